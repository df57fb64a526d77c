//! The semaphore, end to end: the real `coord.wasm` in wasmtime, over every
//! backend, with the store's clock moved by hand instead of slept on.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{Harness, settle};
use coord_component::keys::semaphore_partition;
use coord_host::backend::Backend;
use coord_host::semaphore::*;
use coord_host::{Instance, Runtime};
use tokio::sync::Mutex;

mod faults;
mod histories;

const HISTORY: usize = coord_component::memory::DEFAULT_HISTORY;

per_backend!(
    uncontended_acquire_release_and_extend_cost_one_store_call_each,
    permits_never_exceed_the_limit_among_concurrent_instances_and_fences_rise,
    a_release_lets_exactly_one_waiter_in_per_place_freed,
    a_holder_paused_past_its_ttl_is_refused_at_the_fenced_write_boundary,
    force_release_frees_one_permit_and_inspect_never_shows_a_token,
    busy_names_the_permit_that_expires_first_among_many_after_extends_and_releases,
    invalid_input_gets_an_error_naming_the_field,
    a_waiter_costs_one_store_call_per_wake_up_and_never_lists_the_permits,
    a_limit_above_what_the_store_holds_is_invalid_and_writes_nothing,
);

/// The semaphore every test here uses.
const ID: &str = "partner.api";

async fn instance(runtime: &Runtime) -> Instance {
    runtime.instantiate().await.expect("instantiate")
}

fn acquired(outcome: AcquireOutcome) -> Permit {
    match outcome {
        AcquireOutcome::Acquired(permit) => permit,
        AcquireOutcome::Busy(holder) => panic!("expected acquired, got busy {holder:?}"),
    }
}

async fn acquire(
    i: &mut Instance,
    resource: &str,
    limit: u32,
    options: AcquireOptions,
) -> AcquireOutcome {
    i.semaphore()
        .acquire(ID, resource, limit, options)
        .await
        .expect("no trap")
        .expect("no error")
}

/// The permits the store holds for (`ID`, `resource`), read past the component.
async fn live_permits(store: &dyn Backend, resource: &str) -> usize {
    store
        .list(&semaphore_partition(ID, resource), "")
        .await
        .unwrap()
        .entries
        .len()
}

async fn uncontended_acquire_release_and_extend_cost_one_store_call_each(h: Harness) {
    let rt = h.runtime();
    let mut i = instance(&rt).await;
    let options = AcquireOptions::new().ttl_ms(1000).no_wait();
    let a = acquired(acquire(&mut i, "tenant:1", 2, options).await);
    assert_eq!(i.store_calls(), 1, "acquire");
    assert_eq!((a.expires_at, a.limit), (common::T0 + 1000, 2));
    let later = AcquireOptions::new().ttl_ms(2000).no_wait();
    let b = acquired(acquire(&mut i, "tenant:1", 2, later).await);
    assert_eq!(i.store_calls(), 2, "a second permit, with a place left");
    h.advance(250);
    let AcquireOutcome::Busy(first) = acquire(&mut i, "tenant:1", 2, options).await else {
        panic!("a third permit under a limit of 2");
    };
    assert_eq!(
        i.store_calls(),
        3,
        "busy, with the first to expire, in one call"
    );
    assert_eq!(
        (first.fence, first.remaining_ms, first.limit),
        (a.fence, 750, 2)
    );
    let ExtendOutcome::Extended(extended) =
        i.semaphore().extend(&b, Some(5000)).await.unwrap().unwrap()
    else {
        panic!("extend lost the permit");
    };
    assert_eq!(i.store_calls(), 4, "extend");
    assert_eq!(extended.fence, b.fence);
    assert!(i.semaphore().release(&a).await.unwrap().unwrap());
    assert_eq!(i.store_calls(), 5, "release");
    assert!(i.semaphore().is_held(&extended).await.unwrap().unwrap());
    assert!(!i.semaphore().is_held(&a).await.unwrap().unwrap());
}

