"""Distributed locks with fencing tokens: the ``lock`` interface, idiomatically.

``with coord.lock(id, resource) as held:`` acquires, runs the block and
releases; :class:`~coord.errors.Busy` (carrying the holder) when someone
else holds it. The plain calls (:meth:`LockAPI.acquire`, ``release``,
``extend``, ``is_held``, ``inspect``, ``force_release``) are there when the
lock's lifetime does not fit one block.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, Optional, Tuple

from wasmtime.component import Variant

from .arguments import U32, optional_whole, text, whole
from .errors import Busy, CoordError, InvalidArgument, Lost
from .held import HeldRecord
from .linking import field as wit_field
from .linking import record

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, as the store saw it."""

    fence: int
    remaining_ms: int


@dataclass
class HeldLock(HeldRecord):
    """A lock held by the caller: plain data (``to_dict``/``from_dict`` carry it
    to another process, which can release or extend it there).

    ``fence`` is the fencing token: present it at the write boundary and
    refuse writes that bring a lower one than the highest seen.
    """

    _FIELDS: ClassVar[Tuple[str, ...]] = ("id", "resource", "owner", "fence", "ttl_ms", "expires_at")
    _UNBOUND: ClassVar[str] = "coord.release(lock)"

    id: str
    resource: str
    owner: str
    fence: int
    ttl_ms: int
    expires_at: int
    _coord: Any = field(default=None, repr=False, compare=False)

    def release(self) -> bool:
        """Release it: ``True`` when this call freed it, ``False`` when this
        owner no longer held it."""
        return self._bound().release(self)

    def extend(self, ttl_ms: Optional[int] = None) -> "HeldLock":
        """Push the expiry to ``ttl_ms`` (default: its TTL) from the store's now;
        updates this object. Raises :class:`~coord.errors.Lost` when lost."""
        extended = self._bound().extend(self, ttl_ms)
        self.ttl_ms, self.expires_at = extended.ttl_ms, extended.expires_at
        return self

    def is_held(self) -> bool:
        """Whether this acquisition still holds its lock (one store read)."""
        return self._bound().is_held(self)


def _holder(r: Any) -> Holder:
    return Holder(fence=r.fence, remaining_ms=wit_field(r, "remaining-ms"))


def _wait_policy(wait_ms: Optional[int], attempts: Optional[int],
                 delay_ms: Optional[int]) -> Variant:
    """The ``option<wait-policy>`` field as wasmtime-py takes it.

    wasmtime-py leaves a variant untagged when its cases map to distinct
    Python classes, and ``wait-policy``'s do (``no-wait``: ``None``,
    ``timeout``: ``int``, ``attempts``: ``Record``); the option around it
    then has two cases that can both be ``None``, so it is tagged:
    ``Variant("none")`` leaves the component's default (11 attempts at most
    200 ms apart), ``Variant("some", policy)`` gives one.
    """
    if attempts is not None:
        if wait_ms is not None:
            raise TypeError("pass wait_ms or attempts, not both")
        retry = record(max_attempts=whole("options.wait.attempts.max-attempts", attempts, U32),
                       delay_ms=whole("options.wait.attempts.delay-ms",
                                      200 if delay_ms is None else delay_ms))
        return Variant("some", retry)
    if delay_ms is not None:
        raise TypeError("delay_ms goes with attempts")
    if wait_ms is None:
        return Variant("none")
    wait_ms = whole("options.wait.timeout", wait_ms)
    return Variant("some", None if wait_ms == 0 else wait_ms)


class LockContext:
    """What :meth:`LockAPI.lock` returns: acquires on ``__enter__``, releases on ``__exit__``.

    A release the store does not answer leaves the lock to its TTL (the
    work is done; the error is logged, not raised over the block's outcome).
    """

    def __init__(self, coord: "LockAPI", id: str, resource: str, kwargs: Dict[str, Any]) -> None:
        self._coord, self._id, self._resource, self._kwargs = coord, id, resource, kwargs
        self.held: Optional[HeldLock] = None

    def __enter__(self) -> HeldLock:
        self.held = self._coord.acquire(self._id, self._resource, **self._kwargs)
        return self.held

    def __exit__(self, *exc: Any) -> None:
        if self.held is None:
            return
        try:
            self.held.release()
        except CoordError as e:
            log.warning("coord: releasing %s/%s (fence %d) failed; it expires with its TTL: %s",
                        self._id, self._resource, self.held.fence, e)


