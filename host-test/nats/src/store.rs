//! NATS as a [`PartitionStore`]: every operation is the in-memory state
//! machine's, run by [`NatsBackend::transact`] on the partition's snapshot;
//! `coord_host::backend::partitioned` makes it a `Backend`.

use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;

use coord_host::backend::partitioned::{Answer, Operation, PartitionStore};
use coord_host::backend::{Condition, Millis, StoreError};
use coord_host::clock::Clock;

use super::{NatsBackend, unavailable};

/// The largest count an `absent-and-fewer-than` put may pass on NATS (a
/// semaphore's limit): a partition is one message, written whole by every
/// call, so each permit held adds to the cost of every call (about 70
/// bytes). Above it the put is `invalid`, naming `limit` (wit/store.wit).
pub const MAX_PERMITS: u32 = 1000;

#[async_trait]
impl PartitionStore for NatsBackend {
    fn kind(&self) -> &'static str {
        "nats"
    }

    async fn now(&self) -> Result<Millis, StoreError> {
        self.trip();
        self.reading(std::time::Instant::now(), || self.clock())
            .await
    }

    async fn ready(&self) -> Result<(), StoreError> {
        self.stream_has_leader().await?;
        self.takes_a_write().await
    }

    fn warnings(&self) -> Vec<String> {
        NatsBackend::warnings(self)
    }

    /// A read, or a create-if-absent (a lock's or a permit's acquire),
    /// reads the partition first; another write decides on what this host
    /// last saw, and its compare-and-set retries when that was stale.
    /// Deciding a create on a cached copy, a holder that just released
    /// would take the lock again before the waiters its release woke had
    /// read — one round trip ahead of them every time (the 64-instance
    /// contention run took 4 times as long, its waiters starved).
    async fn step(
        &self,
        partition: &str,
        operation: Operation<'_>,
    ) -> Result<(Answer, Millis), StoreError> {
        if let Operation::Put { condition, .. } = &operation
            && let Condition::AbsentAndFewerThan(limit) = condition.as_ref()
            && *limit > MAX_PERMITS
        {
            return Err(StoreError::Invalid(format!(
                "limit: {limit} is over {MAX_PERMITS}, the most permits one semaphore holds on \
                 NATS (every write republishes the partition whole, so a permit's cost grows \
                 with the permits held)"
            )));
        }
        let skip_read = !operation.needs_latest();
        self.transact(partition, skip_read, |p, now| operation.apply(p, now))
            .await
    }

    async fn wait(&self, partition: &str, after: u64, timeout_ms: u64) -> Result<u64, StoreError> {
        // Subscribed before the first check, so a change after it wakes us.
        let mut notifications = self
            .client
            .subscribe(self.notify_subject(partition))
            .await
            .map_err(unavailable)?;
        let mut deadline = None;
        loop {
            // A check records due expiries, so an expiry is a new revision.
            let ((revision, next_expiry), now) = self
                .transact(partition, false, |p, _| (p.revision(), p.next_expiry()))
                .await?;
            let deadline = *deadline.get_or_insert(now.saturating_add(timeout_ms));
            if revision > after || now >= deadline {
                return Ok(revision);
            }
            let recheck_ms = u64::try_from(self.config.recheck.as_millis()).unwrap_or(u64::MAX);
            let mut sleep_ms = (deadline - now).min(recheck_ms);
            if let Some(expiry) = next_expiry {
                sleep_ms = sleep_ms.min(expiry.saturating_sub(now).max(1));
            }
            let test_clock_reaches = async {
                match &self.config.test_clock {
                    Some(clock) => clock.sleep_until(now + sleep_ms).await,
                    None => std::future::pending().await,
                }
            };
            let _asleep = self.asleep(partition);
            tokio::select! {
                notification = notifications.next() => {
                    // The revision a write announced once it was stored:
                    // past `after`, it answers the wait with no check.
                    let announced = notification
                        .and_then(|m| std::str::from_utf8(&m.payload).ok()?.parse::<u64>().ok());
                    match announced {
                        Some(announced) if announced > after => return Ok(announced),
                        Some(_) => {}
                        // The subscription ended (the connection is being
                        // re-established): sleep, then check again.
                        None => tokio::time::sleep(Duration::from_millis(sleep_ms)).await,
                    }
                }
                _ = test_clock_reaches => {}
                _ = tokio::time::sleep(Duration::from_millis(sleep_ms)) => {}
            }
        }
    }
}
