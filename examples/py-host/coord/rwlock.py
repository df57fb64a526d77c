"""Fenced read-write locks: the ``rwlock`` interface, idiomatically.

``with coord.read_lock(id, resource) as grant:`` holds the lock beside any
other readers; ``with coord.write_lock(id, resource) as grant:`` holds it
alone. Each raises :class:`~coord.errors.Busy` (carrying a holder in the
way) when the lock stays held in a mode that excludes it. Writers are
preferred: once a writer waits, new readers are turned away. The plain calls
(:meth:`RwLockAPI.acquire_rwlock`, ``release_grant``, ``extend_grant``,
``grant_is_held``, ``inspect_rwlock``, ``force_release_grant``) are there
when a grant's lifetime does not fit one block.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Optional, Tuple

from .arguments import one_of, optional_whole, text, whole
from .errors import Busy, CoordError, InvalidArgument, Lost
from .held import HeldRecord
from .linking import field as wit_field
from .linking import record
from .locks import _wait_policy

log = logging.getLogger(__name__)

#: The modes a grant holds the lock in.
MODES = ("read", "write")


@dataclass(frozen=True)
class GrantHolder:
    """A grant somebody holds, as the store saw it (never its owner token)."""

    mode: str
    fence: int
    remaining_ms: int


@dataclass(frozen=True)
class RwUsage:
    """A read-write lock at one moment: the writer's entry (holding when
    ``readers`` is empty, else waiting for them), the live readers in fence
    order, and the store's now."""

    writer: Optional[GrantHolder]
    readers: List[GrantHolder]
    now: int


@dataclass
class Grant(HeldRecord):
    """A grant held by the caller: plain data (``to_dict``/``from_dict``).

    A writer's ``fence`` is above every earlier grant's of the lock: present
    it at the write boundary and refuse writes that bring a lower one.
    """

    _FIELDS: ClassVar[Tuple[str, ...]] = ("id", "resource", "mode", "owner", "fence", "ttl_ms", "expires_at")
    _UNBOUND: ClassVar[str] = "coord.release_grant(g)"

    id: str
    resource: str
    mode: str
    owner: str
    fence: int
    ttl_ms: int
    expires_at: int
    _coord: Any = field(default=None, repr=False, compare=False)

    def release(self) -> bool:
        """Release it: ``True`` when this call freed it."""
        return self._bound().release_grant(self)


class GrantContext:
    """What :meth:`RwLockAPI.read_lock` and ``write_lock`` return: acquires on
    enter, releases on exit."""

    def __init__(self, coord: "RwLockAPI", args: tuple, kwargs: Dict[str, Any]) -> None:
        self._coord, self._args, self._kwargs = coord, args, kwargs
        self.held: Optional[Grant] = None

    def __enter__(self) -> Grant:
        self.held = self._coord.acquire_rwlock(*self._args, **self._kwargs)
        return self.held

    def __exit__(self, *exc: Any) -> None:
        if self.held is None:
            return
        try:
            self.held.release()
        except CoordError as e:
            log.warning("coord: releasing %s grant %s/%s (fence %d) failed; it expires with "
                        "its TTL: %s", self.held.mode, self.held.id, self.held.resource,
                        self.held.fence, e)