class LockAPI:
    """The lock methods of :class:`coord.Coord`."""

    def _call(self, interface: str, name: str, *args: Any) -> Any:  # provided by Coord
        raise NotImplementedError

    def lock(self, id: str, resource: str, *, ttl_ms: Optional[int] = None,
             wait_ms: Optional[int] = None, attempts: Optional[int] = None,
             delay_ms: Optional[int] = None) -> LockContext:
        """``with coord.lock(id, resource, ttl_ms=10_000, wait_ms=2_000) as held:``
        — see :meth:`acquire` for the arguments; released when the block ends."""
        kwargs = dict(ttl_ms=ttl_ms, wait_ms=wait_ms, attempts=attempts, delay_ms=delay_ms)
        return LockContext(self, id, resource, kwargs)

    def acquire(self, id: str, resource: str, *, ttl_ms: Optional[int] = None,
                wait_ms: Optional[int] = None, attempts: Optional[int] = None,
                delay_ms: Optional[int] = None) -> HeldLock:
        """Acquire lock (``id``, ``resource``) for ``ttl_ms`` (default 30 s).

        Waiting: ``wait_ms=0`` tries once; ``wait_ms=N`` keeps trying for N ms
        of store time, woken by each release or expiry; ``attempts=``/
        ``delay_ms=`` bound the tries instead; neither: the component's
        default (11 attempts, at most 200 ms apart). Raises
        :class:`~coord.errors.Busy` with the holder when it stays held,
        :class:`~coord.errors.Unavailable` when the store did not answer
        (never ``Busy`` then).
        """
        options = record(ttl_ms=optional_whole("options.ttl-ms", ttl_ms),
                         wait=_wait_policy(wait_ms, attempts, delay_ms))
        outcome = self._call("lock", "acquire", text("id", id), text("resource", resource),
                             options)
        if outcome.tag == "busy":
            raise Busy(_holder(outcome.payload))
        return self._held(outcome.payload)

    def release(self, lock: HeldLock) -> bool:
        """Release ``lock``: ``True`` when this call freed it; ``False`` when this
        owner no longer held it (it never frees another owner's acquisition)."""
        return self._call("lock", "release", _held_record(lock))

    def extend(self, lock: HeldLock, ttl_ms: Optional[int] = None) -> HeldLock:
        """``lock`` pushed to expire ``ttl_ms`` (default: its TTL) after the store's
        now, as a new record (same fence). Raises :class:`~coord.errors.Lost`
        when this owner no longer holds it."""
        # extend-outcome is untagged in wasmtime-py (see _wait_policy): the
        # extended lock's record, or None for `lost`.
        outcome = self._call("lock", "extend", _held_record(lock),
                             optional_whole("ttl-ms", ttl_ms))
        if outcome is None:
            raise Lost(f"lock {lock.id}/{lock.resource} at fence {lock.fence} is no longer held")
        return self._held(outcome)

    def is_held(self, lock: HeldLock) -> bool:
        """Whether ``lock`` still holds its lock, at its owner and fence (one read)."""
        return self._call("lock", "is-held", _held_record(lock))

    def inspect(self, id: str, resource: str) -> Optional[Holder]:
        """Who holds the lock now, if anyone. Reads only."""
        holder = self._call("lock", "inspect", text("id", id), text("resource", resource))
        return None if holder is None else _holder(holder)

    def force_release(self, id: str, resource: str) -> bool:
        """Free the lock whoever holds it (an operator's action); ``True`` when a
        holder was removed."""
        return self._call("lock", "force-release", text("id", id), text("resource", resource))

    def _held(self, r: Any) -> HeldLock:
        return HeldLock(id=r.id, resource=r.resource, owner=r.owner, fence=r.fence,
                        ttl_ms=wit_field(r, "ttl-ms"), expires_at=wit_field(r, "expires-at"),
                        _coord=self)


def _held_record(lock: HeldLock) -> Any:
    """``lock`` as the WIT ``held-lock``, each field checked (it may come from
    :meth:`HeldLock.from_dict` on data that crossed a process boundary)."""
    if not isinstance(lock, HeldLock):
        raise InvalidArgument("lock", f"must be a HeldLock, not {type(lock).__name__}")
    return record(id=text("lock.id", lock.id), resource=text("lock.resource", lock.resource),
                  owner=text("lock.owner", lock.owner), fence=whole("lock.fence", lock.fence),
                  ttl_ms=whole("lock.ttl-ms", lock.ttl_ms),
                  expires_at=whole("lock.expires-at", lock.expires_at))
