//! Histories of concurrent semaphore calls with expiring permits, recorded
//! on every backend and checked against a sequential model by
//! `common::history`.

use super::*;
use crate::common::history;
use coord_host::backend::{Condition, Outcome};
use futures_util::StreamExt;
use std::sync::atomic::AtomicU64;

per_backend!(
    semaphore_histories_are_linearizable,
    semaphore_histories_with_every_release_refused_are_linearizable,
    semaphore_histories_beside_many_held_permits_are_linearizable,
);

/// The semaphore as a sequential model. Every grant reports the store's
/// time (`expires-at - ttl`) and every busy answer names the permit that
/// expires first with its remaining time, so the model knows when each
/// happened: time never runs backwards, a grant needs fewer than its limit
/// of live permits and a fence above every earlier one, and `busy` needs
/// a full semaphore whose first expiry is the permit it names. Beside the
/// history's own permits it counts `beside` permits held all along, with
/// fences up to `fence_floor`, that outlast the history (so none of them is
/// ever the first to expire, and a busy answer naming one is wrong).
#[derive(Default)]
struct SemaphoreModel {
    beside: usize,
    fence_floor: u64,
}

#[derive(Debug, Clone)]
enum SemIn {
    Acquire { ttl: u64, limit: usize },
    Release(u64),
}

#[derive(Debug, Clone)]
enum SemOut {
    Acquired {
        fence: u64,
        expires_at: u64,
    },
    Busy {
        fence: u64,
        remaining: u64,
    },
    Released(bool),
    /// The release answered `unavailable`: the store refused every delete,
    /// so the permit stays until its TTL runs out.
    ReleaseRefused,
}

/// (the history's live permits' fences and expiries, in fence order; the
/// highest fence given; the store time reached).
type SemState = (Vec<(u64, u64)>, u64, u64);

impl history::Model for SemaphoreModel {
    type State = SemState;
    type Input = SemIn;
    type Output = SemOut;

    fn init(&self) -> SemState {
        (Vec::new(), self.fence_floor, 0)
    }

    fn step(
        &self,
        (held, highest, time): &SemState,
        input: &SemIn,
        output: &SemOut,
    ) -> Option<SemState> {
        let live_at = |at: u64| -> Vec<(u64, u64)> {
            held.iter()
                .copied()
                .filter(|&(_, until)| until > at)
                .collect()
        };
        match (input, output) {
            (SemIn::Acquire { ttl, limit }, SemOut::Acquired { fence, expires_at }) => {
                let at = expires_at.checked_sub(*ttl)?;
                let mut live = live_at(at);
                if at < *time || self.beside + live.len() >= *limit || *fence <= *highest {
                    return None;
                }
                live.push((*fence, *expires_at));
                Some((live, *fence, at))
            }
            (SemIn::Acquire { limit, .. }, SemOut::Busy { fence, remaining }) => {
                let &(_, until) = held.iter().find(|(f, _)| f == fence)?;
                let at = until.checked_sub(*remaining)?;
                let live = live_at(at);
                let first = live.iter().map(|&(_, until)| until).min()?;
                let full = self.beside + live.len() >= *limit;
                (at >= *time && *remaining > 0 && full && until == first)
                    .then_some((live, *highest, at))
            }
            (SemIn::Release(fence), SemOut::Released(true)) => {
                // Released while still held: possible only before its expiry.
                let &(_, until) = held.iter().find(|(f, _)| f == fence)?;
                (*time < until).then(|| {
                    let rest = held.iter().copied().filter(|(f, _)| f != fence).collect();
                    (rest, *highest, *time)
                })
            }
            // Nothing was deleted: the permit holds its place until it expires.
            (SemIn::Release(_), SemOut::ReleaseRefused) => Some((held.clone(), *highest, *time)),
            (SemIn::Release(fence), SemOut::Released(false)) => {
                match held.iter().find(|(f, _)| f == fence) {
                    // Its own permit refused: it must have expired by then.
                    Some(&(_, until)) => {
                        let rest = held.iter().copied().filter(|(f, _)| f != fence).collect();
                        Some((rest, *highest, (*time).max(until)))
                    }
                    None => Some((held.clone(), *highest, *time)),
                }
            }
            _ => None,
        }
    }
}

