#!/usr/bin/env bash
# The runtime's own cost: `coord serve` and `wasmtime serve` (the wasmtime CLI
# of the version the host links, pooling on) serving the same hello function,
# target/hello-fn.wasm, under the same wrk load, one after the other, ROUNDS
# times each.
#
#   examples/hello-fn/load.sh [SECONDS] [CONNECTIONS] [ROUNDS]
#
# Prints a Markdown table: requests/s, p50 and p99 per run, and coord's
# requests/s divided by wasmtime's in the same round. Needs wrk
# (apt-get install wrk) and `wasmtime` 48.0.8 on PATH (cargo install --locked
# wasmtime-cli@48.0.8, about 20 minutes here), or WASMTIME naming it.
# COORD_BIN runs an already built `coord` instead of building this checkout's.
# AGAINST=quiet-log sets coord beside itself with its request log off
# (COORD_LOG=warn) instead of beside wasmtime: what the log line costs.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds="${1:-10}"
connections="${2:-32}"
rounds="${3:-2}"
wasmtime="${WASMTIME:-wasmtime}"
against="${AGAINST:-wasmtime}"
command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install wrk)" >&2; exit 1; }
if [ "$against" = wasmtime ]; then
  command -v "$wasmtime" >/dev/null || {
    echo "wasmtime is not installed (cargo install --locked wasmtime-cli@48.0.8)" >&2
    exit 1
  }
  wanted=$(sed -n 's/^wasmtime = { version = "=\([0-9.]*\)".*/\1/p' Cargo.toml)
  have=$("$wasmtime" --version | awk '{print $2}')
  if [ "$have" != "$wanted" ]; then
    echo "wasmtime $have is not the version coord links ($wanted)" >&2
    exit 1
  fi
elif [ "$against" != quiet-log ]; then
  echo "AGAINST must be wasmtime or quiet-log, not $against" >&2
  exit 1
fi

if [ -n "${COORD_BIN:-}" ]; then
  coord=$COORD_BIN
else
  cargo build --release -p coord-cli
  coord=target/release/coord
fi
function=target/hello-fn.wasm
[ -f "$function" ] || { echo "$function is missing: build the workspace first" >&2; exit 1; }

pid=
stop() {
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  pid=
}
trap stop EXIT

free_port() {
  local p=$1
  while (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do p=$((p + 1)); done
  echo "$p"
}

# Start one runtime on a free port and wait until it answers 200.
start() {
  local runtime=$1 port
  port=$(free_port 18080)
  case $runtime in
    coord) "$coord" serve "$function" --listen "127.0.0.1:$port" >/dev/null 2>&1 & ;;
    quiet-log) COORD_LOG=warn "$coord" serve "$function" --listen "127.0.0.1:$port" >/dev/null 2>&1 & ;;
    wasmtime) "$wasmtime" serve -Scli -O pooling-allocator=y --addr "127.0.0.1:$port" "$function" >/dev/null 2>&1 & ;;
  esac
  pid=$!
  address="127.0.0.1:$port"
  for _ in $(seq 300); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$address/" 2>/dev/null)" = 200 ] && return
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "$runtime did not answer on $address" >&2
  exit 1
}

# wrk's requests/s, p50 and p99 (ms) against the running runtime.
measure() {
  local out rps p50 p99
  out=$(wrk -t2 -c"$connections" -d"${seconds}s" --latency "http://$address/")
  rps=$(echo "$out" | awk '/^Requests\/sec/ {print $2}')
  p50=$(echo "$out" | awk '$1 == "50%" {print $2}')
  p99=$(echo "$out" | awk '$1 == "99%" {print $2}')
  if echo "$out" | grep -q "Non-2xx"; then
    echo "$out" >&2
    echo "answers other than 2xx" >&2
    exit 1
  fi
  echo "$rps $p50 $p99"
}

case $against in
  wasmtime) other_name="wasmtime serve" ;;
  quiet-log) other_name="coord serve, COORD_LOG=warn" ;;
esac
echo "| round | runtime | requests/s | p50 | p99 | coord ÷ $other_name |"
echo "|---|---|---|---|---|---|"
for round in $(seq "$rounds"); do
  start coord
  read -r coord_rps coord_p50 coord_p99 < <(measure)
  stop
  start "$against"
  read -r other_rps other_p50 other_p99 < <(measure)
  stop
  ratio=$(awk -v a="$coord_rps" -v b="$other_rps" 'BEGIN {printf "%.2f", a / b}')
  echo "| $round | coord serve | $coord_rps | $coord_p50 | $coord_p99 | $ratio |"
  echo "| $round | $other_name | $other_rps | $other_p50 | $other_p99 | |"
done
