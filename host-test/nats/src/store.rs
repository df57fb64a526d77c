//! The `Backend` implementation on NATS: every operation is the in-memory
//! state machine's, run by [`NatsBackend::transact`] on the partition's
//! snapshot.

use std::time::Duration;

use async_trait::async_trait;
use coord_component::keys::is_unwatched;
use futures_util::StreamExt;

use coord_host::backend::{
    Backend, ChangesReply, Condition, ListReply, MeterReply, MeterRequest, Millis, Outcome,
    ReadReply, StoreError, WriteReply, no_feed,
};
use coord_host::clock::Clock;

use super::{NatsBackend, unavailable};

impl NatsBackend {
    /// Run a write and wrap its outcome with the now it was decided at.
    ///
    /// A create-if-absent (a lock's or a permit's acquire) always reads first: deciding
    /// on what this host last saw, a holder that just released would take
    /// the lock again before the waiters its release woke had read — one
    /// round trip ahead of them every time (the 64-instance contention run
    /// took 4 times as long, its waiters starved).
    async fn write(
        &self,
        partition: &str,
        condition: &Condition,
        mut decide: impl FnMut(&mut coord_component::memory::Partition, u64) -> Outcome,
    ) -> Result<WriteReply, StoreError> {
        let skip_read = !matches!(
            condition,
            Condition::Absent | Condition::AbsentAndFewerThan(_)
        );
        let (outcome, now) = self
            .transact(partition, skip_read, |p, now| decide(p, now))
            .await?;
        Ok(WriteReply { outcome, now })
    }
}

#[async_trait]
impl Backend for NatsBackend {
    fn kind(&self) -> &'static str {
        "nats"
    }

    async fn now(&self) -> Result<Millis, StoreError> {
        self.trip();
        self.reading(std::time::Instant::now(), || self.clock())
            .await
    }

    async fn ready(&self) -> Result<(), StoreError> {
        self.stream_has_leader().await
    }

    fn warnings(&self) -> Vec<String> {
        NatsBackend::warnings(self)
    }

    async fn get(&self, partition: &str, key: &str) -> Result<ReadReply, StoreError> {
        let (entry, now) = self
            .transact(partition, false, |p, now| p.get(key, now))
            .await?;
        Ok(ReadReply { entry, now })
    }

    async fn list(&self, partition: &str, prefix: &str) -> Result<ListReply, StoreError> {
        let ((entries, revision), now) = self
            .transact(partition, false, |p, now| {
                (p.list(prefix, now), p.revision())
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
        self.write(partition, condition, |p, now| {
            p.put(key, value, ttl_ms, condition, now)
        })
        .await
    }

    async fn delete(
        &self,
        partition: &str,
        key: &str,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        self.write(partition, condition, |p, now| p.delete(key, condition, now))
            .await
    }

    async fn touch(
        &self,
        partition: &str,
        key: &str,
        ttl_ms: u64,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        self.write(partition, condition, |p, now| {
            p.touch(key, ttl_ms, condition, now)
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
            .transact(partition, false, |p, now| {
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
        Ok(self
            .transact(partition, true, |p, now| p.meter(key, request, now))
            .await?
            .0)
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
