//! `absent-and-fewer-than`: a create-if-absent that also counts the
//! partition's live entries (a semaphore's acquire), on a watched and on an
//! unwatched partition alike.

use super::{conflict, put};
use crate::{Harness, applied};
use coord_host::backend::*;

/// The partitions each check runs on: one watched, one unwatched (where a
/// semaphore keeps its permits).
const PARTITIONS: [&str; 2] = ["p", "~sem:1:a:b"];

fn fewer_than(limit: u32) -> Condition {
    Condition::AbsentAndFewerThan(limit)
}

/// Up to the limit apply, the next conflicts with the entry that expires
/// first, expired entries do not count, and each caller's own limit decides.
pub async fn absent_and_fewer_than_admits_up_to_the_limit_and_reports_the_first_to_expire(
    h: Harness,
) {
    for p in PARTITIONS {
        let start = h.backend.now().await.unwrap();
        let a = applied(put(&h, p, "a", "a", Some(3000), fewer_than(3)).await);
        let b = applied(put(&h, p, "b", "b", Some(1000), fewer_than(3)).await);
        let c = applied(put(&h, p, "c", "c", Some(2000), fewer_than(3)).await);
        assert!(a.revision < b.revision && b.revision < c.revision);
        assert_eq!(
            conflict(put(&h, p, "d", "d", Some(1000), fewer_than(3)).await),
            Some(b.clone()),
            "{p}: full, and b expires first"
        );
        assert_eq!(h.backend.get(p, "d").await.unwrap().entry, None);
        // A present key conflicts with itself, whatever the count.
        assert_eq!(
            conflict(put(&h, p, "a", "x", Some(1000), fewer_than(100)).await),
            Some(a.clone()),
            "{p}: the key's own entry"
        );
        // Another caller's larger limit is its own to pass.
        let d = applied(put(&h, p, "d", "d", Some(5000), fewer_than(4)).await);
        assert_eq!(
            conflict(put(&h, p, "e", "e", Some(1000), fewer_than(4)).await),
            Some(b.clone())
        );
        // Never holds for a delete or a touch.
        assert_eq!(
            conflict(h.backend.delete(p, "a", &fewer_than(100)).await.unwrap()),
            Some(a.clone())
        );
        assert_eq!(
            conflict(
                h.backend
                    .touch(p, "zz", 100, &fewer_than(100))
                    .await
                    .unwrap()
            ),
            None
        );
        // b's expiry frees a place; the conflict then names c.
        h.advance(1000);
        let e = applied(put(&h, p, "e", "e", Some(1000), fewer_than(4)).await);
        assert_eq!(
            conflict(put(&h, p, "f", "f", Some(1000), fewer_than(4)).await),
            Some(c.clone())
        );
        // A delete frees one as well.
        h.backend.delete(p, "a", &Condition::Always).await.unwrap();
        let f = applied(put(&h, p, "f", "f", Some(1000), fewer_than(4)).await);
        assert!(f.revision > e.revision && e.revision > d.revision);
        assert_eq!(
            f.expires_at,
            Some(start + 1000 + 1000),
            "{p}: on the store's clock"
        );
        let live: Vec<String> = h
            .backend
            .list(p, "")
            .await
            .unwrap()
            .entries
            .into_iter()
            .map(|e| e.key)
            .collect();
        assert_eq!(live, ["c", "d", "e", "f"], "{p}");
        for key in live {
            h.backend.delete(p, &key, &Condition::Always).await.unwrap();
        }
    }
}

/// A limit of 0 never admits, and its conflict on an empty partition
/// carries nothing; an entry that never expires is named only when none
/// expires.
pub async fn absent_and_fewer_than_with_no_place_or_no_expiry_names_what_it_can(h: Harness) {
    for p in PARTITIONS {
        assert_eq!(
            conflict(put(&h, p, "a", "a", Some(1000), fewer_than(0)).await),
            None,
            "{p}: empty, and a limit of 0"
        );
        let forever = applied(put(&h, p, "k", "v", None, Condition::Always).await);
        assert_eq!(
            conflict(put(&h, p, "a", "a", Some(1000), fewer_than(1)).await),
            Some(forever.clone()),
            "{p}: the only entry never expires"
        );
        let soon = applied(put(&h, p, "a", "a", Some(1000), fewer_than(2)).await);
        assert_eq!(
            conflict(put(&h, p, "b", "b", Some(1000), fewer_than(2)).await),
            Some(soon.clone()),
            "{p}: an entry that expires comes before one that never does"
        );
        h.backend.delete(p, "k", &Condition::Always).await.unwrap();
        h.backend.delete(p, "a", &Condition::Always).await.unwrap();
    }
}

/// A `wait-then-put` with the condition waits for a place: a release wakes
/// it and its put lands in the freed place, and one that wakes to a full
/// partition puts nothing.
pub async fn a_wait_then_put_for_a_place_lands_once_a_place_is_freed(h: Harness) {
    for p in PARTITIONS {
        let a = applied(put(&h, p, "a", "a", Some(60_000), fewer_than(2)).await);
        let b = applied(put(&h, p, "b", "b", Some(60_000), fewer_than(2)).await);
        // Already changed since a: the wait ends at once, and the put finds
        // no place.
        let early = h
            .backend
            .wait_then_put(p, "c", b"c", Some(1000), &fewer_than(2), a.revision, 0)
            .await
            .unwrap();
        assert_eq!(conflict(early), Some(a.clone()), "{p}");
        let backend = h.backend.clone();
        let partition = p.to_string();
        let after = b.revision;
        let waiter = tokio::spawn(async move {
            backend
                .wait_then_put(
                    &partition,
                    "c",
                    b"c",
                    Some(1000),
                    &fewer_than(2),
                    after,
                    30_000,
                )
                .await
        });
        h.until_waiting(p, 1).await;
        h.backend.delete(p, "a", &Condition::Always).await.unwrap();
        let c = applied(waiter.await.unwrap().unwrap());
        assert_eq!((c.key.as_str(), c.value.as_slice()), ("c", &b"c"[..]));
        let keys: Vec<String> = h
            .backend
            .list(p, "")
            .await
            .unwrap()
            .entries
            .into_iter()
            .map(|e| e.key)
            .collect();
        assert_eq!(keys, ["b", "c"], "{p}");
    }
}
