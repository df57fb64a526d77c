#!/usr/bin/env bash
# Count the instructions Redis spends per coord operation, reproducibly.
#
# Timing a script on a shared VM moves by tens of percent from run to run;
# callgrind counts instructions, which do not. Each workload runs on a fresh
# redis-server under callgrind, counting only inside `processCommand` (the
# commands themselves, not the event loop or the cron), and the total is
# divided by the operations sent, after subtracting a run that only loads
# the scripts.
#
#   host-test/bench/scripts/callgrind-redis.sh [N] [OUT_DIR]
#
# N operations per workload (default 1000); the callgrind files land in
# OUT_DIR (default a temporary directory) for `callgrind_annotate
# --inclusive=yes`. REDIS_SERVER picks the binary (default: redis-server on
# PATH); Debian's is stripped, so for function names build the same version
# from source, with a deb-src line for bookworm in /etc/apt/sources.list.d/:
#
#   apt-get source redis && cd redis-7.0.15 && make -j2 MALLOC=libc BUILD_TLS=no
#   REDIS_SERVER=$PWD/src/redis-server host-test/bench/scripts/callgrind-redis.sh 1000 /tmp/cg
#   callgrind_annotate --inclusive=yes /tmp/cg/callgrind.lock-pair.out | less
set -euo pipefail

n=${1:-1000}
out=${2:-$(mktemp -d)}
server=${REDIS_SERVER:-$(command -v redis-server)}
port=${CALLGRIND_PORT:-6391}
here=$(cd "$(dirname "$0")" && pwd)
store_lua="$here/../../redis/redis.lua"
unwatched_lua="$here/../../redis/unwatched.lua"
plain_window_lua="$here/plain-window.lua"
meter_lua="$here/../../redis/meter.lua"
fenced_acquire_lua="$here/fenced-acquire.lua"
fenced_release_lua="$here/fenced-release.lua"
commands_acquire_lua="$here/commands-acquire.lua"
commands_release_lua="$here/commands-release.lua"
commands_check_lua="$here/commands-check.lua"
mkdir -p "$out"

command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }

# One quoted command per line, as redis-cli reads them from stdin.
line() {
  local quoted=() a
  for a in "$@"; do quoted+=("\"$a\""); done
  echo "${quoted[*]}"
}

# The store script's fixed arguments, as the backend sends them: keys, then
# op, clock ('' = Redis's TIME), channel.
store() {
  local p="cg:{p:$1}" op=$2
  shift 2
  line EVALSHA "$store_sha" 3 "$p:e" "$p:x" "$p:f" "$op" '' "$p:w" "$@"
}

