//! Writes: the store's clock, conditional puts and deletes, strictly
//! rising revisions, touches, and TTLs that expire in order.

use super::{conflict, put};
use crate::{Harness, T0, applied};
use coord_host::backend::*;

/// Now is the stores clock.
pub async fn now_is_the_stores_clock(h: Harness) {
    assert_eq!(h.backend.now().await.unwrap(), T0);
    h.advance(1234);
    assert_eq!(h.backend.now().await.unwrap(), T0 + 1234);
    let reply = put(&h, "p", "k", "v", None, Condition::Always).await;
    assert_eq!(reply.now, T0 + 1234);
    assert_eq!(applied(reply).updated_at, T0 + 1234);
}

/// Create if absent is exclusive and conflicts report the holder.
pub async fn create_if_absent_is_exclusive_and_conflicts_report_the_holder(h: Harness) {
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

/// Revisions strictly increase across every kind of write.
pub async fn revisions_strictly_increase_across_every_kind_of_write(h: Harness) {
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

/// Update and delete are conditional on revision and value.
pub async fn update_and_delete_are_conditional_on_revision_and_value(h: Harness) {
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

/// Delete and touch of an absent key conflict with none.
pub async fn delete_and_touch_of_an_absent_key_conflict_with_none(h: Harness) {
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

/// Touch renews the ttl without a revision or a change.
pub async fn touch_renews_the_ttl_without_a_revision_or_a_change(h: Harness) {
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

/// Expired entries are invisible and free their key.
pub async fn expired_entries_are_invisible_and_free_their_key(h: Harness) {
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

/// Expiry appears in the feed even when nobody was reading.
pub async fn expiry_appears_in_the_feed_even_when_nobody_was_reading(h: Harness) {
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

/// Renewed and shortened ttls expire at their new times in order.
pub async fn renewed_and_shortened_ttls_expire_at_their_new_times_in_order(h: Harness) {
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

/// Every write's reply carries the partition's revision once it was
/// decided, applied or not, the one a listing right after reports: a put's
/// and a delete's own, a touch's (which makes none) the partition's, and a
/// conflict's the partition's after the expiries it recorded. On a watched
/// partition, an unwatched one and a semaphore's (three layouts on Redis).
pub async fn every_write_reply_carries_the_partitions_revision(h: Harness) {
    let semaphore = coord_component::keys::semaphore_partition("t", "r");
    for p in ["p", "~p", semaphore.as_str()] {
        let listed = || async { h.backend.list(p, "").await.unwrap().revision };
        let check = |reply: &WriteReply, listed: u64, what: &str| {
            assert_eq!(reply.revision, listed, "{p}: {what}");
        };
        let a = put(&h, p, "a", "1", None, Condition::Always).await;
        check(&a, listed().await, "an applied put");
        let a = applied(a);
        assert_eq!(
            a.revision,
            listed().await,
            "{p}: a put's revision is its own"
        );
        let b = applied(put(&h, p, "b", "1", Some(10), Condition::Always).await);
        let touched = h
            .backend
            .touch(p, "a", 1000, &Condition::Revision(a.revision))
            .await
            .unwrap();
        check(&touched, listed().await, "an applied touch");
        assert_eq!(
            touched.revision, b.revision,
            "{p}: a touch makes no revision"
        );
        let lost = put(&h, p, "a", "2", None, Condition::Absent).await;
        check(&lost, listed().await, "a conflict");
        let full = put(&h, p, "c", "1", None, Condition::AbsentAndFewerThan(2)).await;
        check(&full, listed().await, "a full partition's conflict");
        h.advance(10); // b expires: the next write records it first
        let after_expiry = put(&h, p, "a", "3", None, Condition::Absent).await;
        assert!(
            after_expiry.revision > b.revision,
            "{p}: the expiry is counted"
        );
        check(&after_expiry, listed().await, "a conflict after an expiry");
        let deleted = h.backend.delete(p, "a", &Condition::Always).await.unwrap();
        assert!(
            deleted.revision > after_expiry.revision,
            "{p}: a delete's own"
        );
        check(&deleted, listed().await, "an applied delete");
        let gone = h.backend.delete(p, "a", &Condition::Always).await.unwrap();
        check(&gone, listed().await, "a delete of an absent key");
        let waited = h
            .backend
            .wait_then_put(p, "a", b"4", None, &Condition::Absent, gone.revision, 0)
            .await
            .unwrap();
        check(&waited, listed().await, "a wait-then-put's put");
    }
}
