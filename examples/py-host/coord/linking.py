"""The component's imports: ``coord:sync/store`` on a Python store, and
``wasi:random/random``.

This is the boundary between the component's values (``wasmtime.component``
``Record``s with kebab-case attributes, ``Variant``s, ``None`` for an
absent option, ``bytes`` for ``list<u8>``) and the store's Python types
(:mod:`coord.store.types`). An exception escaping a host function traps the
component, so each one here catches every error and returns it as the WIT
``error`` variant instead: a store's own errors as their case, anything
unexpected (a bug) as ``unavailable``, logged.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any, Callable, Optional

from wasmtime.component import LinkerInstance, Record, Variant

from .store.types import (
    Change, Condition, Entry, HistoryGone, MeterRequest, Store, StoreInvalid, StoreUnavailable,
    WriteReply,
)

STORE_INTERFACE = "coord:sync/store@0.1.0"
RANDOM_INTERFACE = "wasi:random/random@0.2.0"

log = logging.getLogger(__name__)


def record(**fields: Any) -> Record:
    """A ``Record`` whose attributes are ``fields``, ``_`` spelled ``-`` (WIT names)."""
    r = Record()
    for name, value in fields.items():
        setattr(r, name.replace("_", "-"), value)
    return r


def field(r: Record, name: str) -> Any:
    """A record's field by its WIT (kebab-case) name."""
    return getattr(r, name)


# -- store values -> component values -----------------------------------------

def lift_entry(e: Optional[Entry]) -> Optional[Record]:
    """A store entry as the WIT ``entry`` record (``None`` stays ``None``)."""
    if e is None:
        return None
    return record(key=e.key, value=bytes(e.value), revision=e.revision,
                  updated_at=e.updated_at, expires_at=e.expires_at)


def lift_write(w: WriteReply) -> Record:
    """A write's reply: ``outcome`` is ``applied(entry)`` or ``conflict(option<entry>)``."""
    outcome = Variant("applied" if w.applied else "conflict", lift_entry(w.entry))
    return record(outcome=outcome, now=w.now, revision=w.revision)


def lift_change(c: Change) -> Record:
    """One change of the feed; ``kind`` is an enum, so a string."""
    return record(kind=c.kind, key=c.key, value=bytes(c.value), revision=c.revision, at=c.at)


# -- component values -> store values -----------------------------------------

def lower_condition(v: Variant) -> Condition:
    """The WIT ``condition`` variant as a :class:`Condition`."""
    if v.tag in ("always", "absent"):
        return Condition(v.tag)
    if v.tag == "revision":
        return Condition("revision", v.payload)
    if v.tag == "revision-and-value":
        return Condition("revision-and-value", v.payload.revision, bytes(v.payload.value))
    if v.tag == "absent-and-fewer-than":
        return Condition("absent-and-fewer-than", limit=v.payload)
    raise StoreInvalid(f"condition: unknown case {v.tag!r}")


def lower_meter_request(r: Record) -> MeterRequest:
    """The WIT ``meter-request`` record (its enum arrives as a string, its
    ``meter-mode`` variant as a tagged ``Variant``)."""
    mode = r.mode.tag
    refund_at = r.mode.payload if mode == "refund" else 0
    return MeterRequest(algorithm=r.algorithm, limit=r.limit, window_ms=field(r, "window-ms"),
                        cost=r.cost, mode=mode, refund_at=refund_at)


# -- host functions -----------------------------------------------------------

def guarded(op: str, fn: Callable[..., Any], calls: Optional[dict]) -> Callable[..., Any]:
    """``fn`` as a host function: the store context dropped, every error
    returned as the WIT ``error`` variant, each call counted in ``calls``."""

    def host(_context: Any, *args: Any) -> Any:
        """The host function wasmtime calls."""
        if calls is not None:
            calls[op] = calls.get(op, 0) + 1
        try:
            return fn(*args)
        except StoreUnavailable as e:
            return Variant("unavailable", str(e))
        except HistoryGone as e:
            return Variant("history-gone", e.revision)
        except StoreInvalid as e:
            return Variant("invalid", str(e))
        except Exception as e:  # a host bug: report it rather than trap the component
            log.exception("coord: store %s failed", op)
            return Variant("unavailable", f"host error in {op}: {type(e).__name__}: {e}")

    return host


def link_store(root: LinkerInstance, store: Store, calls: Optional[dict] = None) -> None:
    """Define ``coord:sync/store`` in ``root`` on ``store``; count calls per op in ``calls``."""
    functions = {
        "now": store.now,
        "get": lambda p, k: _read(store.get(p, k)),
        "list": lambda p, prefix: _listing(store.list(p, prefix)),
        "put": lambda p, k, v, ttl, c: lift_write(store.put(p, k, bytes(v), ttl,
                                                            lower_condition(c))),
        "delete": lambda p, k, c: lift_write(store.delete(p, k, lower_condition(c))),
        "touch": lambda p, k, ttl, c: lift_write(store.touch(p, k, ttl, lower_condition(c))),
        "changes": lambda p, after, mx: _page(store.changes(p, after, mx)),
        "meter": lambda p, k, req: _meter(store.meter(p, k, lower_meter_request(req))),
        "wait": store.wait,
        "wait-then-put": lambda p, k, v, ttl, c, after, timeout: lift_write(
            store.wait_then_put(p, k, bytes(v), ttl, lower_condition(c), after, timeout)),
    }
    with root.add_instance(STORE_INTERFACE) as interface:
        for name, fn in functions.items():
            interface.add_func(name, guarded(name, fn, calls))


def link_random(root: LinkerInstance) -> None:
    """Define ``wasi:random/random`` on the operating system's CSPRNG (owner tokens)."""
    with root.add_instance(RANDOM_INTERFACE) as interface:
        interface.add_func("get-random-bytes", lambda _context, n: secrets.token_bytes(n))
        interface.add_func("get-random-u64", lambda _context: secrets.randbits(64))


def _read(reply: Any) -> Record:
    return record(entry=lift_entry(reply.entry), now=reply.now)


def _listing(reply: Any) -> Record:
    return record(entries=[lift_entry(e) for e in reply.entries], revision=reply.revision,
                  now=reply.now)


def _page(reply: Any) -> Record:
    return record(changes=[lift_change(c) for c in reply.changes], revision=reply.revision,
                  now=reply.now)


def _meter(reply: Any) -> Record:
    return record(allowed=reply.allowed, remaining=reply.remaining,
                  reset_in_ms=reply.reset_in_ms, retry_after_ms=reply.retry_after_ms,
                  now=reply.now)
