#!/usr/bin/env bash
# A `coord` binary runs `coord serve` on the embedded in-memory store and
# answers the README's first request.
#
#   host-test/release/serve-smoke.sh path/to/coord
set -euo pipefail

coord="${1:?usage: serve-smoke.sh COORD_BINARY}"
port=8180
while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
log="$(mktemp)"
"$coord" serve --listen "127.0.0.1:$port" >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; rm -f "$log"' EXIT
# Bounded by the process: it either says it listens or exits.
while ! grep -q "listening on" "$log"; do
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "coord serve exited before listening:" >&2
    cat "$log" >&2
    exit 1
  fi
  sleep 0.2
done
status="$(curl -s -o /dev/null -w '%{http_code}' -X POST "127.0.0.1:$port/items/apple/adjust?delta=-3")"
if [ "$status" != 200 ]; then
  echo "coord serve answered $status to POST /items/apple/adjust" >&2
  cat "$log" >&2
  exit 1
fi
echo "coord serve ($coord) answered 200"
