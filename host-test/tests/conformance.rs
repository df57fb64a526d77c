//! The store conformance suite: every `coord:sync/store` operation and the
//! guarantee `wit/store.wit` states for it, run against every backend.

#![allow(clippy::unwrap_used)] // tests may unwrap: a panic is the failure report

mod common;

use common::applied;

use common::{Harness, T0, settle};
use coord_host::backend::*;

/// Changes each partition's feed keeps in this suite (small, to test trimming).
const HISTORY: usize = 8;

per_backend!(
    now_is_the_stores_clock,
    create_if_absent_is_exclusive_and_conflicts_report_the_holder,
    revisions_strictly_increase_across_every_kind_of_write,
    update_and_delete_are_conditional_on_revision_and_value,
    delete_and_touch_of_an_absent_key_conflict_with_none,
    touch_renews_the_ttl_without_a_revision_or_a_change,
    expired_entries_are_invisible_and_free_their_key,
    expiry_appears_in_the_feed_even_when_nobody_was_reading,
    renewed_and_shortened_ttls_expire_at_their_new_times_in_order,
    list_filters_by_prefix_in_key_order_with_the_revision,
    changes_continue_a_listing_with_no_gap_and_no_repeat,
    changes_report_history_gone_once_trimmed,
    partitions_are_independent,
    wait_returns_at_once_when_already_changed,
    wait_is_woken_by_a_write,
    wait_times_out_on_the_stores_clock,
    wait_is_woken_by_an_expiry,
    wait_then_put_puts_once_the_partition_changes,
    wait_then_put_puts_once_at_its_timeout_whatever_the_outcome,
    wait_then_put_after_a_change_already_made_puts_at_once,
    meter_answers_as_the_reference_algorithms_on_a_generated_trace,
    meter_state_is_not_an_entry_and_makes_no_changes,
    an_unwatched_partition_keeps_every_guarantee_but_the_feed,
    a_wait_on_an_unwatched_partition_is_woken_by_writes_and_by_expiry,
    a_wait_then_put_on_an_unwatched_partition_puts_once_the_holder_goes,
    unwatched_keys_and_values_of_any_bytes_and_sizes_round_trip_and_never_meet,
);

fn conflict(reply: WriteReply) -> Option<Entry> {
    match reply.outcome {
        Outcome::Conflict(current) => current,
        Outcome::Applied(entry) => panic!("expected conflict, got applied {entry:?}"),
    }
}

async fn put(h: &Harness, p: &str, k: &str, v: &str, ttl: Option<u64>, c: Condition) -> WriteReply {
    h.backend.put(p, k, v.as_bytes(), ttl, &c).await.unwrap()
}

async fn now_is_the_stores_clock(h: Harness) {
    assert_eq!(h.backend.now().await.unwrap(), T0);
    h.advance(1234);
    assert_eq!(h.backend.now().await.unwrap(), T0 + 1234);
    let reply = put(&h, "p", "k", "v", None, Condition::Always).await;
    assert_eq!(reply.now, T0 + 1234);
    assert_eq!(applied(reply).updated_at, T0 + 1234);
}

async fn create_if_absent_is_exclusive_and_conflicts_report_the_holder(h: Harness) {
    let first = applied(put(&h, "p", "k", "a", Some(1000), Condition::Absent).await);
    assert_eq!(first.value, b"a");
    assert_eq!(first.expires_at, Some(T0 + 1000));
    let current = conflict(put(&h, "p", "k", "b", Some(1000), Condition::Absent).await);
    assert_eq!(
        current,
        Some(first.clone()),
        "the conflict carries the current entry"
    );
    let read = h.backend.get("p", "k").await.unwrap();
    assert_eq!(read.entry, Some(first));
    assert_eq!(read.now, T0);
}

