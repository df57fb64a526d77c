//! The in-memory backend: one map of partitions shared by every instance.
//!
//! Every component instance that uses a [`MemoryBackend`] must share the
//! same one (it is meant to live in an `Arc`), or locks between instances
//! would mean nothing. The store semantics are those of
//! [`coord_component::memory::Partition`]; this module adds the shared map,
//! the clock and waiting: each partition has a watch channel that every
//! mutation bumps, and a waiter also sleeps on the clock until the
//! partition's next expiry, so expiry wakes it with no one else writing.
//!
//! A partition that went quiet — no live entry, no meter, no waiter — is
//! dropped once the retention has passed since its last change, as Redis's
//! keys expire, so a long-running host does not keep every lock resource and
//! tenant it ever saw. Dropping it loses nothing a caller can count on:
//! revisions are floored at the clock, so the partition made again later
//! starts above every revision it had, and a watcher resuming from before
//! the drop is told `history-gone` and resyncs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use coord_component::memory::{DEFAULT_HISTORY, Partition};
use tokio::sync::watch;

use super::partitioned::{Answer, Operation, PartitionStore};
use super::*;
use crate::clock::{Clock, SystemClock};

/// How often, on the store's clock, every partition is swept: expiries are
/// recorded (and their waiters woken) and quiet partitions dropped.
const SWEEP_EVERY_MS: u64 = 1000;

/// A partition and the channel that tells waiters it changed.
struct Slot {
    partition: Partition,
    mutations: watch::Sender<u64>,
    /// Store time of the partition's last change (or of its making).
    changed_at: u64,
}

impl Slot {
    /// Record due expiries, waking waiters if any; whether to keep the slot.
    fn sweep(&mut self, now: u64, retention_ms: u64) -> bool {
        if self.partition.sweep(now) > 0 {
            self.changed_at = now;
            self.wake();
        }
        self.worth_keeping(now, retention_ms)
    }

    /// Wake the partition's waiters. Nobody subscribed, nobody to wake: a
    /// waiter subscribes under the map's lock together with reading the
    /// revision, so it cannot miss a change made while it was not listening.
    fn wake(&self) {
        if self.mutations.receiver_count() > 0 {
            self.mutations.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// A partition with a live entry, a meter or a waiter is kept. One that
    /// had entries is kept for the retention after its last change, so a
    /// watcher can resume from its revisions; one that never had any (a
    /// rate-limit key once its meter expired) has nothing to resume from.
    fn worth_keeping(&self, now: u64, retention_ms: u64) -> bool {
        !self.partition.is_empty()
            || self.mutations.receiver_count() > 0
            || (self.partition.revision() > 0 && now < self.changed_at.saturating_add(retention_ms))
    }
}

/// Every partition, and when they were last all swept.
#[derive(Default)]
struct Partitions {
    map: HashMap<String, Slot>,
    swept_at: u64,
}

/// The in-memory store, shared by every instance that holds it.
pub struct MemoryBackend {
    clock: Arc<dyn Clock>,
    history: usize,
    retention_ms: u64,
    partitions: Mutex<Partitions>,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend::new(Arc::new(SystemClock))
    }
}

impl MemoryBackend {
    /// A store on `clock`, keeping the default history per partition.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        MemoryBackend::with_history(clock, DEFAULT_HISTORY)
    }

    /// A store on `clock` whose change feeds keep `history` changes per
    /// partition, and which drops a quiet partition after the default
    /// retention ([`DEFAULT_RETENTION_MS`]).
    pub fn with_history(clock: Arc<dyn Clock>, history: usize) -> Self {
        MemoryBackend {
            clock,
            history,
            retention_ms: DEFAULT_RETENTION_MS,
            partitions: Mutex::default(),
        }
    }

    /// This store, dropping a partition that has no live entry, meter or
    /// waiter once `retention_ms` have passed since its last change.
    pub fn with_retention(mut self, retention_ms: u64) -> Self {
        self.retention_ms = retention_ms;
        self
    }

