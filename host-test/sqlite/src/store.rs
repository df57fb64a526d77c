//! The `Backend` implementation on SQLite: every operation is the
//! in-memory state machine's, run by [`SqliteBackend::transact`] on the
//! partition's row.

use std::time::Duration;

use async_trait::async_trait;
use coord_component::keys::is_unwatched;
use coord_component::memory::Partition;
use tokio::sync::broadcast::error::RecvError;

use coord_host::backend::{
    Backend, ChangesReply, Condition, ListReply, MeterReply, MeterRequest, Millis, Outcome,
    ReadReply, StoreError, WriteReply, no_feed,
};
use coord_host::clock::Clock;

use super::{SqliteBackend, unavailable};

impl SqliteBackend {
    /// Run a write and wrap its outcome with the now it was decided at.
    async fn write(
        &self,
        partition: &str,
        decide: impl FnOnce(&mut Partition, u64) -> Outcome + Send + 'static,
    ) -> Result<WriteReply, StoreError> {
        let (outcome, now) = self.transact(partition, decide).await?;
        Ok(WriteReply { outcome, now })
    }
}

#[async_trait]
impl Backend for SqliteBackend {
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

    async fn get(&self, partition: &str, key: &str) -> Result<ReadReply, StoreError> {
        let key = key.to_string();
        let (entry, now) = self
            .transact(partition, move |p, now| p.get(&key, now))
            .await?;
        Ok(ReadReply { entry, now })
    }

    async fn list(&self, partition: &str, prefix: &str) -> Result<ListReply, StoreError> {
        let prefix = prefix.to_string();
        let ((entries, revision), now) = self
            .transact(partition, move |p, now| {
                (p.list(&prefix, now), p.revision())
            })
            .await?;
        Ok(ListReply {
            entries,
            revision,
            now,
        })
    }

    async fn put(
        &self,
        partition: &str,
        key: &str,
        value: &[u8],
        ttl_ms: Option<u64>,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        let (key, value, condition) = (key.to_string(), value.to_vec(), condition.clone());
        self.write(partition, move |p, now| {
            p.put(&key, &value, ttl_ms, &condition, now)
        })
        .await
    }

    async fn delete(
        &self,
        partition: &str,
        key: &str,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        let (key, condition) = (key.to_string(), condition.clone());
        self.write(partition, move |p, now| p.delete(&key, &condition, now))
            .await
    }

    async fn touch(
        &self,
        partition: &str,
        key: &str,
        ttl_ms: u64,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        let (key, condition) = (key.to_string(), condition.clone());
        self.write(partition, move |p, now| {
            p.touch(&key, ttl_ms, &condition, now)
        })
        .await
    }

    async fn changes(
        &self,
        partition: &str,
        after: u64,
        max: u32,
    ) -> Result<ChangesReply, StoreError> {
        if is_unwatched(partition) {
            return Err(no_feed(partition));
        }
        let ((changes, revision), now) = self
            .transact(partition, move |p, now| {
                (p.changes(after, max, now), p.revision())
            })
            .await?;
        Ok(ChangesReply {
            changes: changes?,
            revision,
            now,
        })
    }

    async fn meter(
        &self,
        partition: &str,
        key: &str,
        request: &MeterRequest,
    ) -> Result<MeterReply, StoreError> {
        let (key, request) = (key.to_string(), *request);
        Ok(self
            .transact(partition, move |p, now| p.meter(&key, &request, now))
            .await?
            .0)
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
        loop {
            // A check records due expiries, so an expiry is a new revision.
            let ((revision, next_expiry), now) = self
                .transact(partition, |p, _| (p.revision(), p.next_expiry()))
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
