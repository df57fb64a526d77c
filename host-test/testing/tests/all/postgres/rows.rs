//! PostgreSQL's layout for a partition that may hold many entries (a
//! semaphore's): a row per entry in `<table>_entries`. The scenarios are
//! `rows_layout.rs`'s; this file runs them on tables of the test server,
//! looking at them through a connection of its own, with backends on
//! separate pools as separate processes would be.

use std::sync::Arc;
use std::time::Duration;

use super::Table;
use crate::common;
use crate::rows_layout::{self, SEMAPHORE, Tables};
use common::{T0, postgres_config, postgres_url};
use coord_host::backend::Backend;
use coord_host::clock::ManualClock;
use coord_postgres::{PostgresBackend, PostgresConfig};
use tokio_postgres::NoTls;

/// Run `sql` on a connection of its own, on a thread of its own (the
/// scenarios ask synchronously), with `name` as `$1` if it has one, and
/// return its rows.
fn query(url: &str, sql: String, name: &str) -> Vec<tokio_postgres::Row> {
    let (url, name) = (url.to_string(), name.as_bytes().to_vec());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (client, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
            let driving = tokio::spawn(connection);
            let rows = match sql.contains("$1") {
                true => client.query(&sql, &[&name]).await.unwrap(),
                false => client.query(&sql, &[]).await.unwrap(),
            };
            driving.abort();
            rows
        })
    })
    .join()
    .unwrap()
}

impl Tables for Table {
    fn empty_partitions(&self) {
        query(&self.url, format!("TRUNCATE {}", self.name), "");
    }

    fn stored(&self, partition: &str) -> (u64, Vec<u8>) {
        let t = &self.name;
        let rows = query(
            &self.url,
            format!(
                "SELECT (SELECT count(*) FROM {t}_entries WHERE partition = $1), \
                 (SELECT state FROM {t} WHERE name = $1)"
            ),
            partition,
        );
        let count: i64 = rows[0].get(0);
        let state: Option<Vec<u8>> = rows[0].get(1);
        (count as u64, state.unwrap_or_default())
    }
}

/// A config for a new table on the test server whose now is `clock`'s, and
/// the guard that drops the table.
async fn config(clock: &Arc<ManualClock>) -> (PostgresConfig, Table) {
    let url = postgres_url().await;
    let config = postgres_config(&url, 64, Some(clock.clone()));
    let table = Table {
        url,
        name: config.table.clone(),
    };
    (config, table)
}

#[tokio::test]
async fn a_semaphore_keeps_a_row_per_permit_and_counts_them_as_the_whole_partition_would() {
    let clock = Arc::new(ManualClock::new(T0));
    let (config, table) = config(&clock).await;
    let backend = PostgresBackend::connect(config.clone()).await.unwrap();
    let other = PostgresBackend::connect(config).await.unwrap();
    rows_layout::a_row_per_permit_counted_as_the_whole_partition_would(
        &backend, &other, &clock, &table,
    )
    .await;
}

#[tokio::test]
async fn a_semaphore_written_before_the_row_layout_keeps_its_permits_and_moves_to_rows() {
    let clock = Arc::new(ManualClock::new(T0));
    let (config, table) = config(&clock).await;
    let backend = PostgresBackend::connect(config).await.unwrap();
    let t = &table.name;
    let (client, connection) = tokio_postgres::connect(&table.url, NoTls).await.unwrap();
    let driving = tokio::spawn(connection);
    client
        .execute(
            &format!(
                "INSERT INTO {t} (name, version, decided_at, state) \
                 VALUES ($1, nextval('{t}_versions'), $2, $3)"
            ),
            &[
                &SEMAPHORE.as_bytes(),
                &(T0 as i64),
                &rows_layout::three_permits_in_the_old_layout(),
            ],
        )
        .await
        .unwrap();
    driving.abort();
    rows_layout::the_old_layout_keeps_its_permits_and_moves_to_rows(&backend, &table).await;
}

#[tokio::test]
async fn a_semaphores_rows_are_collected_with_its_partition() {
    let clock = Arc::new(ManualClock::new(T0));
    let (config, table) = config(&clock).await;
    let backend = PostgresBackend::connect(PostgresConfig {
        retention_ms: 0,
        collect_every: Duration::from_millis(10),
        ..config
    })
    .await
    .unwrap();
    rows_layout::the_rows_are_collected_with_their_partition(&backend, &clock, &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_on_separate_pools_never_grant_more_permits_than_the_limit() {
    let clock = Arc::new(ManualClock::new(T0));
    let (config, table) = config(&clock).await;
    let mut backends: Vec<Arc<dyn Backend>> = Vec::new();
    for _ in 0..4 {
        backends.push(Arc::new(
            PostgresBackend::connect(config.clone()).await.unwrap(),
        ));
    }
    rows_layout::processes_racing_never_grant_more_permits_than_the_limit(&backends, &table).await;
}

#[tokio::test]
async fn permits_whose_partition_row_was_emptied_away_are_gone_not_resurrected() {
    let clock = Arc::new(ManualClock::new(T0));
    let (config, table) = config(&clock).await;
    let backend = PostgresBackend::connect(config).await.unwrap();
    rows_layout::permits_whose_partition_row_went_are_gone_not_resurrected(
        &backend, &clock, &table,
    )
    .await;
}
