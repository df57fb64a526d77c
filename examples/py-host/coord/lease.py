"""Single-writer leases with epochs and a failover grace: the ``lease``
interface, idiomatically. Errors keep apart the reasons a node may not
write: :class:`~coord.errors.Unavailable`, :class:`~coord.errors.NotHolder`
(carrying who holds it) and :class:`~coord.errors.InGrace`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .arguments import text, whole
from .errors import InvalidArgument, NotHolder
from .linking import field as wit_field
from .linking import record


@dataclass(frozen=True)
class LeaseHolder:
    """Who holds a lease: the node, its epoch, ms until it runs out (0: in its
    grace, can be taken over) and ms until it may write."""

    node: str
    epoch: int
    remaining_ms: int
    grace_ms: int


@dataclass(frozen=True)
class HeldLease:
    """A lease held by the caller; present ``epoch`` at the write boundary.
    ``writable_at`` is the store time from which it may write (0: at once)."""

    name: str
    node: str
    epoch: int
    ttl_ms: int
    expires_at: int
    writable_at: int

    def _record(self) -> Any:
        return record(name=text("lease.name", self.name), node=text("lease.node", self.node),
                      epoch=whole("lease.epoch", self.epoch),
                      ttl_ms=whole("lease.ttl-ms", self.ttl_ms),
                      expires_at=whole("lease.expires-at", self.expires_at),
                      writable_at=whole("lease.writable-at", self.writable_at))


def _lease_record(lease: Any) -> Any:
    """``lease`` as the WIT ``held-lease``, each field checked."""
    if not isinstance(lease, HeldLease):
        raise InvalidArgument("lease", f"must be a HeldLease, not {type(lease).__name__}")
    return lease._record()


def _lease(r: Any) -> HeldLease:
    return HeldLease(r.name, r.node, r.epoch, wit_field(r, "ttl-ms"), wit_field(r, "expires-at"),
                     wit_field(r, "writable-at"))


def _holder(r: Any) -> Optional[LeaseHolder]:
    if r is None:
        return None
    return LeaseHolder(r.node, r.epoch, wit_field(r, "remaining-ms"), wit_field(r, "grace-ms"))


class LeaseAPI:
    """The lease methods of :class:`coord.Coord`."""

    def _call(self, interface: str, name: str, *args: Any) -> Any:  # provided by Coord
        raise NotImplementedError

    def _lease_call(self, name: str, *args: Any) -> Any:
        try:
            return self._call("lease", name, *args)
        except NotHolder as e:
            raise NotHolder(_holder(e.holder)) from None

    def acquire_lease(self, name: str, node: str, ttl_ms: int) -> HeldLease:
        """Acquire, adopt (``node`` already holds it) or take over (in its grace)
        lease ``name``; :class:`~coord.errors.NotHolder` when another node holds it."""
        return _lease(self._lease_call("acquire", text("name", name), text("node", node),
                                       whole("ttl-ms", ttl_ms)))

    def renew_lease(self, lease: HeldLease) -> HeldLease:
        """Renew for its TTL from the store's now, if still held at its epoch."""
        return _lease(self._lease_call("renew", _lease_record(lease)))

    def check_lease(self, lease: HeldLease) -> HeldLease:
        """The commit-point check before a write: the lease as the store has it,
        or :class:`~coord.errors.NotHolder` / :class:`~coord.errors.InGrace`."""
        return _lease(self._lease_call("check", _lease_record(lease)))

    def resign_lease(self, lease: HeldLease) -> bool:
        """Give the lease up; ``False`` when this node no longer held it at this epoch."""
        return self._lease_call("resign", _lease_record(lease))

    def observe_lease(self, name: str) -> Optional[LeaseHolder]:
        """Who holds ``name``, if anyone. Reads only."""
        return _holder(self._lease_call("observe", text("name", name)))
