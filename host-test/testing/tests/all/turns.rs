//! Lock and semaphore waiters of one process take turns
//! (`coord_host::backend::turns`): a release wakes the first of them alone,
//! they are granted in the order they came, and a waiter that leaves (cut,
//! or out of time) never holds up the ones behind it. On every backend,
//! through the real component.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::recording::RecordingBackend;
use common::{Harness, no_wait};
use coord_component::keys::{LOCK_HOLDER_KEY, lock_partition};
use coord_host::lock::*;
use coord_host::{Instance, Runtime};

const HISTORY: usize = coord_component::memory::DEFAULT_HISTORY;

per_backend!(
    waiters_are_granted_in_the_order_they_came_and_each_reaches_the_store_once,
    a_waiter_cut_at_the_head_of_the_line_hands_its_turn_on,
    a_waiter_out_of_time_is_not_held_behind_the_head,
    waiters_keep_their_order_across_the_slices_of_an_attempts_policy,
    a_head_that_does_not_call_again_holds_the_line_no_longer_than_its_grace,
    a_waiter_behind_a_kept_place_is_woken_when_the_one_ahead_of_it_leaves,
    a_waiter_that_comes_while_the_head_is_away_is_held_no_longer_than_the_grace,
    semaphore_waiters_of_one_process_are_granted_in_the_order_they_came,
    the_next_head_wakes_at_the_expiry_the_line_learned_not_the_one_it_knew,
);

const ID: &str = "turns";
const WAITERS: usize = 6;

fn waiting(timeout_ms: u64) -> AcquireOptions {
    AcquireOptions {
        ttl_ms: Some(600_000),
        wait: Some(WaitPolicy::Timeout(timeout_ms)),
    }
}

/// An `attempts` policy of slices of `delay_ms`, which only the store's
/// clock ends (the tests' clock moves by hand).
fn in_slices(max_attempts: u32, delay_ms: u64) -> AcquireOptions {
    AcquireOptions {
        ttl_ms: Some(600_000),
        wait: Some(WaitPolicy::Attempts(Retry {
            max_attempts,
            delay_ms,
        })),
    }
}

fn acquired(outcome: AcquireOutcome) -> HeldLock {
    match outcome {
        AcquireOutcome::Acquired(lock) => lock,
        AcquireOutcome::Busy(holder) => panic!("expected acquired, got busy {holder:?}"),
    }
}

/// Return once `n` calls wait in the line of `resource`'s lock in `rt`.
async fn until_in_line(rt: &Runtime, resource: &str, n: usize) {
    let partition = lock_partition(ID, resource);
    while rt.turns().in_line(&partition, LOCK_HOLDER_KEY) != n {
        tokio::task::yield_now().await;
    }
}

/// Start `n` waiters for `resource`'s lock, one after another (each in
/// line before the next starts), the `k`-th with `options(k)`. Each, once
/// granted, releases at once. The waiters' tasks answer their store calls;
/// [`granted_in_order`] checks the grants when they have ended.
async fn waiters(
    rt: &Arc<Runtime>,
    resource: &'static str,
    n: usize,
    options: impl Fn(usize) -> AcquireOptions,
) -> (Grants, Vec<tokio::task::JoinHandle<u64>>) {
    let grants = Grants::default();
    let mut tasks = Vec::new();
    for k in 0..n {
        let (runtime, grants, options) = (rt.clone(), grants.clone(), options(k));
        tasks.push(tokio::spawn(async move {
            let mut i = runtime.instantiate().await.unwrap();
            let lock = acquired(
                i.lock()
                    .acquire(ID, resource, options)
                    .await
                    .unwrap()
                    .unwrap(),
            );
            grants.lock().unwrap().push((k, lock.fence));
            assert!(i.lock().release(&lock).await.unwrap().unwrap());
            i.store_calls()
        }));
        until_in_line(rt, resource, k + 1).await;
    }
    (grants, tasks)
}

/// The waiters granted, in the order they were, with their fences.
type Grants = Arc<Mutex<Vec<(usize, u64)>>>;

