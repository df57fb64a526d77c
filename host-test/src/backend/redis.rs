//! The Redis backend: the store contract on Redis (or Valkey), one round trip
//! per call, ready for Redis Cluster.
//!
//! Every operation is one `EVALSHA` of `redis.lua` (loaded once behind a line
//! that sets this backend's history and retention, reloaded on `NOSCRIPT`),
//! except `now`, which is one `TIME`, and `wait-then-put`, which
//! is one `XREAD BLOCK` with the put's `EVALSHA` sent right behind it. The
//! script keeps each partition in three keys that share one hash tag — `<prefix>:{p:<partition>}:e`
//! (entries and the partition's meta), `:x` (expiry index), `:f` (change
//! feed, a stream trimmed by whole nodes, its exact history enforced on
//! read) — so it always touches one cluster slot. Time is Redis's own
//! (`TIME` inside the script); due expiries are swept by the first script
//! that touches the partition after them and recorded in the feed; every key carries a Redis
//! TTL (the last entry's expiry plus the retention), so an abandoned
//! partition disappears by itself. (Tests may give a [`ManualClock`] in
//! [`RedisConfig::test_clock`]; its time then replaces `TIME`.)
//!
//! `wait` does not hold a connection per waiter: one RESP3 connection is
//! subscribed to the channels of the partitions that have waiters here, the
//! scripts `PUBLISH` each change, and a waiter re-checks the partition at
//! least every [`RedisConfig::recheck`], so a lost notification delays it by a bounded
//! time, never forever. `wait` is the one call that may take more than one
//! round trip: a check per wake-up.
//!
//! `wait-then-put` (how a lock waiter waits) does hold a connection while it
//! blocks, taken from a small pool: it sends `XREAD BLOCK` on the partition's
//! change feed and, in the same write, the put's `EVALSHA`. Redis runs a
//! connection's commands in order, so the put runs the moment the feed
//! grows (or the block times out), on the server, with no round trip back
//! to this host in between. Every change, the release of a lock included,
//! appends to the feed, so nothing extra is written for it. The host ends
//! a block at its timeout itself (`CLIENT UNBLOCK ... TIMEOUT` from the main
//! connection), as Redis notices blocked commands' timeouts only at its cron
//! tick. At most [`RedisConfig::blocking_connections`] calls block at once;
//! beyond that, when no connection can be opened, once Redis has refused
//! `XREAD` (an ACL), and under a test clock (whose time cannot end a block
//! on Redis), it is a `wait` followed by a `put`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use ::redis::{
    AsyncConnectionConfig, Client, Cmd, ErrorKind, IntoConnectionInfo, ProtocolVersion, PushInfo,
    PushKind, RedisError, ServerErrorKind, Value,
};
use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot, watch};

use super::*;
use crate::clock::{Clock, ManualClock};

/// The Lua script that implements every partition operation but `meter`,
/// without the line of configuration it is loaded behind
/// ([`store_script`]).
const SCRIPT: &str = include_str!("redis.lua");
/// The Lua script of `meter` (the rate limiter's one round trip).
const METER_SCRIPT: &str = include_str!("meter.lua");

/// The default longest sleep of a waiter between checks, in ms.
pub const RECHECK_MS: u64 = 500;
/// The default number of `wait-then-put` calls that may block on a
/// connection of their own at once.
pub const BLOCKING_CONNECTIONS: usize = 64;

/// How to reach Redis and how to lay out coord's data there.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// `redis://[user:password@]host[:port][/db]`, or `rediss://` for TLS
    /// (append `#insecure` to skip certificate verification).
    pub url: String,
    /// The first part of every key, so several deployments can share a database.
    pub prefix: String,
    /// How many changes each partition's feed keeps.
    pub history: usize,
    /// How long a partition's keys outlive its last entry, in ms: the time a
    /// watcher can resume from an old revision after the partition went quiet.
    pub retention_ms: u64,
    /// How long a request may take before it fails as unavailable.
    pub response_timeout: Duration,
    /// The longest a waiter sleeps between checks when no notification
    /// comes: the bound on the delay a lost notification can cause.
    pub recheck: Duration,
    /// How many `wait-then-put` calls may block at once, each on a Redis
    /// connection of its own (kept open for the next one afterwards); calls
    /// beyond it wait on the shared subscriber connection, then put. 0 turns
    /// the blocking path off.
    pub blocking_connections: usize,
    /// For tests only: take "now" from this clock instead of Redis's `TIME`,
    /// so TTL tests move a clock instead of sleeping. Everything else still
    /// runs in Redis. `None` (the default) is the store's own clock.
    pub test_clock: Option<Arc<ManualClock>>,
}

impl RedisConfig {
    /// The defaults for `url`: prefix `coord`, 1024 changes of history,
    /// ten minutes of retention, a two-second response timeout, a re-check
    /// every half second, 64 blocking connections at most, and Redis's own
    /// clock.
    pub fn new(url: impl Into<String>) -> Self {
        RedisConfig {
            url: url.into(),
            prefix: "coord".into(),
            history: coord_component::memory::DEFAULT_HISTORY,
            retention_ms: DEFAULT_RETENTION_MS,
            response_timeout: Duration::from_secs(2),
            recheck: Duration::from_millis(RECHECK_MS),
            blocking_connections: BLOCKING_CONNECTIONS,
            test_clock: None,
        }
    }
}

/// Local waiters on one partition's channel.
struct Waiting {
    /// Waiters registered (subscribed or subscribing).
    count: usize,
    /// Waiters asleep after a check that found nothing new.
    sleeping: usize,
    /// The highest revision published on the channel since the first waiter came.
    notify: watch::Sender<u64>,
}

type Waiters = Arc<Mutex<HashMap<String, Waiting>>>;

/// The store on a Redis server.
pub struct RedisBackend {
    conn: ConnectionManager,
    /// The store script as this backend loads it, and its SHA-1.
    script: String,
    sha: String,
    meter_sha: String,
    config: RedisConfig,
    round_trips: AtomicU64,
    waiters: Waiters,
    subscriptions: mpsc::UnboundedSender<(String, oneshot::Sender<()>)>,
    /// Opens the connections `wait-then-put` blocks on (RESP3, which lets
    /// a connection report that it was closed).
    blocking_client: Client,
    /// Blocking connections whose call finished cleanly, ready for the next.
    idle_blocking: Mutex<Vec<BlockingConnection>>,
    /// `wait-then-put` calls blocking right now.
    blocking: AtomicUsize,
    /// Blocking connections opened so far (for tests: reuse is observable).
    blocking_opened: AtomicU64,
    /// Blocks this host ended at their timeout with `CLIENT UNBLOCK`.
    unblocked: AtomicU64,
    /// Set once Redis refuses `XREAD` (an ACL, a proxy): from then on every
    /// `wait-then-put` is a `wait`, then a `put`.
    blocking_refused: AtomicBool,
    /// Set once Redis refuses `CLIENT UNBLOCK`: from then on a block ends
    /// at Redis's own timeout, which its cron notices (every 100 ms at the
    /// default `hz`), not at the host's.
    unblock_refused: AtomicBool,
    /// Taken for the whole of each script call when a test clock gives the
    /// time (see [`RedisBackend::turn`]).
    test_turn: tokio::sync::Mutex<()>,
}