async fn revisions_strictly_increase_across_every_kind_of_write(h: Harness) {
    let mut revisions = Vec::new();
    revisions.push(applied(put(&h, "p", "a", "1", None, Condition::Always).await).revision);
    revisions.push(applied(put(&h, "p", "a", "2", None, Condition::Always).await).revision);
    revisions.push(applied(put(&h, "p", "b", "1", Some(10), Condition::Always).await).revision);
    h.backend
        .delete("p", "a", &Condition::Always)
        .await
        .unwrap();
    h.advance(10); // b expires
    revisions.push(applied(put(&h, "p", "a", "3", None, Condition::Absent).await).revision);
    let feed = h.backend.changes("p", 0, 100).await.unwrap();
    let kinds: Vec<_> = feed
        .changes
        .iter()
        .map(|c| (c.kind, c.key.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            (ChangeKind::Put, "a"),
            (ChangeKind::Put, "a"),
            (ChangeKind::Put, "b"),
            (ChangeKind::Delete, "a"),
            (ChangeKind::Expire, "b"),
            (ChangeKind::Put, "a"),
        ]
    );
    let feed_revisions: Vec<u64> = feed.changes.iter().map(|c| c.revision).collect();
    assert!(
        feed_revisions.windows(2).all(|w| w[0] < w[1]),
        "{feed_revisions:?}"
    );
    assert!(revisions.iter().all(|r| feed_revisions.contains(r)));
    assert_eq!(feed.revision, *feed_revisions.last().unwrap());
}

async fn update_and_delete_are_conditional_on_revision_and_value(h: Harness) {
    let e = applied(put(&h, "p", "k", "owner-1", None, Condition::Always).await);
    // Wrong revision: conflict with the current entry, nothing written.
    let stale = Condition::Revision(e.revision + 1);
    assert_eq!(
        conflict(put(&h, "p", "k", "x", None, stale.clone()).await),
        Some(e.clone())
    );
    assert_eq!(
        conflict(h.backend.delete("p", "k", &stale).await.unwrap()),
        Some(e.clone())
    );
    // Right revision, wrong value.
    let wrong_owner = Condition::RevisionAndValue(Guard {
        revision: e.revision,
        value: b"owner-2".to_vec(),
    });
    assert_eq!(
        conflict(h.backend.delete("p", "k", &wrong_owner).await.unwrap()),
        Some(e.clone())
    );
    // Right revision: the update applies and gets a new revision.
    let e2 = applied(
        put(
            &h,
            "p",
            "k",
            "owner-1",
            None,
            Condition::Revision(e.revision),
        )
        .await,
    );
    assert!(e2.revision > e.revision);
    // Right revision and value: the delete applies and returns what it removed.
    let owner = Condition::RevisionAndValue(Guard {
        revision: e2.revision,
        value: b"owner-1".to_vec(),
    });
    assert_eq!(
        applied(h.backend.delete("p", "k", &owner).await.unwrap()),
        e2
    );
    assert_eq!(h.backend.get("p", "k").await.unwrap().entry, None);
}

async fn delete_and_touch_of_an_absent_key_conflict_with_none(h: Harness) {
    assert_eq!(
        conflict(
            h.backend
                .delete("p", "k", &Condition::Always)
                .await
                .unwrap()
        ),
        None
    );
    assert_eq!(
        conflict(
            h.backend
                .touch("p", "k", 100, &Condition::Always)
                .await
                .unwrap()
        ),
        None
    );
    assert_eq!(
        conflict(put(&h, "p", "k", "v", None, Condition::Revision(1)).await),
        None
    );
    assert_eq!(
        h.backend.changes("p", 0, 10).await.unwrap().changes,
        vec![],
        "nothing was written"
    );
}

async fn touch_renews_the_ttl_without_a_revision_or_a_change(h: Harness) {
    let e = applied(put(&h, "p", "k", "v", Some(1000), Condition::Absent).await);
    h.advance(900);
    let touched = applied(
        h.backend
            .touch("p", "k", 1000, &Condition::Revision(e.revision))
            .await
            .unwrap(),
    );
    assert_eq!(touched.revision, e.revision);
    assert_eq!(touched.value, e.value);
    assert_eq!(touched.expires_at, Some(T0 + 1900));
    assert_eq!(
        h.backend
            .changes("p", e.revision, 10)
            .await
            .unwrap()
            .changes,
        vec![]
    );
    h.advance(900); // past the first TTL, within the renewed one
    assert_eq!(h.backend.get("p", "k").await.unwrap().entry, Some(touched));
    let wrong = Condition::RevisionAndValue(Guard {
        revision: e.revision,
        value: b"other".to_vec(),
    });
    assert!(conflict(h.backend.touch("p", "k", 5000, &wrong).await.unwrap()).is_some());
}

