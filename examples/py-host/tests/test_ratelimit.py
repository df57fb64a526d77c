"""Rate limits through the component, on both stores."""

from __future__ import annotations

import dataclasses

import pytest

import coord


@pytest.mark.parametrize("algorithm", [None, "fixed-window", "token-bucket"])
def test_a_limit_of_n_allows_exactly_n_shared_by_two_instances(backend, name, algorithm):
    a, b = backend.coord(), backend.coord()
    limiter = coord.Limiter(name, limit=5, window_ms=60_000, algorithm=algorithm)
    decisions = [(a if i % 2 else b).limit(limiter, "user:1") for i in range(7)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False] * 2
    assert [d.remaining for d in decisions[:5]] == [4, 3, 2, 1, 0]
    denied = decisions[5]
    assert denied.limited and denied.limit == 5 and denied.remaining == 0
    assert 0 < denied.retry_after_ms <= 120_000
    assert decisions[0].retry_after_ms == 0
    # Another key has its own count.
    assert a.limit(limiter, "user:2").allowed


def test_peek_counts_nothing_and_reset_restores_the_limit(backend, name):
    c = backend.coord()
    limiter = coord.Limiter(name, limit=2, window_ms=60_000)
    assert c.peek_limit(limiter, "k").remaining == 2
    assert c.limit(limiter, "k", cost=2).allowed
    assert c.peek_limit(limiter, "k").allowed is False
    c.reset_limit(limiter, "k")
    assert c.peek_limit(limiter, "k").remaining == 2
    assert c.limit(limiter, "k").remaining == 1


def test_a_window_passing_allows_again(backend, name):
    c = backend.coord()
    limiter = coord.Limiter(name, limit=1, window_ms=200, algorithm="fixed-window")
    assert c.limit(limiter, "k").allowed
    denied = c.limit(limiter, "k")
    assert denied.limited and 0 < denied.retry_after_ms <= 200
    backend.advance(denied.retry_after_ms + 10)
    assert c.limit(limiter, "k").allowed


@pytest.mark.parametrize("make, field", [
    (lambda n: (coord.Limiter(n, limit=0, window_ms=1_000), 1), "limiter.limit"),
    (lambda n: (coord.Limiter(n, limit=5, window_ms=0), 1), "limiter.window-ms"),
    (lambda n: (coord.Limiter(n, limit=5, window_ms=1_000), 0), "cost"),
    (lambda n: (coord.Limiter(n, limit=5, window_ms=1_000), 6), "cost"),
    (lambda n: (coord.Limiter("", limit=5, window_ms=1_000), 1), "limiter.id"),
])
def test_bad_limits_name_the_field(backend, name, make, field):
    c = backend.coord()
    limiter, cost = make(name)
    with pytest.raises(coord.InvalidArgument) as invalid:
        c.limit(limiter, "k", cost=cost)
    assert invalid.value.field == field, invalid.value
    assert sum(c.store_calls.values()) == 0


def test_a_reservation_settles_to_the_real_cost_once(backend, name):
    c = backend.coord()
    tokens = coord.Limiter(name, 10, 3_600_000, "fixed-window")
    decision, r = c.reserve(tokens, "tenant:1", 8, 60_000)
    assert decision.allowed and decision.remaining == 2 and r.cost == 8
    assert c.limit(tokens, "tenant:1", 3).limited
    assert c.settle(tokens, r, 2) == "settled"
    assert c.peek_limit(tokens, "tenant:1").remaining == 8
    assert c.cancel(tokens, r) == "already-settled"
    # Only the store's record decides: a made-up token gives nothing back.
    forged = dataclasses.replace(r, token="0" * 32, cost=10)
    assert c.cancel(tokens, forged) == "unknown"
    assert c.peek_limit(tokens, "tenant:1").remaining == 8
    limited, none = c.reserve(tokens, "tenant:1", 9, 60_000)
    assert limited.limited and none is None
    with pytest.raises(coord.InvalidArgument) as e:
        c.settle(tokens, r, 11)
    assert e.value.field == "actual"
