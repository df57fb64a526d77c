//! The PostgreSQL backend: the store contract on one table of a PostgreSQL
//! database, through a pool of connections.
//!
//! This file holds the configuration, the pool and the table; `partition.rs`
//! reads and writes one partition (a compare-and-set on its row);
//! `store.rs` is the `Backend` implementation; `listen.rs` the one
//! connection that `LISTEN`s for changes, which wakes waiters.
//!
//! **The mapping.** Each partition is one row of the table (`coord_partitions`
//! by default): its name (as bytes), its whole state — entries, revision, bounded
//! change feed, meters — as the snapshot `coord_component::memory::Partition`
//! reads and writes (the state machine the in-memory and NATS backends run,
//! so the semantics are the same by construction), the store time it was
//! last decided at, and a version drawn from a sequence. A call reads the
//! row (or remembers it: `speculation.rs`) and, when it changes anything,
//! writes the new state only if the row is still the one it decided on,
//! through the table's write function (`write_function.rs`: an `UPDATE`
//! conditioned on the row, or an `INSERT … ON CONFLICT DO NOTHING` for a
//! new partition); a call that loses that race reads again and decides
//! again. The version comes from a
//! sequence, never from the row, so a row collected and made again cannot
//! take a version a stale writer still holds.
//!
//! **A partition that may hold many entries** (a semaphore's permits) keeps
//! each entry as a row of `<table>_entries` instead, beside its own row
//! (`rows.rs`): a call reads the rows it needs by index and writes back the
//! ones it changed, in the same compare-and-set on the partition's row, so
//! its cost does not grow with the permits held.
//!
//! **Time** is the server's: every read also selects `clock_timestamp()` in
//! milliseconds, and a partition's time never goes back (each row keeps
//! the latest time it was decided at). Revisions are floored at the clock in
//! µs, as in the other backends, so a table emptied or restored from an old
//! backup still issues fences above every earlier one.
//!
//! **Round trips.** A read (`get`, `list`, `changes`, `now`) is one
//! statement. A write to a row this process wrote or read last is one: it
//! is decided on the row as remembered and sent with that row as its
//! condition (`speculation.rs`). Otherwise it is two: the read (or the
//! failed speculation, which returns the row), then the conditional write
//! (which also sends the `NOTIFY` in the same statement); a write whose
//! condition fails is one (the conflict carries the entry the read
//! returned). Each lost race adds more (`partition.rs`). Every statement
//! is sent with its parameter types (`query_typed`): no prepare round trip
//! and no prepared statement left on a connection, and no statement needs
//! session state, so calls work through a transaction-mode pooler
//! (PgBouncer). `wait` is the exception:
//! its `LISTEN` needs a session of its own, on a direct connection.
//!
//! **Waiting.** A write that makes a new revision sends `pg_notify` on the
//! table's channel with the revision and the partition's name in hex (a
//! name may hold any character, NUL included, which a payload cannot; a
//! name too long for a payload, over 3 900 bytes, is not announced). One connection per
//! backend listens, and `connect` returns once it does. A waiter re-checks
//! the partition at least every [`PostgresConfig::recheck`], at once when
//! the listening connection is lost or listens again (a write in between
//! notified nobody here), and every 500 ms while none listens.
//!
//! **Collection.** A row records when its partition may go (its last live
//! entry's expiry plus the retention; never while an entry has no TTL).
//! Every [`PostgresConfig::collect_every`] a backend deletes the rows whose
//! time has passed, so the table does not grow with abandoned partitions;
//! the feed inside a row is bounded in changes and bytes on every write.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_host::backend::{DEFAULT_RETENTION_MS, StoreError};
use coord_host::clock::{Clock, ManualClock};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tokio_postgres::NoTls;

mod durability;
mod listen;
mod partition;
mod rows;
mod speculation;
mod store;
mod write_function;

pub use durability::Durability;
pub use partition::FEED_BYTES;
pub use speculation::{KNOWN_ROWS, SEEN_BYTES, SEEN_ROWS};

/// How often a waiter checks its partition again when no notification came
/// (the bound on the delay a lost notification causes), by default.
pub const RECHECK_MS: u64 = 500;

