//! The Redis backend: the store contract on Redis (or Valkey), one round trip
//! per call, on one server or a Redis Cluster.
//!
//! This file holds the configuration, the connections and the scripts'
//! plumbing; `store.rs` is the `Backend` implementation, a list of store
//! operations; `codec.rs` reads the scripts' packed replies and writes
//! their arguments; `waiting.rs` is the pub/sub waiter registry;
//! `blocking.rs` the connections a lock waiter's `wait-then-put` blocks on;
//! `link.rs` the connection calls travel on (one server's, or a cluster's
//! that routes each call to its partition's node).
//!
//! On a cluster (`RedisConfig::cluster`) nothing in the scripts changes but
//! the channel command: a partition's keys share one hash tag, so each call
//! runs on the one master that serves the partition's slot; scripts
//! `SPUBLISH` (sharded pub/sub, sent only by that node) and waiters
//! `SSUBSCRIBE`; a blocking `wait-then-put` opens its connection to that
//! node. With [`RedisConfig::replica_acks`] every write is followed on the
//! same connection by `WAIT`, so it answers only once that many replicas
//! hold it, and `unavailable` otherwise.
//!
//! Every operation is one `EVALSHA` of `redis.lua` (loaded once behind a line
//! that sets this backend's history and retention, reloaded on `NOSCRIPT`),
//! except `now`, which is one `TIME`, and `wait-then-put`, which
//! is one `XREAD BLOCK` with the put's `EVALSHA` sent right behind it. The
//! script keeps each partition in three keys that share one hash tag — `<prefix>:{p:<partition>}:e`
//! (entries and the partition's meta), `:x` (expiry index), `:f` (change
//! feed, a stream trimmed by whole nodes, its exact history enforced on
//! read) — so it always touches one cluster slot. An *unwatched* partition
//! (a lock's, a lease's: a name beginning with `~`) keeps no feed, so it
//! runs `unwatched.lua` instead, on one string key (`:s`) that holds the
//! whole partition, with a wake-up stream (`:n`) written only while
//! somebody waits. Time is Redis's own
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

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{
    Client, Cmd, ConnectionInfo, ErrorKind, IntoConnectionInfo, ProtocolVersion, PushInfo,
    RedisError, ServerErrorKind, Value,
};
use coord_component::keys::{is_unwatched, may_hold_many};
use tokio::sync::mpsc;

use blocking::BlockingConnection;
use codec::{Inputs, Op, write_reply};
use coord_host::backend::{DEFAULT_RETENTION_MS, StoreError, WriteReply};
use coord_host::clock::{Clock, ManualClock};
use link::{Link, SlotTable, cluster_connection};
use waiting::{Subscription, Waiters, dispatch_notification, manage_subscriptions};

mod acks;
mod blocking;
mod codec;
mod deadline;
mod link;
mod store;
mod test_clock;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod vectors;
mod waiting;

pub use link::slot_of;

/// The Lua script that implements every partition operation but `meter`,
/// without the line of configuration it is loaded behind
/// ([`store_script`]).
const SCRIPT: &str = include_str!("../redis.lua");
/// The Lua script of every operation on an unwatched partition, without the
/// line of configuration it is loaded behind ([`unwatched_script`]).
const UNWATCHED_SCRIPT: &str = include_str!("../unwatched.lua");
/// The Lua script of `meter` (the rate limiter's one round trip).
const METER_SCRIPT: &str = include_str!("../meter.lua");

/// How often a call loads the scripts again after `NOSCRIPT` before it
/// answers `unavailable`: where it runs, then everywhere.
const RELOADS: usize = 2;

/// The default longest sleep of a waiter between checks, in ms.
pub const RECHECK_MS: u64 = 500;
/// The default number of `wait-then-put` calls that may block on a
/// connection of their own at once.
pub const BLOCKING_CONNECTIONS: usize = 64;

