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
use coord_host::clock::ManualClock;

/// Where the manual clocks start: an ordinary Unix time in milliseconds.
pub const T0: u64 = 1_750_000_000_000;

/// A backend, a way to move its clock, and a way to see its blocked waiters.
pub struct Harness {
    /// The store under test.
    pub backend: Arc<dyn Backend>,
    clock: Arc<ManualClock>,
    waiters: Box<dyn Fn(&str) -> usize + Send + Sync>,
}

impl Harness {
    /// Move the store's clock forward.
    pub fn advance(&self, ms: u64) {
        self.clock.advance(ms);
    }

    /// Return once `n` waiters are blocked in `wait` on `partition`.
    pub async fn until_waiting(&self, partition: &str, n: usize) {
        while (self.waiters)(partition) != n {
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
    };
}
