//! What only the SQLite backend has to show: backends on separate
//! connections to one file (as processes on one host) granting a key to
//! exactly one and waking each other's waiters, a process killed inside a
//! write transaction, a long write lock held by another process, and an
//! in-memory database. The contract itself is checked by the shared suites
//! (`conformance.rs` and the others run on SQLite too).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::common;
use common::{applied, bounded, delete_sqlite, sqlite_path};
use coord_host::backend::*;
use coord_sqlite::{SqliteBackend, SqliteConfig};

/// A test's database file, deleted at the end.
struct File(PathBuf);

impl Drop for File {
    fn drop(&mut self) {
        delete_sqlite(&self.0);
    }
}

async fn open(path: &std::path::Path) -> SqliteBackend {
    SqliteBackend::open(SqliteConfig::new(Some(path.to_path_buf())))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_on_one_file_grant_a_key_to_exactly_one() {
    let file = File(sqlite_path());
    let mut backends = Vec::new();
    for _ in 0..4 {
        backends.push(Arc::new(open(&file.0).await));
    }
    for round in 0..20 {
        let key = format!("k{round}");
        let tries = backends.iter().enumerate().map(|(i, backend)| {
            let (backend, key) = (backend.clone(), key.clone());
            tokio::spawn(async move {
                let value = format!("{i}");
                backend
                    .put(
                        "~lock:1:a:b",
                        &key,
                        value.as_bytes(),
                        Some(60_000),
                        &Condition::Absent,
                    )
                    .await
                    .unwrap()
            })
        });
        let mut granted = 0;
        for reply in futures_util::future::join_all(tries).await {
            if matches!(reply.unwrap().outcome, Outcome::Applied(_)) {
                granted += 1;
            }
        }
        assert_eq!(granted, 1, "round {round}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_another_connection_is_woken_by_a_release_there() {
    let file = File(sqlite_path());
    let (a, b) = (open(&file.0).await, Arc::new(open(&file.0).await));
    let p = "~lock:1:wake:me";
    let held = applied(
        a.put(p, "holder", b"a", Some(60_000), &Condition::Absent)
            .await
            .unwrap(),
    );
    // A lock waiter on the other connection: wait, then put if absent.
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move {
            b.wait_then_put(
                p,
                "holder",
                b"b",
                Some(60_000),
                &Condition::Absent,
                held.revision,
                60_000,
            )
            .await
        })
    };
    while b.waiters(p) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    a.delete(p, "holder", &Condition::Revision(held.revision))
        .await
        .unwrap();
    // No announcement crosses connections: the waiter's own re-check
    // finds the release and takes the lock, with a higher revision.
    let taken = applied(bounded(waiter).await.unwrap().unwrap());
    assert_eq!(taken.value, b"b");
    assert!(taken.revision > held.revision);
}

#[tokio::test]
async fn a_process_killed_inside_a_write_leaves_the_file_as_it_was() {
    let file = File(sqlite_path());
    let backend = open(&file.0).await;
    let p = "~lock:1:kill:nine";
    let held = applied(
        backend
            .put(p, "holder", b"a", Some(60_000), &Condition::Absent)
            .await
            .unwrap(),
    );
    // Another process deletes every row inside a transaction, then is
    // killed (SIGKILL) before it commits.
    let script = format!(
        "import os, signal, sqlite3\n\
         c = sqlite3.connect({path:?}, isolation_level=None)\n\
         c.execute('BEGIN IMMEDIATE')\n\
         c.execute('DELETE FROM coord_partitions')\n\
         os.kill(os.getpid(), signal.SIGKILL)\n",
        path = file.0.display().to_string()
    );
    let status = std::process::Command::new("python3")
        .args(["-c", &script])
        .status()
        .unwrap();
    assert!(!status.success(), "the writer was killed: {status}");
    // The holder is still there, with its revision; the lock is busy.
    let read = backend.get(p, "holder").await.unwrap().entry.unwrap();
    assert_eq!(read.revision, held.revision);
    let rival = backend
        .put(p, "holder", b"b", Some(60_000), &Condition::Absent)
        .await
        .unwrap();
    assert!(
        matches!(rival.outcome, Outcome::Conflict(Some(_))),
        "{rival:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_lock_held_past_the_busy_timeout_is_unavailable_never_busy_or_acquired() {
    let file = File(sqlite_path());
    let backend = SqliteBackend::open(SqliteConfig {
        busy_timeout: Duration::from_millis(200),
        ..SqliteConfig::new(Some(file.0.clone()))
    })
    .await
    .unwrap();
    let p = "~lock:1:long:write";
    // Another connection (another process would do the same) holds the
    // write lock.
    let other = rusqlite::Connection::open(&file.0).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let error = backend
        .put(p, "holder", b"a", Some(60_000), &Condition::Absent)
        .await
        .expect_err("no write while another holds the lock");
    assert!(matches!(error, StoreError::Unavailable(_)), "{error:?}");
    assert!(backend.ready().await.is_err(), "not ready while locked out");
    other.execute_batch("ROLLBACK").unwrap();
    // Nothing was written, and the lock is free to take.
    assert_eq!(backend.get(p, "holder").await.unwrap().entry, None);
    let taken = backend
        .put(p, "holder", b"a", Some(60_000), &Condition::Absent)
        .await
        .unwrap();
    assert!(matches!(taken.outcome, Outcome::Applied(_)));
    backend.ready().await.unwrap();
}

#[tokio::test]
async fn a_database_in_memory_is_one_process_and_a_file_deleted_keeps_fences_rising() {
    let memory = SqliteBackend::open(SqliteConfig::new(None)).await.unwrap();
    let first = applied(
        memory
            .put(
                "~lock:1:a:b",
                "holder",
                b"a",
                Some(60_000),
                &Condition::Absent,
            )
            .await
            .unwrap(),
    );
    // A fresh database (a restart, a deleted file) issues revisions above
    // every earlier one: they are floored at the clock in µs.
    let again = SqliteBackend::open(SqliteConfig::new(None)).await.unwrap();
    let second = applied(
        again
            .put(
                "~lock:1:a:b",
                "holder",
                b"b",
                Some(60_000),
                &Condition::Absent,
            )
            .await
            .unwrap(),
    );
    assert!(
        second.revision > first.revision,
        "{second:?} after {first:?}"
    );
}
