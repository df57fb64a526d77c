//! One partition in SQLite: one transaction reads its row, decides with the
//! in-memory state machine, and writes the row back if anything changed. A
//! partition that may hold many entries keeps them as rows apart
//! (`rows.rs`): the call loads the ones it needs and writes back those it
//! changed.

use coord_component::keys::{is_unwatched, may_hold_many};
use coord_component::memory::Partition;
use coord_host::backend::StoreError;
use coord_host::backend::rows::{self as layout, Touches};
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior};

use super::rows;
use super::{Shared, SqliteBackend, unavailable};

/// The most bytes of feed a row carries beyond its live entries (every
/// write rewrites the whole row; the rule the NATS and PostgreSQL backends
/// follow).
pub const FEED_BYTES: usize = 16 * 1024;

/// A store time as the table keeps it.
fn column(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

impl SqliteBackend {
    /// Run `decide` on the partition at the store's now, after recording
    /// due expiries, in one transaction that writes the result back if it
    /// changed anything. `decide` sees the entries `touches` names (and, in
    /// a partition of many, those that decide expiry and conflicts; in any
    /// other, all). Returns `decide`'s answer and the store's now; wakes
    /// this process's waiters when the revision moved.
    pub(super) async fn transact<T: Send + 'static>(
        &self,
        name: &str,
        touches: Touches,
        decide: impl FnOnce(&mut Partition, u64) -> T + Send + 'static,
    ) -> Result<(T, u64), StoreError> {
        let bound = self.shared.config.busy_timeout;
        let owned = name.to_string();
        let (answer, now, announce) = self
            .with_connection_within(bound, move |shared, connection| {
                shared.in_transaction(connection, &owned, &touches, decide)
            })
            .await?;
        if let Some(revision) = announce {
            let _ = self.notifications.send((name.to_string(), revision));
        }
        Ok((answer, now))
    }
}

impl SqliteBackend {
    /// Run `decide`, which only reads, on the partition at the store's now,
    /// within `bound` (at most the busy timeout). It begins as a read
    /// (`BEGIN DEFERRED`): in WAL mode it takes no lock that a writer, in
    /// this process or another, waits for or holds it back, so a read
    /// answers while another process holds a long write and on a file
    /// this process may only read. When an entry of the partition is due
    /// to expire, the expiry must be recorded (with its revision, in the
    /// feed) before the answer: then it runs as [`SqliteBackend::transact`]
    /// does, a write.
    pub(super) async fn read_within<T: Send + 'static>(
        &self,
        name: &str,
        touches: Touches,
        bound: std::time::Duration,
        decide: impl Fn(&mut Partition, u64) -> T + Send + 'static,
    ) -> Result<(T, u64), StoreError> {
        let owned = name.to_string();
        let (answer, now, announce) = self
            .with_connection_within(bound, move |shared, connection| {
                if let Some((answer, now)) =
                    shared.in_read(connection, &owned, &touches, &decide)?
                {
                    return Ok((answer, now, None));
                }
                shared.in_transaction(connection, &owned, &touches, decide)
            })
            .await?;
        if let Some(revision) = announce {
            let _ = self.notifications.send((name.to_string(), revision));
        }
        Ok((answer, now))
    }
}

/// The row of partition `name`: its state and the store time it was last
/// decided at.
fn partition_row(tx: &Transaction<'_>, name: &str) -> Result<Option<(Vec<u8>, i64)>, StoreError> {
    tx.query_row(
        "SELECT state, decided_at FROM coord_partitions WHERE name = ?1",
        [name.as_bytes()],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )
    .optional()
    .map_err(unavailable)
}

/// A row's state as the partition it holds and, in a partition of many,
/// the count of its entry rows (0 otherwise).
fn decode(name: &str, state: &[u8], many: bool) -> Result<(Partition, u64), StoreError> {
    let split = if many { layout::split(state)? } else { None };
    let (rows, snapshot) = split.unwrap_or((0, state));
    let partition = Partition::decode(snapshot)
        .map_err(|e| unavailable(format!("the row of {name:?} is not a coord partition: {e}")))?;
    Ok((partition, rows))
}

