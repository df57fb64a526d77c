"""Semaphores through the component, on both stores."""

from __future__ import annotations

import json
import threading

import pytest

import coord


def test_at_most_limit_permits_busy_names_the_first_to_expire_and_release_frees_one(backend, name):
    a, b = backend.coord(), backend.coord()
    first = a.acquire_permit(name, "tenant:1", 2, ttl_ms=10_000, wait_ms=0)
    second = b.acquire_permit(name, "tenant:1", 2, ttl_ms=20_000, wait_ms=0)
    assert second.fence > first.fence and second.limit == 2
    with pytest.raises(coord.Busy) as busy:
        b.acquire_permit(name, "tenant:1", 2, ttl_ms=10_000, wait_ms=0)
    assert busy.value.holder.fence == first.fence, "the permit that expires first"
    usage = a.inspect_semaphore(name, "tenant:1")
    assert [p.fence for p in usage.permits] == [first.fence, second.fence]
    assert first.owner not in repr(usage)
    assert first.release() is True and first.release() is False
    # A permit carried as JSON to another instance releases there.
    third = a.acquire_permit(name, "tenant:1", 2, ttl_ms=10_000, wait_ms=0)
    assert third.fence > second.fence
    carried = coord.Permit.from_dict(json.loads(json.dumps(third.to_dict())), b)
    assert b.permit_is_held(carried) is True
    assert carried.release() is True
    extended = a.extend_permit(second, ttl_ms=5_000)
    assert extended.fence == second.fence
    assert a.force_release_permit(name, "tenant:1", second.fence) is True
    with pytest.raises(coord.Lost):
        a.extend_permit(extended)


def test_the_with_block_holds_a_permit_and_a_waiter_gets_the_place_it_frees(backend, name):
    a, b = backend.coord(), backend.coord()
    got = []
    with a.permit(name, "tenant:2", 1, ttl_ms=60_000, wait_ms=0) as held:
        waiter = threading.Thread(target=lambda: got.append(
            b.acquire_permit(name, "tenant:2", 1, ttl_ms=60_000, wait_ms=60_000)))
        waiter.start()
        assert a.permit_is_held(held)
    waiter.join()
    assert len(got) == 1 and got[0].fence > held.fence
    assert got[0].release()


@pytest.mark.parametrize("limit", [0, 100_001, 2**32, -1])
def test_a_limit_out_of_range_is_refused_naming_the_field(backend, name, limit):
    with pytest.raises(coord.InvalidArgument) as e:
        backend.coord().acquire_permit(name, "t", limit, wait_ms=0)
    assert e.value.field == "limit"
