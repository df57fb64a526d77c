//! What the SQL stores' layout for a partition that may hold many entries
//! (a semaphore's: a row per entry beside the partition's own row,
//! `coord_host::backend::rows`) must keep, as scenarios each store runs
//! with its own way of looking at its tables (`sqlite_rows.rs`,
//! `postgres/rows.rs`): the count and the holder a full semaphore names,
//! expiry on the store's clock, another process's view, a partition written
//! before the layout, a process that predates it refused rather than
//! misled, the limit across processes racing, and collection of the rows
//! with their partition. The contract itself is checked on a semaphore's
//! partition by the shared suites (`conformance::unwatched`, the
//! semaphore's histories).

use std::sync::Arc;
use std::time::Duration;

use crate::common;
use common::{T0, applied, bounded};
use coord_component::memory::Partition;
use coord_host::backend::*;
use coord_host::clock::{Clock, ManualClock};

/// A semaphore's partition (`coord_component::keys::semaphore_partition`).
pub const SEMAPHORE: &str = "~sem:1:a:b";

/// How a test looks at a store's tables, as an operator would: a
/// partition's count of entry rows and its own row's state (empty: no row).
pub trait Tables {
    fn stored(&self, partition: &str) -> (u64, Vec<u8>);
    /// Delete every partition's own row, not their entry rows, as an
    /// operator emptying the table of partitions would.
    fn empty_partitions(&self);
}

fn fewer_than(limit: u32) -> Condition {
    Condition::AbsentAndFewerThan(limit)
}

/// 1 000 permits as rows, half of them expiring, on `backend`; `other` (a
/// second process on the same store) sees the same.
pub async fn a_row_per_permit_counted_as_the_whole_partition_would(
    backend: &dyn Backend,
    other: &dyn Backend,
    clock: &ManualClock,
    tables: &impl Tables,
) {
    // Permit i expires at T0 + 10 000 + i.
    let mut permits = Vec::new();
    for i in 0..1000u64 {
        let key = format!("p{i}");
        let reply = backend
            .put(SEMAPHORE, &key, b"v", Some(10_000 + i), &fewer_than(1000))
            .await
            .unwrap();
        permits.push(applied(reply));
    }
    let (rows, state) = tables.stored(SEMAPHORE);
    assert_eq!(rows, 1000, "a row per permit");
    assert!(
        state.len() < 200,
        "the partition's own row holds no permit: {} bytes",
        state.len()
    );
    assert!(
        Partition::decode(&state).is_err(),
        "a build that predates the layout cannot read the state, so it refuses \
         (unavailable) rather than see no permits and grant past the limit"
    );
    // Full: the conflict names the permit that expires first.
    let full = backend
        .put(SEMAPHORE, "late", b"v", Some(1000), &fewer_than(1000))
        .await
        .unwrap();
    assert!(
        matches!(&full.outcome, Outcome::Conflict(Some(e)) if *e == permits[0]),
        "{:?}",
        full.outcome
    );

    // p0 … p499 expire; 500 stay.
    clock.advance(10_000 + 499);
    let listing = backend.list(SEMAPHORE, "p9").await.unwrap();
    let listed: Vec<&Entry> = listing.entries.iter().collect();
    let expected: Vec<&Entry> = permits[900..1000].iter().collect();
    assert_eq!(listed, expected, "the live permits under p9, in key order");
    assert_eq!(
        tables.stored(SEMAPHORE).0,
        500,
        "expired rows are removed when a call sees them"
    );
    assert!(
        listing.revision > permits[999].revision,
        "each expiry took a revision"
    );
    // Exactly one place under 501; the next conflicts with p500.
    applied(
        backend
            .put(SEMAPHORE, "q", b"v", Some(60_000), &fewer_than(501))
            .await
            .unwrap(),
    );
    let full = backend
        .put(SEMAPHORE, "r", b"v", Some(60_000), &fewer_than(501))
        .await
        .unwrap();
    assert!(
        matches!(&full.outcome, Outcome::Conflict(Some(e)) if *e == permits[500]),
        "{:?}",
        full.outcome
    );
    // A guarded release of one, and a touch of another, change their rows.
    let p600 = &permits[600];
    applied(
        backend
            .delete(SEMAPHORE, "p600", &Condition::Revision(p600.revision))
            .await
            .unwrap(),
    );
    let touched = applied(
        backend
            .touch(SEMAPHORE, "p700", 90_000, &Condition::Always)
            .await
            .unwrap(),
    );
    assert_eq!(touched.expires_at, Some(clock.now_ms() + 90_000));
    assert_eq!(tables.stored(SEMAPHORE).0, 500);
    // Another process on the store sees the same.
    assert_eq!(other.get(SEMAPHORE, "p600").await.unwrap().entry, None);
    assert_eq!(
        other.get(SEMAPHORE, "p700").await.unwrap().entry,
        Some(touched)
    );
    applied(
        other
            .put(SEMAPHORE, "s", b"v", Some(60_000), &fewer_than(501))
            .await
            .unwrap(),
    );
    let full = backend
        .put(SEMAPHORE, "t", b"v", Some(60_000), &fewer_than(501))
        .await
        .unwrap();
    assert!(matches!(full.outcome, Outcome::Conflict(Some(_))));
}

/// The state an earlier build wrote for a semaphore of three permits `a`,
/// `b` and `c` (all inside the partition's one value), decided at `T0`.
pub fn three_permits_in_the_old_layout() -> Vec<u8> {
    let mut old = Partition::new(1);
    for key in ["a", "b", "c"] {
        let put = old.put(key, b"v", Some(60_000), &fewer_than(3), T0);
        assert!(matches!(put, Outcome::Applied(_)));
    }
    old.encode()
}

