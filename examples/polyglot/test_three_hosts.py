"""Three hosts in three languages on one Redis, sharing one lock, one
presence list and one rate limit through the same coord.wasm:

- Rust: ``coord serve`` running the built-in inventory function (HTTP);
- JavaScript: ``examples/js-host/contender.mjs`` (jco, node-redis in a worker);
- Python: this process (``examples/py-host``'s ``coord`` package).

The lock: all three adjust one item's stock under the function's own lock
(``inventory.stock``/``item:<item>``), at the same time. Node and Python
write the record the Rust function keeps with a compare-and-set on the
revision they read under the lock, after a pause; a second holder at any
moment would make a write conflict or lose an update. So the final stock is
exactly 100 plus every adjustment, every write's fence exceeds the record's,
and each host's fences increase.

Run from the repository root after ``cargo test --workspace`` (which builds
``target/debug/coord`` and ``target/coord.wasm``) and ``npm ci && npm run
build`` in examples/js-host: ``python3 -m pytest -q examples/polyglot``.
``COORD_BIN`` names another ``coord`` binary; ``REDIS_URL`` the Redis
(default redis://127.0.0.1:6379). With no Redis the test fails.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "py-host"))

import coord  # noqa: E402  (the path above makes it importable)
from coord.store import RedisStore  # noqa: E402
from coord.store.types import Condition  # noqa: E402

REDIS_URL = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379"
COORD_BIN = os.environ.get("COORD_BIN") or str(ROOT / "target" / "debug" / "coord")

ROUNDS = 15  # adjustments per host
INITIAL_STOCK = 100  # the inventory function's, for an item never written
RECORD_KEY = "record"  # an item's record in the inventory function's table


def record_partition(item: str) -> str:
    """The partition of ``item``'s record in the inventory function's table."""
    return f"~inventory-record:{item}"


EDITORS = coord.Space("inventory.editors", ttl_ms=30_000, max_value_bytes=4_096)
EXPORTS = coord.Limiter("inventory.exports", limit=10, window_ms=60_000,
                        algorithm="sliding-window")


class Serve:
    """A ``coord serve`` process on Redis under ``prefix``, on a free port."""

    def __init__(self, prefix: str) -> None:
        self.process = subprocess.Popen(
            [COORD_BIN, "serve", "--redis", REDIS_URL, "--prefix", prefix,
             "--listen", "127.0.0.1:0", "--no-cache"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.process.stdout is not None
        first = self.process.stdout.readline()
        found = re.match(r"coord serve: listening on (http://\S+)", first)
        if not found:
            self.process.kill()
            pytest.fail(f"coord serve did not start: {first!r}")
        self.base = found.group(1)
        # Keep reading, so a full pipe never blocks the server.
        threading.Thread(target=lambda: self.process.stdout.read(), daemon=True).start()

    def call(self, method: str, path: str, body: str = "",
             headers: Optional[Dict[str, str]] = None) -> Tuple[int, dict]:
        """One request; the status and the JSON body."""
        request = urllib.request.Request(self.base + path, data=body.encode() or None,
                                         method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                return reply.status, json.loads(reply.read() or b"{}")
        except urllib.error.HTTPError as reply:
            return reply.code, json.loads(reply.read() or b"{}")

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def python_adjusts(c: coord.Coord, store: RedisStore, item: str, fences: List[int],
                   failures: List[str]) -> None:
    """Python's share of the lock: ``ROUNDS`` fenced read-pause-CAS writes."""
    try:
        for _ in range(ROUNDS):
            with c.lock("inventory.stock", f"item:{item}", ttl_ms=10_000, wait_ms=20_000) as held:
                read = store.get(record_partition(item), RECORD_KEY)
                record = (json.loads(read.entry.value) if read.entry
                          else {"stock": INITIAL_STOCK, "fence": 0})
                if record["fence"] >= held.fence:
                    failures.append(f"fence {held.fence} does not exceed the record's {record['fence']}")
                    return
                time.sleep(0.003)  # widen the window in which a second holder would show
                record = {**record, "stock": record["stock"] + 1, "fence": held.fence}
                condition = (Condition("revision", read.entry.revision) if read.entry
                             else Condition("absent"))
                written = store.put(record_partition(item), RECORD_KEY, json.dumps(record).encode(),
                                    None, condition)
                if not written.applied:
                    failures.append(f"the record changed while fence {held.fence} held the lock")
                    return
                fences.append(held.fence)
    except coord.CoordError as e:
        failures.append(f"python: {e!r}")


