#!/usr/bin/env bash
# Start a Redis Cluster on loopback for coord-bench --redis-cluster (or
# coord serve --redis-cluster): 3 masters with a replica each, on ports
# BASE..BASE+5 (default 7000), keeping nothing on disk, in a temporary
# directory. Prints the URLs coord takes; stop it with
#   for p in $(seq BASE BASE+5); do redis-cli -p $p shutdown nosave; done
set -euo pipefail
base="${1:-7000}"
dir="$(mktemp -d)"
ports=()
for i in 0 1 2 3 4 5; do
  port=$((base + i))
  mkdir -p "$dir/$port"
  # Not --daemonize: the servers stay in this session's scheduling group
  # (RELIABILITY.md, "Why the tests start their own Redis").
  (cd "$dir/$port" && exec redis-server --bind 127.0.0.1 --port "$port" \
    --cluster-enabled yes --cluster-config-file nodes.conf \
    --cluster-node-timeout 1000 --save "" --appendonly no \
    >"$dir/$port/log" 2>&1) &
  ports+=("127.0.0.1:$port")
done
for p in "${ports[@]}"; do
  until redis-cli -p "${p#*:}" ping >/dev/null 2>&1; do sleep 0.1; done
done
redis-cli --cluster create "${ports[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log"
until redis-cli -p "$base" cluster info | grep -q cluster_state:ok; do sleep 0.1; done
# Ready once each master's replica has synced (writes asking for a
# replica's acknowledgement are refused until then).
until [ "$(for p in "${ports[@]}"; do redis-cli -p "${p#*:}" info replication; done |
  grep -c master_link_status:up)" = 3 ]; do sleep 0.1; done
urls=""
for p in "${ports[@]}"; do urls="${urls:+$urls,}redis://$p"; done
echo "$urls"
