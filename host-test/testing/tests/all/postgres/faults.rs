//! The server stalled under a write, a holder stopped inside its
//! transaction, a connection killed in the middle of a write: each call
//! answers `unavailable`, never busy or done, and nothing it sent is
//! applied afterwards — no ghost holder once the stall ends — while fences
//! stay above every earlier one.
//!
//! And the server itself stopped and started again, cleanly and as a crash.
//!
//! A stall here is a lock another session holds: `EXCLUSIVE` on the table
//! (reads go on, every write waits for it), or `FOR UPDATE` on one row.

use std::sync::Arc;
use std::time::Duration;

use super::Table;
use crate::common::{PrivateServer, Stop, applied, bounded, postgres_config, postgres_url};
use coord_host::backend::*;
use coord_postgres::{PostgresBackend, PostgresConfig};
use tokio_postgres::{Client, NoTls};

/// A partition that holds a lock, and one that is free.
const HELD: &str = "~lock:1:stall:held";
const FREE: &str = "~lock:1:stall:free";

/// The test's table and two backends on it: `stalled`, whose connections
/// carry `tag` as their application name (so the test can find them on the
/// server) and give up after `response_timeout`, and `steady`, with the
/// defaults, to set up and check.
struct Setup {
    stalled: Arc<PostgresBackend>,
    steady: PostgresBackend,
    tag: String,
    table: Table,
}

async fn setup(test: &str, response_timeout: Duration) -> Setup {
    let url = postgres_url().await;
    let tag = format!("coord{test}{}", std::process::id());
    let separator = if url.contains('?') { '&' } else { '?' };
    let steady_config = postgres_config(&url, 64, None);
    let stalled_config = PostgresConfig {
        url: format!("{url}{separator}application_name={tag}"),
        response_timeout,
        ..steady_config.clone()
    };
    let table = Table {
        url,
        name: steady_config.table.clone(),
    };
    Setup {
        steady: PostgresBackend::connect(steady_config).await.unwrap(),
        stalled: Arc::new(PostgresBackend::connect(stalled_config).await.unwrap()),
        tag,
        table,
    }
}

/// A session of its own, with its connection driven in the background.
async fn session(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// How many of `tag`'s connections are running a statement, and how many
/// of those wait for a lock.
async fn activity(admin: &Client, tag: &str) -> (i64, i64) {
    let row = admin
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE wait_event_type = 'Lock') \
             FROM pg_stat_activity WHERE application_name = $1 AND state = 'active'",
            &[&tag],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// Wait until `tag`'s connections satisfy `done`, polling the server.
async fn until(admin: &Client, tag: &str, done: impl Fn((i64, i64)) -> bool) {
    bounded(async {
        while !done(activity(admin, tag).await) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// A holder in `HELD`, taken before the stall, and its revision.
async fn hold(steady: &PostgresBackend) -> u64 {
    applied(
        steady
            .put(HELD, "holder", b"a", Some(60_000), &Condition::Absent)
            .await
            .unwrap(),
    )
    .revision
}

/// After the stall: `HELD` is as it was, `FREE` is free, and a new holder
/// there gets a revision above `first`.
async fn nothing_applied_since(steady: &PostgresBackend, first: u64) {
    let held = steady.get(HELD, "holder").await.unwrap().entry.unwrap();
    assert_eq!(
        (held.value.as_slice(), held.revision),
        (&b"a"[..], first),
        "a write answered unavailable changed the holder later"
    );
    assert_eq!(
        steady.get(FREE, "holder").await.unwrap().entry,
        None,
        "an acquisition answered unavailable was applied later: a ghost holder"
    );
    let next = applied(
        steady
            .put(FREE, "holder", b"new", Some(60_000), &Condition::Absent)
            .await
            .unwrap(),
    );
    assert!(next.revision > first, "{next:?} after {first}");
}

fn unavailable<T: std::fmt::Debug>(reply: Result<T, StoreError>, what: &str) {
    assert!(
        matches!(reply, Err(StoreError::Unavailable(_))),
        "{what}: expected unavailable, got {reply:?}"
    );
}

#[tokio::test]
async fn writes_held_up_by_a_table_lock_past_the_timeout_are_unavailable_and_never_applied_later() {
    let s = setup("stall", Duration::from_millis(500)).await;
    let first = hold(&s.steady).await;
    let stall = session(&s.table.url).await;
    stall
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE {} IN EXCLUSIVE MODE",
            s.table.name
        ))
        .await
        .unwrap();
    // Each reads (reads go on), decides, and its write waits for the table
    // until the call gives up.
    unavailable(
        s.stalled
            .put(FREE, "holder", b"ghost", Some(60_000), &Condition::Absent)
            .await,
        "an acquisition",
    );
    unavailable(
        s.stalled
            .put(
                HELD,
                "holder",
                b"extended",
                Some(60_000),
                &Condition::Revision(first),
            )
            .await,
        "an extension",
    );
    unavailable(
        s.stalled
            .delete(HELD, "holder", &Condition::Revision(first))
            .await,
        "a release",
    );
    // The stall ends: the held-up statements run, and change nothing.
    stall.batch_execute("ROLLBACK").await.unwrap();
    let admin = session(&s.table.url).await;
    until(&admin, &s.tag, |(active, _)| active == 0).await;
    nothing_applied_since(&s.steady, first).await;
}

#[tokio::test]
async fn a_row_locked_by_a_stopped_holder_is_unavailable_and_never_written_later() {
    let s = setup("rowlock", Duration::from_millis(500)).await;
    let first = hold(&s.steady).await;
    // Another session locks the row and stops inside its transaction, as a
    // paused process would.
    let holder = session(&s.table.url).await;
    holder
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM {} WHERE name = '{HELD}'::bytea FOR UPDATE",
            s.table.name
        ))
        .await
        .unwrap();
    unavailable(
        s.stalled
            .put(
                HELD,
                "holder",
                b"extended",
                Some(60_000),
                &Condition::Revision(first),
            )
            .await,
        "an extension",
    );
    unavailable(
        s.stalled
            .delete(HELD, "holder", &Condition::Revision(first))
            .await,
        "a release",
    );
    // The holder wakes and commits without writing: nothing queued behind
    // its lock may run now.
    holder.batch_execute("COMMIT").await.unwrap();
    let admin = session(&s.table.url).await;
    until(&admin, &s.tag, |(active, _)| active == 0).await;
    nothing_applied_since(&s.steady, first).await;
}

