//! One round trip for a write to a partition this process saw last.
//!
//! A call normally reads its partition's row and the server's clock, decides
//! in Rust, then writes: two round trips. But the process that wrote a row
//! last usually knows it already, and can estimate the server's clock from
//! its earlier replies. So a call first *speculates*: it decides on the row
//! as this process last read or wrote it, at the estimated clock, and sends
//! the write with everything the decision relied on as its condition, in one
//! statement:
//!
//! - the row is exactly as remembered (its version, its time and its whole
//!   state, compared byte for byte: a version alone could be issued again by
//!   a sequence restored from a backup), or, for a partition this process
//!   knows nothing of, there is no row (`ON CONFLICT DO NOTHING`);
//! - the server's clock, read in the statement, has reached the millisecond
//!   the call decided at (no decision is taken in the server's future), and
//!   has not reached the expiry of any entry the decision saw live, nor the
//!   call's deadline.
//!
//! When all hold, the write applies and the call is done: the decision is
//! the one a read at that moment would have led to, at a time within the
//! call. When one fails, nothing is written, and the same statement returns
//! the row as it is and the server's clock, so the call decides again on
//! those and writes as usual: two round trips, as without speculation. The
//! rules run in one place (the state machine every store shares); the server
//! only compares.
//!
//! **The clock estimate** is an upper bound on the server's clock: the
//! smallest `server clock − local time when the statement was sent` seen in
//! the last second (the server read its clock after the statement left), so
//! a decision is never dated before the call began. The server's check that
//! its clock reached the decided millisecond catches the rest. The call's
//! deadline is set from a lower bound (the same less that statement's round
//! trip), so a statement held up past it applies nothing, as in
//! `partition.rs`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use coord_component::keys::may_hold_many;
use coord_component::memory::Partition;
use coord_host::backend::StoreError;
use coord_host::backend::rows::Touches;
use tokio_postgres::GenericClient;

use super::PostgresBackend;
use super::partition::{Decided, Loaded, Stored};

/// The largest state (encoded, in bytes) a backend remembers a row by: a
/// speculation sends it back as its condition, so a larger row is read
/// instead. Locks, leases and rate limits stay far below it.
pub const SEEN_BYTES: usize = 4 * 1024;

/// The most entry rows of a partition of many (a semaphore) a backend
/// remembers to speculate on: all its rows when it has at most this many
/// (the read loads them all, `rows.rs`), else those a call loaded.
pub const KNOWN_ROWS: usize = 32;

/// How many partitions' rows a backend remembers; past it, it forgets one
/// (any) for each new one.
pub const SEEN_ROWS: usize = 4096;

/// How long a bound on the server's clock is kept before a looser, newer
/// one replaces it (the two clocks drift apart; a bound this young is off
/// by microseconds at most).
const CLOCK_BOUND_AGE: Duration = Duration::from_secs(1);

/// What this process knows of the server: rows as it last read or wrote
/// them, and a bound on the server's clock.
pub(super) struct Seen {
    /// By partition: the row (`None`: it exists, but is larger than
    /// [`SEEN_BYTES`]).
    rows: Mutex<HashMap<String, Option<Loaded>>>,
    /// The bound on the server's clock, from the statement whose reply gave
    /// the tightest one.
    clock: Mutex<Option<ClockBound>>,
    /// Local times are µs since this.
    started: Instant,
}

/// `server µs − local µs` as one reply bounds it.
#[derive(Clone, Copy)]
struct ClockBound {
    /// The server's clock less the local time the statement was sent: at
    /// least the true difference.
    upper: i64,
    /// The statement's round trip in µs: the true difference is at least
    /// `upper − round_trip`.
    round_trip: i64,
    /// When it was observed.
    at: Instant,
}

/// What a partition's speculation knows of its row.
enum Known {
    /// Nothing: speculate that it has none.
    Nothing,
    /// It exists but is too large to remember (or, a partition of many, is
    /// not known whole): read it.
    Large,
    /// As last read or written.
    Row(Box<Loaded>),
}

impl Seen {
    pub(super) fn new() -> Self {
        Seen {
            rows: Mutex::new(HashMap::new()),
            clock: Mutex::new(None),
            started: Instant::now(),
        }
    }

