//! The SQLite backend: the store contract in one SQLite database, a file
//! that every process of one host opens (or memory, for one process).
//!
//! This file holds the configuration, the connection and the table;
//! `store.rs` is the `Backend` implementation.
//!
//! **The mapping.** One table, `coord_partitions`: a row per partition, its
//! name (as bytes), its whole state — entries, revision, bounded change
//! feed, meters — as the snapshot `coord_component::memory::Partition`
//! reads and writes (the state machine the memory, NATS and PostgreSQL
//! backends run, so the semantics are the same by construction), and the
//! store time it was last decided at.
//!
//! **Every call is one transaction**, `BEGIN IMMEDIATE` to `COMMIT`: read
//! the row, decide, write it back if anything changed. SQLite lets one
//! writer in at a time across every process on the file, so no call sees a
//! half-made decision, and a process killed inside a transaction leaves
//! the file as the last commit had it (the journal rolls it back). The
//! file is in WAL mode with `synchronous = NORMAL`: a commit survives the
//! process, and a power loss may lose the last commits, never corrupt the
//! file. A call that cannot get the write lock within
//! [`SqliteConfig::busy_timeout`] (another process holding a long write)
//! is `unavailable`, as is every other failure (a read-only file, a full
//! disk).
//!
//! **Time** is this host's clock (every process on the file shares it),
//! never going back within a partition. Revisions are floored at the clock
//! in µs, so a file deleted and made again still issues fences above every
//! earlier one.
//!
//! **Waiting.** A write wakes the waiters of this process at once. Another
//! process has no server to tell it: a waiter checks its partition again
//! after 1 ms, then twice as long each time up to
//! [`SqliteConfig::recheck`] (50 ms by default), so a release in another
//! process reaches a waiter within about that long.
//!
//! **Collection.** A row records when its partition may go (its last live
//! entry's expiry plus the retention); every minute a backend deletes the
//! rows whose time has passed.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_host::backend::{DEFAULT_RETENTION_MS, StoreError};
use coord_host::clock::{Clock, ManualClock, SystemClock};
use rusqlite::{Connection, OpenFlags};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

mod store;
mod transact;

/// The longest pause between two checks of a waiter in another process
/// than the writer's, by default.
pub const RECHECK_MS: u64 = 50;

/// Where the database is and how to keep partitions there.
#[derive(Debug, Clone)]
pub struct SqliteConfig {
    /// The database file, made if missing; every process that opens it
    /// shares the state. `None`: a database in memory, for this process.
    pub path: Option<PathBuf>,
    /// Changes each watched partition's feed keeps.
    pub history: usize,
    /// How long a partition's row outlives its last live entry, in ms.
    pub retention_ms: u64,
    /// How long a call waits for another process's write to finish before
    /// it answers `unavailable`.
    pub busy_timeout: Duration,
    /// The longest pause between a waiter's checks of its partition.
    pub recheck: Duration,
    /// How often expired rows are deleted.
    pub collect_every: Duration,
    /// Tests only: take "now" from this clock instead of the host's.
    pub test_clock: Option<Arc<ManualClock>>,
}

impl SqliteConfig {
    /// The defaults for the database at `path` (`None`: in memory): 1024
    /// changes of history, ten minutes of retention, a 5 s busy timeout.
    pub fn new(path: Option<PathBuf>) -> Self {
        SqliteConfig {
            path,
            history: coord_component::memory::DEFAULT_HISTORY,
            retention_ms: DEFAULT_RETENTION_MS,
            busy_timeout: Duration::from_secs(5),
            recheck: Duration::from_millis(RECHECK_MS),
            collect_every: Duration::from_secs(60),
            test_clock: None,
        }
    }
}

/// The store on SQLite. One connection, used by one call at a time; calls
/// of other processes on the same file take turns with it.
pub struct SqliteBackend {
    config: SqliteConfig,
    connection: Arc<Mutex<Connection>>,
    clock: SystemClock,
    /// Writes of this process: (partition, revision).
    notifications: broadcast::Sender<(String, u64)>,
    asleep: Mutex<HashMap<String, usize>>,
    collecting: JoinHandle<()>,
}

impl Drop for SqliteBackend {
    fn drop(&mut self) {
        self.collecting.abort();
    }
}

/// A SQLite failure, as the store contract's `unavailable`.
fn unavailable(error: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("SQLite: {error}"))
}