impl Shared {
    /// [`SqliteBackend::read_within`]'s read: its answer and its now, or
    /// `None` when an entry is due to expire (the caller writes instead).
    fn in_read<T>(
        &self,
        connection: &mut Connection,
        name: &str,
        touches: &Touches,
        decide: &impl Fn(&mut Partition, u64) -> T,
    ) -> Result<Option<(T, u64)>, StoreError> {
        let many = may_hold_many(name);
        let tx = connection
            .transaction_with_behavior(TransactionBehavior::Deferred)
            .map_err(unavailable)?;
        let row = partition_row(&tx, name)?;
        let clock = self.now_us() / 1000;
        let Some((state, decided_at)) = row else {
            // No row: no entries (entry rows without one are not its) and
            // revision 0, what a write would find and leave unwritten.
            let mut partition = Partition::new(1);
            return Ok(Some((decide(&mut partition, clock), clock)));
        };
        let now = clock.max(u64::try_from(decided_at).unwrap_or(0));
        let (mut partition, rows) = decode(name, &state, many)?;
        if many {
            rows::load(&tx, name, now, touches, rows, &mut partition)?;
        }
        if partition.next_expiry().is_some_and(|at| at <= now) {
            return Ok(None);
        }
        Ok(Some((decide(&mut partition, now), now)))
    }

    /// [`SqliteBackend::transact`]'s transaction: its answer, its now, and
    /// the new revision when it made one.
    fn in_transaction<T>(
        &self,
        connection: &mut Connection,
        name: &str,
        touches: &Touches,
        decide: impl FnOnce(&mut Partition, u64) -> T,
    ) -> Result<(T, u64, Option<u64>), StoreError> {
        let many = may_hold_many(name);
        let tx = connection
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(unavailable)?;
        let row = partition_row(&tx, name)?;
        let clock_us = self.now_us();
        let clock = clock_us / 1000;
        let (mut partition, before, now, rows) = match row {
            Some((state, decided_at)) => {
                let (partition, rows) = decode(name, &state, many)?;
                let decided_at = u64::try_from(decided_at).unwrap_or(0);
                (partition, Some(state), clock.max(decided_at), rows)
            }
            None => {
                // An unwatched partition's feed is never read: keep one
                // change, not the history.
                let history = if is_unwatched(name) {
                    1
                } else {
                    self.config.history
                };
                (Partition::new(history), None, clock, 0)
            }
        };
        let revision = partition.revision();
        partition.floor_at_micros(clock_us);
        if many && before.is_none() {
            // A partition with no row has no entries: rows left by one
            // whose row went some other way (an operator's `DELETE`) are
            // not its. Kept only if this transaction writes.
            tx.execute(
                "DELETE FROM coord_entries WHERE partition = ?1",
                [name.as_bytes()],
            )
            .map_err(unavailable)?;
        }
        let loaded = if many {
            Some(rows::load(&tx, name, now, touches, rows, &mut partition)?)
        } else {
            None
        };
        partition.sweep(now);
        let answer = decide(&mut partition, now);
        let (state, rows_written) = match &loaded {
            Some(loaded) => {
                let (rows, written) = rows::store(&tx, name, loaded, &mut partition)?;
                (layout::join(rows, &partition.encode()), written)
            }
            None => (partition.encode(), false),
        };
        let changed = rows_written
            || match &before {
                Some(before) => state != *before,
                None => partition.revision() > 0 || !partition.is_empty(),
            };
        if !changed {
            // Nothing written: the transaction ends as it began.
            drop(tx);
            return Ok((answer, now, None));
        }
        // A partition of many is unwatched (a semaphore's): its feed keeps
        // one change, with nothing to trim.
        let state = if many {
            state
        } else {
            partition.trim_feed_to_bytes(FEED_BYTES.max(partition.live_bytes()));
            partition.encode()
        };
        let lives_until = match many {
            true => rows::lives_until(&tx, name)?
                .and_then(|rows_until| partition.lives_until().map(|own| own.max(rows_until))),
            false => partition.lives_until(),
        };
        let collect_at = lives_until.map(|lives_until| {
            let retention = if partition.revision() > 0 {
                self.config.retention_ms
            } else {
                0
            };
            column(lives_until.max(now).saturating_add(retention))
        });
        tx.execute(
            "INSERT OR REPLACE INTO coord_partitions (name, decided_at, state, collect_at) \
             VALUES (?1, ?2, ?3, ?4)",
            rusqlite::params![name.as_bytes(), column(now), state, collect_at],
        )
        .map_err(unavailable)?;
        tx.commit().map_err(unavailable)?;
        let announce = (partition.revision() != revision).then(|| partition.revision());
        Ok((answer, now, announce))
    }
}