# unwatched.lua's one packed argument (its header gives the layout), on
# Redis's clock, in redis-cli's escapes:
#   packed OP CONDITION NUMBER KEY VALUE [GUARD]
# op 2 put, 3 touch, 4 delete; condition 1 always, 2 absent, 5 absent and
# fewer than GUARD; NUMBER the TTL (-1 for none); no guard value.
packed() {
  perl -e 'my ($op, $cond, $number, $key, $value, $guard) = @ARGV;
    my $p = pack("CCd<d<d<", $op, $cond, -1, $number, $guard // 0)
      . pack("V", length $key) . $key . pack("V", length $value) . $value . pack("V", 0);
    print join("", map { sprintf("\\x%02x", ord) } split(//, $p));' "$@"
}
acquire_input=$(packed 2 2 30000 holder 0123456789abcdef0123456789abcdef)
release_input=$(packed 4 1 -1 holder '')
touch_input=$(packed 3 1 30000 holder '')
# A semaphore's permit: keyed by its owner token, holding its limit.
permit=0123456789abcdef0123456789abcdef

# A call of it on an unwatched partition (a lock's): one key, one argument.
unwatched() {
  line EVALSHA "$unwatched_sha" 1 "cg:{p:~$1}:s" "$2"
}

# A sliding-window check that consumes, on Redis's clock, with a limit of
# 10 000 000, a window of 60 000 ms and a cost of 1, packed as the backend
# packs it (two code bytes, then five little-endian doubles: the clock, the
# limit, the window, the cost, and a refund's time, 0), in redis-cli's
# escapes.
meter_input='\x01\x01\x00\x00\x00\x00\x00\x00\xf0\xbf\x00\x00\x00\x00\xd0\x12\x63\x41\x00\x00\x00\x00\x00\x4c\xed\x40\x00\x00\x00\x00\x00\x00\xf0\x3f\x00\x00\x00\x00\x00\x00\x00\x00'

# Values of the sizes of a lock's partition with its holder (92 bytes) and
# without (18), for the commands-only lock, and of a meter's state and reply
# (33 each), for the commands-only check.
with_holder=$(printf 'h%.0s' {1..92})
without=$(printf 'n%.0s' {1..18})
meter_state=$(printf 's%.0s' {1..33})

# The permits held beside the pairs of permit-pair-H-held: H acquires on one
# semaphore's partition, with long TTLs (prefill-H is those alone,
# subtracted below), under a limit of 20 000.
prefill() {
  local j
  for ((j = 0; j < $1; j++)); do
    store "~sem/bench/many" put "held$j" 20000 600000 absent-and-fewer-than 20000
  done
}

workload() {
  local i p
  [ "$1" = baseline ] && return
  case $1 in
    prefill-*)
      prefill "${1#prefill-}"
      return ;;
    permit-pair-*-held)
      local held=${1#permit-pair-}
      prefill "${held%-held}"
      for ((i = 0; i < n; i++)); do
        store "~sem/bench/many" put "$permit" 20000 30000 absent-and-fewer-than 20000
        store "~sem/bench/many" delete "$permit" always
      done
      return ;;
  esac
  for ((i = 0; i < n; i++)); do
    p="lock/bench/k$((i % 100))"
    case $1 in
      lock-pair)
        # On the lock's unwatched partition, as the component names it.
        unwatched "$p" "$acquire_input"
        unwatched "$p" "$release_input" ;;
      permit-pair)
        # A semaphore's acquire (absent and fewer than 10) and release on its
        # partition, which redis.lua keeps as a hash of permits with an index
        # of expiries (the component names it '~sem:...').
        store "~sem/bench/k$((i % 100))" put "$permit" 10 30000 absent-and-fewer-than 10
        store "~sem/bench/k$((i % 100))" delete "$permit" always ;;
      watched-lock-pair)
        # The same pair on a watched partition (redis.lua: entries hash,
        # expiry index, change feed, a publish per write), as every lock
        # ran before unwatched partitions.
        store "$p" put holder 0123456789abcdef0123456789abcdef 30000 absent
        store "$p" delete holder always ;;
      upsert)
        store "eph/bench" put "k$((i % 100))" user=ada 60000 always ;;
      extend)
        # A touch of a held lock (held since the first 100 operations), as an
        # extend makes, but unguarded: the guard's revision is not known here.
        if ((i < 100)); then
          unwatched "$p" "$acquire_input"
        else
          unwatched "$p" "$touch_input"
        fi ;;
      snapshot)
        # A listing of a 100-entry partition (filled by the first 100 operations).
        if ((i < 100)); then
          store "eph/snap" put "k$i" user=ada 600000 always
        else
          store "eph/snap" list ''
        fi ;;
      check)
        line EVALSHA "$meter_sha" 1 "cg:{p:rl/bench}:r:k$((i % 100))" "$meter_input" ;;
      plain-window-check)
        # The plain two-counter sliding window on the caller's clock (one
        # window throughout: 1000 checks take well under a minute).
        line EVALSHA "$plain_window_sha" 2 "cg:{w$((i % 100))}:1" "cg:{w$((i % 100))}:0" 10000000 1750000030000 60000 1 ;;
      commands-check)
        # The check's commands with none of the meter script's logic.
        line EVALSHA "$commands_check_sha" 1 "cg:{p:rl/bench}:r:k$((i % 100))" "$meter_state" "$meter_state" ;;
      bare-lock-pair)
        line SET "cg:$p" 0123456789abcdef0123456789abcdef NX PX 30000
        line EVALSHA "$release_sha" 1 "cg:$p" 0123456789abcdef0123456789abcdef ;;
      fenced-lock-pair)
        line EVALSHA "$fenced_acquire_sha" 1 "cg:$p" 0123456789abcdef0123456789abcdef 30000
        line EVALSHA "$fenced_release_sha" 1 "cg:$p" 0123456789abcdef0123456789abcdef ;;
      commands-lock-pair)
        # coord's lock commands with none of its script's logic.
        local k="cg:{p:~$p}:s"
        line EVALSHA "$commands_acquire_sha" 1 "$k" "$with_holder" "$without"
        line EVALSHA "$commands_release_sha" 1 "$k" "$with_holder" "$without" ;;
      ping)
        line PING ;;
    esac
  done
}

