#!/usr/bin/env python3
"""Whether an adjust's latency stays flat as one item's history grows.

Sends N sequential `POST /items/apple/adjust?delta=1` to a running
`coord serve` (keep-alive, one connection), with an `Idempotency-Key` each
when `keyed`, and prints the median latency of the first and of the last
hundred and their ratio. Issue 39 asked for the last hundred within 1.5x of
the first over 2 000 adjusts on NATS:

    coord serve --nats nats://127.0.0.1:4222 --listen 127.0.0.1:18090 &
    python3 host-test/bench/scripts/flat_adjusts.py 2000 keyed

Run it on a quiet machine: it measures time, and other work on the same
cores shows up as drift.
"""
import http.client
import statistics
import sys
import time


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    keyed = len(sys.argv) > 2 and sys.argv[2] == "keyed"
    address = sys.argv[3] if len(sys.argv) > 3 else "127.0.0.1:18090"
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port))
    latencies = []
    for i in range(n):
        headers = {"Idempotency-Key": f"flat-{time.time_ns()}-{i}"} if keyed else {}
        started = time.perf_counter()
        connection.request("POST", "/items/apple/adjust?delta=1", headers=headers)
        response = connection.getresponse()
        response.read()
        latencies.append((time.perf_counter() - started) * 1000)
        if response.status != 200:
            print(f"adjust {i}: status {response.status}", file=sys.stderr)
    first = statistics.median(latencies[:100])
    last = statistics.median(latencies[-100:])
    kind = "keyed" if keyed else "plain"
    print(f"{n} {kind} adjusts: median of the first 100 {first:.1f} ms, "
          f"of the last 100 {last:.1f} ms, ratio {last / first:.2f}")


if __name__ == "__main__":
    main()
