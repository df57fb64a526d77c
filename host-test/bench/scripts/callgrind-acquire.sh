#!/usr/bin/env bash
# Count the instructions of an in-memory acquire + release pair, through the
# component and natively, reproducibly.
#
# The in-memory timings move by tens of percent between runs and VMs;
# callgrind's instruction counts do not. Each side runs `coord-bench
# --profile-acquire N [--native]` under callgrind, and again with 0 pairs
# (which leaves the start-up and the component's compilation); the
# difference, divided by N, is one pair. The component's pair is then split
# by where its instructions ran (exclusive counts, the same subtraction).
#
#   host-test/bench/scripts/callgrind-acquire.sh [N] [OUT_DIR]
#
# N pairs (default 20000); the callgrind files land in OUT_DIR (default a
# temporary directory) for `callgrind_annotate --inclusive=yes`. BENCH picks
# the binary (default target/release/coord-bench, built first if missing).
set -euo pipefail

n=${1:-20000}
out=${2:-$(mktemp -d)}
cd "$(dirname "$0")/../../.."
bench=${BENCH:-target/release/coord-bench}
mkdir -p "$out"

command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
[ -n "${BENCH:-}" ] || [ -x "$bench" ] || cargo build --release -p coord-bench

# Total instructions of one run: side (component|native), pairs.
count() {
  local file="$out/callgrind.$1.$2.out" flag=
  [ "$1" = native ] && flag=--native
  valgrind --tool=callgrind --callgrind-out-file="$file" \
    "$bench" --profile-acquire "$2" $flag >/dev/null 2>&1
  # awk reads to the end: leaving early would kill callgrind_annotate with SIGPIPE.
  callgrind_annotate "$file" | awk '/PROGRAM TOTALS/ && !done { gsub(",", "", $1); print $1; done = 1 }'
}

# Exclusive instructions per function of one run, as "count<TAB>function".
functions() {
  callgrind_annotate --threshold=100 "$out/callgrind.$1.$2.out" |
    awk '/PROGRAM TOTALS/ { on = 1; next }
         on && /\[/ { c = $1; gsub(",", "", c); sub(/^ *[0-9,]+ +\( *[0-9.]+%\) +/, ""); print c "\t" $0 }'
}

export LC_ALL=C
declare -A per_pair
for side in component native; do
  base=$(count "$side" 0)
  full=$(count "$side" "$n")
  per_pair[$side]=$(( (full - base) / n ))
  printf '%-10s %8d instructions per acquire + release pair (%d pairs)\n' "$side" "${per_pair[$side]}" "$n"
done
awk -v c="${per_pair[component]}" -v n="${per_pair[native]}" \
  'BEGIN { printf "%-10s %8.1fx\n", "ratio", c / n }'

# Where the component's pair ran: the run with N pairs minus the one with 0,
# function by function, in the categories BENCHMARKS.md reports.
echo
echo "component, by where the instructions ran (per pair):"
join -t $'\t' -a 1 -e 0 -o 0,1.2,2.2 \
  <(functions component "$n" | awk -F'\t' '{ print $2 "\t" $1 }' | sort -t $'\t' -k1,1) \
  <(functions component 0 | awk -F'\t' '{ print $2 "\t" $1 }' | sort -t $'\t' -k1,1) |
  awk -F'\t' -v n="$n" '
    {
      d = ($2 - $3) / n; f = $1
      if (f ~ /\[\?\?\?\]/) k = "the guest (JIT code, trampolines)"
      else if (f ~ /libc\.so/) k = "libc (malloc, free, memcpy)"
      else if (f ~ /MemoryBackend|coord_component::memory|btree|[Hh]ash/) k = "the in-memory store (maps, hashing, feed)"
      else if (f ~ /coord_host|coord_bench/) k = "coord host glue"
      else if (f ~ /wasmtime/) k = "wasmtime runtime"
      else k = "the rest"
      sum[k] += d; total += d
    }
    END { for (k in sum) printf "  %8.0f  %4.1f%%  %s\n", sum[k], 100 * sum[k] / total, k }' |
  sort -rn
echo "callgrind files: $out"
