//! coord's test kit: what every host test suite shares, and what a
//! third-party store backend needs to test itself as coord's are tested.
//!
//! - [`Harness`]: a backend, a clock the test moves, and its waiters; made
//!   by [`memory`], [`redis`], [`redis_cluster`], [`nats`], [`postgres`]
//!   and [`sqlite`], or by
//!   [`Harness::new`] for a backend of your own.
//! - [`per_backend!`]: a suite written once as `async fn name(h: Harness)`,
//!   instantiated for every backend, each test under the [`watchdog`].
//! - [`conformance`]: the store contract (`wit/store.wit`) as functions
//!   over a [`Harness`]; [`conformance_suite!`] runs them all on yours.
//! - [`faulty`], [`recording`]: backends that fail, stall or record calls;
//!   [`stall_proxy`]: a TCP proxy that stalls a real server.
//! - Server spawners ([`RedisServer`], [`RedisCluster`], [`NatsServer`],
//!   [`nats_cluster`]) that start what a test needs when the machine has
//!   none; [`history`] and [`fault_run`]: the checker of a concurrent
//!   history of grants and writes.
//!
//! The integration suites of the host crates are this crate's `tests/all`.

#![allow(clippy::unwrap_used)] // a test kit: a panic is the failure report

use std::sync::Arc;

use coord_host::backend::Backend;
use coord_host::backend::memory::MemoryBackend;
use coord_host::clock::ManualClock;
use coord_nats::{NatsBackend, NatsConfig};
use coord_postgres::{PostgresBackend, PostgresConfig};
use coord_redis::{RedisBackend, RedisConfig};
use coord_sqlite::{SqliteBackend, SqliteConfig};

pub mod conformance;
pub mod fault_run;
pub mod faulty;
pub mod history;
pub mod nats_cluster;
mod nats_server;
mod postgres_server;
pub mod recording;
pub mod redis_cluster;
mod redis_server;
pub mod stall_proxy;
pub mod watchdog;
pub use nats_server::{NatsServer, nats_server_binary, nats_url, server_version};
pub use postgres_server::{PrivateServer, Stop, drop_table, postgres_url};
pub use redis_cluster::{RedisCluster, redis_cluster_url};
pub use redis_server::{RedisServer, free_ports, redis_url};
pub use watchdog::{Progress, ProgressBackend, QUIET, watchdog};

/// Where the manual clocks start: an ordinary Unix time in milliseconds.
pub const T0: u64 = 1_750_000_000_000;

/// A backend, a way to move its clock, and a way to see its blocked waiters.
pub struct Harness {
    /// The store under test, counting each successful call in `progress`.
    pub backend: Arc<dyn Backend>,
    /// What the hang detector of [`per_backend!`] watches (see [`watchdog`]).
    progress: Progress,
    clock: Arc<ManualClock>,
    waiters: Box<dyn Fn(&str) -> usize + Send + Sync>,
    /// What the harness deletes when it drops: the test's Redis keys, NATS
    /// stream or PostgreSQL table (tests share the machine's servers;
    /// partitions without a TTL would otherwise stay there).
    cleanup: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(cleanup) = self.cleanup.take() {
            cleanup();
        }
    }
}

/// Delete a test's stream (best effort), on a thread of its own: a drop
/// cannot await, and may run inside the test's runtime.
pub fn delete_stream(url: String, stream: String) {
    let deleting = std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        runtime.block_on(async {
            if let Ok(client) = async_nats::connect(url.as_str()).await {
                let _ = async_nats::jetstream::new(client)
                    .delete_stream(&stream)
                    .await;
            }
        });
    });
    let _ = deleting.join();
}

/// Delete every key under `prefix` (best effort: a test's failure, not its
/// cleanup, is the report that matters). `url` may list a cluster's nodes,
/// comma-separated: each deletes its own keys (a replica's deletes fail).
pub fn delete_prefix(url: &str, prefix: &str) {
    for url in url.split(',') {
        delete_prefix_on(url.trim(), prefix);
    }
}

