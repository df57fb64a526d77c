//! SQLite's layout for a partition that may hold many entries (a
//! semaphore's): a row per entry in `coord_entries`, so that the partition's
//! own row, read and written by every call, does not grow with the permits
//! held. What the layout must keep: the count and the holder a full
//! semaphore names, expiry on the store's clock, the limit across processes
//! racing on one file, a partition written before the layout, a process
//! that predates it refused rather than misled, and collection of the rows
//! with their partition. The contract itself is
//! checked on a semaphore's partition by the shared suites
//! (`conformance::counted`, `conformance::unwatched`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::common;
use common::{T0, applied, bounded, delete_sqlite, sqlite_path};
use coord_component::memory::Partition;
use coord_host::backend::*;
use coord_host::clock::{Clock, ManualClock};
use coord_sqlite::{SqliteBackend, SqliteConfig};

/// A semaphore's partition (`coord_component::keys::semaphore_partition`).
const SEMAPHORE: &str = "~sem:1:a:b";

/// A test's database file, deleted at the end.
struct File(PathBuf);

impl Drop for File {
    fn drop(&mut self) {
        delete_sqlite(&self.0);
    }
}

/// A backend on `path` whose now is `clock`'s.
async fn open(path: &Path, clock: &Arc<ManualClock>) -> SqliteBackend {
    SqliteBackend::open(SqliteConfig {
        test_clock: Some(clock.clone()),
        ..SqliteConfig::new(Some(path.to_path_buf()))
    })
    .await
    .unwrap()
}

fn fewer_than(limit: u32) -> Condition {
    Condition::AbsentAndFewerThan(limit)
}

/// The entry rows of `partition` and its own row's state, read by another
/// connection as an operator would.
fn stored(path: &Path, partition: &str) -> (u64, Vec<u8>) {
    let c = rusqlite::Connection::open(path).unwrap();
    let rows: u64 = c
        .query_row(
            "SELECT count(*) FROM coord_entries WHERE partition = ?1",
            [partition.as_bytes()],
            |row| row.get(0),
        )
        .unwrap();
    let state: Vec<u8> = c
        .query_row(
            "SELECT state FROM coord_partitions WHERE name = ?1",
            [partition.as_bytes()],
            |row| row.get(0),
        )
        .unwrap_or_default();
    (rows, state)
}

#[tokio::test]
async fn a_semaphore_keeps_a_row_per_permit_and_counts_them_as_the_whole_partition_would() {
    let file = File(sqlite_path());
    let clock = Arc::new(ManualClock::new(T0));
    let backend = open(&file.0, &clock).await;
    // 1 000 permits; permit i expires at T0 + 10 000 + i.
    let mut permits = Vec::new();
    for i in 0..1000u64 {
        let key = format!("p{i}");
        let reply = backend
            .put(SEMAPHORE, &key, b"v", Some(10_000 + i), &fewer_than(1000))
            .await
            .unwrap();
        permits.push(applied(reply));
    }
    let (rows, state) = stored(&file.0, SEMAPHORE);
    assert_eq!(rows, 1000, "a row per permit");
    assert!(
        state.len() < 200,
        "the partition's own row holds no permit: {} bytes",
        state.len()
    );
    assert!(
        Partition::decode(&state).is_err(),
        "a build that predates the layout cannot read the state, so it refuses \
         (unavailable) rather than see no permits and grant past the limit"
    );
    // Full: the conflict names the permit that expires first.
    let full = backend
        .put(SEMAPHORE, "late", b"v", Some(1000), &fewer_than(1000))
        .await
        .unwrap();
    assert!(
        matches!(&full.outcome, Outcome::Conflict(Some(e)) if *e == permits[0]),
        "{:?}",
        full.outcome
    );

    // p0 … p499 expire; 500 stay.
    clock.advance(10_000 + 499);
    let listing = backend.list(SEMAPHORE, "p9").await.unwrap();
    let listed: Vec<&Entry> = listing.entries.iter().collect();
    let expected: Vec<&Entry> = permits[900..1000].iter().collect();
    assert_eq!(listed, expected, "the live permits under p9, in key order");
    let (rows, _) = stored(&file.0, SEMAPHORE);
    assert_eq!(rows, 500, "expired rows are removed when a call sees them");
    assert!(
        listing.revision > permits[999].revision,
        "each expiry took a revision"
    );
    // Exactly one place under 501; the next conflicts with p500.
    applied(
        backend
            .put(SEMAPHORE, "q", b"v", Some(60_000), &fewer_than(501))
            .await
            .unwrap(),
    );
    let full = backend
        .put(SEMAPHORE, "r", b"v", Some(60_000), &fewer_than(501))
        .await
        .unwrap();
    assert!(
        matches!(&full.outcome, Outcome::Conflict(Some(e)) if *e == permits[500]),
        "{:?}",
        full.outcome
    );
    // A guarded release of one, and a touch of another, change their rows.
    let p600 = &permits[600];
    applied(
        backend
            .delete(SEMAPHORE, "p600", &Condition::Revision(p600.revision))
            .await
            .unwrap(),
    );
    let touched = applied(
        backend
            .touch(SEMAPHORE, "p700", 90_000, &Condition::Always)
            .await
            .unwrap(),
    );
    assert_eq!(touched.expires_at, Some(clock.now_ms() + 90_000));
    assert_eq!(stored(&file.0, SEMAPHORE).0, 500);
    // Another process on the file sees the same.
    let other = open(&file.0, &clock).await;
    assert_eq!(other.get(SEMAPHORE, "p600").await.unwrap().entry, None);
    assert_eq!(
        other.get(SEMAPHORE, "p700").await.unwrap().entry,
        Some(touched)
    );
    applied(
        other
            .put(SEMAPHORE, "s", b"v", Some(60_000), &fewer_than(501))
            .await
            .unwrap(),
    );
}

