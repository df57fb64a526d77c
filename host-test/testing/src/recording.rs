//! A backend that records every call it passes on, in order, for tests that
//! assert what was sent (no extend after a release, one read per check).

use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use coord_host::backend::*;

/// One call as [`RecordingBackend`] saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The operation: `get`, `put`, `delete`, `touch`, `wait-then-put`, …
    pub operation: &'static str,
    /// The partition it was about (empty for `now`).
    pub partition: String,
}

/// A backend that records each call, then passes it to another.
pub struct RecordingBackend {
    inner: Arc<dyn Backend>,
    calls: Mutex<Vec<Call>>,
}

impl RecordingBackend {
    /// Record the calls made to `inner`.
    pub fn new(inner: Arc<dyn Backend>) -> Self {
        RecordingBackend {
            inner,
            calls: Mutex::new(Vec::new()),
        }
    }

    /// Every call so far, oldest first.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    fn record(&self, operation: &'static str, partition: &str) {
        if let Ok(mut calls) = self.calls.lock() {
            calls.push(Call {
                operation,
                partition: partition.to_string(),
            });
        }
    }
}

#[async_trait]
impl Backend for RecordingBackend {
    async fn now(&self) -> Result<Millis, StoreError> {
        self.record("now", "");
        self.inner.now().await
    }
    async fn get(&self, partition: &str, key: &str) -> Result<ReadReply, StoreError> {
        self.record("get", partition);
        self.inner.get(partition, key).await
    }
    async fn list(&self, partition: &str, prefix: &str) -> Result<ListReply, StoreError> {
        self.record("list", partition);
        self.inner.list(partition, prefix).await
    }
    async fn put(
        &self,
        partition: &str,
        key: &str,
        value: &[u8],
        ttl_ms: Option<u64>,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        self.record("put", partition);
        self.inner
            .put(partition, key, value, ttl_ms, condition)
            .await
    }
    async fn delete(
        &self,
        partition: &str,
        key: &str,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        self.record("delete", partition);
        self.inner.delete(partition, key, condition).await
    }
    async fn touch(
        &self,
        partition: &str,
        key: &str,
        ttl_ms: u64,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        self.record("touch", partition);
        self.inner.touch(partition, key, ttl_ms, condition).await
    }
    async fn changes(
        &self,
        partition: &str,
        after: u64,
        max: u32,
    ) -> Result<ChangesReply, StoreError> {
        self.record("changes", partition);
        self.inner.changes(partition, after, max).await
    }
    async fn meter(
        &self,
        partition: &str,
        key: &str,
        request: &MeterRequest,
    ) -> Result<MeterReply, StoreError> {
        self.record("meter", partition);
        self.inner.meter(partition, key, request).await
    }
    async fn wait(&self, partition: &str, after: u64, timeout_ms: u64) -> Result<u64, StoreError> {
        self.record("wait", partition);
        self.inner.wait(partition, after, timeout_ms).await
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
        self.record("wait-then-put", partition);
        self.inner
            .wait_then_put(partition, key, value, ttl_ms, condition, after, timeout_ms)
            .await
    }
}
