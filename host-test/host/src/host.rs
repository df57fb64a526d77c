//! The component's imports, implemented once on top of [`Backend`].
//!
//! Each `coord:sync/store` call is counted (per instance, for tests and
//! benchmarks that assert store calls per operation), converted from the
//! wasmtime-generated types to the component crate's store types, and
//! handed to the backend.

use std::sync::Arc;

use crate::backend::{self as b, Backend};
use crate::bindings::coord::sync::store as wit;
use crate::bindings::wasi::random::random;
use crate::holdings::{self, Holdings, Sending};

/// What each component instance's wasmtime `Store` holds.
pub struct HostState {
    backend: Arc<dyn Backend>,
    store_calls: u64,
    /// The locks and leases this instance's writes took, when kept.
    holdings: Option<Holdings>,
}

impl HostState {
    /// State for one instance over `backend`.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        HostState {
            backend,
            store_calls: 0,
            holdings: None,
        }
    }

    /// State for one instance over `backend` that keeps a ledger of the
    /// locks and leases it takes, for a runtime that may cut it short and
    /// must then give them back ([`HostState::take_holdings`]).
    pub fn keeping_holdings(backend: Arc<dyn Backend>) -> Self {
        HostState {
            holdings: Some(Holdings::default()),
            ..HostState::new(backend)
        }
    }

    /// The ledger of what this instance holds, if it keeps one.
    pub fn take_holdings(&mut self) -> Option<Holdings> {
        self.holdings.take()
    }

    /// The backend this instance's store calls go to.
    pub fn store(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    fn sending(
        &mut self,
        partition: &str,
        key: &str,
        value: &[u8],
        condition: &b::Condition,
        ttl_ms: Option<u64>,
    ) -> Option<Sending> {
        self.holdings
            .as_mut()
            .map(|h| h.sending(partition, key, value, condition, ttl_ms))
    }

    /// A lock acquire that failed as `unavailable` may land later: look
    /// for it in the background and take it back
    /// ([`holdings::take_back_in_background`]).
    fn failed_put(
        &self,
        reply: &Result<b::WriteReply, b::StoreError>,
        partition: &str,
        key: &str,
        value: &[u8],
        condition: &b::Condition,
        ttl_ms: Option<u64>,
    ) {
        if matches!(reply, Err(b::StoreError::Unavailable(_))) {
            holdings::take_back_in_background(
                self.backend.clone(),
                partition,
                key,
                value,
                condition,
                ttl_ms,
            );
        }
    }

    fn sent(
        &mut self,
        sending: Option<Sending>,
        partition: &str,
        key: &str,
        reply: &Result<b::WriteReply, b::StoreError>,
    ) {
        if let (Some(holdings), Some(sending)) = (self.holdings.as_mut(), sending) {
            holdings.sent(sending, partition, key, reply);
        }
    }

    /// How many `coord:sync/store` calls this instance has made.
    pub fn store_calls(&self) -> u64 {
        self.store_calls
    }

    fn backend(&mut self) -> Arc<dyn Backend> {
        self.store_calls += 1;
        self.backend.clone()
    }
}

impl wit::Host for HostState {
    async fn now(&mut self) -> Result<wit::Millis, wit::Error> {
        Ok(self.backend().now().await?)
    }

    async fn get(&mut self, partition: String, key: String) -> Result<wit::ReadReply, wit::Error> {
        Ok(self.backend().get(&partition, &key).await?.into())
    }

    async fn list(
        &mut self,
        partition: String,
        prefix: String,
    ) -> Result<wit::ListReply, wit::Error> {
        Ok(self.backend().list(&partition, &prefix).await?.into())
    }

    async fn put(
        &mut self,
        partition: String,
        key: String,
        value: Vec<u8>,
        ttl_ms: Option<u64>,
        condition: wit::Condition,
    ) -> Result<wit::WriteReply, wit::Error> {
        let condition = condition.into();
        let sending = self.sending(&partition, &key, &value, &condition, ttl_ms);
        let reply = self
            .backend()
            .put(&partition, &key, &value, ttl_ms, &condition)
            .await;
        self.sent(sending, &partition, &key, &reply);
        self.failed_put(&reply, &partition, &key, &value, &condition, ttl_ms);
        Ok(reply?.into())
    }