async fn expired_entries_are_invisible_and_free_their_key(h: Harness) {
    let e = applied(put(&h, "p", "k", "v", Some(100), Condition::Absent).await);
    h.advance(99);
    assert!(h.backend.get("p", "k").await.unwrap().entry.is_some());
    h.advance(1);
    assert_eq!(h.backend.get("p", "k").await.unwrap().entry, None);
    assert_eq!(h.backend.list("p", "").await.unwrap().entries, vec![]);
    assert_eq!(
        conflict(
            h.backend
                .touch("p", "k", 100, &Condition::Always)
                .await
                .unwrap()
        ),
        None
    );
    assert_eq!(
        conflict(put(&h, "p", "k", "w", None, Condition::Revision(e.revision)).await),
        None
    );
    let again = applied(put(&h, "p", "k", "w", Some(100), Condition::Absent).await);
    assert!(again.revision > e.revision);
}

async fn expiry_appears_in_the_feed_even_when_nobody_was_reading(h: Harness) {
    let a = applied(put(&h, "p", "a", "v", Some(100), Condition::Absent).await);
    applied(put(&h, "p", "b", "v", Some(50), Condition::Absent).await);
    h.advance(500); // both expire with nobody looking
    let feed = h.backend.changes("p", a.revision, 10).await.unwrap();
    let expiries: Vec<_> = feed
        .changes
        .iter()
        .map(|c| (c.kind, c.key.as_str(), c.at))
        .collect();
    assert_eq!(
        expiries,
        [
            (ChangeKind::Put, "b", T0),
            (ChangeKind::Expire, "b", T0 + 50),
            (ChangeKind::Expire, "a", T0 + 100),
        ],
        "each expiry is recorded, in the order the TTLs ran out, with its time"
    );
}

async fn renewed_and_shortened_ttls_expire_at_their_new_times_in_order(h: Harness) {
    let a = applied(put(&h, "p", "a", "v", Some(100), Condition::Absent).await);
    applied(put(&h, "p", "b", "v", Some(300), Condition::Absent).await);
    h.advance(50);
    // a now ends at T0 + 450, later than b; c, written now, before both.
    applied(
        h.backend
            .touch("p", "a", 400, &Condition::Always)
            .await
            .unwrap(),
    );
    applied(put(&h, "p", "c", "v", Some(150), Condition::Absent).await);
    h.advance(100); // past a's first expiry, before every current one
    let live = h.backend.list("p", "").await.unwrap();
    let keys: Vec<_> = live.entries.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(
        keys,
        ["a", "b", "c"],
        "a renewed entry outlives its first TTL"
    );
    // b now ends at T0 + 160, earlier than it was to.
    applied(
        h.backend
            .touch("p", "b", 10, &Condition::Always)
            .await
            .unwrap(),
    );
    h.advance(9);
    assert!(h.backend.get("p", "b").await.unwrap().entry.is_some());
    h.advance(1);
    assert_eq!(h.backend.get("p", "b").await.unwrap().entry, None);
    h.advance(300); // all gone
    let feed = h.backend.changes("p", a.revision, 10).await.unwrap();
    let expiries: Vec<_> = feed
        .changes
        .iter()
        .filter(|c| c.kind == ChangeKind::Expire)
        .map(|c| (c.key.as_str(), c.at))
        .collect();
    assert_eq!(
        expiries,
        [("b", T0 + 160), ("c", T0 + 200), ("a", T0 + 450)],
        "expiries follow the TTLs as last set, each with its own time"
    );
}

