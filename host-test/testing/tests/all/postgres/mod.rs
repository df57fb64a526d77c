//! What only the PostgreSQL backend has to show: the server's clock, a
//! table emptied under it, connections the server kills mid-wait and
//! between calls, rows it did not write, no server at all, and backends on
//! separate pools granting a key to exactly one. The contract itself is
//! checked by the shared suites (`conformance.rs` and the others run on
//! PostgreSQL too).

use std::sync::Arc;
use std::time::Duration;

use crate::common;
use common::{applied, bounded, drop_table, postgres_config, postgres_url};
use coord_host::backend::*;
use coord_postgres::{PostgresBackend, PostgresConfig};
use tokio_postgres::NoTls;

mod durability;
mod faults;
mod promotion;
mod rows;
mod speculation;

/// A backend on the test server, on the server's own clock; its table is
/// dropped when the returned guard drops.
async fn on_server_clock() -> (PostgresBackend, Table) {
    let url = postgres_url().await;
    let config = postgres_config(&url, 64, None);
    let table = Table {
        url,
        name: config.table.clone(),
    };
    (PostgresBackend::connect(config).await.unwrap(), table)
}

/// A test's table, dropped at the end.
struct Table {
    url: String,
    name: String,
}

impl Drop for Table {
    fn drop(&mut self) {
        drop_table(self.url.clone(), self.name.clone());
    }
}

/// Run `sql` on a connection of its own.
async fn admin(url: &str, sql: &str) {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    let driving = tokio::spawn(connection);
    client.batch_execute(sql).await.unwrap();
    driving.abort();
}

#[tokio::test]
async fn no_server_at_the_url_is_unavailable_and_a_bad_table_is_invalid() {
    let port = common::free_ports(1).unwrap()[0];
    let config = PostgresConfig {
        response_timeout: Duration::from_secs(2),
        ..PostgresConfig::new(&format!("postgres://postgres@127.0.0.1:{port}/postgres"))
    };
    let error = bounded(PostgresBackend::connect(config))
        .await
        .err()
        .unwrap();
    assert!(matches!(error, StoreError::Unavailable(_)), "{error:?}");

    let bad = PostgresConfig {
        table: "t; drop table x".into(),
        ..PostgresConfig::new(&postgres_url().await)
    };
    let error = PostgresBackend::connect(bad).await.err().unwrap();
    assert!(
        matches!(&error, StoreError::Invalid(m) if m.starts_with("table:")),
        "{error:?}"
    );
}