fn unavailable(e: RedisError) -> StoreError {
    StoreError::Unavailable(format!("redis: {e}"))
}

fn malformed(what: &str) -> StoreError {
    StoreError::Unavailable(format!("redis: malformed reply ({what})"))
}

impl RedisBackend {
    /// Connect to the server `config.url` names. Fails as unavailable when it
    /// cannot be reached now; once connected, lost connections are re-made
    /// in the background and calls fail as unavailable meanwhile.
    pub async fn connect(config: RedisConfig) -> Result<Self, StoreError> {
        let info = config
            .url
            .as_str()
            .into_connection_info()
            .map_err(unavailable)?;
        let push_settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let push_info = info.clone().set_redis_settings(push_settings);
        let manager_config = || {
            ConnectionManagerConfig::new()
                .set_response_timeout(Some(config.response_timeout))
                .set_connection_timeout(Some(config.response_timeout))
                .set_number_of_retries(2)
                .set_max_delay(Duration::from_millis(500))
        };
        let conn = ConnectionManager::new_with_config(
            Client::open(info).map_err(unavailable)?,
            manager_config(),
        )
        .await
        .map_err(unavailable)?;

        let waiters: Waiters = Arc::default();
        // Notifications are dispatched right where the connection reads them,
        // not handed to a task of their own: one wake-up less per handoff.
        let dispatch_to = waiters.clone();
        let blocking_client = Client::open(push_info).map_err(unavailable)?;
        let push = ConnectionManager::new_with_config(
            blocking_client.clone(),
            manager_config()
                .set_push_sender(move |push: PushInfo| {
                    dispatch_notification(&push, &dispatch_to);
                    Ok::<(), std::convert::Infallible>(())
                })
                .set_automatic_resubscription(),
        )
        .await
        .map_err(unavailable)?;
        let (sub_tx, sub_rx) = mpsc::unbounded_channel();
        tokio::spawn(manage_subscriptions(sub_rx, push, waiters.clone()));

        let config = RedisConfig {
            history: config.history.max(1),
            ..config
        };
        let script = store_script(&config);
        let backend = RedisBackend {
            conn,
            sha: sha1_hex(&script),
            script,
            meter_sha: sha1_hex(METER_SCRIPT),
            config,
            round_trips: AtomicU64::new(0),
            waiters,
            subscriptions: sub_tx,
            blocking_client,
            idle_blocking: Mutex::new(Vec::new()),
            blocking: AtomicUsize::new(0),
            blocking_opened: AtomicU64::new(0),
            unblocked: AtomicU64::new(0),
            blocking_refused: AtomicBool::new(false),
            unblock_refused: AtomicBool::new(false),
            test_turn: tokio::sync::Mutex::new(()),
        };
        Ok(backend)
    }

    /// One `PING` on the backend's connection: the bare round trip that
    /// benchmarks compare every operation with. Counted as a round trip.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        ::redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// How many requests this backend has sent to Redis.
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    /// How many connections `wait-then-put` has opened to block on.
    pub fn blocking_connections_opened(&self) -> u64 {
        self.blocking_opened.load(Ordering::Relaxed)
    }

    /// How many blocks this host has ended at their timeout itself.
    pub fn blocks_ended_at_timeout(&self) -> u64 {
        self.unblocked.load(Ordering::Relaxed)
    }

    /// How many idle blocking connections are kept that are not known to be
    /// closed: lets a test see a closed one noticed before it calls again.
    pub fn blocking_connections_idle(&self) -> usize {
        self.idle_blocking.lock().map_or(0, |idle| {
            idle.iter()
                .filter(|c| !c.closed.load(Ordering::Acquire))
                .count()
        })
    }

    /// How many `wait` calls of this backend are asleep on `partition`,
    /// having checked it and found nothing new. Lets a test know a waiter is
    /// blocked before it acts, instead of hoping.
    pub fn waiters(&self, partition: &str) -> usize {
        let channel = self.key(partition, "w");
        self.waiters
            .lock()
            .map_or(0, |w| w.get(&channel).map_or(0, |w| w.sleeping))
    }

    /// The Redis key of one part of a partition. The partition is escaped so
    /// it holds no `{` or `}`: the hash tag is exactly `p:<partition>`, and
    /// distinct partitions never share keys.
    pub fn key(&self, partition: &str, part: &str) -> String {
        let escaped = partition
            .replace('%', "%25")
            .replace('{', "%7B")
            .replace('}', "%7D");
        format!("{}:{{p:{escaped}}}:{part}", self.config.prefix)
    }

    /// The store script as this backend loads it (its configuration line
    /// first), for tests that call it by hand.
    pub fn script_text(&self) -> &str {
        &self.script
    }

    /// Every key (and the channel) a partition uses, for tests of the layout.
    pub fn keys(&self, partition: &str) -> [String; 4] {
        ["e", "x", "f", "w"].map(|part| self.key(partition, part))
    }

    /// The script call for `op` on `partition`, before its own arguments.
    fn script(&self, partition: &str, op: &str) -> Cmd {
        let [e, x, f, w] = self.keys(partition);
        let mut cmd = ::redis::cmd("EVALSHA");
        cmd.arg(&self.sha).arg(3).arg(e).arg(x).arg(f).arg(op);
        // The script reads Redis's TIME unless a test clock gives the time.
        match &self.config.test_clock {
            Some(clock) => cmd.arg(clock.now_ms()),
            None => cmd.arg(""),
        };
        cmd.arg(w);
        cmd
    }

    /// Send one request; after `NOSCRIPT` (a restarted or flushed server),
    /// load the script and send it again.
    async fn run(&self, cmd: &Cmd) -> Result<Vec<Value>, StoreError> {
        self.run_script(cmd, &self.script).await
    }

    /// [`RedisBackend::run`] for a call of `script`.
    async fn run_script(&self, cmd: &Cmd, script: &str) -> Result<Vec<Value>, StoreError> {
        match self.run_script_value(cmd, script).await? {
            Value::Array(values) => Ok(values),
            other => Err(malformed(&format!("expected an array, got {other:?}"))),
        }
    }

