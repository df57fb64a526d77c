//! The table's durability: relaxed commits are answered without waiting
//! for what a durable commit waits for, every write follows the table's
//! mode as it is at that write (never one process's, never a setting left
//! on a pooled connection), and one process may raise the mode but relax
//! it only with a second explicit word.
//!
//! What a durable commit waits for is made visible with a synchronous
//! standby that never connects (`synchronous_standby_names` naming it): a
//! durable commit then waits for ever, so the call is `unavailable` at its
//! response timeout, while a relaxed one (`synchronous_commit = off`) is
//! answered.

use std::time::Duration;

use super::promotion::one;
use super::{Table, admin, on_server_clock};
use crate::common::{PrivateServer, Stop, applied, bounded, postgres_config, postgres_url};
use coord_host::backend::*;
use coord_postgres::{Durability, PostgresBackend, PostgresConfig};

const KEY: &str = "~lock:1:durability:k";

/// A backend on `url`'s table `table` asking for `durability`.
async fn asking(
    url: &str,
    table: &str,
    durability: Option<Durability>,
    allow_relaxed: bool,
) -> PostgresBackend {
    let config = PostgresConfig {
        table: table.to_string(),
        durability,
        allow_relaxed,
        ..postgres_config(url, 64, None)
    };
    bounded(PostgresBackend::connect(config)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relaxed_commits_skip_the_wait_and_every_write_follows_the_table() {
    let server = tokio::task::spawn_blocking(PrivateServer::start)
        .await
        .unwrap()
        .unwrap();
    let url = server.url();
    // One connection, so a setting left on it would reach the next write.
    // The timeout only ends the durable write below, which never commits.
    let config = PostgresConfig {
        durability: Some(Durability::Relaxed),
        pool_size: 1,
        response_timeout: Duration::from_secs(10),
        ..postgres_config(&url, 64, None)
    };
    let table = config.table.clone();
    let relaxed = bounded(PostgresBackend::connect(config)).await.unwrap();
    assert_eq!(
        relaxed.durability(),
        Durability::Relaxed,
        "a new table gets what was asked"
    );
    let follower = asking(&url, &table, None, false).await;
    assert_eq!(
        follower.durability(),
        Durability::Relaxed,
        "asking nothing keeps the table's"
    );
    assert!(
        Backend::warnings(&follower).is_empty(),
        "{:?}",
        Backend::warnings(&follower)
    );

    // From here a durable commit waits for a standby that never comes.
    one(
        &url,
        "ALTER SYSTEM SET synchronous_standby_names = 'absent_standby'",
    )
    .await;
    one(&url, "SELECT pg_reload_conf()").await;
    bounded(async {
        while one(&url, "SHOW synchronous_standby_names").await != "absent_standby" {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;

    for (backend, owner) in [(&relaxed, "first"), (&follower, "second")] {
        let key = format!("{KEY}:{owner}");
        let written = bounded(backend.put("p", &key, b"held", Some(600_000), &Condition::Absent))
            .await
            .unwrap();
        applied(written);
    }

    // The operator raises the table (its own commit not waiting either).
    admin(
        &url,
        &format!(
            "SET synchronous_commit = local; \
             UPDATE {table}_settings SET durability = 'durable'"
        ),
    )
    .await;
    let error = bounded(relaxed.put("p", KEY, b"held", Some(600_000), &Condition::Absent))
        .await
        .unwrap_err();
    assert!(
        matches!(error, StoreError::Unavailable(_)),
        "a durable write was answered without its synchronous standby: {error:?}"
    );
    drop((relaxed, follower));
    drop(server);
}

#[tokio::test]
async fn one_process_raises_durability_but_relaxes_it_only_with_a_second_word() {
    let url = postgres_url().await;
    let (first, table) = on_server_clock().await;
    let name = table.name.clone();
    assert_eq!(
        first.durability(),
        Durability::Durable,
        "a table is durable by default"
    );

    let asked = asking(&url, &name, Some(Durability::Relaxed), false).await;
    assert_eq!(
        asked.durability(),
        Durability::Durable,
        "relaxed without the second word"
    );
    let warnings = Backend::warnings(&asked).join(" ");
    assert!(
        warnings.contains("--allow-relaxed-durability"),
        "{warnings}"
    );

    let allowed = asking(&url, &name, Some(Durability::Relaxed), true).await;
    assert_eq!(allowed.durability(), Durability::Relaxed);
    assert!(
        Backend::warnings(&allowed).is_empty(),
        "{:?}",
        Backend::warnings(&allowed)
    );
    // The first process relied on durable commits: its probe says so.
    bounded(Backend::ready(&first)).await.unwrap();
    let warnings = Backend::warnings(&first).join(" ");
    assert!(
        warnings.contains("another process relaxed it"),
        "{warnings}"
    );

    let raised = asking(&url, &name, Some(Durability::Durable), false).await;
    assert_eq!(
        raised.durability(),
        Durability::Durable,
        "durable always raises"
    );
    bounded(Backend::ready(&first)).await.unwrap();
    assert!(
        Backend::warnings(&first).is_empty(),
        "{:?}",
        Backend::warnings(&first)
    );
    drop((first, asked, allowed, raised));
    drop::<Table>(table);
}

/// One writer acquires a new key after another on a server of its own
/// until the server crashes (every process killed, as `pg_ctl stop -m
/// immediate` does); after the restart, how many acquisitions it had
/// acknowledged, and how many of those are gone.
async fn lost_in_a_crash(durability: Durability) -> (usize, usize) {
    let server = std::sync::Arc::new(
        tokio::task::spawn_blocking(PrivateServer::start)
            .await
            .unwrap()
            .unwrap(),
    );
    let config = PostgresConfig {
        durability: Some(durability),
        allow_relaxed: true,
        ..postgres_config(&server.url(), 64, None)
    };
    let backend = std::sync::Arc::new(bounded(PostgresBackend::connect(config)).await.unwrap());
    let acknowledged = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writer = {
        let (backend, acknowledged) = (backend.clone(), acknowledged.clone());
        tokio::spawn(async move {
            for i in 0usize.. {
                let partition = format!("crash:{i}");
                match backend
                    .put(&partition, KEY, b"held", Some(600_000), &Condition::Absent)
                    .await
                {
                    Ok(_) => acknowledged.store(i + 1, std::sync::atomic::Ordering::SeqCst),
                    Err(_) => break,
                }
            }
        })
    };
    // Crash once the writer is well under way.
    bounded(async {
        while acknowledged.load(std::sync::atomic::Ordering::SeqCst) < 300 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let crashing = server.clone();
    tokio::task::spawn_blocking(move || crashing.stop(Stop::Immediate))
        .await
        .unwrap()
        .unwrap();
    bounded(writer).await.unwrap();
    let acknowledged = acknowledged.load(std::sync::atomic::Ordering::SeqCst);
    let resuming = server.clone();
    tokio::task::spawn_blocking(move || resuming.resume())
        .await
        .unwrap()
        .unwrap();
    let mut lost = 0;
    for i in 0..acknowledged {
        let read = bounded(backend.get(&format!("crash:{i}"), KEY))
            .await
            .unwrap();
        lost += usize::from(read.entry.is_none());
    }
    (acknowledged, lost)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_loses_no_durable_acquisition_and_at_most_the_relaxed_last_moments() {
    let (acknowledged, lost) = lost_in_a_crash(Durability::Durable).await;
    assert_eq!(
        lost, 0,
        "durable: {lost} of {acknowledged} acknowledged acquisitions lost"
    );
    let (acknowledged, lost) = lost_in_a_crash(Durability::Relaxed).await;
    // What a crash costs in relaxed mode depends on when it strikes: it
    // is measured (docs/failover.md), not a property to assert, beyond
    // losing only a tail: the first acquisitions were flushed long ago.
    println!("relaxed: {lost} of {acknowledged} acknowledged acquisitions lost in the crash");
    assert!(lost < acknowledged, "relaxed: everything was lost ({lost})");
}
