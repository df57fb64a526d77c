"""Rate limits shared by every instance: the ``ratelimit`` interface, idiomatically.

``decision = coord.limit(limiter, key)``; ``decision.limited`` with
``decision.retry_after_ms`` is an HTTP 429 with ``Retry-After``. For work
whose cost is known only after it: ``decision, r = coord.reserve(limiter,
key, estimate, ttl_ms)``, then ``coord.settle(limiter, r, actual)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple

from .arguments import U32, one_of, optional_whole, text, whole
from .errors import InvalidArgument
from .linking import field as wit_field
from .linking import record

ALGORITHMS = ("sliding-window", "fixed-window", "token-bucket")


@dataclass(frozen=True)
class Limiter:
    """A limit: its name (1 to 256 bytes), ``limit`` units (1 to 10000000) per
    ``window_ms`` (1 to 86400000), counted by ``algorithm`` (one of
    :data:`ALGORITHMS`; ``None``: sliding window). The same id must always
    be used with the same terms."""

    id: str
    limit: int
    window_ms: int
    algorithm: Optional[str] = None

    def _record(self) -> Any:
        algorithm = None if self.algorithm is None else one_of("limiter.algorithm",
                                                                self.algorithm, ALGORITHMS)
        return record(id=text("limiter.id", self.id), limit=whole("limiter.limit", self.limit, U32),
                      window_ms=whole("limiter.window-ms", self.window_ms), algorithm=algorithm)


@dataclass(frozen=True)
class Decision:
    """A check's answer: whether the request may proceed (and was counted),
    the limit, units left, ms until fully available, ms until a request of
    the same cost would be allowed (0 when allowed)."""

    allowed: bool
    limit: int
    remaining: int
    reset_in_ms: int
    retry_after_ms: int

    @property
    def limited(self) -> bool:
        """``not allowed``."""
        return not self.allowed


def _decision(r: Any) -> Decision:
    return Decision(r.allowed, r.limit, r.remaining, wit_field(r, "reset-in-ms"),
                    wit_field(r, "retry-after-ms"))


class RateLimitAPI:
    """The rate-limit methods of :class:`coord.Coord`."""

    def _call(self, interface: str, name: str, *args: Any) -> Any:  # provided by Coord
        raise NotImplementedError

    def limit(self, limiter: Limiter, key: str, cost: Optional[int] = None) -> Decision:
        """Count a request of ``cost`` units (default 1) against ``key`` if it
        fits; a limited request counts nothing."""
        return _decision(self._call("ratelimit", "check", limiter._record(), text("key", key),
                                    optional_whole("cost", cost, U32)))

    def peek_limit(self, limiter: Limiter, key: str) -> Decision:
        """What :meth:`limit` with cost 1 would answer now, counting nothing."""
        return _decision(self._call("ratelimit", "peek", limiter._record(), text("key", key)))

    def reset_limit(self, limiter: Limiter, key: str) -> None:
        """Forget everything counted for ``key``: it has the full limit again."""
        self._call("ratelimit", "reset", limiter._record(), text("key", key))

    def reserve(self, limiter: Limiter, key: str, cost: int,
                ttl_ms: int) -> Tuple[Decision, Optional[Reservation]]:
        """Count an estimated ``cost`` now, as :meth:`limit` would; the
        reservation to settle within ``ttl_ms`` when allowed, else ``None``."""
        r = self._call("ratelimit", "reserve", limiter._record(), text("key", key),
                       whole("cost", cost, U32), whole("ttl-ms", ttl_ms))
        reservation = None if r.reservation is None else _reservation(r.reservation)
        return _decision(r.decision), reservation

    def settle(self, limiter: Limiter, reservation: Reservation, actual: int) -> str:
        """Settle ``reservation`` with the units really used: ``"settled"``,
        ``"already-settled"``, ``"expired"`` (it then counts in full) or
        ``"unknown"`` (the store holds no record of it: forged, edited, or
        kept past twice its TTL); only the store's record decides."""
        return self._call("ratelimit", "settle", limiter._record(),
                          _reservation_record(reservation), whole("actual", actual, U32))

    def cancel(self, limiter: Limiter, reservation: Reservation) -> str:
        """Give ``reservation`` back whole: :meth:`settle` with 0."""
        return self._call("ratelimit", "cancel", limiter._record(),
                          _reservation_record(reservation))


@dataclass(frozen=True)
class Reservation:
    """Units reserved by :meth:`RateLimitAPI.reserve`: plain data to settle
    (here or in another process) once the real cost is known."""

    id: str
    key: str
    token: str
    cost: int
    reserved_at: int
    expires_at: int


def _reservation(r: Any) -> Reservation:
    return Reservation(r.id, r.key, r.token, r.cost, wit_field(r, "reserved-at"),
                       wit_field(r, "expires-at"))


def _reservation_record(r: Reservation) -> Any:
    if not isinstance(r, Reservation):
        raise InvalidArgument("reservation", f"must be a Reservation, not {type(r).__name__}")
    return record(id=text("reservation.id", r.id), key=text("reservation.key", r.key),
                  token=text("reservation.token", r.token),
                  cost=whole("reservation.cost", r.cost, U32),
                  reserved_at=whole("reservation.reserved-at", r.reserved_at),
                  expires_at=whole("reservation.expires-at", r.expires_at))