    /// [`RedisBackend::run_script`], whatever the reply's shape.
    async fn run_script_value(&self, cmd: &Cmd, script: &str) -> Result<Value, StoreError> {
        let mut conn = self.conn.clone();
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        let reply = match cmd.query_async::<Value>(&mut conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.round_trips.fetch_add(2, Ordering::Relaxed);
                ::redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(script)
                    .query_async::<String>(&mut conn)
                    .await
                    .map_err(unavailable)?;
                cmd.query_async::<Value>(&mut conn).await
            }
            other => other,
        };
        reply.map_err(unavailable)
    }

    /// A put (with `Some(value)`), delete or touch, and its reply.
    async fn write(
        &self,
        mut cmd: Cmd,
        key: &str,
        value: Option<&[u8]>,
        ttl_ms: Option<i64>,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        let sent = write_args(&mut cmd, key, value, ttl_ms, condition);
        write_reply(self.run_script_value(&cmd, &self.script).await?, key, sent)
    }

    /// `wait-then-put` on a connection of its own: `XREAD BLOCK` on the
    /// feed, the put's `EVALSHA` behind it in the same write. `None` when
    /// this call should wait and put apart instead: every blocking
    /// connection is in use, none could be opened, or Redis refused the
    /// `XREAD` (and the put it then ran at once did not apply).
    ///
    /// The host ends the block itself at the timeout, with `CLIENT UNBLOCK`
    /// from the main connection: Redis times blocked commands out only at
    /// its cron tick (every 100 ms at the default `hz`), so its own timeout,
    /// a response timeout later, is only the backstop.
    #[allow(clippy::too_many_arguments)] // the WIT function's parameters, one for one
    async fn blocking_wait_then_put(
        &self,
        partition: &str,
        key: &str,
        value: &[u8],
        ttl_ms: Option<i64>,
        condition: &Condition,
        after: u64,
        timeout_ms: u64,
    ) -> Option<Result<WriteReply, StoreError>> {
        let slot = BlockingSlot::take(self)?;
        // A connection that cannot be opened (a client limit, say) leaves the
        // shared connections, which may still serve.
        let mut conn = slot.connection().await.ok()?;
        let mut put = self.script(partition, "put");
        let sent = write_args(&mut put, key, Some(value), ttl_ms, condition);
        let unblock = !self.unblock_refused.load(Ordering::Relaxed);
        let backstop = if unblock {
            u64::try_from(self.config.response_timeout.as_millis()).unwrap_or(u64::MAX)
        } else {
            0
        };
        let mut pipe = ::redis::pipe();
        // Entries of the feed after `after` (its ids are "<revision>-0"):
        // the first one there is, or the first one appended while blocked.
        // One is enough to end the wait.
        pipe.cmd("XREAD")
            .arg("COUNT")
            .arg(1)
            .arg("BLOCK")
            .arg(timeout_ms.saturating_add(backstop))
            .arg("STREAMS")
            .arg(self.key(partition, "f"))
            .arg(format!("{after}-0"))
            .add_command(put.clone())
            .ignore_errors();
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        let limit = Duration::from_millis(timeout_ms.saturating_add(backstop))
            .saturating_add(self.config.response_timeout);
        let exchange = async {
            let replies = pipe.query_async::<Vec<Value>>(&mut conn.conn);
            tokio::pin!(replies);
            if unblock {
                tokio::select! {
                    replies = &mut replies => return replies,
                    _ = tokio::time::sleep(Duration::from_millis(timeout_ms)) => {}
                }
                // Nothing blocked yet means the XREAD has not reached Redis
                // (a timeout of a millisecond, a busy host) or was answered
                // just now: ask again until it is ended or its reply is here.
                while let Some(false) = self.unblock(conn.id).await {
                    tokio::select! {
                        replies = &mut replies => return replies,
                        _ = tokio::time::sleep(Duration::from_millis(1)) => {}
                    }
                }
            }
            replies.await
        };
        let replies = match tokio::time::timeout(limit, exchange).await {
            Ok(Ok(replies)) => replies,
            Ok(Err(e)) => return Some(Err(unavailable(e))),
            Err(_) => {
                return Some(Err(StoreError::Unavailable(format!(
                    "redis: no reply to a wait-then-put within {} ms",
                    limit.as_millis()
                ))));
            }
        };
        let mut replies = replies.into_iter();
        let (Some(read), Some(reply)) = (replies.next(), replies.next()) else {
            return Some(Err(malformed("a wait-then-put without both replies")));
        };
        slot.keep(conn);
        let reply = match reply.extract_error() {
            Ok(reply) => write_reply(reply, key, sent),
            // A restarted or flushed server forgot the script: the wait is
            // over, so load it and put again, once.
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                match self.run_script_value(&put, &self.script).await {
                    Ok(reply) => write_reply(reply, key, sent),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(unavailable(e)),
        };
        if let Value::ServerError(_) = read {
            // Redis refused the XREAD, so the put ran without a wait. Keep
            // what it wrote; otherwise wait and put apart, now and from now
            // on (a refusal is a setting, not a moment).
            self.blocking_refused.store(true, Ordering::Relaxed);
            if !matches!(
                &reply,
                Ok(WriteReply {
                    outcome: Outcome::Applied(_),
                    ..
                })
            ) {
                return None;
            }
        }
        Some(reply)
    }

    /// End the block of connection `id` as if it had timed out, so that its
    /// queued put runs now: whether a blocked command was ended, or `None`
    /// when Redis could not be asked or refused. If it refused (`CLIENT
    /// UNBLOCK` is an admin command an ACL may deny), later blocks end at
    /// Redis's own timeout.
    async fn unblock(&self, id: i64) -> Option<bool> {
        let mut conn = self.conn.clone();
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        let unblocked = ::redis::cmd("CLIENT")
            .arg("UNBLOCK")
            .arg(id)
            .arg("TIMEOUT")
            .query_async::<i64>(&mut conn)
            .await;
        match unblocked {
            Ok(1) => {
                self.unblocked.fetch_add(1, Ordering::Relaxed);
                Some(true)
            }
            Ok(_) => Some(false),
            Err(e) => {
                if e.kind() != ErrorKind::Io {
                    self.unblock_refused.store(true, Ordering::Relaxed);
                }
                None
            }
        }
    }
}

/// A connection `wait-then-put` blocks on, and whether it is known closed.
struct BlockingConnection {
    conn: MultiplexedConnection,
    /// Its `CLIENT ID`, for `CLIENT UNBLOCK`.
    id: i64,
    /// Set when the connection reports its disconnection.
    closed: Arc<AtomicBool>,
}

/// One `wait-then-put` blocking on a connection of its own; gives its place
/// back when dropped, however the call ended.
struct BlockingSlot<'a> {
    backend: &'a RedisBackend,
}

impl<'a> BlockingSlot<'a> {
    /// A place among the blocking calls, if one is free.
    fn take(backend: &'a RedisBackend) -> Option<Self> {
        let max = backend.config.blocking_connections;
        backend
            .blocking
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        Some(BlockingSlot { backend })
    }

