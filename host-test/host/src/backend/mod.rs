//! The seam between the component's `coord:sync/store` import and the
//! places data actually lives.
//!
//! [`Backend`] is the one trait every store backend implements; the WIT
//! `Host` traits are implemented once, on top of it, in `crate::host`.
//! It speaks the component crate's store types, so a backend can be driven
//! directly (natively, with no wasm in between) by tests and benchmarks.
//! The guarantees every method must keep are in `wit/store.wit`; the
//! conformance suite in `tests/all/conformance/` checks them for each backend.
//!
//! A store that keeps each partition as the in-memory state machine (memory,
//! SQLite, PostgreSQL, NATS) implements [`partitioned::PartitionStore`]
//! instead: one step that applies a call to one partition, its clock and its
//! wait; [`partitioned`] makes it a [`Backend`]. Redis runs its own scripts
//! and implements [`Backend`] itself.

pub mod memory;
pub mod partitioned;
pub mod rows;
pub mod turns;

use async_trait::async_trait;
pub use coord_component::store::{
    Change, ChangeKind, ChangesReply, Condition, Entry, Guard, ListReply, MeterAlgorithm,
    MeterMode, MeterReply, MeterRequest, Millis, Outcome, ReadReply, StoreError, WriteReply,
};

/// The answer of `changes` on an unwatched partition (a name beginning with
/// `~`, see `wit/store.wit`), which no backend keeps a feed for.
pub fn no_feed(partition: &str) -> StoreError {
    StoreError::Invalid(format!(
        "partition: {partition:?} is unwatched (its name begins with '~'), so no change feed is kept for it"
    ))
}

/// How long a partition that went quiet is kept by default, in ms (ten
/// minutes): the time a watcher can resume from an old revision after the
/// partition's last entry was deleted or expired. Both backends use it.
pub const DEFAULT_RETENTION_MS: u64 = 600_000;

/// A revisioned, partitioned key-value store with TTLs (`coord:sync/store`).
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// What kind of store this is (`memory`, `redis`), for metrics and logs.
    fn kind(&self) -> &'static str {
        "custom"
    }
    /// The store's clock, in milliseconds.
    async fn now(&self) -> Result<Millis, StoreError>;
    /// Whether the store can take a write now (`/readyz`), not only tell the
    /// time: a replicated store without a leader answers `unavailable`. By
    /// default, whether it answers [`Backend::now`].
    async fn ready(&self) -> Result<(), StoreError> {
        self.now().await.map(|_| ())
    }
    /// What is wrong with the store's configuration now, though it works:
    /// each a sentence for the operator (`/readyz` lists them, the metrics
    /// count them). A NATS stream with fewer replicas than its processes
    /// rely on, say. None by default.
    fn warnings(&self) -> Vec<String> {
        Vec::new()
    }
    /// Read one key.
    async fn get(&self, partition: &str, key: &str) -> Result<ReadReply, StoreError>;
    /// List live entries by key prefix, with the partition's revision.
    async fn list(&self, partition: &str, prefix: &str) -> Result<ListReply, StoreError>;
    /// Write if `condition` holds.
    async fn put(
        &self,
        partition: &str,
        key: &str,
        value: &[u8],
        ttl_ms: Option<u64>,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError>;
    /// Remove if `condition` holds.
    async fn delete(
        &self,
        partition: &str,
        key: &str,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError>;
    /// Renew a live entry's TTL if `condition` holds.
    async fn touch(
        &self,
        partition: &str,
        key: &str,
        ttl_ms: u64,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError>;
    /// Read the change feed after a revision.
    async fn changes(
        &self,
        partition: &str,
        after: u64,
        max: u32,
    ) -> Result<ChangesReply, StoreError>;
    /// Run a rate-limit meter on a key, atomically, on the store's clock.
    async fn meter(
        &self,
        partition: &str,
        key: &str,
        request: &MeterRequest,
    ) -> Result<MeterReply, StoreError>;
    /// Block until the partition's revision exceeds `after` or the timeout passes.
    async fn wait(&self, partition: &str, after: u64, timeout_ms: u64) -> Result<u64, StoreError>;
    /// Block as [`Backend::wait`] does, then put as [`Backend::put`] does.
    /// By default the two calls, one after the other; a backend on a remote
    /// server sends the put with the wait (see `wit/store.wit`).
    #[allow(clippy::too_many_arguments)] // the WIT function's parameters, one for one
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
        self.wait(partition, after, timeout_ms).await?;
        self.put(partition, key, value, ttl_ms, condition).await
    }
}
