#!/usr/bin/env python3
"""Adjusts per second through a running `coord serve`: CLIENTS threads, each
on its own keep-alive connection, send `POST /items/item-<n>/adjust?delta=1`
round-robin over ITEMS items for SECONDS, and the script prints the
requests answered 200 per second, the other answers by status, and the p50
and p99 latency. Issue 50 compares stores with 8 clients on 8 items:

    coord serve --redis --listen 127.0.0.1:18090 &
    python3 host-test/bench/scripts/serve_adjusts.py 8 8 10 127.0.0.1:18090
    coord serve --postgres --listen 127.0.0.1:18091 &
    python3 host-test/bench/scripts/serve_adjusts.py 8 8 10 127.0.0.1:18091

Run the stores alternately in one session, on a quiet machine: it measures
time.
"""
import collections
import http.client
import statistics
import sys
import threading
import time


def client(address, items, offset, until, latencies, statuses, lock):
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port))
    n = offset
    mine = []
    counts = collections.Counter()
    while time.monotonic() < until:
        item = f"item-{n % items}"
        n += 1
        start = time.perf_counter()
        connection.request("POST", f"/items/{item}/adjust?delta=1", body=b"")
        response = connection.getresponse()
        response.read()
        mine.append(time.perf_counter() - start)
        counts[response.status] += 1
    with lock:
        latencies.extend(mine)
        statuses.update(counts)


def main() -> None:
    clients = int(sys.argv[1])
    items = int(sys.argv[2])
    seconds = float(sys.argv[3])
    address = sys.argv[4]
    latencies, statuses, lock = [], collections.Counter(), threading.Lock()
    until = time.monotonic() + seconds
    threads = [
        threading.Thread(
            target=client, args=(address, items, c, until, latencies, statuses, lock)
        )
        for c in range(clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99) - 1] if latencies else 0
    print(
        f"{statuses[200] / seconds:.0f} adjusts/s answered 200; "
        f"statuses {dict(statuses)}; p50 {statistics.median(latencies) * 1000:.1f} ms, "
        f"p99 {p99 * 1000:.1f} ms"
    )


if __name__ == "__main__":
    main()
