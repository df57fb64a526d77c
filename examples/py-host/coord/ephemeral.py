"""Ephemeral state: short-lived entries per tenant, with a snapshot and a
resumable watch — the ``ephemeral`` interface, idiomatically.

A :class:`Space` names one kind of state and its limits; a tenant
partitions it. ``for event in coord.watch(space, tenant):`` iterates over
the changes; the watch's :attr:`Watch.revision` is the cursor to resume from
(``coord.watch(space, tenant, after=cursor)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Union

from .arguments import U32, data, optional_text, optional_whole, text, whole
from .linking import field as wit_field
from .linking import record

#: The longest a watcher's ``next`` may wait in one call (WIT: 0 to 600000).
MAX_NEXT_MS = 600_000

Bytes = Union[bytes, bytearray, memoryview, str]


@dataclass(frozen=True)
class Space:
    """One kind of ephemeral state: its name (1 to 256 bytes), how long an entry
    lives after its last upsert or touch (``ttl_ms``, 1 to 86400000) and the
    largest value it takes (``max_value_bytes``, 1 to 1048576)."""

    id: str
    ttl_ms: int
    max_value_bytes: int = 65_536

    def _record(self) -> Any:
        return record(id=text("space.id", self.id), ttl_ms=whole("space.ttl-ms", self.ttl_ms),
                      max_value_bytes=whole("space.max-value-bytes", self.max_value_bytes, U32))


@dataclass(frozen=True)
class Entry:
    """A live entry: its key, value, the revision and store time of its last upsert."""

    key: str
    value: bytes
    revision: int
    updated_at: int

    @property
    def text(self) -> str:
        """The value decoded as UTF-8."""
        return self.value.decode("utf-8")


@dataclass(frozen=True)
class Written:
    """What an upsert wrote: its revision and store time."""

    revision: int
    updated_at: int


@dataclass(frozen=True)
class Snapshot:
    """A tenant's live entries at one revision; pass ``revision`` as
    ``watch(after=...)`` to continue from exactly this state."""

    entries: List[Entry]
    revision: int


@dataclass(frozen=True)
class Event:
    """One change a watch reports.

    ``kind`` is ``upsert`` (``value`` is the new value, ``at`` its
    updated-at), ``delete``, ``expire`` (``at``: when the TTL ran out) or
    ``resync-required`` (changes were missed: the watch is closed; open a
    new one without ``after`` and replace local state).
    """

    kind: str
    key: str = ""
    value: bytes = b""
    revision: int = 0
    at: int = 0


def _entry(r: Any) -> Entry:
    return Entry(r.key, bytes(r.value), r.revision, wit_field(r, "updated-at"))


def _event(v: Any) -> Event:
    if v.tag == "upsert":
        e = v.payload
        return Event("upsert", e.key, bytes(e.value), e.revision, wit_field(e, "updated-at"))
    if v.tag in ("delete", "expire"):
        return Event(v.tag, v.payload.key, b"", v.payload.revision, v.payload.at)
    return Event("resync-required")


class Watch:
    """A watch of one tenant: an iterator of :class:`Event`, in revision order.

    Each step waits up to ``timeout_ms`` for the next event and ends the
    iteration when none came (``None``: waits for ever). ``resync-required``
    is yielded once, then the iteration ends. Close it (or use it in a
    ``with``) to free the component's watcher; ending the iteration closes it.
    """

    def __init__(self, coord: Any, watcher: Any, timeout_ms: Optional[int]) -> None:
        self._coord = coord
        self._watcher = watcher
        self._timeout_ms = timeout_ms
        self._revision = 0
        self._closed = False

    @property
    def revision(self) -> int:
        """The revision of the last event returned (or the starting point):
        reopening with ``after=`` it loses and repeats nothing."""
        if not self._closed:
            self._revision = self._coord._call("ephemeral", "[method]watcher.revision",
                                               self._watcher)
        return self._revision

    def next(self, timeout_ms: int = 0) -> Optional[Event]:
        """The next event, waiting up to ``timeout_ms`` (0 to 600000) for one;
        ``None`` when that time passed on the store's clock with none."""
        if self._closed:
            raise ValueError("the watch is closed")
        event = self._coord._call("ephemeral", "[method]watcher.next", self._watcher,
                                  whole("timeout-ms", timeout_ms))
        return None if event is None else _event(event)

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        if self._closed:
            raise StopIteration
        while True:
            wait = MAX_NEXT_MS if self._timeout_ms is None else self._timeout_ms
            event = self.next(wait)
            if event is not None:
                break
            if self._timeout_ms is not None:
                self.close()
                raise StopIteration
        if event.kind == "resync-required":
            # Yielded once; the watcher would answer it for ever.
            self.close()
        return event

    def close(self) -> None:
        """Free the component's watcher (keeps :attr:`revision` readable)."""
        if not self._closed:
            self.revision  # keep the cursor for after the close
            self._closed = True
            self._coord._drop(self._watcher)

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class EphemeralAPI:
    """The ephemeral-state methods of :class:`coord.Coord`."""

    def _call(self, interface: str, name: str, *args: Any) -> Any:  # provided by Coord
        raise NotImplementedError

    def _drop(self, resource: Any) -> None:  # provided by Coord
        raise NotImplementedError

    def put(self, space: Space, tenant: str, key: str, value: Bytes) -> Written:
        """Create or replace an entry (a ``str`` value is stored as UTF-8); it
        expires ``space.ttl_ms`` from now."""
        w = self._call("ephemeral", "upsert", space._record(), text("tenant", tenant),
                       text("key", key), data("value", value))
        return Written(w.revision, wit_field(w, "updated-at"))

    def get(self, space: Space, tenant: str, key: str) -> Optional[Entry]:
        """The live entry under ``key``, or ``None`` (one snapshot of that prefix)."""
        for entry in self.snapshot(space, tenant, prefix=key).entries:
            if entry.key == key:
                return entry
        return None

    def touch(self, space: Space, tenant: str, key: str) -> bool:
        """Renew an entry's TTL (no event); ``False`` when it is gone: recreate it."""
        return self._call("ephemeral", "touch", space._record(), text("tenant", tenant),
                          text("key", key))

    def delete(self, space: Space, tenant: str, key: str) -> bool:
        """Remove an entry; ``False`` when it did not exist."""
        return self._call("ephemeral", "delete", space._record(), text("tenant", tenant),
                          text("key", key))

    def list(self, space: Space, tenant: str, prefix: str = "") -> List[Entry]:
        """The live entries whose keys start with ``prefix``, in key order."""
        return self.snapshot(space, tenant, prefix=prefix).entries

    def snapshot(self, space: Space, tenant: str, prefix: Optional[str] = None) -> Snapshot:
        """The live entries (with ``prefix``) and the tenant's revision, atomically."""
        s = self._call("ephemeral", "snapshot", space._record(), text("tenant", tenant),
                       optional_text("prefix", prefix) or None)
        return Snapshot([_entry(e) for e in s.entries], s.revision)

    def watch(self, space: Space, tenant: str, prefix: Optional[str] = None,
              after: Optional[int] = None, timeout_ms: Optional[int] = None) -> Watch:
        """Watch the entries (with ``prefix``). Without ``after`` the current
        entries come first, as upserts; with it (a snapshot's or a watch's
        revision) only the changes after it. Iterating waits up to
        ``timeout_ms`` for each event, for ever when ``None``."""
        watcher = self._call("ephemeral", "watch", space._record(), text("tenant", tenant),
                             optional_text("prefix", prefix) or None,
                             optional_whole("after", after))
        return Watch(self, watcher, optional_whole("timeout-ms", timeout_ms))
