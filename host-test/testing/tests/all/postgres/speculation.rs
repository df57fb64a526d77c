//! One-statement writes (`host-test/postgres/src/speculation.rs`): a write
//! to a row this process saw last is one round trip, one to a row another
//! process changed is two and still right, and a row that only looks as
//! remembered (the same version, other contents, as a sequence restored
//! from a backup would give) is never trusted. A write decided on a wrong
//! estimate of the server's clock applies nothing: not ahead of it (a hold
//! that only looks expired, or a new entry stamped in the server's future),
//! nor behind it (a hold that only looks live).

use std::sync::Arc;

use coord_host::backend::*;
use coord_postgres::PostgresBackend;
use tokio_postgres::NoTls;
use tokio_postgres::types::Type;

use super::{Table, on_server_clock};
use crate::common::{T0, applied, postgres_config, postgres_url};
use coord_host::clock::ManualClock;

/// Two backends on one table, as two processes would have them, on a test
/// clock: whether a speculation applies then depends on the row alone, not
/// on how well a busy machine's replies bounded the server's clock (which
/// `coord-bench --sql` counts instead, as round trips per call).
async fn two_processes() -> (Arc<PostgresBackend>, Arc<PostgresBackend>, Table) {
    let url = postgres_url().await;
    let clock = Arc::new(ManualClock::new(T0));
    let config = postgres_config(&url, 64, Some(clock));
    let table = Table {
        url,
        name: config.table.clone(),
    };
    let a = PostgresBackend::connect(config.clone()).await.unwrap();
    let b = PostgresBackend::connect(config).await.unwrap();
    (Arc::new(a), Arc::new(b), table)
}

/// The round trips `backend` spends on `call`, and its answer.
async fn trips<T>(backend: &PostgresBackend, call: impl Future<Output = T>) -> (u64, T) {
    let before = backend.round_trips();
    let answer = call.await;
    (backend.round_trips() - before, answer)
}

#[tokio::test]
async fn a_write_to_a_row_this_process_saw_last_is_one_round_trip_and_after_another_process_two() {
    let (a, b, _table) = two_processes().await;
    let p = "~lock:1:spec:one";
    let ttl = Some(60_000);
    // A's first call knows neither the row nor the server's clock: read,
    // then write.
    let (n, first) = trips(&a, a.put(p, "holder", b"a", ttl, &Condition::Absent)).await;
    let first = applied(first.unwrap());
    assert_eq!(n, 2, "a first call reads, then writes");
    // A alone on the row: every write is one statement.
    let mut held = first;
    for round in 0..5 {
        let (n, released) = trips(
            &a,
            a.delete(p, "holder", &Condition::Revision(held.revision)),
        )
        .await;
        assert!(
            matches!(released.unwrap().outcome, Outcome::Applied(_)),
            "round {round}"
        );
        assert_eq!(n, 1, "round {round}: a release of A's own row");
        let (n, again) = trips(&a, a.put(p, "holder", b"a", ttl, &Condition::Absent)).await;
        let again = applied(again.unwrap());
        assert!(again.revision > held.revision, "round {round}");
        assert_eq!(n, 1, "round {round}: an acquire on A's own row");
        held = again;
    }
    // B takes the row over (its first call: two), releasing A's hold.
    let (n, taken) = trips(&b, b.delete(p, "holder", &Condition::Always)).await;
    assert!(matches!(taken.unwrap().outcome, Outcome::Applied(_)));
    assert_eq!(n, 2);
    let by_b = applied(
        b.put(p, "holder", b"b", ttl, &Condition::Absent)
            .await
            .unwrap(),
    );
    // A's memory of the row is stale: its speculation does not apply, and
    // the same statement's reply is what it decides on. The holder is B,
    // so A's acquire conflicts, naming B's entry, and A's release of its
    // old hold changes nothing.
    let (n, busy) = trips(&a, a.put(p, "holder", b"a", ttl, &Condition::Absent)).await;
    match busy.unwrap().outcome {
        Outcome::Conflict(Some(current)) => assert_eq!(current, by_b),
        other => panic!("expected a conflict naming B's entry, got {other:?}"),
    }
    assert_eq!(
        n, 1,
        "a conflict is answered by the failed speculation's reply"
    );
    let stale = a
        .delete(p, "holder", &Condition::Revision(held.revision))
        .await
        .unwrap();
    assert!(
        matches!(stale.outcome, Outcome::Conflict(Some(_))),
        "{stale:?}"
    );
    assert_eq!(b.get(p, "holder").await.unwrap().entry, Some(by_b.clone()));
    // B writes again; a write A makes over B's row is the failed
    // speculation, then the write.
    applied(b.put(p, "b2", b"b", ttl, &Condition::Absent).await.unwrap());
    let (n, over) = trips(&a, a.put(p, "other", b"a", ttl, &Condition::Absent)).await;
    applied(over.unwrap());
    assert_eq!(n, 2);
    // And then A is the last to have written it again: one.
    let (n, next) = trips(&a, a.put(p, "third", b"a", ttl, &Condition::Absent)).await;
    applied(next.unwrap());
    assert_eq!(n, 1);
}

