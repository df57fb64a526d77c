//! Unit tests of the semaphore logic over the fake store, with the clock
//! moved by hand.

use super::*;
use crate::bindings::exports::coord::sync::semaphore::Retry;
use crate::fake::{CountingEntropy, FakeStore};

const T0: u64 = 1_000_000;

fn semaphores(store: &FakeStore) -> Semaphores<&FakeStore, CountingEntropy> {
    Semaphores::new(store, CountingEntropy::default())
}

fn once(ttl_ms: u64) -> AcquireOptions {
    AcquireOptions {
        ttl_ms: Some(ttl_ms),
        wait: Some(WaitPolicy::NoWait),
    }
}

fn acquired(outcome: AcquireOutcome) -> Permit {
    match outcome {
        AcquireOutcome::Acquired(permit) => permit,
        AcquireOutcome::Busy(holder) => panic!("expected acquired, got busy {holder:?}"),
    }
}

fn busy(outcome: AcquireOutcome) -> Holder {
    match outcome {
        AcquireOutcome::Busy(holder) => holder,
        AcquireOutcome::Acquired(permit) => panic!("expected busy, got acquired {permit:?}"),
    }
}

fn invalid_field(result: Result<impl std::fmt::Debug, Error>) -> String {
    match result {
        Err(Error::InvalidArgument(InvalidArgument { field, .. })) => field,
        other => panic!("expected invalid-argument, got {other:?}"),
    }
}

#[test]
fn at_most_limit_permits_each_with_a_rising_fence_and_busy_names_the_first_to_expire() {
    let store = FakeStore::new(T0);
    let s = semaphores(&store);
    let a = acquired(s.acquire("api", "t", 2, once(3_000)).unwrap());
    let b = acquired(s.acquire("api", "t", 2, once(1_000)).unwrap());
    assert!(b.fence > a.fence);
    assert_ne!(a.owner, b.owner);
    assert_eq!((b.limit, b.expires_at), (2, T0 + 1_000));
    let calls = store.calls.get();
    let full = busy(s.acquire("api", "t", 2, once(1_000)).unwrap());
    assert_eq!(
        store.calls.get() - calls,
        1,
        "a no-wait busy is one request"
    );
    assert_eq!(
        full,
        Holder {
            fence: b.fence,
            remaining_ms: 1_000,
            limit: 2
        }
    );
    // Another semaphore, another resource: its own places.
    acquired(s.acquire("api", "u", 1, once(1_000)).unwrap());
    // A release frees exactly one place, once.
    let calls = store.calls.get();
    assert!(s.release(&a).unwrap());
    assert!(!s.release(&a).unwrap());
    assert_eq!(store.calls.get() - calls, 2, "a release is one request");
    let c = acquired(s.acquire("api", "t", 2, once(1_000)).unwrap());
    assert!(c.fence > b.fence);
    busy(s.acquire("api", "t", 2, once(1_000)).unwrap());
    let usage = s.inspect("api", "t").unwrap();
    let fences: Vec<u64> = usage.permits.iter().map(|h| h.fence).collect();
    assert_eq!(fences, [b.fence, c.fence]);
    assert_eq!(usage.now, T0);
}

#[test]
fn a_waiter_takes_the_place_an_expiry_frees_and_a_caller_limit_is_its_own() {
    let store = FakeStore::new(T0);
    let s = semaphores(&store);
    let a = acquired(s.acquire("api", "t", 1, once(500)).unwrap());
    let waited = acquired(
        s.acquire(
            "api",
            "t",
            1,
            AcquireOptions {
                ttl_ms: Some(1_000),
                wait: Some(WaitPolicy::Timeout(10_000)),
            },
        )
        .unwrap(),
    );
    assert_eq!(store.clock(), T0 + 500, "woken at the holder's expiry");
    assert!(waited.fence > a.fence);
    assert!(!s.is_held(&a).unwrap());
    assert!(s.is_held(&waited).unwrap());
    // A caller passing a larger limit is granted beside it; one passing
    // the old limit is not.
    acquired(s.acquire("api", "t", 2, once(1_000)).unwrap());
    busy(s.acquire("api", "t", 2, once(1_000)).unwrap());
    busy(s.acquire("api", "t", 1, once(1_000)).unwrap());
}