class RwLockAPI:
    """The read-write lock methods of :class:`coord.Coord`."""

    def _call(self, interface: str, name: str, *args: Any) -> Any:  # provided by Coord
        raise NotImplementedError

    def read_lock(self, id: str, resource: str, *, ttl_ms: Optional[int] = None,
                  wait_ms: Optional[int] = None, attempts: Optional[int] = None,
                  delay_ms: Optional[int] = None) -> GrantContext:
        """``with coord.read_lock(id, resource, wait_ms=2_000) as g:`` — see
        :meth:`acquire_rwlock`; released when the block ends."""
        kwargs = dict(ttl_ms=ttl_ms, wait_ms=wait_ms, attempts=attempts, delay_ms=delay_ms)
        return GrantContext(self, (id, resource, "read"), kwargs)

    def write_lock(self, id: str, resource: str, *, ttl_ms: Optional[int] = None,
                   wait_ms: Optional[int] = None, attempts: Optional[int] = None,
                   delay_ms: Optional[int] = None) -> GrantContext:
        """``with coord.write_lock(id, resource, wait_ms=2_000) as g:`` — see
        :meth:`acquire_rwlock`; released when the block ends."""
        kwargs = dict(ttl_ms=ttl_ms, wait_ms=wait_ms, attempts=attempts, delay_ms=delay_ms)
        return GrantContext(self, (id, resource, "write"), kwargs)

    def acquire_rwlock(self, id: str, resource: str, mode: str, *,
                       ttl_ms: Optional[int] = None, wait_ms: Optional[int] = None,
                       attempts: Optional[int] = None,
                       delay_ms: Optional[int] = None) -> Grant:
        """Read-write lock (``id``, ``resource``) in ``mode`` (``"read"`` or
        ``"write"``) for ``ttl_ms`` (default 30 s); waiting as the lock's
        ``acquire``. Raises :class:`~coord.errors.Busy` with a holder in the
        way when the lock stays held in a mode that excludes this one."""
        options = record(ttl_ms=optional_whole("options.ttl-ms", ttl_ms),
                         wait=_wait_policy(wait_ms, attempts, delay_ms))
        outcome = self._call("rwlock", "acquire", text("id", id), text("resource", resource),
                             one_of("mode", mode, MODES), options)
        if outcome.tag == "busy":
            raise Busy(_holder(outcome.payload))
        return self._grant(outcome.payload)

    def release_grant(self, grant: Grant) -> bool:
        """Release ``grant``: ``True`` when this call freed it; it never frees another."""
        return self._call("rwlock", "release", _grant_record(grant))

    def extend_grant(self, grant: Grant, ttl_ms: Optional[int] = None) -> Grant:
        """``grant`` pushed to expire ``ttl_ms`` (default: its TTL) after the
        store's now (same fence). Raises :class:`~coord.errors.Lost` when lost."""
        outcome = self._call("rwlock", "extend", _grant_record(grant),
                             optional_whole("ttl-ms", ttl_ms))
        if outcome is None:
            raise Lost(f"{grant.mode} grant {grant.id}/{grant.resource} at fence {grant.fence} "
                       "is no longer held")
        return self._grant(outcome)

    def grant_is_held(self, grant: Grant) -> bool:
        """Whether ``grant`` still holds the lock (one read; the commit-point check)."""
        return self._call("rwlock", "is-held", _grant_record(grant))

    def inspect_rwlock(self, id: str, resource: str) -> RwUsage:
        """The writer and the live readers of the lock. Reads only."""
        usage = self._call("rwlock", "inspect", text("id", id), text("resource", resource))
        writer = None if usage.writer is None else _holder(usage.writer)
        return RwUsage(writer=writer, readers=[_holder(r) for r in usage.readers],
                       now=usage.now)

    def force_release_grant(self, id: str, resource: str, fence: int) -> bool:
        """Free the grant with ``fence``, read or write (an operator's action)."""
        return self._call("rwlock", "force-release", text("id", id),
                          text("resource", resource), whole("fence", fence))

    def _grant(self, r: Any) -> Grant:
        return Grant(id=r.id, resource=r.resource, mode=r.mode, owner=r.owner, fence=r.fence,
                     ttl_ms=wit_field(r, "ttl-ms"), expires_at=wit_field(r, "expires-at"),
                     _coord=self)


def _holder(r: Any) -> GrantHolder:
    return GrantHolder(mode=r.mode, fence=r.fence, remaining_ms=wit_field(r, "remaining-ms"))


def _grant_record(grant: Grant) -> Any:
    """``grant`` as the WIT ``grant``, each field checked."""
    if not isinstance(grant, Grant):
        raise InvalidArgument("grant", f"must be a Grant, not {type(grant).__name__}")
    return record(id=text("grant.id", grant.id),
                  resource=text("grant.resource", grant.resource),
                  mode=one_of("grant.mode", grant.mode, MODES),
                  owner=text("grant.owner", grant.owner),
                  fence=whole("grant.fence", grant.fence),
                  ttl_ms=whole("grant.ttl-ms", grant.ttl_ms),
                  expires_at=whole("grant.expires-at", grant.expires_at))
