"""coord for Python: distributed locks, read-write locks, leases, ephemeral
state, rate limits and semaphores, run by the unchanged coord.wasm component on a store
in memory or on Redis.

    import coord

    c = coord.Coord(store=coord.RedisStore("redis://127.0.0.1:6379"))
    with c.lock("inventory.stock", "item:42", ttl_ms=10_000, wait_ms=2_000) as held:
        adjust_stock(42, fence=held.fence)
"""

from .client import Coord
from .component import Component, compile_component, find_wasm
from .ephemeral import Entry, Event, Snapshot, Space, Watch, Written
from .errors import (
    Busy, CoordError, InGrace, Internal, InvalidArgument, Lost, NotHolder, Unavailable,
)
from .lease import HeldLease, LeaseHolder
from .locks import HeldLock, Holder, LockContext
from .ratelimit import Decision, Limiter, Reservation
from .rwlock import Grant, GrantContext, GrantHolder, RwUsage
from .semaphore import Permit, PermitContext, PermitHolder, Usage
from .store import MemoryStore, RedisStore

__all__ = [
    "Busy", "Component", "Coord", "CoordError", "Decision", "Entry", "Event", "Grant",
    "GrantContext", "GrantHolder", "HeldLease",
    "HeldLock", "Holder", "InGrace", "Internal", "InvalidArgument", "LeaseHolder", "Limiter",
    "LockContext", "Lost", "MemoryStore", "NotHolder", "Permit", "PermitContext",
    "PermitHolder", "RedisStore", "Reservation", "RwUsage", "Snapshot", "Space", "Unavailable", "Usage", "Watch",
    "Written", "compile_component", "find_wasm",
]
