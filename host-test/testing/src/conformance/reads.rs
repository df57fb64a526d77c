//! Reads: listings by prefix with the revision, the change feed continuing
//! a listing with no gap and no repeat, trimmed history, and partitions
//! that never meet.

use super::{HISTORY, put};
use crate::{Harness, T0, applied};
use coord_host::backend::*;

/// List filters by prefix in key order with the revision.
pub async fn list_filters_by_prefix_in_key_order_with_the_revision(h: Harness) {
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

/// Changes continue a listing with no gap and no repeat.
pub async fn changes_continue_a_listing_with_no_gap_and_no_repeat(h: Harness) {
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

/// Changes report history gone once trimmed.
pub async fn changes_report_history_gone_once_trimmed(h: Harness) {
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

/// Partitions are independent.
pub async fn partitions_are_independent(h: Harness) {
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
