//! SQLite as a [`PartitionStore`]: every operation is the in-memory state
//! machine's, run by [`SqliteBackend::transact`] on the partition's row;
//! `coord_host::backend::partitioned` makes it a `Backend`.

use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::broadcast::error::RecvError;

use coord_host::backend::partitioned::{Answer, Operation, PartitionStore};
use coord_host::backend::rows::Touches;
use coord_host::backend::{Millis, StoreError};
use coord_host::clock::Clock;

use super::{SqliteBackend, unavailable};

#[async_trait]
impl PartitionStore for SqliteBackend {
    fn kind(&self) -> &'static str {
        "sqlite"
    }

    async fn now(&self) -> Result<Millis, StoreError> {
        Ok(self.now_ms())
    }

    /// Whether the store takes a write now: a row written and committed
    /// (a read-only or deleted file, a full disk, a write lock held past
    /// the busy timeout: no), within the busy timeout.
    async fn ready(&self) -> Result<(), StoreError> {
        self.probe().await
    }

    /// The operation, owned, runs on the connection's thread.
    async fn step(
        &self,
        partition: &str,
        operation: Operation<'_>,
    ) -> Result<(Answer, Millis), StoreError> {
        let touches = operation.touches();
        let operation = operation.into_owned();
        if operation.only_reads() {
            let bound = self.shared.config.busy_timeout;
            return self
                .read_within(partition, touches, bound, move |p, now| {
                    operation.apply(p, now)
                })
                .await;
        }
        self.transact(partition, touches, move |p, now| operation.apply(p, now))
            .await
    }

    async fn wait(&self, partition: &str, after: u64, timeout_ms: u64) -> Result<u64, StoreError> {
        // Subscribed before the first check, so a write of this process
        // after it wakes us at once.
        let mut heard = self.notifications.subscribe();
        let mut deadline = None;
        // Another process's write has no announcement here: check again
        // after 1 ms, then twice as long each time, up to the recheck.
        let recheck_ms = u64::try_from(self.shared.config.recheck.as_millis()).unwrap_or(u64::MAX);
        let mut pause_ms = 1u64;
        // Each check waits for another process's write lock no longer than
        // what is left of the wait (and at least `CHECK_AT_LEAST`): with
        // the lock held, a 1 s wait answered after the 5 s busy timeout.
        let started = std::time::Instant::now();
        let waits = Duration::from_millis(timeout_ms);
        loop {
            let bound = waits.saturating_sub(started.elapsed()).max(CHECK_AT_LEAST);
            // A check only reads, unless an entry is due: then it records
            // the expiry (a write), so an expiry is a new revision.
            let ((revision, next_expiry), now) = self
                .read_within(partition, Touches::Nothing, bound, |p, _| {
                    (p.revision(), p.next_expiry())
                })
                .await?;
            let deadline = *deadline.get_or_insert(now.saturating_add(timeout_ms));
            if revision > after || now >= deadline {
                return Ok(revision);
            }
            let mut sleep_ms = (deadline - now).min(pause_ms);
            if let Some(expiry) = next_expiry {
                sleep_ms = sleep_ms.min(expiry.saturating_sub(now).max(1));
            }
            pause_ms = (pause_ms * 2).min(recheck_ms.max(1));
            let test_clock_reaches = async {
                match &self.shared.config.test_clock {
                    Some(clock) => clock.sleep_until(now + sleep_ms).await,
                    None => std::future::pending().await,
                }
            };
            let sleep = tokio::time::sleep(Duration::from_millis(sleep_ms));
            tokio::pin!(sleep, test_clock_reaches);
            let _asleep = self.asleep(partition);
            loop {
                tokio::select! {
                    message = heard.recv() => match message {
                        // A write of this process announced its revision:
                        // past `after`, it answers the wait with no check.
                        Ok((name, announced)) if name == partition => {
                            if announced > after {
                                return Ok(announced);
                            }
                        }
                        Ok(_) => continue,
                        Err(RecvError::Lagged(_)) => break,
                        Err(RecvError::Closed) => {
                            return Err(unavailable("the backend is closing"));
                        }
                    },
                    _ = &mut sleep => break,
                    _ = &mut test_clock_reaches => break,
                }
            }
        }
    }
}

/// The least time a `wait`'s check may wait for another process's write
/// lock, however little of the wait is left: a check made at a wait's end
/// still gets a lock a writer holds for a moment.
const CHECK_AT_LEAST: Duration = Duration::from_millis(100);
