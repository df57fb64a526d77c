//! A backend that fails on purpose, for fault tests.
//!
//! [`FaultyBackend`] wraps another backend and makes a chosen share of its
//! calls fail as `unavailable`, half of them *before* the inner call (nothing
//! happened) and half *after* it (the write happened, the reply was lost) —
//! the two cases a caller cannot tell apart, and that a lock must survive
//! without granting anything wrongly. The choice is a seeded pseudo-random
//! sequence, so a failing run can be repeated.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use async_trait::async_trait;

use coord_host::backend::*;

/// Where an injected fault strikes.
enum Fault {
    None,
    Before,
    After,
}

/// A backend whose calls fail at a chosen rate.
pub struct FaultyBackend {
    inner: Arc<dyn Backend>,
    per_million: AtomicU32,
    seed: Mutex<u64>,
    injected: AtomicU64,
    deletes_down: std::sync::atomic::AtomicBool,
}

impl FaultyBackend {
    /// Wrap `inner`; no faults until [`FaultyBackend::set_rate`].
    pub fn new(inner: Arc<dyn Backend>, seed: u64) -> Self {
        FaultyBackend {
            inner,
            per_million: AtomicU32::new(0),
            seed: Mutex::new(seed),
            injected: AtomicU64::new(0),
            deletes_down: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// While `down`, every delete fails as `unavailable` before it reaches
    /// the inner backend (nothing is deleted), whatever the rate: a store
    /// that refuses the release a caller just sent.
    pub fn set_deletes_down(&self, down: bool) {
        self.deletes_down.store(down, Ordering::SeqCst);
    }

    /// Fail this share of calls from now on (0.0 to 1.0).
    pub fn set_rate(&self, share: f64) {
        self.per_million
            .store((share.clamp(0.0, 1.0) * 1e6) as u32, Ordering::SeqCst);
    }

    /// How many faults have been injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::SeqCst)
    }

    fn roll(&self) -> Fault {
        let rate = self.per_million.load(Ordering::SeqCst);
        let Ok(mut seed) = self.seed.lock() else {
            return Fault::None;
        };
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let draw = (*seed >> 33) % 1_000_000;
        if draw >= u64::from(rate) {
            return Fault::None;
        }
        self.injected.fetch_add(1, Ordering::SeqCst);
        if draw % 2 == 0 {
            Fault::Before
        } else {
            Fault::After
        }
    }
}

fn injected(when: &str) -> StoreError {
    StoreError::Unavailable(format!("injected fault ({when} the call)"))
}

/// Run one inner call under a fault roll.
macro_rules! faulty {
    ($self:ident, $call:expr) => {
        match $self.roll() {
            Fault::None => $call.await,
            Fault::Before => Err(injected("before")),
            Fault::After => {
                let _ = $call.await;
                Err(injected("after"))
            }
        }
    };
}

#[async_trait]
impl Backend for FaultyBackend {
    async fn now(&self) -> Result<Millis, StoreError> {
        faulty!(self, self.inner.now())
    }
    async fn get(&self, partition: &str, key: &str) -> Result<ReadReply, StoreError> {
        faulty!(self, self.inner.get(partition, key))
    }
    async fn list(&self, partition: &str, prefix: &str) -> Result<ListReply, StoreError> {
        faulty!(self, self.inner.list(partition, prefix))
    }
    async fn put(
        &self,
        partition: &str,
        key: &str,
        value: &[u8],
        ttl_ms: Option<u64>,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        faulty!(
            self,
            self.inner.put(partition, key, value, ttl_ms, condition)
        )
    }
    async fn delete(
        &self,
        partition: &str,
        key: &str,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        if self.deletes_down.load(Ordering::SeqCst) {
            return Err(injected("instead of"));
        }
        faulty!(self, self.inner.delete(partition, key, condition))
    }
    async fn touch(
        &self,
        partition: &str,
        key: &str,
        ttl_ms: u64,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        faulty!(self, self.inner.touch(partition, key, ttl_ms, condition))
    }
    async fn changes(
        &self,
        partition: &str,
        after: u64,
        max: u32,
    ) -> Result<ChangesReply, StoreError> {
        faulty!(self, self.inner.changes(partition, after, max))
    }
    async fn meter(
        &self,
        partition: &str,
        key: &str,
        request: &MeterRequest,
    ) -> Result<MeterReply, StoreError> {
        faulty!(self, self.inner.meter(partition, key, request))
    }
    async fn wait(&self, partition: &str, after: u64, timeout_ms: u64) -> Result<u64, StoreError> {
        faulty!(self, self.inner.wait(partition, after, timeout_ms))
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
        faulty!(
            self,
            self.inner
                .wait_then_put(partition, key, value, ttl_ms, condition, after, timeout_ms)
        )
    }
}
