//! The semaphore under injected store faults: calls that fail as
//! `unavailable` before or after the store applied them, on every backend.

use super::*;
use coord_testing::Lcg;
use coord_testing::faulty::FaultyBackend;

per_backend!(injected_store_faults_never_exceed_the_limit_and_leave_no_permit_behind,);

/// Under a fifth of store calls failing (half after applying), with the
/// clock moving: every granted permit is in the store, the store never
/// holds more than the limit, every failure is `unavailable`, and once the
/// faults stop and the TTLs pass, every place can be taken again: no
/// permit outlives its TTL whatever the faults left behind. With the host's
/// ledger off (no instance is cut), a failed acquire's own take-back is
/// what frees an attempt that applied.
async fn injected_store_faults_never_exceed_the_limit_and_leave_no_permit_behind(h: Harness) {
    const TASKS: u64 = 8;
    const LIMIT: u32 = 3;
    const MAX_TTL: u64 = 300;
    let faulty = Arc::new(FaultyBackend::new(h.backend.clone(), 11));
    faulty.set_rate(0.2);
    let runtime = Arc::new(Runtime::new(faulty.clone()).unwrap());
    let inner = h.backend.clone();
    let unavailable = Arc::new(AtomicUsize::new(0));
    let granted = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (runtime, inner, unavailable, granted) = (
            runtime.clone(),
            inner.clone(),
            unavailable.clone(),
            granted.clone(),
        );
        let clock = h.clone_clock();
        tasks.push(tokio::spawn(async move {
            let mut i = runtime.instantiate().await.unwrap();
            let mut rng = Lcg(t + 40);
            for _ in 0..30 {
                let options = AcquireOptions::new()
                    .ttl_ms(50 + rng.below(MAX_TTL - 50))
                    .no_wait();
                match i
                    .semaphore()
                    .acquire(ID, "faults", LIMIT, options)
                    .await
                    .unwrap()
                {
                    Err(Error::Unavailable(_)) => {
                        unavailable.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(other) => panic!("faults must surface as unavailable, got {other:?}"),
                    Ok(AcquireOutcome::Busy(_)) => {}
                    Ok(AcquireOutcome::Acquired(permit)) => {
                        granted.fetch_add(1, Ordering::SeqCst);
                        let listing = inner
                            .list(&semaphore_partition(ID, "faults"), "")
                            .await
                            .unwrap();
                        assert!(
                            listing.entries.len() <= LIMIT as usize,
                            "{} permits held under a limit of {LIMIT}",
                            listing.entries.len()
                        );
                        let mine = listing.entries.iter().find(|e| e.key == permit.owner);
                        assert!(
                            mine.is_some_and(|e| e.revision == permit.fence)
                                || listing.now >= permit.expires_at,
                            "acquired was reported but the store does not hold it"
                        );
                        match i.semaphore().release(&permit).await.unwrap() {
                            Ok(_) => {}
                            Err(Error::Unavailable(_)) => {
                                unavailable.fetch_add(1, Ordering::SeqCst);
                            }
                            Err(other) => {
                                panic!("faults must surface as unavailable, got {other:?}")
                            }
                        }
                    }
                }
                clock.advance(rng.below(40));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(
        faulty.injected() > 0 && unavailable.load(Ordering::SeqCst) > 0,
        "faults were injected and seen"
    );
    assert!(
        granted.load(Ordering::SeqCst) > 0,
        "some work got through the faults"
    );
    // The faults stop; whatever they left expires with its TTL.
    faulty.set_rate(0.0);
    h.advance(MAX_TTL);
    let mut i = instance(&runtime).await;
    let options = AcquireOptions::new().ttl_ms(1000).no_wait();
    for _ in 0..LIMIT {
        acquired(acquire(&mut i, "faults", LIMIT, options).await);
    }
    assert!(matches!(
        acquire(&mut i, "faults", LIMIT, options).await,
        AcquireOutcome::Busy(_)
    ));
}
