"""The package as a user meets it: only the public import, two instances on
the in-memory store, one lock between them."""

import coord

store = coord.MemoryStore()
a = coord.Coord(store=store)
b = coord.Coord(store=store)
first = a.acquire("smoke", "item:1", ttl_ms=30_000, wait_ms=0)
try:
    b.acquire("smoke", "item:1", ttl_ms=30_000, wait_ms=0)
    raise AssertionError("the second instance acquired a held lock")
except coord.Busy as busy:
    print(f"the second instance is told busy: {busy}")
assert a.release(first), "the holder releases"
second = b.acquire("smoke", "item:1", ttl_ms=30_000, wait_ms=0)
assert second.fence > first.fence, "the second acquires with a higher fence"
print(f"coord-sync smoke: fences {first.fence} then {second.fence}, ok")
