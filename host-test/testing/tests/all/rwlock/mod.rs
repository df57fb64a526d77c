//! The read-write lock, end to end: the real `coord.wasm` in wasmtime, over
//! every backend, with the store's clock moved by hand instead of slept on.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::{Harness, settle};
use coord_component::keys::rwlock_partition;
use coord_host::rwlock::*;
use coord_host::{Instance, Runtime};
use tokio::sync::Mutex;

mod faults;
mod histories;

const HISTORY: usize = coord_component::memory::DEFAULT_HISTORY;

per_backend!(
    uncontended_calls_cost_two_requests_to_acquire_and_one_to_release_or_extend,
    readers_and_writers_never_overlap_among_concurrent_instances_and_fences_rise,
    a_stream_of_readers_never_starves_a_waiting_writer,
    a_released_writer_lets_every_waiting_reader_in,
    inspect_shows_the_writer_and_readers_without_a_token,
);

/// The read-write lock every test here uses.
const ID: &str = "catalog";

fn acquired(outcome: AcquireOutcome) -> Grant {
    match outcome {
        AcquireOutcome::Acquired(grant) => grant,
        AcquireOutcome::Busy(holder) => panic!("expected acquired, got busy {holder:?}"),
    }
}

async fn acquire(
    i: &mut Instance,
    resource: &str,
    mode: Mode,
    options: AcquireOptions,
) -> AcquireOutcome {
    i.rwlock()
        .acquire(ID, resource, mode, options)
        .await
        .expect("no trap")
        .expect("no error")
}

async fn uncontended_calls_cost_two_requests_to_acquire_and_one_to_release_or_extend(h: Harness) {
    let mut i = h.instance().await;
    let once = AcquireOptions::new().ttl_ms(1000).no_wait();
    let r = acquired(acquire(&mut i, "a", Mode::Read, once).await);
    assert_eq!(
        i.store_calls(),
        2,
        "a read: its entry, then the writer's key"
    );
    assert_eq!((r.mode, r.expires_at), (Mode::Read, common::T0 + 1000));
    let ExtendOutcome::Extended(r) = i.rwlock().extend(&r, Some(5000)).await.unwrap().unwrap()
    else {
        panic!("extend lost the grant");
    };
    assert_eq!(i.store_calls(), 3, "extend");
    assert!(i.rwlock().is_held(&r).await.unwrap().unwrap());
    assert_eq!(i.store_calls(), 4, "is-held");
    assert!(i.rwlock().release(&r).await.unwrap().unwrap());
    assert_eq!(i.store_calls(), 5, "release");
    let w = acquired(acquire(&mut i, "a", Mode::Write, once).await);
    assert_eq!(i.store_calls(), 7, "a write: its entry, then the readers");
    assert!(w.fence > r.fence);
    assert!(i.rwlock().release(&w).await.unwrap().unwrap());
    assert_eq!(i.store_calls(), 8, "release");
    assert!(!i.rwlock().is_held(&w).await.unwrap().unwrap());
}