/// Wait for the waiters' tasks; assert that the `n` of them were granted
/// in the order they came, with rising fences. Answers each one's store
/// calls.
async fn granted_in_order(grants: Grants, tasks: Vec<tokio::task::JoinHandle<u64>>) -> Vec<u64> {
    let n = tasks.len();
    let mut calls = Vec::new();
    for task in tasks {
        calls.push(task.await.unwrap());
    }
    let grants = grants.lock().unwrap().clone();
    let came: Vec<usize> = grants.iter().map(|(k, _)| *k).collect();
    assert_eq!(came, (0..n).collect::<Vec<_>>(), "granted in order");
    assert!(grants.windows(2).all(|w| w[0].1 < w[1].1), "fences rise");
    calls
}

/// Six waiters start one after another; the holder releases; each, once
/// granted, releases at once. They hold the lock in the order they came,
/// and below the line exactly one `wait-then-put` per waiter reaches the
/// store: a release wakes only the next. (Without turns, every release
/// woke every waiter still waiting, and each of those tried again.)
async fn waiters_are_granted_in_the_order_they_came_and_each_reaches_the_store_once(h: Harness) {
    let recording = Arc::new(RecordingBackend::new(h.backend.clone()));
    let rt = Arc::new(Runtime::new(recording.clone()).unwrap());
    let mut holder = rt.instantiate().await.unwrap();
    let held = acquired(
        holder
            .lock()
            .acquire(ID, "a", no_wait(600_000))
            .await
            .unwrap()
            .unwrap(),
    );
    let (grants, tasks) = waiters(&rt, "a", WAITERS, |_| waiting(600_000)).await;
    assert!(holder.lock().release(&held).await.unwrap().unwrap());
    let calls = granted_in_order(grants, tasks).await;
    // Each: the first attempt, the one wait-then-put, the release.
    assert_eq!(calls, vec![3; WAITERS], "the waiters' store calls");
    let waits = recording
        .calls()
        .iter()
        .filter(|c| c.operation == "wait-then-put")
        .count();
    assert_eq!(
        waits, WAITERS,
        "one wait-then-put per waiter reached the store"
    );
}

/// The head of the line is cut (its task dropped, as a request cut short
/// drops its call): the next waiter takes its turn and is granted on the
/// release, instead of waiting behind a call that will never end.
async fn a_waiter_cut_at_the_head_of_the_line_hands_its_turn_on(h: Harness) {
    let rt = h.runtime();
    let mut holder = rt.instantiate().await.unwrap();
    let held = acquired(
        holder
            .lock()
            .acquire(ID, "b", no_wait(600_000))
            .await
            .unwrap()
            .unwrap(),
    );
    let spawn = |rt: Arc<Runtime>| {
        tokio::spawn(async move {
            let mut i = rt.instantiate().await.unwrap();
            i.lock()
                .acquire(ID, "b", waiting(600_000))
                .await
                .unwrap()
                .unwrap()
        })
    };
    let first = spawn(rt.clone());
    until_in_line(&rt, "b", 1).await;
    let second = spawn(rt.clone());
    until_in_line(&rt, "b", 2).await;
    first.abort();
    until_in_line(&rt, "b", 1).await;
    assert!(holder.lock().release(&held).await.unwrap().unwrap());
    let granted = acquired(second.await.unwrap());
    assert!(granted.fence > held.fence);
}

/// A waiter with a short budget behind a head with a long one: once its
/// budget has passed on the store's clock, it answers `busy` without
/// waiting for the head to leave, and the head still holds its turn.
async fn a_waiter_out_of_time_is_not_held_behind_the_head(h: Harness) {
    let rt = h.runtime();
    let mut holder = rt.instantiate().await.unwrap();
    let held = acquired(
        holder
            .lock()
            .acquire(ID, "c", no_wait(600_000))
            .await
            .unwrap()
            .unwrap(),
    );
    let patient = {
        let rt = rt.clone();
        tokio::spawn(async move {
            let mut i = rt.instantiate().await.unwrap();
            i.lock()
                .acquire(ID, "c", waiting(600_000))
                .await
                .unwrap()
                .unwrap()
        })
    };
    until_in_line(&rt, "c", 1).await;
    let mut hurried = rt.instantiate().await.unwrap();
    let short = hurried.lock().acquire(ID, "c", waiting(1000));
    let moved = async {
        until_in_line(&rt, "c", 2).await;
        h.advance(1000);
    };
    let (outcome, ()) = tokio::join!(short, moved);
    let AcquireOutcome::Busy(by) = outcome.unwrap().unwrap() else {
        panic!("the lock is held: the short waiter must be busy");
    };
    assert_eq!(by.fence, held.fence);
    assert_eq!(
        rt.turns()
            .in_line(&lock_partition(ID, "c"), LOCK_HOLDER_KEY),
        1
    );
    assert!(holder.lock().release(&held).await.unwrap().unwrap());
    assert!(acquired(patient.await.unwrap()).fence > held.fence);
}