/// How to reach Redis and how to lay out coord's data there.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// `redis://[user:password@]host[:port][/db]`, or `rediss://` for TLS
    /// (append `#insecure` to skip certificate verification). With
    /// [`RedisConfig::cluster`], one or more such URLs of the cluster's
    /// nodes, separated by commas (the others are found from them).
    pub url: String,
    /// Whether `url` names the nodes of a Redis Cluster rather than one server.
    pub cluster: bool,
    /// How many replicas must hold a write before it answers (`WAIT`
    /// right behind each write, on its connection): 0 (the default) answers
    /// once the master has it, as Redis does; a write the replicas do not
    /// acknowledge within [`RedisConfig::replica_ack_timeout`] answers
    /// `unavailable`. With it, an acquisition a caller saw survives the
    /// master's failover. Shared by the processes on one prefix: each
    /// waits for the most any of them was given (`<prefix>:settings`), so
    /// a process given fewer never lowers what the others rely on.
    pub replica_acks: u32,
    /// How long a write waits for [`RedisConfig::replica_acks`] replicas.
    pub replica_ack_timeout: Duration,
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
    /// The defaults for `url`, one server: prefix `coord`, 1024 changes of
    /// history, ten minutes of retention, a two-second response timeout, a
    /// re-check every half second, 64 blocking connections at most, no
    /// replica acknowledgement (half a second when asked for), and Redis's
    /// own clock.
    pub fn new(url: impl Into<String>) -> Self {
        RedisConfig {
            url: url.into(),
            cluster: false,
            replica_acks: 0,
            replica_ack_timeout: Duration::from_millis(500),
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

/// The store on a Redis server or cluster.
pub struct RedisBackend {
    conn: Link,
    /// The replica acknowledgements asked for and relied on (`acks.rs`).
    acks: acks::Acks,
    /// The store script as this backend loads it, and its SHA-1.
    script: String,
    sha: String,
    /// The unwatched partitions' script as this backend loads it, and its SHA-1.
    unwatched_script: String,
    unwatched_sha: String,
    meter_sha: String,
    config: RedisConfig,
    round_trips: AtomicU64,
    /// Redis's clock as last heard, for writes' deadlines.
    server_clock: deadline::ServerClock,
    waiters: Waiters,
    subscriptions: mpsc::UnboundedSender<Subscription>,
    /// The settings of the connections `wait-then-put` blocks on (RESP3,
    /// which lets a connection report that it was closed); on a cluster,
    /// with each node's address put in.
    blocking_info: ConnectionInfo,
    /// On a cluster, the slots' masters, read when a blocking call first
    /// needs them and again after a redirection.
    slots: Mutex<Option<Arc<SlotTable>>>,
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
        let urls: Vec<&str> = if config.cluster {
            config
                .url
                .split(',')
                .map(str::trim)
                .filter(|url| !url.is_empty())
                .collect()
        } else {
            vec![config.url.as_str()]
        };
        let seeds = urls
            .iter()
            .map(|url| url.into_connection_info())
            .collect::<Result<Vec<_>, _>>()
            .map_err(unavailable)?;
        let Some(info) = seeds.first().cloned() else {
            return Err(StoreError::Invalid(
                "url: a cluster needs the URL of at least one of its nodes".into(),
            ));
        };
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
        let waiters: Waiters = Arc::default();
        // Notifications are dispatched right where the connection reads them,
        // not handed to a task of their own: one wake-up less per handoff.
        let dispatch_to = waiters.clone();
        let (sub_tx, sub_rx) = mpsc::unbounded_channel();
        let report_to = sub_tx.clone();
        let dispatch = move |push: PushInfo| {
            dispatch_notification(&push, &dispatch_to, &report_to);
            Ok::<(), std::convert::Infallible>(())
        };
        let (conn, push) = if config.cluster {
            let no_push = None::<fn(PushInfo) -> Result<(), std::convert::Infallible>>;
            let conn = cluster_connection(&seeds, &config, no_push).await;
            let push = cluster_connection(&seeds, &config, Some(dispatch)).await;
            (
                Link::Cluster(conn.map_err(unavailable)?),
                Link::Cluster(push.map_err(unavailable)?),
            )
        } else {
            let conn = ConnectionManager::new_with_config(
                Client::open(info).map_err(unavailable)?,
                manager_config(),
            )
            .await
            .map_err(unavailable)?;
            let push = ConnectionManager::new_with_config(
                Client::open(push_info.clone()).map_err(unavailable)?,
                manager_config()
                    .set_push_sender(dispatch)
                    .set_automatic_resubscription(),
            )
            .await
            .map_err(unavailable)?;
            (Link::Single(conn), Link::Single(push))
        };
        tokio::spawn(manage_subscriptions(sub_rx, push, waiters.clone()));

        let config = RedisConfig {
            history: config.history.max(1),
            ..config
        };
        let script = store_script(&config);
        let unwatched_script = unwatched_script(&config);
        let backend = RedisBackend {
            conn,
            acks: acks::Acks::new(config.replica_acks),
            sha: sha1_hex(&script),
            script,
            unwatched_sha: sha1_hex(&unwatched_script),
            unwatched_script,
            meter_sha: sha1_hex(METER_SCRIPT),
            config,
            round_trips: AtomicU64::new(0),
            server_clock: deadline::ServerClock::default(),
            waiters,
            subscriptions: sub_tx,
            blocking_info: push_info,
            slots: Mutex::new(None),
            idle_blocking: Mutex::new(Vec::new()),
            blocking: AtomicUsize::new(0),
            blocking_opened: AtomicU64::new(0),
            unblocked: AtomicU64::new(0),
            blocking_refused: AtomicBool::new(false),
            unblock_refused: AtomicBool::new(false),
            test_turn: tokio::sync::Mutex::new(()),
        };
        backend.settle_acks().await?;
        Ok(backend)
    }

    /// One `PING` on the backend's connection (on a cluster, to one master):
    /// the bare round trip that benchmarks compare every operation with.
    /// Counted as a round trip.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        self.conn.ping().await.map_err(unavailable)?;
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
        partition_key(&self.config.prefix, partition, part)
    }

    /// The store script as this backend loads it (its configuration line
    /// first), for tests that call it by hand.
    pub fn script_text(&self) -> &str {
        &self.script
    }

    /// Every key (and the channel) a watched partition uses, for tests of
    /// the layout.
    pub fn keys(&self, partition: &str) -> [String; 4] {
        ["e", "x", "f", "w"].map(|part| self.key(partition, part))
    }

    /// Every key (and the channel) an unwatched partition uses: the
    /// partition, its wake-up stream, its channel.
    pub fn unwatched_keys(&self, partition: &str) -> [String; 3] {
        ["s", "n", "w"].map(|part| self.key(partition, part))
    }

    /// The script call for `op` on `partition` with its `inputs`:
    /// `unwatched.lua` for a partition kept as one string ([`one_string`]),
    /// with every input packed in one argument; `redis.lua` otherwise.
    fn script(&self, partition: &str, op: Op, inputs: &Inputs) -> Cmd {
        let clock = self.script_clock(partition, None);
        self.script_on(partition, op, inputs, clock)
    }

    /// [`RedisBackend::script`] for a write whose caller `gives_up` then:
    /// with a recent sample of the partition's server clock, the script
    /// refuses to run past that moment (`deadline.rs`).
    fn write_script(
        &self,
        partition: &str,
        op: Op,
        inputs: &Inputs,
        gives_up: std::time::Instant,
    ) -> Cmd {
        let clock = self.script_clock(partition, Some(gives_up));
        self.script_on(partition, op, inputs, clock)
    }

    /// The clock a script call on `partition` is decided on: the test
    /// clock's, or Redis's with the deadline of a write whose caller
    /// `gives_up` then, when a recent sample of the server's clock gives
    /// one.
    fn script_clock(&self, partition: &str, gives_up: Option<std::time::Instant>) -> ScriptClock {
        if let Some(clock) = &self.config.test_clock {
            return ScriptClock::Test(clock.now_ms());
        }
        gives_up
            .and_then(|at| {
                self.server_clock
                    .deadline_ms(self.clock_slot(partition), at)
            })
            .map_or(ScriptClock::Redis, ScriptClock::RedisBefore)
    }

    fn script_on(&self, partition: &str, op: Op, inputs: &Inputs, clock: ScriptClock) -> Cmd {
        let sha = if one_string(partition) {
            &self.unwatched_sha
        } else {
            &self.sha
        };
        script_command(sha, &self.config.prefix, partition, op, inputs, clock)
    }

    /// Whose clock a partition's calls are decided on: its slot's master
    /// on a cluster, the one server (slot 0) otherwise.
    fn clock_slot(&self, partition: &str) -> u16 {
        if self.config.cluster {
            slot_of(&self.key(partition, "e"))
        } else {
            0
        }
    }

    /// A reply from `partition`'s server said its clock read `now`.
    fn heard_clock(&self, partition: &str, now: u64) {
        if self.config.test_clock.is_none() {
            self.server_clock.heard(self.clock_slot(partition), now);
        }
    }

    /// The scripts a store call may need loaded again after `NOSCRIPT`.
    fn store_scripts(&self) -> [&str; 2] {
        [&self.script, &self.unwatched_script]
    }

    /// Send one request; after `NOSCRIPT` (a restarted or flushed server),
    /// load the scripts and send it again.
    async fn run(&self, cmd: &Cmd) -> Result<Vec<Value>, StoreError> {
        match self.run_script_value(cmd, &self.store_scripts()).await? {
            Value::Array(values) => Ok(values),
            other => Err(malformed(&format!("expected an array, got {other:?}"))),
        }
    }

    /// `call` within the response timeout as a whole: after `NOSCRIPT`, the
    /// script loads and the request sent again share the call's timeout
    /// (the client's own bounds each command alone, so a call could take
    /// several).
    async fn whole_call<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let timeout = self.config.response_timeout;
        tokio::time::timeout(timeout, call)
            .await
            .map_err(|_| StoreError::Unavailable(format!("redis: no answer within {timeout:?}")))?
    }

    /// [`RedisBackend::run`], whatever the reply's shape; `scripts` are
    /// loaded after `NOSCRIPT`.
    async fn run_script_value(&self, cmd: &Cmd, scripts: &[&str]) -> Result<Value, StoreError> {
        self.whole_call(self.run_script_value_in_turns(cmd, scripts))
            .await
    }

    /// [`RedisBackend::run_script_value`], with no bound of its own.
    async fn run_script_value_in_turns(
        &self,
        cmd: &Cmd,
        scripts: &[&str],
    ) -> Result<Value, StoreError> {
        let mut conn = self.conn.clone();
        let mut attempt = 0;
        loop {
            self.round_trips.fetch_add(1, Ordering::Relaxed);
            match cmd.query_async::<Value>(&mut conn).await {
                Err(e)
                    if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
                        && attempt < RELOADS =>
                {
                    self.load_scripts(cmd, scripts, attempt).await?;
                    attempt += 1;
                }
                reply => return reply.map_err(unavailable),
            }
        }
    }

    /// A put, delete or touch of `inputs.key`, and its reply.
    async fn write(
        &self,
        partition: &str,
        op: Op,
        inputs: Inputs<'_>,
    ) -> Result<WriteReply, StoreError> {
        let gives_up = std::time::Instant::now() + self.config.response_timeout;
        let cmd = self.write_script(partition, op, &inputs, gives_up);
        let reply = write_reply(
            self.run_write(&cmd, &self.store_scripts()).await?,
            inputs.key,
            inputs.sent(),
        )?;
        self.heard_clock(partition, reply.now);
        Ok(reply)
    }

    /// [`RedisBackend::run_script_value`] for a call that writes: with
    /// [`RedisConfig::replica_acks`], `WAIT` goes right behind it on the
    /// same connection (still one round trip), and the call answers
    /// `unavailable` unless enough replicas acknowledged it in time. The
    /// write then stays on the master, where the caller's clean-up (a lock's
    /// take-back) finds it.
    async fn run_write(&self, cmd: &Cmd, scripts: &[&str]) -> Result<Value, StoreError> {
        self.whole_call(self.run_write_in_turns(cmd, scripts)).await
    }

    /// [`RedisBackend::run_write`], with no bound of its own.
    async fn run_write_in_turns(&self, cmd: &Cmd, scripts: &[&str]) -> Result<Value, StoreError> {
        let wanted = self.replica_acks();
        if wanted == 0 {
            return self.run_script_value_in_turns(cmd, scripts).await;
        }
        let mut pipe = ::redis::pipe();
        pipe.add_command(cmd.clone())
            .add_command(self.wait_command())
            .ignore_errors();
        let mut conn = self.conn.clone();
        let mut replies = Vec::new();
        for attempt in 0..=RELOADS {
            self.round_trips.fetch_add(1, Ordering::Relaxed);
            replies = pipe
                .query_async::<Vec<Value>>(&mut conn)
                .await
                .map_err(unavailable)?;
            let no_script = matches!(replies.first(),
                Some(Value::ServerError(e)) if e.kind() == Some(ServerErrorKind::NoScript));
            if !no_script || attempt == RELOADS {
                break;
            }
            self.load_scripts(cmd, scripts, attempt).await?;
        }
        let mut replies = replies.into_iter();
        let (Some(reply), Some(acks)) = (replies.next(), replies.next()) else {
            return Err(malformed("a write without its WAIT"));
        };
        let reply = reply.extract_error().map_err(unavailable)?;
        self.check_acks(&acks)?;
        Ok(reply)
    }

    /// `WAIT` for [`RedisConfig::replica_acks`] replicas, for at most
    /// [`RedisConfig::replica_ack_timeout`], and at most half the response
    /// timeout (so that replicas that do not answer make the call answer
    /// how many did, not time out).
    fn wait_command(&self) -> Cmd {
        let limit = self
            .config
            .replica_ack_timeout
            .min(self.config.response_timeout / 2);
        let mut wait = ::redis::cmd("WAIT");
        wait.arg(self.replica_acks())
            .arg(limit.as_millis().max(1) as u64);
        wait
    }

    /// `unavailable` unless `acks` (a `WAIT` reply) counts enough replicas.
    fn check_acks(&self, acks: &Value) -> Result<(), StoreError> {
        let wanted = self.replica_acks();
        match acks {
            Value::Int(n) if *n >= i64::from(wanted) => Ok(()),
            Value::Int(n) => Err(StoreError::Unavailable(format!(
                "redis: the write reached {n} of the {wanted} replicas asked for within {} ms \
                 (it may still be on the master alone; a failover would lose it)",
                self.config.replica_ack_timeout.as_millis()
            ))),
            Value::ServerError(e) => Err(StoreError::Unavailable(format!(
                "redis: WAIT for {wanted} replicas refused: {e:?}"
            ))),
            other => Err(malformed(&format!("expected WAIT's count, got {other:?}"))),
        }
    }

    /// `SCRIPT LOAD` each of `scripts` where `cmd` (an `EVALSHA` that met
    /// `NOSCRIPT`) runs. On a cluster, first (`attempt` 0) on the master of
    /// its key's slot only, so that a node that is down (right after a
    /// failover, say) does not fail the load; then on every master (the
    /// call may have been redirected to a node the slot is moving to).
    async fn load_scripts(
        &self,
        cmd: &Cmd,
        scripts: &[&str],
        attempt: usize,
    ) -> Result<(), StoreError> {
        self.round_trips
            .fetch_add(scripts.len() as u64, Ordering::Relaxed);
        // EVALSHA sha numkeys key…: the first key.
        let key = match cmd.args_iter().nth(3) {
            Some(::redis::Arg::Simple(key)) if attempt == 0 => Some(key.to_vec()),
            _ => None,
        };
        for script in scripts {
            let mut load = ::redis::cmd("SCRIPT");
            load.arg("LOAD").arg(*script);
            self.conn
                .to_key_master(key.as_deref(), &load)
                .await
                .map_err(unavailable)?;
        }
        Ok(())
    }
}

