"""Stores the component runs on: the contract's types, in memory, on Redis."""

from .memory import MemoryStore
from .redis_backend import RedisStore
from .types import (
    ALWAYS, Change, ChangesReply, Condition, Entry, HistoryGone, ListReply, MeterReply,
    MeterRequest, ReadReply, Store, StoreError, StoreInvalid, StoreStats, StoreUnavailable,
    WriteReply, is_unwatched,
)

__all__ = [
    "ALWAYS", "Change", "ChangesReply", "Condition", "Entry", "HistoryGone", "ListReply",
    "MemoryStore", "MeterReply", "MeterRequest", "ReadReply", "RedisStore", "Store",
    "StoreError", "StoreInvalid", "StoreStats", "StoreUnavailable", "WriteReply",
    "is_unwatched",
]
