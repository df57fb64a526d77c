//! What only the SQLite backend has to show: backends on separate
//! connections to one file (as processes on one host) granting a key to
//! exactly one and waking each other's waiters, a process killed inside a
//! write transaction, a long write lock held by another process, a file
//! made read-only, and an in-memory database. The contract itself is checked by the shared suites
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

/// Make the database's files read-only (`writable: false`) or writable
/// again: by their mode, or, as root (whom modes do not stop), by the
/// immutable attribute (`chattr`).
fn set_writable(path: &std::path::Path, writable: bool) -> Result<(), String> {
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0");
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        let file = PathBuf::from(file);
        if !file.exists() {
            continue;
        }
        if root {
            let flag = if writable { "-i" } else { "+i" };
            let status = std::process::Command::new("chattr")
                .arg(flag)
                .arg(&file)
                .status()
                .map_err(|e| format!("chattr, to make a file read-only for root: {e}"))?;
            if !status.success() {
                return Err(format!("chattr {flag} {}: {status}", file.display()));
            }
        } else {
            use std::os::unix::fs::PermissionsExt;
            let mode = if writable { 0o644 } else { 0o444 };
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode))
                .map_err(|e| format!("chmod {}: {e}", file.display()))?;
        }
    }
    Ok(())
}

/// A database's files kept read-only until this drops (also when the test
/// fails, so the file can be deleted).
struct ReadOnly(PathBuf);

impl ReadOnly {
    fn make(path: &std::path::Path) -> Self {
        let guard = ReadOnly(path.to_path_buf());
        set_writable(path, false).unwrap();
        guard
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let _ = set_writable(&self.0, true);
    }
}

#[tokio::test]
async fn a_read_only_file_is_unavailable_never_busy_or_acquired_and_loses_nothing() {
    let file = File(sqlite_path());
    let (held, free) = ("~lock:1:ro:held", "~lock:1:ro:free");
    let first = {
        let backend = open(&file.0).await;
        applied(
            backend
                .put(held, "holder", b"a", Some(60_000), &Condition::Absent)
                .await
                .unwrap(),
        )
        .revision
    };
    // The writer has exited: its connection closed, the last one on the
    // file, which folds the write-ahead log back into the file and deletes
    // it. (Made immutable under an open connection, the shared-memory file
    // it maps faults: SIGBUS, the kernel's answer to a write there.)
    let mut wal = file.0.as_os_str().to_owned();
    wal.push("-wal");
    bounded(async {
        while std::path::Path::new(&wal).exists() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // A process (re)started on a file an operator made read-only.
    let read_only = ReadOnly::make(&file.0);
    let opened = SqliteBackend::open(SqliteConfig::new(Some(file.0.clone()))).await;
    match opened {
        Err(error) => assert!(matches!(error, StoreError::Unavailable(_)), "{error:?}"),
        Ok(backend) => {
            let acquisition = backend
                .put(free, "holder", b"b", Some(60_000), &Condition::Absent)
                .await;
            assert!(
                matches!(acquisition, Err(StoreError::Unavailable(_))),
                "an acquisition on a read-only file: expected unavailable, got {acquisition:?}"
            );
            // A contender needs no write to be refused: the file still
            // reads, and the holder is there. Busy is the truth; anything
            // but that or unavailable is not.
            let contender = backend
                .put(held, "holder", b"b", Some(60_000), &Condition::Absent)
                .await;
            assert!(
                match &contender {
                    Err(StoreError::Unavailable(_)) => true,
                    Ok(reply) => matches!(
                        &reply.outcome,
                        Outcome::Conflict(Some(e)) if e.value == b"a" && e.revision == first
                    ),
                    Err(_) => false,
                },
                "a contender on a read-only file: got {contender:?}"
            );
            assert!(backend.ready().await.is_err(), "ready on a read-only file");
        }
    }
    drop(read_only);
    let backend = open(&file.0).await;
    let read = backend.get(held, "holder").await.unwrap().entry.unwrap();
    assert_eq!((read.value.as_slice(), read.revision), (&b"a"[..], first));
    assert_eq!(backend.get(free, "holder").await.unwrap().entry, None);
    let next = applied(
        backend
            .put(free, "holder", b"c", Some(60_000), &Condition::Absent)
            .await
            .unwrap(),
    );
    assert!(next.revision > first, "{next:?} after {first}");
}