#[tokio::test]
async fn a_row_back_at_a_remembered_version_with_other_contents_is_read_not_trusted() {
    let (a, _b, table) = two_processes().await;
    let p = "~lock:1:spec:restored";
    let name = table.name.clone();
    let (client, connection) = tokio_postgres::connect(&table.url, NoTls).await.unwrap();
    let driving = tokio::spawn(connection);
    // A holds the lock; the row as it is then is kept aside (a backup).
    applied(
        a.put(p, "holder", b"a", Some(60_000), &Condition::Absent)
            .await
            .unwrap(),
    );
    let rows = client
        .query_typed(
            &format!("SELECT state FROM {name} WHERE name = $1"),
            &[(&p.as_bytes(), Type::BYTEA)],
        )
        .await
        .unwrap();
    let held: Vec<u8> = rows[0].get(0);
    // A releases it: A remembers the row, free, at its new version.
    let released = a.delete(p, "holder", &Condition::Always).await.unwrap();
    assert!(matches!(released.outcome, Outcome::Applied(_)));
    // The row comes back holding the lock, at the version A remembers (as
    // when a restored sequence issues a version again).
    client
        .query_typed(
            &format!("UPDATE {name} SET state = $2 WHERE name = $1"),
            &[(&p.as_bytes(), Type::BYTEA), (&held, Type::BYTEA)],
        )
        .await
        .unwrap();
    // A's acquire must see the holder, not its memory of a free lock.
    let again = a
        .put(p, "holder", b"b", Some(60_000), &Condition::Absent)
        .await
        .unwrap();
    match again.outcome {
        Outcome::Conflict(Some(current)) => assert_eq!(current.value, b"a"),
        other => panic!("granted over a holder the row names: {other:?}"),
    }
    driving.abort();
}

#[tokio::test]
async fn a_write_decided_ahead_of_the_servers_clock_never_applies() {
    let (a, _table) = on_server_clock().await;
    let p = "~lock:1:spec:ahead";
    // A holds the lock for a minute; the reply bounds its estimate of the
    // server's clock.
    let held = applied(
        a.put(p, "holder", b"a", Some(60_000), &Condition::Absent)
            .await
            .unwrap(),
    );
    // Misjudged two minutes ahead, the hold looks expired, and an acquire
    // by another owner decides to take it...
    a.misestimate_server_clock(120_000);
    let (n, taken) = trips(
        &a,
        a.put(p, "holder", b"b", Some(60_000), &Condition::Absent),
    )
    .await;
    // ...but the server's clock has not reached the moment it was decided
    // at: nothing applies, and decided again on the statement's reply, at
    // the server's clock, the acquire conflicts with the holder.
    match taken.unwrap().outcome {
        Outcome::Conflict(Some(current)) => assert_eq!(current, held),
        other => panic!("a lock held for a minute was taken: {other:?}"),
    }
    assert_eq!(n, 1, "one statement: the speculation, refused");
    assert_eq!(a.get(p, "holder").await.unwrap().entry, Some(held));
}

#[tokio::test]
async fn a_write_decided_behind_the_servers_clock_never_renews_an_expired_entry() {
    let (a, _table) = on_server_clock().await;
    let p = "~lock:1:spec:behind";
    let held = applied(
        a.put(p, "holder", b"a", Some(1_000), &Condition::Absent)
            .await
            .unwrap(),
    );
    let expires = held.expires_at.expect("a TTL was given");
    // Wait on the server's clock until the hold has expired (however long
    // the machine takes: the clock only has to move on).
    let mut now = a.now().await.unwrap();
    while now <= expires + 100 {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        now = a.now().await.unwrap();
    }
    // Misjudged to two seconds before the expiry, the hold looks live, and
    // a renewal decides to extend it. Two seconds is within the call's
    // deadline (5 s), so only the expiry the decision relied on can stop it.
    let expires = i64::try_from(expires).unwrap();
    a.misestimate_server_clock(expires - 2_000 - i64::try_from(now).unwrap());
    let renewed = a
        .touch(p, "holder", 60_000, &Condition::Revision(held.revision))
        .await;
    // The server's clock is past that expiry: nothing applies, and decided
    // again at the server's clock, the entry is gone. (How many statements
    // that takes is not asserted: on a machine that stalled two seconds
    // since the estimate was set, the decision itself sees the expiry.)
    match renewed.unwrap().outcome {
        Outcome::Conflict(None) => {}
        other => panic!("an expired hold was renewed: {other:?}"),
    }
    assert_eq!(a.get(p, "holder").await.unwrap().entry, None);
}

