//! Histories of concurrent read-write lock calls with expiring grants,
//! recorded on every backend and checked against a sequential model by
//! `common::history`.

use super::*;
use crate::common::history;
use coord_testing::Lcg;

per_backend!(
    rwlock_histories_are_linearizable,
    rwlock_histories_with_every_release_refused_are_linearizable,
);

/// The read-write lock as a sequential model of its grants.
///
/// A grant takes effect when its acquire reads the other mode's entries
/// clear, after it wrote its own: at a store time no earlier than its write
/// (`expires-at - ttl`) and than the model's time, and before its expiry.
/// The model takes the earliest such time at which no grant it excludes is
/// live (a writer excludes every grant, a reader every writer), so a grant
/// whose read came after an excluding grant expired is accepted, and one
/// that overlaps a live excluding grant is not. A writer's fence is above
/// every earlier grant's, a reader's above every earlier writer's. A `busy`
/// or `unavailable` acquire changes nothing and is allowed at any point: a
/// writer's claim that turns readers away is not a grant.
struct RwModel;

#[derive(Debug, Clone)]
enum RwIn {
    Acquire { mode: Mode, ttl: u64 },
    Release(u64),
}

#[derive(Debug, Clone)]
enum RwOut {
    Acquired {
        fence: u64,
        expires_at: u64,
    },
    /// `busy`, or `unavailable` (nothing granted).
    NotGranted,
    Released(bool),
    /// The release answered `unavailable`: the store refused every delete,
    /// so the grant stays until its TTL runs out.
    ReleaseRefused,
}

/// The model's state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct RwState {
    /// The live grants: whether it writes, its fence, its expiry.
    held: Vec<(bool, u64, u64)>,
    /// The highest fence of any grant, and of a writer's.
    highest: u64,
    highest_write: u64,
    /// The store time reached.
    time: u64,
}

impl history::Model for RwModel {
    type State = RwState;
    type Input = RwIn;
    type Output = RwOut;

    fn init(&self) -> RwState {
        RwState {
            held: Vec::new(),
            highest: 0,
            highest_write: 0,
            time: 0,
        }
    }

    fn step(&self, state: &RwState, input: &RwIn, output: &RwOut) -> Option<RwState> {
        let RwState { held, time, .. } = state;
        match (input, output) {
            (RwIn::Acquire { mode, ttl }, RwOut::Acquired { fence, expires_at }) => {
                let writes = *mode == Mode::Write;
                let written = expires_at.checked_sub(*ttl)?;
                let excludes = |g: &&(bool, u64, u64)| writes || g.0;
                let at = held
                    .iter()
                    .filter(excludes)
                    .map(|g| g.2)
                    .fold((*time).max(written), u64::max);
                let above = if writes {
                    state.highest
                } else {
                    state.highest_write
                };
                if at >= *expires_at || *fence <= above {
                    return None;
                }
                let mut held: Vec<_> = held.iter().copied().filter(|g| g.2 > at).collect();
                held.push((writes, *fence, *expires_at));
                Some(RwState {
                    held,
                    highest: state.highest.max(*fence),
                    highest_write: if writes { *fence } else { state.highest_write },
                    time: at,
                })
            }
            (RwIn::Acquire { .. }, RwOut::NotGranted) => Some(state.clone()),
            (RwIn::Release(fence), RwOut::Released(true)) => {
                let &(_, _, until) = held.iter().find(|g| g.1 == *fence)?;
                (*time < until).then(|| RwState {
                    held: held.iter().copied().filter(|g| g.1 != *fence).collect(),
                    ..state.clone()
                })
            }
            (RwIn::Release(_), RwOut::ReleaseRefused) => Some(state.clone()),
            (RwIn::Release(fence), RwOut::Released(false)) => {
                match held.iter().find(|g| g.1 == *fence) {
                    // Its own grant refused: it must have expired by then.
                    Some(&(_, _, until)) => Some(RwState {
                        held: held.iter().copied().filter(|g| g.1 != *fence).collect(),
                        time: (*time).max(until),
                        ..state.clone()
                    }),
                    None => Some(state.clone()),
                }
            }
            _ => None,
        }
    }
}