/// Four waiters, the first under an `attempts` policy, whose waits are
/// slices of `delay-ms`, each slice a call of its own. The head's slice
/// ends (the store's clock moves past it) while the holder still holds:
/// the head's call ends busy and its acquire calls again at once. It takes
/// its place back at the head instead of going behind the three others,
/// so the release still grants them in the order they came. (Before the
/// grace, the head went to the back at the end of each slice: the second
/// came first.) The grace is set long, so no slow machine ends it.
async fn waiters_keep_their_order_across_the_slices_of_an_attempts_policy(h: Harness) {
    const N: usize = 4;
    let recording = Arc::new(RecordingBackend::new(h.backend.clone()));
    let rt = Arc::new(Runtime::new(recording.clone()).unwrap());
    rt.turns().set_grace(Duration::from_secs(600));
    let partition = lock_partition(ID, "d");
    let mut holder = rt.instantiate().await.unwrap();
    let held = acquired(
        holder
            .lock()
            .acquire(ID, "d", no_wait(600_000))
            .await
            .unwrap()
            .unwrap(),
    );
    // The first waits in slices; the others for as long as it takes.
    let options = |k| match k {
        0 => in_slices(1000, 1_000),
        _ => waiting(600_000),
    };
    let (grants, tasks) = waiters(&rt, "d", N, options).await;
    let waits = || {
        recording
            .calls()
            .iter()
            .filter(|c| c.operation == "wait-then-put")
            .count()
    };
    // The head waits on the store; its slice ends; the next slice's call
    // (whoever's turn it is) waits on the store again.
    h.until_waiting(&partition, 1).await;
    assert_eq!(waits(), 1, "only the head waits on the store");
    h.advance(1_000);
    while waits() < 2 {
        tokio::task::yield_now().await;
    }
    until_in_line(&rt, "d", N).await;
    h.until_waiting(&partition, 1).await;
    assert!(holder.lock().release(&held).await.unwrap().unwrap());
    granted_in_order(grants, tasks).await;
}

/// A task that acquires `resource`'s lock with `options` and, once
/// granted, releases it at once; it answers the grant's fence.
fn acquiring(
    rt: &Arc<Runtime>,
    resource: &'static str,
    options: AcquireOptions,
) -> tokio::task::JoinHandle<u64> {
    let rt = rt.clone();
    tokio::spawn(async move {
        let mut i = rt.instantiate().await.unwrap();
        let lock = acquired(
            i.lock()
                .acquire(ID, resource, options)
                .await
                .unwrap()
                .unwrap(),
        );
        assert!(i.lock().release(&lock).await.unwrap().unwrap());
        lock.fence
    })
}

/// `resource`'s lock held, and a head under an `attempts` policy of two
/// waiting on the store for it, with `behind` waiters (of long timeouts)
/// in line after it. Then the store's clock moves past the head's slice:
/// its acquire ends busy and its place is kept for the grace. Answers the
/// holder, its lock and the waiters' tasks (each answers its grant's
/// fence).
async fn a_head_gone_busy(
    h: &Harness,
    rt: &Arc<Runtime>,
    resource: &'static str,
    behind: usize,
) -> (Instance, HeldLock, Vec<tokio::task::JoinHandle<u64>>) {
    let mut holder = rt.instantiate().await.unwrap();
    let held = acquired(
        holder
            .lock()
            .acquire(ID, resource, no_wait(600_000))
            .await
            .unwrap()
            .unwrap(),
    );
    let head = {
        let rt = rt.clone();
        tokio::spawn(async move {
            let mut i = rt.instantiate().await.unwrap();
            // Two attempts: the first at once, the second after a slice.
            i.lock()
                .acquire(ID, resource, in_slices(2, 60_000))
                .await
                .unwrap()
                .unwrap()
        })
    };
    until_in_line(rt, resource, 1).await;
    h.until_waiting(&lock_partition(ID, resource), 1).await;
    let mut tasks = Vec::new();
    for n in 0..behind {
        tasks.push(acquiring(rt, resource, waiting(600_000)));
        until_in_line(rt, resource, n + 2).await;
    }
    h.advance(60_000);
    let AcquireOutcome::Busy(by) = head.await.unwrap() else {
        panic!("the lock is held: the head's last slice must end busy");
    };
    assert_eq!(by.fence, held.fence);
    (holder, held, tasks)
}