async fn list_filters_by_prefix_in_key_order_with_the_revision(h: Harness) {
    for key in ["user/2", "user/1", "users", "team/1"] {
        put(&h, "p", key, key, None, Condition::Always).await;
    }
    let listing = h.backend.list("p", "user/").await.unwrap();
    let keys: Vec<_> = listing.entries.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["user/1", "user/2"]);
    assert_eq!(listing.now, T0);
    let all = h.backend.list("p", "").await.unwrap();
    assert_eq!(all.entries.len(), 4);
    assert_eq!(
        all.revision,
        all.entries.iter().map(|e| e.revision).max().unwrap()
    );
    let empty = h.backend.list("nobody-wrote-here", "").await.unwrap();
    assert_eq!(empty.entries, vec![]);
}

async fn changes_continue_a_listing_with_no_gap_and_no_repeat(h: Harness) {
    put(&h, "p", "a", "1", None, Condition::Always).await;
    let listing = h.backend.list("p", "").await.unwrap();
    put(&h, "p", "b", "1", None, Condition::Always).await;
    put(&h, "p", "a", "2", None, Condition::Always).await;
    let page = h.backend.changes("p", listing.revision, 1).await.unwrap();
    assert_eq!(page.changes.len(), 1, "max is respected");
    assert_eq!(
        (
            page.changes[0].key.as_str(),
            page.changes[0].value.as_slice()
        ),
        ("b", &b"1"[..])
    );
    let rest = h
        .backend
        .changes("p", page.changes[0].revision, 10)
        .await
        .unwrap();
    assert_eq!(rest.changes.len(), 1);
    assert_eq!(
        (
            rest.changes[0].key.as_str(),
            rest.changes[0].value.as_slice()
        ),
        ("a", &b"2"[..])
    );
    let none = h
        .backend
        .changes("p", rest.changes[0].revision, 10)
        .await
        .unwrap();
    assert_eq!(none.changes, vec![]);
    assert_eq!(none.revision, rest.changes[0].revision);
}

async fn changes_report_history_gone_once_trimmed(h: Harness) {
    let first = applied(put(&h, "p", "k", "0", None, Condition::Always).await);
    for i in 1..=HISTORY {
        put(&h, "p", "k", &i.to_string(), None, Condition::Always).await;
    }
    // HISTORY + 1 changes were made; the feed keeps HISTORY, so the first is gone.
    match h.backend.changes("p", first.revision - 1, 100).await {
        Err(StoreError::HistoryGone(complete_after)) => assert!(complete_after >= first.revision),
        other => panic!("expected history-gone, got {other:?}"),
    }
    let kept = h.backend.changes("p", first.revision, 100).await.unwrap();
    assert_eq!(kept.changes.len(), HISTORY);
}

async fn partitions_are_independent(h: Harness) {
    applied(put(&h, "p1", "k", "one", None, Condition::Absent).await);
    applied(put(&h, "p2", "k", "two", None, Condition::Absent).await);
    assert_eq!(
        h.backend.get("p1", "k").await.unwrap().entry.unwrap().value,
        b"one"
    );
    assert_eq!(
        h.backend.get("p2", "k").await.unwrap().entry.unwrap().value,
        b"two"
    );
    h.backend
        .delete("p1", "k", &Condition::Always)
        .await
        .unwrap();
    assert!(h.backend.get("p2", "k").await.unwrap().entry.is_some());
    assert_eq!(
        h.backend.changes("p2", 0, 10).await.unwrap().changes.len(),
        1
    );
}

async fn wait_returns_at_once_when_already_changed(h: Harness) {
    let e = applied(put(&h, "p", "k", "v", None, Condition::Always).await);
    // The clock never moves: only an already-changed partition can return.
    assert_eq!(
        h.backend.wait("p", e.revision - 1, 60_000).await.unwrap(),
        e.revision
    );
    assert_eq!(
        h.backend.wait("p", e.revision, 0).await.unwrap(),
        e.revision
    );
}

async fn wait_is_woken_by_a_write(h: Harness) {
    let e = applied(put(&h, "p", "k", "v", None, Condition::Always).await);
    let backend = h.backend.clone();
    let waiter = tokio::spawn(async move { backend.wait("p", e.revision, 60_000).await });
    h.until_waiting("p", 1).await;
    let e2 = applied(put(&h, "p", "k", "w", None, Condition::Always).await);
    // The clock never moved, so only the write can have woken the waiter.
    assert_eq!(waiter.await.unwrap().unwrap(), e2.revision);
}