def rust_adjusts(serve: Serve, item: str, fences: List[int], failures: List[str]) -> None:
    """Rust's share: ``ROUNDS`` adjustments over HTTP, each waiting for the lock."""
    for _ in range(ROUNDS):
        status, body = serve.call("POST", f"/items/{item}/adjust?delta=1&wait_ms=20000")
        if status != 200:
            failures.append(f"rust: {status} {body}")
            return
        fences.append(int(body["fence"]))


def test_rust_node_and_python_share_one_lock_presence_and_limit() -> None:
    if not Path(COORD_BIN).exists():
        pytest.fail(f"no coord binary at {COORD_BIN}: run `cargo test --workspace` first")
    run = uuid.uuid4().hex[:10]
    prefix, item, user = f"polyglot-{run}", f"widget-{run}", f"user-{run}"
    store = RedisStore(REDIS_URL, prefix=prefix)
    try:
        store.client.ping()
    except Exception as e:  # no Redis: this test cannot run, and must say so
        pytest.fail(f"Redis at {REDIS_URL} did not answer ({e}); set REDIS_URL")
    c = coord.Coord(store=store)
    serve = Serve(prefix)
    node = None
    try:
        node = subprocess.Popen(
            ["node", str(ROOT / "examples" / "js-host" / "contender.mjs"),
             "--redis", REDIS_URL, "--prefix", prefix, "--item", item,
             "--rounds", str(ROUNDS), "--session", "node",
             "--expect", "rust,node,python", "--user", user, "--exports", "5"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        fences: Dict[str, List[int]] = {"rust": [], "python": []}
        failures: List[str] = []
        rust = threading.Thread(target=rust_adjusts, args=(serve, item, fences["rust"], failures))
        rust.start()
        python_adjusts(c, store, item, fences["python"], failures)
        rust.join()
        assert not failures, failures

        # Presence: each host joins; each sees all three.
        status, _ = serve.call("PUT", f"/items/{item}/editors/rust", '{"userId":"rust"}')
        assert status == 200
        c.put(EDITORS, item, "python", json.dumps({"userId": "python"}))

        # The limit: 5 requests from each host against one user's 10.
        allowed = {"rust": 0, "python": 0}
        for _ in range(5):
            status, _ = serve.call("POST", "/exports", headers={"x-user-id": user})
            assert status in (200, 429), status
            allowed["rust"] += status == 200
            allowed["python"] += c.limit(EXPORTS, f"user:{user}").allowed

        out, err = node.communicate(timeout=120)
        assert node.returncode == 0, f"the Node host failed: {err}"
        from_node = json.loads(out.strip().splitlines()[-1])
        fences["node"] = [int(f) for f in from_node["fences"]]

        # One holder at a time: no update lost, every fence its own.
        status, shown = serve.call("GET", f"/items/{item}")
        assert status == 200, shown
        assert shown["stock"] == INITIAL_STOCK + 3 * ROUNDS, (shown, fences)
        every = [f for host in fences.values() for f in host]
        assert len(every) == 3 * ROUNDS and len(set(every)) == len(every), fences
        for host, own in fences.items():
            assert own == sorted(own), f"{host}'s fences do not increase: {own}"
        assert int(shown["fence"]) == max(every), (shown, max(every))

        # Each host saw the others' presence.
        assert from_node["editors"] == ["node", "python", "rust"], from_node
        assert sorted(e.key for e in c.list(EDITORS, item)) == ["node", "python", "rust"]
        status, editors = serve.call("GET", f"/items/{item}/editors")
        assert status == 200, editors
        assert sorted(e["session"] for e in editors["editors"]) == ["node", "python", "rust"], editors

        # One limit of 10 across the three hosts' 15 requests.
        assert allowed["rust"] + allowed["python"] + from_node["allowed"] == 10, (allowed, from_node)
    finally:
        if node is not None and node.poll() is None:
            node.kill()
        serve.stop()
        store.delete_everything()
        store.close()