    fn local_us(&self, at: Instant) -> i64 {
        i64::try_from(at.saturating_duration_since(self.started).as_micros()).unwrap_or(i64::MAX)
    }

    /// A reply to a statement sent at `sent` read the server's clock as
    /// `server_us`.
    pub(super) fn observe_clock(&self, sent: Instant, server_us: u64) {
        let observed = ClockBound {
            upper: i64::try_from(server_us)
                .unwrap_or(i64::MAX)
                .saturating_sub(self.local_us(sent)),
            round_trip: i64::try_from(sent.elapsed().as_micros()).unwrap_or(i64::MAX),
            at: Instant::now(),
        };
        let Ok(mut clock) = self.clock.lock() else {
            return;
        };
        let keep = matches!(*clock, Some(best) if best.upper <= observed.upper
            && best.at.elapsed() < CLOCK_BOUND_AGE);
        if !keep {
            *clock = Some(observed);
        }
    }

    /// Move the estimate of the server's clock by `by_us`, kept as the
    /// tightest bound until a reply gives a tighter one or it ages out.
    pub(super) fn shift_clock_estimate(&self, by_us: i64) {
        if let Ok(mut clock) = self.clock.lock()
            && let Some(bound) = clock.as_mut()
        {
            bound.upper = bound.upper.saturating_add(by_us);
            bound.at = Instant::now();
        }
    }

    /// The server's clock at local time `now`, bounded from above and from
    /// below (µs); `None` before any reply.
    fn estimate_us(&self, now: Instant) -> Option<(u64, u64)> {
        let bound = (*self.clock.lock().ok()?)?;
        let local = self.local_us(now);
        let upper = u64::try_from(local.saturating_add(bound.upper)).ok()?;
        let lower = local
            .saturating_add(bound.upper)
            .saturating_sub(bound.round_trip);
        Some((upper, u64::try_from(lower).unwrap_or(0)))
    }

    fn known(&self, name: &str) -> Known {
        let Ok(rows) = self.rows.lock() else {
            return Known::Nothing;
        };
        match rows.get(name) {
            None => Known::Nothing,
            Some(None) => Known::Large,
            Some(Some(row)) => Known::Row(Box::new(row.clone())),
        }
    }

    /// Remember `row` as `name`'s.
    pub(super) fn remember(&self, name: &str, row: &Loaded) {
        let kept = (row.encoded.len() <= SEEN_BYTES).then(|| row.clone());
        self.keep(name, kept);
    }

    /// Remember a partition of many as read or written (`None`: it has no
    /// row) with the entry rows in `row` (every row, or those loaded, with
    /// the horizon before which they decide a call), if there are at most
    /// [`KNOWN_ROWS`] of them; else remember only that it must be read.
    pub(super) fn remember_rows(&self, name: &str, row: Option<&Loaded>) {
        let Some(row) = row else {
            self.forget(name);
            return;
        };
        match row.rows.as_deref() {
            Some((rows, count)) if rows.len() <= KNOWN_ROWS => {
                // Known in part, the rows decide a call only while the
                // first row to expire of all is among them, unchanged.
                let whole = rows.len() as u64 == *count;
                let first_kept = row.horizon.as_deref().is_some_and(|(at, key)| {
                    rows.get(key).is_some_and(|e| e.expires_at == Some(*at))
                });
                if whole || first_kept {
                    self.keep(name, Some(row.clone()));
                } else {
                    self.read_next(name);
                }
            }
            _ => self.read_next(name),
        }
    }

    /// `name` has a row that the next call must read (a partition of many
    /// not known whole): it does not speculate, not even that there is no
    /// row.
    pub(super) fn read_next(&self, name: &str) {
        self.keep(name, None);
    }

    /// Remember the row `name` was written as.
    pub(super) fn remember_parts(
        &self,
        name: &str,
        version: i64,
        partition: &Partition,
        encoded: Vec<u8>,
        decided_at: u64,
    ) {
        let kept = (encoded.len() <= SEEN_BYTES).then(|| Loaded {
            version,
            partition: partition.clone(),
            encoded,
            decided_at,
            rows: None,
            horizon: None,
        });
        self.keep(name, kept);
    }