fn delete_prefix_on(url: &str, prefix: &str) {
    let Ok(mut connection) = redis::Client::open(url).and_then(|c| c.get_connection()) else {
        return;
    };
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query(&mut connection)
        .unwrap_or_default();
    // One key per DEL: on a cluster, keys of different slots cannot share one.
    for key in keys {
        let _: redis::RedisResult<()> = redis::cmd("DEL").arg(key).query(&mut connection);
    }
}

impl Harness {
    /// A harness on a backend of your own: `backend` must take its time
    /// from `clock` (so tests move time instead of sleeping), and `waiters`
    /// tells how many `wait` calls are blocked on a partition right now.
    /// Each successful store call counts as progress for the [`watchdog`].
    pub fn new(
        backend: Arc<dyn Backend>,
        clock: Arc<ManualClock>,
        waiters: impl Fn(&str) -> usize + Send + Sync + 'static,
    ) -> Harness {
        let progress = Progress::new();
        Harness {
            backend: Arc::new(ProgressBackend::new(backend, progress.clone())),
            progress,
            clock,
            waiters: Box::new(waiters),
            cleanup: None,
        }
    }

    /// A runtime (coord.wasm loaded) on this harness's store.
    pub fn runtime(&self) -> Arc<coord_host::Runtime> {
        Arc::new(coord_host::Runtime::new(self.backend.clone()).expect("load the component"))
    }

    /// A fresh runtime on this harness's store and an instance of it.
    pub async fn runtime_and_instance(&self) -> (Arc<coord_host::Runtime>, coord_host::Instance) {
        let runtime = self.runtime();
        let instance = runtime.instantiate().await.expect("instantiate");
        (runtime, instance)
    }

    /// An instance of a fresh runtime on this harness's store.
    pub async fn instance(&self) -> coord_host::Instance {
        self.runtime_and_instance().await.1
    }

    /// Move the store's clock forward.
    pub fn advance(&self, ms: u64) {
        self.clock.advance(ms);
    }

    /// The count of this harness's completed store calls.
    pub fn progress(&self) -> Progress {
        self.progress.clone()
    }

    /// The clock this harness moves.
    pub fn clone_clock(&self) -> Arc<ManualClock> {
        self.clock.clone()
    }

    /// How many waiters are blocked in `wait` on `partition` right now.
    pub fn waiting(&self, partition: &str) -> usize {
        (self.waiters)(partition)
    }

    /// Return once `n` waiters are blocked in `wait` on `partition`.
    pub async fn until_waiting(&self, partition: &str, n: usize) {
        while self.waiting(partition) != n {
            tokio::task::yield_now().await;
        }
    }
}

/// The in-memory backend on a manual clock, keeping `history` changes per partition.
pub fn memory(history: usize) -> Harness {
    let clock = Arc::new(ManualClock::new(T0));
    let backend = Arc::new(MemoryBackend::with_history(clock.clone(), history));
    let progress = Progress::new();
    Harness {
        backend: Arc::new(ProgressBackend::new(backend.clone(), progress.clone())),
        progress,
        clock,
        waiters: Box::new(move |partition| backend.waiters(partition)),
        cleanup: None,
    }
}

/// A Redis configuration for one test: its own key prefix (tests share the
/// server and run in parallel), a short retention, and `clock` if given.
pub fn redis_config(url: &str, history: usize, clock: Option<Arc<ManualClock>>) -> RedisConfig {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    RedisConfig {
        prefix: format!("coordtest-{}-{n}", std::process::id()),
        history,
        retention_ms: 60_000,
        test_clock: clock,
        ..RedisConfig::new(url)
    }
}

/// The Redis backend on a real server (see [`redis_url`]), with its "now"
/// taken from a manual clock so TTL tests move time instead of sleeping.
pub async fn redis(history: usize) -> Harness {
    redis_harness(redis_url().await, history, false).await
}

/// The Redis backend on a three-master cluster (see [`redis_cluster_url`]),
/// with its "now" taken from a manual clock, as [`redis`].
pub async fn redis_cluster(history: usize) -> Harness {
    let url = tokio::task::spawn_blocking(redis_cluster_url)
        .await
        .expect("the cluster starts");
    redis_harness(url, history, true).await
}