#[tokio::test]
async fn a_semaphore_written_before_the_row_layout_keeps_its_permits_and_moves_to_rows() {
    let file = File(sqlite_path());
    let clock = Arc::new(ManualClock::new(T0));
    let backend = open(&file.0, &clock).await;
    // The state an earlier build wrote: three permits inside the
    // partition's one value.
    let mut old = Partition::new(1);
    for key in ["a", "b", "c"] {
        let put = old.put(key, b"v", Some(60_000), &fewer_than(3), T0);
        assert!(matches!(put, Outcome::Applied(_)));
    }
    rusqlite::Connection::open(&file.0)
        .unwrap()
        .execute(
            "INSERT INTO coord_partitions (name, decided_at, state, collect_at) \
             VALUES (?1, ?2, ?3, NULL)",
            rusqlite::params![SEMAPHORE.as_bytes(), T0 as i64, old.encode()],
        )
        .unwrap();
    // The three count: a limit of 3 is full.
    let full = backend
        .put(SEMAPHORE, "d", b"v", Some(60_000), &fewer_than(3))
        .await
        .unwrap();
    assert!(
        matches!(&full.outcome, Outcome::Conflict(Some(e)) if e.key == "a"),
        "{:?}",
        full.outcome
    );
    applied(
        backend
            .put(SEMAPHORE, "d", b"v", Some(60_000), &fewer_than(4))
            .await
            .unwrap(),
    );
    let (rows, state) = stored(&file.0, SEMAPHORE);
    assert_eq!(rows, 4, "the first write moved every permit to rows");
    assert!(Partition::decode(&state).is_err(), "the new layout");
    let keys: Vec<String> = backend
        .list(SEMAPHORE, "")
        .await
        .unwrap()
        .entries
        .into_iter()
        .map(|e| e.key)
        .collect();
    assert_eq!(keys, ["a", "b", "c", "d"]);
    let full = backend
        .put(SEMAPHORE, "e", b"v", Some(60_000), &fewer_than(4))
        .await
        .unwrap();
    assert!(matches!(full.outcome, Outcome::Conflict(Some(_))));
}

#[tokio::test]
async fn a_semaphores_rows_are_collected_with_its_partition() {
    let file = File(sqlite_path());
    let clock = Arc::new(ManualClock::new(T0));
    let backend = SqliteBackend::open(SqliteConfig {
        test_clock: Some(clock.clone()),
        retention_ms: 0,
        collect_every: Duration::from_millis(10),
        ..SqliteConfig::new(Some(file.0.clone()))
    })
    .await
    .unwrap();
    let kept = "~sem:1:kept:x";
    for key in ["a", "b", "c"] {
        applied(
            backend
                .put(SEMAPHORE, key, b"v", Some(1000), &fewer_than(3))
                .await
                .unwrap(),
        );
    }
    applied(
        backend
            .put(kept, "a", b"v", Some(60_000), &fewer_than(3))
            .await
            .unwrap(),
    );
    // Every permit of SEMAPHORE expires, with no call to see it: the
    // collector takes the partition and its rows; the other stays whole.
    clock.advance(2000);
    bounded(async {
        while stored(&file.0, SEMAPHORE) != (0, Vec::new()) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(stored(&file.0, kept).0, 1);
    assert!(backend.get(kept, "a").await.unwrap().entry.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_on_one_file_never_grant_more_permits_than_the_limit() {
    // Four processes on one file, five acquirers each, racing for a
    // semaphore of 3 with its permits in rows: each round grants exactly 3
    // (the semaphore starts empty), whoever wins.
    const LIMIT: u32 = 3;
    let file = File(sqlite_path());
    let clock = Arc::new(ManualClock::new(T0));
    let mut backends = Vec::new();
    for _ in 0..4 {
        backends.push(Arc::new(open(&file.0, &clock).await));
    }
    for round in 0..10 {
        let partition = format!("~sem:1:r:{round}");
        let tries = (0..20).map(|n| {
            let backend = backends[n % backends.len()].clone();
            let partition = partition.clone();
            tokio::spawn(async move {
                backend
                    .put(
                        &partition,
                        &format!("owner-{n}"),
                        b"3",
                        Some(60_000),
                        &fewer_than(LIMIT),
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
        assert_eq!(granted, LIMIT, "round {round}");
        assert_eq!(stored(&file.0, &partition).0, u64::from(LIMIT));
    }
}
