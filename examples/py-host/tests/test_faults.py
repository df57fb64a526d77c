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
from coord.store.types import MeterRequest, StoreUnavailable


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


def held_then_checked(server: PrivateRedis, call: Any, check: Any) -> None:
    """``call(round)`` while Redis sleeps (``DEBUG SLEEP`` from another thread),
    until it raises ``unavailable``; then ``check(round)`` once Redis woke.
    Whether Redis is asleep yet when the call is sent cannot be known on a
    loaded machine, and a round whose call was answered tests nothing."""
    for round in range(10):
        sleeper = threading.Thread(target=server.cli, args=("DEBUG", "SLEEP", "1.5"))
        sleeper.start()
        time.sleep(0.2)
        try:
            call(round)
            refused = False
        except (coord.Unavailable, StoreUnavailable):
            refused = True
        sleeper.join()
        if refused:
            check(round)
            return
    pytest.fail("ten calls in a row were answered although Redis was asleep")


def test_a_stall_during_an_acquire_is_unavailable_and_its_put_never_applies(redis_server):
    # The acquire's put reaches Redis while it sleeps; the host times out
    # first. Before, the put applied when Redis woke and the component's
    # take-back had to find and free it; now it carries its deadline on
    # Redis's clock, and the script, run when Redis wakes, changes nothing.
    c = coord.Coord(store=RedisStore(redis_server.url, timeout_s=0.5))
    c.inspect("faults", "r")  # connected, scripts loaded, Redis's clock heard
    observer = coord.Coord(store=RedisStore(redis_server.url))

    def check(round: int) -> None:
        # The take-back's read came after the put on the same connection:
        # it found no token of its own, so nothing was there to delete.
        assert c.store_calls.get("delete", 0) == 0, c.store_calls
        assert observer.inspect("faults", f"r{round}") is None, \
            "the put applied after unavailable"
        observer.acquire("faults", f"r{round}", ttl_ms=10_000, wait_ms=0)

    held_then_checked(
        redis_server,
        lambda round: c.acquire("faults", f"r{round}", ttl_ms=10_000, wait_ms=0),
        check)


def test_a_rate_limit_count_held_by_a_stalled_redis_is_not_counted_later(redis_server):
    store = RedisStore(redis_server.url, timeout_s=0.5)
    observer = RedisStore(redis_server.url)

    def request(mode: str) -> MeterRequest:
        return MeterRequest(algorithm="fixed-window", limit=1000, window_ms=3_600_000, cost=1,
                            mode=mode)

    store.meter("faults", "k", request("consume"))
    counted = [1]  # each answered count adds one; the held one must not

    def count(round: int) -> None:
        store.meter("faults", "k", request("consume"))
        counted[0] += 1

    def check(round: int) -> None:
        remaining = observer.meter("faults", "k", request("peek")).remaining
        assert remaining == 1000 - counted[0], "a count answered unavailable was counted later"

    held_then_checked(redis_server, count, check)


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