async fn permits_never_exceed_the_limit_among_concurrent_instances_and_fences_rise(h: Harness) {
    const INSTANCES: usize = 8;
    const ROUNDS: usize = 12;
    const LIMIT: u32 = 3;
    let rt = h.runtime();
    let inside = Arc::new(AtomicUsize::new(0));
    let fences = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..INSTANCES {
        let (rt, inside, fences) = (rt.clone(), inside.clone(), fences.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = rt.instantiate().await.unwrap();
            // The clock never moves: a waiter can only be woken by a release.
            let wait = AcquireOptions::new().ttl_ms(60_000).wait_up_to(600_000);
            for _ in 0..ROUNDS {
                let permit = acquired(acquire(&mut i, "tenant:1", LIMIT, wait).await);
                let now_inside = inside.fetch_add(1, Ordering::SeqCst) + 1;
                assert!(now_inside <= LIMIT as usize, "{now_inside} holders at once");
                fences.lock().await.push(permit.fence);
                settle().await; // let the others try while we hold it
                inside.fetch_sub(1, Ordering::SeqCst);
                assert!(i.semaphore().release(&permit).await.unwrap().unwrap());
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let mut fences = fences.lock().await.clone();
    assert_eq!(fences.len(), INSTANCES * ROUNDS);
    fences.sort_unstable();
    fences.dedup();
    assert_eq!(
        fences.len(),
        INSTANCES * ROUNDS,
        "every permit has its own fence"
    );
    assert_eq!(live_permits(h.backend.as_ref(), "tenant:1").await, 0);
    // How many held at once above depends on the scheduler; that the
    // semaphore admits up to its limit, and no more, is checked here
    // without relying on it: LIMIT instances in, the next one busy.
    let now = AcquireOptions::new().ttl_ms(60_000).no_wait();
    let mut holders = Vec::new();
    for _ in 0..LIMIT {
        let mut i = rt.instantiate().await.unwrap();
        let permit = acquired(acquire(&mut i, "tenant:1", LIMIT, now).await);
        holders.push((i, permit));
    }
    let mut late = rt.instantiate().await.unwrap();
    assert!(
        matches!(
            acquire(&mut late, "tenant:1", LIMIT, now).await,
            AcquireOutcome::Busy(_)
        ),
        "a permit past the limit"
    );
    for (mut i, permit) in holders {
        assert!(i.semaphore().release(&permit).await.unwrap().unwrap());
    }
    assert_eq!(live_permits(h.backend.as_ref(), "tenant:1").await, 0);
}

async fn a_release_lets_exactly_one_waiter_in_per_place_freed(h: Harness) {
    const WAITERS: usize = 4;
    let rt = h.runtime();
    let mut i = instance(&rt).await;
    let hold = AcquireOptions::new().ttl_ms(600_000).no_wait();
    let a = acquired(acquire(&mut i, "tenant:2", 2, hold).await);
    let b = acquired(acquire(&mut i, "tenant:2", 2, hold).await);
    let admitted = Arc::new(AtomicUsize::new(0));
    let granted = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for _ in 0..WAITERS {
        // Each in a runtime of its own, as in a process of its own: all of
        // them wait on the store, and race for each place freed (waiters of
        // one runtime take turns instead: `turns.rs`).
        let (rt, admitted, granted) = (h.runtime(), admitted.clone(), granted.clone());
        waiters.push(tokio::spawn(async move {
            let mut i = rt.instantiate().await.unwrap();
            // The clock never moves: only a release can let a waiter in.
            let wait = AcquireOptions::new().ttl_ms(600_000).wait_up_to(600_000);
            let permit = acquired(acquire(&mut i, "tenant:2", 2, wait).await);
            admitted.fetch_add(1, Ordering::SeqCst);
            granted.lock().await.push(permit);
        }));
    }
    let partition = semaphore_partition(ID, "tenant:2");
    h.until_waiting(&partition, WAITERS).await;
    // Each release frees one place: exactly one waiter gets in, and the
    // others go back to waiting in the store.
    let mut freed = vec![a, b];
    let mut released = 0;
    while released < WAITERS {
        let permit = freed.remove(0);
        assert!(i.semaphore().release(&permit).await.unwrap().unwrap());
        released += 1;
        while admitted.load(Ordering::SeqCst) < released {
            tokio::task::yield_now().await;
        }
        h.until_waiting(&partition, WAITERS - released).await;
        settle().await;
        assert_eq!(
            admitted.load(Ordering::SeqCst),
            released,
            "one in per place freed"
        );
        assert_eq!(live_permits(h.backend.as_ref(), "tenant:2").await, 2);
        freed.extend(granted.lock().await.drain(..));
    }
    for waiter in waiters {
        waiter.await.unwrap();
    }
}

async fn a_holder_paused_past_its_ttl_is_refused_at_the_fenced_write_boundary(h: Harness) {
    let rt = h.runtime();
    let (mut paused, mut other) = (instance(&rt).await, instance(&rt).await);
    // The external system: per resource the highest fence it has seen.
    let boundary: Mutex<HashMap<String, u64>> = Mutex::new(HashMap::new());
    let write = |fence: u64| {
        let boundary = &boundary;
        async move {
            let mut seen = boundary.lock().await;
            let highest = seen.entry("export".into()).or_insert(0);
            let accepted = fence > *highest;
            if accepted {
                *highest = fence;
            }
            accepted
        }
    };
    let short = AcquireOptions::new().ttl_ms(1000).no_wait();
    let stale = acquired(acquire(&mut paused, "tenant:3", 1, short).await);
    assert!(write(stale.fence).await);
    // The holder pauses past its TTL; another takes the only place.
    h.advance(1000);
    let fresh = acquired(acquire(&mut other, "tenant:3", 1, short).await);
    assert!(fresh.fence > stale.fence);
    assert!(write(fresh.fence).await);
    // The paused holder wakes: refused at the boundary, and by the store.
    assert!(!write(stale.fence).await, "a lower fence must be refused");
    assert!(!paused.semaphore().is_held(&stale).await.unwrap().unwrap());
    assert!(!paused.semaphore().release(&stale).await.unwrap().unwrap());
    assert!(matches!(
        paused
            .semaphore()
            .extend(&stale, None)
            .await
            .unwrap()
            .unwrap(),
        ExtendOutcome::Lost
    ));
    assert!(other.semaphore().is_held(&fresh).await.unwrap().unwrap());
}

/// The (fence, remaining ms) of the permit a full semaphore names as busy.
async fn busy_at(i: &mut Instance, resource: &str, limit: u32) -> (u64, u64) {
    let options = AcquireOptions::new().ttl_ms(1000).no_wait();
    match acquire(i, resource, limit, options).await {
        AcquireOutcome::Busy(holder) => (holder.fence, holder.remaining_ms),
        AcquireOutcome::Acquired(p) => panic!("a place past the limit: {p:?}"),
    }
}

/// A full semaphore of many permits answers busy with the one that expires
/// first, read on the store's clock, however its permits were taken: out of
/// expiry order, extended past others (a store that indexes expiries must
/// not answer from a stale index entry) and released.
async fn busy_names_the_permit_that_expires_first_among_many_after_extends_and_releases(
    h: Harness,
) {
    const LIMIT: u32 = 40;
    let rt = h.runtime();
    let mut i = instance(&rt).await;
    // TTLs 10 s apart, taken in a scrambled order (7 and 40 are coprime).
    let mut held: Vec<(Permit, u64)> = Vec::new();
    for n in 0..u64::from(LIMIT) {
        let ttl = 100_000 + ((n * 7) % u64::from(LIMIT)) * 10_000;
        let options = AcquireOptions::new().ttl_ms(ttl).no_wait();
        held.push((
            acquired(acquire(&mut i, "tenant:5", LIMIT, options).await),
            ttl,
        ));
    }
    let first = |held: &[(Permit, u64)]| {
        let (permit, ttl) = held.iter().min_by_key(|(_, ttl)| *ttl).unwrap();
        (permit.fence, *ttl)
    };
    let (fence, ttl) = first(&held);
    assert_eq!(busy_at(&mut i, "tenant:5", LIMIT).await, (fence, ttl));
    // Half of them, those that expire first, are extended past every other
    // (an index of expiries kept as lower bounds now leads with 20 stale
    // entries): the first of the other half is named.
    h.advance(1_000);
    for (_, ttl) in held.iter_mut() {
        *ttl -= 1_000;
    }
    held.sort_by_key(|(_, ttl)| *ttl);
    let mut extended = Vec::new();
    for (permit, _) in held.drain(..20) {
        let ExtendOutcome::Extended(permit) = i
            .semaphore()
            .extend(&permit, Some(1_000_000))
            .await
            .unwrap()
            .unwrap()
        else {
            panic!("extend lost the permit");
        };
        extended.push(permit);
    }
    let (fence, ttl) = first(&held);
    assert_eq!(busy_at(&mut i, "tenant:5", LIMIT).await, (fence, ttl));
    // The next three to expire are released: a free place, then full again.
    held.sort_by_key(|(_, ttl)| *ttl);
    for (permit, _) in held.drain(..3) {
        assert!(i.semaphore().release(&permit).await.unwrap().unwrap());
    }
    for _ in 0..3 {
        let options = AcquireOptions::new().ttl_ms(2_000_000).no_wait();
        acquired(acquire(&mut i, "tenant:5", LIMIT, options).await);
    }
    let (fence, ttl) = first(&held);
    assert_eq!(busy_at(&mut i, "tenant:5", LIMIT).await, (fence, ttl));
    // Once the named permit's time is up, it is no longer named, nor held.
    h.advance(ttl);
    let expired = held.remove(0).0;
    for (_, left) in held.iter_mut() {
        *left -= ttl;
    }
    assert!(!i.semaphore().is_held(&expired).await.unwrap().unwrap());
    assert!(i.semaphore().is_held(&extended[0]).await.unwrap().unwrap());
    acquired(
        acquire(
            &mut i,
            "tenant:5",
            LIMIT,
            AcquireOptions::new().ttl_ms(2_000_000).no_wait(),
        )
        .await,
    );
    let (fence, ttl) = first(&held);
    assert_eq!(busy_at(&mut i, "tenant:5", LIMIT).await, (fence, ttl));
}

async fn force_release_frees_one_permit_and_inspect_never_shows_a_token(h: Harness) {
    let rt = h.runtime();
    let mut i = instance(&rt).await;
    let options = AcquireOptions::new().ttl_ms(60_000).no_wait();
    let a = acquired(acquire(&mut i, "tenant:4", 2, options).await);
    h.advance(10);
    let b = acquired(acquire(&mut i, "tenant:4", 2, options).await);
    let usage = i
        .semaphore()
        .inspect(ID, "tenant:4")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        usage.permits,
        [
            Holder {
                fence: a.fence,
                remaining_ms: 59_990,
                limit: 2
            },
            Holder {
                fence: b.fence,
                remaining_ms: 60_000,
                limit: 2
            }
        ]
    );
    assert_eq!(usage.now, common::T0 + 10);
    assert!(!format!("{usage:?}").contains(&a.owner));
    assert!(
        i.semaphore()
            .force_release(ID, "tenant:4", a.fence)
            .await
            .unwrap()
            .unwrap()
    );
    assert!(
        !i.semaphore()
            .force_release(ID, "tenant:4", a.fence)
            .await
            .unwrap()
            .unwrap()
    );
    assert!(
        !i.semaphore().release(&a).await.unwrap().unwrap(),
        "the removed holder lost it"
    );
    assert!(i.semaphore().is_held(&b).await.unwrap().unwrap());
    let c = acquired(acquire(&mut i, "tenant:4", 2, options).await);
    assert!(c.fence > b.fence);
    let empty = i.semaphore().inspect(ID, "nobody").await.unwrap().unwrap();
    assert!(empty.permits.is_empty());
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
    let ok = AcquireOptions::new().ttl_ms(1000).no_wait();
    for (limit, options, expected) in [
        (0, ok, "limit"),
        (100_001, ok, "limit"),
        (u32::MAX, ok, "limit"),
        (1, AcquireOptions::new().ttl_ms(0), "options.ttl-ms"),
        (
            1,
            AcquireOptions::new().ttl_ms(86_400_001),
            "options.ttl-ms",
        ),
        (
            1,
            AcquireOptions::new().wait_up_to(600_001),
            "options.wait.timeout",
        ),
        (
            1,
            AcquireOptions::new().wait(WaitPolicy::Attempts(Retry {
                max_attempts: 0,
                delay_ms: 1,
            })),
            "options.wait.attempts.max-attempts",
        ),
    ] {
        let result = i
            .semaphore()
            .acquire(ID, "t", limit, options)
            .await
            .unwrap();
        assert_eq!(field(result), expected);
    }
    let empty = i.semaphore().acquire("", "t", 1, ok).await.unwrap();
    assert_eq!(field(empty), "id");
    let long = "r".repeat(1025);
    let long = i.semaphore().acquire(ID, &long, 1, ok).await.unwrap();
    assert_eq!(field(long), "resource");
    let zero = i.semaphore().force_release(ID, "t", 0).await.unwrap();
    assert_eq!(field(zero), "fence");
    assert_eq!(i.store_calls(), 0, "the store was never asked");
    let good = acquired(acquire(&mut i, "t", 1, ok).await);
    let forged = Permit {
        owner: "not hex".into(),
        ..good.clone()
    };
    assert_eq!(
        field(i.semaphore().release(&forged).await.unwrap()),
        "permit.owner"
    );
    let relimited = Permit {
        limit: 0,
        ..good.clone()
    };
    assert_eq!(
        field(i.semaphore().extend(&relimited, None).await.unwrap()),
        "permit.limit"
    );
    assert_eq!(
        field(i.semaphore().extend(&good, Some(0)).await.unwrap()),
        "ttl-ms"
    );
}

/// A waiter's first attempt finds the semaphore full; its next goes to the
/// store at once as a wait on the revision the full attempt's reply
/// carried, and the release lands it: two store calls in all, and no
/// listing of the permits held (which would make waiting cost more beside
/// more permits).
async fn a_waiter_costs_one_store_call_per_wake_up_and_never_lists_the_permits(h: Harness) {
    let rt = h.runtime();
    let mut holder = instance(&rt).await;
    let hold = AcquireOptions::new().ttl_ms(600_000).no_wait();
    let held = acquired(acquire(&mut holder, "tenant:7", 1, hold).await);
    let waiter = {
        let rt = rt.clone();
        tokio::spawn(async move {
            let mut i = rt.instantiate().await.unwrap();
            // The clock never moves: only the release can let it in.
            let wait = AcquireOptions::new().ttl_ms(600_000).wait_up_to(600_000);
            let permit = acquired(acquire(&mut i, "tenant:7", 1, wait).await);
            (permit, i.store_calls())
        })
    };
    h.until_waiting(&semaphore_partition(ID, "tenant:7"), 1)
        .await;
    assert!(holder.semaphore().release(&held).await.unwrap().unwrap());
    let (permit, calls) = waiter.await.unwrap();
    assert!(permit.fence > held.fence);
    assert_eq!(calls, 2, "the full attempt, then the wait that lands");
}

/// A limit the store cannot hold is `invalid-argument` naming `limit`, and
/// nothing is written: on NATS, above 1 000 (a partition is one message,
/// rewritten whole by every call); every other store takes the
/// component's 100 000.
async fn a_limit_above_what_the_store_holds_is_invalid_and_writes_nothing(h: Harness) {
    let rt = h.runtime();
    let mut i = instance(&rt).await;
    let ok = AcquireOptions::new().ttl_ms(60_000).no_wait();
    let (most, refused) = if h.backend.kind() == "nats" {
        (coord_nats::MAX_PERMITS, Some(coord_nats::MAX_PERMITS + 1))
    } else {
        (coord_component::semaphore::MAX_LIMIT, None)
    };
    if let Some(limit) = refused {
        let result = i
            .semaphore()
            .acquire(ID, "tenant:8", limit, ok)
            .await
            .unwrap();
        match result {
            Err(Error::InvalidArgument(InvalidArgument { field, reason })) => {
                assert_eq!(field, "limit");
                assert!(reason.contains(&most.to_string()), "{reason}");
            }
            other => panic!("expected invalid-argument on limit, got {other:?}"),
        }
        assert_eq!(live_permits(h.backend.as_ref(), "tenant:8").await, 0);
    }
    let permit = acquired(acquire(&mut i, "tenant:8", most, ok).await);
    assert_eq!(permit.limit, most);
    assert_eq!(live_permits(h.backend.as_ref(), "tenant:8").await, 1);
}