#[tokio::test]
async fn the_listening_connection_goes_to_the_listen_url_and_a_bad_one_is_invalid() {
    // Behind a transaction-mode pooler the pool's URL is the pooler's; the
    // LISTEN needs a session of its own, so it takes the URL it is given.
    let url = postgres_url().await;
    let separator = if url.contains('?') { '&' } else { '?' };
    let tag = format!("coordlisten{}", std::process::id());
    let config = PostgresConfig {
        listen_url: Some(format!("{url}{separator}application_name={tag}")),
        ..postgres_config(&url, 64, None)
    };
    let _table = Table {
        url: url.clone(),
        name: config.table.clone(),
    };
    let listen = format!("LISTEN {}_changes", config.table);
    let _backend = PostgresBackend::connect(config.clone()).await.unwrap();
    let (client, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(connection);
    let names: Vec<String> = client
        .query(
            "SELECT application_name FROM pg_stat_activity WHERE query = $1",
            &[&listen],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(names, vec![tag], "the LISTEN went elsewhere");

    let bad = PostgresConfig {
        listen_url: Some("postgres://[".into()),
        ..config
    };
    let error = PostgresBackend::connect(bad).await.err().unwrap();
    assert!(
        matches!(&error, StoreError::Invalid(m) if m.starts_with("listen_url:")),
        "{error:?}"
    );
}

#[tokio::test]
async fn the_clock_is_the_servers_and_expiry_happens_on_it() {
    let (backend, _table) = on_server_clock().await;
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let now = backend.now().await.unwrap();
    // The server runs on this machine: its clock is this machine's.
    assert!(
        now + 5_000 > before && now < before + 60_000,
        "{now} against {before}"
    );
    let put = backend
        .put("eph:1:a:b", "k", b"v", Some(200), &Condition::Absent)
        .await
        .unwrap();
    let entry = applied(put);
    assert_eq!(entry.expires_at, Some(entry.updated_at + 200));
    while backend.now().await.unwrap() <= entry.expires_at.unwrap() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(backend.get("eph:1:a:b", "k").await.unwrap().entry, None);
}

#[tokio::test]
async fn a_table_emptied_under_the_backend_still_issues_revisions_above_every_earlier_one() {
    let (backend, table) = on_server_clock().await;
    let p = "~lock:1:a:b";
    let first = applied(
        backend
            .put(p, "holder", b"a", Some(60_000), &Condition::Absent)
            .await
            .unwrap(),
    );
    admin(&table.url, &format!("TRUNCATE {}", table.name)).await;
    // The holder is gone with the data; a new one gets a greater revision,
    // so its fence is above the lost holder's.
    let second = applied(
        backend
            .put(p, "holder", b"b", Some(60_000), &Condition::Absent)
            .await
            .unwrap(),
    );
    assert!(
        second.revision > first.revision,
        "{second:?} after {first:?}"
    );
    // And the lost holder cannot write over the new one.
    let stale = backend
        .delete(p, "holder", &Condition::Revision(first.revision))
        .await
        .unwrap();
    assert!(
        matches!(stale.outcome, Outcome::Conflict(Some(_))),
        "{stale:?}"
    );
}

#[tokio::test]
async fn connections_killed_by_the_server_cost_a_call_each_at_most_and_never_strand_a_waiter() {
    let url = postgres_url().await;
    // A name for this backend's connections alone: the other tests' stay.
    let name = format!("coordkill{}", std::process::id());
    let separator = if url.contains('?') { '&' } else { '?' };
    let config = postgres_config(
        &format!("{url}{separator}application_name={name}"),
        64,
        None,
    );
    let table = Table {
        url: url.clone(),
        name: config.table.clone(),
    };
    let backend = Arc::new(PostgresBackend::connect(config).await.unwrap());
    let p = "eph:1:kill:me";
    backend
        .put(p, "k", b"1", None, &Condition::Always)
        .await
        .unwrap();
    let revision = backend.list(p, "").await.unwrap().revision;
    // A waiter, asleep on the partition.
    let waiter = {
        let backend = backend.clone();
        tokio::spawn(async move { backend.wait(p, revision, 60_000).await })
    };
    while backend.waiters(p) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Every connection of this backend: the pool's and the listening one.
    admin(
        &table.url,
        &format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = '{name}'"
        ),
    )
    .await;
    // The next calls may meet a dead connection: each is answered
    // (unavailable or done), and the pool makes new ones.
    let mut written = false;
    for _ in 0..10 {
        match backend.put(p, "k", b"2", None, &Condition::Always).await {
            Ok(_) => {
                written = true;
                break;
            }
            Err(StoreError::Unavailable(_)) => {}
            Err(other) => panic!("expected unavailable or done, got {other:?}"),
        }
    }
    assert!(written, "the pool never recovered");
    // The write wakes the waiter: by the announcement if the listener is
    // back, else by its re-check; a waiter whose own connection died
    // answers unavailable. Either way it answers.
    match bounded(waiter).await.unwrap() {
        Ok(woken) => assert!(woken > revision),
        Err(StoreError::Unavailable(_)) => {}
        Err(other) => panic!("expected a revision or unavailable, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_the_listening_connection_missed_still_wakes_a_waiter_with_an_hour_between_rechecks()
 {
    let url = postgres_url().await;
    let name = format!("coordlisten{}", std::process::id());
    let separator = if url.contains('?') { '&' } else { '?' };
    let config = PostgresConfig {
        recheck: Duration::from_secs(3600),
        ..postgres_config(
            &format!("{url}{separator}application_name={name}"),
            64,
            None,
        )
    };
    let table = Table {
        url: url.clone(),
        name: config.table.clone(),
    };
    let writer = PostgresBackend::connect(PostgresConfig {
        url: url.clone(),
        ..config.clone()
    })
    .await
    .unwrap();
    let waiting = Arc::new(PostgresBackend::connect(config).await.unwrap());
    let p = "eph:1:listen:lost";
    for round in 0..5 {
        let after = waiting.list(p, "").await.unwrap().revision;
        let waiter = {
            let waiting = waiting.clone();
            tokio::spawn(async move { waiting.wait(p, after, 3_600_000).await })
        };
        bounded(async {
            while waiting.waiters(p) == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await;
        // Only the waiting backend's listening connection goes; the write
        // follows at once, before the listener is back half a second
        // later, so its announcement reaches nobody in that process.
        admin(
            &table.url,
            &format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE application_name = '{name}' AND query LIKE 'LISTEN %'"
            ),
        )
        .await;
        let written = applied(
            writer
                .put(
                    p,
                    "k",
                    format!("{round}").as_bytes(),
                    None,
                    &Condition::Always,
                )
                .await
                .unwrap(),
        );
        // Its re-check is an hour away: it answers because it learnt the
        // listener was lost and checked again once one listened.
        let woken = bounded(waiter).await.unwrap().unwrap();
        assert!(
            woken >= written.revision,
            "round {round}: woken at {woken}, written at {}",
            written.revision
        );
    }
}

#[tokio::test]
async fn a_row_coord_did_not_write_is_unavailable_not_a_panic() {
    let (backend, table) = on_server_clock().await;
    backend.now().await.unwrap();
    admin(
        &table.url,
        &format!(
            "INSERT INTO {t} (name, version, decided_at, state) \
             VALUES ('eph:1:x:y'::bytea, nextval('{t}_versions'), 0, '\\x00ff'::bytea)",
            t = table.name
        ),
    )
    .await;
    let error = backend.get("eph:1:x:y", "k").await.err().unwrap();
    assert!(
        matches!(&error, StoreError::Unavailable(m) if m.contains("not a coord partition")),
        "{error:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_on_separate_pools_grant_a_key_to_exactly_one() {
    let url = postgres_url().await;
    let config = postgres_config(&url, 64, None);
    let _table = Table {
        url: url.clone(),
        name: config.table.clone(),
    };
    let mut backends = Vec::new();
    for _ in 0..4 {
        backends.push(Arc::new(
            PostgresBackend::connect(config.clone()).await.unwrap(),
        ));
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
async fn a_waiter_on_another_backend_is_woken_by_the_write_not_by_its_recheck() {
    // Registrations shorter than a round: each round writes one.
    woken_by_the_write(Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_row_still_says_so_is_woken_without_registering_again() {
    // Registrations of two hours: rounds after the first write none.
    woken_by_the_write(Duration::from_secs(7200)).await;
}

/// 30 rounds of a waiter on one backend and a write on another, with
/// re-checks an hour apart, so a waiter that answers was told.
async fn woken_by_the_write(registration: Duration) {
    let url = postgres_url().await;
    let config = PostgresConfig {
        recheck: Duration::from_secs(3600),
        registration,
        ..postgres_config(&url, 64, None)
    };
    let _table = Table {
        url,
        name: config.table.clone(),
    };
    let writer = PostgresBackend::connect(config.clone()).await.unwrap();
    let waiting = Arc::new(PostgresBackend::connect(config).await.unwrap());
    // A new row (its first write always announces itself), then rows
    // that exist (a write announces itself when a waiter registered),
    // each write racing the waiter's registration.
    for round in 0..30 {
        let p = format!("eph:1:wake:{}", round % 3);
        let after = waiting.list(&p, "").await.unwrap().revision;
        let waiter = {
            let (waiting, p) = (waiting.clone(), p.clone());
            tokio::spawn(async move { waiting.wait(&p, after, 3_600_000).await })
        };
        if round % 2 == 0 {
            // Half the rounds write once the waiter sleeps, half at once.
            bounded(async {
                while waiting.waiters(&p) == 0 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
            .await;
        }
        let written = applied(
            writer
                .put(
                    &p,
                    "k",
                    format!("{round}").as_bytes(),
                    None,
                    &Condition::Always,
                )
                .await
                .unwrap(),
        );
        let woken = bounded(waiter).await.unwrap().unwrap();
        assert!(
            woken >= written.revision && woken > after,
            "round {round}: woken at {woken}, written at {}",
            written.revision
        );
    }
}
