//! Unwatched partitions: every guarantee but the feed, keys and values of
//! any bytes, and waits woken by writes and expiry.

use super::{conflict, put};
use crate::{Harness, applied};
use coord_host::backend::*;

/// An unwatched partition (a name beginning with `~`, as a lock's, a
/// lease's and a semaphore's are) answers every call as a watched one does, but `changes`,
/// which fails with `invalid` naming the partition.
pub async fn an_unwatched_partition_keeps_every_guarantee_but_the_feed(h: Harness) {
    // A lock's partition, and a semaphore's, which some stores keep in
    // another layout (a hash on Redis, a row per entry on SQLite).
    for (round, p) in ["~lock:1:a:b", "~sem:1:a:b"].into_iter().enumerate() {
        if round > 0 {
            // Past every expiry of the round before: the clock starts anew.
            h.advance(10_000);
        }
        let t0 = h.backend.now().await.unwrap();
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
            (a.revision, Some(t0 + 1400)),
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
}

/// An unwatched partition's calls travel as one packed argument on Redis
/// (lengths, then the bytes): keys and values of any bytes and sizes come
/// back exactly, keys that differ only in length or in a trailing NUL never
/// meet, and a guard whose value is a prefix or whose revision is forged
/// (`u64::MAX`, as an outside tester sent) holds nothing.
pub async fn unwatched_keys_and_values_of_any_bytes_and_sizes_round_trip_and_never_meet(
    h: Harness,
) {
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
pub async fn a_wait_on_an_unwatched_partition_is_woken_by_writes_and_by_expiry(h: Harness) {
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
pub async fn a_wait_then_put_on_an_unwatched_partition_puts_once_the_holder_goes(h: Harness) {
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
