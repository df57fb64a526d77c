//! PostgreSQL as a [`PartitionStore`]: every operation is the in-memory
//! state machine's, run by [`PostgresBackend::transact`] on the partition's
//! row; `coord_host::backend::partitioned` makes it a `Backend`.

use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::broadcast::error::RecvError;

use coord_host::backend::partitioned::{Answer, Operation, PartitionStore};
use coord_host::backend::rows::Touches;
use coord_host::backend::{Millis, StoreError};
use coord_host::clock::Clock;

use super::{PostgresBackend, announced_name, listen, unavailable};

/// How long past its next check a waiter needs its registration on a row
/// to last: a round trip slowed that much still finds the row announcing
/// writes.
const REGISTRATION_SLACK_MS: u64 = 5_000;

#[async_trait]
impl PartitionStore for PostgresBackend {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    async fn now(&self) -> Result<Millis, StoreError> {
        self.clock().await
    }

    /// Whether a write could land: not a standby, not read-only sessions;
    /// and the table's durability checked again (see `warnings`).
    async fn ready(&self) -> Result<(), StoreError> {
        self.writable().await?;
        let have = self.bounded(self.table_durability()).await?;
        self.check_durability(have);
        Ok(())
    }

    fn warnings(&self) -> Vec<String> {
        PostgresBackend::warnings(self)
    }

    async fn step(
        &self,
        partition: &str,
        operation: Operation<'_>,
    ) -> Result<(Answer, Millis), StoreError> {
        self.transact(partition, operation.touches(), |p, now| {
            operation.apply(p, now)
        })
        .await
    }

    async fn wait(&self, partition: &str, after: u64, timeout_ms: u64) -> Result<u64, StoreError> {
        // Subscribed before the first check, so a change after it wakes us.
        let mut heard = self.notifications.subscribe();
        let mut listening = self.listening.clone();
        let announced_as = announced_name(partition);
        let mut deadline = None;
        loop {
            // Read before the check: a write announced while this says the
            // connection listens reaches `heard`; when it stops listening,
            // or listens again on a new connection, `changed` wakes us to
            // check for writes nobody heard.
            let listens = listening.borrow_and_update().is_some();
            // Registered before the check: a write after the check sees
            // the registration and announces itself (see
            // `register_waiter`). It covers this round's sleep, with room
            // for a slow round trip; a lapse costs at most one sleep.
            let recheck_ms = u64::try_from(self.config.recheck.as_millis()).unwrap_or(u64::MAX);
            let need_ms = recheck_ms.saturating_add(REGISTRATION_SLACK_MS);
            let cover_ms = u64::try_from(self.config.registration.as_millis()).unwrap_or(u64::MAX);
            self.register_waiter(partition, need_ms, cover_ms).await?;
            // A check records due expiries, so an expiry is a new revision.
            let ((revision, next_expiry), now) = self
                .transact(partition, Touches::Nothing, |p, _| {
                    (p.revision(), p.next_expiry())
                })
                .await?;
            let deadline = *deadline.get_or_insert(now.saturating_add(timeout_ms));
            if revision > after || now >= deadline {
                return Ok(revision);
            }
            let mut sleep_ms = (deadline - now).min(recheck_ms);
            if !listens {
                // Nobody hears announcements: poll until someone does.
                sleep_ms = sleep_ms.min(listen::RETRY.as_millis() as u64);
            }
            if let Some(expiry) = next_expiry {
                sleep_ms = sleep_ms.min(expiry.saturating_sub(now).max(1));
            }
            let test_clock_reaches = async {
                match &self.config.test_clock {
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
                        // A write announced the revision it stored: past
                        // `after`, it answers the wait with no check.
                        Ok((name, announced)) if Some(&name) == announced_as.as_ref() => {
                            if announced > after {
                                return Ok(announced);
                            }
                        }
                        Ok(_) => continue,
                        // Missed announcements: check again.
                        Err(RecvError::Lagged(_)) => break,
                        Err(RecvError::Closed) => {
                            return Err(unavailable("the backend is closing"));
                        }
                    },
                    changed = listening.changed() => match changed {
                        // Lost or listening again: announcements may have
                        // gone unheard in between.
                        Ok(()) => break,
                        Err(_) => return Err(unavailable("the backend is closing")),
                    },
                    _ = &mut sleep => break,
                    _ = &mut test_clock_reaches => break,
                }
            }
        }
    }
}
