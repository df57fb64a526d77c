//! SQLite's layout for a partition that may hold many entries (a
//! semaphore's): a row per entry in `coord_entries`. The scenarios are
//! `rows_layout.rs`'s; this file runs them on database files, looking at the
//! tables through a connection of its own.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::common;
use crate::rows_layout::{self, SEMAPHORE, Tables};
use common::{T0, delete_sqlite, sqlite_path};
use coord_host::backend::Backend;
use coord_host::clock::ManualClock;
use coord_sqlite::{SqliteBackend, SqliteConfig};

/// A test's database file, deleted at the end.
struct File(PathBuf);

impl Drop for File {
    fn drop(&mut self) {
        delete_sqlite(&self.0);
    }
}

impl Tables for File {
    fn empty_partitions(&self) {
        let c = rusqlite::Connection::open(&self.0).unwrap();
        c.execute("DELETE FROM coord_partitions", []).unwrap();
    }

    fn stored(&self, partition: &str) -> (u64, Vec<u8>) {
        let c = rusqlite::Connection::open(&self.0).unwrap();
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

#[tokio::test]
async fn a_semaphore_keeps_a_row_per_permit_and_counts_them_as_the_whole_partition_would() {
    let file = File(sqlite_path());
    let clock = Arc::new(ManualClock::new(T0));
    let (backend, other) = (open(&file.0, &clock).await, open(&file.0, &clock).await);
    rows_layout::a_row_per_permit_counted_as_the_whole_partition_would(
        &backend, &other, &clock, &file,
    )
    .await;
}

#[tokio::test]
async fn a_semaphore_written_before_the_row_layout_keeps_its_permits_and_moves_to_rows() {
    let file = File(sqlite_path());
    let clock = Arc::new(ManualClock::new(T0));
    let backend = open(&file.0, &clock).await;
    rusqlite::Connection::open(&file.0)
        .unwrap()
        .execute(
            "INSERT INTO coord_partitions (name, decided_at, state, collect_at) \
             VALUES (?1, ?2, ?3, NULL)",
            rusqlite::params![
                SEMAPHORE.as_bytes(),
                T0 as i64,
                rows_layout::three_permits_in_the_old_layout()
            ],
        )
        .unwrap();
    rows_layout::the_old_layout_keeps_its_permits_and_moves_to_rows(&backend, &file).await;
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
    rows_layout::the_rows_are_collected_with_their_partition(&backend, &clock, &file).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_on_one_file_never_grant_more_permits_than_the_limit() {
    let file = File(sqlite_path());
    let clock = Arc::new(ManualClock::new(T0));
    let mut backends: Vec<Arc<dyn Backend>> = Vec::new();
    for _ in 0..4 {
        backends.push(Arc::new(open(&file.0, &clock).await));
    }
    rows_layout::processes_racing_never_grant_more_permits_than_the_limit(&backends, &file).await;
}

#[tokio::test]
async fn permits_whose_partition_row_was_deleted_away_are_gone_not_resurrected() {
    let file = File(sqlite_path());
    let clock = Arc::new(ManualClock::new(T0));
    let backend = open(&file.0, &clock).await;
    rows_layout::permits_whose_partition_row_went_are_gone_not_resurrected(&backend, &clock, &file)
        .await;
}
