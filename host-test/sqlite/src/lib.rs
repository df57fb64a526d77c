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
//! store time it was last decided at. A partition that may hold many
//! entries (a semaphore's permits) keeps each entry as a row of a second
//! table, `coord_entries`, so that a call reads and writes only the
//! entries it touches (`rows.rs`).
//!
//! **Every call is one transaction**, `BEGIN IMMEDIATE` to `COMMIT`: read
//! the row, decide, write it back if anything changed. A read (`get`,
//! `list`, `changes`, a wait's check) begins `DEFERRED` instead and writes
//! nothing, so another process's long write does not hold it back and a
//! file this process may only read still answers; only when an entry is
//! due to expire does it run as a write, to record the expiry before it
//! answers (`transact.rs`). SQLite lets one
//! writer in at a time across every process on the file, so no call sees a
//! half-made decision, and a process killed inside a transaction leaves
//! the file as the last commit had it (the journal rolls it back). The
//! file is in WAL mode with `synchronous = NORMAL`: a commit survives the
//! process, and a power loss may lose the last commits, never corrupt the
//! file. A call that cannot start and get the write lock within
//! [`SqliteConfig::busy_timeout`] of its arrival (this process's calls
//! before it, another process holding a long write) is `unavailable`, as
//! is every other failure (a read-only file, a full disk, a file deleted
//! under the process: `file.rs`).
//!
//! **One thread owns the connection** and runs the calls back to back in
//! arrival order; a caller awaits its call's answer and may give up (its
//! deadline): a call not started by then never runs.
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
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coord_host::backend::{DEFAULT_RETENTION_MS, StoreError};
use coord_host::clock::{Clock, ManualClock, SystemClock};
use rusqlite::Connection;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

mod file;
mod rows;
mod store;
mod transact;

use file::FileId;

/// The longest pause between two checks of a waiter in another process
/// than the writer's, by default.
pub const RECHECK_MS: u64 = 50;

/// What SQLite says of a write on a connection it opened read-only (it
/// does so, for good, when the file could not be written at open; and
/// `sqlite3_db_readonly` does not always tell).
const READ_ONLY_ERROR: &str = "attempt to write a readonly database";

/// How often a connection that SQLite opened read-only (the file was not
/// writable then) is opened again, to see whether the file takes writes now.
const REOPEN_EVERY: Duration = Duration::from_secs(1);

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
    /// The longest a call waits, in all, before it answers `unavailable`:
    /// for this process's calls before it (one connection takes one call
    /// at a time) and for another process's write to finish.
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

/// The store on SQLite. One connection, owned by a thread of its own that
/// runs the calls one at a time in arrival order, so that the caller's
/// task stays free to give up at its deadline; calls of other processes on
/// the same file take turns with it.
pub struct SqliteBackend {
    shared: Arc<Shared>,
    /// The calls for the connection's thread. A call that cannot start
    /// within the busy timeout answers `unavailable`.
    calls: Calls,
    /// Writes of this process: (partition, revision).
    notifications: broadcast::Sender<(String, u64)>,
    asleep: Mutex<HashMap<String, usize>>,
    collecting: JoinHandle<()>,
}

/// What a call needs on the connection's thread besides the connection.
struct Shared {
    config: SqliteConfig,
    clock: SystemClock,
    /// The identity of the file opened (none in memory).
    opened: Option<FileId>,
    /// Set once the path no longer names the file opened: why every call
    /// is refused from then on.
    lost: Mutex<Option<String>>,
    /// Set when a write failed as SQLite's read-only error: the
    /// connection may have been opened read-only, and is opened again.
    read_only: std::sync::atomic::AtomicBool,
    /// When a read-only connection was last opened again.
    reopened: Mutex<Option<Instant>>,
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
    /// Open (or make) the database and its tables, in WAL mode.
    pub async fn open(config: SqliteConfig) -> Result<Self, StoreError> {
        let connection = file::connect(&config)?;
        let opened = match &config.path {
            Some(path) => Some(FileId::of(path).map_err(|e| {
                unavailable(format!(
                    "the database {} cannot be checked: {e}",
                    path.display()
                ))
            })?),
            None => None,
        };
        let shared = Arc::new(Shared {
            config: SqliteConfig {
                history: config.history.max(1),
                ..config
            },
            clock: SystemClock,
            opened,
            lost: Mutex::new(None),
            read_only: std::sync::atomic::AtomicBool::new(false),
            reopened: Mutex::new(None),
        });
        let calls = Calls::start(connection, shared.clone())?;
        let (notifications, _) = broadcast::channel(1024);
        let collecting = tokio::spawn(collect(calls.clone(), shared.clone()));
        Ok(SqliteBackend {
            shared,
            calls,
            notifications,
            asleep: Mutex::new(HashMap::new()),
            collecting,
        })
    }

