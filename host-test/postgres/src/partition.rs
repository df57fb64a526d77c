//! One partition on PostgreSQL: read its row and the server's clock in one
//! statement, decide with the in-memory state machine, and write the result
//! back only if nobody wrote in between (the row's version).
//!
//! A call that lost that race once takes the row's lock for its next try
//! (`SELECT … FOR UPDATE` in a transaction), so it cannot lose again: under
//! contention every call gets through, in the order the server queues the
//! row's lockers, instead of racing until its timeout.

use std::time::Instant;

use coord_component::keys::{is_unwatched, may_hold_many};
use coord_component::memory::Partition;
use coord_host::backend::StoreError;
use coord_host::backend::rows::{self as layout, RowChanges, Touches};
use deadpool_postgres::Pool;
use tokio_postgres::GenericClient;
use tokio_postgres::types::{ToSql, Type};

use super::speculation::{KNOWN_ROWS, Speculated};
use super::{PostgresBackend, announced_name, refused, rows, unavailable, write_function};

/// The most bytes of feed a partition's row carries beyond its live
/// entries: every write rewrites the whole row, so the feed is bounded in
/// bytes as well as in changes (the rule the NATS backend follows).
pub const FEED_BYTES: usize = 16 * 1024;

/// When a row may be collected is kept to this grain (ms): a row lives up
/// to a minute past its time, and consecutive writes mostly keep the value.
pub(super) const COLLECT_GRAIN_MS: u64 = 60_000;

/// The server's clock in microseconds, as every read selects it: the store
/// time is its milliseconds, and revisions are floored at it.
pub(super) const CLOCK_US: &str = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint";

/// The server's clock in milliseconds, as waiters register until.
pub(super) const CLOCK_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// A partition as read or written: its row's version, its state, its
/// encoding (to tell whether a call changed it, and to check that the row
/// is still exactly this), the latest store time it was decided at and,
/// for a partition of many read with its entry rows (`rows.rs`), those rows
/// and how many it has.
#[derive(Clone)]
pub(super) struct Loaded {
    pub(super) version: i64,
    pub(super) partition: Partition,
    pub(super) encoded: Vec<u8>,
    pub(super) decided_at: u64,
    pub(super) rows: Option<Box<(layout::Loaded, u64)>>,
    /// A partition of many not loaded whole: the first row to expire
    /// after the read's now (its expiry and key). Every row not loaded
    /// comes after it in that order, so a decision on the rows loaded
    /// holds before its expiry while it is still among them.
    pub(super) horizon: Option<Box<(u64, String)>>,
}

/// The server's now, in ms.
pub(super) async fn server_now(pool: &Pool) -> Result<u64, StoreError> {
    let client = pool.get().await.map_err(unavailable)?;
    let row = client
        .query_typed(&format!("SELECT {CLOCK_US}"), &[])
        .await
        .map_err(refused)?;
    let now: i64 = row
        .first()
        .ok_or_else(|| unavailable("no clock in the reply"))?
        .try_get(0)
        .map_err(unavailable)?;
    micros(now).map(|us| us / 1000)
}

/// Whether the server would take a write now: `unavailable` from a
/// standby (in recovery) or a session whose transactions are read-only
/// (`default_transaction_read_only`), which answer reads and the clock
/// while every write fails.
pub(super) async fn takes_writes(pool: &Pool) -> Result<(), StoreError> {
    let client = pool.get().await.map_err(unavailable)?;
    let row = client
        .query_typed(
            "SELECT pg_is_in_recovery(), current_setting('transaction_read_only')",
            &[],
        )
        .await
        .map_err(refused)?;
    let row = row
        .first()
        .ok_or_else(|| unavailable("no answer to the readiness query"))?;
    let in_recovery: bool = row.try_get(0).map_err(unavailable)?;
    let read_only: String = row.try_get(1).map_err(unavailable)?;
    if in_recovery {
        return Err(unavailable(
            "the server is a standby (in recovery): it takes no write",
        ));
    }
    if read_only == "on" {
        return Err(unavailable(
            "this server's sessions are read-only (default_transaction_read_only): no write can land",
        ));
    }
    Ok(())
}