    async fn delete(
        &mut self,
        partition: String,
        key: String,
        condition: wit::Condition,
    ) -> Result<wit::WriteReply, wit::Error> {
        let condition = condition.into();
        let reply = self.backend().delete(&partition, &key, &condition).await;
        if let Some(holdings) = self.holdings.as_mut() {
            holdings.deleted(&partition, &key, &reply);
        }
        if matches!(reply, Err(b::StoreError::Unavailable(_))) {
            // A release guarded by its holder's revision and value can only
            // ever remove that holder: finish it once the store answers,
            // rather than leave the lock held for the rest of its TTL.
            holdings::finish_in_background(self.backend.clone(), &partition, &key, condition);
        }
        Ok(reply?.into())
    }

    async fn touch(
        &mut self,
        partition: String,
        key: String,
        ttl_ms: u64,
        condition: wit::Condition,
    ) -> Result<wit::WriteReply, wit::Error> {
        let condition = condition.into();
        Ok(self
            .backend()
            .touch(&partition, &key, ttl_ms, &condition)
            .await?
            .into())
    }

    async fn changes(
        &mut self,
        partition: String,
        after: u64,
        max: u32,
    ) -> Result<wit::ChangesReply, wit::Error> {
        Ok(self.backend().changes(&partition, after, max).await?.into())
    }

    async fn meter(
        &mut self,
        partition: String,
        key: String,
        request: wit::MeterRequest,
    ) -> Result<wit::MeterReply, wit::Error> {
        let request = b::MeterRequest {
            algorithm: match request.algorithm {
                wit::MeterAlgorithm::SlidingWindow => b::MeterAlgorithm::SlidingWindow,
                wit::MeterAlgorithm::FixedWindow => b::MeterAlgorithm::FixedWindow,
                wit::MeterAlgorithm::Gcra => b::MeterAlgorithm::Gcra,
            },
            limit: request.limit,
            window_ms: request.window_ms,
            cost: request.cost,
            mode: match request.mode {
                wit::MeterMode::Consume => b::MeterMode::Consume,
                wit::MeterMode::Peek => b::MeterMode::Peek,
                wit::MeterMode::Reset => b::MeterMode::Reset,
                wit::MeterMode::Charge => b::MeterMode::Charge,
                wit::MeterMode::Refund(at) => b::MeterMode::Refund(at),
            },
        };
        let r = self.backend().meter(&partition, &key, &request).await?;
        Ok(wit::MeterReply {
            allowed: r.allowed,
            remaining: r.remaining,
            reset_in_ms: r.reset_in_ms,
            retry_after_ms: r.retry_after_ms,
            now: r.now,
        })
    }

    async fn wait(
        &mut self,
        partition: String,
        after: u64,
        timeout_ms: u64,
    ) -> Result<u64, wit::Error> {
        Ok(self.backend().wait(&partition, after, timeout_ms).await?)
    }

    async fn wait_then_put(
        &mut self,
        partition: String,
        key: String,
        value: Vec<u8>,
        ttl_ms: Option<u64>,
        condition: wit::Condition,
        after: u64,
        timeout_ms: u64,
    ) -> Result<wit::WriteReply, wit::Error> {
        let condition = condition.into();
        let sending = self.sending(&partition, &key, &value, &condition, ttl_ms);
        let reply = self
            .backend()
            .wait_then_put(
                &partition, &key, &value, ttl_ms, &condition, after, timeout_ms,
            )
            .await;
        self.sent(sending, &partition, &key, &reply);
        self.failed_put(&reply, &partition, &key, &value, &condition, ttl_ms);
        Ok(reply?.into())
    }
}

