"""Fixtures: every test runs on both stores.

``backend`` is parametrized over ``memory`` and ``redis``. A Redis test
talks to ``$REDIS_URL`` (default redis://127.0.0.1:6379) under a key prefix
of its own, deleted afterwards; when Redis does not answer, the Redis tests
FAIL (a skipped suite would hide a broken backend).
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any, List

import pytest

import coord
from coord.store import MemoryStore, RedisStore

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379")


class Backend:
    """One test's store: stores and Coord instances that share its data, and a
    way to let store time pass."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.prefix = f"coord-test-{uuid.uuid4().hex[:12]}"
        self._stores: List[Any] = []
        self._memory = MemoryStore() if kind == "memory" else None

    def store(self, **options: Any) -> Any:
        """A store on this test's data (a new client each call, on Redis).
        With ``options`` (say ``history=4``), a store configured so."""
        if self.kind == "memory":
            if options:
                s = MemoryStore(**options)
                self._stores.append(s)
                return s
            return self._memory
        s = RedisStore(REDIS_URL, prefix=self.prefix, **options)
        self._stores.append(s)
        return s

    def coord(self, **options: Any) -> coord.Coord:
        """A new Coord instance (its own component instance) on this test's data."""
        return coord.Coord(store=self.store(**options))

    def advance(self, ms: int) -> None:
        """Let ``ms`` of store time pass: move the memory store's clock, or
        sleep for Redis's."""
        if self.kind == "memory":
            for s in [self._memory, *self._stores]:
                s.advance(ms)
        else:
            time.sleep(ms / 1000)

    def close(self) -> None:
        """Delete this test's Redis keys and close the clients."""
        for s in self._stores:
            if isinstance(s, RedisStore):
                s.delete_everything()
                s.close()


def _require_redis() -> None:
    s = RedisStore(REDIS_URL, prefix="coord-test-ping")
    try:
        s.client.ping()
    except Exception as e:  # any failure: the Redis tests cannot run, and must say so
        pytest.fail(f"Redis at {REDIS_URL} did not answer ({e}); the Redis tests need it "
                    f"(set REDIS_URL)", pytrace=False)
    finally:
        s.close()


@pytest.fixture(params=["memory", "redis"])
def backend(request: pytest.FixtureRequest) -> Any:
    """This test's store, once in memory and once on Redis."""
    if request.param == "redis":
        _require_redis()
    b = Backend(request.param)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def name() -> str:
    """A name no other test or run uses (lock ids, spaces, limiters)."""
    return f"t.{uuid.uuid4().hex[:10]}"


@pytest.fixture
def redis_backend() -> Any:
    """This test's Redis data, for the tests about Redis itself (its layout,
    its scripts): they have no memory counterpart."""
    _require_redis()
    b = Backend("redis")
    try:
        yield b
    finally:
        b.close()