async fn wait_times_out_on_the_stores_clock(h: Harness) {
    let e = applied(put(&h, "p", "k", "v", None, Condition::Always).await);
    let backend = h.backend.clone();
    let waiter = tokio::spawn(async move { backend.wait("p", e.revision, 1000).await });
    h.until_waiting("p", 1).await;
    h.advance(999);
    settle().await;
    assert!(!waiter.is_finished(), "woke before its timeout");
    h.advance(1);
    assert_eq!(
        waiter.await.unwrap().unwrap(),
        e.revision,
        "timed out with no change"
    );
}

async fn wait_is_woken_by_an_expiry(h: Harness) {
    let e = applied(put(&h, "p", "k", "v", Some(500), Condition::Absent).await);
    let backend = h.backend.clone();
    let waiter = tokio::spawn(async move { backend.wait("p", e.revision, 60_000).await });
    h.until_waiting("p", 1).await;
    h.advance(500); // nobody writes: the expiry itself must wake the waiter
    let revision = waiter.await.unwrap().unwrap();
    assert!(revision > e.revision);
    let feed = h.backend.changes("p", e.revision, 10).await.unwrap();
    assert_eq!(feed.changes[0].kind, ChangeKind::Expire);
    assert_eq!(feed.changes[0].revision, revision);
}

/// A lock's handoff, as the store sees it: a waiter's create-if-absent,
/// sent with its wait, applies once the holder's entry is deleted.
async fn wait_then_put_puts_once_the_partition_changes(h: Harness) {
    let held = applied(put(&h, "p", "k", "holder", Some(60_000), Condition::Absent).await);
    let backend = h.backend.clone();
    let waiter = tokio::spawn(async move {
        backend
            .wait_then_put(
                "p",
                "k",
                b"waiter",
                Some(5_000),
                &Condition::Absent,
                held.revision,
                60_000,
            )
            .await
    });
    h.until_waiting("p", 1).await;
    let released = h
        .backend
        .delete("p", "k", &Condition::Always)
        .await
        .unwrap();
    let Outcome::Applied(_) = released.outcome else {
        panic!("the delete was refused: {released:?}");
    };
    // The clock never moved: the delete ended the wait, and the put followed.
    let e = applied(waiter.await.unwrap().unwrap());
    assert_eq!(e.value, b"waiter");
    assert_eq!(e.expires_at, Some(T0 + 5_000));
    let feed = h.backend.changes("p", held.revision, 10).await.unwrap();
    let kinds: Vec<_> = feed.changes.iter().map(|c| c.kind).collect();
    assert_eq!(kinds, [ChangeKind::Delete, ChangeKind::Put]);
    assert_eq!(feed.changes[1].revision, e.revision);
}

async fn wait_then_put_puts_once_at_its_timeout_whatever_the_outcome(h: Harness) {
    let held = applied(put(&h, "p", "k", "holder", Some(60_000), Condition::Absent).await);
    let backend = h.backend.clone();
    let waiter = tokio::spawn(async move {
        backend
            .wait_then_put(
                "p",
                "k",
                b"waiter",
                None,
                &Condition::Absent,
                held.revision,
                1000,
            )
            .await
    });
    h.until_waiting("p", 1).await;
    h.advance(999);
    settle().await;
    assert!(!waiter.is_finished(), "woke before its timeout");
    h.advance(1);
    // Nothing changed: the put was tried at the timeout and found the holder.
    let reply = waiter.await.unwrap().unwrap();
    assert_eq!(conflict(reply.clone()), Some(held.clone()));
    assert_eq!(reply.now, T0 + 1000);
    let feed = h.backend.changes("p", held.revision, 10).await.unwrap();
    assert_eq!(feed.changes, vec![], "a refused put writes nothing");
}