async fn rwlock_histories_are_linearizable(h: Harness) {
    record_and_check(h, false).await;
}

/// The store refuses every delete (a partial outage): each release is
/// `unavailable`, nothing is freed but by expiry, and still no grant
/// overlaps one it excludes.
async fn rwlock_histories_with_every_release_refused_are_linearizable(h: Harness) {
    record_and_check(h, true).await;
}

/// Record 4 rounds of 5 clients, each acquiring in either mode without
/// waiting, holding past its TTL every other time, and releasing; check
/// each round against the model.
async fn record_and_check(h: Harness, deletes_down: bool) {
    const CLIENTS: u64 = 5;
    let faulty = Arc::new(coord_testing::faulty::FaultyBackend::new(
        h.backend.clone(),
        5,
    ));
    faulty.set_deletes_down(deletes_down);
    let runtime = Arc::new(Runtime::new(faulty).unwrap());
    let refused = Arc::new(AtomicUsize::new(0));
    let lapsed = Arc::new(AtomicUsize::new(0));
    let (busy_readers, busy_writers) =
        (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    for round in 0..4u64 {
        let resource = format!("hist-{round}");
        let recorder = Arc::new(history::Recorder::<RwIn, RwOut>::default());
        let mut tasks = Vec::new();
        for c in 0..CLIENTS {
            let (runtime, recorder, lapsed, refused) = (
                runtime.clone(),
                recorder.clone(),
                lapsed.clone(),
                refused.clone(),
            );
            let (busy_readers, busy_writers) = (busy_readers.clone(), busy_writers.clone());
            let clock = h.clone_clock();
            let resource = resource.clone();
            tasks.push(tokio::spawn(async move {
                let mut i = runtime.instantiate().await.unwrap();
                let mut rng = Lcg(c * 17 + round + 3);
                for attempt in 0..6 {
                    let ttl = 5 + rng.below(30);
                    // Two in five write.
                    let mode = if rng.below(5) < 2 {
                        Mode::Write
                    } else {
                        Mode::Read
                    };
                    let options = AcquireOptions::new().ttl_ms(ttl).no_wait();
                    let t = recorder.invoke();
                    let input = RwIn::Acquire { mode, ttl };
                    let outcome = i.rwlock().acquire(ID, &resource, mode, options).await;
                    match outcome.expect("no trap") {
                        Ok(AcquireOutcome::Acquired(grant)) => {
                            let out = RwOut::Acquired {
                                fence: grant.fence,
                                expires_at: grant.expires_at,
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
                            let out = match i.rwlock().release(&grant).await.unwrap() {
                                Ok(released) => {
                                    if !released {
                                        lapsed.fetch_add(1, Ordering::SeqCst);
                                    }
                                    RwOut::Released(released)
                                }
                                Err(Error::Unavailable(_)) => {
                                    refused.fetch_add(1, Ordering::SeqCst);
                                    RwOut::ReleaseRefused
                                }
                                Err(other) => panic!("a release failed otherwise: {other:?}"),
                            };
                            recorder.returned(t, RwIn::Release(grant.fence), out);
                        }
                        Ok(AcquireOutcome::Busy(_)) => {
                            match mode {
                                Mode::Read => busy_readers.fetch_add(1, Ordering::SeqCst),
                                Mode::Write => busy_writers.fetch_add(1, Ordering::SeqCst),
                            };
                            recorder.returned(t, input, RwOut::NotGranted);
                            clock.advance(1 + rng.below(10));
                        }
                        // A delete refused while stepping aside or taking
                        // back; or a TTL shorter than the clock's jumps.
                        Err(Error::Unavailable(_)) => {
                            match mode {
                                Mode::Read => busy_readers.fetch_add(1, Ordering::SeqCst),
                                Mode::Write => busy_writers.fetch_add(1, Ordering::SeqCst),
                            };
                            recorder.returned(t, input, RwOut::NotGranted);
                            // What a refused delete left (a reader's entry,
                            // a writer's claim) lapses with its TTL.
                            clock.advance(1 + rng.below(10));
                        }
                        Err(other) => panic!("an acquire failed otherwise: {other:?}"),
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let history = Arc::try_unwrap(recorder).ok().unwrap().history();
        assert!(
            history::linearizable(&RwModel, &history),
            "not linearizable: {history:#?}"
        );
    }
    if deletes_down {
        assert!(
            refused.load(Ordering::SeqCst) > 0,
            "no release was refused: {busy_readers:?} readers and {busy_writers:?} writers not granted"
        );
    } else {
        assert!(
            lapsed.load(Ordering::SeqCst) > 0,
            "no grant lapsed: expiry went untested"
        );
    }
    assert!(
        busy_readers.load(Ordering::SeqCst) > 0 && busy_writers.load(Ordering::SeqCst) > 0,
        "exclusion went untested in a mode: {busy_readers:?} readers and {busy_writers:?} writers not granted"
    );
}

/// The checker itself: it refuses a writer beside a reader, a reader
/// beside a writer, two writers, and a writer's fence that goes back; and
/// accepts two readers at once, and a writer after a reader's expiry.
#[test]
fn the_rwlock_model_refuses_what_it_must() {
    use history::Op;
    let acquire = |mode, ttl| RwIn::Acquire { mode, ttl };
    let granted = |fence, expires_at| RwOut::Acquired { fence, expires_at };
    let op = |n: u64, input, output| Op {
        invoked: n * 2,
        returned: n * 2 + 1,
        input,
        output,
    };
    let two_readers = [
        op(0, acquire(Mode::Read, 100), granted(1, 100)),
        op(1, acquire(Mode::Read, 100), granted(2, 100)),
    ];
    assert!(history::linearizable(&RwModel, &two_readers));
    for (first, second) in [
        (Mode::Read, Mode::Write),
        (Mode::Write, Mode::Read),
        (Mode::Write, Mode::Write),
    ] {
        let overlap = [
            op(0, acquire(first, 100), granted(1, 100)),
            op(1, acquire(second, 100), granted(2, 100)),
        ];
        assert!(
            !history::linearizable(&RwModel, &overlap),
            "{first:?} then {second:?}"
        );
    }
    let backwards = [
        op(0, acquire(Mode::Read, 10), granted(5, 10)),
        op(1, acquire(Mode::Write, 100), granted(4, 100)),
    ];
    assert!(!history::linearizable(&RwModel, &backwards));
    // A writer whose read came after the reader expired.
    let after_expiry = [
        op(0, acquire(Mode::Read, 50), granted(1, 50)),
        op(1, acquire(Mode::Write, 20), granted(2, 60)),
    ];
    assert!(history::linearizable(&RwModel, &after_expiry));
    // ... but not one that expired before the reader did.
    let lapsed_first = [
        op(0, acquire(Mode::Read, 50), granted(1, 50)),
        op(1, acquire(Mode::Write, 20), granted(2, 45)),
    ];
    assert!(!history::linearizable(&RwModel, &lapsed_first));
    // Readers' fences need not rise among themselves; a reader's must
    // rise above a writer's before it.
    let readers_any_order = [
        op(0, acquire(Mode::Read, 100), granted(5, 100)),
        op(1, acquire(Mode::Read, 100), granted(4, 100)),
    ];
    assert!(history::linearizable(&RwModel, &readers_any_order));
    let below_writer = [
        op(0, acquire(Mode::Write, 10), granted(5, 10)),
        op(1, acquire(Mode::Read, 100), granted(4, 100)),
    ];
    assert!(!history::linearizable(&RwModel, &below_writer));
    let refused = [
        op(0, acquire(Mode::Write, 100), granted(1, 100)),
        op(1, RwIn::Release(1), RwOut::ReleaseRefused),
        op(2, acquire(Mode::Read, 100), granted(2, 100)),
    ];
    assert!(!history::linearizable(&RwModel, &refused));
}
