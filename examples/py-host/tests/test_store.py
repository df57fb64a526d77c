"""The store contract directly on both stores (no component), and the Redis
layout the other hosts share."""

from __future__ import annotations

import random
import threading
import time

import pytest

import coord
from coord.store import (
    ALWAYS, Condition, HistoryGone, MeterRequest, RedisStore, StoreInvalid,
)
from coord.store import meter as meter_algorithms
from coord.store import redis_codec
from coord.store.types import MAX_TTL_MS


@pytest.mark.parametrize("partition", ["eph:1:a:b", "~lock:1:a:b"])
def test_conditions_revisions_and_replies(backend, partition):
    s = backend.store()
    put = s.put(partition, "k", b"v1", 60_000, Condition("absent"))
    assert put.applied and put.entry.value == b"v1" and put.entry.expires_at == put.now + 60_000
    again = s.put(partition, "k", b"v2", None, Condition("absent"))
    assert not again.applied and again.entry.revision == put.entry.revision
    assert not s.put(partition, "k", b"v2", None, Condition("revision", 1)).applied
    guarded = Condition("revision-and-value", put.entry.revision, b"v1")
    touched = s.touch(partition, "k", 5_000, guarded)
    assert touched.applied and touched.entry.revision == put.entry.revision
    assert touched.entry.value == b"v1"  # the guard's value, left out of the reply
    replaced = s.put(partition, "k", b"v2", None, Condition("revision", put.entry.revision))
    assert replaced.applied and replaced.entry.revision > put.entry.revision
    assert replaced.entry.expires_at is None
    assert s.get(partition, "k").entry.value == b"v2"
    s.put(partition, "a", b"\x00\xff", 60_000, ALWAYS)
    listing = s.list(partition, "")
    assert [e.key for e in listing.entries] == ["a", "k"]
    assert listing.revision == max(e.revision for e in listing.entries)
    assert s.delete(partition, "missing", ALWAYS).entry is None
    deleted = s.delete(partition, "k", ALWAYS)
    assert deleted.applied and deleted.entry.value == b"v2"
    assert s.get(partition, "k").entry is None


@pytest.mark.parametrize("partition", ["eph:1:a:b", "~sem:1:a:b"])
def test_absent_and_fewer_than_counts_live_entries_and_names_the_first_to_expire(backend, partition):
    s = backend.store()
    fewer = lambda n: Condition("absent-and-fewer-than", limit=n)  # noqa: E731
    a = s.put(partition, "a", b"a", 3_000, fewer(2))
    b = s.put(partition, "b", b"b", 1_000, fewer(2))
    assert a.applied and b.applied and b.entry.revision > a.entry.revision
    full = s.put(partition, "c", b"c", 1_000, fewer(2))
    assert not full.applied and full.entry.key == "b", "full: b expires first"
    mine = s.put(partition, "a", b"x", 1_000, fewer(9))
    assert not mine.applied and mine.entry.key == "a", "a live key conflicts with itself"
    assert s.put(partition, "c", b"c", 5_000, fewer(3)).applied, "a larger limit is its own"
    assert not s.delete(partition, "a", fewer(9)).applied
    backend.advance(1_000)  # b expires: a place frees up
    assert s.put(partition, "d", b"d", 1_000, fewer(3)).applied
    assert [e.key for e in s.list(partition, "").entries] == ["a", "c", "d"]
    assert s.put(partition, "z", b"", 1_000, fewer(0)).entry.key == "d", "d expires first"


def test_the_feed_records_expiry_and_refuses_gaps(backend):
    s = backend.store(history=3)
    p = "eph:1:f:x"
    first = s.put(p, "short", b"", 100, ALWAYS).entry.revision
    backend.advance(150)
    page = s.changes(p, 0, 10)
    assert [(c.kind, c.key) for c in page.changes] == [("put", "short"), ("expire", "short")]
    for i in range(4):
        s.put(p, "k", bytes([i]), None, ALWAYS)
    with pytest.raises(HistoryGone) as gone:
        s.changes(p, first, 10)
    assert gone.value.revision > first
    assert len(s.changes(p, gone.value.revision, 10).changes) == 3
    with pytest.raises(HistoryGone):
        s.changes(p, page.revision * 2, 10)  # from the future: the store lost it


def test_unwatched_partitions_refuse_changes_and_huge_ttls_are_invalid(backend):
    s = backend.store()
    with pytest.raises(StoreInvalid, match="partition"):
        s.changes("~lock:1:a:b", 0, 10)
    with pytest.raises(StoreInvalid, match="ttl-ms"):
        s.put("eph:1:a:b", "k", b"", MAX_TTL_MS + 1, ALWAYS)
    with pytest.raises(StoreInvalid, match="ttl-ms"):
        s.touch("~lock:1:a:b", "k", MAX_TTL_MS + 1, ALWAYS)


