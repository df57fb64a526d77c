//! What every host test suite shares: the backends a suite runs against,
//! each with a clock the test can move.
//!
//! A suite is written once as `async fn name(h: Harness)` and instantiated
//! for every backend by [`per_backend!`].
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use coord_host::backend::Backend;
use coord_host::backend::memory::MemoryBackend;
use coord_host::backend::redis::{RedisBackend, RedisConfig};
use coord_host::clock::ManualClock;

pub mod history;
mod redis_server;
pub mod serve;
pub mod stall_proxy;
#[allow(unused_imports)] // not every suite starts a private server
pub use redis_server::{RedisServer, redis_url};

/// Where the manual clocks start: an ordinary Unix time in milliseconds.
pub const T0: u64 = 1_750_000_000_000;

/// A backend, a way to move its clock, and a way to see its blocked waiters.
pub struct Harness {
    /// The store under test.
    pub backend: Arc<dyn Backend>,
    clock: Arc<ManualClock>,
    waiters: Box<dyn Fn(&str) -> usize + Send + Sync>,
    /// The Redis URL and key prefix whose keys are deleted when the harness
    /// drops (tests share the machine's Redis; partitions without a TTL
    /// would otherwise stay there).
    cleanup: Option<(String, String)>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some((url, prefix)) = self.cleanup.take() {
            delete_prefix(&url, &prefix);
        }
    }
}

/// Delete every key under `prefix` (best effort: a test's failure, not its
/// cleanup, is the report that matters).
pub fn delete_prefix(url: &str, prefix: &str) {
    let Ok(mut connection) = redis::Client::open(url).and_then(|c| c.get_connection()) else {
        return;
    };
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query(&mut connection)
        .unwrap_or_default();
    for chunk in keys.chunks(500) {
        let _: redis::RedisResult<()> = redis::cmd("DEL").arg(chunk).query(&mut connection);
    }
}

impl Harness {
    /// Move the store's clock forward.
    pub fn advance(&self, ms: u64) {
        self.clock.advance(ms);
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
    Harness {
        backend: backend.clone(),
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
    let url = redis_url().await;
    let clock = Arc::new(ManualClock::new(T0));
    let config = redis_config(&url, history, Some(clock.clone()));
    let cleanup = Some((url.clone(), config.prefix.clone()));
    let backend = Arc::new(
        RedisBackend::connect(config)
            .await
            .expect("connect to Redis"),
    );
    Harness {
        backend: backend.clone(),
        clock,
        waiters: Box::new(move |partition| backend.waiters(partition)),
        cleanup,
    }
}

/// Fail, rather than hang, if `f` does not finish within ten real seconds.
/// Tests never wait for time to pass: this only guards against a deadlock.
pub async fn bounded<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .expect("the test did not finish in 10 s: something is stuck")
}

/// Let spawned tasks run until they block; no time passes on the store's clock.
pub async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// Instantiate each `async fn(Harness)` listed as a test per backend.
#[macro_export]
macro_rules! per_backend {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    $crate::common::bounded(super::$name($crate::common::memory(super::HISTORY))).await
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let harness = $crate::common::redis(super::HISTORY).await;
                    $crate::common::bounded(super::$name(harness)).await
                }
            )*
        }
    };
}