/// The store script as a backend with `config` loads it: one line that
/// gives the script `HISTORY` (as the text `XADD` takes), `RETENTION` and
/// `PUBLISH`, then [`SCRIPT`]. Constants in the script's text cost Redis
/// nothing per call; as arguments they cost a string each, and a `tonumber`.
fn store_script(config: &RedisConfig) -> String {
    format!(
        "local HISTORY, RETENTION, PUBLISH = '{}', {}, '{}'\n{SCRIPT}",
        config.history,
        config.retention_ms,
        publish_command(config)
    )
}

/// The unwatched partitions' script as a backend with `config` loads it:
/// one line that gives it `RETENTION`, `PUBLISH` and `STREAM` (whether it
/// keeps the wake stream a blocked `wait-then-put` reads: not on a
/// cluster, see the script), then [`UNWATCHED_SCRIPT`].
fn unwatched_script(config: &RedisConfig) -> String {
    format!(
        "local RETENTION, PUBLISH, STREAM = {}, '{}', {}\n{UNWATCHED_SCRIPT}",
        config.retention_ms,
        publish_command(config),
        !config.cluster
    )
}

/// Which clock a script call is decided on.
#[derive(Clone, Copy, Debug)]
enum ScriptClock {
    /// Redis's `TIME`.
    Redis,
    /// Redis's `TIME`, and the call changes nothing (it answers `LATE`)
    /// once that is past this deadline in ms.
    RedisBefore(u64),
    /// A test clock's now, in ms.
    Test(u64),
}

