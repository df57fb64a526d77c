//! Histories of concurrent calls, recorded on every backend and checked
//! against a sequential model (lock, expiring lock, rate limit, ephemeral
//! state) by `common::history`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::{Lcg, clock_mover};
use crate::common::{Harness, history};
use coord_host::Runtime;
use coord_host::lock::*;
use coord_host::ratelimit::{Algorithm, Limiter};

const HISTORY: usize = super::HISTORY;

per_backend!(
    lock_histories_are_linearizable,
    expiring_lock_histories_are_linearizable,
    rate_limit_histories_are_linearizable,
    ephemeral_histories_are_linearizable,
);

/// The lock as a sequential model: who holds it, and the highest fence given.
pub(super) struct LockModel;

#[derive(Debug, Clone)]
pub(super) enum LockIn {
    Acquire,
    Release(u64),
}

#[derive(Debug, Clone)]
pub(super) enum LockOut {
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
pub(super) struct LimitModel(pub(super) u32);

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
                        .lock()
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
                            let released = i.lock().release(&lock).await.unwrap().unwrap();
                            recorder.returned(
                                t,
                                LockIn::Release(lock.fence),
                                LockOut::Released(released),
                            );
                            // A second, stale release must be refused.
                            let t = recorder.invoke();
                            let again = i.lock().release(&lock).await.unwrap().unwrap();
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
                let d = i
                    .ratelimit()
                    .check(&limiter, "k", Some(cost))
                    .await
                    .unwrap()
                    .unwrap();
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
pub(super) struct ExpiringLockModel;

#[derive(Debug, Clone)]
pub(super) enum ExpIn {
    Acquire { ttl: u64 },
    Release(u64),
}

#[derive(Debug, Clone)]
pub(super) enum ExpOut {
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
                        .lock()
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
                            let released = i.lock().release(&lock).await.unwrap().unwrap();
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
pub(super) struct EphemeralModel;

#[derive(Debug, Clone)]
pub(super) enum EphIn {
    Upsert(String, Vec<u8>),
    Touch(String),
    Delete(String),
    Snapshot,
}

#[derive(Debug, Clone)]
pub(super) enum EphOut {
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
                                .ephemeral()
                                .upsert(&space, &tenant, &key, &value)
                                .await
                                .unwrap()
                                .unwrap();
                            (EphIn::Upsert(key, value), EphOut::Written(written.revision))
                        }
                        2 if n % 2 == 0 => {
                            let found = i
                                .ephemeral()
                                .touch(&space, &tenant, &key)
                                .await
                                .unwrap()
                                .unwrap();
                            (EphIn::Touch(key), EphOut::Found(found))
                        }
                        2 => {
                            let found = i
                                .ephemeral()
                                .delete(&space, &tenant, &key)
                                .await
                                .unwrap()
                                .unwrap();
                            (EphIn::Delete(key), EphOut::Found(found))
                        }
                        _ => {
                            let snapshot = i
                                .ephemeral()
                                .snapshot(&space, &tenant, None)
                                .await
                                .unwrap()
                                .unwrap();
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
