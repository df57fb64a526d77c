//! The tests' hang detector: a watchdog that fails a test when it has made
//! no progress for a while, not when it is slow.
//!
//! A wall-clock bound on a whole test fires on a loaded machine: the Redis
//! fenced-writes run takes 2.3-3.1 s alone and failed its 30 s bound with
//! the load average at 10 on two cores. A [`Progress`] counts completed
//! steps (each successful call to a harness's store, see
//! [`ProgressBackend`]); [`watchdog`] fails only if the count stays still
//! for [`QUIET`], however long the whole run takes.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use coord_host::backend::{
    Backend, ChangesReply, Condition, ListReply, MeterReply, MeterRequest, Millis, ReadReply,
    StoreError, WriteReply,
};

/// How long a test may go without progress before it is called stuck:
/// generous, since a store call that waits (a lock's `wait`, a blocked
/// Redis read) may take seconds on a loaded machine and is no hang.
pub const QUIET: Duration = Duration::from_secs(60);

/// A count of completed steps, shared by whatever does the work and the
/// [`watchdog`] that watches it.
#[derive(Clone, Debug, Default)]
pub struct Progress(Arc<AtomicU64>);

impl Progress {
    /// A count at zero.
    pub fn new() -> Self {
        Progress::default()
    }

    /// One more step completed.
    pub fn bump(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// How many steps have completed.
    pub fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Run `f` to its end, or panic once `progress` has not moved for `quiet`
/// (tokio's clock, so a test with paused time checks this without waiting).
/// A `progress` nothing bumps makes this a bound of `quiet` on `f` as one
/// step.
pub async fn watchdog<T>(progress: &Progress, quiet: Duration, f: impl Future<Output = T>) -> T {
    let mut f = std::pin::pin!(f);
    // Checked eight times per quiet period: it fires between `quiet` and
    // `quiet` + 1/8 after the last step.
    let tick = quiet / 8;
    let mut last = progress.count();
    let mut since = tokio::time::Instant::now();
    loop {
        if let Ok(done) = tokio::time::timeout(tick, &mut f).await {
            return done;
        }
        let now = progress.count();
        if now != last {
            last = now;
            since = tokio::time::Instant::now();
        } else if since.elapsed() >= quiet {
            panic!("no progress for {quiet:?} ({last} steps completed before): something is stuck");
        }
    }
}

/// A store that bumps a [`Progress`] for each call that succeeds, and
/// passes every call to `inner` unchanged. A `wait` that timed out is no
/// step (a waiter nobody wakes must not look like progress), and neither is
/// an error (a retry loop against a store that is down is none either).
pub struct ProgressBackend {
    inner: Arc<dyn Backend>,
    progress: Progress,
}

impl ProgressBackend {
    /// Count the successful calls to `inner` in `progress`.
    pub fn new(inner: Arc<dyn Backend>, progress: Progress) -> Self {
        ProgressBackend { inner, progress }
    }

    fn step<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if result.is_ok() {
            self.progress.bump();
        }
        result
    }
}

#[async_trait]
impl Backend for ProgressBackend {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    async fn now(&self) -> Result<Millis, StoreError> {
        self.step(self.inner.now().await)
    }
    async fn get(&self, partition: &str, key: &str) -> Result<ReadReply, StoreError> {
        self.step(self.inner.get(partition, key).await)
    }
    async fn list(&self, partition: &str, prefix: &str) -> Result<ListReply, StoreError> {
        self.step(self.inner.list(partition, prefix).await)
    }
    async fn put(
        &self,
        partition: &str,
        key: &str,
        value: &[u8],
        ttl_ms: Option<u64>,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        let result = self
            .inner
            .put(partition, key, value, ttl_ms, condition)
            .await;
        self.step(result)
    }
    async fn delete(
        &self,
        partition: &str,
        key: &str,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        self.step(self.inner.delete(partition, key, condition).await)
    }
    async fn touch(
        &self,
        partition: &str,
        key: &str,
        ttl_ms: u64,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        self.step(self.inner.touch(partition, key, ttl_ms, condition).await)
    }
    async fn changes(
        &self,
        partition: &str,
        after: u64,
        max: u32,
    ) -> Result<ChangesReply, StoreError> {
        self.step(self.inner.changes(partition, after, max).await)
    }
    async fn meter(
        &self,
        partition: &str,
        key: &str,
        request: &MeterRequest,
    ) -> Result<MeterReply, StoreError> {
        self.step(self.inner.meter(partition, key, request).await)
    }
    async fn wait(&self, partition: &str, after: u64, timeout_ms: u64) -> Result<u64, StoreError> {
        let result = self.inner.wait(partition, after, timeout_ms).await;
        if matches!(result, Ok(revision) if revision > after) {
            self.progress.bump();
        }
        result
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
        let result = self
            .inner
            .wait_then_put(partition, key, value, ttl_ms, condition, after, timeout_ms)
            .await;
        self.step(result)
    }
}
