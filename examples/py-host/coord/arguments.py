"""Checking a caller's arguments before they reach the component.

wasmtime-py converts Python values to WIT values without range checks: a
negative ``int`` for a ``u64`` arrives as 2**64 minus it, and 2**64 + 1000
as 1000, which the component would then accept. A ``float`` or ``str``
where a number belongs fails with a message naming no field, and
``bytes(5)`` is five zero bytes. So every wrapper passes its arguments
through these functions, which return the value unchanged or raise
:class:`~coord.errors.InvalidArgument` naming the field as the WIT spells it.
The ranges the component enforces itself (a TTL's 1 to 86400000, a key's
1024 bytes) stay the component's to check: what reaches it is exactly what
the caller passed.
"""

from __future__ import annotations

from typing import Any, Optional

from .errors import InvalidArgument

U32 = 2**32 - 1
U64 = 2**64 - 1


def whole(field: str, value: Any, maximum: int = U64) -> int:
    """``value`` when it is an ``int`` (not a ``bool``) from 0 to ``maximum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(field, f"must be a whole number, not {type(value).__name__}")
    if not 0 <= value <= maximum:
        raise InvalidArgument(field, f"is {value}; it must be between 0 and {maximum}")
    return value


def optional_whole(field: str, value: Any, maximum: int = U64) -> Optional[int]:
    """``None``, or :func:`whole`."""
    return None if value is None else whole(field, value, maximum)


def text(field: str, value: Any) -> str:
    """``value`` when it is a ``str`` that UTF-8 can encode (no lone surrogates)."""
    if not isinstance(value, str):
        raise InvalidArgument(field, f"must be a string, not {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgument(field, f"is not valid Unicode (a lone surrogate at {e.start})") \
            from None
    return value


def optional_text(field: str, value: Any) -> Optional[str]:
    """``None``, or :func:`text`."""
    return None if value is None else text(field, value)


def data(field: str, value: Any) -> bytes:
    """``value`` as bytes: a ``str`` encoded as UTF-8, or ``bytes``, ``bytearray``
    or ``memoryview`` copied; anything else (an ``int`` above all, which
    ``bytes()`` would turn into that many zero bytes) is refused."""
    if isinstance(value, str):
        return text(field, value).encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise InvalidArgument(field, f"must be bytes or str, not {type(value).__name__}")


def one_of(field: str, value: Any, choices: tuple) -> Any:
    """``value`` when it is one of ``choices``."""
    if value not in choices:
        raise InvalidArgument(field, f"is {value!r}; it must be one of {', '.join(choices)}")
    return value