    /// How many partitions the store holds.
    pub fn partitions(&self) -> usize {
        self.partitions.lock().map_or(0, |p| p.map.len())
    }

    /// How many `wait` calls are blocked on `partition` right now. Lets a
    /// test know a waiter is asleep before it acts, instead of hoping.
    pub fn waiters(&self, partition: &str) -> usize {
        self.partitions.lock().map_or(0, |p| {
            p.map
                .get(partition)
                .map_or(0, |slot| slot.mutations.receiver_count())
        })
    }

    /// Run `f` on the partition's slot under the map's lock, at the clock's
    /// now, after recording due expiries; wake the partition's waiters if
    /// anything changed. Returns `f`'s result and `now`.
    fn with_slot<T>(
        &self,
        name: &str,
        f: impl FnOnce(&mut Slot, u64) -> T,
    ) -> Result<(T, u64), StoreError> {
        let mut partitions = self.partitions.lock().map_err(|_| {
            StoreError::Unavailable("the in-memory store's lock is poisoned".into())
        })?;
        let now = self.clock.now_ms();
        if now >= partitions.swept_at.saturating_add(SWEEP_EVERY_MS) {
            partitions.swept_at = now;
            let retention_ms = self.retention_ms;
            partitions
                .map
                .retain(|_, slot| slot.sweep(now, retention_ms));
        }
        // Look up before inserting: `entry` would need an owned name, an
        // allocation on every call for a partition that almost always exists.
        if !partitions.map.contains_key(name) {
            let slot = Slot {
                partition: Partition::new(self.history),
                mutations: watch::Sender::new(0),
                changed_at: now,
            };
            partitions.map.insert(name.to_string(), slot);
        }
        let Some(slot) = partitions.map.get_mut(name) else {
            return Err(StoreError::Unavailable(
                "the in-memory store lost a partition it just made".into(),
            ));
        };
        let before = (slot.partition.revision(), slot.partition.next_expiry());
        slot.partition.sweep(now);
        let result = f(slot, now);
        if before != (slot.partition.revision(), slot.partition.next_expiry()) {
            slot.changed_at = now;
            slot.wake();
        }
        if !slot.worth_keeping(now, self.retention_ms) {
            partitions.map.remove(name);
        }
        Ok((result, now))
    }

    /// [`MemoryBackend::with_slot`] for the partition alone.
    fn with<T>(
        &self,
        name: &str,
        f: impl FnOnce(&mut Partition, u64) -> T,
    ) -> Result<(T, u64), StoreError> {
        self.with_slot(name, |slot, now| f(&mut slot.partition, now))
    }
}

#[async_trait]
impl PartitionStore for MemoryBackend {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn now(&self) -> Result<Millis, StoreError> {
        Ok(self.clock.now_ms())
    }

    async fn step(
        &self,
        partition: &str,
        operation: Operation<'_>,
    ) -> Result<(Answer, Millis), StoreError> {
        self.with(partition, |p, now| operation.apply(p, now))
    }

    async fn wait(&self, partition: &str, after: u64, timeout_ms: u64) -> Result<u64, StoreError> {
        let deadline = self.clock.now_ms().saturating_add(timeout_ms);
        loop {
            // Subscribe under the map's lock, with the revision read, so a
            // mutation between the check and the sleep still wakes us.
            let ((revision, next_expiry, mut mutations), now) =
                self.with_slot(partition, |slot, _| {
                    let p = &slot.partition;
                    (p.revision(), p.next_expiry(), slot.mutations.subscribe())
                })?;
            if revision > after || now >= deadline {
                return Ok(revision);
            }
            // Wake at the next expiry too: it is a change nobody else will write.
            let wake = next_expiry.map_or(deadline, |at| at.min(deadline));
            tokio::select! {
                _ = mutations.changed() => {}
                _ = self.clock.sleep_until(wake) => {}
            }
        }
    }
}