/// The clock column as microseconds, or `unavailable` before 1970.
fn micros(clock: i64) -> Result<u64, StoreError> {
    u64::try_from(clock).map_err(|_| unavailable(format!("the server's clock reads {clock} µs")))
}

/// A store time as the table keeps it.
pub(super) fn column(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

impl PostgresBackend {
    /// The store's now: the server's clock, or the test clock.
    pub(super) async fn clock(&self) -> Result<u64, StoreError> {
        self.trip();
        let now = self.bounded(server_now(&self.pool)).await?;
        Ok(self.test_now().unwrap_or(now))
    }

    /// Whether the store takes a write now ([`takes_writes`]), within the
    /// response timeout.
    pub(super) async fn writable(&self) -> Result<(), StoreError> {
        self.trip();
        self.bounded(takes_writes(&self.pool)).await
    }

    /// `attempt`, or `unavailable` once the response timeout passes.
    pub(super) async fn bounded<T>(
        &self,
        attempt: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.bounded_from(Instant::now(), attempt).await
    }

    /// [`bounded`](Self::bounded), for a call begun at `begun`: what is left
    /// of its response timeout.
    async fn bounded_from<T>(
        &self,
        begun: Instant,
        attempt: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let timeout = self.config.response_timeout;
        tokio::time::timeout(timeout.saturating_sub(begun.elapsed()), attempt)
            .await
            .map_err(|_| unavailable(format!("no answer within {timeout:?}")))?
    }

    /// The partition's row, if it has one, and the server's clock in µs,
    /// read through `client` (a pooled connection or a transaction); for a
    /// partition of many, with the entry rows a call touching `touches`
    /// needs (`rows.rs`).
    async fn load(
        &self,
        client: &impl GenericClient,
        name: &str,
        touches: &Touches,
    ) -> Result<(Option<Loaded>, u64), StoreError> {
        let name_bytes = name.as_bytes();
        self.trip();
        let sent = Instant::now();
        if may_hold_many(name) {
            let (key, prefix) = rows::read_params(touches);
            let test_now = self.test_now().map(column);
            let rows = client
                .query_typed(
                    &rows::read(&self.config.table),
                    &[
                        (&name_bytes, Type::BYTEA),
                        (&test_now, Type::INT8),
                        (&key, Type::BYTEA),
                        (&prefix, Type::BYTEA),
                    ],
                )
                .await
                .map_err(refused)?;
            let row = rows
                .first()
                .ok_or_else(|| unavailable("no row in the reply"))?;
            let clock_us = micros(row.try_get(0).map_err(unavailable)?)?;
            self.seen.observe_clock(sent, clock_us);
            let mut loaded = rows::loaded_of(name, row)?;
            if let Some(loaded) = &mut loaded {
                let now = self.test_now().unwrap_or(clock_us / 1000);
                loaded.horizon = rows::horizon(loaded, now.max(loaded.decided_at)).map(Box::new);
            }
            self.seen.remember_rows(name, loaded.as_ref());
            return Ok((loaded, clock_us));
        }
        let sql = format!(
            "SELECT c.now_us, t.version, t.decided_at, t.state \
             FROM (SELECT {CLOCK_US} AS now_us) c LEFT JOIN {} t ON t.name = $1",
            self.config.table
        );
        let rows = client
            .query_typed(&sql, &[(&name_bytes, Type::BYTEA)])
            .await
            .map_err(refused)?;
        let row = rows
            .first()
            .ok_or_else(|| unavailable("no row in the reply"))?;
        let (loaded, clock_us) = self.read_row(name, row, 0, sent)?;
        Ok((loaded, clock_us))
    }

    /// The row and clock a statement's reply carries from column `first`
    /// on (the clock in µs, the version, the time decided at, the state),
    /// for a statement sent at `sent`: the clock tightens this process's
    /// estimate of the server's, and the row is remembered for the next
    /// call's speculation.
    pub(super) fn read_row(
        &self,
        name: &str,
        row: &tokio_postgres::Row,
        first: usize,
        sent: Instant,
    ) -> Result<(Option<Loaded>, u64), StoreError> {
        let clock_us = micros(row.try_get(first).map_err(unavailable)?)?;
        self.seen.observe_clock(sent, clock_us);
        let version: Option<i64> = row.try_get(first + 1).map_err(unavailable)?;
        let Some(version) = version else {
            self.seen.forget(name);
            return Ok((None, clock_us));
        };
        let decided_at: i64 = row.try_get(first + 2).map_err(unavailable)?;
        let encoded: Vec<u8> = row.try_get(first + 3).map_err(unavailable)?;
        // Read without its entry rows, a partition of many would seem to
        // hold none: only `rows.rs` reads it.
        if layout::split(&encoded)?.is_some() {
            return Err(unavailable(format!(
                "the row of {name:?} keeps its entries as rows, which this read lacks"
            )));
        }
        let partition = Partition::decode(&encoded).map_err(|e| {
            unavailable(format!("the row of {name:?} is not a coord partition: {e}"))
        })?;
        let loaded = Loaded {
            version,
            partition,
            encoded,
            decided_at: u64::try_from(decided_at).unwrap_or(0),
            rows: None,
            horizon: None,
        };
        self.seen.remember(name, &loaded);
        Ok((Some(loaded), clock_us))
    }

    /// Make sure the partition's row says a waiter waits on it for at
    /// least the next `need_ms` of the server's clock (if the row exists:
    /// the first write of a new row always announces itself). When it says
    /// less, the row is written to say `cover_ms`; when it already says
    /// enough (another waiter, an earlier round), nothing is written, so a
    /// waiter writes about once per `cover_ms`, not once per check.
    ///
    /// A write reads this in the statement that writes the row, after the
    /// row's lock: it either sees the registration and announces itself,
    /// or committed before it, and the check the waiter makes next sees
    /// the write. Skipping holds the same way: a write after this
    /// statement reads a registration at least as long as the one it saw.
    pub(super) async fn register_waiter(
        &self,
        name: &str,
        need_ms: u64,
        cover_ms: u64,
    ) -> Result<(), StoreError> {
        let sql = format!(
            "UPDATE {} SET wait_until = greatest(coalesce(wait_until, 0), {CLOCK_MS} + $2) \
             WHERE name = $1 AND coalesce(wait_until, 0) < {CLOCK_MS} + $3",
            self.config.table
        );
        let (cover, need) = (column(cover_ms.max(need_ms)), column(need_ms));
        self.trip();
        self.bounded(async {
            let client = self.client().await?;
            client
                .query_typed(
                    &sql,
                    &[
                        (&name.as_bytes(), Type::BYTEA),
                        (&cover, Type::INT8),
                        (&need, Type::INT8),
                    ],
                )
                .await
                .map_err(refused)
        })
        .await?;
        Ok(())
    }

    /// When the partition's row may be deleted: its last live entry's
    /// expiry plus the retention (none while an entry never expires).
    pub(super) fn collect_at(&self, partition: &Partition, now: u64) -> Option<i64> {
        let lives_until = partition.lives_until()?;
        let retention = if partition.revision() > 0 {
            self.config.retention_ms
        } else {
            0
        };
        let at = lives_until.max(now).saturating_add(retention);
        // Rounded up to the grain, so most writes leave the indexed column
        // as it was and PostgreSQL can update the row in place (a HOT
        // update: no new index entries, less to flush).
        Some(column(
            at.div_ceil(COLLECT_GRAIN_MS)
                .saturating_mul(COLLECT_GRAIN_MS),
        ))
    }

    /// Run `decide` on the partition as read (or as last seen, when
    /// speculating), at the store's now (`clock_us`, the server's clock as
    /// read or estimated), after recording due expiries.
    pub(super) fn decide<T>(
        &self,
        name: &str,
        loaded: Option<Loaded>,
        clock_us: u64,
        decide: &mut impl FnMut(&mut Partition, u64) -> T,
    ) -> Decided<T> {
        let (clock, clock_us) = match self.test_now() {
            Some(now) => (now, now.saturating_mul(1000)),
            None => (clock_us / 1000, clock_us),
        };
        let horizon = loaded.as_ref().and_then(|l| l.horizon.clone());
        let (mut partition, was, now, rows) = match loaded {
            Some(l) => (
                l.partition,
                Some(Was {
                    version: l.version,
                    decided_at: l.decided_at,
                    encoded: l.encoded,
                }),
                clock.max(l.decided_at),
                l.rows.map(|rows| *rows),
            ),
            // An unwatched partition's feed is never read: keep one
            // change, not the history.
            None => {
                let history = if is_unwatched(name) {
                    1
                } else {
                    self.config.history
                };
                let rows = may_hold_many(name).then(|| (layout::Loaded::new(), 0));
                (Partition::new(history), None, clock, rows)
            }
        };
        let revision = partition.revision();
        partition.floor_at_micros(clock_us);
        if let Some((loaded, count)) = &rows {
            layout::adopt(&mut partition, loaded, *count);
        }
        partition.sweep(now);
        // The decision holds until the next live entry expires: past that
        // (on the server's clock), an entry it saw live is gone.
        let valid_until_us = match self.test_now() {
            Some(_) => u64::MAX,
            None => partition
                .next_expiry()
                .unwrap_or(u64::MAX)
                .min(horizon.as_ref().map_or(u64::MAX, |first| first.0))
                .saturating_mul(1000),
        };
        let answer = decide(&mut partition, now);
        // A partition of many: its entries go back as rows, apart. When few
        // rows were loaded, the rows known after the write are kept too.
        let mut known = None;
        let rows = rows.map(|(loaded, _)| {
            let (count_after, changes) = layout::changes(&mut partition, &loaded);
            if loaded.len() <= KNOWN_ROWS {
                let mut all = loaded;
                for key in &changes.deletes {
                    all.remove(key);
                }
                for entry in &changes.upserts {
                    all.insert(entry.key.clone(), entry.clone());
                }
                known = Some(all);
            }
            (count_after, changes)
        });
        let rows_changed = rows
            .as_ref()
            .is_some_and(|(_, changes)| !changes.is_empty());
        let changed = rows_changed
            || match &was {
                Some(was) => state(&partition, rows.as_ref()) != was.encoded,
                None => partition.revision() > 0 || !partition.is_empty(),
            };
        let write = changed.then(|| Write {
            announce: (partition.revision() != revision).then(|| partition.revision()),
            partition,
            was,
            rows,
            known,
            horizon,
        });
        Decided {
            answer,
            now,
            write,
            valid_until_us,
        }
    }

    /// Write what a call decided through `client` (`write_function.rs`),
    /// if the row is still exactly as decided on (none: it has no row) and
    /// the server's clock, read after the row's lock, is at least
    /// `at_least_us` and before `before_us`, announcing the new revision in
    /// the same statement when a waiter registered on the row.
    ///
    /// `before_us` is at most the moment this call gives up (on the
    /// server's clock): a statement held up past it by a stall (a lock on
    /// the table, a stopped server) and run later changes nothing, so a
    /// call answered `unavailable` is never applied afterwards. An update
    /// never waits for the row's lock (`SKIP LOCKED`): a locked row counts
    /// as a lost race, and the next try queues for the lock with a
    /// timeout.
    ///
    /// Written: the row is remembered as written. Not written: the row as it is now (`None`: no row) and the
    /// server's clock, read by the same statement.
    pub(super) async fn store(
        &self,
        client: &impl GenericClient,
        name: &str,
        now: u64,
        (at_least_us, before_us): (u64, u64),
        write: &mut Write,
    ) -> Result<Stored, StoreError> {
        let (state, collect_at) = self.seal(write, now);
        let payload = write
            .announce
            .zip(announced_name(name))
            .map(|(revision, hex)| format!("{revision}:{hex}"));
        let name_bytes = name.as_bytes();
        let decided_at = column(now);
        let was_version = write.was.as_ref().map(|was| was.version);
        let was_decided_at = write.was.as_ref().map(|was| column(was.decided_at));
        let was_state = write.was.as_ref().map(|was| was.encoded.as_slice());
        let (at_least, before) = (column(at_least_us), column(before_us));
        let channel = self.channel();
        let mut params: Vec<(&(dyn ToSql + Sync), Type)> = vec![
            (&name_bytes, Type::BYTEA),
            (&decided_at, Type::INT8),
            (&state, Type::BYTEA),
            (&collect_at, Type::INT8),
            (&was_version, Type::INT8),
            (&was_decided_at, Type::INT8),
            (&was_state, Type::BYTEA),
            (&at_least, Type::INT8),
            (&before, Type::INT8),
            (&channel, Type::TEXT),
            (&payload, Type::TEXT),
        ];
        let entry_rows = write
            .rows
            .as_ref()
            .map(|(_, changes)| rows::RowParams::new(changes));
        let retention = column(self.config.retention_ms);
        let sql = match &entry_rows {
            Some(r) => {
                params.extend([
                    (&r.keys as &(dyn ToSql + Sync), Type::BYTEA_ARRAY),
                    (&r.values, Type::BYTEA_ARRAY),
                    (&r.revisions, Type::INT8_ARRAY),
                    (&r.updated, Type::INT8_ARRAY),
                    (&r.expires, Type::INT8_ARRAY),
                    (&r.gone, Type::BYTEA_ARRAY),
                    (&retention, Type::INT8),
                    (&r.absent, Type::BYTEA_ARRAY),
                ]);
                rows::call(&self.config.table)
            }
            None => write_function::call(&self.config.table),
        };
        self.trip();
        let sent = Instant::now();
        let replies = client.query_typed(&sql, &params).await.map_err(refused)?;
        let row = replies
            .first()
            .ok_or_else(|| unavailable("no row in the reply"))?;
        let written: Option<i64> = row.try_get(0).map_err(unavailable)?;
        if written.is_none() && entry_rows.is_some() {
            // The row as it is now would lack its entry rows: the next try
            // reads it again.
            let clock_us = micros(row.try_get(1).map_err(unavailable)?)?;
            self.seen.observe_clock(sent, clock_us);
            self.seen.read_next(name);
            return Ok(Stored::Stale);
        }
        let Some(version) = written else {
            let (row, clock_us) = self.read_row(name, row, 1, sent)?;
            return Ok(Stored::Refused {
                row: row.map(Box::new),
                clock_us,
            });
        };
        let clock_us = micros(row.try_get(1).map_err(unavailable)?)?;
        self.seen.observe_clock(sent, clock_us);
        match (&write.rows, write.known.take()) {
            (None, _) => self
                .seen
                .remember_parts(name, version, &write.partition, state, now),
            (Some((count, _)), Some(known)) => {
                let loaded = Loaded {
                    version,
                    partition: write.partition.clone(),
                    encoded: state,
                    decided_at: now,
                    rows: Some(Box::new((known, *count))),
                    horizon: write.horizon.clone(),
                };
                self.seen.remember_rows(name, Some(&loaded));
            }
            (Some(_), None) => self.seen.read_next(name),
        }
        Ok(Stored::Written)
    }

    /// A write made ready to send: its feed trimmed to its bound in bytes,
    /// its state encoded, and when its row may be collected.
    pub(super) fn seal(&self, write: &mut Write, now: u64) -> (Vec<u8>, Option<i64>) {
        let partition = &mut write.partition;
        partition.trim_feed_to_bytes(FEED_BYTES.max(partition.live_bytes()));
        let collect_at = self.collect_at(partition, now);
        (state(partition, write.rows.as_ref()), collect_at)
    }

    /// The server's clock when a try that began at `begun` gives up: its
    /// clock read `clock_us` (after `begun`, before now), so this is no
    /// later than the moment the response timeout cuts the try.
    pub(super) fn deadline_us(&self, begun: Instant, clock_us: u64) -> u64 {
        let left = self.config.response_timeout.saturating_sub(begun.elapsed());
        clock_us.saturating_add(u64::try_from(left.as_micros()).unwrap_or(u64::MAX))
    }

    /// One try, begun at `begun`, on a pooled connection. First the
    /// speculation (`speculation.rs`): decided on the row as this process
    /// last saw it, written only if the row is still exactly that, in one
    /// statement. When it cannot be sent or does not apply: decide on the
    /// row as read (by the speculation's statement, else by a read) and
    /// write if the row is still as read. One statement when the
    /// speculation applies, else two (one when nothing changes); `None`
    /// when another call wrote first.
    async fn try_optimistic<T>(
        &self,
        name: &str,
        touches: &Touches,
        begun: Instant,
        decide: &mut impl FnMut(&mut Partition, u64) -> T,
    ) -> Result<Option<(T, u64)>, StoreError> {
        let client = self.client().await?;
        let (loaded, clock_us) = match self
            .speculate(&**client, name, touches, begun, decide)
            .await?
        {
            Speculated::Applied(answer, now) => return Ok(Some((answer, now))),
            Speculated::Read(loaded, clock_us) => (loaded.map(|loaded| *loaded), clock_us),
            Speculated::NotSent => self.load(&**client, name, touches).await?,
        };
        let Decided {
            answer,
            now,
            write,
            valid_until_us,
        } = self.decide(name, loaded, clock_us, decide);
        let Some(mut write) = write else {
            return Ok(Some((answer, now)));
        };
        let bounds = (0, self.deadline_us(begun, clock_us).min(valid_until_us));
        let stored = self.store(&**client, name, now, bounds, &mut write).await?;
        Ok(matches!(stored, Stored::Written).then_some((answer, now)))
    }

    /// One try holding the row's lock: in a transaction, lock the row
    /// (waiting behind its other lockers), read it and the clock, decide,
    /// write, commit. Nobody can write the row in between, so this loses a
    /// race only when the row did not exist and another call made it first.
    /// Five round trips: `BEGIN`, the lock (with the transaction's timeouts
    /// sent beside it), the read, the write, `COMMIT`.
    async fn try_locked<T>(
        &self,
        name: &str,
        touches: &Touches,
        begun: Instant,
        decide: &mut impl FnMut(&mut Partition, u64) -> T,
    ) -> Result<Option<(T, u64)>, StoreError> {
        let mut client = self.client().await?;
        self.trip();
        // Dropped before `commit` (an error, the response timeout), the
        // transaction rolls back before the connection serves anyone else.
        let tx = client.transaction().await.map_err(refused)?;
        // Neither a wait for the lock nor a holder stopped inside its
        // transaction (a paused process) may hold the row longer than a
        // call may take: the server ends both.
        let ms = self
            .config
            .response_timeout
            .saturating_sub(begun.elapsed())
            .as_millis()
            .max(1);
        let timeouts = format!(
            "SET LOCAL lock_timeout = {ms}; SET LOCAL idle_in_transaction_session_timeout = {ms}"
        );
        let lock = format!(
            "SELECT 1 FROM {} WHERE name = $1 FOR UPDATE",
            self.config.table
        );
        let name_bytes = name.as_bytes();
        self.trip();
        // Sent together, in this order, as one round trip.
        tokio::try_join!(
            async { tx.batch_execute(&timeouts).await.map_err(refused) },
            async {
                tx.query_typed(&lock, &[(&name_bytes, Type::BYTEA)])
                    .await
                    .map_err(refused)
            },
        )?;
        // Read after the lock is held, so the clock is read after the wait.
        let (loaded, clock_us) = self.load(&*tx, name, touches).await?;
        let Decided {
            answer,
            now,
            write,
            valid_until_us,
        } = self.decide(name, loaded, clock_us, decide);
        let Some(mut write) = write else {
            return Ok(Some((answer, now)));
        };
        let bounds = (0, self.deadline_us(begun, clock_us).min(valid_until_us));
        // A row remembered from here on is one this transaction may yet
        // roll back: harmless, as its version, drawn from the sequence,
        // then never appears in the table, so no speculation matches it.
        let stored = self.store(&*tx, name, now, bounds, &mut write).await?;
        if !matches!(stored, Stored::Written) {
            return Ok(None);
        }
        self.trip();
        tx.commit().await.map_err(refused)?;
        Ok(Some((answer, now)))
    }

    /// Run `decide` on the partition at the store's now, after recording
    /// due expiries, and write the result back if it changed anything.
    /// The first try is optimistic; once another call wrote first, every
    /// later try holds the row's lock. After the response timeout, the
    /// call is `unavailable` with nothing applied. Returns `decide`'s
    /// answer and the store's now.
    pub(super) async fn transact<T>(
        &self,
        name: &str,
        touches: Touches,
        mut decide: impl FnMut(&mut Partition, u64) -> T,
    ) -> Result<(T, u64), StoreError> {
        // Taken before the first try's timeout starts: the call's deadline
        // on the server is then never later than the moment it is cut.
        // Every try shares it: the response timeout bounds the call, not
        // each try (a try begun near the end gets only what is left).
        let begun = Instant::now();
        let mut races = 0u32;
        loop {
            let done = if races == 0 {
                self.bounded_from(
                    begun,
                    self.try_optimistic(name, &touches, begun, &mut decide),
                )
                .await?
            } else {
                self.bounded_from(begun, self.try_locked(name, &touches, begun, &mut decide))
                    .await?
            };
            if let Some(done) = done {
                return Ok(done);
            }
            races += 1;
            if begun.elapsed() > self.config.response_timeout {
                return Err(StoreError::Unavailable(format!(
                    "PostgreSQL: {races} writes to partition {name:?} raced this one within \
                     the response timeout; nothing of it was applied"
                )));
            }
        }
    }
}

/// What a call decided on one read of its partition.
pub(super) struct Decided<T> {
    pub(super) answer: T,
    /// The store time it was decided at.
    pub(super) now: u64,
    /// What to write back; `None` when the call changed nothing.
    pub(super) write: Option<Write>,
    /// The server's clock (µs) at which the first entry the decision saw
    /// live expires: a write of it must land before (`u64::MAX`: none, or
    /// a test clock).
    pub(super) valid_until_us: u64,
}

/// A partition to write back over the row it was decided on.
pub(super) struct Write {
    /// The partition as it is kept in its row (a partition of many: without
    /// its entries, which `rows` carries).
    pub(super) partition: Partition,
    /// The row as decided on; `None`: it had no row.
    pub(super) was: Option<Was>,
    /// The revision to announce to waiters, when the call made one.
    pub(super) announce: Option<u64>,
    /// A partition of many: the entry rows it holds now, and the rows to
    /// write back.
    pub(super) rows: Option<(u64, RowChanges)>,
    /// A partition of many of few loaded rows: the rows it holds after the
    /// write of those it loaded, for the next call's speculation.
    pub(super) known: Option<layout::Loaded>,
    /// The horizon of the rows it was decided on ([`Loaded::horizon`]),
    /// which the write leaves as it is: it touches only rows it loaded.
    pub(super) horizon: Option<Box<(u64, String)>>,
}

/// The state a partition's row keeps: its snapshot, or for a partition of
/// many, the count of its entry rows and its snapshot without them.
fn state(partition: &Partition, rows: Option<&(u64, RowChanges)>) -> Vec<u8> {
    match rows {
        Some((count, _)) => layout::join(*count, &partition.encode()),
        None => partition.encode(),
    }
}

/// The row a write was decided on, which it must still be.
pub(super) struct Was {
    version: i64,
    decided_at: u64,
    encoded: Vec<u8>,
}

/// What a write came to.
pub(super) enum Stored {
    /// Written (and remembered as written).
    Written,
    /// Not written: the row as it is now (`None`: none) and the server's
    /// clock in µs.
    Refused {
        row: Option<Box<Loaded>>,
        clock_us: u64,
    },
    /// Not written, a partition of many: its row must be read again, with
    /// its entry rows.
    Stale,
}
