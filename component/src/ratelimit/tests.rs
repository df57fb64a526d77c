//! Unit tests of the rate limiter over the fake store.

use super::*;
use crate::fake::FakeStore;

fn limiter(algorithm: Option<Algorithm>) -> Limiter {
    Limiter {
        id: "inventory.exports".into(),
        limit: 3,
        window_ms: 1000,
        algorithm,
    }
}

fn field(r: Result<Decision, Error>) -> String {
    match r {
        Err(Error::InvalidArgument(InvalidArgument { field, .. })) => field,
        other => panic!("expected invalid-argument, got {other:?}"),
    }
}

#[test]
fn a_check_is_one_store_call_and_keys_are_separate() {
    let store = FakeStore::new(10_000);
    let limits = RateLimits::new(&store);
    let d = limits.check(&limiter(None), "user:1", None).unwrap();
    assert_eq!(store.calls.get(), 1);
    assert_eq!((d.allowed, d.limit, d.remaining), (true, 3, 2));
    limits.check(&limiter(None), "user:1", Some(2)).unwrap();
    let limited = limits.check(&limiter(None), "user:1", None).unwrap();
    assert!(!limited.allowed);
    assert!(limited.retry_after_ms > 0);
    assert!(
        limits
            .check(&limiter(None), "user:2", None)
            .unwrap()
            .allowed,
        "another key"
    );
    let other_id = Limiter {
        id: "other".into(),
        ..limiter(None)
    };
    assert!(
        limits.check(&other_id, "user:1", None).unwrap().allowed,
        "another limiter"
    );
}

#[test]
fn peek_counts_nothing_and_reset_forgets() {
    let store = FakeStore::new(10_000);
    let limits = RateLimits::new(&store);
    let l = limiter(Some(Algorithm::TokenBucket));
    for _ in 0..3 {
        assert_eq!(limits.peek(&l, "k").unwrap().remaining, 3);
    }
    limits.check(&l, "k", Some(3)).unwrap();
    assert!(!limits.peek(&l, "k").unwrap().allowed);
    limits.reset(&l, "k").unwrap();
    assert_eq!(limits.check(&l, "k", None).unwrap().remaining, 2);
}

#[test]
fn invalid_limiters_and_costs_are_named() {
    let store = FakeStore::new(10_000);
    let limits = RateLimits::new(&store);
    assert_eq!(
        field(limits.check(
            &Limiter {
                limit: 0,
                ..limiter(None)
            },
            "k",
            None
        )),
        "limiter.limit"
    );
    assert_eq!(
        field(limits.check(
            &Limiter {
                limit: u32::MAX,
                ..limiter(None)
            },
            "k",
            None
        )),
        "limiter.limit"
    );
    assert_eq!(
        field(limits.check(
            &Limiter {
                window_ms: 0,
                ..limiter(None)
            },
            "k",
            None
        )),
        "limiter.window-ms"
    );
    assert_eq!(
        field(limits.check(
            &Limiter {
                window_ms: u64::MAX,
                ..limiter(None)
            },
            "k",
            None
        )),
        "limiter.window-ms"
    );
    assert_eq!(
        field(limits.check(
            &Limiter {
                id: String::new(),
                ..limiter(None)
            },
            "k",
            None
        )),
        "limiter.id"
    );
    assert_eq!(field(limits.check(&limiter(None), "", None)), "key");
    assert_eq!(field(limits.check(&limiter(None), "k", Some(0))), "cost");
    assert_eq!(field(limits.check(&limiter(None), "k", Some(4))), "cost");
    assert_eq!(field(limits.peek(&limiter(None), "")), "key");
    assert_eq!(store.calls.get(), 0);
}

mod reservations {
    use super::*;
    use crate::bindings::exports::coord::sync::ratelimit::{Reservation, Settled};
    use crate::fake::CountingEntropy;

    fn reserve(limits: &RateLimits<&FakeStore>, cost: u32, ttl: u64) -> Option<Reservation> {
        let entropy = CountingEntropy::default();
        entropy.0.set(cost as u8 ^ (ttl as u8));
        limits
            .reserve(
                &limiter(Some(Algorithm::FixedWindow)),
                "user:1",
                cost,
                ttl,
                &entropy,
            )
            .unwrap()
            .reservation
    }

