"""What the project's Redis scripts take and answer, byte for byte.

The argument layouts and reply shapes are those of
host-test/redis/src/codec.rs (the Rust Redis backend), so this host
and that one read and write the same keys the same way:

- ``redis.lua`` takes text arguments after its operation name, clock and
  channel: only those the operation reads, then the condition
  (:func:`script_args`);
- ``unwatched.lua`` and ``meter.lua`` take one packed argument
  (:func:`packed_unwatched`, :func:`packed_meter`);
- an applied write answers one packed string, which leaves out the value
  when the caller sent it itself (:func:`applied_write`); a conflict, a
  read and a ``check`` answer flat arrays (:class:`Reader`); a listing, a
  feed page and a meter answer packed strings.

Numbers in packed strings are little-endian doubles holding whole numbers
below 2^53, or -1 for "none". Anything else is a malformed reply, which the
backend reports as ``unavailable``.
"""

from __future__ import annotations

import struct
from typing import Any, List, Optional, Sequence

from .types import (
    Change, ChangesReply, Condition, Entry, ListReply, MeterReply, MeterRequest, StoreUnavailable,
    WriteReply, is_unwatched, may_hold_many,
)

#: unwatched.lua's operation codes.
OP_CODES = {"get": 1, "put": 2, "touch": 3, "delete": 4, "list": 5, "check": 6, "arm": 7}
#: unwatched.lua's condition codes (0: the operation takes none).
CONDITION_CODES = {"always": 1, "absent": 2, "revision": 3, "revision-and-value": 4,
                   "absent-and-fewer-than": 5}
#: meter.lua's codes.
ALGORITHM_CODES = {"sliding-window": 1, "fixed-window": 2, "gcra": 3}
MODE_CODES = {"consume": 1, "peek": 2, "reset": 3, "charge": 4, "refund": 5}

_TWO_53 = float(2**53)
_MINUS_ONE = struct.pack("<d", -1.0)
_KINDS = {ord("p"): "put", ord("d"): "delete", ord("e"): "expire"}


def malformed(what: str) -> StoreUnavailable:
    """The error for a reply this codec cannot read."""
    return StoreUnavailable(f"redis: malformed reply ({what})")


# -- arguments ----------------------------------------------------------------

def one_string(partition: str) -> bool:
    """Whether unwatched.lua keeps ``partition`` as one string read and
    rewritten whole by every call: an unwatched partition of a few entries
    (a lock's, a lease's). One that may hold many (a semaphore's) is kept by
    redis.lua, as a watched partition is, whose calls cost the same at 10 000
    entries as at none; the Rust backend's ``one_string``, so both meet on one
    layout."""
    return is_unwatched(partition) and not may_hold_many(partition)


def condition_args(condition: Optional[Condition]) -> List[Any]:
    """A condition as redis.lua reads it: its type, then revision, then value."""
    if condition is None:
        return []
    if condition.kind in ("always", "absent"):
        return [condition.kind]
    if condition.kind == "revision":
        return ["revision", condition.revision]
    if condition.kind == "absent-and-fewer-than":
        return ["absent-and-fewer-than", condition.limit]
    return ["revision-and-value", condition.revision, condition.value]


def script_args(op: str, key: str = "", value: Optional[bytes] = None,
                ttl_ms: Optional[int] = None, condition: Optional[Condition] = None,
                after: int = 0, max: int = 0) -> List[Any]:
    """``op``'s own arguments for redis.lua (after ARGV[1..3]), only those it reads."""
    if op in ("get", "list", "delete"):
        args: List[Any] = [key]
    elif op == "put":
        args = [key, value or b"", -1 if ttl_ms is None else ttl_ms]
    elif op == "touch":
        args = [key, -1 if ttl_ms is None else ttl_ms]
    elif op == "changes":
        args = [after, max]
    else:  # check
        args = []
    return args + condition_args(condition)


