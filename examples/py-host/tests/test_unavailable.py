"""A Redis that cannot be reached, or does not answer, is `Unavailable`:
never `Busy`, never acquired, never allowed or limited. (Redis only: a
memory store is always reachable.)"""

from __future__ import annotations

import socket
import threading
import time

import pytest

import coord
from coord.store import RedisStore, StoreUnavailable


def _every_call(c: coord.Coord, name: str):
    space = coord.Space(name, ttl_ms=1_000)
    limiter = coord.Limiter(name, limit=5, window_ms=1_000)
    return [
        lambda: c.acquire(name, "r", wait_ms=0),
        lambda: c.acquire(name, "r", wait_ms=300),
        lambda: c.inspect(name, "r"),
        lambda: c.put(space, "t", "k", b"v"),
        lambda: c.snapshot(space, "t"),
        lambda: c.watch(space, "t"),
        lambda: c.limit(limiter, "k"),
        lambda: c.acquire_lease(name, "node-a", 1_000),
    ]


def test_an_unreachable_redis_is_unavailable(name):
    c = coord.Coord(store=RedisStore("redis://127.0.0.1:1"))
    for call in _every_call(c, name):
        with pytest.raises(coord.Unavailable) as unavailable:
            call()
        assert not isinstance(unavailable.value, coord.Busy)
        assert "redis" in str(unavailable.value)
    # The instance is not poisoned by the failures: the errors were values.
    with pytest.raises(coord.Unavailable):
        c.acquire(name, "r", wait_ms=0)


def test_a_redis_that_never_answers_is_unavailable_within_the_timeout(name):
    # A server that accepts connections and never replies.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted = []

    def accept():
        while True:
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    port = listener.getsockname()[1]
    try:
        store = RedisStore(f"redis://127.0.0.1:{port}", timeout_s=0.2)
        with pytest.raises(StoreUnavailable):
            store.now()
        c = coord.Coord(store=store)
        started = time.monotonic()
        with pytest.raises(coord.Unavailable):
            c.acquire(name, "r", wait_ms=0)
        # The put, then acquire's take-back read: each bounded by the timeout.
        assert time.monotonic() - started < 2.0
    finally:
        listener.close()
        for s in accepted:
            s.close()
