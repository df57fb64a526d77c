"""The Python and JavaScript edge functions, over HTTP, each served by
`coord serve` (composed with coord, in-memory store).

    python3 -m pytest examples/polyglot/test_edge_functions.py

Environment:
- COORD_BIN: the coord binary (default target/debug/coord).
- COORD_TEST_CACHE_DIR: coord serve's compile cache (default
  target/fn-test-cache), so that only the first run compiles.
- COORD_START_TIMEOUT: seconds to wait for "listening on" (default 600: a
  debug build compiles the 19 MB Python component slowly).
- A function whose target/<name>.wasm is missing is built with its build.sh.
"""

import http.client
import json
import os
import pathlib
import re
import subprocess
import threading
import time
import uuid

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
COORD_BIN = os.environ.get("COORD_BIN", str(ROOT / "target/debug/coord"))
CACHE_DIR = os.environ.get("COORD_TEST_CACHE_DIR", str(ROOT / "target/fn-test-cache"))
START_TIMEOUT = float(os.environ.get("COORD_START_TIMEOUT", "600"))

FUNCTIONS = {
    "py": ROOT / "target/py-fn.wasm",
    "js": ROOT / "target/js-fn.wasm",
}
BUILD_SCRIPTS = {
    "py": ROOT / "examples/py-fn/build.sh",
    "js": ROOT / "examples/js-fn/build.sh",
}