    /// An idle blocking connection that is still open, or a new one. Idle
    /// ones the server closed meanwhile (a restart, an idle timeout, a
    /// `CLIENT KILL`) are dropped here, before anything is sent on them.
    /// Replies have no timeout of their own: the call bounds the exchange.
    async fn connection(&self) -> Result<BlockingConnection, StoreError> {
        if let Ok(mut idle) = self.backend.idle_blocking.lock() {
            while let Some(conn) = idle.pop() {
                if !conn.closed.load(Ordering::Acquire) {
                    return Ok(conn);
                }
            }
        }
        let closed = Arc::new(AtomicBool::new(false));
        let flag = closed.clone();
        let config = AsyncConnectionConfig::new()
            .set_response_timeout(None)
            .set_connection_timeout(Some(self.backend.config.response_timeout))
            .set_push_sender(move |push: PushInfo| {
                if push.kind == PushKind::Disconnection {
                    flag.store(true, Ordering::Release);
                }
                Ok::<(), std::convert::Infallible>(())
            });
        let mut conn = self
            .backend
            .blocking_client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(unavailable)?;
        let id = tokio::time::timeout(
            self.backend.config.response_timeout,
            ::redis::cmd("CLIENT")
                .arg("ID")
                .query_async::<i64>(&mut conn),
        )
        .await
        .map_err(|_| StoreError::Unavailable("redis: no reply to CLIENT ID".into()))?
        .map_err(unavailable)?;
        self.backend.blocking_opened.fetch_add(1, Ordering::Relaxed);
        Ok(BlockingConnection { conn, id, closed })
    }

    /// Keep `conn` for the next call: only a connection whose exchange ended
    /// cleanly, never one a cancelled or failed call may have left blocked.
    fn keep(&self, conn: BlockingConnection) {
        if let Ok(mut idle) = self.backend.idle_blocking.lock() {
            idle.push(conn);
        }
    }
}

impl Drop for BlockingSlot<'_> {
    fn drop(&mut self) {
        self.backend.blocking.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Append a write's own arguments to `cmd`, only those its operation reads
/// (the script's header lists them; each one costs Redis a string and an
/// ARGV slot): a put's key, value and TTL (`Some(value)`), a touch's key and
/// TTL, a delete's key; then the condition. Returns the value an applied
/// write leaves, when this call sent it (the script then leaves it out of
/// its reply): a put's own, or a guard's.
fn write_args<'a>(
    cmd: &mut Cmd,
    key: &str,
    value: Option<&'a [u8]>,
    ttl_ms: Option<i64>,
    condition: &'a Condition,
) -> Option<&'a [u8]> {
    cmd.arg(key);
    match (value, ttl_ms) {
        (Some(value), ttl_ms) => cmd.arg(value).arg(ttl_ms.unwrap_or(-1)),
        (None, Some(ttl_ms)) => cmd.arg(ttl_ms),
        (None, None) => cmd,
    };
    match condition {
        Condition::Always => cmd.arg("always"),
        Condition::Absent => cmd.arg("absent"),
        Condition::Revision(rev) => cmd.arg("revision").arg(rev),
        Condition::RevisionAndValue(g) => {
            cmd.arg("revision-and-value").arg(g.revision).arg(&g.value)
        }
    };
    match (value, condition) {
        (Some(value), _) => Some(value),
        (None, Condition::RevisionAndValue(g)) => Some(g.value.as_slice()),
        (None, _) => None,
    }
}

/// A write's reply: one packed string when applied, an array otherwise.
fn write_reply(reply: Value, key: &str, sent: Option<&[u8]>) -> Result<WriteReply, StoreError> {
    let reply = match reply {
        Value::BulkString(packed) => return applied_write(&packed, key, sent),
        Value::Array(values) => values,
        other => return Err(malformed(&format!("expected an array, got {other:?}"))),
    };
    let mut r = Reader::new(&reply);
    let now = r.u64()?;
    let applied = r.u64()? == 1;
    let entry = r.maybe_entry()?;
    let outcome = match (applied, entry) {
        (true, Some(entry)) => Outcome::Applied(entry),
        (true, None) => return Err(malformed("an applied write without its entry")),
        (false, entry) => Outcome::Conflict(entry),
    };
    Ok(WriteReply { outcome, now })
}

/// A TTL as the script takes it.
fn ttl_arg(ttl_ms: u64) -> Result<i64, StoreError> {
    i64::try_from(ttl_ms).map_err(|_| StoreError::Invalid("ttl-ms is too large".into()))
}

impl RedisBackend {
    /// With a test clock, one script call at a time, from reading the clock
    /// to the reply: the clock is read when a call is built, so calls in
    /// flight together could reach Redis out of clock order and show the
    /// store's time going back — which Redis's `TIME`, read inside the
    /// script, never does. Without a test clock, nothing is held.
    async fn turn(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        match self.config.test_clock {
            Some(_) => Some(self.test_turn.lock().await),
            None => None,
        }
    }

    /// `(now, revision, next expiry)` of a partition, after sweeping it; the
    /// next expiry may be early (a lower bound), never late.
    async fn check(&self, partition: &str) -> Result<(u64, u64, Option<u64>), StoreError> {
        let _turn = self.turn().await;
        let reply = self.run(&self.script(partition, "check")).await?;
        let mut r = Reader::new(&reply);
        Ok((r.u64()?, r.u64()?, r.optional_u64()?))
    }

    /// Register a waiter on `channel` and make sure it is subscribed before
    /// the waiter's first check, so no notification after it is missed.
    async fn register(&self, channel: &str) -> Result<WaiterGuard<'_>, StoreError> {
        let notify = {
            let mut waiters = self
                .waiters
                .lock()
                .map_err(|_| malformed("poisoned waiter map"))?;
            let w = waiters
                .entry(channel.to_string())
                .or_insert_with(|| Waiting {
                    count: 0,
                    sleeping: 0,
                    notify: watch::Sender::new(0),
                });
            w.count += 1;
            w.notify.subscribe()
        };
        let guard = WaiterGuard {
            backend: self,
            channel: channel.to_string(),
            notify,
        };
        let (ack, acked) = oneshot::channel();
        if self.subscriptions.send((channel.to_string(), ack)).is_ok() {
            // If the subscription cannot be made, the re-check still bounds the wait.
            let _ = acked.await;
        }
        Ok(guard)
    }
}

/// Deregisters a waiter when its `wait` ends, however it ends.
struct WaiterGuard<'a> {
    backend: &'a RedisBackend,
    channel: String,
    notify: watch::Receiver<u64>,
}

impl WaiterGuard<'_> {
    /// Count this waiter as asleep (see [`RedisBackend::waiters`]) until the
    /// returned value drops.
    fn asleep(&self) -> Asleep<'_> {
        self.adjust_sleeping(true);
        Asleep(self)
    }

    fn adjust_sleeping(&self, asleep: bool) {
        if let Ok(mut waiters) = self.backend.waiters.lock()
            && let Some(w) = waiters.get_mut(&self.channel)
        {
            w.sleeping = if asleep {
                w.sleeping + 1
            } else {
                w.sleeping.saturating_sub(1)
            };
        }
    }
}