#[tokio::test]
async fn a_new_partition_another_session_is_making_is_unavailable_and_never_made_later() {
    // Another session inserts the same new partition's row and stops
    // before committing. The acquisition reads no row, decides, and its
    // insert waits for that session after the server checked the clock:
    // the wait itself must end at the call's deadline, or the insert
    // applies once the other session rolls back, a ghost holder of a call
    // answered unavailable.
    let s = setup("insertwait", Duration::from_millis(500)).await;
    let first = hold(&s.steady).await;
    let other = session(&s.table.url).await;
    // Should this test fail, the server ends the other session in time,
    // so that dropping the test's table does not wait for it for ever.
    other
        .batch_execute(&format!(
            "SET idle_in_transaction_session_timeout = '120s'; \
             BEGIN; INSERT INTO {} (name, version, decided_at, state) \
             VALUES ('{FREE}'::bytea, 1, 0, ''::bytea)",
            s.table.name
        ))
        .await
        .unwrap();
    unavailable(
        s.stalled
            .put(FREE, "holder", b"ghost", Some(60_000), &Condition::Absent)
            .await,
        "an acquisition",
    );
    // The held-up insert stops waiting by itself (its deadline passed),
    // while the other session still holds its row.
    let admin = session(&s.table.url).await;
    until(&admin, &s.tag, |(_, waiting)| waiting == 0).await;
    other.batch_execute("ROLLBACK").await.unwrap();
    until(&admin, &s.tag, |(active, _)| active == 0).await;
    nothing_applied_since(&s.steady, first).await;
}

#[tokio::test]
async fn a_connection_killed_inside_a_write_is_unavailable_and_applies_nothing() {
    // A long timeout: the kill, not the timeout, ends the call.
    let s = setup("killwrite", Duration::from_secs(600)).await;
    let first = hold(&s.steady).await;
    let stall = session(&s.table.url).await;
    stall
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE {} IN EXCLUSIVE MODE",
            s.table.name
        ))
        .await
        .unwrap();
    let call = {
        let stalled = s.stalled.clone();
        tokio::spawn(async move {
            stalled
                .put(FREE, "holder", b"ghost", Some(60_000), &Condition::Absent)
                .await
        })
    };
    // Its write is on the server, waiting for the table: kill that
    // connection.
    let admin = session(&s.table.url).await;
    until(&admin, &s.tag, |(_, waiting)| waiting > 0).await;
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = $1 AND wait_event_type = 'Lock'",
            &[&s.tag],
        )
        .await
        .unwrap();
    unavailable(bounded(call).await.unwrap(), "the killed acquisition");
    stall.batch_execute("ROLLBACK").await.unwrap();
    nothing_applied_since(&s.steady, first).await;
    // The pool replaces the dead connection: the next calls get through.
    let mut written = false;
    for _ in 0..10 {
        match s
            .stalled
            .put(HELD, "other", b"v", Some(60_000), &Condition::Always)
            .await
        {
            Ok(reply) => {
                written = matches!(reply.outcome, Outcome::Applied(_));
                break;
            }
            Err(StoreError::Unavailable(_)) => {}
            Err(other) => panic!("expected unavailable or done, got {other:?}"),
        }
    }
    assert!(written, "the pool never recovered");
}

