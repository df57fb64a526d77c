"""Fenced counting semaphores: the ``semaphore`` interface, idiomatically.

``with coord.permit(id, resource, limit) as permit:`` acquires one of
``limit`` places, runs the block and releases;
:class:`~coord.errors.Busy` (carrying the permit that expires first) when
every place stays taken. The plain calls (:meth:`SemaphoreAPI.acquire_permit`,
``release_permit``, ``extend_permit``, ``permit_is_held``,
``inspect_semaphore``, ``force_release_permit``) are there when a permit's
lifetime does not fit one block.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Optional, Tuple

from .arguments import U32, optional_whole, text, whole
from .errors import Busy, CoordError, InvalidArgument, Lost
from .held import HeldRecord
from .linking import field as wit_field
from .linking import record
from .locks import _wait_policy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PermitHolder:
    """A permit somebody holds, as the store saw it (never its owner token)."""

    fence: int
    remaining_ms: int
    limit: int


@dataclass(frozen=True)
class Usage:
    """The live permits of a semaphore, in fence order, and the store's now."""

    permits: List[PermitHolder]
    now: int


@dataclass
class Permit(HeldRecord):
    """A permit held by the caller: plain data (``to_dict``/``from_dict``).

    ``fence`` rises with every permit of the semaphore: present it at the
    write boundary and refuse writes that bring a lower one.
    """

    _FIELDS: ClassVar[Tuple[str, ...]] = ("id", "resource", "owner", "fence", "limit", "ttl_ms", "expires_at")
    _UNBOUND: ClassVar[str] = "coord.release_permit(p)"

    id: str
    resource: str
    owner: str
    fence: int
    limit: int
    ttl_ms: int
    expires_at: int
    _coord: Any = field(default=None, repr=False, compare=False)

    def release(self) -> bool:
        """Release it: ``True`` when this call freed it."""
        return self._bound().release_permit(self)


class PermitContext:
    """What :meth:`SemaphoreAPI.permit` returns: acquires on enter, releases on exit."""

    def __init__(self, coord: "SemaphoreAPI", args: tuple, kwargs: Dict[str, Any]) -> None:
        self._coord, self._args, self._kwargs = coord, args, kwargs
        self.held: Optional[Permit] = None

    def __enter__(self) -> Permit:
        self.held = self._coord.acquire_permit(*self._args, **self._kwargs)
        return self.held

    def __exit__(self, *exc: Any) -> None:
        if self.held is None:
            return
        try:
            self.held.release()
        except CoordError as e:
            log.warning("coord: releasing permit %s/%s (fence %d) failed; it expires with "
                        "its TTL: %s", self.held.id, self.held.resource, self.held.fence, e)


class SemaphoreAPI:
    """The semaphore methods of :class:`coord.Coord`."""

    def _call(self, interface: str, name: str, *args: Any) -> Any:  # provided by Coord
        raise NotImplementedError

    def permit(self, id: str, resource: str, limit: int, *, ttl_ms: Optional[int] = None,
               wait_ms: Optional[int] = None, attempts: Optional[int] = None,
               delay_ms: Optional[int] = None) -> PermitContext:
        """``with coord.permit(id, resource, 10, ttl_ms=30_000, wait_ms=2_000) as p:``
        — see :meth:`acquire_permit`; released when the block ends."""
        kwargs = dict(ttl_ms=ttl_ms, wait_ms=wait_ms, attempts=attempts, delay_ms=delay_ms)
        return PermitContext(self, (id, resource, limit), kwargs)

    def acquire_permit(self, id: str, resource: str, limit: int, *,
                       ttl_ms: Optional[int] = None, wait_ms: Optional[int] = None,
                       attempts: Optional[int] = None,
                       delay_ms: Optional[int] = None) -> Permit:
        """One of ``limit`` (1 to 100 000) places of semaphore (``id``,
        ``resource``) for ``ttl_ms`` (default 30 s); waiting as the lock's
        ``acquire``. Raises :class:`~coord.errors.Busy` with the permit that
        expires first when every place stays taken."""
        options = record(ttl_ms=optional_whole("options.ttl-ms", ttl_ms),
                         wait=_wait_policy(wait_ms, attempts, delay_ms))
        outcome = self._call("semaphore", "acquire", text("id", id),
                             text("resource", resource), whole("limit", limit, U32), options)
        if outcome.tag == "busy":
            raise Busy(_holder(outcome.payload))
        return self._permit(outcome.payload)

    def release_permit(self, permit: Permit) -> bool:
        """Release ``permit``: ``True`` when this call freed it; it never frees another."""
        return self._call("semaphore", "release", _permit_record(permit))

    def extend_permit(self, permit: Permit, ttl_ms: Optional[int] = None) -> Permit:
        """``permit`` pushed to expire ``ttl_ms`` (default: its TTL) after the
        store's now (same fence). Raises :class:`~coord.errors.Lost` when lost."""
        outcome = self._call("semaphore", "extend", _permit_record(permit),
                             optional_whole("ttl-ms", ttl_ms))
        if outcome is None:
            raise Lost(f"permit {permit.id}/{permit.resource} at fence {permit.fence} "
                       "is no longer held")
        return self._permit(outcome)

    def permit_is_held(self, permit: Permit) -> bool:
        """Whether ``permit`` is still held (one read; the commit-point check)."""
        return self._call("semaphore", "is-held", _permit_record(permit))

    def inspect_semaphore(self, id: str, resource: str) -> Usage:
        """The live permits of the semaphore, in fence order. Reads only."""
        usage = self._call("semaphore", "inspect", text("id", id), text("resource", resource))
        return Usage(permits=[_holder(p) for p in usage.permits], now=usage.now)

    def force_release_permit(self, id: str, resource: str, fence: int) -> bool:
        """Free the permit with ``fence``, whoever holds it (an operator's action)."""
        return self._call("semaphore", "force-release", text("id", id),
                          text("resource", resource), whole("fence", fence))

    def _permit(self, r: Any) -> Permit:
        return Permit(id=r.id, resource=r.resource, owner=r.owner, fence=r.fence,
                      limit=r.limit, ttl_ms=wit_field(r, "ttl-ms"),
                      expires_at=wit_field(r, "expires-at"), _coord=self)


def _holder(r: Any) -> PermitHolder:
    return PermitHolder(fence=r.fence, remaining_ms=wit_field(r, "remaining-ms"), limit=r.limit)


def _permit_record(permit: Permit) -> Any:
    """``permit`` as the WIT ``permit``, each field checked."""
    if not isinstance(permit, Permit):
        raise InvalidArgument("permit", f"must be a Permit, not {type(permit).__name__}")
    return record(id=text("permit.id", permit.id),
                  resource=text("permit.resource", permit.resource),
                  owner=text("permit.owner", permit.owner),
                  fence=whole("permit.fence", permit.fence),
                  limit=whole("permit.limit", permit.limit, U32),
                  ttl_ms=whole("permit.ttl-ms", permit.ttl_ms),
                  expires_at=whole("permit.expires-at", permit.expires_at))