class Served:
    """A `coord serve` process and a client for it."""

    def __init__(self, wasm):
        self.process = subprocess.Popen(
            [COORD_BIN, "serve", str(wasm), "--listen", "127.0.0.1:0",
             "--cache-dir", CACHE_DIR],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.log = []
        # Keep draining stderr (one log line per request) so it never fills.
        threading.Thread(target=self._drain, daemon=True).start()
        self.address = self._wait_for_address()

    def _drain(self):
        for line in self.process.stderr:
            self.log.append(line)

    def _wait_for_address(self):
        found = {}

        def read():
            for line in self.process.stdout:
                match = re.search(r"listening on http://(\S+)", line)
                if match:
                    found["address"] = match.group(1)
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(START_TIMEOUT)
        if "address" not in found:
            self.stop()
            pytest.fail("coord serve did not start:\n" + "".join(self.log[-30:]))
        # Keep draining stdout too.
        threading.Thread(target=lambda: [None for _ in self.process.stdout], daemon=True).start()
        return found["address"]

    def request(self, method, path, body=None, headers=None):
        host, port = self.address.rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
            connection.request(method, path, body=data, headers=headers or {})
            response = connection.getresponse()
            text = response.read().decode()
            try:
                payload = json.loads(text)
            except ValueError:
                payload = text
            return response.status, payload, dict(response.getheaders())
        finally:
            connection.close()

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module", params=sorted(FUNCTIONS))
def fn(request):
    name = request.param
    wasm = FUNCTIONS[name]
    if not wasm.exists():
        subprocess.run([str(BUILD_SCRIPTS[name])], check=True)
    if not os.access(COORD_BIN, os.X_OK):
        pytest.fail(f"no coord binary at {COORD_BIN} (set COORD_BIN)")
    served = Served(wasm)
    yield served
    served.stop()


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def test_adjust_returns_stock_and_a_growing_fence(fn):
    item = unique("item")
    status, first, _ = fn.request("POST", f"/items/{item}/adjust?delta=-3")
    assert status == 200, first
    assert first["item"] == item and first["stock"] == 97
    assert isinstance(first["fence"], str) and int(first["fence"]) > 0
    status, second, _ = fn.request("POST", f"/items/{item}/adjust?delta=5")
    assert status == 200, second
    assert second["stock"] == 102
    assert int(second["fence"]) > int(first["fence"])
    status, shown, _ = fn.request("GET", f"/items/{item}")
    assert (status, shown) == (200, second)


def test_a_held_lock_makes_adjust_busy(fn):
    item = unique("item")
    status, held, _ = fn.request("POST", f"/items/{item}/lock?ttl_ms=30000")
    assert status == 200, held
    assert held["resource"] == f"item:{item}" and int(held["fence"]) > 0

    status, busy, headers = fn.request("POST", f"/items/{item}/adjust?delta=1")
    assert status == 409, busy
    assert busy["holderFence"] == held["fence"]
    assert int(headers["retry-after"]) >= 1

    # A short wait does not outlast a 30 s holder either.
    status, busy, _ = fn.request("POST", f"/items/{item}/adjust?delta=1&wait_ms=200")
    assert status == 409, busy

    status, released, _ = fn.request("DELETE", f"/items/{item}/lock", body=held)
    assert (status, released) == (200, {"released": True})
    status, adjusted, _ = fn.request("POST", f"/items/{item}/adjust?delta=1")
    assert status == 200, adjusted
    assert int(adjusted["fence"]) > int(held["fence"])


def test_exports_are_rate_limited_per_user(fn):
    user = unique("user")
    for n in range(10):
        status, body, headers = fn.request("POST", "/exports", headers={"x-user-id": user})
        assert status == 200, body
        assert body["remaining"] == 9 - n
        assert headers["ratelimit-limit"] == "10"
    status, body, headers = fn.request("POST", "/exports", headers={"x-user-id": user})
    assert status == 429, body
    assert int(headers["retry-after"]) >= 1
    assert body["retryAfterMs"] > 0
    # Another user has the whole limit.
    status, _, _ = fn.request("POST", "/exports", headers={"x-user-id": unique("user")})
    assert status == 200


def test_presence_lists_editors_and_forgets_them_after_their_ttl(fn):
    item = unique("item")
    status, written, _ = fn.request("PUT", f"/items/{item}/editors/short?ttl_ms=1000",
                                    body={"name": "ann"})
    assert status == 200, written
    status, _, _ = fn.request("PUT", f"/items/{item}/editors/long?ttl_ms=60000",
                              body={"name": "bob"})
    assert status == 200

    status, present, _ = fn.request("GET", f"/items/{item}/editors")
    assert status == 200, present
    assert {e["session"]: e["value"] for e in present["editors"]} == {
        "short": {"name": "ann"},
        "long": {"name": "bob"},
    }

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        _, present, _ = fn.request("GET", f"/items/{item}/editors")
        if [e["session"] for e in present["editors"]] == ["long"]:
            break
        time.sleep(0.25)
    assert [e["session"] for e in present["editors"]] == ["long"]

    status, left, _ = fn.request("DELETE", f"/items/{item}/editors/long")
    assert (status, left) == (200, {"deleted": True})
    _, present, _ = fn.request("GET", f"/items/{item}/editors")
    assert present["editors"] == []


@pytest.mark.parametrize(
    "method, path, body, headers, field",
    [
        ("POST", "/items/a/adjust", None, {}, "delta"),
        ("POST", "/items/a/adjust?delta=two", None, {}, "delta"),
        ("POST", "/items/a/adjust?delta=1&wait_ms=-5", None, {}, "wait_ms"),
        ("POST", f"/items/{'x' * 65}/adjust?delta=1", None, {}, "item"),
        ("POST", "/exports", None, {}, "x-user-id"),
        ("PUT", "/items/a/editors/s", b"{not json", {}, "body"),
        ("PUT", "/items/a/editors/s?ttl_ms=5", {"name": "ann"}, {}, "ttl_ms"),
        ("DELETE", "/items/a/lock", {"fence": "1"}, {}, "body.owner"),
        ("DELETE", "/items/a/lock", {"owner": "00", "fence": "x"}, {}, "body.fence"),
        # Each of these once made the Python function raise past its handler.
        ("DELETE", "/items/a/lock", b'{"owner": "00", "fence": 1e400}', {}, "body.fence"),
        # JavaScript strings carry the lone surrogate to coord, which refuses
        # the owner token; Python refuses it first.
        ("DELETE", "/items/a/lock", b'{"owner": "\\ud800", "fence": "1"}', {},
         ("body.owner", "lock.owner")),
        ("DELETE", "/items/a/lock", b'["owner"]', {}, "body.owner"),
        ("PUT", "/items/a/editors/s", b"[" * 10_000, {}, "body"),
    ],
)
def test_bad_input_is_400_naming_the_field(fn, method, path, body, headers, field):
    status, reply, _ = fn.request(method, path, body=body, headers=headers)
    assert status == 400, reply
    assert reply["field"] in (field if isinstance(field, tuple) else (field,)), reply
    assert reply["error"]


def test_unknown_route_is_404(fn):
    status, reply, _ = fn.request("GET", "/nowhere")
    assert status == 404 and reply["field"] == "path"
