//! `coord serve` while its store is stalled, as outside testers stalled it
//! (issue 48, items 3 and 9): another process holding SQLite's write lock,
//! another connection holding an exclusive lock on PostgreSQL's table. The
//! deadline answers at the deadline (before: after the store call and the
//! give-back of what the cut request held, 7 s into a 2 s deadline on
//! PostgreSQL, 9.6 s on SQLite), and a stop with a take-back pending is
//! graceful (before: a panic in every run on SQLite).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common;
use crate::process::Serve;

/// How long the stores wait for a lock before they answer `unavailable`
/// (SQLite's busy timeout, PostgreSQL's response timeout): the old code
/// answered only after it, so a 504 before it shows the deadline held.
const STORE_WAIT: Duration = Duration::from_secs(5);

/// A unique name for this test's data.
fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{name}{}x{nanos}", std::process::id())
}

/// A store stalled from outside until dropped.
enum Stall {
    /// Another connection holds the SQLite file's write lock.
    Sqlite(rusqlite::Connection),
    /// Another connection holds an exclusive lock on coord's table (the
    /// transaction ends when the connection closes).
    Postgres(tokio_postgres::Client, tokio::task::JoinHandle<()>),
}

impl Stall {
    fn sqlite(path: &std::path::Path) -> Stall {
        let other = rusqlite::Connection::open(path).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        Stall::Sqlite(other)
    }

    async fn postgres(url: &str, table: &str) -> Stall {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .unwrap();
        let driving = tokio::spawn(async move {
            let _ = connection.await;
        });
        client
            .batch_execute(&format!("BEGIN; LOCK TABLE {table} IN EXCLUSIVE MODE"))
            .await
            .unwrap();
        Stall::Postgres(client, driving)
    }

    async fn end(self) {
        match self {
            Stall::Sqlite(other) => other.execute_batch("ROLLBACK").unwrap(),
            Stall::Postgres(client, driving) => {
                client.batch_execute("ROLLBACK").await.unwrap();
                drop(client);
                let _ = driving.await;
            }
        }
    }
}

/// A SQLite file for one test, deleted at the end.
struct SqliteFile(PathBuf);

impl Drop for SqliteFile {
    fn drop(&mut self) {
        common::delete_sqlite(&self.0);
    }
}

/// An adjust sent while the store is stalled gets its 504 at the deadline,
/// long before the stalled call could end; once the stall ends, the item's
/// lock is free (the cut request's holdings were given back, or never
/// taken).
async fn a_deadline_is_answered_while_the_store_is_stalled(
    args: &[&str],
    stall: impl std::future::Future<Output = Stall>,
) {
    let mut args = args.to_vec();
    args.extend(["--deadline-ms", "1000"]);
    let serve = Serve::start(&args);
    let warm = serve
        .call("POST", "/items/s1/adjust?delta=1", None, "")
        .await;
    assert_eq!(warm.status, 200, "{}", warm.json);
    let stall = stall.await;
    let started = Instant::now();
    let cut = serve
        .call("POST", "/items/s1/adjust?delta=1", None, "")
        .await;
    let took = started.elapsed();
    assert_eq!(cut.status, 504, "{}", cut.json);
    assert!(
        took < STORE_WAIT - Duration::from_millis(500),
        "a 1 s deadline answered after {took:?}: it waited for the stalled store"
    );
    stall.end().await;
    let next = common::bounded(async {
        loop {
            let next = serve
                .call("POST", "/items/s1/adjust?delta=1", None, "")
                .await;
            // A give-back still landing may hold the item a moment.
            if next.status != 409 {
                break next;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(next.status, 200, "{}", next.json);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_deadline_is_answered_while_the_file_is_write_locked() {
    let file = SqliteFile(common::sqlite_path());
    let path = file.0.display().to_string();
    a_deadline_is_answered_while_the_store_is_stalled(&["--sqlite", path.as_str()], async {
        Stall::sqlite(&file.0)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_deadline_is_answered_while_the_table_is_locked() {
    let url = common::postgres_url().await;
    let prefix = unique("stall");
    let table = coord_postgres::PostgresConfig::table_for(&prefix);
    a_deadline_is_answered_while_the_store_is_stalled(
        &["--postgres", url.as_str(), "--prefix", prefix.as_str()],
        Stall::postgres(&url, &table),
    )
    .await;
    common::drop_table(url, table);
}

/// SIGTERM while an acquire that failed as `unavailable` is being taken
/// back in the background: the process stops cleanly (no panic, exit 0)
/// within its grace and the take-back's wait, and once the stall ends the
/// item is free to a new process on the same store.
async fn a_stop_with_a_take_back_pending_is_graceful(
    args: &[&str],
    stall: impl std::future::Future<Output = Stall>,
) {
    let log = std::env::temp_dir().join(format!("{}.log", unique("coord-stop")));
    let mut args = args.to_vec();
    args.extend(["--grace-ms", "500"]);
    let mut serve = Serve::start_logging_to(&args, &log);
    let warm = serve
        .call("POST", "/items/t1/adjust?delta=1", None, "")
        .await;
    assert_eq!(warm.status, 200, "{}", warm.json);
    let stall = stall.await;
    let failed = serve
        .call("POST", "/items/t1/adjust?delta=1", None, "")
        .await;
    assert!(
        matches!(failed.status, 503 | 504),
        "an adjust on a stalled store: {} {}",
        failed.status,
        failed.json
    );
    serve.terminate();
    let status = serve.wait();
    let written = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    assert!(
        !written.contains("panicked"),
        "the stop panicked:\n{written}"
    );
    assert!(status.success(), "{status}:\n{written}");
    stall.end().await;
    let again = Serve::start(&args);
    let next = again
        .call("POST", "/items/t1/adjust?delta=1", None, "")
        .await;
    assert_eq!(next.status, 200, "{}", next.json);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_stop_with_a_take_back_pending_is_graceful() {
    let file = SqliteFile(common::sqlite_path());
    let path = file.0.display().to_string();
    a_stop_with_a_take_back_pending_is_graceful(&["--sqlite", path.as_str()], async {
        Stall::sqlite(&file.0)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_stop_with_a_take_back_pending_is_graceful() {
    let url = common::postgres_url().await;
    let prefix = unique("stop");
    let table = coord_postgres::PostgresConfig::table_for(&prefix);
    a_stop_with_a_take_back_pending_is_graceful(
        &["--postgres", url.as_str(), "--prefix", prefix.as_str()],
        Stall::postgres(&url, &table),
    )
    .await;
    common::drop_table(url, table);
}
