//! Safety under contention and faults, through the real component on every
//! backend: fenced writes under expiring locks, and store calls that fail
//! before or after taking effect. See RELIABILITY.md for the results.

#![allow(clippy::unwrap_used)] // tests may unwrap: a panic is the failure report

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use common::{Harness, history};
use coord_component::keys::{LOCK_HOLDER_KEY, lock_partition};
use coord_host::backend::Backend;
use coord_host::backend::faulty::FaultyBackend;
use coord_host::lock::*;
use coord_host::ratelimit::{Algorithm, Limiter};
use coord_host::{Instance, Runtime};

const HISTORY: usize = 1024;

per_backend!(
    fenced_writes_stay_safe_under_contention_and_expiring_holders,
    injected_store_faults_never_grant_wrongly_and_work_resumes,
    lock_histories_are_linearizable,
    expiring_lock_histories_are_linearizable,
    rate_limit_histories_are_linearizable,
    ephemeral_histories_are_linearizable,
);

/// A deterministic pseudo-random sequence.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// The external system the locks protect: per resource a value and the
/// highest fence seen, which refuses any access with a lower fence.
#[derive(Default)]
struct FencedRegister {
    cells: Mutex<HashMap<String, (u64, u64)>>,
}

impl FencedRegister {
    fn read(&self, resource: &str, fence: u64) -> Option<u64> {
        let mut cells = self.cells.lock().unwrap();
        let (value, highest) = cells.entry(resource.to_string()).or_default();
        if fence < *highest {
            return None;
        }
        *highest = fence;
        Some(*value)
    }

    fn write(&self, resource: &str, fence: u64, value: u64) -> bool {
        let mut cells = self.cells.lock().unwrap();
        let (stored, highest) = cells.entry(resource.to_string()).or_default();
        if fence < *highest {
            return false;
        }
        *highest = fence;
        *stored = value;
        true
    }

    fn value(&self, resource: &str) -> u64 {
        self.cells.lock().unwrap().get(resource).map_or(0, |c| c.0)
    }
}

/// Moves the store's clock in small random steps until told to stop, so
/// holders expire while they work.
fn clock_mover(h: &Harness, stop: Arc<AtomicBool>, max_step: u64) -> tokio::task::JoinHandle<()> {
    let clock = h.clone_clock();
    tokio::spawn(async move {
        let mut rng = Lcg(99);
        while !stop.load(Ordering::SeqCst) {
            clock.advance(rng.below(max_step));
            for _ in 0..5 {
                tokio::task::yield_now().await;
            }
        }
    })
}

#[derive(Default)]
struct Tally {
    sections: AtomicU64,
    accepted: AtomicU64,
    refused: AtomicU64,
    lost_releases: AtomicU64,
}

async fn fenced_writes_stay_safe_under_contention_and_expiring_holders(h: Harness) {
    fenced_writes(h, 30).await;
}

/// The fenced-safety run at soak length: `COORD_SOAK_ROUNDS` rounds per
/// instance (default 1000), on demand:
/// `cargo test -p coord-host --test reliability -- --ignored soak`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a soak: minutes; run on demand with --ignored"]
async fn soak_fenced_writes_in_memory() {
    fenced_writes(common::memory(HISTORY), soak_rounds()).await;
}

/// [`soak_fenced_writes_in_memory`] on Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a soak: minutes; run on demand with --ignored"]
async fn soak_fenced_writes_on_redis() {
    fenced_writes(common::redis(HISTORY).await, soak_rounds()).await;
}