async fn wait_then_put_after_a_change_already_made_puts_at_once(h: Harness) {
    let first = applied(put(&h, "p", "k", "v1", None, Condition::Always).await);
    let second = applied(put(&h, "p", "k", "v2", None, Condition::Always).await);
    // The clock never moves: only the change already made can end the wait.
    let guarded = Condition::Revision(second.revision);
    let reply = h
        .backend
        .wait_then_put("p", "k", b"v3", None, &guarded, first.revision, 60_000)
        .await
        .unwrap();
    let e = applied(reply);
    assert_eq!(e.value, b"v3");
    assert!(e.revision > second.revision);
    // A zero timeout is no wait at all: the put is tried at once.
    let stale = Condition::Revision(second.revision);
    let reply = h
        .backend
        .wait_then_put("p", "k", b"v4", None, &stale, e.revision, 0)
        .await
        .unwrap();
    assert_eq!(conflict(reply), Some(e));
}

async fn meter_answers_as_the_reference_algorithms_on_a_generated_trace(h: Harness) {
    use coord_component::meter::{Write, decide};
    // A limit that divides the window and one that does not: GCRA keeps the
    // remainder of window / limit, which only the second exercises.
    for (algorithm, limit, window_ms) in [
        MeterAlgorithm::SlidingWindow,
        MeterAlgorithm::FixedWindow,
        MeterAlgorithm::Gcra,
    ]
    .into_iter()
    .flat_map(|a| [(a, 5, 1000), (a, 3, 700)])
    {
        let partition = format!("meter-{algorithm:?}-{limit}");
        let (mut reference, mut now, mut seed) = (None, h.backend.now().await.unwrap(), 42u64);
        for step in 0..300 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let advance = (seed >> 33) % 7 * 45; // 0 to 270 ms, often 0
            h.advance(advance);
            now += advance;
            let mode = match (seed >> 50) % 16 {
                0 => MeterMode::Reset,
                1 | 2 => MeterMode::Peek,
                _ => MeterMode::Consume,
            };
            let request = MeterRequest {
                algorithm,
                limit,
                window_ms,
                cost: 1 + ((seed >> 40) % 3) as u32,
                mode,
            };
            let got = h
                .backend
                .meter(&partition, "user:1", &request)
                .await
                .unwrap();
            let (expected, write) = decide(reference, &request, now);
            match write {
                Write::Put(state, _) => reference = Some(state),
                Write::Delete => reference = None,
                Write::Keep => {}
            }
            assert_eq!(got, expected, "{algorithm:?} step {step}: {request:?}");
        }
    }
}

async fn meter_state_is_not_an_entry_and_makes_no_changes(h: Harness) {
    let request = MeterRequest {
        algorithm: MeterAlgorithm::SlidingWindow,
        limit: 2,
        window_ms: 1000,
        cost: 1,
        mode: MeterMode::Consume,
    };
    assert!(h.backend.meter("p", "k", &request).await.unwrap().allowed);
    assert!(h.backend.meter("p", "k", &request).await.unwrap().allowed);
    let third = h.backend.meter("p", "k", &request).await.unwrap();
    assert!(!third.allowed, "the state is shared across calls");
    assert_eq!(third.now, T0);
    assert_eq!(h.backend.get("p", "k").await.unwrap().entry, None);
    assert_eq!(h.backend.list("p", "").await.unwrap().entries, vec![]);
    assert_eq!(h.backend.changes("p", 0, 10).await.unwrap().changes, vec![]);
    assert!(
        h.backend
            .meter("other", "k", &request)
            .await
            .unwrap()
            .allowed,
        "per partition"
    );
}

