//! The lock, end to end: the real `coord.wasm` in wasmtime, over every backend,
//! with the store's clock moved by hand instead of slept on.

use crate::common;

use common::no_wait;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{Harness, settle};
use coord_component::keys::lock_partition;
use coord_host::lock::*;
use coord_host::{Instance, Runtime};
use tokio::sync::Mutex;

const HISTORY: usize = coord_component::memory::DEFAULT_HISTORY;

per_backend!(
    uncontended_acquire_release_and_extend_cost_one_store_call_each,
    busy_reports_the_holder_from_the_same_store_call,
    mutual_exclusion_and_increasing_fences_among_concurrent_instances,
    a_stale_holder_cannot_release_or_extend_the_new_holders_lock,
    expiry_frees_the_lock,
    a_waiter_is_woken_by_the_release_not_by_a_poll,
    a_lock_serialized_in_one_instance_is_released_from_another,
    force_release_frees_the_lock_and_the_old_holder_loses_it,
    invalid_input_gets_an_error_naming_the_field,
    a_lock_entry_that_is_not_an_owner_token_is_internal_never_busy,
);

async fn instance(runtime: &Runtime) -> Instance {
    runtime.instantiate().await.expect("instantiate")
}

fn acquired(outcome: AcquireOutcome) -> HeldLock {
    match outcome {
        AcquireOutcome::Acquired(lock) => lock,
        AcquireOutcome::Busy(holder) => panic!("expected acquired, got busy {holder:?}"),
    }
}

async fn acquire(i: &mut Instance, resource: &str, options: AcquireOptions) -> AcquireOutcome {
    i.lock()
        .acquire("inventory.stock", resource, options)
        .await
        .expect("no trap")
        .expect("no error")
}

async fn uncontended_acquire_release_and_extend_cost_one_store_call_each(h: Harness) {
    let rt = h.runtime();
    let mut i = instance(&rt).await;
    let lock = acquired(acquire(&mut i, "item:1", no_wait(1000)).await);
    assert_eq!(i.store_calls(), 1, "acquire");
    assert_eq!(lock.expires_at, common::T0 + 1000);
    let ExtendOutcome::Extended(extended) =
        i.lock().extend(&lock, Some(2000)).await.unwrap().unwrap()
    else {
        panic!("extend lost the lock");
    };
    assert_eq!(i.store_calls(), 2, "extend");
    assert_eq!(extended.fence, lock.fence);
    assert!(i.lock().release(&extended).await.unwrap().unwrap());
    assert_eq!(i.store_calls(), 3, "release");
}

async fn busy_reports_the_holder_from_the_same_store_call(h: Harness) {
    let rt = h.runtime();
    let (mut a, mut b) = (instance(&rt).await, instance(&rt).await);
    let lock = acquired(acquire(&mut a, "item:1", no_wait(1000)).await);
    h.advance(250);
    let AcquireOutcome::Busy(holder) = acquire(&mut b, "item:1", no_wait(1000)).await else {
        panic!("a held lock was acquired twice");
    };
    assert_eq!(
        holder,
        Holder {
            fence: lock.fence,
            remaining_ms: 750
        }
    );
    assert_eq!(b.store_calls(), 1);
    assert_eq!(
        b.lock()
            .inspect("inventory.stock", "item:1")
            .await
            .unwrap()
            .unwrap(),
        Some(holder)
    );
}