baseline=0
for w in baseline lock-pair permit-pair prefill-1000 permit-pair-1000-held prefill-10000 permit-pair-10000-held watched-lock-pair upsert extend snapshot check plain-window-check commands-check bare-lock-pair fenced-lock-pair commands-lock-pair ping; do
  valgrind --tool=callgrind --toggle-collect=processCommand \
    --callgrind-out-file="$out/callgrind.$w.out" \
    "$server" --port "$port" --save '' --appendonly no >/dev/null 2>"$out/valgrind.$w.log" &
  vg=$!
  until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.2; done
  # Loaded as the backend loads it, behind its configuration line.
  store_sha=$(redis-cli -p "$port" script load "local HISTORY, RETENTION, PUBLISH = '64', 600000, 'PUBLISH'
$(cat "$store_lua")")
  unwatched_sha=$(redis-cli -p "$port" script load "local RETENTION, PUBLISH, STREAM = 600000, 'PUBLISH', true
$(cat "$unwatched_lua")")
  plain_window_sha=$(redis-cli -p "$port" script load "$(cat "$plain_window_lua")")
  meter_sha=$(redis-cli -p "$port" script load "$(cat "$meter_lua")")
  release_sha=$(redis-cli -p "$port" script load \
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end")
  fenced_acquire_sha=$(redis-cli -p "$port" script load "$(cat "$fenced_acquire_lua")")
  fenced_release_sha=$(redis-cli -p "$port" script load "$(cat "$fenced_release_lua")")
  commands_acquire_sha=$(redis-cli -p "$port" script load "$(cat "$commands_acquire_lua")")
  commands_release_sha=$(redis-cli -p "$port" script load "$(cat "$commands_release_lua")")
  commands_check_sha=$(redis-cli -p "$port" script load "$(cat "$commands_check_lua")")
  # A reply that is an error would count a failing script: stop instead.
  errors=$(workload "$w" | redis-cli -p "$port" | grep -c '^ERR' || true)
  if [ "$errors" -ne 0 ]; then
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    echo "$w: $errors replies were errors; nothing counted" >&2
    exit 1
  fi
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$vg" || true
  total=$(sed -n 's/^summary: //p' "$out/callgrind.$w.out")
  if [ "$w" = baseline ]; then
    baseline=$total # the SCRIPT LOADs, which every run makes
    continue
  fi
  case $w in
    prefill-*)
      prefill=$total # the acquires the next workload starts with
      continue ;;
    permit-pair-*-held)
      printf '%-22s %10d instructions per operation (%d operations)\n' "$w" $(((total - prefill) / n)) "$n"
      continue ;;
  esac
  printf '%-22s %10d instructions per operation (%d operations)\n' "$w" $(((total - baseline) / n)) "$n"
done
echo "callgrind files: $out"
