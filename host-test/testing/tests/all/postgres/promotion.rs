//! What a standby's promotion loses, with asynchronous and with synchronous
//! replication: a primary and a streaming standby of the test's own on
//! loopback, the primary crashed, the standby promoted.
//!
//! Asynchronous (PostgreSQL's default): an acquisition the primary
//! acknowledged but had not shipped is gone after the promotion, and a new
//! holder's fence is still above the lost one's (revisions are floored at
//! the clock), so the lost holder's fenced writes are refused. Synchronous
//! (`synchronous_commit = remote_apply` to a named standby): every
//! acknowledged acquisition survives, and a write the standby cannot take
//! is never acknowledged: the call is `unavailable`.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{PrivateServer, Stop, applied, bounded, postgres_config};
use coord_host::backend::*;
use coord_postgres::{PostgresBackend, PostgresConfig};
use tokio_postgres::NoTls;

const HELD: &str = "~lock:1:promote:held";
const LATE: &str = "~lock:1:promote:late";

/// Run `sql` on `url` and return the first column of its first row.
pub(super) async fn one(url: &str, sql: &str) -> String {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    let driving = tokio::spawn(connection);
    let rows = client.simple_query(sql).await.unwrap();
    driving.abort();
    rows.iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(String::from),
            _ => None,
        })
        .unwrap_or_default()
}

/// Run a blocking server step off the runtime.
async fn blocking(step: impl FnOnce() -> Result<(), String> + Send + 'static) {
    tokio::task::spawn_blocking(step).await.unwrap().unwrap();
}

/// Wait until `standby` has replayed everything `primary` wrote so far.
async fn caught_up(primary: &str, standby: &str) {
    let lsn = one(primary, "SELECT pg_current_wal_lsn()").await;
    let check = format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn");
    bounded(async {
        while one(standby, &check).await != "t" {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// A primary (synchronous to its standby if `synchronous`), its standby,
/// a backend on the primary, and a holder in `HELD` both have; returns
/// them and the holder's revision.
async fn pair(
    synchronous: bool,
    response_timeout: Duration,
) -> (
    Arc<PrivateServer>,
    Arc<PrivateServer>,
    PostgresBackend,
    PostgresConfig,
    u64,
) {
    let primary = Arc::new(
        tokio::task::spawn_blocking(PrivateServer::start)
            .await
            .unwrap()
            .unwrap(),
    );
    let standby = {
        let primary = primary.clone();
        Arc::new(
            tokio::task::spawn_blocking(move || PrivateServer::standby_of(&primary))
                .await
                .unwrap()
                .unwrap(),
        )
    };
    if synchronous {
        one(
            &primary.url(),
            "ALTER SYSTEM SET synchronous_standby_names = '*'",
        )
        .await;
        one(
            &primary.url(),
            "ALTER SYSTEM SET synchronous_commit = 'remote_apply'",
        )
        .await;
        one(&primary.url(), "SELECT pg_reload_conf()").await;
        // The standby is synchronous once the primary says so.
        bounded(async {
            while one(
                &primary.url(),
                "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
            )
            .await
                != "1"
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    }
    let config = PostgresConfig {
        response_timeout,
        ..postgres_config(&primary.url(), 64, None)
    };
    let backend = PostgresBackend::connect(config.clone()).await.unwrap();
    let held = applied(
        backend
            .put(HELD, "holder", b"a", Some(600_000), &Condition::Absent)
            .await
            .unwrap(),
    );
    caught_up(&primary.url(), &standby.url()).await;
    (primary, standby, backend, config, held.revision)
}

/// Crash the primary, start the (stopped) standby on what it had
/// received, promote it, and connect to it.
async fn fail_over(
    primary: &Arc<PrivateServer>,
    standby: &Arc<PrivateServer>,
    config: &PostgresConfig,
) -> PostgresBackend {
    let crashing = primary.clone();
    blocking(move || crashing.stop(Stop::Immediate)).await;
    let promoting = standby.clone();
    blocking(move || {
        promoting.resume()?;
        promoting.promote()
    })
    .await;
    PostgresBackend::connect(PostgresConfig {
        url: standby.url(),
        ..config.clone()
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asynchronous_replication_loses_an_unshipped_acquisition_and_fences_still_rise() {
    let (primary, standby, backend, config, held) = pair(false, Duration::from_secs(5)).await;
    // The standby falls behind (here: stopped), and the primary
    // acknowledges an acquisition it alone has.
    let stopping = standby.clone();
    blocking(move || stopping.stop(Stop::Fast)).await;
    let late = applied(
        backend
            .put(LATE, "holder", b"b", Some(600_000), &Condition::Absent)
            .await
            .unwrap(),
    );
    drop(backend);
    let promoted = fail_over(&primary, &standby, &config).await;
    let shipped = promoted.get(HELD, "holder").await.unwrap().entry.unwrap();
    assert_eq!(shipped.revision, held, "a shipped acquisition was lost");
    assert_eq!(
        promoted.get(LATE, "holder").await.unwrap().entry,
        None,
        "asynchronous replication kept an acquisition it never shipped"
    );
    // The lost holder still believes it holds LATE at `late.revision`; the
    // next holder's fence is above it, so the lost one's writes are fenced.
    let next = applied(
        promoted
            .put(LATE, "holder", b"c", Some(600_000), &Condition::Absent)
            .await
            .unwrap(),
    );
    assert!(
        next.revision > late.revision,
        "{next:?} after the lost {late:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_replication_keeps_every_acknowledged_acquisition() {
    let (primary, standby, backend, config, held) = pair(true, Duration::from_secs(2)).await;
    // Acknowledged: applied on the standby before the primary answers.
    let late = applied(
        backend
            .put(LATE, "holder", b"b", Some(600_000), &Condition::Absent)
            .await
            .unwrap(),
    );
    // With the standby stopped, no write is acknowledged: unavailable.
    let stopping = standby.clone();
    blocking(move || stopping.stop(Stop::Fast)).await;
    let unacknowledged = backend
        .put(
            "~lock:1:promote:never",
            "holder",
            b"x",
            Some(600_000),
            &Condition::Absent,
        )
        .await;
    assert!(
        matches!(unacknowledged, Err(StoreError::Unavailable(_))),
        "a write the standby could not take: {unacknowledged:?}"
    );
    drop(backend);
    let promoted = fail_over(&primary, &standby, &config).await;
    for (partition, revision) in [(HELD, held), (LATE, late.revision)] {
        let kept = promoted.get(partition, "holder").await.unwrap().entry;
        assert_eq!(
            kept.map(|e| e.revision),
            Some(revision),
            "the acknowledged acquisition of {partition} was lost"
        );
    }
    assert_eq!(
        promoted
            .get("~lock:1:promote:never", "holder")
            .await
            .unwrap()
            .entry,
        None,
        "a write never acknowledged (nor shipped) appeared after the promotion"
    );
    let next = applied(
        promoted
            .put(
                "~lock:1:promote:fresh",
                "holder",
                b"c",
                Some(600_000),
                &Condition::Absent,
            )
            .await
            .unwrap(),
    );
    assert!(next.revision > late.revision, "{next:?} after {late:?}");
}