impl SqliteBackend {
    /// Open (or make) the database and its table, in WAL mode.
    pub async fn open(config: SqliteConfig) -> Result<Self, StoreError> {
        let connection = match &config.path {
            Some(path) => Connection::open_with_flags(
                path,
                OpenFlags::SQLITE_OPEN_READ_WRITE
                    | OpenFlags::SQLITE_OPEN_CREATE
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            ),
            None => Connection::open_in_memory(),
        }
        .map_err(|e| match &config.path {
            Some(path) => unavailable(format!("opening {}: {e}", path.display())),
            None => unavailable(e),
        })?;
        connection
            .busy_timeout(config.busy_timeout)
            .map_err(unavailable)?;
        if config.path.is_some() {
            // journal_mode answers with the mode it set: a row to read.
            let mode: String = connection
                .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
                .map_err(unavailable)?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(unavailable(format!(
                    "the database would not take WAL mode (it is in {mode})"
                )));
            }
        }
        connection
            .execute_batch(
                "PRAGMA synchronous = NORMAL;
                 CREATE TABLE IF NOT EXISTS coord_partitions (
                   name BLOB PRIMARY KEY,
                   decided_at INTEGER NOT NULL,
                   state BLOB NOT NULL,
                   collect_at INTEGER
                 );
                 CREATE INDEX IF NOT EXISTS coord_partitions_collect_at
                   ON coord_partitions (collect_at);",
            )
            .map_err(unavailable)?;
        let connection = Arc::new(Mutex::new(connection));
        let (notifications, _) = broadcast::channel(1024);
        let collecting = tokio::spawn(collect(connection.clone(), config.clone()));
        Ok(SqliteBackend {
            config: SqliteConfig {
                history: config.history.max(1),
                ..config
            },
            connection,
            clock: SystemClock,
            notifications,
            asleep: Mutex::new(HashMap::new()),
            collecting,
        })
    }

    /// The store's now: the test clock's when a test gave one, else this
    /// host's.
    fn now_ms(&self) -> u64 {
        self.now_us() / 1000
    }

    /// [`Self::now_ms`] in microseconds, the floor of revisions.
    fn now_us(&self) -> u64 {
        match &self.config.test_clock {
            Some(clock) => clock.now_us(),
            None => self.clock.now_us(),
        }
    }

    /// `unavailable` when the database is open read-only (SQLite falls back
    /// to that when the file is not writable by this process): calls that
    /// only read still answer, every write would fail.
    fn writable(&self) -> Result<(), StoreError> {
        let connection = self.connection.lock().map_err(unavailable)?;
        if connection
            .is_readonly(rusqlite::MAIN_DB)
            .map_err(unavailable)?
        {
            return Err(unavailable(format!(
                "the database {} is read-only to this process: no call can write",
                self.config
                    .path
                    .as_ref()
                    .map_or("in memory".into(), |p| p.display().to_string())
            )));
        }
        Ok(())
    }

    /// How many `wait` calls of this backend are asleep on `partition`.
    pub fn waiters(&self, partition: &str) -> usize {
        self.asleep
            .lock()
            .map_or(0, |a| a.get(partition).copied().unwrap_or(0))
    }

    /// Count a waiter asleep on `partition` until the guard drops.
    fn asleep(&self, partition: &str) -> Asleep<'_> {
        if let Ok(mut asleep) = self.asleep.lock() {
            *asleep.entry(partition.to_string()).or_default() += 1;
        }
        Asleep {
            backend: self,
            partition: partition.to_string(),
        }
    }
}

/// A waiter counted asleep on a partition.
struct Asleep<'a> {
    backend: &'a SqliteBackend,
    partition: String,
}

impl Drop for Asleep<'_> {
    fn drop(&mut self) {
        if let Ok(mut asleep) = self.backend.asleep.lock()
            && let Some(n) = asleep.get_mut(&self.partition)
        {
            *n -= 1;
            if *n == 0 {
                asleep.remove(&self.partition);
            }
        }
    }
}

/// Delete the rows whose partitions may go, every `collect_every`.
async fn collect(connection: Arc<Mutex<Connection>>, config: SqliteConfig) {
    loop {
        tokio::time::sleep(config.collect_every).await;
        let now = match &config.test_clock {
            Some(clock) => clock.now_ms(),
            None => SystemClock.now_ms(),
        };
        let now = i64::try_from(now).unwrap_or(i64::MAX);
        let deleted = transact::blocking(|| {
            let connection = connection.lock().map_err(unavailable)?;
            connection
                .execute("DELETE FROM coord_partitions WHERE collect_at < ?1", [now])
                .map_err(unavailable)
        });
        if let Err(e) = deleted {
            tracing::warn!("collecting expired partitions failed: {e}");
        }
    }
}
