#!/usr/bin/env bash
# HTTP load on `coord serve` with the built-in inventory function, in memory
# and on Redis, one route at a time, with wrk (apt-get install wrk).
#
#   examples/inventory-fn/load/run.sh [SECONDS] [CONNECTIONS]
#
# Prints a Markdown table: requests/s, p50 and p99 per route, and each
# route's requests/s as a fraction of the floor (a 404 that calls no coord
# interface: the runtime's own cost per request). REDIS_URL picks the Redis
# (default redis://127.0.0.1:6379); each run uses a fresh key prefix and
# deletes its keys afterwards. COORD_BIN runs an already built `coord` (to
# compare two builds in alternate runs) instead of building this checkout's.
set -euo pipefail
cd "$(dirname "$0")/../../.."
seconds="${1:-10}"
connections="${2:-32}"
redis_url="${REDIS_URL:-redis://127.0.0.1:6379}"
script="examples/inventory-fn/load/load.lua"
command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install wrk)" >&2; exit 1; }

if [ -n "${COORD_BIN:-}" ]; then
  coord=$COORD_BIN
else
  cargo build --release -p coord-cli
  coord=target/release/coord
fi
prefix="coord-load-$$"

serve_pid=
stop() {
  if [ -n "$serve_pid" ]; then
    kill "$serve_pid" 2>/dev/null || true
    wait "$serve_pid" 2>/dev/null || true
  fi
  serve_pid=
}
trap stop EXIT

start() {
  local out
  out=$(mktemp)
  # Its request log (a line per request on standard error) stays on, as
  # by default, but off the terminal.
  "$coord" serve --listen 127.0.0.1:0 "$@" >"$out" 2>/dev/null &
  serve_pid=$!
  for _ in $(seq 100); do
    grep -q listening "$out" && break
    sleep 0.1
  done
  address=$(sed -n 's|coord serve: listening on ||p' "$out")
  [ -n "$address" ] || { echo "coord serve did not start" >&2; exit 1; }
}

echo "wrk -t1 -c$connections -d${seconds}s, $(nproc) cores shared by wrk, coord serve and Redis; $(date -u +%F)"
echo
echo "| store | route | requests | req/s | p50 ms | p99 ms | non-2xx or errors | req/s ÷ floor |"
echo "|---|---|---|---|---|---|---|---|"
for store in memory redis; do
  if [ "$store" = memory ]; then start; else start --redis "$redis_url" --prefix "$prefix"; fi
  floor=
  for route in floor read export presence adjust; do
    line=$(ROUTE=$route wrk -t1 -c"$connections" -d"${seconds}s" --latency -s "$script" "$address" | grep '^RESULT')
    read -r _ name requests rps p50 p99 errors <<<"$line"
    [ -z "$floor" ] && floor=$rps
    ratio=$(awk -v a="$rps" -v b="$floor" 'BEGIN { printf "%.2f", a / b }')
    echo "| $store | $name | $requests | $rps | $p50 | $p99 | $errors | $ratio |"
  done
  stop
done
if command -v redis-cli >/dev/null; then
  redis-cli -u "$redis_url" --scan --pattern "$prefix:*" | xargs -r -n 500 redis-cli -u "$redis_url" del >/dev/null
fi