/// A waiter counted as asleep.
struct Asleep<'a>(&'a WaiterGuard<'a>);

impl Drop for Asleep<'_> {
    fn drop(&mut self) {
        self.0.adjust_sleeping(false);
    }
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        if let Ok(mut waiters) = self.backend.waiters.lock()
            && let Some(w) = waiters.get_mut(&self.channel)
        {
            w.count = w.count.saturating_sub(1);
        }
        let (ack, _) = oneshot::channel();
        let _ = self.backend.subscriptions.send((self.channel.clone(), ack));
    }
}

/// Wake the local waiters of the channel a change was published on. Called
/// by the subscriber connection for each push it reads; never blocks.
fn dispatch_notification(push: &PushInfo, waiters: &Waiters) {
    if push.kind != PushKind::Message {
        return;
    }
    let Some(Value::BulkString(channel)) = push.data.first() else {
        return;
    };
    let Ok(channel) = std::str::from_utf8(channel) else {
        return;
    };
    // The payload is the change's revision; anything else still wakes the
    // waiters, who then check the partition themselves.
    let revision: Option<u64> = match push.data.get(1) {
        Some(Value::BulkString(payload)) => std::str::from_utf8(payload)
            .ok()
            .and_then(|p| p.parse().ok()),
        _ => None,
    };
    if let Ok(waiters) = waiters.lock()
        && let Some(w) = waiters.get(channel)
    {
        w.notify
            .send_modify(|latest| *latest = revision.map_or(*latest, |r| r.max(*latest)));
    }
}

/// Bring the subscriptions in line with the waiters, one channel at a time,
/// in request order, so a subscribe and an unsubscribe never cross.
async fn manage_subscriptions(
    mut requests: mpsc::UnboundedReceiver<(String, oneshot::Sender<()>)>,
    mut push: ConnectionManager,
    waiters: Waiters,
) {
    let mut subscribed = HashSet::new();
    while let Some((channel, ack)) = requests.recv().await {
        let wanted = waiters.lock().is_ok_and(|mut w| {
            let wanted = w.get(&channel).is_some_and(|w| w.count > 0);
            if !wanted {
                w.remove(&channel);
            }
            wanted
        });
        if wanted && !subscribed.contains(&channel) {
            if push.subscribe(&channel).await.is_ok() {
                subscribed.insert(channel);
            }
        } else if !wanted && subscribed.remove(&channel) {
            let _ = push.unsubscribe(&channel).await;
        }
        let _ = ack.send(());
    }
}

/// Reads a string the script packed with Lua's `struct` library (little
/// endian), front to back. Every number in it is a whole number below 2^53,
/// packed as a double, or -1 for none.
struct Packed<'a> {
    bytes: &'a [u8],
}

impl<'a> Packed<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Packed { bytes }
    }

    /// The next `n` bytes.
    fn take(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        if self.bytes.len() < n {
            return Err(malformed("a packed reply cut short"));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn byte(&mut self) -> Result<u8, StoreError> {
        Ok(self.take(1)?[0])
    }

    /// A `struct` `I4`: a length.
    fn length(&mut self) -> Result<usize, StoreError> {
        let bytes = self
            .take(4)?
            .try_into()
            .map_err(|_| malformed("a length"))?;
        usize::try_from(u32::from_le_bytes(bytes)).map_err(|_| malformed("a length"))
    }

    fn double(&mut self) -> Result<f64, StoreError> {
        let bytes = self
            .take(8)?
            .try_into()
            .map_err(|_| malformed("a number"))?;
        Ok(f64::from_le_bytes(bytes))
    }

    fn number(&mut self) -> Result<u64, StoreError> {
        let n = self.double()?;
        if n.fract() == 0.0 && (0.0..9.007_199_254_740_992e15).contains(&n) {
            Ok(n as u64)
        } else {
            Err(malformed("a packed number"))
        }
    }

    /// A number where -1 means none.
    fn optional(&mut self) -> Result<Option<u64>, StoreError> {
        if self.bytes.get(..8) == Some(&(-1.0f64).to_le_bytes()[..]) {
            self.take(8)?;
            return Ok(None);
        }
        self.number().map(Some)
    }

    /// What is left.
    fn rest(self) -> &'a [u8] {
        self.bytes
    }
}

/// The reply of an applied write, packed by the script as
/// `struct.pack('<Bdddd', with_value, now, revision, updated-at, expires-at)`
/// followed by the value when `with_value` is 1; when it is 0, the value is
/// `sent`, the one this call sent itself.
fn applied_write(packed: &[u8], key: &str, sent: Option<&[u8]>) -> Result<WriteReply, StoreError> {
    let mut p = Packed::new(packed);
    let with_value = p.byte()?;
    let (now, revision, updated_at, expires_at) =
        (p.number()?, p.number()?, p.number()?, p.optional()?);
    let value = match (with_value, sent, p.rest()) {
        (1, _, value) => value.to_vec(),
        (0, Some(sent), []) => sent.to_vec(),
        _ => return Err(malformed("a packed write reply without its value")),
    };
    Ok(WriteReply {
        now,
        outcome: Outcome::Applied(Entry {
            key: key.to_string(),
            value,
            revision,
            updated_at,
            expires_at,
        }),
    })
}

/// A listing, packed by the script as `struct.pack('<dd', now, revision)`,
/// then for each entry `struct.pack('<I4I4', #field, #stored)`, the field
/// (`=` and the key) and the stored bytes (`struct.pack('<ddd', revision,
/// updated-at, expires-at)` and the value); sorted here by key bytes.
fn listing(packed: &[u8]) -> Result<ListReply, StoreError> {
    let mut p = Packed::new(packed);
    let (now, revision) = (p.number()?, p.number()?);
    let mut entries = Vec::new();
    while !p.bytes.is_empty() {
        let (field_len, stored_len) = (p.length()?, p.length()?);
        let key = p
            .take(field_len)?
            .strip_prefix(b"=")
            .ok_or_else(|| malformed("a listed field that is not an entry"))?;
        let key =
            String::from_utf8(key.to_vec()).map_err(|_| malformed("a key that is not UTF-8"))?;
        let mut stored = Packed::new(p.take(stored_len)?);
        let (revision, updated_at, expires_at) =
            (stored.number()?, stored.number()?, stored.optional()?);
        entries.push(Entry {
            key,
            value: stored.rest().to_vec(),
            revision,
            updated_at,
            expires_at,
        });
    }
    entries.sort_by(|a, b| a.key.as_bytes().cmp(b.key.as_bytes()));
    Ok(ListReply {
        entries,
        revision,
        now,
    })
}

