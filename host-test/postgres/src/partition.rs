//! One partition on PostgreSQL: read its row and the server's clock in one
//! statement, decide with the in-memory state machine, and write the result
//! back only if nobody wrote in between (the row's version).

use std::time::Instant;

use coord_component::keys::is_unwatched;
use coord_component::memory::Partition;
use coord_host::backend::StoreError;
use deadpool_postgres::Pool;
use tokio_postgres::types::Type;

use super::{PostgresBackend, announced_name, refused, unavailable};

/// The most bytes of feed a partition's row carries beyond its live
/// entries: every write rewrites the whole row, so the feed is bounded in
/// bytes as well as in changes (the rule the NATS backend follows).
pub const FEED_BYTES: usize = 16 * 1024;

/// The server's clock in milliseconds, as every read selects it.
const CLOCK: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// A partition as read: its row's version, its state, its encoding (to tell
/// whether a call changed it) and the latest store time it was decided at.
struct Loaded {
    version: i64,
    partition: Partition,
    encoded: Vec<u8>,
    decided_at: u64,
}

/// The server's now, in ms.
pub(super) async fn server_now(pool: &Pool) -> Result<u64, StoreError> {
    let client = pool.get().await.map_err(unavailable)?;
    let row = client
        .query_typed(&format!("SELECT {CLOCK}"), &[])
        .await
        .map_err(refused)?;
    let now: i64 = row
        .first()
        .ok_or_else(|| unavailable("no clock in the reply"))?
        .try_get(0)
        .map_err(unavailable)?;
    u64::try_from(now).map_err(|_| unavailable(format!("the server's clock reads {now}")))
}