/// Stop the test's own server `how`, call through the outage, start it
/// again: calls in the outage are `unavailable`, every acquisition
/// committed before it survives, and fences rise after it.
async fn through_a_restart(how: Stop) {
    let server = Arc::new(
        tokio::task::spawn_blocking(PrivateServer::start)
            .await
            .unwrap()
            .unwrap(),
    );
    let config = PostgresConfig {
        response_timeout: Duration::from_secs(2),
        ..postgres_config(&server.url(), 64, None)
    };
    let backend = Arc::new(PostgresBackend::connect(config).await.unwrap());
    let first = hold(&backend).await;
    let watched = "eph:1:restart:room";
    backend
        .put(watched, "k", b"1", None, &Condition::Always)
        .await
        .unwrap();
    let seen = backend.list(watched, "").await.unwrap().revision;
    let waiter = {
        let backend = backend.clone();
        tokio::spawn(async move { backend.wait(watched, seen, 600_000).await })
    };
    bounded(async {
        while backend.waiters(watched) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;

    let stopping = server.clone();
    tokio::task::spawn_blocking(move || stopping.stop(how))
        .await
        .unwrap()
        .unwrap();
    unavailable(
        backend
            .put(FREE, "holder", b"b", Some(60_000), &Condition::Absent)
            .await,
        "an acquisition while the server is down",
    );
    unavailable(
        backend
            .put(HELD, "holder", b"b", Some(60_000), &Condition::Absent)
            .await,
        "a contender while the server is down (never busy)",
    );

    let resuming = server.clone();
    tokio::task::spawn_blocking(move || resuming.resume())
        .await
        .unwrap()
        .unwrap();
    // The pool's connections died with the server: each call meets at most
    // one of them, and the pool makes new ones.
    let mut next = None;
    for _ in 0..20 {
        match backend
            .put(FREE, "holder", b"c", Some(60_000), &Condition::Absent)
            .await
        {
            Ok(reply) => {
                next = Some(applied(reply));
                break;
            }
            Err(StoreError::Unavailable(_)) => {}
            Err(other) => panic!("expected unavailable or done, got {other:?}"),
        }
    }
    let next = next.expect("the pool never reconnected");
    assert!(next.revision > first, "{next:?} after {first}");
    let held = backend.get(HELD, "holder").await.unwrap().entry;
    assert_eq!(
        held.map(|e| (e.value, e.revision)),
        Some((b"a".to_vec(), first)),
        "the acquisition committed before the {how:?} stop was lost"
    );
    // The waiter answers: woken by a write after the restart (the listener
    // reconnected, or its re-check saw it), or unavailable if its own
    // connection died under it.
    backend
        .put(watched, "k", b"2", None, &Condition::Always)
        .await
        .unwrap();
    match bounded(waiter).await.unwrap() {
        Ok(woken) => assert!(woken > seen),
        Err(StoreError::Unavailable(_)) => {}
        Err(other) => panic!("expected a revision or unavailable, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restarted_cleanly_keeps_every_holder_and_fences_rise() {
    through_a_restart(Stop::Fast).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_crashed_and_restarted_keeps_every_committed_holder_and_fences_rise() {
    through_a_restart(Stop::Immediate).await;
}

/// A server made read-only (as managed PostgreSQL does when its disk fills:
/// `default_transaction_read_only` for every session) still tells the time
/// and answers reads while every write fails: it is not ready. Before,
/// readiness asked for the clock alone and said ready (issue 48: a probe
/// exercises what it claims). Made writable again, it is ready and writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_made_read_only_is_not_ready_and_writes_are_unavailable() {
    let server = tokio::task::spawn_blocking(PrivateServer::start)
        .await
        .unwrap()
        .unwrap();
    let backend = PostgresBackend::connect(postgres_config(&server.url(), 64, None))
        .await
        .unwrap();
    backend.ready().await.unwrap();
    let admin = session(&server.url()).await;
    // One statement a call: ALTER SYSTEM refuses a transaction block.
    for sql in [
        "ALTER SYSTEM SET default_transaction_read_only = on",
        "SELECT pg_reload_conf()",
    ] {
        admin.batch_execute(sql).await.unwrap();
    }
    // Each session takes the reload at its next statement.
    bounded(async {
        while backend.ready().await.is_ok() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    backend.now().await.unwrap();
    bounded(async {
        for n in 0.. {
            let key = format!("holder{n}");
            match backend
                .put(FREE, &key, b"a", Some(60_000), &Condition::Absent)
                .await
            {
                Err(StoreError::Unavailable(_)) => break,
                // A pooled session that has not taken the reload yet.
                Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                Err(other) => panic!("a write to a read-only server: {other:?}"),
            }
        }
    })
    .await;
    for sql in [
        "ALTER SYSTEM RESET default_transaction_read_only",
        "SELECT pg_reload_conf()",
    ] {
        admin.batch_execute(sql).await.unwrap();
    }
    bounded(async {
        while backend.ready().await.is_err() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    applied(
        backend
            .put(FREE, "again", b"a", Some(60_000), &Condition::Absent)
            .await
            .unwrap(),
    );
}