/// A harness on the Redis server (or cluster) at `url`, its keys deleted
/// when it drops.
async fn redis_harness(url: String, history: usize, cluster: bool) -> Harness {
    let clock = Arc::new(ManualClock::new(T0));
    let config = RedisConfig {
        cluster,
        ..redis_config(&url, history, Some(clock.clone()))
    };
    let prefix = config.prefix.clone();
    let cleanup: Option<Box<dyn FnOnce() + Send + Sync>> =
        Some(Box::new(move || delete_prefix(&url, &prefix)));
    let backend = Arc::new(
        RedisBackend::connect(config)
            .await
            .expect("connect to Redis"),
    );
    let progress = Progress::new();
    Harness {
        backend: Arc::new(ProgressBackend::new(backend.clone(), progress.clone())),
        progress,
        clock,
        waiters: Box::new(move |partition| backend.waiters(partition)),
        cleanup,
    }
}

/// A NATS configuration for one test: its own stream and subjects (tests
/// share the server and run in parallel), a short retention, and `clock`.
pub fn nats_config(url: &str, history: usize, clock: Option<Arc<ManualClock>>) -> NatsConfig {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let id = format!("{}_{n}", std::process::id());
    NatsConfig {
        stream: format!("COORDTEST_{id}"),
        subject_prefix: format!("coordtest{id}"),
        history,
        retention_ms: 60_000,
        test_clock: clock,
        ..NatsConfig::new(url)
    }
}

/// The NATS backend on a real server (see [`nats_url`]), with its "now"
/// taken from a manual clock so TTL tests move time instead of sleeping.
pub async fn nats(history: usize) -> Harness {
    let url = nats_url();
    let clock = Arc::new(ManualClock::new(T0));
    let config = nats_config(&url, history, Some(clock.clone()));
    let stream = config.stream.clone();
    let cleanup_url = url.clone();
    let cleanup: Option<Box<dyn FnOnce() + Send + Sync>> =
        Some(Box::new(move || delete_stream(cleanup_url, stream)));
    let backend = Arc::new(NatsBackend::connect(config).await.expect("connect to NATS"));
    let progress = Progress::new();
    Harness {
        backend: Arc::new(ProgressBackend::new(backend.clone(), progress.clone())),
        progress,
        clock,
        waiters: Box::new(move |partition| backend.waiters(partition)),
        cleanup,
    }
}

/// A PostgreSQL configuration for one test: its own table (tests share the
/// server and run in parallel), a short retention, and `clock`.
pub fn postgres_config(
    url: &str,
    history: usize,
    clock: Option<Arc<ManualClock>>,
) -> PostgresConfig {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    PostgresConfig {
        table: format!("coordtest_{}_{n}", std::process::id()),
        history,
        retention_ms: 60_000,
        pool_size: 4,
        test_clock: clock,
        ..PostgresConfig::new(url)
    }
}

/// The PostgreSQL backend on a real server (see [`postgres_url`]), with its
/// "now" taken from a manual clock so TTL tests move time instead of
/// sleeping; its table is dropped when the harness drops.
pub async fn postgres(history: usize) -> Harness {
    let url = postgres_url().await;
    let clock = Arc::new(ManualClock::new(T0));
    let config = postgres_config(&url, history, Some(clock.clone()));
    let table = config.table.clone();
    let backend = Arc::new(
        PostgresBackend::connect(config)
            .await
            .expect("connect to PostgreSQL"),
    );
    let progress = Progress::new();
    Harness {
        backend: Arc::new(ProgressBackend::new(backend.clone(), progress.clone())),
        progress,
        clock,
        waiters: Box::new(move |partition| backend.waiters(partition)),
        cleanup: Some(Box::new(move || drop_table(url, table))),
    }
}

/// A fresh SQLite file for one test, in the system's temporary directory.
pub fn sqlite_path() -> std::path::PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("coordtest-{}-{n}.sqlite", std::process::id()))
}

/// Delete a SQLite database and its WAL files (best effort).
pub fn delete_sqlite(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
}

