"""Leases through the component, on both stores."""

from __future__ import annotations

import pytest

import coord


def test_a_lease_has_one_holder_and_passes_on_when_resigned(backend, name):
    a, b = backend.coord(), backend.coord()
    lease = a.acquire_lease(name, "node-a", 10_000)
    assert lease.node == "node-a" and lease.epoch > 0 and lease.writable_at == 0

    with pytest.raises(coord.NotHolder) as not_holder:
        b.acquire_lease(name, "node-b", 10_000)
    assert not_holder.value.holder.node == "node-a"
    assert not_holder.value.holder.epoch == lease.epoch
    assert b.observe_lease(name).node == "node-a"

    renewed = a.renew_lease(lease)
    assert renewed.epoch == lease.epoch and renewed.expires_at >= lease.expires_at
    assert a.check_lease(renewed).epoch == lease.epoch
    assert a.resign_lease(renewed) is True
    assert a.resign_lease(renewed) is False

    taken = b.acquire_lease(name, "node-b", 10_000)
    assert taken.epoch > lease.epoch and taken.writable_at == 0
    with pytest.raises(coord.NotHolder):
        a.check_lease(renewed)


def test_a_lease_run_out_is_taken_over_after_a_grace(backend, name):
    a, b = backend.coord(), backend.coord()
    lease = a.acquire_lease(name, "node-a", 200)
    backend.advance(250)  # run out, not resigned: the grace begins
    taken = b.acquire_lease(name, "node-b", 10_000)
    assert taken.epoch > lease.epoch and taken.writable_at > 0
    with pytest.raises(coord.InGrace) as in_grace:
        b.check_lease(taken)
    assert 0 < in_grace.value.remaining_ms <= 200
