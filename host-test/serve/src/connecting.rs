//! A store that is not reachable yet: `coord serve` listens at once and
//! keeps trying its store, rather than exit because the store starts after
//! it (a compose file or an init system starts both at once; a JetStream
//! cluster has no meta leader for its first seconds).
//!
//! Until [`Connecting::connected`] is given the real backend, every call is
//! `unavailable`, saying why the last attempt failed, so `/readyz` answers
//! 503 with the reason and a function's store calls fail cleanly (never
//! busy, never acquired). Afterwards every call goes to the real backend.

use std::sync::{Arc, Mutex, OnceLock};

use async_trait::async_trait;
use coord_host::backend::{
    Backend, ChangesReply, Condition, ListReply, MeterReply, MeterRequest, Millis, ReadReply,
    StoreError, WriteReply,
};

/// A backend that answers `unavailable` until it is connected.
pub struct Connecting {
    kind: &'static str,
    store: OnceLock<Arc<dyn Backend>>,
    /// Why the last attempt to reach the store failed.
    last_failure: Mutex<String>,
}

impl Connecting {
    /// A store of `kind` (`redis`, `nats`, ...) not reached yet.
    pub fn new(kind: &'static str) -> Connecting {
        Connecting {
            kind,
            store: OnceLock::new(),
            last_failure: Mutex::new("no attempt has ended yet".into()),
        }
    }

    /// The store is reached: every call goes to `store` from now on.
    pub fn connected(&self, store: Arc<dyn Backend>) {
        let _ = self.store.set(store);
    }

    /// An attempt to reach the store failed: `why`.
    pub fn failed(&self, why: String) {
        if let Ok(mut last) = self.last_failure.lock() {
            *last = why;
        }
    }

    /// Why the last attempt to reach the store failed.
    pub fn last_failure(&self) -> String {
        self.last_failure
            .lock()
            .map(|w| w.clone())
            .unwrap_or_default()
    }

    /// Whether the store was reached.
    pub fn is_connected(&self) -> bool {
        self.store.get().is_some()
    }

    /// The real store, or `unavailable` with the reason.
    fn store(&self) -> Result<&Arc<dyn Backend>, StoreError> {
        self.store.get().ok_or_else(|| {
            StoreError::Unavailable(format!(
                "the store is not reached yet: {}",
                self.last_failure()
            ))
        })
    }
}

#[async_trait]
impl Backend for Connecting {
    fn kind(&self) -> &'static str {
        self.kind
    }
    async fn now(&self) -> Result<Millis, StoreError> {
        self.store()?.now().await
    }
    async fn ready(&self) -> Result<(), StoreError> {
        self.store()?.ready().await
    }
    fn warnings(&self) -> Vec<String> {
        self.store.get().map(|s| s.warnings()).unwrap_or_default()
    }
    async fn get(&self, partition: &str, key: &str) -> Result<ReadReply, StoreError> {
        self.store()?.get(partition, key).await
    }
    async fn list(&self, partition: &str, prefix: &str) -> Result<ListReply, StoreError> {
        self.store()?.list(partition, prefix).await
    }
    async fn put(
        &self,
        partition: &str,
        key: &str,
        value: &[u8],
        ttl_ms: Option<u64>,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        self.store()?
            .put(partition, key, value, ttl_ms, condition)
            .await
    }
    async fn delete(
        &self,
        partition: &str,
        key: &str,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        self.store()?.delete(partition, key, condition).await
    }
    async fn touch(
        &self,
        partition: &str,
        key: &str,
        ttl_ms: u64,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        self.store()?.touch(partition, key, ttl_ms, condition).await
    }
    async fn changes(
        &self,
        partition: &str,
        after: u64,
        max: u32,
    ) -> Result<ChangesReply, StoreError> {
        self.store()?.changes(partition, after, max).await
    }
    async fn meter(
        &self,
        partition: &str,
        key: &str,
        request: &MeterRequest,
    ) -> Result<MeterReply, StoreError> {
        self.store()?.meter(partition, key, request).await
    }
    async fn wait(&self, partition: &str, after: u64, timeout_ms: u64) -> Result<u64, StoreError> {
        self.store()?.wait(partition, after, timeout_ms).await
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
        self.store()?
            .wait_then_put(partition, key, value, ttl_ms, condition, after, timeout_ms)
            .await
    }
}
