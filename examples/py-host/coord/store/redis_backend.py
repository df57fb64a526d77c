"""The store contract on Redis, running the project's own Lua scripts.

Compatible byte for byte with the Rust Redis backend
(host-test/redis/src/): the same keys, the same scripts loaded
behind the same configuration line (so the same SHA-1), the same arguments
and replies. A Rust host, this host and any other host on those scripts
share one set of locks, entries and limits on one Redis.

The scripts are read at run time from host-test/redis/ — redis.lua
for a watched partition and a semaphore's, unwatched.lua for the other
unwatched ones (a name that begins with ``~``: a lock's, a lease's;
:func:`~coord.store.redis_codec.one_string`), meter.lua for the rate
limiter — never copied. Each operation is one ``EVALSHA`` (``now`` is one ``TIME``);
``NOSCRIPT`` (a restarted or flushed server) loads the scripts and sends it
again. ``wait`` subscribes to the partition's channel and re-checks at
least every ``recheck_ms``; ``wait-then-put`` is a ``wait``, then a ``put``
(the Rust host's blocking ``XREAD`` is an optimisation not copied here).

A write carries its deadline on Redis's own clock (the Rust backend's
``deadline.rs``): a write held by a paused server, run after its call
raised ``unavailable``, changes nothing. The deadline is the last reply's
time moved on to the moment the call gives up, less a millisecond per second
of the sample's age, so never later than that moment on Redis's clock.

Every connection error, timeout, server error or malformed reply raises
:class:`~coord.store.types.StoreUnavailable`; the linker returns it to the
component as ``unavailable``.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any, Iterable, List, Optional, Sequence, Tuple

import redis
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError
from redis.retry import Retry

from . import redis_codec as codec
from .types import (
    DEFAULT_HISTORY, DEFAULT_RETENTION_MS, ChangesReply, Condition, HistoryGone, ListReply,
    MeterReply, MeterRequest, ReadReply, StoreInvalid, StoreStats, StoreUnavailable, WriteReply,
    check_ttl, is_unwatched,
)

#: The scripts an installed package carries (the wheel's coord/_data/redis/),
#: else, in a checkout, the repository's host-test/redis/ (relative to this
#: file, examples/py-host/coord/store/).
PACKAGED_SCRIPTS_DIR = Path(__file__).resolve().parents[1] / "_data" / "redis"
DEFAULT_SCRIPTS_DIR = (PACKAGED_SCRIPTS_DIR if PACKAGED_SCRIPTS_DIR.is_dir()
                       else Path(__file__).resolve().parents[4] / "host-test" / "redis")

#: How often a call loads the scripts again after ``NOSCRIPT`` before it fails.
RELOADS = 2


def read_script(directory: Path, name: str) -> str:
    """One of the project's Lua scripts, exactly as the Rust backend embeds it."""
    path = directory / name
    try:
        # Bytes, decoded as is: no newline translation may change the SHA-1.
        return path.read_bytes().decode("utf-8")
    except OSError as e:
        raise FileNotFoundError(
            f"coord: the Redis store runs the project's scripts, and {path} could not be read "
            f"({e.strerror}); pass scripts_dir= or set COORD_SCRIPTS") from e


def store_script(base: str, history: int, retention_ms: int, publish: str = "PUBLISH") -> str:
    """redis.lua behind its configuration line, as the Rust backend formats it."""
    return f"local HISTORY, RETENTION, PUBLISH = '{history}', {retention_ms}, '{publish}'\n{base}"


def unwatched_script(base: str, retention_ms: int, publish: str = "PUBLISH",
                     stream: bool = True) -> str:
    """unwatched.lua behind its configuration line, as the Rust backend formats it."""
    return (f"local RETENTION, PUBLISH, STREAM = {retention_ms}, '{publish}', "
            f"{'true' if stream else 'false'}\n{base}")


def sha1_hex(text: str) -> str:
    """The SHA-1 ``EVALSHA`` names a script by."""
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def partition_key(prefix: str, partition: str, part: str) -> str:
    """``<prefix>:{p:<partition>}:<part>``, the partition escaped so it holds no
    ``{`` or ``}``: the hash tag is exactly ``p:<partition>`` and distinct
    partitions never share keys."""
    escaped = partition.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")
    return f"{prefix}:{{p:{escaped}}}:{part}"


