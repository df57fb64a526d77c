"""The exceptions the wrappers raise, one class per WIT error case.

Contention is never an exception in the WIT interfaces (a held lock is a
`busy` *result*), but in Python the idiomatic way to say "you did not get
it" from a ``with`` block is an exception, so :class:`Busy` (and
:class:`Lost`, :class:`NotHolder`, :class:`InGrace`) exist beside the
error cases proper. Every class derives from :class:`CoordError`, and
:class:`Unavailable` never derives from :class:`Busy` (or the reverse): an
unreachable store must not be mistaken for a held lock.
"""

from __future__ import annotations

from typing import Any, Optional


class CoordError(Exception):
    """Base class of every exception this package raises on purpose."""


class Unavailable(CoordError):
    """The store could not be reached or did not answer in time.

    The call MAY have taken effect: it was neither acquired nor busy,
    neither allowed nor limited, as far as the caller can know.
    """


class InvalidArgument(CoordError, ValueError):
    """An argument was rejected before the store was asked.

    ``field`` is the argument's name as the WIT interface spells it (for
    example ``options.ttl-ms`` or ``limiter.window-ms``); ``reason`` says why.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class Internal(CoordError):
    """The store answered something that breaks its contract."""


class Busy(CoordError):
    """A lock is held by someone else; ``holder`` says who, as the store saw it."""

    def __init__(self, holder: Any) -> None:
        super().__init__(f"lock is busy: held at fence {holder.fence}, "
                         f"{holder.remaining_ms} ms left")
        self.holder = holder


class Lost(CoordError):
    """A held lock is no longer held by this owner (it expired or was force-released)."""


class NotHolder(CoordError):
    """The caller does not hold the lease; ``holder`` is who does (``None``: nobody)."""

    def __init__(self, holder: Optional[Any]) -> None:
        who = "nobody" if holder is None else f"node {holder.node!r} at epoch {holder.epoch}"
        super().__init__(f"not the lease holder: {who} holds it")
        self.holder = holder


class InGrace(CoordError):
    """The caller holds the lease but may not write for ``remaining_ms`` more."""

    def __init__(self, remaining_ms: int) -> None:
        super().__init__(f"lease held but in the previous holder's grace for {remaining_ms} ms")
        self.remaining_ms = remaining_ms


def from_wit(error: Any) -> CoordError:
    """The exception for a WIT ``error`` variant of lock, ephemeral, ratelimit or lease.

    ``error`` is the ``wasmtime.component.Variant`` the component returned;
    lease's ``not-holder`` payload is converted by the caller, which knows
    the record's shape, so it arrives here already converted.
    """
    tag, payload = error.tag, error.payload
    if tag == "unavailable":
        return Unavailable(payload)
    if tag == "invalid-argument":
        return InvalidArgument(payload.field, payload.reason)
    if tag == "internal":
        return Internal(payload)
    if tag == "not-holder":
        return NotHolder(payload)
    if tag == "in-grace":
        return InGrace(payload)
    return Internal(f"unknown error case {tag!r}: {payload!r}")
