"""Locks through the component, on both stores."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest

import coord


def test_acquire_busy_release_then_a_higher_fence(backend, name):
    a, b = backend.coord(), backend.coord()
    first = a.acquire(name, "item:1", ttl_ms=10_000, wait_ms=0)
    assert re.fullmatch(r"[0-9a-f]{32}", first.owner)
    assert first.fence > 0

    with pytest.raises(coord.Busy) as busy:
        b.acquire(name, "item:1", ttl_ms=10_000, wait_ms=0)
    assert busy.value.holder.fence == first.fence
    assert 0 < busy.value.holder.remaining_ms <= 10_000
    assert b.inspect(name, "item:1").fence == first.fence

    assert first.release() is True
    assert first.release() is False, "released once only"
    assert b.inspect(name, "item:1") is None

    second = b.acquire(name, "item:1", ttl_ms=10_000, wait_ms=0)
    assert second.fence > first.fence
    # A lock carried as JSON to another instance releases there.
    carried = coord.HeldLock.from_dict(json.loads(json.dumps(second.to_dict())), a)
    assert carried.release() is True


def test_a_record_bound_to_no_coord_says_which_call_to_use(backend, name):
    a = backend.coord()
    held = a.acquire(name, "item:unbound", ttl_ms=10_000, wait_ms=0)
    grant = a.write_lock(name, "unbound").__enter__()
    permit = a.permit(name, "unbound", 2).__enter__()
    for record, call in [(held, "coord.release(lock)"), (grant, "coord.release_grant(g)"),
                         (permit, "coord.release_permit(p)")]:
        unbound = type(record).from_dict(record.to_dict())
        with pytest.raises(RuntimeError, match=re.escape(call)):
            unbound.release()
        assert record.release() is True


def test_the_with_block_holds_then_releases(backend, name):
    a, b = backend.coord(), backend.coord()
    with a.lock(name, "item:2", ttl_ms=10_000, wait_ms=0) as held:
        assert isinstance(held.fence, int) and held.fence > 0
        with pytest.raises(coord.Busy):
            with b.lock(name, "item:2", wait_ms=0):
                pytest.fail("ran the block without the lock")
        before = held.expires_at
        backend.advance(20)
        assert held.extend(ttl_ms=20_000) is held
        assert held.expires_at > before and held.ttl_ms == 20_000
        assert held.is_held()
    assert b.inspect(name, "item:2") is None
    with pytest.raises(RuntimeError):
        with a.lock(name, "item:2", wait_ms=0):
            raise RuntimeError("the work failed")
    assert b.inspect(name, "item:2") is None, "released although the block raised"


def test_an_expired_holder_cannot_release_its_successor(backend, name):
    a, b = backend.coord(), backend.coord()
    old = a.acquire(name, "item:3", ttl_ms=100, wait_ms=0)
    backend.advance(150)
    successor = b.acquire(name, "item:3", ttl_ms=10_000, wait_ms=0)
    assert successor.fence > old.fence
    assert old.release() is False
    with pytest.raises(coord.Lost):
        old.extend()
    assert old.is_held() is False
    assert b.inspect(name, "item:3").fence == successor.fence
    assert successor.release() is True


def test_a_waiter_gets_the_lock_released_from_another_instance_and_thread(backend, name):
    holder = backend.coord()
    held = holder.acquire(name, "item:4", ttl_ms=30_000, wait_ms=0)
    wire = json.dumps(held.to_dict())  # handed to another thread, as to another process

    def release_later():
        time.sleep(0.3)
        other = backend.coord()
        assert coord.HeldLock.from_dict(json.loads(wire), other).release() is True

    releaser = threading.Thread(target=release_later)
    waiter = backend.coord()
    started = time.monotonic()
    releaser.start()
    got = waiter.acquire(name, "item:4", ttl_ms=10_000, wait_ms=5_000)
    took = time.monotonic() - started
    releaser.join()
    assert got.fence > held.fence
    assert 0.25 <= took < 1.5, f"took {took:.3f} s for a release after 0.3 s"
    got.release()


def test_a_waiter_gets_the_lock_when_its_holder_ttl_runs_out(backend, name):
    backend.coord().acquire(name, "item:5", ttl_ms=300, wait_ms=0)
    waiter = backend.coord()
    started = time.monotonic()
    got = waiter.acquire(name, "item:5", ttl_ms=10_000, wait_ms=5_000)
    took = time.monotonic() - started
    assert 0.2 <= took < 1.5, f"took {took:.3f} s for a 300 ms TTL"
    got.release()


def test_a_waiter_times_out_after_its_budget_without_spinning(backend, name):
    holder = backend.coord().acquire(name, "item:6", ttl_ms=60_000, wait_ms=0)
    waiter = backend.coord()
    sleeps_before = waiter.store.stats.sleeps
    started = time.monotonic()
    with pytest.raises(coord.Busy) as busy:
        waiter.acquire(name, "item:6", ttl_ms=1_000, wait_ms=400)
    took = time.monotonic() - started
    assert busy.value.holder.fence == holder.fence
    assert 0.39 <= took < 1.2, f"gave up after {took:.3f} s of a 0.4 s budget"
    calls = sum(waiter.store_calls.values())
    assert calls < 12, f"{calls} store calls in one acquire: {waiter.store_calls}"
    assert waiter.store.stats.sleeps > sleeps_before, "the wait never slept"
    holder.release()


def test_the_default_retry_schedule_and_attempts(backend, name):
    a, b = backend.coord(), backend.coord()
    held = a.acquire(name, "item:7", ttl_ms=60_000)  # default policy: acquired at once
    started = time.monotonic()
    with pytest.raises(coord.Busy):
        b.acquire(name, "item:7", attempts=3, delay_ms=100)
    took = time.monotonic() - started
    assert 0.19 <= took < 1.0, f"3 attempts 100 ms apart took {took:.3f} s"
    assert b.force_release(name, "item:7") is True
    assert held.release() is False, "a force-released holder's release is refused"


@pytest.mark.parametrize("call, field", [
    (lambda c, n: c.acquire(n, "r", ttl_ms=0, wait_ms=0), "options.ttl-ms"),
    (lambda c, n: c.acquire("", "r", wait_ms=0), "id"),
    (lambda c, n: c.acquire("x" * 257, "r", wait_ms=0), "id"),
    (lambda c, n: c.acquire(n, "r" * 1025, wait_ms=0), "resource"),
    (lambda c, n: c.acquire(n, "r", wait_ms=600_001), "options.wait.timeout"),
])
def test_bad_lock_input_is_invalid_argument_naming_the_field(backend, name, call, field):
    c = backend.coord()
    with pytest.raises(coord.InvalidArgument) as invalid:
        call(c, name)
    assert invalid.value.field == field, invalid.value
    assert invalid.value.reason
    assert not isinstance(invalid.value, (coord.Busy, coord.Unavailable))
    assert sum(c.store_calls.values()) == 0, "the store was asked"