class RedisStore:
    """The store contract on one Redis server.

    ``url`` is ``redis://[user:password@]host[:port][/db]`` (or
    ``rediss://``); ``prefix`` is the first part of every key (``coord``, as
    the Rust host's default: hosts that share data must share it);
    ``history`` and ``retention_ms`` are baked into the loaded script and
    must match the other hosts' too (the defaults do). ``timeout_s`` bounds
    every request; ``recheck_ms`` bounds how long a lost notification can
    delay a waiter. Nothing connects until the first call.
    """

    def __init__(self, url: str = "redis://127.0.0.1:6379", *, prefix: str = "coord",
                 history: int = DEFAULT_HISTORY, retention_ms: int = DEFAULT_RETENTION_MS,
                 timeout_s: float = 2.0, recheck_ms: int = 500,
                 scripts_dir: Optional[os.PathLike] = None) -> None:
        directory = Path(scripts_dir or os.environ.get("COORD_SCRIPTS") or DEFAULT_SCRIPTS_DIR)
        self.url = url
        self.prefix = prefix
        self.recheck_ms = recheck_ms
        self.timeout_s = timeout_s
        self.stats = StoreStats()
        self.script = store_script(read_script(directory, "redis.lua"), max(history, 1),
                                   retention_ms)
        self.unwatched_script = unwatched_script(read_script(directory, "unwatched.lua"),
                                                 retention_ms)
        self.meter_script = read_script(directory, "meter.lua")
        self.sha = sha1_hex(self.script)
        self.unwatched_sha = sha1_hex(self.unwatched_script)
        self.meter_sha = sha1_hex(self.meter_script)
        # No command is re-sent by the client: a write that timed out may have
        # been applied, and sending it again could apply it twice.
        # Redis's clock as last heard: (its time in ms, time.monotonic() then).
        self._heard: Optional[Tuple[int, float]] = None
        self.client = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0), health_check_interval=10)

    def close(self) -> None:
        """Close this store's connections."""
        self.client.close()

    def key(self, partition: str, part: str) -> str:
        """The Redis key of one part of a partition (see :func:`partition_key`)."""
        return partition_key(self.prefix, partition, part)

    # -- plumbing --------------------------------------------------------------

    def _call(self, *args: Any) -> Any:
        """One command; every failure is ``unavailable``."""
        try:
            return self.client.execute_command(*args)
        except (redis.RedisError, OSError) as e:
            raise StoreUnavailable(f"redis: {type(e).__name__}: {e}") from None

    def _eval(self, sha: str, keys: Sequence[str], args: Iterable[Any],
              scripts: Sequence[str]) -> Any:
        """``EVALSHA``; after ``NOSCRIPT``, ``SCRIPT LOAD`` ``scripts`` and send it again."""
        command = ["EVALSHA", sha, len(keys), *keys, *args]
        for attempt in range(RELOADS + 1):
            try:
                return self.client.execute_command(*command)
            except NoScriptError:
                if attempt == RELOADS:
                    raise StoreUnavailable("redis: NOSCRIPT after loading the scripts") from None
                for script in scripts:
                    self._call("SCRIPT", "LOAD", script)
            except (redis.RedisError, OSError) as e:
                raise StoreUnavailable(f"redis: {type(e).__name__}: {e}") from None
        raise AssertionError("unreachable")

    def _heard_clock(self, server_ms: int) -> None:
        """A reply read just now said Redis's clock read ``server_ms``."""
        self._heard = (server_ms, time.monotonic())

    def _deadline_ms(self) -> Optional[int]:
        """The latest time on Redis's clock at which a write sent now may still
        apply (its call gives up a socket timeout from now); ``None`` without a
        sample younger than a minute."""
        heard = self._heard
        if heard is None:
            return None
        server_ms, at = heard
        now = time.monotonic()
        age = now - at
        if age > 60.0:
            return None
        ahead_ms = int((now + self.timeout_s - at) * 1000)
        # A millisecond per second of age: clocks drifting apart by up to
        # 1 000 ppm still never let a late write through.
        return max(server_ms + ahead_ms - (int(age) + 1), 2)

    def _store_scripts(self) -> Tuple[str, str]:
        return (self.script, self.unwatched_script)

    def _run(self, partition: str, op: str, deadline: Optional[int] = None,
             **inputs: Any) -> Any:
        """``op`` on ``partition``: unwatched.lua with one packed argument for a
        partition kept as one string, redis.lua with text arguments otherwise;
        with a ``deadline`` on Redis's clock past which it changes nothing."""
        if codec.one_string(partition):
            clock = -1.0 if deadline is None else -float(deadline)
            packed = codec.packed_unwatched(op, clock=clock, **inputs)
            return self._eval(self.unwatched_sha, [self.key(partition, "s")], [packed],
                              self._store_scripts())
        keys = [self.key(partition, part) for part in ("e", "x", "f")]
        # ARGV: the operation, '' (Redis's TIME) or '-<deadline>', the
        # channel, then the op's own.
        clock_arg = "" if deadline is None else f"-{deadline}"
        args = [op, clock_arg, self.key(partition, "w"), *codec.script_args(op, **inputs)]
        return self._eval(self.sha, keys, args, self._store_scripts())

    def _write(self, partition: str, op: str, key: str, value: Optional[bytes] = None,
               ttl_ms: Optional[int] = None, condition: Optional[Condition] = None) -> WriteReply:
        reply = self._run(partition, op, deadline=self._deadline_ms(), key=key, value=value,
                          ttl_ms=ttl_ms, condition=condition)
        written = codec.write_reply(reply, key, codec.sent_value(value, condition))
        self._heard_clock(written.now)
        return written

    def check(self, partition: str) -> Tuple[int, int, Optional[int]]:
        """``(now, revision, next expiry)`` after sweeping the partition; on an
        unwatched partition it also marks that somebody waits, so writes publish."""
        r = codec.Reader(self._run(partition, "check"))
        return r.u64(), r.u64(), r.optional()

    # -- the store contract ------------------------------------------------------

    def now(self) -> int:
        """Redis's clock (``TIME``), in ms."""
        self.stats.count("now")
        reply = self._call("TIME")
        try:
            seconds, micros = int(reply[0]), int(reply[1])
        except (TypeError, ValueError, IndexError):
            raise codec.malformed(f"TIME answered {reply!r}") from None
        now = seconds * 1000 + micros // 1000
        self._heard_clock(now)
        return now

    def get(self, partition: str, key: str) -> ReadReply:
        """Read one key."""
        self.stats.count("get")
        r = codec.Reader(self._run(partition, "get", key=key))
        read = ReadReply(now=r.u64(), entry=r.maybe_entry())
        self._heard_clock(read.now)
        return read

    def list(self, partition: str, prefix: str) -> ListReply:
        """The live entries whose keys start with ``prefix``, in key order."""
        self.stats.count("list")
        reply = self._run(partition, "list", key=prefix)
        if not isinstance(reply, bytes):
            raise codec.malformed(f"expected a packed listing, got {reply!r}")
        return codec.listing(reply)

    def put(self, partition: str, key: str, value: bytes, ttl_ms: Optional[int],
            condition: Condition) -> WriteReply:
        """Write ``value`` under ``key`` if ``condition`` holds."""
        check_ttl("ttl-ms", ttl_ms)
        self.stats.count("put")
        return self._write(partition, "put", key, value, ttl_ms, condition)

    def delete(self, partition: str, key: str, condition: Condition) -> WriteReply:
        """Remove ``key`` if it is live and ``condition`` holds."""
        self.stats.count("delete")
        return self._write(partition, "delete", key, condition=condition)

    def touch(self, partition: str, key: str, ttl_ms: int, condition: Condition) -> WriteReply:
        """Renew a live entry's TTL if ``condition`` holds."""
        check_ttl("ttl-ms", ttl_ms)
        self.stats.count("touch")
        return self._write(partition, "touch", key, ttl_ms=ttl_ms, condition=condition)

    def changes(self, partition: str, after: int, max: int) -> ChangesReply:
        """At most ``max`` changes after ``after``; ``history-gone`` on a gap."""
        if is_unwatched(partition):
            raise StoreInvalid(f"partition: {partition!r} is unwatched (its name begins "
                               "with '~'), so no change feed is kept for it")
        self.stats.count("changes")
        reply = self._run(partition, "changes", after=after, max=max)
        if isinstance(reply, bytes):
            return codec.page(reply)
        # {now, revision, the revision after which the feed is complete, 0}
        r = codec.Reader(reply)
        r.u64(), r.u64()
        raise HistoryGone(r.u64())

    def meter(self, partition: str, key: str, request: MeterRequest) -> MeterReply:
        """Run meter.lua on ``key``'s state: one packed argument, one packed reply."""
        self.stats.count("meter")
        # A peek changes nothing, so it goes without a deadline.
        deadline = None if request.mode == "peek" else self._deadline_ms()
        clock = -1.0 if deadline is None else -float(deadline)
        reply = self._eval(self.meter_sha, [self.key(partition, "r:") + key],
                           [codec.packed_meter(request, clock)], [self.meter_script])
        if not isinstance(reply, bytes):
            raise codec.malformed(f"expected a packed meter reply, got {reply!r}")
        metered = codec.meter_reply(reply)
        self._heard_clock(metered.now)
        return metered

    def wait(self, partition: str, after: int, timeout_ms: int) -> int:
        """Block until the partition's revision passes ``after`` or ``timeout_ms``
        passes on Redis's clock; the latest revision.

        Subscribes to the partition's channel first, then checks, so a change
        published after the check wakes it; re-checks at least every
        ``recheck_ms`` and at the next expiry (which only a check records).
        """
        self.stats.count("wait")
        return self._wait(partition, after, timeout_ms)

    def _wait(self, partition: str, after: int, timeout_ms: int) -> int:
        pubsub = self.client.pubsub()
        try:
            try:
                pubsub.subscribe(self.key(partition, "w"))
                # The confirmation: once it is read, the server has subscribed us.
                confirmed = pubsub.get_message(timeout=self.timeout_s)
            except (redis.RedisError, OSError) as e:
                raise StoreUnavailable(f"redis: subscribing: {type(e).__name__}: {e}") from None
            if not confirmed or confirmed.get("type") != "subscribe":
                raise StoreUnavailable("redis: the subscription was not confirmed in time")
            deadline = None
            while True:
                now, revision, next_expiry = self.check(partition)
                if deadline is None:
                    deadline = now + timeout_ms
                if revision > after or now >= deadline:
                    return revision
                sleep_ms = min(deadline - now, self.recheck_ms)
                if next_expiry is not None:
                    sleep_ms = min(sleep_ms, max(next_expiry - now, 1))
                self.stats.sleeps += 1
                try:
                    message = pubsub.get_message(timeout=sleep_ms / 1000)
                except (redis.RedisError, OSError) as e:
                    raise StoreUnavailable(f"redis: waiting: {type(e).__name__}: {e}") from None
                if message and message.get("type") == "message":
                    # The payload is the change's revision: past `after`, it
                    # answers the wait with no check.
                    try:
                        published = int(message["data"])
                    except (TypeError, ValueError):
                        published = 0
                    if published > after:
                        return published
        finally:
            try:
                pubsub.close()
            except (redis.RedisError, OSError):
                pass

    def wait_then_put(self, partition: str, key: str, value: bytes, ttl_ms: Optional[int],
                      condition: Condition, after: int, timeout_ms: int) -> WriteReply:
        """``wait``, then ``put``, whichever way the wait ended; ``timeout_ms`` 0 is a put."""
        check_ttl("ttl-ms", ttl_ms)
        self.stats.count("wait-then-put")
        if timeout_ms > 0:
            self._wait(partition, after, timeout_ms)
        return self._write(partition, "put", key, value, ttl_ms, condition)

    # -- for tests and operators ------------------------------------------------

    def delete_everything(self) -> int:
        """Delete every key under this store's prefix (for tests); how many went."""
        pattern = "".join("\\" + c if c in "*?[]\\" else c for c in self.prefix) + ":*"
        keys: List[bytes] = []
        try:
            keys = list(self.client.scan_iter(match=pattern, count=1000))
            for i in range(0, len(keys), 500):
                self.client.delete(*keys[i:i + 500])
        except (redis.RedisError, OSError) as e:
            raise StoreUnavailable(f"redis: {type(e).__name__}: {e}") from None
        return len(keys)