fn soak_rounds() -> usize {
    std::env::var("COORD_SOAK_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000)
}

/// 64 instances contend for 4 resources with expiring holders, `rounds`
/// sections each, writing through a fenced register.
async fn fenced_writes(h: Harness, rounds: usize) {
    const INSTANCES: usize = 64; // 16 × 4: one instance per task, since an instance serves one call at a time
    const RESOURCES: u64 = 4;
    let runtime = Arc::new(Runtime::new(h.backend.clone()).unwrap());
    let register = Arc::new(FencedRegister::default());
    let tally = Arc::new(Tally::default());
    let fences: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mover = clock_mover(&h, stop.clone(), 40);
    let mut tasks = Vec::new();
    for t in 0..INSTANCES {
        let (runtime, register, tally, fences) = (
            runtime.clone(),
            register.clone(),
            tally.clone(),
            fences.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut i = runtime.instantiate().await.unwrap();
            let mut rng = Lcg(t as u64 + 1);
            for _ in 0..rounds {
                let resource = format!("item:{}", rng.below(RESOURCES));
                let options = AcquireOptions {
                    ttl_ms: Some(20 + rng.below(180)),
                    wait: Some(WaitPolicy::Timeout(2_000)),
                };
                let lock = match i
                    .acquire("stock", &resource, options)
                    .await
                    .unwrap()
                    .unwrap()
                {
                    AcquireOutcome::Acquired(lock) => lock,
                    AcquireOutcome::Busy(_) => continue,
                };
                fences.lock().unwrap().push((resource.clone(), lock.fence));
                tally.sections.fetch_add(1, Ordering::SeqCst);
                // Read, work (the clock moves meanwhile), write: the counter increment.
                if let Some(value) = register.read(&resource, lock.fence) {
                    for _ in 0..rng.below(20) {
                        tokio::task::yield_now().await;
                    }
                    if register.write(&resource, lock.fence, value + 1) {
                        tally.accepted.fetch_add(1, Ordering::SeqCst);
                    } else {
                        tally.refused.fetch_add(1, Ordering::SeqCst);
                    }
                } else {
                    tally.refused.fetch_add(1, Ordering::SeqCst);
                }
                if !i.release(&lock).await.unwrap().unwrap() {
                    tally.lost_releases.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    mover.await.unwrap();

    let fences = fences.lock().unwrap();
    let unique: HashSet<_> = fences.iter().collect();
    assert_eq!(
        unique.len(),
        fences.len(),
        "two acquisitions of one resource shared a fence"
    );
    let (sections, accepted, refused) = (
        tally.sections.load(Ordering::SeqCst),
        tally.accepted.load(Ordering::SeqCst),
        tally.refused.load(Ordering::SeqCst),
    );
    assert_eq!(sections, accepted + refused);
    let total: u64 = (0..RESOURCES)
        .map(|r| register.value(&format!("item:{r}")))
        .sum();
    assert_eq!(
        total, accepted,
        "every accepted increment is in the counters: no lost update"
    );
    let lost = tally.lost_releases.load(Ordering::SeqCst);
    assert!(
        lost > 0,
        "some holders outlived their TTL, so the test exercised expiry"
    );
    eprintln!(
        "fenced safety: {sections} sections, {accepted} writes accepted, {refused} stale accesses refused, {lost} holders expired mid-section"
    );
}

async fn injected_store_faults_never_grant_wrongly_and_work_resumes(h: Harness) {
    const TASKS: usize = 16;
    let faulty = Arc::new(FaultyBackend::new(h.backend.clone(), 7));
    faulty.set_rate(0.2);
    let runtime = Arc::new(Runtime::new(faulty.clone()).unwrap());
    let inner = h.backend.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let mover = clock_mover(&h, stop.clone(), 30);
    let unavailable = Arc::new(AtomicU64::new(0));
    let granted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (runtime, inner, unavailable, granted) = (
            runtime.clone(),
            inner.clone(),
            unavailable.clone(),
            granted.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut i = runtime.instantiate().await.unwrap();
            let mut rng = Lcg(t as u64 + 100);
            for _ in 0..40 {
                let resource = format!("item:{}", rng.below(2));
                let options = AcquireOptions {
                    ttl_ms: Some(50 + rng.below(200)),
                    wait: Some(WaitPolicy::NoWait),
                };
                match i.acquire("stock", &resource, options).await.unwrap() {
                    Err(Error::Unavailable(_)) => {
                        unavailable.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(other) => panic!("faults must surface as unavailable, got {other:?}"),
                    Ok(AcquireOutcome::Busy(_)) => {}
                    Ok(AcquireOutcome::Acquired(lock)) => {
                        granted.fetch_add(1, Ordering::SeqCst);
                        assert_holds(inner.as_ref(), &lock).await;
                        match i.release(&lock).await.unwrap() {
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
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    mover.await.unwrap();
    assert!(
        faulty.injected() > 0 && unavailable.load(Ordering::SeqCst) > 0,
        "faults were injected and seen"
    );
    assert!(
        granted.load(Ordering::SeqCst) > 0,
        "some work got through the faults"
    );

    // The rate limiter under the same faults: never more allowed than the limit.
    let limiter = Limiter {
        id: "exports".into(),
        limit: 30,
        window_ms: 3_600_000,
        algorithm: Some(Algorithm::FixedWindow),
    };
    let mut i = runtime.instantiate().await.unwrap();
    let mut allowed = 0;
    for _ in 0..100 {
        match i.check(&limiter, "user:1", None).await.unwrap() {
            Ok(d) if d.allowed => allowed += 1,
            Ok(_) => {}
            Err(coord_host::ratelimit::Error::Unavailable(_)) => {}
            Err(other) => panic!("faults must surface as unavailable, got {other:?}"),
        }
    }
    assert!(allowed <= 30, "{allowed} allowed past a limit of 30");

    // Faults stop: work resumes at once, for every instance.
    faulty.set_rate(0.0);
    h.advance(3_600_000); // every lock left behind by a lost reply has expired
    for t in 0..TASKS {
        let mut i: Instance = runtime.instantiate().await.unwrap();
        let options = AcquireOptions::new().ttl_ms(1000).no_wait();
        let resource = format!("item:{}", t % 2);
        let AcquireOutcome::Acquired(lock) = i
            .acquire("stock", &resource, options)
            .await
            .unwrap()
            .unwrap()
        else {
            panic!("after recovery the lock must be free");
        };
        assert!(i.release(&lock).await.unwrap().unwrap());
    }
    eprintln!(
        "faults: {} injected, {} calls unavailable, {} locks granted, {allowed} of 100 checks allowed (limit 30)",
        faulty.injected(),
        unavailable.load(Ordering::SeqCst),
        granted.load(Ordering::SeqCst)
    );
}

/// An `acquired` lock is really held in the store (read past the faults),
/// unless the moving clock has already expired it.
async fn assert_holds(store: &dyn Backend, lock: &HeldLock) {
    let read = store
        .get(&lock_partition(&lock.id, &lock.resource), LOCK_HOLDER_KEY)
        .await
        .unwrap();
    match read.entry {
        Some(e) if e.revision == lock.fence => assert_eq!(e.value, lock.owner.as_bytes()),
        other => assert!(
            read.now >= lock.expires_at,
            "acquired was reported but the store holds {other:?} at {} (expiry {})",
            read.now,
            lock.expires_at
        ),
    }
}

/// The lock as a sequential model: who holds it, and the highest fence given.
struct LockModel;

#[derive(Debug, Clone)]
enum LockIn {
    Acquire,
    Release(u64),
}

#[derive(Debug, Clone)]
enum LockOut {
    Acquired(u64),
    Busy(u64),
    Released(bool),
}

impl history::Model for LockModel {
    type State = (Option<u64>, u64);
    type Input = LockIn;
    type Output = LockOut;

    fn init(&self) -> Self::State {
        (None, 0)
    }

    fn step(
        &self,
        &(holder, highest): &Self::State,
        input: &LockIn,
        output: &LockOut,
    ) -> Option<Self::State> {
        match (input, output) {
            (LockIn::Acquire, LockOut::Acquired(f)) => {
                (holder.is_none() && *f > highest).then_some((Some(*f), *f))
            }
            (LockIn::Acquire, LockOut::Busy(f)) => {
                (holder == Some(*f)).then_some((holder, highest))
            }
            (LockIn::Release(f), LockOut::Released(true)) => {
                (holder == Some(*f)).then_some((None, highest))
            }
            (LockIn::Release(f), LockOut::Released(false)) => {
                (holder != Some(*f)).then_some((holder, highest))
            }
            _ => None,
        }
    }
}

/// A fixed-window limit with a frozen clock as a sequential model: units counted.
struct LimitModel(u32);

impl history::Model for LimitModel {
    type State = u32;
    type Input = u32;
    type Output = bool;

    fn init(&self) -> u32 {
        0
    }

    fn step(&self, &count: &u32, &cost: &u32, &allowed: &bool) -> Option<u32> {
        let fits = count + cost <= self.0;
        (fits == allowed).then_some(if allowed { count + cost } else { count })
    }
}

async fn lock_histories_are_linearizable(h: Harness) {
    const CLIENTS: u64 = 6;
    const ROUNDS: usize = 5;
    let runtime = Arc::new(Runtime::new(h.backend.clone()).unwrap());
    // Several short histories: the search is exponential in the worst case.
    for round in 0..4 {
        let recorder = Arc::new(history::Recorder::<LockIn, LockOut>::default());
        let mut tasks = Vec::new();
        for c in 0..CLIENTS {
            let (runtime, recorder) = (runtime.clone(), recorder.clone());
            tasks.push(tokio::spawn(async move {
                let mut i = runtime.instantiate().await.unwrap();
                let mut rng = Lcg(c * 31 + round);
                for _ in 0..ROUNDS {
                    let t = recorder.invoke();
                    let options = AcquireOptions::new().ttl_ms(60_000).no_wait();
                    match i
                        .acquire("stock", &format!("hist-{round}"), options)
                        .await
                        .unwrap()
                        .unwrap()
                    {
                        AcquireOutcome::Acquired(lock) => {
                            recorder.returned(t, LockIn::Acquire, LockOut::Acquired(lock.fence));
                            for _ in 0..rng.below(4) {
                                tokio::task::yield_now().await;
                            }
                            let t = recorder.invoke();
                            let released = i.release(&lock).await.unwrap().unwrap();
                            recorder.returned(
                                t,
                                LockIn::Release(lock.fence),
                                LockOut::Released(released),
                            );
                            // A second, stale release must be refused.
                            let t = recorder.invoke();
                            let again = i.release(&lock).await.unwrap().unwrap();
                            recorder.returned(
                                t,
                                LockIn::Release(lock.fence),
                                LockOut::Released(again),
                            );
                        }
                        AcquireOutcome::Busy(holder) => {
                            recorder.returned(t, LockIn::Acquire, LockOut::Busy(holder.fence))
                        }
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let history = Arc::try_unwrap(recorder).ok().unwrap().history();
        assert!(
            history::linearizable(&LockModel, &history),
            "not linearizable: {history:#?}"
        );
    }
}

async fn rate_limit_histories_are_linearizable(h: Harness) {
    let runtime = Arc::new(Runtime::new(h.backend.clone()).unwrap());
    let recorder = Arc::new(history::Recorder::<u32, bool>::default());
    let mut tasks = Vec::new();
    for c in 0..6u64 {
        let (runtime, recorder) = (runtime.clone(), recorder.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = runtime.instantiate().await.unwrap();
            let mut rng = Lcg(c + 5);
            let limiter = Limiter {
                id: "hist".into(),
                limit: 12,
                window_ms: 3_600_000,
                algorithm: Some(Algorithm::FixedWindow),
            };
            for _ in 0..8 {
                let cost = 1 + rng.below(3) as u32;
                let t = recorder.invoke();
                let d = i.check(&limiter, "k", Some(cost)).await.unwrap().unwrap();
                recorder.returned(t, cost, d.allowed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let history = Arc::try_unwrap(recorder).ok().unwrap().history();
    assert!(
        history::linearizable(&LimitModel(12), &history),
        "not linearizable: {history:#?}"
    );
}

/// The lock with expiry as a sequential model. Every acquire reports the
/// store's time (`expires-at - ttl`, or the holder's expiry minus the busy
/// reply's `remaining-ms`), so the model knows when each one happened: time
/// never runs backwards, nobody acquires before the holder's expiry, and
/// `busy` names a holder that has not expired yet.
struct ExpiringLockModel;

#[derive(Debug, Clone)]
enum ExpIn {
    Acquire { ttl: u64 },
    Release(u64),
}

#[derive(Debug, Clone)]
enum ExpOut {
    Acquired { fence: u64, expires_at: u64 },
    Busy { fence: u64, remaining: u64 },
    Released(bool),
}

/// (holder's fence and expiry, highest fence given, the store time reached).
type ExpState = (Option<(u64, u64)>, u64, u64);

impl history::Model for ExpiringLockModel {
    type State = ExpState;
    type Input = ExpIn;
    type Output = ExpOut;

    fn init(&self) -> ExpState {
        (None, 0, 0)
    }

    fn step(
        &self,
        &(holder, highest, time): &ExpState,
        input: &ExpIn,
        output: &ExpOut,
    ) -> Option<ExpState> {
        match (input, output) {
            (ExpIn::Acquire { ttl }, ExpOut::Acquired { fence, expires_at }) => {
                let at = expires_at.checked_sub(*ttl)?;
                let free = holder.is_none_or(|(_, until)| until <= at);
                (at >= time && free && *fence > highest).then_some((
                    Some((*fence, *expires_at)),
                    *fence,
                    at,
                ))
            }
            (ExpIn::Acquire { .. }, ExpOut::Busy { fence, remaining }) => {
                let (held, until) = holder?;
                let at = until.checked_sub(*remaining)?;
                (held == *fence && *remaining > 0 && at >= time).then_some((holder, highest, at))
            }
            (ExpIn::Release(fence), ExpOut::Released(true)) => {
                // Released while still held: possible only before its expiry.
                let (held, until) = holder?;
                (held == *fence && time < until).then_some((None, highest, time))
            }
            (ExpIn::Release(fence), ExpOut::Released(false)) => match holder {
                // Its own lock refused: it must have expired by then.
                Some((held, until)) if held == *fence => Some((None, highest, time.max(until))),
                _ => Some((holder, highest, time)),
            },
            _ => None,
        }
    }
}

async fn expiring_lock_histories_are_linearizable(h: Harness) {
    const CLIENTS: u64 = 5;
    let runtime = Arc::new(Runtime::new(h.backend.clone()).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let mover = clock_mover(&h, stop.clone(), 8);
    // Releases refused because the lock had lapsed: expiry must really occur.
    let lapsed = Arc::new(AtomicU64::new(0));
    for round in 0..4 {
        let recorder = Arc::new(history::Recorder::<ExpIn, ExpOut>::default());
        let mut tasks = Vec::new();
        for c in 0..CLIENTS {
            let (runtime, recorder, lapsed) = (runtime.clone(), recorder.clone(), lapsed.clone());
            let clock = h.clone_clock();
            tasks.push(tokio::spawn(async move {
                let mut i = runtime.instantiate().await.unwrap();
                let mut rng = Lcg(c * 17 + round + 3);
                for attempt in 0..6 {
                    let ttl = 5 + rng.below(30);
                    let options = AcquireOptions::new().ttl_ms(ttl).no_wait();
                    let t = recorder.invoke();
                    let resource = format!("exp-hist-{round}");
                    match i
                        .acquire("stock", &resource, options)
                        .await
                        .unwrap()
                        .unwrap()
                    {
                        AcquireOutcome::Acquired(lock) => {
                            recorder.returned(
                                t,
                                ExpIn::Acquire { ttl },
                                ExpOut::Acquired {
                                    fence: lock.fence,
                                    expires_at: lock.expires_at,
                                },
                            );
                            for _ in 0..rng.below(20) {
                                tokio::task::yield_now().await;
                            }
                            // Every other holder outstays its TTL, so each
                            // round has a lapse whatever the mover did: the
                            // round's first acquisition is some client's
                            // attempt 0. (On a fast machine the mover alone
                            // could leave a whole run without one.)
                            if attempt % 2 == 0 {
                                clock.advance(ttl + 1);
                            }
                            let t = recorder.invoke();
                            let released = i.release(&lock).await.unwrap().unwrap();
                            if !released {
                                lapsed.fetch_add(1, Ordering::SeqCst);
                            }
                            recorder.returned(
                                t,
                                ExpIn::Release(lock.fence),
                                ExpOut::Released(released),
                            );
                        }
                        AcquireOutcome::Busy(holder) => recorder.returned(
                            t,
                            ExpIn::Acquire { ttl },
                            ExpOut::Busy {
                                fence: holder.fence,
                                remaining: holder.remaining_ms,
                            },
                        ),
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let history = Arc::try_unwrap(recorder).ok().unwrap().history();
        assert!(
            history::linearizable(&ExpiringLockModel, &history),
            "not linearizable: {history:#?}"
        );
    }
    stop.store(true, Ordering::SeqCst);
    mover.await.unwrap();
    assert!(
        lapsed.load(Ordering::SeqCst) > 0,
        "no lock lapsed: expiry went untested"
    );
}

/// One tenant of ephemeral state as a sequential model: its live entries
/// (key, value, revision), and a lower bound on the tenant's revision.
struct EphemeralModel;

#[derive(Debug, Clone)]
enum EphIn {
    Upsert(String, Vec<u8>),
    Touch(String),
    Delete(String),
    Snapshot,
}

#[derive(Debug, Clone)]
enum EphOut {
    Written(u64),
    Found(bool),
    Snapshot(Vec<(String, Vec<u8>, u64)>, u64),
}

type EphState = (Vec<(String, Vec<u8>, u64)>, u64);

impl history::Model for EphemeralModel {
    type State = EphState;
    type Input = EphIn;
    type Output = EphOut;

    fn init(&self) -> EphState {
        (Vec::new(), 0)
    }

    fn step(
        &self,
        (entries, floor): &EphState,
        input: &EphIn,
        output: &EphOut,
    ) -> Option<EphState> {
        let present = |key: &str| entries.iter().any(|(k, _, _)| k == key);
        match (input, output) {
            (EphIn::Upsert(key, value), EphOut::Written(revision)) => {
                if *revision <= *floor {
                    return None;
                }
                let mut next: Vec<_> = entries
                    .iter()
                    .filter(|(k, _, _)| k != key)
                    .cloned()
                    .collect();
                next.push((key.clone(), value.clone(), *revision));
                next.sort();
                Some((next, *revision))
            }
            (EphIn::Touch(key), EphOut::Found(found)) => {
                (present(key) == *found).then(|| (entries.clone(), *floor))
            }
            (EphIn::Delete(key), EphOut::Found(found)) => {
                if present(key) != *found {
                    return None;
                }
                if !found {
                    return Some((entries.clone(), *floor));
                }
                // The delete took a revision the reply does not show: the
                // next one is at least one higher.
                let next = entries
                    .iter()
                    .filter(|(k, _, _)| k != key)
                    .cloned()
                    .collect();
                Some((next, floor + 1))
            }
            (EphIn::Snapshot, EphOut::Snapshot(seen, revision)) => {
                (seen == entries && *revision >= *floor).then(|| (entries.clone(), *revision))
            }
            _ => None,
        }
    }
}

async fn ephemeral_histories_are_linearizable(h: Harness) {
    use coord_host::ephemeral::Space;
    let runtime = Arc::new(Runtime::new(h.backend.clone()).unwrap());
    let space = Space {
        id: "hist.presence".into(),
        ttl_ms: 3_600_000,
        max_value_bytes: 64,
    };
    for round in 0..4u64 {
        let recorder = Arc::new(history::Recorder::<EphIn, EphOut>::default());
        let mut tasks = Vec::new();
        for c in 0..5u64 {
            let (runtime, recorder, space) = (runtime.clone(), recorder.clone(), space.clone());
            tasks.push(tokio::spawn(async move {
                let mut i = runtime.instantiate().await.unwrap();
                let mut rng = Lcg(c * 7 + round * 101 + 1);
                let tenant = format!("doc-{round}");
                for n in 0..6 {
                    let key = ["a", "b", "c"][rng.below(3) as usize].to_string();
                    let t = recorder.invoke();
                    let (input, output) = match rng.below(4) {
                        0 | 1 => {
                            let value = format!("{c}.{n}").into_bytes();
                            let written = i
                                .upsert(&space, &tenant, &key, &value)
                                .await
                                .unwrap()
                                .unwrap();
                            (EphIn::Upsert(key, value), EphOut::Written(written.revision))
                        }
                        2 if n % 2 == 0 => {
                            let found = i.touch(&space, &tenant, &key).await.unwrap().unwrap();
                            (EphIn::Touch(key), EphOut::Found(found))
                        }
                        2 => {
                            let found = i.delete(&space, &tenant, &key).await.unwrap().unwrap();
                            (EphIn::Delete(key), EphOut::Found(found))
                        }
                        _ => {
                            let snapshot =
                                i.snapshot(&space, &tenant, None).await.unwrap().unwrap();
                            let mut seen: Vec<_> = snapshot
                                .entries
                                .into_iter()
                                .map(|e| (e.key, e.value, e.revision))
                                .collect();
                            seen.sort();
                            (EphIn::Snapshot, EphOut::Snapshot(seen, snapshot.revision))
                        }
                    };
                    recorder.returned(t, input, output);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let history = Arc::try_unwrap(recorder).ok().unwrap().history();
        assert!(
            history::linearizable(&EphemeralModel, &history),
            "not linearizable: {history:#?}"
        );
    }
}

#[test]
fn the_history_checker_rejects_what_no_order_explains() {
    use history::Op;
    // Two acquisitions that overlap in time both "acquired": no order works.
    let both = vec![
        Op {
            invoked: 0,
            returned: 3,
            input: LockIn::Acquire,
            output: LockOut::Acquired(5),
        },
        Op {
            invoked: 1,
            returned: 2,
            input: LockIn::Acquire,
            output: LockOut::Acquired(6),
        },
    ];
    assert!(!history::linearizable(&LockModel, &both));
    // A fence that goes backwards after a release.
    let backwards = vec![
        Op {
            invoked: 0,
            returned: 1,
            input: LockIn::Acquire,
            output: LockOut::Acquired(5),
        },
        Op {
            invoked: 2,
            returned: 3,
            input: LockIn::Release(5),
            output: LockOut::Released(true),
        },
        Op {
            invoked: 4,
            returned: 5,
            input: LockIn::Acquire,
            output: LockOut::Acquired(4),
        },
    ];
    assert!(!history::linearizable(&LockModel, &backwards));
    // Allowed past the limit.
    let over = vec![
        Op {
            invoked: 0,
            returned: 1,
            input: 2,
            output: true,
        },
        Op {
            invoked: 0,
            returned: 1,
            input: 2,
            output: true,
        },
    ];
    assert!(!history::linearizable(&LimitModel(3), &over));
    // And a concurrent pair that only one order explains is accepted.
    let racing = vec![
        Op {
            invoked: 0,
            returned: 3,
            input: LockIn::Acquire,
            output: LockOut::Busy(7),
        },
        Op {
            invoked: 1,
            returned: 2,
            input: LockIn::Acquire,
            output: LockOut::Acquired(7),
        },
    ];
    assert!(history::linearizable(&LockModel, &racing));
}

#[test]
fn the_expiry_and_ephemeral_models_reject_what_no_order_explains() {
    use history::Op;
    fn op<I, O>(invoked: u64, returned: u64, input: I, output: O) -> Op<I, O> {
        Op {
            invoked,
            returned,
            input,
            output,
        }
    }
    let acquire = |ttl| ExpIn::Acquire { ttl };
    let acquired = |fence, expires_at| ExpOut::Acquired { fence, expires_at };
    let busy = |fence, remaining| ExpOut::Busy { fence, remaining };
    // Acquired at 100 for 50 ms; another acquire at 120 (before the expiry
    // at 150) cannot have succeeded ...
    let early = vec![
        op(0, 1, acquire(50), acquired(1, 150)),
        op(2, 3, acquire(50), acquired(2, 170)),
    ];
    assert!(!history::linearizable(&ExpiringLockModel, &early));
    // ... but at 150 it can,
    let on_time = vec![
        op(0, 1, acquire(50), acquired(1, 150)),
        op(2, 3, acquire(50), acquired(2, 200)),
    ];
    assert!(history::linearizable(&ExpiringLockModel, &on_time));
    // and the store's time cannot run backwards between two busy replies.
    let backwards = vec![
        op(0, 1, acquire(50), acquired(1, 150)),
        op(2, 3, acquire(9), busy(1, 10)),
        op(4, 5, acquire(9), busy(1, 30)),
    ];
    assert!(!history::linearizable(&ExpiringLockModel, &backwards));

    // An acknowledged upsert missing from a later snapshot is rejected, and
    // so is a revision that goes back.
    let upsert = |key: &str, value: &str| EphIn::Upsert(key.into(), value.into());
    let lost = vec![
        op(0, 1, upsert("a", "1"), EphOut::Written(5)),
        op(2, 3, EphIn::Snapshot, EphOut::Snapshot(vec![], 5)),
    ];
    assert!(!history::linearizable(&EphemeralModel, &lost));
    let regressed = vec![
        op(0, 1, upsert("a", "1"), EphOut::Written(5)),
        op(2, 3, upsert("b", "1"), EphOut::Written(4)),
    ];
    assert!(!history::linearizable(&EphemeralModel, &regressed));
    let kept = vec![
        op(0, 1, upsert("a", "1"), EphOut::Written(5)),
        op(2, 3, EphIn::Delete("a".into()), EphOut::Found(true)),
        op(4, 5, EphIn::Touch("a".into()), EphOut::Found(false)),
        op(6, 7, EphIn::Snapshot, EphOut::Snapshot(vec![], 6)),
    ];
    assert!(history::linearizable(&EphemeralModel, &kept));
}

/// The hang detector of every suite here ([`common::watchdog`]) fires once
/// nothing has completed for its quiet period: three steps 50 s apart,
/// then none, fail 60 s (to 60 + 7.5 s) after the last step. Tokio's
/// paused clock: no real time passes.
#[tokio::test(start_paused = true)]
async fn the_watchdog_fires_when_no_step_completes_for_its_quiet_period() {
    use std::time::Duration;
    let progress = common::Progress::new();
    let started = tokio::time::Instant::now();
    let run = tokio::spawn(async move {
        let steps = progress.clone();
        common::watchdog(&progress, Duration::from_secs(60), async move {
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_secs(50)).await;
                steps.bump();
            }
            std::future::pending::<()>().await // stuck
        })
        .await
    });
    let error = run.await.expect_err("the watchdog fired");
    let fired = started.elapsed();
    let message = *error.into_panic().downcast::<String>().unwrap();
    assert!(
        message.contains("no progress for 60s (3 steps completed before)"),
        "{message}"
    );
    assert!(
        fired >= Duration::from_secs(210) && fired <= Duration::from_millis(217_500),
        "fired {fired:?} after the start, the last step at 150 s"
    );
}

/// ... and never fires on work that is slow but keeps completing steps:
/// 100 steps 55 s apart, 92 minutes in all against a quiet period of 60 s
/// (the Redis fenced-writes run failed a 30 s wall-clock bound this way,
/// on a loaded machine).
#[tokio::test(start_paused = true)]
async fn the_watchdog_lets_slow_work_that_keeps_progressing_finish() {
    use std::time::Duration;
    let progress = common::Progress::new();
    let started = tokio::time::Instant::now();
    let steps = common::watchdog(&progress, Duration::from_secs(60), async {
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_secs(55)).await;
            progress.bump();
        }
        progress.count()
    })
    .await;
    assert_eq!(steps, 100);
    assert!(started.elapsed() >= Duration::from_secs(5_500));
}

/// What counts as a step: a harness's store call that succeeds, but not a
/// `wait` that timed out (a waiter nobody wakes is no progress).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_harness_counts_completed_store_calls_but_not_a_wait_that_timed_out() {
    let h = common::memory(HISTORY);
    let progress = h.progress();
    let always = coord_host::backend::Condition::Always;
    h.backend.put("p", "k", b"v", None, &always).await.unwrap();
    let revision = h.backend.list("p", "").await.unwrap().revision;
    assert_eq!(progress.count(), 2);
    let store = h.backend.clone();
    let waiting = tokio::spawn(async move { store.wait("p", revision, 1_000).await });
    common::bounded(h.until_waiting("p", 1)).await;
    h.advance(1_000);
    assert_eq!(waiting.await.unwrap().unwrap(), revision, "timed out");
    assert_eq!(progress.count(), 2, "a wait that timed out is no step");
    assert!(h.backend.wait("p", 0, 1_000).await.unwrap() > 0);
    assert_eq!(progress.count(), 3, "a wait that saw a change is one");
}