/// Writers and readers on eight instances, each waiting as long as it
/// takes (the clock never moves, so only a release lets anyone in): a
/// writer is never inside with anyone, and every writer's fence is above
/// every fence granted before it.
async fn readers_and_writers_never_overlap_among_concurrent_instances_and_fences_rise(h: Harness) {
    const INSTANCES: usize = 8;
    const ROUNDS: usize = 6;
    let rt = h.runtime();
    let readers = Arc::new(AtomicUsize::new(0));
    let writers = Arc::new(AtomicUsize::new(0));
    let most_readers = Arc::new(AtomicUsize::new(0));
    // The highest fence granted so far, and each writer's in grant order.
    let fences = Arc::new(Mutex::new((0u64, Vec::new())));
    let mut tasks = Vec::new();
    for n in 0..INSTANCES {
        let (rt, readers, writers, most_readers, fences) = (
            rt.clone(),
            readers.clone(),
            writers.clone(),
            most_readers.clone(),
            fences.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut i = rt.instantiate().await.unwrap();
            let wait = AcquireOptions::new().ttl_ms(600_000).wait_up_to(600_000);
            for round in 0..ROUNDS {
                // Three in eight write.
                let mode = if (n + round) % 8 < 3 {
                    Mode::Write
                } else {
                    Mode::Read
                };
                let grant = acquired(acquire(&mut i, "b", mode, wait).await);
                {
                    let mut fences = fences.lock().await;
                    assert!(
                        grant.mode == Mode::Read || grant.fence > fences.0,
                        "a writer's fence {} not above {}",
                        grant.fence,
                        fences.0
                    );
                    fences.0 = fences.0.max(grant.fence);
                    if mode == Mode::Write {
                        fences.1.push(grant.fence);
                    }
                }
                match mode {
                    Mode::Write => {
                        assert_eq!(writers.fetch_add(1, Ordering::SeqCst), 0, "two writers");
                        assert_eq!(readers.load(Ordering::SeqCst), 0, "a writer beside readers");
                    }
                    Mode::Read => {
                        assert_eq!(
                            writers.load(Ordering::SeqCst),
                            0,
                            "a reader beside a writer"
                        );
                        let now = readers.fetch_add(1, Ordering::SeqCst) + 1;
                        most_readers.fetch_max(now, Ordering::SeqCst);
                    }
                }
                settle().await; // let the others try while it holds
                match mode {
                    Mode::Write => writers.fetch_sub(1, Ordering::SeqCst),
                    Mode::Read => readers.fetch_sub(1, Ordering::SeqCst),
                };
                assert!(i.rwlock().release(&grant).await.unwrap().unwrap());
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let fences = fences.lock().await;
    assert!(fences.1.windows(2).all(|w| w[0] < w[1]), "{:?}", fences.1);
    assert_eq!(fences.1.len(), INSTANCES * ROUNDS * 3 / 8);
    // Readers share: two readers held at once at some point, which needs
    // no luck here, so it is checked without the scheduler: two in, then a
    // writer is busy.
    let mut a = h.instance().await;
    let mut b = h.instance().await;
    let now = AcquireOptions::new().ttl_ms(60_000).no_wait();
    let ra = acquired(acquire(&mut a, "b", Mode::Read, now).await);
    let rb = acquired(acquire(&mut b, "b", Mode::Read, now).await);
    let AcquireOutcome::Busy(first) = acquire(&mut a, "b", Mode::Write, now).await else {
        panic!("a writer beside two readers");
    };
    // Both expire at once: either may be named first.
    assert_eq!(first.mode, Mode::Read);
    assert!([ra.fence, rb.fence].contains(&first.fence), "{first:?}");
    assert!(a.rwlock().release(&ra).await.unwrap().unwrap());
    assert!(b.rwlock().release(&rb).await.unwrap().unwrap());
    let left = h
        .backend
        .list(&rwlock_partition(ID, "b"), "")
        .await
        .unwrap();
    assert!(left.entries.is_empty(), "left behind: {left:?}");
}

/// Four readers take turns so that one always holds (each acquires before
/// the last releases); a writer that asks in the middle is granted anyway,
/// because its claim turns the next readers away.
async fn a_stream_of_readers_never_starves_a_waiting_writer(h: Harness) {
    const READERS: usize = 4;
    let rt = h.runtime();
    let partition = rwlock_partition(ID, "c");
    let done = Arc::new(AtomicBool::new(false));
    let mut i = h.instance().await;
    let now = AcquireOptions::new().ttl_ms(600_000).no_wait();
    let mut held = acquired(acquire(&mut i, "c", Mode::Read, now).await);
    let mut tasks = Vec::new();
    for _ in 0..READERS {
        let (rt, done) = (rt.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = rt.instantiate().await.unwrap();
            while !done.load(Ordering::SeqCst) {
                match acquire(&mut i, "c", Mode::Read, now).await {
                    AcquireOutcome::Acquired(grant) => {
                        settle().await;
                        assert!(i.rwlock().release(&grant).await.unwrap().unwrap());
                    }
                    AcquireOutcome::Busy(holder) => {
                        assert_eq!(holder.mode, Mode::Write);
                        settle().await;
                    }
                }
            }
        }));
    }
    let writer = {
        let rt = rt.clone();
        tokio::spawn(async move {
            let mut i = rt.instantiate().await.unwrap();
            let wait = AcquireOptions::new().ttl_ms(600_000).wait_up_to(600_000);
            acquired(acquire(&mut i, "c", Mode::Write, wait).await)
        })
    };
    // The writer waits on its claim. This reader hands over to another one
    // before it leaves, as a stream of overlapping readers does: were
    // newcomers not turned away, the lock would never be free of readers.
    h.until_waiting(&partition, 1).await;
    let mut handovers = 0;
    loop {
        let mut next = rt.instantiate().await.unwrap();
        let handover = acquire(&mut next, "c", Mode::Read, now).await;
        assert!(i.rwlock().release(&held).await.unwrap().unwrap());
        match handover {
            AcquireOutcome::Acquired(grant) => (i, held) = (next, grant),
            AcquireOutcome::Busy(holder) => {
                assert_eq!(holder.mode, Mode::Write);
                break;
            }
        }
        handovers += 1;
        assert!(handovers < 100, "the readers starved the writer");
        settle().await;
    }
    let grant = writer.await.unwrap();
    done.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }
    let mut i = h.instance().await;
    assert!(i.rwlock().is_held(&grant).await.unwrap().unwrap());
    let usage = i.rwlock().inspect(ID, "c").await.unwrap().unwrap();
    assert!(usage.readers.is_empty());
    assert_eq!(usage.writer.map(|w| w.fence), Some(grant.fence));
}