/// The head's acquire ends busy when its last slice ends (it will not call
/// again), and its place is kept for the grace: the waiter behind it is
/// held no longer than that, and is granted on the release.
async fn a_head_that_does_not_call_again_holds_the_line_no_longer_than_its_grace(h: Harness) {
    let rt = h.runtime();
    rt.turns().set_grace(Duration::from_millis(50));
    let (mut holder, held, mut behind) = a_head_gone_busy(&h, &rt, "e", 1).await;
    // The next waiter takes its turn once the grace has passed, and waits
    // on the store for the release.
    h.until_waiting(&lock_partition(ID, "e"), 1).await;
    assert!(holder.lock().release(&held).await.unwrap().unwrap());
    assert!(behind.remove(0).await.unwrap() > held.fence);
}

/// A waiter comes after the head has gone busy, while the head's place is
/// kept: it learns as it joins how long the kept place may hold the line,
/// takes its turn when the grace has passed, and is granted on the
/// release. (Before, nobody told it: it waited for its own timeout.)
async fn a_waiter_that_comes_while_the_head_is_away_is_held_no_longer_than_the_grace(h: Harness) {
    let rt = h.runtime();
    rt.turns().set_grace(Duration::from_secs(1));
    let (mut holder, held, _) = a_head_gone_busy(&h, &rt, "g", 0).await;
    let late = acquiring(&rt, "g", waiting(600_000));
    until_in_line(&rt, "g", 1).await;
    h.until_waiting(&lock_partition(ID, "g"), 1).await;
    assert!(holder.lock().release(&held).await.unwrap().unwrap());
    assert!(late.await.unwrap() > held.fence);
}

/// A kept place at the head, and two waiters behind it: the first of them,
/// which was told how long the kept place may hold the line, is cut. The
/// second, which was not told, is woken to learn it, takes its turn when
/// the grace has passed, and is granted on the release. (Before, nothing
/// woke it: it waited for its own timeout.)
async fn a_waiter_behind_a_kept_place_is_woken_when_the_one_ahead_of_it_leaves(h: Harness) {
    let rt = h.runtime();
    rt.turns().set_grace(Duration::from_secs(1));
    let (mut holder, held, mut behind) = a_head_gone_busy(&h, &rt, "f", 2).await;
    let (first, second) = (behind.remove(0), behind.remove(0));
    first.abort();
    until_in_line(&rt, "f", 1).await;
    h.until_waiting(&lock_partition(ID, "f"), 1).await;
    assert!(holder.lock().release(&held).await.unwrap().unwrap());
    assert!(second.await.unwrap() > held.fence);
}