    fn keep(&self, name: &str, row: Option<Loaded>) {
        let Ok(mut rows) = self.rows.lock() else {
            return;
        };
        if rows.len() >= SEEN_ROWS && !rows.contains_key(name) {
            let any = rows.keys().next().cloned();
            if let Some(any) = any {
                rows.remove(&any);
            }
        }
        rows.insert(name.to_string(), row);
    }

    /// Forget `name`'s row (it has none now).
    pub(super) fn forget(&self, name: &str) {
        if let Ok(mut rows) = self.rows.lock() {
            rows.remove(name);
        }
    }
}

/// What a speculation came to.
pub(super) enum Speculated<T> {
    /// Written: the answer, and the store time it was decided at.
    Applied(T, u64),
    /// Not written: the row as the statement found it (`None`: no row) and
    /// the server's clock in µs, to decide on again.
    Read(Option<Box<Loaded>>, u64),
    /// Nothing to decide on: no clock seen yet, a row too large to
    /// remember, a decision that writes nothing (which only a read can
    /// confirm), or a partition of many whose write was refused (its row
    /// must be read with its entry rows).
    NotSent,
}

impl PostgresBackend {
    /// Decide on the row as last seen, at the estimated clock, and write it
    /// in one statement if the row and the clock are as the decision
    /// assumed (see the module's comment).
    pub(super) async fn speculate<T>(
        &self,
        client: &impl GenericClient,
        name: &str,
        touches: &Touches,
        begun: Instant,
        decide: &mut impl FnMut(&mut Partition, u64) -> T,
    ) -> Result<Speculated<T>, StoreError> {
        let sent = Instant::now();
        let Some((estimate_us, at_least_us)) = self.seen.estimate_us(sent) else {
            return Ok(Speculated::NotSent);
        };
        let seen = match self.seen.known(name) {
            Known::Large => return Ok(Speculated::NotSent),
            Known::Nothing => None,
            // A partition of many is remembered only with every entry row
            // (`remember_rows`); one with no row has none.
            Known::Row(row) if may_hold_many(name) && row.rows.is_none() => {
                return Ok(Speculated::NotSent);
            }
            // Known in part, a partition of many decides one key's call as
            // a read would: every row due before the horizon is known, the
            // first to expire is the first known, and a key written as new
            // is checked to have no row. Not a check or a listing, which
            // answer from rows it does not know.
            Known::Row(row)
                if row
                    .rows
                    .as_deref()
                    .is_some_and(|(rows, count)| rows.len() as u64 != *count)
                    && !matches!(touches, Touches::Key(_)) =>
            {
                return Ok(Speculated::NotSent);
            }
            Known::Row(row) => Some(*row),
        };
        // Known in part, a key this process did not load was decided on as
        // absent (a release or extend of it answered as if it were gone):
        // the server must find it absent too, or the write is refused and
        // the call reads it.
        let unloaded_key = match (touches, seen.as_ref().and_then(|row| row.rows.as_deref())) {
            (Touches::Key(key), Some((rows, count)))
                if rows.len() as u64 != *count && !rows.contains_key(key) =>
            {
                Some(key.clone())
            }
            _ => None,
        };
        let Decided {
            answer,
            now,
            write,
            valid_until_us,
        } = self.decide(name, seen, estimate_us, decide);
        let Some(mut write) = write else {
            return Ok(Speculated::NotSent);
        };
        if let (Some(key), Some((_, changes))) = (unloaded_key, write.rows.as_mut())
            && !changes.new_keys.contains(&key)
        {
            changes.new_keys.push(key);
        }
        // The clock has reached the decided millisecond, and not the first
        // expiry the decision saw, nor the deadline. (A test clock decides
        // alone what time it is: the server's is only held to the
        // deadline.)
        let decided_ms_us = match self.test_now() {
            Some(_) => 0,
            None => estimate_us / 1000 * 1000,
        };
        let bounds = (
            decided_ms_us,
            self.deadline_us(begun, at_least_us).min(valid_until_us),
        );
        match self.store(client, name, now, bounds, &mut write).await? {
            Stored::Written => Ok(Speculated::Applied(answer, now)),
            Stored::Refused { row, clock_us } => Ok(Speculated::Read(row, clock_us)),
            // Refused, and the row it returned lacks the entry rows.
            Stored::Stale => Ok(Speculated::NotSent),
        }
    }
}