/// How to reach PostgreSQL and how to keep partitions there.
#[derive(Debug, Clone)]
pub struct PostgresConfig {
    /// A libpq-style URL or key-value string:
    /// `postgres://user:password@host:5432/database`.
    pub url: String,
    /// Where the one connection that `LISTEN`s goes, when not `url`: it
    /// needs a session of its own, so the server itself (or a pooler in
    /// session mode), never a transaction-mode pooler such as PgBouncer's,
    /// which would hand its session to others and drop the notifications
    /// (waiters would then wake only at each `recheck`).
    pub listen_url: Option<String>,
    /// The table the partitions live in, made if missing: 1 to 48 of
    /// `a-z`, `0-9` and `_`, starting with a letter (it also names the
    /// version sequence, `<table>_versions`, and the channel,
    /// `<table>_changes`). Deployments sharing a database use different
    /// tables.
    pub table: String,
    /// Changes each watched partition's feed keeps.
    pub history: usize,
    /// How long a partition's row outlives its last live entry, in ms.
    pub retention_ms: u64,
    /// The most a call waits for the server before it answers `unavailable`.
    pub response_timeout: Duration,
    /// How often a waiter checks its partition when no notification came.
    pub recheck: Duration,
    /// How long a waiter's registration on a row lasts once written (see
    /// docs/postgres.md, "Waiting"): waiters write a row about this often,
    /// and writes to it announce themselves this long after the last
    /// waiter left.
    pub registration: Duration,
    /// Connections in the pool (the listening connection is one more).
    pub pool_size: usize,
    /// How often expired rows are deleted.
    pub collect_every: Duration,
    /// The commits this process asks the table for (see [`Durability`]):
    /// `None` keeps what the table has (a new table: durable); durable
    /// raises a relaxed table; relaxed makes a new table relaxed, and an
    /// existing durable one only with `allow_relaxed`.
    pub durability: Option<Durability>,
    /// Let `durability: Some(Relaxed)` relax a table that is durable (every
    /// process on it then loses its last moments' writes in a crash).
    pub allow_relaxed: bool,
    /// Tests only: take "now" from this clock instead of the server's.
    pub test_clock: Option<Arc<ManualClock>>,
}

impl PostgresConfig {
    /// The defaults for `url`: table `coord_partitions`, 1024 changes of
    /// history, ten minutes of retention, a 5 s response timeout, waiters'
    /// registrations of 30 s, 16 connections, collection every minute, and
    /// the durability the table has (a new table: durable).
    pub fn new(url: &str) -> Self {
        PostgresConfig {
            url: url.to_string(),
            listen_url: None,
            table: "coord_partitions".into(),
            history: coord_component::memory::DEFAULT_HISTORY,
            retention_ms: DEFAULT_RETENTION_MS,
            response_timeout: Duration::from_secs(5),
            recheck: Duration::from_millis(RECHECK_MS),
            registration: Duration::from_secs(30),
            pool_size: 16,
            collect_every: Duration::from_secs(60),
            durability: None,
            allow_relaxed: false,
            test_clock: None,
        }
    }
}

impl PostgresConfig {
    /// The table a deployment with key prefix `prefix` keeps its
    /// partitions in: `<prefix>_partitions`, lowercased, every character
    /// but `a-z`, `0-9` and `_` made `_`, and `t` first if it does not
    /// start with a letter.
    pub fn table_for(prefix: &str) -> String {
        let mut table: String = prefix
            .chars()
            .map(|c| match c.to_ascii_lowercase() {
                c @ ('a'..='z' | '0'..='9' | '_') => c,
                _ => '_',
            })
            .collect();
        if !table.starts_with(|c: char| c.is_ascii_lowercase()) {
            table.insert(0, 't');
        }
        table.truncate(48 - "_partitions".len());
        table + "_partitions"
    }
}