/// Readers waiting on a writer all get in once it releases: none is left
/// waiting for a change that already happened.
async fn a_released_writer_lets_every_waiting_reader_in(h: Harness) {
    const WAITERS: usize = 4;
    let rt = h.runtime();
    let mut i = h.instance().await;
    let now = AcquireOptions::new().ttl_ms(600_000).no_wait();
    let w = acquired(acquire(&mut i, "d", Mode::Write, now).await);
    let mut waiters = Vec::new();
    for _ in 0..WAITERS {
        let rt = rt.clone();
        waiters.push(tokio::spawn(async move {
            let mut i = rt.instantiate().await.unwrap();
            let wait = AcquireOptions::new().ttl_ms(600_000).wait_up_to(600_000);
            acquired(acquire(&mut i, "d", Mode::Read, wait).await)
        }));
    }
    h.until_waiting(&rwlock_partition(ID, "d"), WAITERS).await;
    assert!(i.rwlock().release(&w).await.unwrap().unwrap());
    let mut fences = Vec::new();
    for waiter in waiters {
        let grant = waiter.await.unwrap();
        assert!(grant.fence > w.fence);
        fences.push(grant.fence);
    }
    let usage = i.rwlock().inspect(ID, "d").await.unwrap().unwrap();
    assert_eq!(usage.readers.len(), WAITERS);
    fences.sort_unstable();
    let shown: Vec<u64> = usage.readers.iter().map(|r| r.fence).collect();
    assert_eq!(shown, fences, "in fence order");
}

async fn inspect_shows_the_writer_and_readers_without_a_token(h: Harness) {
    let mut i = h.instance().await;
    let now = AcquireOptions::new().ttl_ms(10_000).no_wait();
    let empty = i.rwlock().inspect(ID, "e").await.unwrap().unwrap();
    assert_eq!((empty.writer, empty.readers.len()), (None, 0));
    let r = acquired(acquire(&mut i, "e", Mode::Read, now).await);
    h.advance(1000);
    let usage = i.rwlock().inspect(ID, "e").await.unwrap().unwrap();
    assert_eq!(
        usage.readers,
        vec![Holder {
            mode: Mode::Read,
            fence: r.fence,
            remaining_ms: 9000
        }]
    );
    assert_eq!(usage.now, common::T0 + 1000);
    assert!(!format!("{usage:?}").contains(&r.owner));
    // Force-release by fence, then a writer; a reader is busy on it.
    assert!(
        i.rwlock()
            .force_release(ID, "e", r.fence)
            .await
            .unwrap()
            .unwrap()
    );
    assert!(!i.rwlock().release(&r).await.unwrap().unwrap());
    let w = acquired(acquire(&mut i, "e", Mode::Write, now).await);
    let AcquireOutcome::Busy(holder) = acquire(&mut i, "e", Mode::Read, now).await else {
        panic!("a reader beside a writer");
    };
    assert_eq!(
        holder,
        Holder {
            mode: Mode::Write,
            fence: w.fence,
            remaining_ms: 10_000
        }
    );
    let usage = i.rwlock().inspect(ID, "e").await.unwrap().unwrap();
    assert_eq!(usage.writer, Some(holder));
    assert!(
        usage.readers.is_empty(),
        "the turned-away reader left nothing"
    );
}