def packed_unwatched(op: str, key: str = "", value: Optional[bytes] = None,
                     ttl_ms: Optional[int] = None, condition: Optional[Condition] = None,
                     after: int = 0, clock: float = -1.0) -> bytes:
    """``op`` and its inputs as unwatched.lua's one argument; ``clock`` -1 asks
    for Redis's TIME."""
    if condition is None:
        code, guard, guard_value = 0, 0, b""
    else:
        code = CONDITION_CODES[condition.kind]
        guard = condition.revision if condition.kind.startswith("revision") else 0
        if condition.kind == "absent-and-fewer-than":
            guard = condition.limit  # the guard number carries the limit
        guard_value = condition.value if condition.kind == "revision-and-value" else b""
    number = float(after) if op == "arm" else (-1.0 if ttl_ms is None else float(ttl_ms))
    out = [struct.pack("<BBddd", OP_CODES[op], code, clock, number, float(guard))]
    for part in (key.encode(), value or b"", guard_value):
        out.append(struct.pack("<I", len(part)))
        out.append(part)
    return b"".join(out)


def packed_meter(request: MeterRequest, clock: float = -1.0) -> bytes:
    """A meter request as meter.lua's one argument."""
    return struct.pack("<BBddddd", ALGORITHM_CODES[request.algorithm], MODE_CODES[request.mode],
                       clock, float(request.limit), float(request.window_ms),
                       float(request.cost), float(request.refund_at))


def sent_value(value: Optional[bytes], condition: Optional[Condition]) -> Optional[bytes]:
    """The value an applied write leaves when this call sent it (the script
    then leaves it out of its reply): a put's own, or a guard's."""
    if value is not None:
        return value
    if condition is not None and condition.kind == "revision-and-value":
        return condition.value
    return None


# -- packed replies -----------------------------------------------------------

class Packed:
    """Reads a string the scripts packed with Lua's ``struct`` (little endian)."""

    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.pos = 0

    def take(self, n: int) -> bytes:
        """The next ``n`` bytes."""
        if len(self.data) - self.pos < n:
            raise malformed("a packed reply cut short")
        out = bytes(self.data[self.pos:self.pos + n])
        self.pos += n
        return out

    def byte(self) -> int:
        """One byte."""
        return self.take(1)[0]

    def length(self) -> int:
        """A ``struct`` ``I4``."""
        return struct.unpack("<I", self.take(4))[0]

    def number(self) -> int:
        """A whole number below 2^53, packed as a double."""
        n = struct.unpack("<d", self.take(8))[0]
        if not (0.0 <= n < _TWO_53) or n != int(n):
            raise malformed(f"a packed number {n!r}")
        return int(n)

    def optional(self) -> Optional[int]:
        """A number where -1 means none."""
        if bytes(self.data[self.pos:self.pos + 8]) == _MINUS_ONE:
            self.pos += 8
            return None
        return self.number()

    def rest(self) -> bytes:
        """Everything left."""
        out = bytes(self.data[self.pos:])
        self.pos = len(self.data)
        return out

    def done(self) -> bool:
        """Whether everything was read."""
        return self.pos >= len(self.data)


def applied_write(packed: bytes, key: str, sent: Optional[bytes]) -> WriteReply:
    """An applied write: ``struct.pack('<Bddddd', with_value, now, the partition's
    revision, the entry's revision, updated-at, expires-at)``, then the value when
    ``with_value`` is 1."""
    p = Packed(packed)
    with_value = p.byte()
    now, partition_revision = p.number(), p.number()
    revision, updated_at, expires_at = p.number(), p.number(), p.optional()
    rest = p.rest()
    if with_value == 1:
        value = rest
    elif with_value == 0 and sent is not None and not rest:
        value = sent
    else:
        raise malformed("a packed write reply without its value")
    return WriteReply(True, Entry(key, value, revision, updated_at, expires_at), now,
                      partition_revision)


def listing(packed: bytes) -> ListReply:
    """A listing: ``<dd`` now, revision, then per entry its field (``=`` key)
    and stored bytes (``<ddd`` header, value) with ``<I4I4`` lengths; sorted
    here by key bytes (the script's order is the server's locale's)."""
    p = Packed(packed)
    now, revision = p.number(), p.number()
    entries = []
    while not p.done():
        field_len, stored_len = p.length(), p.length()
        field = p.take(field_len)
        if not field.startswith(b"="):
            raise malformed("a listed field that is not an entry")
        stored = Packed(p.take(stored_len))
        rev, updated_at, expires_at = stored.number(), stored.number(), stored.optional()
        entries.append(Entry(_utf8(field[1:]), stored.rest(), rev, updated_at, expires_at))
    entries.sort(key=lambda e: e.key.encode())
    return ListReply(entries, revision, now)