/// A meter's answer, packed by `meter.lua` as `struct.pack('<Bdddd',
/// allowed, remaining, reset-in, retry-after, now)`.
fn meter_reply(packed: &[u8]) -> Result<MeterReply, StoreError> {
    let mut p = Packed::new(packed);
    let allowed = match p.byte()? {
        0 => false,
        1 => true,
        _ => return Err(malformed("a meter's allowed")),
    };
    let remaining = u32::try_from(p.number()?).map_err(|_| malformed("remaining"))?;
    let (reset_in_ms, retry_after_ms, now) = (p.number()?, p.number()?, p.number()?);
    if !p.rest().is_empty() {
        return Err(malformed("a meter reply too long"));
    }
    Ok(MeterReply {
        allowed,
        remaining,
        reset_in_ms,
        retry_after_ms,
        now,
    })
}

/// A page of the change feed, packed by the script as `struct.pack('<dd',
/// now, revision)`, then for each change `struct.pack('<I4I4', #id,
/// #message)`, the stream id (`<revision>-0`) and the message as the feed
/// keeps it: `struct.pack('<dddI4', at, previous, seq, #key)`, the kind
/// (`p`, `d` or `e`), the key and the value.
fn page(packed: &[u8]) -> Result<ChangesReply, StoreError> {
    let mut p = Packed::new(packed);
    let (now, revision) = (p.number()?, p.number()?);
    let mut changes = Vec::new();
    while !p.bytes.is_empty() {
        let (id_len, message_len) = (p.length()?, p.length()?);
        let id = p.take(id_len)?;
        let change_revision = std::str::from_utf8(id)
            .ok()
            .and_then(|id| id.strip_suffix("-0")?.parse().ok())
            .ok_or_else(|| malformed("a feed id"))?;
        let mut m = Packed::new(p.take(message_len)?);
        let (at, _previous, _seq) = (m.number()?, m.number()?, m.number()?);
        let key_len = m.length()?;
        let kind = match m.byte()? {
            b'p' => ChangeKind::Put,
            b'd' => ChangeKind::Delete,
            b'e' => ChangeKind::Expire,
            _ => return Err(malformed("an unknown change kind")),
        };
        let key = String::from_utf8(m.take(key_len)?.to_vec())
            .map_err(|_| malformed("a key that is not UTF-8"))?;
        changes.push(Change {
            kind,
            key,
            value: m.rest().to_vec(),
            revision: change_revision,
            at,
        });
    }
    Ok(ChangesReply {
        changes,
        revision,
        now,
    })
}

/// Reads a flat script reply front to back.
struct Reader<'a> {
    values: std::slice::Iter<'a, Value>,
}

impl<'a> Reader<'a> {
    fn new(values: &'a [Value]) -> Self {
        Reader {
            values: values.iter(),
        }
    }

    fn next(&mut self) -> Result<&'a Value, StoreError> {
        self.values.next().ok_or_else(|| malformed("too short"))
    }

    fn i64(&mut self) -> Result<i64, StoreError> {
        match self.next()? {
            Value::Int(n) => Ok(*n),
            other => Err(malformed(&format!("expected an integer, got {other:?}"))),
        }
    }

    fn u64(&mut self) -> Result<u64, StoreError> {
        u64::try_from(self.i64()?).map_err(|_| malformed("a negative number"))
    }

    /// A number where -1 means none.
    fn optional_u64(&mut self) -> Result<Option<u64>, StoreError> {
        let n = self.i64()?;
        Ok((n >= 0).then_some(n as u64))
    }

    fn bytes(&mut self) -> Result<Vec<u8>, StoreError> {
        match self.next()? {
            Value::BulkString(b) => Ok(b.clone()),
            other => Err(malformed(&format!("expected a string, got {other:?}"))),
        }
    }

    fn string(&mut self) -> Result<String, StoreError> {
        String::from_utf8(self.bytes()?).map_err(|_| malformed("a key that is not UTF-8"))
    }

    fn entry(&mut self) -> Result<Entry, StoreError> {
        Ok(Entry {
            key: self.string()?,
            value: self.bytes()?,
            revision: self.u64()?,
            updated_at: self.u64()?,
            expires_at: self.optional_u64()?,
        })
    }

    /// A presence flag (0 or 1) followed, when 1, by an entry.
    fn maybe_entry(&mut self) -> Result<Option<Entry>, StoreError> {
        if self.u64()? == 1 {
            Ok(Some(self.entry()?))
        } else {
            Ok(None)
        }
    }
}

