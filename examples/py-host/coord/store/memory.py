"""The store contract in memory, in Python: what host-test's memory backend
and examples/js-host/store.js are for their hosts.

One :class:`MemoryStore` is shared by every :class:`coord.Coord` that should
see the same locks and entries (within one process). Its clock is the system
clock plus an offset a test moves with :meth:`MemoryStore.advance`, so TTL
tests need not sleep. All state sits behind one lock, so instances on
several threads share it safely; ``wait`` sleeps on a condition variable
that every write and every clock move notifies, and otherwise until the
partition's next expiry or the timeout, whichever is first.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Tuple

from . import meter as meter_algorithms
from .types import (
    DEFAULT_HISTORY, Change, ChangesReply, Condition, Entry, HistoryGone, ListReply,
    MeterReply, MeterRequest, ReadReply, StoreInvalid, StoreStats, WriteReply, check_ttl,
    is_unwatched,
)


@dataclass
class _Partition:
    """One partition's entries, feed and meters."""

    revision: int = 0
    # The revision this incarnation started from: `after = 0` reads from here.
    created: int = 0
    # The feed is complete for every revision after this one.
    complete_after: int = 0
    entries: Dict[str, Entry] = field(default_factory=dict)
    feed: List[Change] = field(default_factory=list)
    # key -> (state, expires_at)
    meters: Dict[str, Tuple[Tuple[int, int, int], int]] = field(default_factory=dict)