/// The store on PostgreSQL. Cheap to share: calls take a pooled connection
/// each.
pub struct PostgresBackend {
    config: PostgresConfig,
    pool: Pool,
    /// What the listening connection heard: (partition, revision).
    notifications: broadcast::Sender<(String, u64)>,
    /// Whether the listening connection listens (see [`listen::listen`]).
    listening: watch::Receiver<Option<u64>>,
    asleep: Mutex<HashMap<String, usize>>,
    /// Rows as this process last saw them, and the server's clock as seen
    /// from here, for one-statement writes (`speculation.rs`).
    seen: speculation::Seen,
    round_trips: AtomicU64,
    /// The table's durability when this process started (after its own
    /// setting), which a later relaxation is reported against.
    relied_on_durability: Mutex<Option<Durability>>,
    /// What is wrong with the table's durability, as last checked.
    durability_warnings: Mutex<Vec<String>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for PostgresBackend {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The statements that remove everything a backend made for `table` in its
/// database: the tables, the sequence and the write functions. For tests
/// and benchmarks that made a table of their own.
pub fn drop_statements(table: &str) -> String {
    format!(
        "DROP TABLE IF EXISTS {table}, {entries}, {table}_settings; \
         DROP SEQUENCE IF EXISTS {table}_versions; \
         DROP FUNCTION IF EXISTS {write}; \
         DROP FUNCTION IF EXISTS {read_rows}; \
         DROP FUNCTION IF EXISTS {write_rows};",
        entries = rows::entries(table),
        write = write_function::name(table),
        read_rows = rows::read_function_name(table),
        write_rows = rows::write_function_name(table),
    )
}

/// A PostgreSQL failure, as the store contract's `unavailable`.
fn unavailable(error: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("PostgreSQL: {error}"))
}

/// A client error, with the server's own message when the server sent one
/// (a client error's `Display` says only "db error").
fn refused(error: tokio_postgres::Error) -> StoreError {
    match error.as_db_error() {
        Some(db) => unavailable(format!("{} ({})", db.message(), db.code().code())),
        None => unavailable(error),
    }
}

/// A partition's name as a notification carries it: hex, or none when it
/// would not fit in a payload (8 000 bytes).
fn announced_name(name: &str) -> Option<String> {
    (name.len() <= 3900).then(|| name.bytes().map(|b| format!("{b:02x}")).collect())
}

/// Whether `table` is a name this backend puts in its statements as it is.
fn valid_table(table: &str) -> bool {
    let mut chars = table.chars();
    matches!(chars.next(), Some('a'..='z'))
        && table.len() <= 48
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
}

impl PostgresBackend {
    /// Connect, make the table, its sequence and index if missing, and
    /// start listening for changes and collecting expired rows.
    pub async fn connect(config: PostgresConfig) -> Result<Self, StoreError> {
        if !valid_table(&config.table) {
            return Err(StoreError::Invalid(format!(
                "table: {:?} is not 1 to 48 of a-z, 0-9 and _ starting with a letter",
                config.table
            )));
        }
        let pg = tokio_postgres::Config::from_str(&config.url)
            .map_err(|e| StoreError::Invalid(format!("url: {e}")))?;
        let listen_pg = match &config.listen_url {
            Some(url) => tokio_postgres::Config::from_str(url)
                .map_err(|e| StoreError::Invalid(format!("listen_url: {e}")))?,
            None => pg.clone(),
        };
        let manager = Manager::from_config(
            pg.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(config.pool_size.max(1))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .create_timeout(Some(config.response_timeout))
            .wait_timeout(Some(config.response_timeout))
            .build()
            .map_err(unavailable)?;
        let (notifications, _) = broadcast::channel(1024);
        let (listening_tx, listening) = watch::channel(None);
        let mut backend = PostgresBackend {
            config: PostgresConfig {
                history: config.history.max(1),
                ..config
            },
            pool,
            notifications,
            listening,
            asleep: Mutex::new(HashMap::new()),
            seen: speculation::Seen::new(),
            round_trips: AtomicU64::new(0),
            relied_on_durability: Mutex::new(None),
            durability_warnings: Mutex::new(Vec::new()),
            tasks: Vec::new(),
        };
        backend.make_table().await?;
        backend.settle_durability().await?;
        let listener = listen::listen(
            listen_pg,
            backend.channel(),
            backend.notifications.clone(),
            listening_tx,
        );
        backend.tasks.push(tokio::spawn(listener));
        // A backend returned listens, so its first waiters are woken by
        // writes like every later one. Should the listening connection be
        // slower than the response timeout, waiters poll until it is up.
        let mut listening = backend.listening.clone();
        let up = listening.wait_for(Option::is_some);
        if tokio::time::timeout(backend.config.response_timeout, up)
            .await
            .is_err()
        {
            tracing::debug!(
                "not listening yet: waiters re-check every {:?}",
                listen::RETRY
            );
        }
        backend.tasks.push(tokio::spawn(collect(
            backend.pool.clone(),
            backend.config.clone(),
        )));
        Ok(backend)
    }

    /// The table, its version sequence, its collection index and its write
    /// function, made if missing (its settings table:
    /// [`Self::settle_durability`]). Two backends making them at once may collide in the
    /// catalog; the loser finds them made.
    async fn make_table(&self) -> Result<(), StoreError> {
        let t = &self.config.table;
        let sql = format!(
            "CREATE SEQUENCE IF NOT EXISTS {t}_versions;
             CREATE TABLE IF NOT EXISTS {t} (
               name bytea PRIMARY KEY,
               version bigint NOT NULL,
               decided_at bigint NOT NULL,
               state bytea NOT NULL,
               collect_at bigint,
               wait_until bigint
             ) WITH (fillfactor = 70);
             ALTER TABLE {t} ADD COLUMN IF NOT EXISTS wait_until bigint;
             CREATE INDEX IF NOT EXISTS {t}_collect_at ON {t} (collect_at);
             {entries}",
            entries = rows::create_table(t),
        );
        for attempt in 0..3 {
            let client = self.client().await?;
            match self.make_write_function(&client, &sql).await {
                Ok(()) => return Ok(()),
                Err(e) if attempt < 2 && e.code().is_some() => {
                    tracing::debug!("making {t} raced another backend: {e}");
                }
                Err(e) => return Err(refused(e)),
            }
        }
        Ok(())
    }

    /// Run `sql` (the table's statements), then make the functions
    /// (`write_function.rs`'s, and `rows.rs`'s two for partitions of many) that
    /// the database has none of by name and signature. Two backends making
    /// one at once collide on its name; the caller tries again and finds it
    /// made.
    async fn make_write_function(
        &self,
        client: &deadpool_postgres::Object,
        sql: &str,
    ) -> Result<(), tokio_postgres::Error> {
        client.batch_execute(sql).await?;
        let table = &self.config.table;
        let functions = [
            (
                write_function::signature(table),
                write_function::create(table),
            ),
            (
                rows::read_signature(table),
                rows::create_read_function(table),
            ),
            (
                rows::write_signature(table),
                rows::create_write_function(table),
            ),
        ];
        for (signature, create) in functions {
            let found = client
                .query_typed(
                    "SELECT to_regprocedure($1) IS NOT NULL",
                    &[(&signature, tokio_postgres::types::Type::TEXT)],
                )
                .await?;
            if !found.first().is_some_and(|row| row.get::<_, bool>(0)) {
                client.batch_execute(&create).await?;
            }
        }
        Ok(())
    }

    /// A pooled connection, or `unavailable`.
    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(unavailable)
    }

