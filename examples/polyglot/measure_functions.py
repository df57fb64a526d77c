"""Start-up and per-request latency of `coord serve` for the Python, the
JavaScript and the built-in Rust inventory function.

    python3 examples/polyglot/measure_functions.py [--requests 200] [py js rust]

For each function: the time from spawning `coord serve` to its "listening
on" line with an empty compile cache (a compile), then again with the cache
it filled (a load); then N sequential requests over one keep-alive
connection for each of two routes (a store read, and an adjust: lock, fenced
write, release), reported as median and p99 in milliseconds. Uses COORD_BIN
(default target/debug/coord) and the in-memory store.
"""

import argparse
import http.client
import os
import pathlib
import re
import statistics
import subprocess
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
COORD_BIN = os.environ.get("COORD_BIN", str(ROOT / "target/debug/coord"))
FUNCTIONS = {
    "py": str(ROOT / "target/py-fn.wasm"),
    "js": str(ROOT / "target/js-fn.wasm"),
    "rust": None,  # the built-in inventory function
}


def start(wasm, cache_dir):
    """Spawn coord serve; return (process, address, seconds to listening)."""
    command = [COORD_BIN, "serve", "--listen", "127.0.0.1:0", "--cache-dir", cache_dir]
    if wasm:
        command.insert(2, wasm)
    began = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    process.log = []
    threading.Thread(target=lambda: process.log.extend(process.stderr), daemon=True).start()
    for line in process.stdout:
        match = re.search(r"listening on http://(\S+)", line)
        if match:
            elapsed = time.monotonic() - began
            threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()
            return process, match.group(1), elapsed
    raise SystemExit(f"coord serve exited with {process.wait()} before listening")


def stop(process):
    process.terminate()
    process.wait(15)


def latencies(address, method, path, count):
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    times = []
    for _ in range(count):
        began = time.perf_counter()
        connection.request(method, path)
        response = connection.getresponse()
        response.read()
        times.append((time.perf_counter() - began) * 1000)
        if response.status != 200:
            raise SystemExit(f"{method} {path}: {response.status}")
    connection.close()
    return times


def server_side(process, path):
    """Medians of the request log's duration and instance wait for `path`, ms."""
    durations, waits = [], []
    for line in process.log:
        if f"path={path} " in line:
            fields = dict(re.findall(r"(\w+)=(\S+)", line))
            durations.append(int(fields["duration_us"]) / 1000)
            waits.append(int(fields["instance_wait_us"]) / 1000)
    if not durations:
        return ""
    return (f"  (in coord: {statistics.median(durations):.2f} ms, of which "
            f"{statistics.median(waits):.2f} ms waiting for the instance)")


def p99(values):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("functions", nargs="*", default=list(FUNCTIONS))
    args = parser.parse_args()
    print(f"coord: {COORD_BIN}")
    for name in args.functions:
        wasm = FUNCTIONS[name]
        size = f"{os.path.getsize(wasm) / 1e6:.1f} MB" if wasm else "built in"
        with tempfile.TemporaryDirectory() as cache:
            process, _, compile_s = start(wasm, cache)
            stop(process)
            process, address, cached_s = start(wasm, cache)
            try:
                latencies(address, "GET", "/items/warm", 5)
                rows = [
                    ("GET /items/bench", latencies(address, "GET", "/items/bench", args.requests)),
                    ("POST /items/bench/adjust?delta=1",
                     latencies(address, "POST", "/items/bench/adjust?delta=1", args.requests)),
                ]
                time.sleep(0.5)  # let the last log lines arrive
                notes = {
                    "GET /items/bench": server_side(process, "/items/bench"),
                    "POST /items/bench/adjust?delta=1": server_side(process, "/items/bench/adjust"),
                }
            finally:
                stop(process)
        print(f"\n{name}: component {size}; start {compile_s:.1f} s compiling, "
              f"{cached_s:.2f} s from the cache")
        for route, times in rows:
            print(f"  {route:36} n={len(times)} median {statistics.median(times):.2f} ms"
                  f"  p99 {p99(times):.2f} ms  max {max(times):.2f} ms")
            print(f"  {'':36} {notes[route]}")


if __name__ == "__main__":
    main()
