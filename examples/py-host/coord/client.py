"""The public entry point: :class:`Coord`, one instance of coord.wasm on a store."""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Union

from .component import Component
from .ephemeral import EphemeralAPI
from .lease import LeaseAPI
from .locks import LockAPI
from .ratelimit import RateLimitAPI
from .rwlock import RwLockAPI
from .semaphore import SemaphoreAPI
from .store.memory import MemoryStore
from .store.types import Store


class Coord(LockAPI, EphemeralAPI, RateLimitAPI, LeaseAPI, SemaphoreAPI, RwLockAPI):
    """Locks, read-write locks, ephemeral state, rate limits, leases and semaphores, run by the coord component
    on ``store`` (default: a new :class:`~coord.MemoryStore`, private to this
    instance).

    Instances that share a store (the same ``MemoryStore`` object, or
    ``RedisStore``s on the same Redis and prefix) share every lock, entry
    and limit. One instance runs one call at a time: give each thread its
    own ``Coord`` on the shared store to run calls concurrently. ``wasm``
    is coord.wasm's path (default ``$COORD_WASM``, else the repository's
    ``target/coord.wasm``).
    """

    def __init__(self, store: Optional[Store] = None, *,
                 wasm: Union[str, os.PathLike, None] = None) -> None:
        self.store: Store = store if store is not None else MemoryStore()
        self.component = Component(self.store, wasm)

    @property
    def store_calls(self) -> Dict[str, int]:
        """How many times this instance's component called each store function."""
        return self.component.store_calls

    def _call(self, interface: str, name: str, *args: Any) -> Any:
        return self.component.call(interface, name, *args)

    def _drop(self, resource: Any) -> None:
        self.component.drop(resource)
