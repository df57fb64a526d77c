"""Arguments a caller can get wrong: each is refused with InvalidArgument
naming the field, before the store is asked, and nothing is written.

wasmtime-py itself wraps out-of-range integers (-1 becomes 2**64 - 1,
2**64 + 1000 becomes 1000) and names no field for a wrong type, so these
tests are what stand between a caller's typo and a lock held for the wrong
time.
"""

from __future__ import annotations

import pytest

import coord

SPACE = coord.Space("args.space", ttl_ms=10_000, max_value_bytes=64)
LIMITER = coord.Limiter("args.limiter", limit=2, window_ms=10_000)


def refused(field: str, call) -> None:
    """``call()`` raises InvalidArgument for ``field``."""
    with pytest.raises(coord.InvalidArgument) as raised:
        call()
    assert raised.value.field == field, str(raised.value)


@pytest.mark.parametrize("ttl", [-1, 2**64, 2**64 + 1_000, 1.5, "1000", True, [1_000]])
def test_a_lock_ttl_that_is_not_a_u64_is_refused_not_wrapped(ttl):
    c = coord.Coord()
    refused("options.ttl-ms", lambda: c.acquire("args", "r", ttl_ms=ttl, wait_ms=0))
    assert c.inspect("args", "r") is None, "nothing was acquired"
    assert c.store_calls.get("put", 0) == 0, "the store was never asked"


def test_2_to_the_64_plus_1000_is_not_taken_for_1000():
    c = coord.Coord()
    refused("options.ttl-ms", lambda: c.acquire("args", "r", ttl_ms=2**64 + 1_000))
    refused("ttl-ms", lambda: c.acquire_lease("args", "node-a", 2**64 + 1_000))
    refused("space.ttl-ms",
            lambda: c.put(coord.Space("s", ttl_ms=2**64 + 1_000), "t", "k", b"v"))
    assert c.observe_lease("args") is None


@pytest.mark.parametrize("kwargs, field", [
    (dict(wait_ms=-5), "options.wait.timeout"),
    (dict(wait_ms=0.5), "options.wait.timeout"),
    (dict(attempts=-1), "options.wait.attempts.max-attempts"),
    (dict(attempts=2**32), "options.wait.attempts.max-attempts"),
    (dict(attempts=3, delay_ms=-1), "options.wait.attempts.delay-ms"),
])
def test_a_wait_policy_out_of_range_is_refused(kwargs, field):
    c = coord.Coord()
    refused(field, lambda: c.acquire("args", "r", **kwargs))


@pytest.mark.parametrize("value", [None, b"r", 42, "\ud800"])
def test_ids_and_resources_must_be_valid_strings(value):
    c = coord.Coord()
    refused("id", lambda: c.acquire(value, "r"))
    refused("resource", lambda: c.acquire("args", value))
    refused("resource", lambda: c.inspect("args", value))
    refused("resource", lambda: c.force_release("args", value))


def test_a_tampered_held_lock_is_refused_and_the_real_one_still_held():
    c = coord.Coord()
    held = c.acquire("args", "r", ttl_ms=10_000, wait_ms=0)
    data = held.to_dict()
    for name, bad in [("fence", "9"), ("fence", -1), ("ttl_ms", 2**64), ("owner", None),
                      ("expires_at", 1.0)]:
        forged = coord.HeldLock.from_dict({**data, name: bad}, c)
        refused(f"lock.{name.replace('_', '-')}", forged.release)
        refused(f"lock.{name.replace('_', '-')}", forged.is_held)
        refused(f"lock.{name.replace('_', '-')}", forged.extend)
    refused("lock", lambda: c.release(data))
    assert held.is_held(), "no forged release freed the real holder"
    refused("ttl-ms", lambda: held.extend(-1))


@pytest.mark.parametrize("value", [5, None, 1.0, ["v"]])
def test_a_value_that_is_not_bytes_or_str_is_refused(value):
    # bytes(5) would be five zero bytes: never stored.
    c = coord.Coord()
    refused("value", lambda: c.put(SPACE, "t", "k", value))
    assert c.get(SPACE, "t", "k") is None


def test_ephemeral_fields_are_checked():
    c = coord.Coord()
    refused("tenant", lambda: c.put(SPACE, 7, "k", b"v"))
    refused("key", lambda: c.put(SPACE, "t", None, b"v"))
    refused("space.max-value-bytes",
            lambda: c.put(coord.Space("s", ttl_ms=1_000, max_value_bytes=-1), "t", "k", b"v"))
    refused("space.id", lambda: c.touch(coord.Space(b"s", ttl_ms=1_000), "t", "k"))
    refused("prefix", lambda: c.snapshot(SPACE, "t", prefix=3))
    refused("after", lambda: c.watch(SPACE, "t", after=-1))
    refused("timeout-ms", lambda: c.watch(SPACE, "t", timeout_ms=-10))
    with c.watch(SPACE, "t", timeout_ms=0) as watch:
        refused("timeout-ms", lambda: watch.next(-1))
    assert c.list(SPACE, "t") == []


def test_limiter_fields_are_checked_and_nothing_is_counted():
    c = coord.Coord()
    refused("limiter.limit", lambda: c.limit(coord.Limiter("l", limit=-1, window_ms=1_000), "k"))
    refused("limiter.window-ms",
            lambda: c.limit(coord.Limiter("l", limit=1, window_ms=2**64), "k"))
    refused("limiter.algorithm",
            lambda: c.limit(coord.Limiter("l", limit=1, window_ms=1_000, algorithm="leaky"), "k"))
    refused("cost", lambda: c.limit(LIMITER, "k", cost=2**32))
    refused("cost", lambda: c.limit(LIMITER, "k", cost=-1))
    refused("key", lambda: c.limit(LIMITER, b"k"))
    assert c.peek_limit(LIMITER, "k").remaining == 2, "no refused check was counted"


def test_lease_fields_are_checked():
    c = coord.Coord()
    refused("name", lambda: c.acquire_lease(None, "node-a", 10_000))
    refused("node", lambda: c.acquire_lease("args", 1, 10_000))
    refused("ttl-ms", lambda: c.acquire_lease("args", "node-a", -3))
    held = c.acquire_lease("args", "node-a", 10_000)
    refused("lease", lambda: c.renew_lease(held.__dict__))
    forged = coord.HeldLease(**{**held.__dict__, "epoch": -1})
    refused("lease.epoch", lambda: c.resign_lease(forged))
    assert c.check_lease(held).epoch == held.epoch, "the real lease is untouched"