/// An unwatched partition (a name beginning with `~`, as a lock's and a
/// lease's are) answers every call as a watched one does, but `changes`,
/// which fails with `invalid` naming the partition.
async fn an_unwatched_partition_keeps_every_guarantee_but_the_feed(h: Harness) {
    let p = "~lock:1:a:b";
    let a = applied(put(&h, p, "holder", "a", Some(1000), Condition::Absent).await);
    assert_eq!(
        conflict(put(&h, p, "holder", "b", Some(1000), Condition::Absent).await),
        Some(a.clone()),
        "create-if-absent is exclusive and the conflict reports the holder"
    );
    // Guarded by revision and value: a stale guard changes nothing.
    let stale = Condition::RevisionAndValue(Guard {
        revision: a.revision,
        value: b"b".to_vec(),
    });
    assert_eq!(
        conflict(h.backend.touch(p, "holder", 5000, &stale).await.unwrap()),
        Some(a.clone())
    );
    assert_eq!(
        conflict(h.backend.delete(p, "holder", &stale).await.unwrap()),
        Some(a.clone())
    );
    let guard = Condition::RevisionAndValue(Guard {
        revision: a.revision,
        value: b"a".to_vec(),
    });
    h.advance(400);
    let touched = applied(h.backend.touch(p, "holder", 1000, &guard).await.unwrap());
    assert_eq!(
        (touched.revision, touched.expires_at),
        (a.revision, Some(T0 + 1400)),
        "a touch renews the TTL and keeps the revision (the fence)"
    );
    let other = applied(put(&h, p, "other", "o", None, Condition::Always).await);
    assert!(other.revision > a.revision);
    let listing = h.backend.list(p, "").await.unwrap();
    assert_eq!(listing.entries, vec![touched.clone(), other.clone()]);
    assert_eq!(listing.revision, other.revision);
    assert_eq!(
        h.backend.list(p, "o").await.unwrap().entries,
        vec![other.clone()]
    );

    // Expiry: invisible, the key free again, and a revision of its own.
    h.advance(1000);
    assert_eq!(h.backend.get(p, "holder").await.unwrap().entry, None);
    let after_expiry = h.backend.list(p, "").await.unwrap();
    assert_eq!(after_expiry.entries, vec![other.clone()]);
    assert!(
        after_expiry.revision > other.revision,
        "the expiry took a revision"
    );
    let b = applied(put(&h, p, "holder", "b", Some(1000), Condition::Absent).await);
    assert!(b.revision > after_expiry.revision);
    let gone = applied(
        h.backend
            .delete(p, "holder", &Condition::Revision(b.revision))
            .await
            .unwrap(),
    );
    assert_eq!(gone, b);
    let c = applied(put(&h, p, "holder", "c", Some(1000), Condition::Absent).await);
    assert!(c.revision > b.revision, "the delete took a revision too");

    match h.backend.changes(p, 0, 10).await {
        Err(StoreError::Invalid(why)) => assert!(why.contains(p), "{why}"),
        other => panic!("expected invalid for the feed of {p}, got {other:?}"),
    }
}