impl ScriptClock {
    /// As a packed script argument takes it: -1 for Redis's TIME, -d for
    /// it with the deadline d, or the test clock's now.
    fn packed(self) -> f64 {
        match self {
            ScriptClock::Redis => -1.0,
            ScriptClock::RedisBefore(deadline) => -(deadline.max(2) as f64),
            ScriptClock::Test(now) => now as f64,
        }
    }
}

/// The `EVALSHA` of script `sha` for `op` on `partition` with its `inputs`
/// ([`RedisBackend::script`]), on `clock`.
fn script_command(
    sha: &str,
    prefix: &str,
    partition: &str,
    op: Op,
    inputs: &Inputs,
    clock: ScriptClock,
) -> Cmd {
    let mut cmd = ::redis::cmd("EVALSHA");
    cmd.arg(sha);
    if one_string(partition) {
        // One key; the script finds the stream and channel beside it.
        cmd.arg(1)
            .arg(partition_key(prefix, partition, "s"))
            .arg(inputs.packed(op, clock.packed()));
        return cmd;
    }
    let [e, x, f, w] = ["e", "x", "f", "w"].map(|part| partition_key(prefix, partition, part));
    cmd.arg(3).arg(e).arg(x).arg(f).arg(op.name());
    // '' for Redis's TIME, '-d' for it with the deadline d, or a test
    // clock's time.
    match clock {
        ScriptClock::Redis => cmd.arg(""),
        ScriptClock::RedisBefore(deadline) => cmd.arg(format!("-{}", deadline.max(1))),
        ScriptClock::Test(now) => cmd.arg(now),
    };
    cmd.arg(w);
    inputs.append_to(op, &mut cmd);
    cmd
}