@pytest.mark.parametrize("partition", ["eph:1:w:x", "~lock:1:w:x"])
def test_wait_sleeps_and_wakes_on_a_write_from_another_thread(backend, partition):
    s, writer = backend.store(), backend.store()
    after = s.put(partition, "k", b"", None, ALWAYS).entry.revision
    started = time.monotonic()
    assert s.wait(partition, after, 300) == after
    assert 0.29 <= time.monotonic() - started < 1.0
    sleeps = s.stats.sleeps

    def write():
        time.sleep(0.2)
        writer.put(partition, "k", b"x", None, ALWAYS)

    t = threading.Thread(target=write)
    t.start()
    started = time.monotonic()
    woke = s.wait(partition, after, 5_000)
    took = time.monotonic() - started
    t.join()
    assert woke > after and 0.15 <= took < 1.0, took
    assert s.stats.sleeps - sleeps <= 3, "the wait spun"


def test_wait_then_put_waits_for_the_expiry_then_puts(backend):
    s = backend.store()
    p = "~lock:1:x:y"
    held = s.put(p, "holder", b"a", 200, Condition("absent"))
    started = time.monotonic()
    reply = s.wait_then_put(p, "holder", b"b", 1_000, Condition("absent"),
                            held.entry.revision, 5_000)
    assert reply.applied and reply.entry.value == b"b"
    assert 0.15 <= time.monotonic() - started < 1.5


def test_a_lock_lives_where_the_rust_backend_looks_for_it(redis_backend, name):
    backend = redis_backend
    c = coord.Coord(store=backend.store())
    held = c.acquire(name, "item:{1}", ttl_ms=10_000, wait_ms=0)
    store = c.store
    partition = f"~lock:{len(name)}:{name}:item:{{1}}"
    key = store.key(partition, "s")
    assert key == f"{backend.prefix}:{{p:~lock:{len(name)}:{name}:item:%7B1%7D}}:s"
    blob = store.client.get(key)
    assert blob is not None and blob[0] == 3  # unwatched.lua's layout version
    assert held.owner.encode() in blob
    assert store.client.script_exists(store.sha, store.unwatched_sha, store.meter_sha) == \
        [True, True, True]


def test_the_python_meter_answers_what_meter_lua_answers(redis_backend):
    """Random meter requests at chosen clocks, decided by coord.store.meter and
    by meter.lua on Redis (given the same clock): the same answers."""
    s: RedisStore = redis_backend.store()
    rng = random.Random(7)
    state = None
    now = 1_700_000_000_000
    key = s.key("rl:1:m:x", "r:") + "k"
    assert s.client.script_load(s.meter_script) == s.meter_sha
    for _ in range(300):
        now += rng.choice([0, 1, 7, 50, 333, 1000, 4000])
        if now % 1000 > 900:
            # Redis expires the state on its own clock: keep every TTL well
            # above the real time between two calls.
            now += 100
        mode = rng.choice(["consume"] * 4 + ["peek", "reset", "charge", "refund", "refund"])
        request = MeterRequest(rng.choice(["sliding-window", "fixed-window", "gcra"]), 5, 1000,
                               rng.randint(1, 5), mode, now - rng.choice([0, 500, 1500]))
        if state is not None and state[2] != request.algorithm:
            request.algorithm = state[2]  # a key keeps one algorithm
        stored = state[0] if state and state[1] > now else None
        expected, write, reset = meter_algorithms.decide(stored, request, now)
        if reset:
            state = None
        elif write:
            state = (write[0], now + write[1], request.algorithm)
        packed = redis_codec.packed_meter(request, clock=float(now))
        got = redis_codec.meter_reply(s.client.evalsha(s.meter_sha, 1, key, packed))
        assert got == expected, (request, now)


def test_a_flushed_script_cache_is_reloaded(redis_backend):
    s: RedisStore = redis_backend.store()
    s.put("eph:1:n:s", "k", b"v", 60_000, ALWAYS)
    s.client.script_flush()  # as after a restart: every host reloads on NOSCRIPT
    assert s.get("eph:1:n:s", "k").entry.value == b"v"
    assert s.get("~lock:1:n:s", "k").entry is None
    s.client.script_flush()
    assert s.meter("rl:1:n:s", "k", MeterRequest("gcra", 1, 1_000, 1, "peek")).allowed