/// Six waiters for a semaphore of 2, both places held, start one after
/// another; the holder releases both; each waiter, once granted, releases
/// at once. They are granted in the order they came (without turns for
/// semaphores the order churned: this fails), and each reaches the store
/// with at most two `wait-then-put`s: a probe when its turn comes (a place
/// may be free), and the wait a release ends.
async fn semaphore_waiters_of_one_process_are_granted_in_the_order_they_came(h: Harness) {
    use coord_component::keys::semaphore_partition;
    use coord_host::semaphore as sem;
    const LIMIT: u32 = 2;
    let rt = Arc::new(Runtime::new(h.backend.clone()).unwrap());
    // A probe that finds the places full keeps its waiter's place until it
    // calls again: long enough whatever the machine's load.
    rt.turns().set_grace(Duration::from_secs(600));
    let partition = semaphore_partition(ID, "s");
    let mut holder = rt.instantiate().await.unwrap();
    let mut held = Vec::new();
    for _ in 0..LIMIT {
        let options = sem::AcquireOptions::new().ttl_ms(600_000).no_wait();
        match holder.semaphore().acquire(ID, "s", LIMIT, options).await {
            Ok(Ok(sem::AcquireOutcome::Acquired(permit))) => held.push(permit),
            other => panic!("a free place: {other:?}"),
        }
    }
    let grants = Grants::default();
    let mut tasks = Vec::new();
    for k in 0..WAITERS {
        let (runtime, grants) = (rt.clone(), grants.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = runtime.instantiate().await.unwrap();
            let options = sem::AcquireOptions::new()
                .ttl_ms(600_000)
                .wait_up_to(600_000);
            let permit = match i.semaphore().acquire(ID, "s", LIMIT, options).await {
                Ok(Ok(sem::AcquireOutcome::Acquired(permit))) => permit,
                other => panic!("expected acquired, got {other:?}"),
            };
            grants.lock().unwrap().push((k, permit.fence));
            assert!(i.semaphore().release(&permit).await.unwrap().unwrap());
            i.store_calls()
        }));
        while rt.turns().in_line_for_a_place(&partition, LIMIT) != k + 1 {
            tokio::task::yield_now().await;
        }
    }
    for permit in &held {
        assert!(holder.semaphore().release(permit).await.unwrap().unwrap());
    }
    let mut calls = Vec::new();
    for task in tasks {
        calls.push(task.await.unwrap());
    }
    // Each: its first attempt, at most two wait-then-puts, its release.
    assert!(
        calls.iter().all(|&c| c <= 4),
        "store calls per waiter: {calls:?}"
    );
    // Two places: two grants may be told in either order, so their order
    // is their fences'.
    let mut grants = grants.lock().unwrap().clone();
    grants.sort_by_key(|&(_, fence)| fence);
    let came: Vec<usize> = grants.iter().map(|&(k, _)| k).collect();
    assert_eq!(came, (0..WAITERS).collect::<Vec<_>>(), "granted in order");
}

/// The head's put conflicts with a new holder that took over between the
/// release and the put (another process's, with a 2 s TTL), and the head
/// gives up. The next waiter's own wait runs to the old holder's expiry, a
/// minute on; it is granted when the new holder expires. (Every store
/// here ends a `wait-then-put` at an expiry, so this passes on them without
/// the line's handing on the expiry the head learned, too; `store.wit`
/// lets a store not end it, and there the next would wait its minute.)
/// Straight on `Turns`, to set each call's revision and timeout.
async fn the_next_head_wakes_at_the_expiry_the_line_learned_not_the_one_it_knew(h: Harness) {
    use coord_host::backend::{Backend, Condition, Outcome, turns::Turns};
    let turns = Arc::new(Turns::new(h.backend.clone()));
    // The head that gives up does not come back: its place goes at once.
    turns.set_grace(Duration::ZERO);
    let (p, k) = (lock_partition(ID, "x"), LOCK_HOLDER_KEY);
    let old = h
        .backend
        .put(&p, k, b"old", Some(60_000), &Condition::Absent)
        .await
        .unwrap();
    let Outcome::Applied(old) = old.outcome else {
        panic!("the lock was free");
    };
    let waiter = |value: &'static [u8]| {
        let (turns, p, after) = (turns.clone(), p.clone(), old.revision);
        tokio::spawn(async move {
            turns
                .wait_then_put(
                    &p,
                    k,
                    value,
                    Some(60_000),
                    &Condition::Absent,
                    after,
                    60_000,
                )
                .await
                .unwrap()
        })
    };
    let head = waiter(b"first");
    h.until_waiting(&p, 1).await;
    let next = waiter(b"second");
    while turns.in_line(&p, k) != 2 {
        tokio::task::yield_now().await;
    }
    let took_over = h
        .backend
        .put(
            &p,
            k,
            b"new",
            Some(2_000),
            &Condition::Revision(old.revision),
        )
        .await
        .unwrap();
    assert!(matches!(took_over.outcome, Outcome::Applied(_)));
    let Outcome::Conflict(Some(holder)) = head.await.unwrap().outcome else {
        panic!("the head's put found the new holder");
    };
    assert_eq!(holder.value, b"new");
    h.until_waiting(&p, 1).await;
    h.advance(2_000);
    let granted = next.await.unwrap();
    let Outcome::Applied(entry) = granted.outcome else {
        panic!("the next was granted once the new holder expired: {granted:?}");
    };
    assert_eq!(entry.value, b"second");
}