#[test]
fn a_release_during_a_wait_admits_the_waiter_and_nobody_else() {
    let store = FakeStore::new(T0);
    let s = semaphores(&store);
    let a = acquired(s.acquire("api", "t", 2, once(60_000)).unwrap());
    acquired(s.acquire("api", "t", 2, once(60_000)).unwrap());
    let releaser = a.clone();
    store.during_wait(move |store| {
        semaphores(store).release(&releaser).unwrap();
    });
    let waiter = acquired(
        s.acquire(
            "api",
            "t",
            2,
            AcquireOptions {
                ttl_ms: Some(1_000),
                wait: Some(WaitPolicy::Attempts(Retry {
                    max_attempts: 3,
                    delay_ms: 5_000,
                })),
            },
        )
        .unwrap(),
    );
    assert_eq!(store.clock(), T0, "woken by the release, not a timeout");
    assert_eq!(s.inspect("api", "t").unwrap().permits.len(), 2);
    assert!(s.is_held(&waiter).unwrap());
}

#[test]
fn extend_keeps_the_fence_and_a_lost_permit_stays_lost() {
    let store = FakeStore::new(T0);
    let s = semaphores(&store);
    let a = acquired(s.acquire("api", "t", 3, once(1_000)).unwrap());
    store.advance(900);
    let ExtendOutcome::Extended(b) = s.extend(&a, Some(5_000)).unwrap() else {
        panic!("a live permit extends");
    };
    assert_eq!(
        (b.fence, b.expires_at, b.ttl_ms),
        (a.fence, T0 + 5_900, 5_000)
    );
    store.advance(5_000);
    assert!(matches!(s.extend(&b, None).unwrap(), ExtendOutcome::Lost));
    assert!(!s.release(&b).unwrap());
    // A forged permit with a live permit's fence but another owner frees nothing.
    let c = acquired(s.acquire("api", "t", 3, once(1_000)).unwrap());
    let forged = Permit {
        owner: "f".repeat(32),
        ..c.clone()
    };
    assert!(!s.release(&forged).unwrap());
    assert!(!s.is_held(&forged).unwrap());
    // The same owner under another limit is another permit too.
    let relimited = Permit {
        limit: 4,
        ..c.clone()
    };
    assert!(!s.is_held(&relimited).unwrap());
    assert!(s.is_held(&c).unwrap());
}

#[test]
fn force_release_frees_one_permit_by_fence() {
    let store = FakeStore::new(T0);
    let s = semaphores(&store);
    let a = acquired(s.acquire("api", "t", 2, once(60_000)).unwrap());
    let b = acquired(s.acquire("api", "t", 2, once(60_000)).unwrap());
    assert!(s.force_release("api", "t", a.fence).unwrap());
    assert!(!s.force_release("api", "t", a.fence).unwrap());
    assert!(!s.release(&a).unwrap());
    assert!(s.is_held(&b).unwrap());
    acquired(s.acquire("api", "t", 2, once(1_000)).unwrap());
}