/// Whether `unwatched.lua` keeps `partition`, as one string that every call
/// reads and rewrites whole: an unwatched partition of a few entries (a
/// lock's, a lease's). One that may hold many (a semaphore's,
/// [`may_hold_many`]) is kept by `redis.lua` as a watched partition is (a
/// hash of entries, an index of expiries, a feed), whose calls cost the
/// same at 10 000 entries as at none (BENCHMARKS.md); it is still
/// unwatched to its callers (`changes` is refused). The JavaScript and
/// Python stores decide alike, so hosts of every language meet on one layout.
pub fn one_string(partition: &str) -> bool {
    is_unwatched(partition) && !may_hold_many(partition)
}

/// The Redis key of one part of a partition under `prefix`
/// ([`RedisBackend::key`]).
fn partition_key(prefix: &str, partition: &str, part: &str) -> String {
    let escaped = partition
        .replace('%', "%25")
        .replace('{', "%7B")
        .replace('}', "%7D");
    format!("{prefix}:{{p:{escaped}}}:{part}")
}

/// How the scripts announce a change: `SPUBLISH` on a cluster, where a
/// partition's channel shares its keys' slot and the message goes only to
/// the subscribers of that node, not over the cluster bus to every node;
/// `PUBLISH` on one server (which keeps Redis 6 served).
fn publish_command(config: &RedisConfig) -> &'static str {
    if config.cluster {
        "SPUBLISH"
    } else {
        "PUBLISH"
    }
}

/// SHA-1 of the script, as `EVALSHA` names it.
fn sha1_hex(text: &str) -> String {
    ::redis::Script::new(text).get_hash().to_string()
}