    /// The channel writes announce changes on.
    fn channel(&self) -> String {
        format!("{}_changes", self.config.table)
    }

    /// The store's now: the test clock's, when a test gave one.
    fn test_now(&self) -> Option<u64> {
        self.config.test_clock.as_ref().map(|clock| clock.now_ms())
    }

    /// The table this backend keeps its partitions in.
    pub fn table(&self) -> &str {
        &self.config.table
    }

    /// Statements sent to the server so far.
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    /// Move this process's estimate of the server's clock by `by_ms` (later
    /// when positive), as a misjudged round trip or a step of the local
    /// clock would, until the next reply corrects it. For tests that check
    /// the server refuses a one-statement write decided at the wrong time
    /// (`speculation.rs`); nothing else calls it.
    #[doc(hidden)]
    pub fn misestimate_server_clock(&self, by_ms: i64) {
        self.seen.shift_clock_estimate(by_ms.saturating_mul(1000));
    }

    fn trip(&self) {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
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
    backend: &'a PostgresBackend,
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

/// Delete the rows whose partitions may go, and their entry rows, every
/// `collect_every`.
async fn collect(pool: Pool, config: PostgresConfig) {
    let sql = rows::collect(&config.table);
    loop {
        tokio::time::sleep(config.collect_every).await;
        let now = match &config.test_clock {
            Some(clock) => clock.now_ms(),
            None => match partition::server_now(&pool).await {
                Ok(now) => now,
                Err(_) => continue,
            },
        };
        let Ok(client) = pool.get().await else {
            continue;
        };
        let now = i64::try_from(now).unwrap_or(i64::MAX);
        if let Err(e) = client
            .query_typed(&sql, &[(&now, tokio_postgres::types::Type::INT8)])
            .await
        {
            tracing::warn!("collecting expired partitions failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::valid_table;

    #[test]
    fn table_names_are_plain_identifiers() {
        for good in ["coord_partitions", "t", "coordtest_12_3"] {
            assert!(valid_table(good), "{good}");
        }
        for bad in ["", "1t", "T", "a-b", "a;drop table x", &"a".repeat(49)] {
            assert!(!valid_table(bad), "{bad}");
        }
    }

    #[test]
    fn every_prefix_names_a_valid_table() {
        for prefix in [
            "coord",
            "Tenant-9",
            "9lives",
            "",
            "a;drop table x",
            &"x".repeat(80),
        ] {
            let table = super::PostgresConfig::table_for(prefix);
            assert!(valid_table(&table), "{prefix:?} gave {table:?}");
        }
        assert_eq!(
            super::PostgresConfig::table_for("coord"),
            "coord_partitions"
        );
    }
}