impl random::Host for HostState {
    async fn get_random_bytes(&mut self, len: u64) -> Vec<u8> {
        // Owner tokens ask for 16; cap what a caller can make the host allocate.
        let mut bytes = vec![0u8; usize::try_from(len.min(1 << 16)).unwrap_or(0)];
        fill_random(&mut bytes);
        bytes
    }

    async fn get_random_u64(&mut self) -> u64 {
        let mut bytes = [0u8; 8];
        fill_random(&mut bytes);
        u64::from_le_bytes(bytes)
    }
}

/// Fill `bytes` from this thread's CSPRNG: ChaCha12, seeded from the
/// operating system and reseeded after every 64 KiB it gives, as `wasi:random`
/// allows ("cryptographically-secure random or pseudo-random bytes"). A
/// `getrandom` system call per owner token cost about a tenth of an in-memory
/// acquire (`perf`, BENCHMARKS.md).
fn fill_random(bytes: &mut [u8]) {
    use rand::Rng;
    rand::rng().fill_bytes(bytes);
}

// Conversions between the two generated type families: wasmtime's (host side)
// and wit-bindgen's (the component crate, which backends speak).

impl From<b::StoreError> for wit::Error {
    fn from(e: b::StoreError) -> Self {
        match e {
            b::StoreError::Unavailable(why) => wit::Error::Unavailable(why),
            b::StoreError::HistoryGone(rev) => wit::Error::HistoryGone(rev),
            b::StoreError::Invalid(why) => wit::Error::Invalid(why),
        }
    }
}

impl From<wit::Condition> for b::Condition {
    fn from(c: wit::Condition) -> Self {
        match c {
            wit::Condition::Always => b::Condition::Always,
            wit::Condition::Absent => b::Condition::Absent,
            wit::Condition::Revision(rev) => b::Condition::Revision(rev),
            wit::Condition::RevisionAndValue(g) => b::Condition::RevisionAndValue(b::Guard {
                revision: g.revision,
                value: g.value,
            }),
            wit::Condition::AbsentAndFewerThan(limit) => b::Condition::AbsentAndFewerThan(limit),
        }
    }
}

impl From<b::Entry> for wit::Entry {
    fn from(e: b::Entry) -> Self {
        wit::Entry {
            key: e.key,
            value: e.value,
            revision: e.revision,
            updated_at: e.updated_at,
            expires_at: e.expires_at,
        }
    }
}

impl From<b::WriteReply> for wit::WriteReply {
    fn from(r: b::WriteReply) -> Self {
        let outcome = match r.outcome {
            b::Outcome::Applied(e) => wit::Outcome::Applied(e.into()),
            b::Outcome::Conflict(e) => wit::Outcome::Conflict(e.map(Into::into)),
        };
        wit::WriteReply {
            outcome,
            now: r.now,
            revision: r.revision,
        }
    }
}

impl From<b::ReadReply> for wit::ReadReply {
    fn from(r: b::ReadReply) -> Self {
        wit::ReadReply {
            entry: r.entry.map(Into::into),
            now: r.now,
        }
    }
}

impl From<b::ListReply> for wit::ListReply {
    fn from(r: b::ListReply) -> Self {
        wit::ListReply {
            entries: r.entries.into_iter().map(Into::into).collect(),
            revision: r.revision,
            now: r.now,
        }
    }
}

impl From<b::ChangesReply> for wit::ChangesReply {
    fn from(r: b::ChangesReply) -> Self {
        let changes = r
            .changes
            .into_iter()
            .map(|c| wit::Change {
                kind: match c.kind {
                    b::ChangeKind::Put => wit::ChangeKind::Put,
                    b::ChangeKind::Delete => wit::ChangeKind::Delete,
                    b::ChangeKind::Expire => wit::ChangeKind::Expire,
                },
                key: c.key,
                value: c.value,
                revision: c.revision,
                at: c.at,
            })
            .collect();
        wit::ChangesReply {
            changes,
            revision: r.revision,
            now: r.now,
        }
    }
}