class MemoryStore:
    """The store contract (wit/store.wit) in memory, shared by every instance given it.

    ``history`` is how many changes each partition's feed keeps.
    """

    def __init__(self, history: int = DEFAULT_HISTORY) -> None:
        self._history = max(history, 1)
        self._offset = 0
        self._partitions: Dict[str, _Partition] = {}
        self._cond = threading.Condition()
        self.stats = StoreStats()

    # -- the clock -----------------------------------------------------------

    def advance(self, ms: int) -> None:
        """Move the store's clock forward by ``ms``; wakes waiters so they see it."""
        with self._cond:
            self._offset += ms
            self._cond.notify_all()

    def _clock(self) -> int:
        return time.time_ns() // 1_000_000 + self._offset

    # -- internals (called with the lock held) -------------------------------

    def _record(self, p: _Partition, kind: str, key: str, value: bytes, at: int) -> int:
        """Append a change under the next revision; no revision is below the
        clock in microseconds, so a fresh store (a new process) issues
        revisions above every one an earlier incarnation issued."""
        floor = at * 1000
        if p.revision == 0:
            p.created = max(floor - 1, 0)
            p.complete_after = p.revision = p.created
        p.revision = max(p.revision + 1, floor)
        p.feed.append(Change(kind, key, value, p.revision, at))
        if len(p.feed) > self._history:
            dropped = p.feed[: len(p.feed) - self._history]
            del p.feed[: len(dropped)]
            p.complete_after = dropped[-1].revision
        self._cond.notify_all()
        return p.revision

    def _sweep(self, p: _Partition, now: int) -> None:
        """Record every due expiry, in expiry order, as an ``expire`` change."""
        due = sorted((e for e in p.entries.values()
                      if e.expires_at is not None and e.expires_at <= now),
                     key=lambda e: (e.expires_at, e.key.encode()))
        for e in due:
            del p.entries[e.key]
            self._record(p, "expire", e.key, b"", e.expires_at)

    def _open(self, name: str) -> Tuple[_Partition, int]:
        """Read the clock and sweep the partition."""
        now = self._clock()
        p = self._partitions.setdefault(name, _Partition())
        self._sweep(p, now)
        return p, now

    @staticmethod
    def _next_expiry(p: _Partition) -> Optional[int]:
        expiries = [e.expires_at for e in p.entries.values() if e.expires_at is not None]
        return min(expiries) if expiries else None

    @staticmethod
    def _first_to_expire(p: _Partition) -> Optional[Entry]:
        """The live entry that expires first; one without an expiry only when
        none has one (``absent-and-fewer-than``'s conflict)."""
        first: Optional[Entry] = None
        for e in p.entries.values():
            sooner = e.expires_at is not None and (
                first is None or first.expires_at is None or e.expires_at < first.expires_at)
            if first is None or sooner:
                first = e
        return first

    # -- the store contract --------------------------------------------------

    def now(self) -> int:
        """The store's clock, in ms."""
        with self._cond:
            self.stats.count("now")
            return self._clock()

    def get(self, partition: str, key: str) -> ReadReply:
        """Read one key."""
        with self._cond:
            self.stats.count("get")
            p, now = self._open(partition)
            e = p.entries.get(key)
            return ReadReply(replace(e) if e else None, now)

    def list(self, partition: str, prefix: str) -> ListReply:
        """The live entries whose keys start with ``prefix``, in key (byte) order."""
        with self._cond:
            self.stats.count("list")
            p, now = self._open(partition)
            entries = sorted((replace(e) for e in p.entries.values() if e.key.startswith(prefix)),
                             key=lambda e: e.key.encode())
            return ListReply(entries, p.revision, now)

    def put(self, partition: str, key: str, value: bytes, ttl_ms: Optional[int],
            condition: Condition) -> WriteReply:
        """Write ``value`` under ``key`` if ``condition`` holds."""
        check_ttl("ttl-ms", ttl_ms)
        with self._cond:
            self.stats.count("put")
            return self._put(partition, key, value, ttl_ms, condition)

    def _put(self, partition: str, key: str, value: bytes, ttl_ms: Optional[int],
             condition: Condition) -> WriteReply:
        p, now = self._open(partition)
        current = p.entries.get(key)
        if not condition.holds(current):
            return WriteReply(False, replace(current) if current else None, now, p.revision)
        if condition.kind == "absent-and-fewer-than" and len(p.entries) >= condition.limit:
            first = self._first_to_expire(p)
            return WriteReply(False, replace(first) if first else None, now, p.revision)
        revision = self._record(p, "put", key, value, now)
        entry = Entry(key, value, revision, now, None if ttl_ms is None else now + ttl_ms)
        p.entries[key] = entry
        return WriteReply(True, replace(entry), now, p.revision)

    def delete(self, partition: str, key: str, condition: Condition) -> WriteReply:
        """Remove ``key`` if it is live and ``condition`` holds."""
        with self._cond:
            self.stats.count("delete")
            p, now = self._open(partition)
            current = p.entries.get(key)
            if current is None or not condition.holds(current):
                return WriteReply(False, replace(current) if current else None, now, p.revision)
            del p.entries[key]
            self._record(p, "delete", key, b"", now)
            return WriteReply(True, current, now, p.revision)

    def touch(self, partition: str, key: str, ttl_ms: int, condition: Condition) -> WriteReply:
        """Renew a live entry's TTL if ``condition`` holds; no revision, no change."""
        check_ttl("ttl-ms", ttl_ms)
        with self._cond:
            self.stats.count("touch")
            p, now = self._open(partition)
            current = p.entries.get(key)
            if current is None or not condition.holds(current):
                return WriteReply(False, replace(current) if current else None, now, p.revision)
            current.expires_at = now + ttl_ms
            return WriteReply(True, replace(current), now, p.revision)

    def changes(self, partition: str, after: int, max: int) -> ChangesReply:
        """At most ``max`` changes after ``after``; ``history-gone`` on a gap."""
        if is_unwatched(partition):
            raise StoreInvalid(f"partition: {partition!r} is unwatched (its name begins "
                               "with '~'), so no change feed is kept for it")
        with self._cond:
            self.stats.count("changes")
            p, now = self._open(partition)
            if after == 0:
                after = p.created  # 0 reads from this incarnation's first change
            if after < p.complete_after or after > p.revision:
                raise HistoryGone(p.complete_after)
            page = [replace(c) for c in p.feed if c.revision > after][:max]
            return ChangesReply(page, p.revision, now)

    def meter(self, partition: str, key: str, request: MeterRequest) -> MeterReply:
        """Run the rate-limit meter of ``key`` on the store's clock."""
        with self._cond:
            self.stats.count("meter")
            p, now = self._open(partition)
            stored = p.meters.get(key)
            state = stored[0] if stored and stored[1] > now else None
            reply, write, reset = meter_algorithms.decide(state, request, now)
            if reset:
                p.meters.pop(key, None)
            elif write is not None:
                p.meters[key] = (write[0], now + write[1])
            return reply

    def wait(self, partition: str, after: int, timeout_ms: int) -> int:
        """Sleep until the revision passes ``after`` (a write, or an entry's TTL
        running out) or ``timeout_ms`` passes on the store's clock."""
        with self._cond:
            self.stats.count("wait")
            return self._wait(partition, after, timeout_ms)

    def _wait(self, partition: str, after: int, timeout_ms: int) -> int:
        p, now = self._open(partition)
        deadline = now + timeout_ms
        while p.revision <= after and now < deadline:
            expiry = self._next_expiry(p)
            until = deadline if expiry is None else min(expiry, deadline)
            self.stats.sleeps += 1
            # Woken early by any write or clock move; then look again.
            self._cond.wait(max(until - now, 1) / 1000)
            p, now = self._open(partition)
        return p.revision

    def wait_then_put(self, partition: str, key: str, value: bytes, ttl_ms: Optional[int],
                      condition: Condition, after: int, timeout_ms: int) -> WriteReply:
        """``wait``, then ``put``, whichever way the wait ended (one call)."""
        check_ttl("ttl-ms", ttl_ms)
        with self._cond:
            self.stats.count("wait-then-put")
            if timeout_ms > 0:
                self._wait(partition, after, timeout_ms)
            return self._put(partition, key, value, ttl_ms, condition)