/// An unwatched partition's calls travel as one packed argument on Redis
/// (lengths, then the bytes): keys and values of any bytes and sizes come
/// back exactly, keys that differ only in length or in a trailing NUL never
/// meet, and a guard whose value is a prefix or whose revision is forged
/// (`u64::MAX`, as an outside tester sent) holds nothing.
async fn unwatched_keys_and_values_of_any_bytes_and_sizes_round_trip_and_never_meet(h: Harness) {
    let p = "~lease:hostile:\u{0}=%{}";
    let big: Vec<u8> = (0..256 * 1024).map(|i| (i % 251) as u8).collect();
    let cases: [(&str, &[u8]); 6] = [
        ("", b""),
        ("k", b"\0\xff\x00="),
        ("k\0", b"k"),
        ("kk", b""),
        ("=k", "\u{e9}t\u{e9} \u{1F512}".as_bytes()),
        ("\u{1F512}\0\u{7f}", &big),
    ];
    let mut written = Vec::new();
    for (key, value) in cases {
        let entry = applied(
            h.backend
                .put(p, key, value, Some(60_000), &Condition::Absent)
                .await
                .unwrap(),
        );
        assert_eq!((entry.key.as_str(), entry.value.as_slice()), (key, value));
        written.push(entry);
    }
    for entry in &written {
        let read = h.backend.get(p, &entry.key).await.unwrap().entry;
        assert_eq!(read.as_ref(), Some(entry), "{:?} read back", entry.key);
    }
    let mut sorted = written.clone();
    sorted.sort_by(|a, b| a.key.as_bytes().cmp(b.key.as_bytes()));
    assert_eq!(h.backend.list(p, "").await.unwrap().entries, sorted);
    assert_eq!(
        h.backend.list(p, "k").await.unwrap().entries,
        vec![written[1].clone(), written[2].clone(), written[3].clone()],
        "the prefix `k` holds k, k\\0 and kk, and not =k"
    );

    let k = &written[1];
    for (why, guard) in [
        ("a forged revision", u64::MAX, k.value.clone()),
        ("a revision past 2^53", (1 << 53) + 1, k.value.clone()),
        ("a prefix of the value", k.revision, k.value[..2].to_vec()),
        (
            "the value and a byte more",
            k.revision,
            [k.value.as_slice(), b"\0"].concat(),
        ),
    ]
    .map(|(why, revision, value)| (why, Guard { revision, value }))
    {
        let stale = Condition::RevisionAndValue(guard);
        assert_eq!(
            conflict(h.backend.delete(p, "k", &stale).await.unwrap()),
            Some(k.clone()),
            "{why} deletes nothing"
        );
        assert_eq!(
            conflict(h.backend.touch(p, "k", 1, &stale).await.unwrap()),
            Some(k.clone()),
            "{why} renews nothing"
        );
    }
    let owner = Condition::RevisionAndValue(Guard {
        revision: k.revision,
        value: k.value.clone(),
    });
    assert_eq!(applied(h.backend.delete(p, "k", &owner).await.unwrap()), *k);
    assert_eq!(h.backend.get(p, "k").await.unwrap().entry, None);
    assert_eq!(
        h.backend.get(p, "k\0").await.unwrap().entry.as_ref(),
        Some(&written[2]),
        "deleting k left k\\0"
    );
}

/// `wait` on an unwatched partition keeps `wait`'s promise: woken by a put,
/// by a delete and by an expiry, with nobody re-checking.
async fn a_wait_on_an_unwatched_partition_is_woken_by_writes_and_by_expiry(h: Harness) {
    let p = "~lease:1:a:";
    let a = applied(put(&h, p, "holder", "a", Some(500), Condition::Absent).await);
    let spawn_wait = |after: u64| {
        let backend = h.backend.clone();
        tokio::spawn(async move { backend.wait(p, after, 60_000).await })
    };
    let waiter = spawn_wait(a.revision);
    h.until_waiting(p, 1).await;
    h.advance(500); // nobody writes: the expiry itself must wake the waiter
    let expired = waiter.await.unwrap().unwrap();
    assert!(expired > a.revision);

    let waiter = spawn_wait(expired);
    h.until_waiting(p, 1).await;
    let b = applied(put(&h, p, "holder", "b", Some(60_000), Condition::Absent).await);
    assert_eq!(
        waiter.await.unwrap().unwrap(),
        b.revision,
        "woken by the put"
    );

    let waiter = spawn_wait(b.revision);
    h.until_waiting(p, 1).await;
    h.backend
        .delete(p, "holder", &Condition::Always)
        .await
        .unwrap();
    assert!(
        waiter.await.unwrap().unwrap() > b.revision,
        "woken by the delete"
    );
}

/// A lock's handoff on its unwatched partition: the waiter's create, sent
/// with its wait, applies once the holder's entry is deleted.
async fn a_wait_then_put_on_an_unwatched_partition_puts_once_the_holder_goes(h: Harness) {
    let p = "~lock:1:a:b";
    let held = applied(put(&h, p, "holder", "a", Some(60_000), Condition::Absent).await);
    let backend = h.backend.clone();
    let waiter = tokio::spawn(async move {
        backend
            .wait_then_put(
                p,
                "holder",
                b"b",
                Some(60_000),
                &Condition::Absent,
                held.revision,
                60_000,
            )
            .await
    });
    h.until_waiting(p, 1).await;
    h.backend
        .delete(p, "holder", &Condition::Always)
        .await
        .unwrap();
    let taken = applied(waiter.await.unwrap().unwrap());
    assert_eq!(taken.value, b"b");
    assert!(taken.revision > held.revision);
}