#[tokio::test]
async fn a_new_entry_decided_ahead_of_the_servers_clock_gets_no_longer_a_ttl() {
    let (a, _table) = on_server_clock().await;
    // One call on another partition, so that the process has an estimate
    // of the server's clock but knows nothing of the partition written
    // next: that write is the speculative insert of a new row.
    applied(
        a.put(
            "~lock:1:spec:other",
            "holder",
            b"a",
            Some(60_000),
            &Condition::Absent,
        )
        .await
        .unwrap(),
    );
    let p = "~lock:1:spec:new";
    // Misjudged two minutes ahead, a new entry would be stamped two
    // minutes in the future and outlive its TTL by as much...
    a.misestimate_server_clock(120_000);
    let written = applied(
        a.put(p, "holder", b"a", Some(60_000), &Condition::Absent)
            .await
            .unwrap(),
    );
    // ...but the server's clock has not reached that moment: the insert
    // applies nothing, and decided again at the server's clock the entry
    // gets exactly its TTL from a time the server has already reached.
    let after = a.now().await.unwrap();
    assert!(
        written.updated_at <= after,
        "stamped {} ms ahead of the server's clock",
        written.updated_at - after
    );
    let expires = written.expires_at.expect("a TTL was given");
    assert!(
        expires <= after + 60_000,
        "a 60 s TTL that ends {} ms after the server's clock",
        expires - after
    );
    assert_eq!(a.get(p, "holder").await.unwrap().entry, Some(written));
}

#[tokio::test]
async fn a_semaphore_call_is_one_round_trip_on_the_rows_this_process_knows() {
    let (a, b, _table) = two_processes().await;
    let known = coord_postgres::KNOWN_ROWS as u32;
    let under = Condition::AbsentAndFewerThan;
    let ttl = Some(60_000);
    // A semaphore of a few permits: after A's first call, which reads
    // every row, A knows it whole; each acquire and release of its own is
    // one statement, and B's write in between costs A one refused
    // speculation and the read.
    let p = "~sem:1:spec:few";
    let (n, first) = trips(&a, a.put(p, "a0", b"v", ttl, &under(20))).await;
    applied(first.unwrap());
    assert_eq!(n, 2, "a first call reads, then writes");
    for round in 0..5 {
        let key = format!("a{}", round + 1);
        let (n, put) = trips(&a, a.put(p, &key, b"v", ttl, &under(20))).await;
        let held = applied(put.unwrap());
        assert_eq!(n, 1, "round {round}: an acquire");
        let (n, gone) = trips(&a, a.delete(p, &key, &Condition::Revision(held.revision))).await;
        assert!(matches!(gone.unwrap().outcome, Outcome::Applied(_)));
        assert_eq!(n, 1, "round {round}: a release");
    }
    applied(b.put(p, "b", b"v", ttl, &under(20)).await.unwrap());
    let (n, put) = trips(&a, a.put(p, "a9", b"v", ttl, &under(20))).await;
    applied(put.unwrap());
    assert_eq!(n, 3, "the refused speculation, the read, the write");
    // Full (a0, a9 and b held under 3), decided on what A knows: the
    // conflict names the first to expire (all expire together: the first
    // key), as a read would.
    let (n, full) = trips(&a, a.put(p, "late", b"v", ttl, &under(3))).await;
    let outcome = full.unwrap().outcome;
    assert!(
        matches!(&outcome, Outcome::Conflict(Some(e)) if e.key == "a0"),
        "{outcome:?}"
    );
    assert_eq!(n, 1, "a conflict is confirmed by a read");

    // Past KNOWN_ROWS permits, A knows the rows its calls loaded (the
    // first to expire, its own), which decide a call of one key: still one
    // round trip; another process's write costs A the read again.
    let q = "~sem:1:spec:many";
    for i in 0..=known {
        let key = format!("k{i:03}");
        applied(a.put(q, &key, b"v", ttl, &under(known + 10)).await.unwrap());
    }
    let (n, put) = trips(&a, a.put(q, "more", b"v", ttl, &under(known + 10))).await;
    let held = applied(put.unwrap());
    assert_eq!(n, 2, "past 32 rows, A's write of the 33rd left it to read");
    let (n, gone) = trips(&a, a.delete(q, "more", &Condition::Revision(held.revision))).await;
    assert!(matches!(gone.unwrap().outcome, Outcome::Applied(_)));
    assert_eq!(n, 1, "decided on the rows A's last call loaded");
    applied(b.put(q, "b", b"v", ttl, &under(known + 10)).await.unwrap());
    let (n, put) = trips(&a, a.put(q, "more2", b"v", ttl, &under(known + 10))).await;
    applied(put.unwrap());
    assert_eq!(
        n, 3,
        "after B: the refused speculation, the read, the write"
    );
    // A key A did not load but that has a row: A's write of it as new is
    // refused by the server (the row is there) and decided again on a
    // read, so it replaces the row and the count stays right.
    let live = known + 3; // k000 … k032, b and more2
    let (n, over) = trips(&a, a.put(q, "k005", b"w", ttl, &Condition::Always)).await;
    applied(over.unwrap());
    assert_eq!(n, 3, "refused as new, read, written over");
    applied(a.put(q, "new", b"v", ttl, &under(live + 1)).await.unwrap());
    let full = a.put(q, "new2", b"v", ttl, &under(live + 1)).await.unwrap();
    assert!(
        matches!(&full.outcome, Outcome::Conflict(Some(e)) if e.key == "b"),
        "{:?}",
        full.outcome
    );
}

