"""What every record a caller holds (a :class:`~coord.locks.HeldLock`, a
:class:`~coord.semaphore.Permit`, a :class:`~coord.rwlock.Grant`) shares: it
is plain data that travels as a dict to another process, and it calls back
through the :class:`~coord.client.Coord` it is bound to."""

from __future__ import annotations

from typing import Any, ClassVar, Dict, Tuple, Type, TypeVar

R = TypeVar("R", bound="HeldRecord")


class HeldRecord:
    """A mixin for the held-record dataclasses. Each sets ``_FIELDS`` (its
    data fields, in WIT order) and ``_UNBOUND`` (the call to use when the
    record is bound to no Coord), and has a ``_coord`` field."""

    _FIELDS: ClassVar[Tuple[str, ...]] = ()
    _UNBOUND: ClassVar[str] = ""
    _coord: Any

    def to_dict(self) -> Dict[str, Any]:
        """The record as a JSON-ready dict (fences are plain ints)."""
        return {k: getattr(self, k) for k in self._FIELDS}

    @classmethod
    def from_dict(cls: Type[R], data: Dict[str, Any], coord: Any = None) -> R:
        """A record from :meth:`to_dict`'s output, bound to ``coord`` for its methods."""
        return cls(**{k: data[k] for k in cls._FIELDS}, _coord=coord)  # type: ignore[call-arg]

    def _bound(self) -> Any:
        if self._coord is None:
            name = type(self).__name__
            raise RuntimeError(f"this {name} is bound to no Coord: call {self._UNBOUND} "
                               f"or {name}.from_dict(data, coord)")
        return self._coord