    #[test]
    fn a_settle_for_less_gives_back_the_difference_once_and_one_for_more_charges_it() {
        let store = FakeStore::new(10_000);
        let limits = RateLimits::new(&store);
        let fixed = limiter(Some(Algorithm::FixedWindow));
        let r = reserve(&limits, 3, 500).expect("3 of 3 fit");
        assert_eq!(store.calls.get(), 1, "a reserve is one store call");
        assert_eq!((r.cost, r.reserved_at, r.expires_at), (3, 10_000, 10_500));
        assert!(
            reserve(&limits, 1, 500).is_none(),
            "full: limited, nothing reserved"
        );
        assert_eq!(limits.settle(&fixed, &r, 1).unwrap(), Settled::Settled);
        assert_eq!(limits.peek(&fixed, "user:1").unwrap().remaining, 2);
        assert_eq!(
            limits.settle(&fixed, &r, 0).unwrap(),
            Settled::AlreadySettled
        );
        assert_eq!(limits.cancel(&fixed, &r).unwrap(), Settled::AlreadySettled);
        assert_eq!(
            limits.peek(&fixed, "user:1").unwrap().remaining,
            2,
            "not twice"
        );
        // Settled for more than reserved: counted past the limit.
        let more = reserve(&limits, 2, 500).expect("2 fit");
        assert_eq!(limits.settle(&fixed, &more, 3).unwrap(), Settled::Settled);
        let after = limits.check(&fixed, "user:1", None).unwrap();
        assert!(!after.allowed, "4 of 3 counted: limited");
        assert_eq!(after.remaining, 0);
    }

    #[test]
    fn an_unsettled_reservation_expires_counting_in_full() {
        let store = FakeStore::new(10_000);
        let limits = RateLimits::new(&store);
        let fixed = limiter(Some(Algorithm::FixedWindow));
        let r = reserve(&limits, 2, 100).unwrap();
        store.advance(100);
        assert_eq!(limits.cancel(&fixed, &r).unwrap(), Settled::Expired);
        assert_eq!(
            limits.peek(&fixed, "user:1").unwrap().remaining,
            1,
            "counted in full"
        );
    }

    #[test]
    fn reservation_arguments_are_refused_by_name() {
        let store = FakeStore::new(10_000);
        let limits = RateLimits::new(&store);
        let fixed = limiter(Some(Algorithm::FixedWindow));
        let entropy = CountingEntropy::default();
        fn refused<T: std::fmt::Debug>(r: Result<T, Error>) -> String {
            match r {
                Err(Error::InvalidArgument(InvalidArgument { field, .. })) => field,
                other => panic!("expected invalid-argument, got {other:?}"),
            }
        }
        assert_eq!(
            refused(limits.reserve(&fixed, "k", 0, 100, &entropy)),
            "cost"
        );
        assert_eq!(
            refused(limits.reserve(&fixed, "k", 4, 100, &entropy)),
            "cost"
        );
        assert_eq!(
            refused(limits.reserve(&fixed, "k", 1, 0, &entropy)),
            "ttl-ms"
        );
        assert_eq!(store.calls.get(), 0);
        let good = reserve(&limits, 1, 100).unwrap();
        for (field, r) in [
            (
                "reservation.token",
                Reservation {
                    token: "x".into(),
                    ..good.clone()
                },
            ),
            (
                "reservation.id",
                Reservation {
                    id: "other".into(),
                    ..good.clone()
                },
            ),
            (
                "reservation.key",
                Reservation {
                    key: String::new(),
                    ..good.clone()
                },
            ),
            (
                "reservation.cost",
                Reservation {
                    cost: 0,
                    ..good.clone()
                },
            ),
            (
                "reservation.cost",
                Reservation {
                    cost: 4,
                    ..good.clone()
                },
            ),
            (
                "reservation.expires-at",
                Reservation {
                    expires_at: 0,
                    ..good.clone()
                },
            ),
        ] {
            assert_eq!(refused(limits.settle(&fixed, &r, 1)), field);
        }
        assert_eq!(refused(limits.settle(&fixed, &good, 4)), "actual");
        assert_eq!(refused(limits.settle(&fixed, &good, u32::MAX)), "actual");
    }
}