/// A store time as the table keeps it.
fn column(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

impl PostgresBackend {
    /// The store's now: the server's clock, or the test clock.
    pub(super) async fn clock(&self) -> Result<u64, StoreError> {
        self.trip();
        let now = self.bounded(server_now(&self.pool)).await?;
        Ok(self.test_now().unwrap_or(now))
    }

    /// `attempt`, or `unavailable` once the response timeout passes.
    pub(super) async fn bounded<T>(
        &self,
        attempt: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let timeout = self.config.response_timeout;
        tokio::time::timeout(timeout, attempt)
            .await
            .map_err(|_| unavailable(format!("no answer within {timeout:?}")))?
    }

    /// The partition's row, if it has one, and the server's now.
    async fn load(&self, name: &str) -> Result<(Option<Loaded>, u64), StoreError> {
        let sql = format!(
            "SELECT c.now_ms, t.version, t.decided_at, t.state \
             FROM (SELECT {CLOCK} AS now_ms) c LEFT JOIN {} t ON t.name = $1",
            self.config.table
        );
        self.trip();
        let client = self.client().await?;
        let rows = client
            .query_typed(&sql, &[(&name.as_bytes(), Type::BYTEA)])
            .await
            .map_err(refused)?;
        let row = rows
            .first()
            .ok_or_else(|| unavailable("no row in the reply"))?;
        let now: i64 = row.try_get(0).map_err(unavailable)?;
        let now = u64::try_from(now).map_err(|_| unavailable(format!("the clock reads {now}")))?;
        let version: Option<i64> = row.try_get(1).map_err(unavailable)?;
        let Some(version) = version else {
            return Ok((None, now));
        };
        let decided_at: i64 = row.try_get(2).map_err(unavailable)?;
        let encoded: Vec<u8> = row.try_get(3).map_err(unavailable)?;
        let partition = Partition::decode(&encoded).map_err(|e| {
            unavailable(format!("the row of {name:?} is not a coord partition: {e}"))
        })?;
        Ok((
            Some(Loaded {
                version,
                partition,
                encoded,
                decided_at: u64::try_from(decided_at).unwrap_or(0),
            }),
            now,
        ))
    }

    /// When the partition's row may be deleted: its last live entry's
    /// expiry plus the retention (none while an entry never expires).
    fn collect_at(&self, partition: &Partition, now: u64) -> Option<i64> {
        let lives_until = partition.lives_until()?;
        let retention = if partition.revision() > 0 {
            self.config.retention_ms
        } else {
            0
        };
        Some(column(lives_until.max(now).saturating_add(retention)))
    }

    /// Write `partition`, decided at `now`, if its row is still at
    /// `version` (none: it has no row); announce `revision` when given.
    /// `Ok(false)`: somebody wrote first.
    async fn store(
        &self,
        name: &str,
        partition: &mut Partition,
        now: u64,
        version: Option<i64>,
        announce: Option<u64>,
    ) -> Result<bool, StoreError> {
        partition.trim_feed_to_bytes(FEED_BYTES.max(partition.live_bytes()));
        let state = partition.encode();
        let collect_at = self.collect_at(partition, now);
        let t = &self.config.table;
        let write = match version {
            // $5 is 0 here: every statement takes the same parameters.
            None => format!(
                "INSERT INTO {t} (name, version, decided_at, state, collect_at) \
                 SELECT $1, nextval('{t}_versions'), $2, $3, $4 WHERE $5 = 0 \
                 ON CONFLICT (name) DO NOTHING RETURNING version"
            ),
            Some(_) => format!(
                "UPDATE {t} SET version = nextval('{t}_versions'), decided_at = $2, \
                 state = $3, collect_at = $4 WHERE name = $1 AND version = $5 \
                 RETURNING version"
            ),
        };
        let payload = announce
            .zip(announced_name(name))
            .map(|(revision, hex)| format!("{revision}:{hex}"));
        // The announcement rides on the write: sent only if it applied.
        let sql = match payload {
            Some(_) => format!("WITH w AS ({write}) SELECT pg_notify($6, $7) FROM w"),
            None => format!("WITH w AS ({write}) SELECT 1 FROM w"),
        };
        let decided_at = column(now);
        let version = version.unwrap_or(0);
        let channel = self.channel();
        let name = name.as_bytes();
        let mut params: Vec<(&(dyn tokio_postgres::types::ToSql + Sync), Type)> = vec![
            (&name, Type::BYTEA),
            (&decided_at, Type::INT8),
            (&state, Type::BYTEA),
            (&collect_at, Type::INT8),
            (&version, Type::INT8),
        ];
        if let Some(payload) = &payload {
            params.push((&channel, Type::TEXT));
            params.push((payload, Type::TEXT));
        }
        self.trip();
        let client = self.client().await?;
        let rows = client.query_typed(&sql, &params).await.map_err(refused)?;
        Ok(!rows.is_empty())
    }

    /// Run `decide` on the partition at the store's now, after recording
    /// due expiries, and write the result back if it changed anything —
    /// again from a fresh read whenever another call wrote first, until the
    /// response timeout. Returns `decide`'s answer and the store's now.
    pub(super) async fn transact<T>(
        &self,
        name: &str,
        mut decide: impl FnMut(&mut Partition, u64) -> T,
    ) -> Result<(T, u64), StoreError> {
        let started = Instant::now();
        let mut races = 0u32;
        loop {
            let (loaded, clock) = self.bounded(self.load(name)).await?;
            let clock = self.test_now().unwrap_or(clock);
            let (mut partition, version, before, now) = match loaded {
                Some(l) => (
                    l.partition,
                    Some(l.version),
                    Some(l.encoded),
                    clock.max(l.decided_at),
                ),
                // An unwatched partition's feed is never read: keep one
                // change, not the history.
                None => {
                    let history = if is_unwatched(name) {
                        1
                    } else {
                        self.config.history
                    };
                    (Partition::new(history), None, None, clock)
                }
            };
            let revision = partition.revision();
            partition.sweep(now);
            let answer = decide(&mut partition, now);
            let changed = match &before {
                Some(before) => partition.encode() != *before,
                None => partition.revision() > 0 || !partition.is_empty(),
            };
            if !changed {
                return Ok((answer, now));
            }
            let announce = (partition.revision() != revision).then(|| partition.revision());
            let stored = self
                .bounded(self.store(name, &mut partition, now, version, announce))
                .await?;
            if stored {
                return Ok((answer, now));
            }
            races += 1;
            if started.elapsed() > self.config.response_timeout {
                return Err(StoreError::Unavailable(format!(
                    "PostgreSQL: {races} writes to partition {name:?} raced this one within \
                     the response timeout; nothing of it was applied"
                )));
            }
        }
    }
}