async fn mutual_exclusion_and_increasing_fences_among_concurrent_instances(h: Harness) {
    const INSTANCES: usize = 8;
    const ROUNDS: usize = 25;
    let rt = h.runtime();
    let in_section = Arc::new(AtomicBool::new(false));
    let fences = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..INSTANCES {
        let (rt, in_section, fences) = (rt.clone(), in_section.clone(), fences.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = rt.instantiate().await.unwrap();
            // The clock never moves: a waiter can only be woken by a release.
            let wait = AcquireOptions::new().ttl_ms(60_000).wait_up_to(600_000);
            for _ in 0..ROUNDS {
                let lock = acquired(acquire(&mut i, "item:1", wait).await);
                assert!(
                    !in_section.swap(true, Ordering::SeqCst),
                    "two holders at once"
                );
                fences.lock().await.push(lock.fence);
                settle().await; // let the others try while we hold it
                in_section.store(false, Ordering::SeqCst);
                assert!(i.lock().release(&lock).await.unwrap().unwrap());
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let fences = fences.lock().await;
    assert_eq!(fences.len(), INSTANCES * ROUNDS);
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences must strictly increase: {fences:?}"
    );
}

async fn a_stale_holder_cannot_release_or_extend_the_new_holders_lock(h: Harness) {
    let rt = h.runtime();
    let (mut stale, mut fresh) = (instance(&rt).await, instance(&rt).await);
    let old = acquired(acquire(&mut stale, "item:1", no_wait(100)).await);
    h.advance(101);
    let new = acquired(acquire(&mut fresh, "item:1", no_wait(1000)).await);
    assert!(new.fence > old.fence);
    assert!(!stale.lock().release(&old).await.unwrap().unwrap());
    assert_eq!(
        stale
            .lock()
            .extend(&old, Some(50_000))
            .await
            .unwrap()
            .unwrap(),
        ExtendOutcome::Lost
    );
    let holder = fresh
        .lock()
        .inspect("inventory.stock", "item:1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        holder,
        Some(Holder {
            fence: new.fence,
            remaining_ms: 1000
        })
    );
}

async fn expiry_frees_the_lock(h: Harness) {
    let rt = h.runtime();
    let mut i = instance(&rt).await;
    acquired(acquire(&mut i, "item:1", no_wait(500)).await);
    h.advance(499);
    assert!(matches!(
        acquire(&mut i, "item:1", no_wait(500)).await,
        AcquireOutcome::Busy(_)
    ));
    h.advance(1);
    assert_eq!(
        i.lock()
            .inspect("inventory.stock", "item:1")
            .await
            .unwrap()
            .unwrap(),
        None
    );
    acquired(acquire(&mut i, "item:1", no_wait(500)).await);
}

async fn a_waiter_is_woken_by_the_release_not_by_a_poll(h: Harness) {
    let rt = h.runtime();
    let mut holder = instance(&rt).await;
    let lock = acquired(acquire(&mut holder, "item:1", no_wait(60_000)).await);
    let waiter_rt = rt.clone();
    let waiter = tokio::spawn(async move {
        let mut i = waiter_rt.instantiate().await.unwrap();
        // Two attempts an hour apart: only the release can end this wait,
        // since the store's clock never moves in this test.
        let wait = WaitPolicy::Attempts(Retry {
            max_attempts: 2,
            delay_ms: 60_000,
        });
        let outcome = acquire(
            &mut i,
            "item:1",
            AcquireOptions {
                ttl_ms: None,
                wait: Some(wait),
            },
        )
        .await;
        (outcome, i.store_calls())
    });
    h.until_waiting(&lock_partition("inventory.stock", "item:1"), 1)
        .await;
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    assert!(holder.lock().release(&lock).await.unwrap().unwrap());
    let (outcome, calls) = waiter.await.unwrap();
    let won = acquired(outcome);
    assert!(won.fence > lock.fence);
    assert_eq!(
        calls, 2,
        "a busy attempt, then one wait-then-put that waited and won"
    );
}

async fn a_lock_serialized_in_one_instance_is_released_from_another(h: Harness) {
    let rt = h.runtime();
    let (mut a, mut b) = (instance(&rt).await, instance(&rt).await);
    let lock = acquired(acquire(&mut a, "item:1", no_wait(1000)).await);
    let wire = serde_json::to_string(&lock).unwrap();
    drop(a); // the acquiring instance is gone
    let restored: HeldLock = serde_json::from_str(&wire).unwrap();
    let ExtendOutcome::Extended(extended) =
        b.lock().extend(&restored, None).await.unwrap().unwrap()
    else {
        panic!("the restored lock was lost");
    };
    assert!(b.lock().release(&extended).await.unwrap().unwrap());
    assert_eq!(
        b.lock()
            .inspect("inventory.stock", "item:1")
            .await
            .unwrap()
            .unwrap(),
        None
    );
}

async fn force_release_frees_the_lock_and_the_old_holder_loses_it(h: Harness) {
    let rt = h.runtime();
    let (mut holder, mut operator) = (instance(&rt).await, instance(&rt).await);
    let lock = acquired(acquire(&mut holder, "item:1", no_wait(60_000)).await);
    assert!(
        operator
            .lock()
            .force_release("inventory.stock", "item:1")
            .await
            .unwrap()
            .unwrap()
    );
    assert!(
        !operator
            .lock()
            .force_release("inventory.stock", "item:1")
            .await
            .unwrap()
            .unwrap()
    );
    let next = acquired(acquire(&mut operator, "item:1", no_wait(1000)).await);
    assert!(next.fence > lock.fence);
    assert!(!holder.lock().release(&lock).await.unwrap().unwrap());
    assert_eq!(
        holder.lock().extend(&lock, None).await.unwrap().unwrap(),
        ExtendOutcome::Lost
    );
}

async fn invalid_input_gets_an_error_naming_the_field(h: Harness) {
    fn field<T: std::fmt::Debug>(result: Result<T, Error>) -> String {
        match result {
            Err(Error::InvalidArgument(InvalidArgument { field, .. })) => field,
            other => panic!("expected invalid-argument, got {other:?}"),
        }
    }
    let rt = h.runtime();
    let mut i = instance(&rt).await;
    let default = AcquireOptions::new();
    assert_eq!(
        field(i.lock().acquire("", "r", default).await.unwrap()),
        "id"
    );
    assert_eq!(
        field(i.lock().acquire("i", "", default).await.unwrap()),
        "resource"
    );
    let huge = "k".repeat(1 << 20);
    assert_eq!(
        field(i.lock().acquire("i", &huge, default).await.unwrap()),
        "resource"
    );
    assert_eq!(
        field(i.lock().acquire("i", "r", no_wait(0)).await.unwrap()),
        "options.ttl-ms"
    );
    assert_eq!(
        field(i.lock().acquire("i", "r", no_wait(u64::MAX)).await.unwrap()),
        "options.ttl-ms"
    );
    let no_attempts = WaitPolicy::Attempts(Retry {
        max_attempts: 0,
        delay_ms: 0,
    });
    let options = AcquireOptions {
        ttl_ms: None,
        wait: Some(no_attempts),
    };
    assert_eq!(
        field(i.lock().acquire("i", "r", options).await.unwrap()),
        "options.wait.attempts.max-attempts"
    );
    let forever = AcquireOptions::new().wait_up_to(u64::MAX);
    assert_eq!(
        field(i.lock().acquire("i", "r", forever).await.unwrap()),
        "options.wait.timeout"
    );
    let forged = HeldLock {
        id: "i".into(),
        resource: "r".into(),
        owner: "not-a-token".into(),
        fence: 1,
        ttl_ms: 1000,
        expires_at: 0,
    };
    assert_eq!(
        field(i.lock().release(&forged).await.unwrap()),
        "lock.owner"
    );
    let zero_fence = HeldLock {
        owner: "f".repeat(32),
        fence: 0,
        ..forged.clone()
    };
    assert_eq!(
        field(i.lock().extend(&zero_fence, None).await.unwrap()),
        "lock.fence"
    );
    let good = HeldLock {
        owner: "f".repeat(32),
        ..forged
    };
    assert_eq!(
        field(i.lock().extend(&good, Some(0)).await.unwrap()),
        "ttl-ms"
    );
    assert_eq!(field(i.lock().inspect("i", "").await.unwrap()), "resource");
    assert_eq!(field(i.lock().force_release("", "r").await.unwrap()), "id");
    assert_eq!(i.store_calls(), 0, "nothing invalid reached the store");
}

/// The in-memory store's counterpart of the Redis suite's restart test: a
/// host process that restarts loses its in-memory store, and the fences of
/// the new store must still exceed every fence the old one issued, or a
/// fenced resource outside the process would refuse every new holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_fences_stay_monotonic_across_a_restart_that_lost_the_data() {
    use coord_host::backend::memory::MemoryBackend;
    use coord_host::clock::ManualClock;
    common::bounded(async {
        let clock = Arc::new(ManualClock::new(common::T0));
        let first_process = Runtime::new(Arc::new(MemoryBackend::new(clock.clone()))).unwrap();
        let mut i = instance(&first_process).await;
        // Several writes in one millisecond: the fences count up past the floor.
        let mut before = 0;
        for _ in 0..5 {
            let lock = acquired(acquire(&mut i, "item:1", no_wait(60_000)).await);
            assert!(lock.fence > before, "fences grow within a process");
            before = lock.fence;
            assert!(i.lock().release(&lock).await.unwrap().unwrap());
        }
        drop((i, first_process));

        // The restart takes at least a millisecond.
        clock.advance(1);
        let second_process = Runtime::new(Arc::new(MemoryBackend::new(clock))).unwrap();
        let mut i = instance(&second_process).await;
        let after = acquired(acquire(&mut i, "item:1", no_wait(60_000)).await);
        assert!(
            after.fence > before,
            "fence {} after the restart <= {before} before it",
            after.fence
        );
    })
    .await
}

/// Outside testers wrote `not-an-owner-token!` (and `ff fe 00`) under a
/// lock's key: `acquire` answered `busy` and `inspect` a holder, where the
/// WIT promises `internal`.
async fn a_lock_entry_that_is_not_an_owner_token_is_internal_never_busy(h: Harness) {
    let rt = h.runtime();
    let mut i = instance(&rt).await;
    for (n, corrupt) in [&b"not-an-owner-token!"[..], &[0xff, 0xfe, 0x00][..]]
        .into_iter()
        .enumerate()
    {
        let resource = format!("item:corrupt-{n}");
        let partition = lock_partition("inventory.stock", &resource);
        h.backend
            .put(
                &partition,
                coord_component::keys::LOCK_HOLDER_KEY,
                corrupt,
                Some(10_000),
                &coord_host::backend::Condition::Always,
            )
            .await
            .unwrap();
        let acquired = i
            .lock()
            .acquire("inventory.stock", &resource, no_wait(1000))
            .await
            .unwrap();
        assert!(matches!(acquired, Err(Error::Internal(_))), "{acquired:?}");
        let inspected = i
            .lock()
            .inspect("inventory.stock", &resource)
            .await
            .unwrap();
        assert!(
            matches!(inspected, Err(Error::Internal(_))),
            "{inspected:?}"
        );
    }
}