#[test]
fn hostile_arguments_are_refused_by_name_before_the_store_is_asked() {
    let store = FakeStore::new(T0);
    let s = semaphores(&store);
    assert_eq!(
        invalid_field(s.acquire("api", "t", 0, once(1_000))),
        "limit"
    );
    assert_eq!(
        invalid_field(s.acquire("api", "t", MAX_LIMIT + 1, once(1_000))),
        "limit"
    );
    assert_eq!(
        invalid_field(s.acquire("api", "t", u32::MAX, once(1_000))),
        "limit"
    );
    assert_eq!(invalid_field(s.acquire("", "t", 1, once(1_000))), "id");
    assert_eq!(
        invalid_field(s.acquire("api", &"r".repeat(1025), 1, once(1_000))),
        "resource"
    );
    assert_eq!(
        invalid_field(s.acquire("api", "t", 1, once(0))),
        "options.ttl-ms"
    );
    assert_eq!(
        invalid_field(s.acquire(
            "api",
            "t",
            1,
            AcquireOptions {
                ttl_ms: None,
                wait: Some(WaitPolicy::Timeout(600_001)),
            }
        )),
        "options.wait.timeout"
    );
    assert_eq!(invalid_field(s.force_release("api", "t", 0)), "fence");
    assert_eq!(store.calls.get(), 0, "the store was never asked");
    let good = acquired(s.acquire("api", "t", 1, once(1_000)).unwrap());
    for (field, permit) in [
        (
            "permit.owner",
            Permit {
                owner: "x".into(),
                ..good.clone()
            },
        ),
        (
            "permit.fence",
            Permit {
                fence: 0,
                ..good.clone()
            },
        ),
        (
            "permit.limit",
            Permit {
                limit: 0,
                ..good.clone()
            },
        ),
        (
            "permit.limit",
            Permit {
                limit: MAX_LIMIT + 1,
                ..good.clone()
            },
        ),
        (
            "permit.ttl-ms",
            Permit {
                ttl_ms: 0,
                ..good.clone()
            },
        ),
        (
            "permit.id",
            Permit {
                id: String::new(),
                ..good.clone()
            },
        ),
    ] {
        assert_eq!(invalid_field(s.release(&permit)), field);
        assert_eq!(invalid_field(s.extend(&permit, None)), field);
        assert_eq!(invalid_field(s.is_held(&permit)), field);
    }
    assert_eq!(invalid_field(s.extend(&good, Some(0))), "ttl-ms");
}

#[test]
fn an_entry_acquire_could_not_have_written_is_internal_never_a_holder() {
    let store = FakeStore::new(T0);
    let s = semaphores(&store);
    let partition = keys::semaphore_partition("api", "t");
    (&store)
        .put(
            &partition,
            "intruder",
            b"1",
            Some(1_000),
            &Condition::Always,
        )
        .unwrap();
    assert!(matches!(
        s.acquire("api", "t", 1, once(1_000)),
        Err(Error::Internal(_))
    ));
    assert!(matches!(s.inspect("api", "t"), Err(Error::Internal(_))));
    for value in [&b"0"[..], b"01", b"-1", b"", b"99999999999"] {
        assert_eq!(parse_limit(value), None, "{value:?}");
    }
    assert_eq!(parse_limit(b"1000"), Some(1000));
}

#[test]
fn an_acquire_whose_write_applied_then_failed_takes_back_its_permit() {
    // Any store error may follow a put that applied (a timeout, a reply
    // that could not be decoded): the permit this call wrote under its own
    // token must not hold a place for its TTL after the call failed.
    for error in [
        StoreError::Unavailable("timed out".into()),
        StoreError::Invalid("the reply could not be decoded".into()),
    ] {
        let store = FakeStore::new(T0);
        let failing = crate::fake::Failing {
            inner: &store,
            fails: Box::new(move |call, _| (call == "put").then(|| error.clone())),
            applied: true,
        };
        let s = Semaphores::new(&failing, CountingEntropy::default());
        assert!(s.acquire("api", "t", 2, once(60_000)).is_err());
        assert_eq!(
            semaphores(&store).inspect("api", "t").unwrap().permits,
            vec![],
            "the failed acquire left its permit behind"
        );
    }
}

#[test]
fn a_waiter_waits_on_its_full_attempts_revision_lists_nothing_and_answers_at_its_timeout() {
    // The full attempt's reply carries the partition's revision and the
    // permit that expires first: all the wait needs, so nothing lists the
    // permits held (a cost that would grow with them), and a 1 000 ms
    // timeout answers 1 000 ms after the first attempt.
    let store: &'static FakeStore = Box::leak(Box::new(FakeStore::new(T0)));
    acquired(
        semaphores(store)
            .acquire("api", "t", 1, once(60_000))
            .unwrap(),
    );
    let no_listing = crate::fake::Failing {
        inner: store,
        fails: Box::new(|call, _| {
            assert_ne!(call, "list", "a waiter listed the permits");
            None
        }),
        applied: false,
    };
    // Tokens of its own, not the holder's.
    let s = Semaphores::new(&no_listing, CountingEntropy(std::cell::Cell::new(7)));
    let timeout = AcquireOptions {
        ttl_ms: Some(1_000),
        wait: Some(WaitPolicy::Timeout(1_000)),
    };
    busy(s.acquire("api", "t", 1, timeout).unwrap());
    assert_eq!(store.clock(), T0 + 1_000, "answered at its timeout");
}
