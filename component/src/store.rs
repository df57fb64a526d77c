//! The store the coordination logic runs over.
//!
//! [`Store`] mirrors the imported WIT interface `coord:sync/store` function for
//! function, with the generated types, so the component's binding is a direct
//! call and a native fake can stand in for it in unit tests. The guarantees
//! each function must keep are stated in `wit/store.wit`.

pub use crate::bindings::coord::sync::store::{
    Change, ChangeKind, ChangesReply, Condition, Entry, Error as StoreError, Guard, ListReply,
    MeterAlgorithm, MeterMode, MeterReply, MeterRequest, Outcome, ReadReply, WriteReply,
};

/// Milliseconds on the store's clock.
pub type Millis = u64;

/// A revisioned key-value store with TTLs, partitioned; see `wit/store.wit`.
pub trait Store {
    /// The store's clock.
    fn now(&self) -> Result<Millis, StoreError>;
    /// Read one key.
    fn get(&self, partition: &str, key: &str) -> Result<ReadReply, StoreError>;
    /// List the live entries whose keys start with `prefix`, with the partition revision.
    fn list(&self, partition: &str, prefix: &str) -> Result<ListReply, StoreError>;
    /// Write if `condition` holds.
    fn put(
        &self,
        partition: &str,
        key: &str,
        value: &[u8],
        ttl_ms: Option<u64>,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError>;
    /// Remove if `condition` holds.
    fn delete(
        &self,
        partition: &str,
        key: &str,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError>;
    /// Renew a live entry's TTL if `condition` holds.
    fn touch(
        &self,
        partition: &str,
        key: &str,
        ttl_ms: u64,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError>;
    /// Read the change feed after a revision.
    fn changes(&self, partition: &str, after: u64, max: u32) -> Result<ChangesReply, StoreError>;
    /// Run a rate-limit meter on a key, atomically.
    fn meter(
        &self,
        partition: &str,
        key: &str,
        request: &MeterRequest,
    ) -> Result<MeterReply, StoreError>;
    /// Block until the partition changes after `after`, or the timeout passes.
    fn wait(&self, partition: &str, after: u64, timeout_ms: u64) -> Result<u64, StoreError>;
    /// Block as [`Store::wait`] does, then put as [`Store::put`] does: one
    /// request where the store can make it one. By default, the two calls.
    #[allow(clippy::too_many_arguments)] // the WIT function's parameters, one for one
    fn wait_then_put(
        &self,
        partition: &str,
        key: &str,
        value: &[u8],
        ttl_ms: Option<u64>,
        condition: &Condition,
        after: u64,
        timeout_ms: u64,
    ) -> Result<WriteReply, StoreError> {
        self.wait(partition, after, timeout_ms)?;
        self.put(partition, key, value, ttl_ms, condition)
    }
}

/// A source of unguessable bytes, for owner tokens.
pub trait Entropy {
    /// Sixteen bytes from a cryptographic random source.
    fn random_16(&self) -> [u8; 16];
}