def page(packed: bytes) -> ChangesReply:
    """A feed page: ``<dd`` now, revision, then per change its stream id
    (``<revision>-0``) and message (``<dddI4`` at, previous, seq, #key; the
    kind byte; key; value) with ``<I4I4`` lengths."""
    p = Packed(packed)
    now, revision = p.number(), p.number()
    changes = []
    while not p.done():
        id_len, message_len = p.length(), p.length()
        stream_id = p.take(id_len)
        if not stream_id.endswith(b"-0") or not stream_id[:-2].isdigit():
            raise malformed("a feed id")
        m = Packed(p.take(message_len))
        at, _previous, _seq = m.number(), m.number(), m.number()
        key_len = m.length()
        kind = _KINDS.get(m.byte())
        if kind is None:
            raise malformed("an unknown change kind")
        key = _utf8(m.take(key_len))
        changes.append(Change(kind, key, m.rest(), int(stream_id[:-2]), at))
    return ChangesReply(changes, revision, now)


def meter_reply(packed: bytes) -> MeterReply:
    """A meter's answer: ``struct.pack('<Bdddd', allowed, remaining, reset-in,
    retry-after, now)``."""
    p = Packed(packed)
    allowed = p.byte()
    if allowed not in (0, 1):
        raise malformed("a meter's allowed")
    remaining, reset_in, retry, now = p.number(), p.number(), p.number(), p.number()
    if not p.done() or remaining > 0xFFFFFFFF:
        raise malformed("a meter reply")
    return MeterReply(allowed == 1, remaining, reset_in, retry, now)


# -- array replies ------------------------------------------------------------

class Reader:
    """Reads a flat array reply (integers and bulk strings) front to back."""

    def __init__(self, values: Any) -> None:
        if not isinstance(values, list):
            raise malformed(f"expected an array, got {type(values).__name__}")
        self.values: Sequence[Any] = values
        self.pos = 0

    def next(self) -> Any:
        """The next element."""
        if self.pos >= len(self.values):
            raise malformed("too short")
        self.pos += 1
        return self.values[self.pos - 1]

    def integer(self) -> int:
        """An integer."""
        v = self.next()
        if not isinstance(v, int) or isinstance(v, bool):
            raise malformed(f"expected an integer, got {v!r}")
        return v

    def u64(self) -> int:
        """A non-negative integer."""
        v = self.integer()
        if v < 0:
            raise malformed("a negative number")
        return v

    def optional(self) -> Optional[int]:
        """An integer where -1 (any negative) means none."""
        v = self.integer()
        return v if v >= 0 else None

    def string(self) -> bytes:
        """A bulk string."""
        v = self.next()
        if not isinstance(v, bytes):
            raise malformed(f"expected a string, got {v!r}")
        return v

    def entry(self) -> Entry:
        """key, value, revision, updated-at, expires-at (-1: none)."""
        return Entry(_utf8(self.string()), self.string(), self.u64(), self.u64(), self.optional())

    def maybe_entry(self) -> Optional[Entry]:
        """A presence flag (0 or 1) followed, when 1, by an entry."""
        return self.entry() if self.u64() == 1 else None


def write_reply(reply: Any, key: str, sent: Optional[bytes]) -> WriteReply:
    """A write's reply: one packed string when applied, ``{now, 0, revision, entry?}``
    otherwise."""
    if isinstance(reply, bytes):
        return applied_write(reply, key, sent)
    r = Reader(reply)
    now = r.u64()
    applied = r.u64() == 1
    revision = r.u64()
    entry = r.maybe_entry()
    if applied:
        if entry is None:
            raise malformed("an applied write without its entry")
        return WriteReply(True, entry, now, revision)
    return WriteReply(False, entry, now, revision)


def _utf8(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise malformed("a key that is not UTF-8") from None