#[async_trait]
impl Backend for RedisBackend {
    fn kind(&self) -> &'static str {
        "redis"
    }

    async fn now(&self) -> Result<Millis, StoreError> {
        if let Some(clock) = &self.config.test_clock {
            return Ok(clock.now_ms());
        }
        let mut conn = self.conn.clone();
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        let (secs, micros): (u64, u64) = ::redis::cmd("TIME")
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(secs * 1000 + micros / 1000)
    }

    async fn get(&self, partition: &str, key: &str) -> Result<ReadReply, StoreError> {
        let _turn = self.turn().await;
        let mut cmd = self.script(partition, "get");
        cmd.arg(key);
        let reply = self.run(&cmd).await?;
        let mut r = Reader::new(&reply);
        Ok(ReadReply {
            now: r.u64()?,
            entry: r.maybe_entry()?,
        })
    }

    async fn list(&self, partition: &str, prefix: &str) -> Result<ListReply, StoreError> {
        let _turn = self.turn().await;
        let mut cmd = self.script(partition, "list");
        cmd.arg(prefix);
        match self.run_script_value(&cmd, &self.script).await? {
            Value::BulkString(packed) => listing(&packed),
            other => Err(malformed(&format!(
                "expected a packed listing, got {other:?}"
            ))),
        }
    }

    async fn put(
        &self,
        partition: &str,
        key: &str,
        value: &[u8],
        ttl_ms: Option<u64>,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        let ttl = ttl_ms.map(ttl_arg).transpose()?;
        let _turn = self.turn().await;
        self.write(
            self.script(partition, "put"),
            key,
            Some(value),
            ttl,
            condition,
        )
        .await
    }

    async fn delete(
        &self,
        partition: &str,
        key: &str,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        let _turn = self.turn().await;
        self.write(self.script(partition, "delete"), key, None, None, condition)
            .await
    }

    async fn touch(
        &self,
        partition: &str,
        key: &str,
        ttl_ms: u64,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        let ttl = ttl_arg(ttl_ms)?;
        let _turn = self.turn().await;
        self.write(
            self.script(partition, "touch"),
            key,
            None,
            Some(ttl),
            condition,
        )
        .await
    }

    async fn changes(
        &self,
        partition: &str,
        after: u64,
        max: u32,
    ) -> Result<ChangesReply, StoreError> {
        let _turn = self.turn().await;
        let mut cmd = self.script(partition, "changes");
        cmd.arg(after).arg(max);
        match self.run_script_value(&cmd, &self.script).await? {
            Value::BulkString(packed) => page(&packed),
            Value::Array(reply) => {
                // The history no longer reaches `after`.
                let mut r = Reader::new(&reply);
                let (_now, _revision) = (r.u64()?, r.u64()?);
                Err(StoreError::HistoryGone(r.u64()?))
            }
            other => Err(malformed(&format!("expected a packed page, got {other:?}"))),
        }
    }

    async fn meter(
        &self,
        partition: &str,
        key: &str,
        request: &MeterRequest,
    ) -> Result<MeterReply, StoreError> {
        // The codes meter.lua reads from its one packed argument.
        let algorithm: u8 = match request.algorithm {
            MeterAlgorithm::SlidingWindow => 1,
            MeterAlgorithm::FixedWindow => 2,
            MeterAlgorithm::Gcra => 3,
        };
        let mode: u8 = match request.mode {
            MeterMode::Consume => 1,
            MeterMode::Peek => 2,
            MeterMode::Reset => 3,
        };
        // -1 asks for Redis's TIME. Every number is exact as a double: the
        // limit is at most 10^7, the window a day, a test clock's now below 2^53.
        let clock = match &self.config.test_clock {
            Some(clock) => clock.now_ms() as f64,
            None => -1.0,
        };
        let mut packed = Vec::with_capacity(34);
        packed.extend([algorithm, mode]);
        for number in [
            clock,
            f64::from(request.limit),
            request.window_ms as f64,
            f64::from(request.cost),
        ] {
            packed.extend(number.to_le_bytes());
        }
        let _turn = self.turn().await;
        let mut cmd = ::redis::cmd("EVALSHA");
        cmd.arg(&self.meter_sha)
            .arg(1)
            .arg(format!("{}{key}", self.key(partition, "r:")))
            .arg(packed);
        match self.run_script_value(&cmd, METER_SCRIPT).await? {
            Value::BulkString(packed) => meter_reply(&packed),
            other => Err(malformed(&format!(
                "expected a packed meter reply, got {other:?}"
            ))),
        }
    }

    async fn wait(&self, partition: &str, after: u64, timeout_ms: u64) -> Result<u64, StoreError> {
        let mut guard = self.register(&self.key(partition, "w")).await?;
        let mut deadline = None;
        loop {
            // Mark what we have seen before checking, so a change published
            // after the check wakes us. A published revision past `after`
            // answers the wait with no check: one round trip less per wake-up.
            let published = *guard.notify.borrow_and_update();
            if published > after {
                return Ok(published);
            }
            let (now, revision, next_expiry) = self.check(partition).await?;
            let deadline = *deadline.get_or_insert(now.saturating_add(timeout_ms));
            if revision > after || now >= deadline {
                return Ok(revision);
            }
            let recheck_ms = u64::try_from(self.config.recheck.as_millis()).unwrap_or(u64::MAX);
            let mut sleep_ms = (deadline - now).min(recheck_ms);
            if let Some(expiry) = next_expiry {
                sleep_ms = sleep_ms.min(expiry.saturating_sub(now).max(1));
            }
            let test_clock_reaches = async {
                match &self.config.test_clock {
                    Some(clock) => clock.sleep_until(now + sleep_ms).await,
                    None => std::future::pending().await,
                }
            };
            let mut notify = guard.notify.clone();
            let _asleep = guard.asleep();
            tokio::select! {
                _ = notify.changed() => {}
                _ = test_clock_reaches => {}
                _ = tokio::time::sleep(Duration::from_millis(sleep_ms)) => {}
            }
        }
    }

    async fn wait_then_put(
        &self,
        partition: &str,
        key: &str,
        value: &[u8],
        ttl_ms: Option<u64>,
        condition: &Condition,
        after: u64,
        timeout_ms: u64,
    ) -> Result<WriteReply, StoreError> {
        if timeout_ms == 0 {
            // No wait at all (and `BLOCK 0` would block forever).
            return self.put(partition, key, value, ttl_ms, condition).await;
        }
        // A test clock's time cannot end a block on Redis: that waits here.
        if self.config.test_clock.is_none() && !self.blocking_refused.load(Ordering::Relaxed) {
            let ttl = ttl_ms.map(ttl_arg).transpose()?;
            if let Some(reply) = self
                .blocking_wait_then_put(partition, key, value, ttl, condition, after, timeout_ms)
                .await
            {
                return reply;
            }
        }
        self.wait(partition, after, timeout_ms).await?;
        self.put(partition, key, value, ttl_ms, condition).await
    }
}

/// The store script as a backend with `config` loads it: one line that
/// gives the script `HISTORY` (as the text `XADD` takes) and `RETENTION`,
/// then [`SCRIPT`]. Constants in the script's text cost Redis nothing per
/// call; as arguments they cost a string each, and a `tonumber`.
fn store_script(config: &RedisConfig) -> String {
    format!(
        "local HISTORY, RETENTION = '{}', {}\n{SCRIPT}",
        config.history, config.retention_ms
    )
}