/// The SQLite backend on a file of its own (WAL mode, as processes share
/// it), with its "now" taken from a manual clock; the file is deleted when
/// the harness drops.
pub async fn sqlite(history: usize) -> Harness {
    let clock = Arc::new(ManualClock::new(T0));
    let path = sqlite_path();
    let config = SqliteConfig {
        history,
        retention_ms: 60_000,
        test_clock: Some(clock.clone()),
        ..SqliteConfig::new(Some(path.clone()))
    };
    let backend = Arc::new(SqliteBackend::open(config).await.expect("open SQLite"));
    let progress = Progress::new();
    Harness {
        backend: Arc::new(ProgressBackend::new(backend.clone(), progress.clone())),
        progress,
        clock,
        waiters: Box::new(move |partition| backend.waiters(partition)),
        cleanup: Some(Box::new(move || delete_sqlite(&path))),
    }
}

/// Fail, rather than hang, if `f`, taken as one step, does not finish for
/// [`QUIET`]: a hang detector for a single call or a short test with no
/// harness to count its steps, never a speed target. Tests never wait for
/// time to pass: this only guards against a deadlock.
pub async fn bounded<T>(f: impl std::future::Future<Output = T>) -> T {
    watchdog(&Progress::new(), QUIET, f).await
}

/// Run `test` on `harness` under the [`watchdog`] of the harness's store
/// calls.
pub async fn watched<F: std::future::Future<Output = ()>>(
    harness: Harness,
    test: impl FnOnce(Harness) -> F,
) {
    let progress = harness.progress();
    watchdog(&progress, QUIET, test(harness)).await
}

/// Let spawned tasks run until they block; no time passes on the store's clock.
pub async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// Instantiate each `async fn(Harness)` listed as a test per backend, each
/// under the [`watchdog`]: it fails if no store call of the harness
/// completes for [`QUIET`], not if the whole run is slow (the 64-instance
/// runs took 2.3-3.1 s on Redis alone and over 30 s on a loaded machine).
#[macro_export]
macro_rules! per_backend {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let harness = $crate::memory(super::HISTORY);
                    $crate::watched(harness, super::$name).await
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let harness = $crate::redis(super::HISTORY).await;
                    $crate::watched(harness, super::$name).await
                }
            )*
        }
        mod redis_cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let harness = $crate::redis_cluster(super::HISTORY).await;
                    $crate::watched(harness, super::$name).await
                }
            )*
        }
        mod nats {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let harness = $crate::nats(super::HISTORY).await;
                    $crate::watched(harness, super::$name).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let harness = $crate::postgres(super::HISTORY).await;
                    $crate::watched(harness, super::$name).await
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let harness = $crate::sqlite(super::HISTORY).await;
                    $crate::watched(harness, super::$name).await
                }
            )*
        }
    };
}

/// An instance of a fresh runtime on `backend` (for a store a test wraps or
/// starts itself, outside a [`Harness`]).
pub async fn instance_on(backend: Arc<dyn Backend>) -> coord_host::Instance {
    coord_host::Runtime::new(backend)
        .expect("load the component")
        .instantiate()
        .await
        .expect("instantiate")
}

/// No-wait acquire options with a TTL of `ttl_ms`.
pub fn no_wait(ttl_ms: u64) -> coord_host::lock::AcquireOptions {
    coord_host::lock::AcquireOptions::new()
        .ttl_ms(ttl_ms)
        .no_wait()
}

/// The entry a write applied; a conflict fails the test.
pub fn applied(reply: coord_host::backend::WriteReply) -> coord_host::backend::Entry {
    match reply.outcome {
        coord_host::backend::Outcome::Applied(entry) => entry,
        coord_host::backend::Outcome::Conflict(current) => {
            panic!("expected applied, got conflict {current:?}")
        }
    }
}

/// A deterministic pseudo-random sequence, so that a failing run of a test
/// that draws TTLs, modes or pauses repeats exactly.
pub struct Lcg(pub u64);

impl Lcg {
    /// The next number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Moves the store's clock in small random steps (below `max_step`
/// milliseconds) until told to stop, so holders expire while they work
/// and waits on store time end.
pub fn clock_mover(
    h: &Harness,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    max_step: u64,
) -> tokio::task::JoinHandle<()> {
    let clock = h.clone_clock();
    tokio::spawn(async move {
        let mut rng = Lcg(99);
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            clock.advance(rng.below(max_step));
            for _ in 0..5 {
                tokio::task::yield_now().await;
            }
        }
    })
}
