"""Finding, compiling, linking and calling the unchanged ``coord.wasm``.

This is the raw component level: :class:`Component` calls an exported
function by interface and name with ``wasmtime.component`` values and
returns its ``ok`` value, or raises the :mod:`coord.errors` exception for
its ``err``. The idiomatic API (:class:`coord.Coord`) is built on it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Dict, Tuple, Union

import wasmtime
from wasmtime.component import Component as WasmComponent, Func, Linker, ResultType, Variant

from .errors import CoordError, from_wit
from .linking import link_random, link_store
from .store.types import Store

#: The component an installed package carries (the wheel's coord/_data/).
PACKAGED_WASM = Path(__file__).resolve().parent / "_data" / "coord.wasm"

#: In a checkout of the repository, its build output: <repo>/target/coord.wasm.
REPOSITORY_WASM = Path(__file__).resolve().parents[3] / "target" / "coord.wasm"

PACKAGE = "coord:sync"
VERSION = "0.1.0"

_engine = wasmtime.Engine()
_compiled: Dict[Path, WasmComponent] = {}
_compiling = threading.Lock()


def find_wasm(path: Union[str, os.PathLike, None] = None) -> Path:
    """Where coord.wasm is: ``path`` if given, else ``$COORD_WASM``, else the
    one the installed package carries, else ``<repo>/target/coord.wasm`` in a
    checkout of the repository."""
    default = PACKAGED_WASM if PACKAGED_WASM.is_file() else REPOSITORY_WASM
    chosen = Path(path or os.environ.get("COORD_WASM") or default)
    if not chosen.is_file():
        how = ("the path given" if path else "$COORD_WASM" if os.environ.get("COORD_WASM")
               else "the repository's build output")
        raise FileNotFoundError(
            f"coord.wasm not found at {chosen} ({how}); build it with the repository's "
            f"build, or pass wasm= or set COORD_WASM")
    return chosen.resolve()


def compile_component(path: Union[str, os.PathLike, None] = None) -> WasmComponent:
    """The compiled component at ``path`` (see :func:`find_wasm`), compiled once per process."""
    found = find_wasm(path)
    with _compiling:
        if found not in _compiled:
            _compiled[found] = WasmComponent.from_file(_engine, str(found))
        return _compiled[found]


def _tagged(result: ResultType) -> bool:
    """Whether wasmtime-py returns this result type as ``Variant('ok'|'err', ...)``:
    it does when its ok and err cases map to overlapping Python classes."""
    ok: set = set()
    err: set = set()
    for ty, classes in ((result.ok, ok), (result.err, err)):
        if ty is None:
            classes.add(object)
        else:
            ty.add_classes(classes)
    return bool(ok & err)


class Component:
    """One instance of coord.wasm with its own wasmtime store, linked to ``store``.

    Instances are cheap once the component is compiled; each one must be
    used by one thread at a time (a wasmtime store is not shareable), while
    the Python ``store`` it runs on may be shared by any number of them.
    ``store_calls`` counts the component's calls to the store, by function.
    """

    def __init__(self, store: Store, wasm: Union[str, os.PathLike, None] = None) -> None:
        self.store = store
        self.store_calls: Dict[str, int] = {}
        component = compile_component(wasm)
        self._wasm_store = wasmtime.Store(_engine)
        linker = Linker(_engine)
        with linker.root() as root:
            link_store(root, store, self.store_calls)
            link_random(root)
        self._instance = linker.instantiate(self._wasm_store, component)
        self._funcs: Dict[Tuple[str, str], Tuple[Func, bool]] = {}
        # A wasmtime store is used by one thread at a time: calls from several
        # threads on one instance take turns (use an instance per thread to
        # run them at once).
        self._turn = threading.RLock()

    def _func(self, interface: str, name: str) -> Tuple[Func, bool]:
        key = (interface, name)
        if key not in self._funcs:
            full = f"{PACKAGE}/{interface}@{VERSION}"
            index = self._instance.get_export_index(self._wasm_store, full)
            inner = index and self._instance.get_export_index(self._wasm_store, name, index)
            func = inner and self._instance.get_func(self._wasm_store, inner)
            if not func:
                raise LookupError(f"coord.wasm exports no {name} in {full}")
            result = func.type(self._wasm_store).result
            self._funcs[key] = (func, isinstance(result, ResultType) and _tagged(result))
        return self._funcs[key]

    def call(self, interface: str, name: str, *args: Any) -> Any:
        """Call ``name`` of exported ``interface`` (``lock``, ``ephemeral``, ...):
        its ``ok`` value, or the :class:`~coord.errors.CoordError` for its ``err``."""
        with self._turn:
            func, tagged = self._func(interface, name)
            value = func(self._wasm_store, *args)
        if tagged:
            if value.tag == "ok":
                return value.payload
            raise self._error(value.payload)
        # Untagged: no ok value is a Variant, so a Variant is the error.
        if isinstance(value, Variant):
            raise self._error(value)
        return value

    def call_raw(self, interface: str, name: str, *args: Any) -> Any:
        """Call a function and return what wasmtime-py returned, unconverted."""
        with self._turn:
            func, _ = self._func(interface, name)
            return func(self._wasm_store, *args)

    def drop(self, resource: Any) -> None:
        """Drop a resource the component returned (a ``watcher``)."""
        with self._turn:
            resource.drop(self._wasm_store)

    @staticmethod
    def _error(error: Any) -> CoordError:
        return from_wit(error)
