//! The read-write lock under injected store faults: calls that fail as
//! `unavailable` before or after the store applied them, on every backend.

use super::*;
use coord_testing::faulty::FaultyBackend;
use coord_testing::{Lcg, clock_mover};

per_backend!(injected_store_faults_answer_unavailable_and_leave_nothing_past_its_ttl,);

/// Under a fifth of store calls failing (half after applying), with the
/// clock moving and both modes contending: every failure is `unavailable`
/// (never `busy` for a store that did not answer, never `internal`), and
/// once the faults stop and the TTLs pass, a writer gets in at once and
/// leaves the partition empty: no reader's entry and no writer's claim
/// outlives its TTL, whatever the faults left behind.
async fn injected_store_faults_answer_unavailable_and_leave_nothing_past_its_ttl(h: Harness) {
    const TASKS: u64 = 6;
    const MAX_TTL: u64 = 300;
    let faulty = Arc::new(FaultyBackend::new(h.backend.clone(), 13));
    faulty.set_rate(0.2);
    let runtime = Arc::new(Runtime::new(faulty.clone()).unwrap());
    let unavailable = Arc::new(AtomicUsize::new(0));
    let granted = Arc::new(AtomicUsize::new(0));
    // Waits end on store time too, not only on a change.
    let stop = Arc::new(AtomicBool::new(false));
    let mover = clock_mover(&h, stop.clone(), 10);
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (runtime, unavailable, granted) =
            (runtime.clone(), unavailable.clone(), granted.clone());
        let clock = h.clone_clock();
        tasks.push(tokio::spawn(async move {
            let mut i = runtime.instantiate().await.unwrap();
            let mut rng = Lcg(t + 70);
            for _ in 0..25 {
                let mode = if rng.below(3) == 0 {
                    Mode::Write
                } else {
                    Mode::Read
                };
                let options = AcquireOptions::new()
                    .ttl_ms(50 + rng.below(MAX_TTL - 50))
                    .wait_up_to(rng.below(100));
                match i
                    .rwlock()
                    .acquire(ID, "faults", mode, options)
                    .await
                    .unwrap()
                {
                    Ok(AcquireOutcome::Acquired(grant)) => {
                        granted.fetch_add(1, Ordering::SeqCst);
                        clock.advance(rng.below(20));
                        match i.rwlock().release(&grant).await.unwrap() {
                            Ok(_) => {}
                            Err(Error::Unavailable(_)) => {
                                unavailable.fetch_add(1, Ordering::SeqCst);
                            }
                            Err(other) => panic!("a release failed otherwise: {other:?}"),
                        }
                    }
                    Ok(AcquireOutcome::Busy(_)) => clock.advance(rng.below(20)),
                    Err(Error::Unavailable(_)) => {
                        unavailable.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(other) => panic!("an acquire failed otherwise: {other:?}"),
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    mover.await.unwrap();
    assert!(unavailable.load(Ordering::SeqCst) > 0, "no fault struck");
    assert!(granted.load(Ordering::SeqCst) > 0, "nothing was granted");
    faulty.set_rate(0.0);
    // The longest any entry can live: a TTL, or a claim renewed last.
    h.advance(MAX_TTL.max(coord_component::rwlock::WRITER_CLAIM_MS) + 1);
    let mut i = h.instance().await;
    let now = AcquireOptions::new().ttl_ms(1000).no_wait();
    let w = acquired(acquire(&mut i, "faults", Mode::Write, now).await);
    assert!(i.rwlock().release(&w).await.unwrap().unwrap());
    let left = h
        .backend
        .list(&rwlock_partition(ID, "faults"), "")
        .await
        .unwrap();
    assert!(left.entries.is_empty(), "left behind: {left:?}");
}