/// [`SEMAPHORE`]'s row, written by the test as
/// [`three_permits_in_the_old_layout`], keeps its permits and moves them to
/// rows on its first write.
pub async fn the_old_layout_keeps_its_permits_and_moves_to_rows(
    backend: &dyn Backend,
    tables: &impl Tables,
) {
    // The three count: a limit of 3 is full.
    let full = backend
        .put(SEMAPHORE, "d", b"v", Some(60_000), &fewer_than(3))
        .await
        .unwrap();
    assert!(
        matches!(&full.outcome, Outcome::Conflict(Some(e)) if e.key == "a"),
        "{:?}",
        full.outcome
    );
    applied(
        backend
            .put(SEMAPHORE, "d", b"v", Some(60_000), &fewer_than(4))
            .await
            .unwrap(),
    );
    let (rows, state) = tables.stored(SEMAPHORE);
    assert_eq!(rows, 4, "the first write moved every permit to rows");
    assert!(Partition::decode(&state).is_err(), "the new layout");
    let keys: Vec<String> = backend
        .list(SEMAPHORE, "")
        .await
        .unwrap()
        .entries
        .into_iter()
        .map(|e| e.key)
        .collect();
    assert_eq!(keys, ["a", "b", "c", "d"]);
    let full = backend
        .put(SEMAPHORE, "e", b"v", Some(60_000), &fewer_than(4))
        .await
        .unwrap();
    assert!(matches!(full.outcome, Outcome::Conflict(Some(_))));
}

/// On a backend with no retention that collects often: every permit of
/// [`SEMAPHORE`] expires with no call to see it, and the collector takes
/// the partition with its rows (past the grain a store may round its
/// collection times up to: two minutes); another semaphore stays whole.
pub async fn the_rows_are_collected_with_their_partition(
    backend: &dyn Backend,
    clock: &ManualClock,
    tables: &impl Tables,
) {
    let kept = "~sem:1:kept:x";
    for key in ["a", "b", "c"] {
        applied(
            backend
                .put(SEMAPHORE, key, b"v", Some(1000), &fewer_than(3))
                .await
                .unwrap(),
        );
    }
    applied(
        backend
            .put(kept, "a", b"v", Some(600_000), &fewer_than(3))
            .await
            .unwrap(),
    );
    assert_eq!(tables.stored(SEMAPHORE).0, 3);
    clock.advance(120_000);
    bounded(async {
        while tables.stored(SEMAPHORE) != (0, Vec::new()) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(tables.stored(kept).0, 1);
    assert!(backend.get(kept, "a").await.unwrap().entry.is_some());
}

/// Several processes, five acquirers each, race for a semaphore of 3 with
/// its permits in rows: each of 10 rounds grants exactly 3 (the semaphore
/// starts empty), whoever wins.
pub async fn processes_racing_never_grant_more_permits_than_the_limit(
    backends: &[Arc<dyn Backend>],
    tables: &impl Tables,
) {
    const LIMIT: u32 = 3;
    for round in 0..10 {
        let partition = format!("~sem:1:r:{round}");
        let tries = (0..5 * backends.len()).map(|n| {
            let backend = backends[n % backends.len()].clone();
            let partition = partition.clone();
            tokio::spawn(async move {
                backend
                    .put(
                        &partition,
                        &format!("owner-{n}"),
                        b"3",
                        Some(60_000),
                        &fewer_than(LIMIT),
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
        assert_eq!(granted, LIMIT, "round {round}");
        assert_eq!(tables.stored(&partition).0, u64::from(LIMIT));
    }
}

/// An operator empties the table of partitions, not the entry rows: a
/// semaphore is gone with its row, as a lock is (its holders lost, the next
/// fence above theirs), and the rows left behind count for nothing.
pub async fn permits_whose_partition_row_went_are_gone_not_resurrected(
    backend: &dyn Backend,
    clock: &ManualClock,
    tables: &impl Tables,
) {
    let mut lost = Vec::new();
    for key in ["a", "b", "c"] {
        let put = backend
            .put(SEMAPHORE, key, b"v", Some(60_000), &fewer_than(3))
            .await
            .unwrap();
        lost.push(applied(put));
    }
    tables.empty_partitions();
    // Revisions are floored at the store's clock: a millisecond later, the
    // new permit's fence is above the lost ones'.
    clock.advance(1);
    let first = applied(
        backend
            .put(SEMAPHORE, "d", b"v", Some(60_000), &fewer_than(3))
            .await
            .unwrap(),
    );
    assert!(first.revision > lost[2].revision);
    let listed: Vec<String> = backend
        .list(SEMAPHORE, "")
        .await
        .unwrap()
        .entries
        .into_iter()
        .map(|e| e.key)
        .collect();
    assert_eq!(listed, ["d"], "the lost permits stay lost");
    assert_eq!(tables.stored(SEMAPHORE).0, 1);
    // Two more places, not fewer.
    for key in ["e", "f"] {
        applied(
            backend
                .put(SEMAPHORE, key, b"v", Some(60_000), &fewer_than(3))
                .await
                .unwrap(),
        );
    }
    let stale = backend
        .delete(SEMAPHORE, "a", &Condition::Revision(lost[0].revision))
        .await
        .unwrap();
    assert!(
        matches!(stale.outcome, Outcome::Conflict(None)),
        "{stale:?}"
    );
}