async fn semaphore_histories_are_linearizable(h: Harness) {
    record_and_check(h, false, 0).await;
}

/// The same at a limit of 10 000 (the NATS store's bound, 1 000, on NATS),
/// all but 2 places held all along: a store that keeps many permits apart
/// (Redis's hash, the SQL stores' rows) must count and order them as if
/// they were one value, and a waiter's wake-up must not depend on them.
async fn semaphore_histories_beside_many_held_permits_are_linearizable(h: Harness) {
    let limit = if h.backend.kind() == "nats" {
        coord_nats::MAX_PERMITS
    } else {
        10_000
    };
    record_and_check(h, false, limit as usize - 2).await;
}

/// The store refuses every delete (a partial outage): each release is
/// `unavailable`, nothing is freed but by expiry, and still nobody gets a
/// place the model does not have free.
async fn semaphore_histories_with_every_release_refused_are_linearizable(h: Harness) {
    record_and_check(h, true, 0).await;
}

/// Record 4 rounds of 5 clients on a semaphore already holding `beside`
/// permits that outlast them, under a limit of 2 more, and check each
/// against the model. The rounds share the semaphore: each starts once
/// every permit of the round before has expired.
async fn record_and_check(h: Harness, deletes_down: bool, beside: usize) {
    const CLIENTS: u64 = 5;
    let limit = beside + 2;
    let resource = "hist";
    let fence_floor = fill(&h, resource, beside, limit).await;
    let faulty = Arc::new(coord_testing::faulty::FaultyBackend::new(
        h.backend.clone(),
        5,
    ));
    faulty.set_deletes_down(deletes_down);
    let runtime = Arc::new(Runtime::new(faulty).unwrap());
    let refused = Arc::new(AtomicUsize::new(0));
    let lapsed = Arc::new(AtomicUsize::new(0));
    // Busy answers: the full semaphore went untested without them.
    let busy = Arc::new(AtomicUsize::new(0));
    for round in 0..4u64 {
        // Past the longest TTL of the round before (34 ms).
        h.advance(100);
        let recorder = Arc::new(history::Recorder::<SemIn, SemOut>::default());
        let mut tasks = Vec::new();
        for c in 0..CLIENTS {
            let (runtime, recorder, lapsed, busy, refused) = (
                runtime.clone(),
                recorder.clone(),
                lapsed.clone(),
                busy.clone(),
                refused.clone(),
            );
            let clock = h.clone_clock();
            tasks.push(tokio::spawn(async move {
                let mut i = runtime.instantiate().await.unwrap();
                let mut rng = faults_rng(c * 17 + round + 3);
                for attempt in 0..6 {
                    let ttl = 5 + rng.below(30);
                    let options = AcquireOptions::new().ttl_ms(ttl).no_wait();
                    let t = recorder.invoke();
                    let input = SemIn::Acquire { ttl, limit };
                    match acquire(&mut i, resource, limit as u32, options).await {
                        AcquireOutcome::Acquired(permit) => {
                            let out = SemOut::Acquired {
                                fence: permit.fence,
                                expires_at: permit.expires_at,
                            };
                            recorder.returned(t, input, out);
                            for _ in 0..rng.below(20) {
                                tokio::task::yield_now().await;
                            }
                            // Every other holder outstays its TTL, so each
                            // round has a lapse whatever else happens.
                            if attempt % 2 == 0 {
                                clock.advance(ttl + 1);
                            }
                            let t = recorder.invoke();
                            let out = match i.semaphore().release(&permit).await.unwrap() {
                                Ok(released) => {
                                    if !released {
                                        lapsed.fetch_add(1, Ordering::SeqCst);
                                    }
                                    SemOut::Released(released)
                                }
                                Err(Error::Unavailable(_)) => {
                                    refused.fetch_add(1, Ordering::SeqCst);
                                    SemOut::ReleaseRefused
                                }
                                Err(other) => panic!("a release failed otherwise: {other:?}"),
                            };
                            recorder.returned(t, SemIn::Release(permit.fence), out);
                        }
                        AcquireOutcome::Busy(holder) => {
                            busy.fetch_add(1, Ordering::SeqCst);
                            let out = SemOut::Busy {
                                fence: holder.fence,
                                remaining: holder.remaining_ms,
                            };
                            recorder.returned(t, input, out);
                        }
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let history = Arc::try_unwrap(recorder).ok().unwrap().history();
        let model = SemaphoreModel {
            beside,
            fence_floor,
        };
        assert!(
            history::linearizable(&model, &history),
            "not linearizable: {history:#?}"
        );
    }
    if deletes_down {
        assert!(refused.load(Ordering::SeqCst) > 0, "no release was refused");
    } else {
        assert!(
            lapsed.load(Ordering::SeqCst) > 0,
            "no permit lapsed: expiry went untested"
        );
    }
    assert!(
        busy.load(Ordering::SeqCst) > 0,
        "never full: the limit went untested"
    );
}

/// The checker itself: it refuses a third permit under a limit of 2, a
/// fence that goes back, and a busy answer naming a permit that is not the
/// first to expire; and accepts a grant after an expiry.
#[test]
fn the_semaphore_model_refuses_what_it_must() {
    use history::{Model, Op};
    let m = SemaphoreModel::default();
    let acquire = |ttl| SemIn::Acquire { ttl, limit: 2 };
    let granted = |fence, expires_at| SemOut::Acquired { fence, expires_at };
    let op = |n: u64, input, output| Op {
        invoked: n * 2,
        returned: n * 2 + 1,
        input,
        output,
    };
    let three = [
        op(0, acquire(100), granted(1, 100)),
        op(1, acquire(100), granted(2, 100)),
        op(2, acquire(100), granted(3, 100)),
    ];
    assert!(!history::linearizable(&m, &three));
    let backwards = [
        op(0, acquire(100), granted(5, 100)),
        op(1, acquire(100), granted(4, 100)),
    ];
    assert!(!history::linearizable(&m, &backwards));
    let wrong_first = [
        op(0, acquire(100), granted(1, 100)),
        op(1, acquire(50), granted(2, 50)),
        op(
            2,
            acquire(10),
            SemOut::Busy {
                fence: 1,
                remaining: 100,
            },
        ),
    ];
    assert!(!history::linearizable(&m, &wrong_first));
    let after_expiry = [
        op(0, acquire(100), granted(1, 100)),
        op(1, acquire(50), granted(2, 50)),
        op(
            2,
            acquire(10),
            SemOut::Busy {
                fence: 2,
                remaining: 50,
            },
        ),
        op(3, acquire(10), granted(3, 60)),
    ];
    assert!(history::linearizable(&m, &after_expiry));
    // A release the store refused frees nothing: no third permit before
    // an expiry.
    let refused = [
        op(0, acquire(100), granted(1, 100)),
        op(1, acquire(100), granted(2, 100)),
        op(2, SemIn::Release(1), SemOut::ReleaseRefused),
        op(3, acquire(100), granted(3, 100)),
    ];
    assert!(!history::linearizable(&m, &refused));
    assert!(
        m.step(&m.init(), &acquire(1), &SemOut::Released(true))
            .is_none()
    );
}

/// Hold `beside` permits of `resource` for a day, each as `acquire` writes
/// one (an owner token, the limit in decimal) and with the store call it
/// makes, eight at a time, past the faults; returns the highest fence.
async fn fill(h: &Harness, resource: &str, beside: usize, limit: usize) -> u64 {
    let partition = semaphore_partition(ID, resource);
    let place = Condition::AbsentAndFewerThan(limit as u32);
    let value = limit.to_string().into_bytes();
    let highest = AtomicU64::new(0);
    futures_util::stream::iter(0..beside)
        .for_each_concurrent(8, |n| {
            let (partition, place, value, highest) = (&partition, &place, &value, &highest);
            async move {
                let owner = format!("{n:032x}");
                let reply = h
                    .backend
                    .put(partition, &owner, value, Some(86_400_000), place)
                    .await
                    .unwrap();
                let Outcome::Applied(permit) = reply.outcome else {
                    panic!("a place is free for each permit held beside");
                };
                highest.fetch_max(permit.revision, Ordering::SeqCst);
            }
        })
        .await;
    highest.into_inner()
}

fn faults_rng(seed: u64) -> coord_testing::Lcg {
    coord_testing::Lcg(seed)
}