    /// The store's now: the test clock's when a test gave one, else this
    /// host's.
    fn now_ms(&self) -> u64 {
        self.shared.now_us() / 1000
    }

    /// Run `work` on the connection, on the connection's thread, within
    /// the busy timeout from now: the wait for this process's earlier calls
    /// and then for another process's write lock together.
    async fn with_connection<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Shared, &mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.with_connection_within(self.shared.config.busy_timeout, work)
            .await
    }

    /// [`SqliteBackend::with_connection`] within `bound` (at most the busy
    /// timeout) rather than the whole busy timeout: a `wait`'s checks keep
    /// to what is left of the wait.
    async fn with_connection_within<T: Send + 'static>(
        &self,
        bound: Duration,
        work: impl FnOnce(&Shared, &mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let bound = bound.min(self.shared.config.busy_timeout);
        run(&self.calls, &self.shared, bound, work).await
    }

    /// Whether the file takes a write now: the probe row rewritten and
    /// committed. A read-only file, a full disk, an immutable write-ahead
    /// log or a write lock held past the busy timeout: no.
    async fn probe(&self) -> Result<(), StoreError> {
        self.with_connection(|shared, connection| {
            if connection
                .is_readonly(rusqlite::MAIN_DB)
                .map_err(unavailable)?
            {
                return Err(unavailable(format!(
                    "the database {} is read-only to this process: no call can write",
                    shared.place()
                )));
            }
            let now = i64::try_from(shared.now_us() / 1000).unwrap_or(i64::MAX);
            connection
                .execute(
                    "INSERT OR REPLACE INTO coord_probe (id, probed_at) VALUES (1, ?1)",
                    [now],
                )
                .map_err(|e| unavailable(format!("a write to {} failed: {e}", shared.place())))?;
            Ok(())
        })
        .await
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

/// A call for the connection's thread: it runs with the connection (none
/// while a read-only one was closed and no new one could be opened yet).
type Call = Box<dyn FnOnce(&Shared, &mut Option<Connection>) + Send>;

/// The way to the thread that owns the connection.
#[derive(Clone)]
struct Calls(std::sync::mpsc::Sender<Call>);

impl Calls {
    /// Start the connection's thread; it ends when every sender is gone.
    fn start(connection: Connection, shared: Arc<Shared>) -> Result<Calls, StoreError> {
        let (sender, calls) = std::sync::mpsc::channel::<Call>();
        std::thread::Builder::new()
            .name("coord-sqlite".into())
            .spawn(move || {
                let mut connection = Some(connection);
                // Back to back while calls queue: no thread is woken
                // between two of them.
                for call in calls {
                    call(&shared, &mut connection);
                }
            })
            .map_err(|e| unavailable(format!("starting the connection's thread: {e}")))?;
        Ok(Calls(sender))
    }
}

/// Run `work` on the connection as [`SqliteBackend::with_connection`] does,
/// within `bound` (the busy timeout, or less).
async fn run<T: Send + 'static>(
    calls: &Calls,
    shared: &Arc<Shared>,
    bound: Duration,
    work: impl FnOnce(&Shared, &mut Connection) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    let started = Instant::now();
    shared.still_the_file()?;
    let (answer, answered) = tokio::sync::oneshot::channel();
    // Once started, the work runs to its end even if the caller has given
    // up (its deadline passed): a transaction is never cut in the middle.
    // A call that waited its whole busy timeout for the calls before it
    // does not start.
    let call: Call = Box::new(move |shared, turn| {
        if answer.is_closed() {
            return;
        }
        let _ = answer.send(run_now(shared, turn, started, bound, work));
    });
    calls
        .0
        .send(call)
        .map_err(|_| unavailable("the connection's thread has ended"))?;
    // The call itself keeps to the busy timeout (it does not start past
    // it, and SQLite waits for the write lock no longer than what is
    // left), so its answer is the truth: an `unavailable` for a busy
    // timeout wrote nothing. A caller that gives up meanwhile drops this
    // wait, and a call not started yet is then never run. But SQLite's
    // busy timeout bounds only lock waits: a call stuck in the disk (a
    // frozen or hung file system) holds the thread, and every call queued
    // behind it, for as long as the disk does. So the wait for the answer
    // ends [`STALLED_AFTER`] past the busy timeout whatever the thread
    // does; that answer may have been written, as the contract allows of
    // `unavailable`.
    let wait = bound
        .saturating_sub(started.elapsed())
        .saturating_add(STALLED_AFTER);
    match tokio::time::timeout(wait, answered).await {
        Ok(answer) => {
            answer.unwrap_or_else(|_| Err(unavailable("the connection's thread has ended")))
        }
        Err(_) => Err(unavailable(format!(
            "no answer within its {} ms bound (the busy timeout, or what was left of a wait) \
             and {} ms more: the database file's \
             disk is stalled (the call may still apply)",
            bound.as_millis(),
            STALLED_AFTER.as_millis()
        ))),
    }
}

