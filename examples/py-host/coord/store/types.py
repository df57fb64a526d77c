"""The store contract (wit/store.wit) as plain Python values.

Backends (:class:`~coord.store.memory.MemoryStore`,
:class:`~coord.store.redis_backend.RedisStore`) speak these types and raise
:class:`StoreError`; :mod:`coord.linking` converts both to and from the
component's ``Record``/``Variant`` values at the boundary, where every
error becomes the WIT ``error`` variant (an exception escaping a host
function would trap the component).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Protocol

#: The largest TTL a store accepts: TTLs travel as signed 64-bit numbers.
MAX_TTL_MS = 2**63 - 1

#: How many changes a partition's feed keeps by default.
DEFAULT_HISTORY = 1024

#: How long a quiet partition is kept by default (Redis key TTL margin), in ms.
DEFAULT_RETENTION_MS = 600_000


def is_unwatched(partition: str) -> bool:
    """Whether ``partition`` keeps no change feed (its name begins with ``~``)."""
    return partition.startswith("~")


def may_hold_many(partition: str) -> bool:
    """Whether ``partition`` may hold many entries: a semaphore's (``~sem:``),
    one entry per permit held, or a read-write lock's (``~rw:``), one per
    reader. The component's ``keys::may_hold_many``."""
    return partition.startswith(("~sem:", "~rw:"))


class StoreError(Exception):
    """A store request failed; the subclass is the WIT ``error`` case."""


class StoreUnavailable(StoreError):
    """``unavailable``: the store could not be reached or answered garbage."""


class HistoryGone(StoreError):
    """``history-gone``: the feed is complete only after ``revision``."""

    def __init__(self, revision: int) -> None:
        super().__init__(f"history gone: the feed is complete after revision {revision}")
        self.revision = revision


class StoreInvalid(StoreError):
    """``invalid``: the request was malformed; the message names the field."""


@dataclass
class Entry:
    """A live entry (WIT ``entry``)."""

    key: str
    value: bytes
    revision: int
    updated_at: int
    expires_at: Optional[int]


@dataclass(frozen=True)
class Condition:
    """What must hold for a conditional write (WIT ``condition``).

    ``kind`` is ``always``, ``absent``, ``revision``,
    ``revision-and-value`` or ``absent-and-fewer-than``; ``revision`` and
    ``revision-and-value`` use ``revision``, the latter ``value`` too, and
    ``absent-and-fewer-than`` uses ``limit``.
    """

    kind: str
    revision: int = 0
    value: bytes = b""
    limit: int = 0

    def holds(self, entry: Optional[Entry]) -> bool:
        """Whether the condition holds for ``entry`` (``None``: no live
        entry). ``absent-and-fewer-than``'s count is the put's to check."""
        if self.kind == "always":
            return True
        if self.kind in ("absent", "absent-and-fewer-than"):
            return entry is None
        if entry is None or entry.revision != self.revision:
            return False
        return self.kind == "revision" or entry.value == self.value


ALWAYS = Condition("always")


@dataclass
class ReadReply:
    """A point read's reply."""

    entry: Optional[Entry]
    now: int


@dataclass
class WriteReply:
    """A write's reply: ``applied`` with the entry, or a conflict with the current one;
    the store's now and the partition's revision once the write was decided."""

    applied: bool
    entry: Optional[Entry]
    now: int
    revision: int


@dataclass
class ListReply:
    """A listing: entries in key order, the partition's revision, the store's now."""

    entries: List[Entry]
    revision: int
    now: int


@dataclass
class Change:
    """One change of the feed; ``kind`` is ``put``, ``delete`` or ``expire``."""

    kind: str
    key: str
    value: bytes
    revision: int
    at: int


@dataclass
class ChangesReply:
    """A page of the change feed."""

    changes: List[Change]
    revision: int
    now: int


@dataclass
class MeterRequest:
    """A meter request: ``algorithm`` is ``sliding-window``, ``fixed-window`` or
    ``gcra``; ``mode`` is ``consume``, ``peek``, ``reset``, ``charge`` or
    ``refund`` (giving back ``cost`` units counted at ``refund_at``)."""

    algorithm: str
    limit: int
    window_ms: int
    cost: int
    mode: str
    refund_at: int = 0


@dataclass
class MeterReply:
    """A meter's answer."""

    allowed: bool
    remaining: int
    reset_in_ms: int
    retry_after_ms: int
    now: int


@dataclass
class StoreStats:
    """Counters a test reads to tell a sleeping wait from a spinning one."""

    calls: int = 0
    sleeps: int = 0
    by_op: dict = field(default_factory=dict)

    def count(self, op: str) -> None:
        """Count one call of ``op``."""
        self.calls += 1
        self.by_op[op] = self.by_op.get(op, 0) + 1


class Store(Protocol):
    """What :class:`coord.Coord` needs of a store: wit/store.wit, in Python.

    Every method raises :class:`StoreError` (never anything else on purpose)
    and is safe to call from several threads.
    """

    stats: StoreStats

    def now(self) -> int:
        """The store's clock, in ms."""

    def get(self, partition: str, key: str) -> ReadReply:
        """Read one key."""

    def list(self, partition: str, prefix: str) -> ListReply:
        """The live entries whose keys start with ``prefix``, with the revision."""

    def put(self, partition: str, key: str, value: bytes, ttl_ms: Optional[int],
            condition: Condition) -> WriteReply:
        """Write ``value`` under ``key`` if ``condition`` holds."""

    def delete(self, partition: str, key: str, condition: Condition) -> WriteReply:
        """Remove ``key`` if ``condition`` holds."""

    def touch(self, partition: str, key: str, ttl_ms: int, condition: Condition) -> WriteReply:
        """Renew a live entry's TTL if ``condition`` holds."""

    def changes(self, partition: str, after: int, max: int) -> ChangesReply:
        """At most ``max`` changes after ``after``."""

    def meter(self, partition: str, key: str, request: MeterRequest) -> MeterReply:
        """Run the rate-limit meter of ``key``."""

    def wait(self, partition: str, after: int, timeout_ms: int) -> int:
        """Block until the revision passes ``after`` or ``timeout_ms`` passes."""

    def wait_then_put(self, partition: str, key: str, value: bytes, ttl_ms: Optional[int],
                      condition: Condition, after: int, timeout_ms: int) -> WriteReply:
        """``wait``, then ``put``, as one request."""


def check_ttl(name: str, ttl_ms: Optional[int]) -> None:
    """Raise ``invalid`` naming ``name`` when a TTL cannot travel as an i64."""
    if ttl_ms is not None and ttl_ms > MAX_TTL_MS:
        raise StoreInvalid(f"{name}: {ttl_ms} is above the largest TTL a store "
                           f"represents ({MAX_TTL_MS} ms)")