/// One backend on a test clock, with its table, and a semaphore `q` of
/// limit 100 holding 40 permits, `k000` expiring first, then `k001`, …:
/// more than a backend knows whole ([`coord_postgres::KNOWN_ROWS`]).
async fn forty_permits(q: &str) -> (PostgresBackend, Arc<ManualClock>, Table) {
    let url = postgres_url().await;
    let clock = Arc::new(ManualClock::new(T0));
    let config = postgres_config(&url, 64, Some(clock.clone()));
    let table = Table {
        url,
        name: config.table.clone(),
    };
    let a = PostgresBackend::connect(config).await.unwrap();
    for i in 0..40u64 {
        let key = format!("k{i:03}");
        applied(
            a.put(
                q,
                &key,
                b"v",
                Some(100_000 + i),
                &Condition::AbsentAndFewerThan(100),
            )
            .await
            .unwrap(),
        );
    }
    (a, clock, table)
}

#[tokio::test]
async fn a_semaphore_known_in_part_never_names_a_holder_from_the_rows_it_knows_once_the_first_is_gone()
 {
    let q = "~sem:1:spec:first";
    let (a, clock, _table) = forty_permits(q).await;
    let under = Condition::AbsentAndFewerThan;
    // A loads k000 (the first to expire) and x; then releases k000, so the
    // rows A knows no longer hold the first of all (k001, not loaded).
    applied(
        a.put(q, "x", b"v", Some(200_000), &under(100))
            .await
            .unwrap(),
    );
    let k000 = a.get(q, "k000").await.unwrap().entry.unwrap();
    applied(
        a.delete(q, "k000", &Condition::Revision(k000.revision))
            .await
            .unwrap(),
    );
    // A short permit of A's, then gone by expiry: the next call sweeps it
    // (a write) and finds the semaphore full; the holder it names is the
    // first to expire of all, k001, never x (the first A knows).
    applied(
        a.put(q, "short", b"v", Some(10), &under(100))
            .await
            .unwrap(),
    );
    clock.advance(20);
    let full = a
        .put(q, "late", b"v", Some(1_000), &under(40))
        .await
        .unwrap();
    assert!(
        matches!(&full.outcome, Outcome::Conflict(Some(e)) if e.key == "k001"),
        "{:?}",
        full.outcome
    );
}

#[tokio::test]
async fn a_semaphore_known_in_part_never_answers_for_a_permit_it_did_not_load() {
    // A knows the rows its calls loaded; a permit it did not load may
    // well be held. Once a permit of A's expired (so the next call writes,
    // sweeping it), an extend, release or read of another permit must not
    // be answered as if that permit were gone: the server checks the key
    // is absent as decided, or the call reads it.
    let q = "~sem:1:spec:unloaded";
    let (a, clock, _table) = forty_permits(q).await;
    let under = Condition::AbsentAndFewerThan;
    for (i, key) in ["k020", "k021", "k022"].into_iter().enumerate() {
        // A short permit of A's, then gone by expiry.
        applied(
            a.put(q, &format!("short{i}"), b"v", Some(10), &under(100))
                .await
                .unwrap(),
        );
        clock.advance(20);
        let answer = match i {
            0 => {
                a.touch(q, key, 60_000, &Condition::Always)
                    .await
                    .unwrap()
                    .outcome
            }
            1 => a.delete(q, key, &Condition::Always).await.unwrap().outcome,
            _ => {
                let read = a.get(q, key).await.unwrap();
                assert!(read.entry.is_some(), "{key} read as absent");
                continue;
            }
        };
        assert!(
            matches!(&answer, Outcome::Applied(e) if e.key == key),
            "{key}: {answer:?}"
        );
    }
    let listing = a.list(q, "").await.unwrap();
    assert_eq!(listing.entries.len(), 39, "k021 released, the rest held");
}
