//! Waits: woken by a write or an expiry, timed out on the store's clock,
//! and `wait-then-put`, which puts exactly once.

use super::{conflict, put};
use crate::{Harness, T0, applied, settle};
use coord_host::backend::*;

/// Wait returns at once when already changed.
pub async fn wait_returns_at_once_when_already_changed(h: Harness) {
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

/// Wait is woken by a write.
pub async fn wait_is_woken_by_a_write(h: Harness) {
    let e = applied(put(&h, "p", "k", "v", None, Condition::Always).await);
    let backend = h.backend.clone();
    let waiter = tokio::spawn(async move { backend.wait("p", e.revision, 60_000).await });
    h.until_waiting("p", 1).await;
    let e2 = applied(put(&h, "p", "k", "w", None, Condition::Always).await);
    // The clock never moved, so only the write can have woken the waiter.
    assert_eq!(waiter.await.unwrap().unwrap(), e2.revision);
}

/// Wait times out on the stores clock.
pub async fn wait_times_out_on_the_stores_clock(h: Harness) {
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

/// Wait is woken by an expiry.
pub async fn wait_is_woken_by_an_expiry(h: Harness) {
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
pub async fn wait_then_put_puts_once_the_partition_changes(h: Harness) {
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

/// Wait then put puts once at its timeout whatever the outcome.
pub async fn wait_then_put_puts_once_at_its_timeout_whatever_the_outcome(h: Harness) {
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

/// Wait then put after a change already made puts at once.
pub async fn wait_then_put_after_a_change_already_made_puts_at_once(h: Harness) {
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
