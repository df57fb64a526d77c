"""The Python host on a Redis that stalls, loses its data or dies: what the
Rust host promises in RELIABILITY.md, tried on ``RedisStore``.

Each test starts a ``redis-server`` of its own on a free port (it flushes,
pauses and kills it), so the shared Redis of the other tests is never
touched.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import threading
import time
from typing import Any, List, Optional

import pytest

import coord
from coord.store import RedisStore


class PrivateRedis:
    """A ``redis-server`` on a free port, no persistence, DEBUG allowed locally."""

    def __init__(self) -> None:
        if shutil.which("redis-server") is None:
            pytest.fail("redis-server is not installed; the fault tests start their own",
                        pytrace=False)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.dir = tempfile.mkdtemp(prefix="coord-py-faults-")
        self.process: Optional[subprocess.Popen] = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start it (again, empty) on its port; wait until it answers."""
        self.process = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--enable-debug-command", "local"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"redis-server exited: {self.process.returncode}")
            if self.cli("PING") == "PONG":
                return
            time.sleep(0.02)
        pytest.fail("redis-server did not answer within 10 s")

    def cli(self, *args: str) -> str:
        """One command through redis-cli; its output, or '' when it failed."""
        out = subprocess.run(["redis-cli", "-p", str(self.port), *args],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip()

    def kill(self) -> None:
        """Kill it at once (SIGKILL): its data is gone."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def redis_server() -> Any:
    server = PrivateRedis()
    try:
        yield server
    finally:
        server.close()


def test_a_stall_during_an_acquire_is_unavailable_and_leaves_no_ghost_holder(redis_server):
    # The acquire's put reaches Redis while it sleeps; the host times out
    # first. The put applies when Redis wakes, and the component's take-back
    # must free it then, not leave a holder nobody has for the 10 s TTL.
    c = coord.Coord(store=RedisStore(redis_server.url, timeout_s=0.5))
    c.inspect("faults", "r")  # connected and scripts loaded before the stall
    sleeper = threading.Thread(target=redis_server.cli, args=("DEBUG", "SLEEP", "0.8"))
    sleeper.start()
    time.sleep(0.1)
    with pytest.raises(coord.Unavailable):
        c.acquire("faults", "r", ttl_ms=10_000, wait_ms=0)
    sleeper.join()
    # The put applied when Redis woke (else the take-back would find no token
    # of its own to delete), and the take-back read and deleted it.
    assert c.store_calls.get("delete") == 1, c.store_calls
    observer = coord.Coord(store=RedisStore(redis_server.url))
    deadline = time.monotonic() + 2
    while observer.inspect("faults", "r") is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert observer.inspect("faults", "r") is None, "a ghost holder kept the lock"
    observer.acquire("faults", "r", ttl_ms=10_000, wait_ms=0)


def test_a_stall_with_a_rival_holding_leaves_the_rival_holding(redis_server):
    rival = coord.Coord(store=RedisStore(redis_server.url))
    held = rival.acquire("faults", "r", ttl_ms=10_000, wait_ms=0)
    c = coord.Coord(store=RedisStore(redis_server.url, timeout_s=0.5))
    c.inspect("faults", "r")
    sleeper = threading.Thread(target=redis_server.cli, args=("DEBUG", "SLEEP", "0.8"))
    sleeper.start()
    time.sleep(0.1)
    with pytest.raises(coord.Unavailable):
        c.acquire("faults", "r", ttl_ms=10_000, wait_ms=0)
    sleeper.join()
    time.sleep(0.3)
    assert held.is_held(), "the take-back freed another owner's lock"


def test_fences_after_a_flushall_or_an_empty_restart_exceed_every_fence_before(redis_server):
    c = coord.Coord(store=RedisStore(redis_server.url))
    before = []
    for _ in range(5):
        held = c.acquire("faults", "r", ttl_ms=10_000, wait_ms=0)
        before.append(held.fence)
        held.release()
    held = c.acquire("faults", "r", ttl_ms=10_000, wait_ms=0)
    before.append(held.fence)
    assert redis_server.cli("FLUSHALL") == "OK"
    after_flush = c.acquire("faults", "r", ttl_ms=10_000, wait_ms=0)
    assert after_flush.fence > max(before), "a flushed store reissued a fence"
    redis_server.kill()
    redis_server.start()
    after_restart = c.acquire("faults", "r", ttl_ms=10_000, wait_ms=0)
    assert after_restart.fence > after_flush.fence, "a restarted store reissued a fence"


def test_a_waiter_whose_redis_dies_is_unavailable_never_acquired(redis_server):
    holder = coord.Coord(store=RedisStore(redis_server.url))
    holder.acquire("faults", "r", ttl_ms=60_000, wait_ms=0)
    waiter = coord.Coord(store=RedisStore(redis_server.url, timeout_s=0.5, recheck_ms=200))
    outcome: List[Any] = []

    def wait() -> None:
        started = time.monotonic()
        try:
            outcome.append(waiter.acquire("faults", "r", ttl_ms=10_000, wait_ms=30_000))
        except coord.CoordError as e:
            outcome.append(e)
        outcome.append(time.monotonic() - started)

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.5)
    redis_server.kill()
    thread.join(timeout=20)
    assert not thread.is_alive(), "the waiter hung on a dead store"
    assert isinstance(outcome[0], coord.Unavailable), outcome
    assert not isinstance(outcome[0], coord.Busy)
    assert outcome[1] < 10, f"the waiter took {outcome[1]:.1f} s to notice"


def test_a_store_restarted_empty_serves_again_through_the_same_instance(redis_server):
    c = coord.Coord(store=RedisStore(redis_server.url, timeout_s=0.5))
    space = coord.Space("faults.space", ttl_ms=10_000)
    limiter = coord.Limiter("faults.limit", limit=1, window_ms=60_000)
    c.put(space, "t", "k", b"v")
    assert c.limit(limiter, "k").allowed
    redis_server.kill()
    with pytest.raises(coord.Unavailable):
        c.put(space, "t", "k", b"v")
    with pytest.raises(coord.Unavailable):
        c.limit(limiter, "k")
    redis_server.start()
    # The connection and the scripts come back without a new instance.
    assert c.put(space, "t", "k", b"w").revision > 0
    assert c.get(space, "t", "k").value == b"w"
    assert c.limit(limiter, "k").allowed, "the data, the count included, went with the restart"