/// SHA-1 of the script, as `EVALSHA` names it.
fn sha1_hex(text: &str) -> String {
    ::redis::Script::new(text).get_hash().to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests may unwrap: a panic is the failure report
    use super::*;

    /// What the script packs for an applied write.
    fn packed(with_value: u8, numbers: [f64; 4], value: &[u8]) -> Vec<u8> {
        let mut out = vec![with_value];
        for n in numbers {
            out.extend_from_slice(&n.to_le_bytes());
        }
        out.extend_from_slice(value);
        out
    }

    fn entry(reply: WriteReply) -> Entry {
        match reply.outcome {
            Outcome::Applied(e) => e,
            other => panic!("expected applied, got {other:?}"),
        }
    }

    #[test]
    fn a_packed_write_reply_takes_its_value_from_the_reply_or_from_the_call() {
        let numbers = [1000.0, 1_000_000.0, 999.0, 5000.0];
        let from_reply = applied_write(&packed(1, numbers, b"v"), "k", None).unwrap();
        assert_eq!(from_reply.now, 1000);
        assert_eq!(
            entry(from_reply),
            Entry {
                key: "k".into(),
                value: b"v".to_vec(),
                revision: 1_000_000,
                updated_at: 999,
                expires_at: Some(5000),
            }
        );
        let from_call = applied_write(&packed(0, numbers, b""), "k", Some(b"sent")).unwrap();
        assert_eq!(entry(from_call).value, b"sent");
        let no_ttl = [1000.0, 1_000_000.0, 999.0, -1.0];
        assert_eq!(
            entry(applied_write(&packed(1, no_ttl, b""), "k", None).unwrap()).expires_at,
            None
        );
    }

    /// What the script packs for one listed entry.
    fn listed(field: &[u8], numbers: [f64; 3], value: &[u8]) -> Vec<u8> {
        let mut stored = Vec::new();
        for n in numbers {
            stored.extend_from_slice(&n.to_le_bytes());
        }
        stored.extend_from_slice(value);
        let mut out = Vec::new();
        for len in [field.len(), stored.len()] {
            out.extend_from_slice(&u32::try_from(len).unwrap().to_le_bytes());
        }
        out.extend_from_slice(field);
        out.extend_from_slice(&stored);
        out
    }

    fn listing_of(entries: &[Vec<u8>]) -> Vec<u8> {
        let mut out = [7.0f64, 42.0].map(f64::to_le_bytes).concat();
        for e in entries {
            out.extend_from_slice(e);
        }
        out
    }

    #[test]
    fn a_packed_listing_is_read_in_key_byte_order() {
        let reply = listing(&listing_of(&[
            listed(b"=b", [3.0, 1.0, -1.0], b"second"),
            listed(b"=a", [2.0, 1.0, 900.0], b""),
        ]))
        .unwrap();
        assert_eq!((reply.now, reply.revision), (7, 42));
        let got: Vec<_> = reply
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_slice(), e.revision, e.expires_at))
            .collect();
        assert_eq!(
            got,
            [
                ("a", &b""[..], 2, Some(900)),
                ("b", &b"second"[..], 3, None)
            ]
        );
        assert_eq!(listing(&listing_of(&[])).unwrap().entries, vec![]);
    }

    #[test]
    fn a_malformed_packed_listing_is_an_error_not_a_panic() {
        let good = listed(b"=k", [2.0, 1.0, 900.0], b"v");
        let cases = [
            listing_of(std::slice::from_ref(&good))[..20].to_vec(), // cut short in the entry
            listing_of(&[good[..good.len() - 1].to_vec()]),         // stored bytes cut short
            listing_of(&[listed(b"#", [2.0, 1.0, 900.0], b"v")]),   // not an entry
            listing_of(&[listed(b"=\xff", [2.0, 1.0, 900.0], b"v")]), // key not UTF-8
            listing_of(&[listed(b"=k", [2.5, 1.0, 900.0], b"v")]),  // not a whole number
            listing_of(&[[1u8, 0, 0, 0, 200, 0, 0, 0, b'='].to_vec()]), // lengths past the end
            vec![1, 2, 3],                                          // no header
        ];
        for case in cases {
            match listing(&case) {
                Err(StoreError::Unavailable(why)) => assert!(why.contains("malformed"), "{why}"),
                other => panic!("expected a malformed reply, got {other:?}"),
            }
        }
    }

    /// What the script packs for one change of a page.
    fn paged(id: &[u8], at: f64, kind: u8, key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut message = [at, 1.0, 1.0].map(f64::to_le_bytes).concat();
        message.extend_from_slice(&u32::try_from(key.len()).unwrap().to_le_bytes());
        message.push(kind);
        message.extend_from_slice(key);
        message.extend_from_slice(value);
        let mut out = Vec::new();
        for len in [id.len(), message.len()] {
            out.extend_from_slice(&u32::try_from(len).unwrap().to_le_bytes());
        }
        out.extend_from_slice(id);
        out.extend_from_slice(&message);
        out
    }

    #[test]
    fn a_packed_page_of_changes_is_read_in_order_and_malformed_ones_are_errors() {
        let reply = page(&listing_of(&[
            paged(b"11-0", 5.0, b'p', b"k", b"v"),
            paged(b"12-0", 6.0, b'e', b"k", b""),
        ]))
        .unwrap();
        assert_eq!((reply.now, reply.revision), (7, 42));
        let got: Vec<_> = reply
            .changes
            .iter()
            .map(|c| (c.kind, c.key.as_str(), c.value.as_slice(), c.revision, c.at))
            .collect();
        assert_eq!(
            got,
            [
                (ChangeKind::Put, "k", &b"v"[..], 11, 5),
                (ChangeKind::Expire, "k", &b""[..], 12, 6)
            ]
        );
        let cases = [
            listing_of(&[paged(b"11", 5.0, b'p', b"k", b"v")]), // an id without its sequence
            listing_of(&[paged(b"x-0", 5.0, b'p', b"k", b"v")]), // an id that is no revision
            listing_of(&[paged(b"11-0", 5.0, b'?', b"k", b"v")]), // an unknown kind
            listing_of(&[paged(b"11-0", -3.0, b'p', b"k", b"v")]), // a negative time
            listing_of(&[paged(b"11-0", 5.0, b'p', b"k", b"v")])[..30].to_vec(), // cut short
        ];
        for case in cases {
            match page(&case) {
                Err(StoreError::Unavailable(why)) => assert!(why.contains("malformed"), "{why}"),
                other => panic!("expected a malformed reply, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_packed_meter_reply_is_read_and_malformed_ones_are_errors() {
        let pack = |allowed: u8, numbers: [f64; 4]| {
            let mut out = vec![allowed];
            for n in numbers {
                out.extend_from_slice(&n.to_le_bytes());
            }
            out
        };
        let reply = meter_reply(&pack(1, [9.0, 60_000.0, 0.0, 1000.0])).unwrap();
        assert!(reply.allowed);
        assert_eq!(
            (
                reply.remaining,
                reply.reset_in_ms,
                reply.retry_after_ms,
                reply.now
            ),
            (9, 60_000, 0, 1000)
        );
        let mut too_long = pack(1, [9.0, 1.0, 0.0, 1000.0]);
        too_long.push(0);
        let cases = [
            pack(2, [9.0, 1.0, 0.0, 1000.0]),  // allowed neither 0 nor 1
            pack(1, [5e9, 1.0, 0.0, 1000.0]),  // remaining beyond a u32
            pack(0, [9.0, 1.0, -1.0, 1000.0]), // a negative retry-after
            pack(1, [9.0, 1.0, 0.0, 1000.0])[..20].to_vec(), // cut short
            too_long,
        ];
        for case in cases {
            match meter_reply(&case) {
                Err(StoreError::Unavailable(why)) => assert!(why.contains("malformed"), "{why}"),
                other => panic!("expected a malformed reply, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_malformed_packed_write_reply_is_an_error_not_a_panic() {
        let good = [1000.0, 1_000_000.0, 999.0, 5000.0];
        let cases = [
            packed(1, good, b"")[..20].to_vec(),       // cut short
            packed(0, good, b""),                      // no value anywhere
            packed(0, good, b"extra"),                 // a value it should not carry
            packed(1, [1000.5, 1.0, 1.0, 1.0], b""),   // not a whole number
            packed(1, [1000.0, -2.0, 1.0, 1.0], b""),  // negative
            packed(1, [1000.0, 1.0, 1.0, -2.0], b""),  // an expiry below -1
            packed(1, [f64::NAN, 1.0, 1.0, 1.0], b""), // not a number
        ];
        for case in cases {
            match applied_write(&case, "k", None) {
                Err(StoreError::Unavailable(why)) => assert!(why.contains("malformed"), "{why}"),
                other => panic!("expected a malformed reply, got {other:?}"),
            }
        }
    }
}