/// How long past its busy timeout a call waits for the connection's
/// thread before it answers `unavailable` anyway: the time a call that
/// started just inside its timeout may take to finish on a healthy disk,
/// with room to spare.
pub const STALLED_AFTER: Duration = Duration::from_secs(1);

/// `work` on the connection's thread, with what is left of the busy
/// timeout since the call was `started`.
fn run_now<T>(
    shared: &Shared,
    turn: &mut Option<Connection>,
    started: Instant,
    bound: Duration,
    work: impl FnOnce(&Shared, &mut Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    shared.still_the_file()?;
    let left = bound.saturating_sub(started.elapsed());
    if left.is_zero() {
        return Err(unavailable(format!(
            "its {} ms bound (the busy timeout, or what was left of a wait) passed before \
             the call could start",
            bound.as_millis()
        )));
    }
    shared.reopen_if_read_only(turn);
    let Some(connection) = turn.as_mut() else {
        return Err(unavailable(format!(
            "the database {} is not open: it was read-only, and opening it again failed",
            shared.place()
        )));
    };
    connection.busy_timeout(left).map_err(unavailable)?;
    let done = work(shared, connection);
    if let Err(StoreError::Unavailable(why)) = &done
        && why.contains(READ_ONLY_ERROR)
    {
        shared.read_only.store(true, Ordering::Relaxed);
    }
    done
}

impl Shared {
    /// [`SqliteBackend::now_ms`] in microseconds, the floor of revisions.
    fn now_us(&self) -> u64 {
        match &self.config.test_clock {
            Some(clock) => clock.now_us(),
            None => self.clock.now_us(),
        }
    }

    /// The database, for messages.
    fn place(&self) -> String {
        self.config
            .path
            .as_ref()
            .map_or("in memory".into(), |p| p.display().to_string())
    }

    /// `unavailable`, for good, once the path no longer names the file
    /// this backend opened.
    fn still_the_file(&self) -> Result<(), StoreError> {
        let mut lost = self.lost.lock().map_err(unavailable)?;
        if let Some(why) = lost.as_ref() {
            return Err(unavailable(why));
        }
        if let (Some(path), Some(opened)) = (&self.config.path, self.opened)
            && let Some(why) = file::moved(path, opened)
        {
            tracing::error!(target: "coord::store", "{why}");
            *lost = Some(why.clone());
            return Err(unavailable(why));
        }
        Ok(())
    }

    /// A connection SQLite opened read-only (the file was not writable
    /// then) stays so: close it and open another, at most every
    /// [`REOPEN_EVERY`]. The old one is closed first: a new connection of
    /// the same process would share its read-only view of the file. When
    /// the new one cannot be opened, there is none, and calls answer
    /// `unavailable` until one can.
    fn reopen_if_read_only(&self, connection: &mut Option<Connection>) {
        let read_only = self.read_only.load(Ordering::Relaxed)
            || connection
                .as_ref()
                .is_none_or(|c| c.is_readonly(rusqlite::MAIN_DB).unwrap_or(false));
        if self.config.path.is_none() || !read_only {
            return;
        }
        let Ok(mut reopened) = self.reopened.lock() else {
            return;
        };
        if reopened.is_some_and(|at| at.elapsed() < REOPEN_EVERY) {
            return;
        }
        *reopened = Some(Instant::now());
        drop(connection.take());
        match file::connect(&self.config) {
            Ok(fresh) => {
                self.read_only.store(false, Ordering::Relaxed);
                tracing::info!(
                    target: "coord::store",
                    "the database {} was read-only to this process: opened again",
                    self.place()
                );
                *connection = Some(fresh);
            }
            Err(e) => tracing::warn!(
                target: "coord::store",
                "the database {} could not be opened again: {e}",
                self.place()
            ),
        }
    }
}

/// Delete the rows whose partitions may go, every `collect_every`.
async fn collect(calls: Calls, shared: Arc<Shared>) {
    loop {
        tokio::time::sleep(shared.config.collect_every).await;
        let deleted = run(
            &calls,
            &shared,
            shared.config.busy_timeout,
            |shared, connection| {
                let now = i64::try_from(shared.now_us() / 1000).unwrap_or(i64::MAX);
                // A partition's entry rows go with it, in one transaction.
                let tx = connection.transaction().map_err(unavailable)?;
                tx.execute(
                    "DELETE FROM coord_entries WHERE partition IN \
                 (SELECT name FROM coord_partitions WHERE collect_at < ?1)",
                    [now],
                )
                .map_err(unavailable)?;
                let deleted = tx
                    .execute("DELETE FROM coord_partitions WHERE collect_at < ?1", [now])
                    .map_err(unavailable)?;
                tx.commit().map_err(unavailable)?;
                Ok(deleted)
            },
        )
        .await;
        if let Err(e) = deleted {
            tracing::warn!("collecting expired partitions failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coord_host::backend::{Backend, Condition};

    /// A call queued behind one stuck in the disk (here: a call that does
    /// not return until the test lets it) answers `unavailable` while the
    /// connection's thread is still stuck: its busy timeout is a bound on
    /// the whole call, as docs/sqlite.md says, not only on lock waits.
    #[tokio::test]
    async fn a_call_behind_a_stalled_disk_answers_within_its_bound() {
        let dir = std::env::temp_dir().join(format!("coord-stall-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let backend = SqliteBackend::open(SqliteConfig {
            busy_timeout: Duration::from_millis(200),
            ..SqliteConfig::new(Some(dir.join("stall.db")))
        })
        .await
        .unwrap();
        let (release, stuck) = std::sync::mpsc::channel::<()>();
        let (entered, in_disk) = tokio::sync::oneshot::channel();
        let stalled = backend.with_connection(move |_, _| {
            let _ = entered.send(());
            let _ = stuck.recv();
            Ok(())
        });
        let queued = async {
            in_disk.await.unwrap();
            // A hang detector, not a speed target: without the bound the
            // put waits for the stuck call, which waits for this put.
            let queued = tokio::time::timeout(
                Duration::from_secs(60),
                backend.put(
                    "~lock:1:a:b",
                    "holder",
                    b"v",
                    Some(60_000),
                    &Condition::Absent,
                ),
            )
            .await
            .expect("no answer while the disk stalled");
            // Answered while the thread is still stuck: only now let it go.
            release.send(()).unwrap();
            queued
        };
        let (stalled, queued) = tokio::join!(stalled, queued);
        assert!(
            matches!(&queued, Err(StoreError::Unavailable(m)) if m.contains("stalled")),
            "{queued:?}"
        );
        // The stuck call itself was answered the same way.
        assert!(matches!(stalled, Err(StoreError::Unavailable(_))));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
