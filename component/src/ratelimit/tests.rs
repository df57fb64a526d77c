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
        assert_eq!(
            store.calls.get(),
            2,
            "a reserve is two store calls: the count, the record"
        );
        assert_eq!((r.cost, r.reserved_at, r.expires_at), (3, 10_000, 10_500));
        assert!(
            reserve(&limits, 1, 500).is_none(),
            "full: limited, nothing reserved"
        );
        let calls = store.calls.get();
        assert_eq!(limits.settle(&fixed, &r, 1).unwrap(), Settled::Settled);
        assert_eq!(
            store.calls.get() - calls,
            3,
            "read the record, claim it, refund"
        );
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
    fn an_unsettled_reservation_expires_counting_in_full_and_says_so_again() {
        let store = FakeStore::new(10_000);
        let limits = RateLimits::new(&store);
        let fixed = limiter(Some(Algorithm::FixedWindow));
        let r = reserve(&limits, 2, 100).unwrap();
        store.advance(99);
        let early = reserve(&limits, 1, 100).unwrap();
        // One millisecond before `expires-at` it still settles...
        let before = limits.check(&fixed, "user:1", None).unwrap();
        assert!(!before.allowed, "3 of 3 reserved");
        assert_eq!(limits.cancel(&fixed, &early).unwrap(), Settled::Settled);
        // ...and at `expires-at` it is expired, for every later call too.
        store.advance(1);
        assert_eq!(store.clock(), r.expires_at);
        assert_eq!(limits.cancel(&fixed, &r).unwrap(), Settled::Expired);
        assert_eq!(limits.cancel(&fixed, &r).unwrap(), Settled::Expired);
        store.advance(99);
        assert_eq!(limits.settle(&fixed, &r, 1).unwrap(), Settled::Expired);
        assert_eq!(
            limits.peek(&fixed, "user:1").unwrap().remaining,
            1,
            "counted in full"
        );
        // Kept as long again past `expires-at`; then the store has no record.
        store.advance(1);
        assert_eq!(limits.cancel(&fixed, &r).unwrap(), Settled::Unknown);
    }

    #[test]
    fn a_reservation_handed_back_edited_or_made_up_refunds_nothing() {
        let store = FakeStore::new(10_000);
        let limits = RateLimits::new(&store);
        let fixed = Limiter {
            limit: 10,
            window_ms: 3_600_000,
            ..limiter(Some(Algorithm::FixedWindow))
        };
        let entropy = CountingEntropy::default();
        let remaining = |key: &str| limits.peek(&fixed, key).unwrap().remaining;
        let six = limits
            .reserve(&fixed, "user:1", 6, 1_000, &entropy)
            .unwrap()
            .reservation
            .unwrap();
        assert_eq!(remaining("user:1"), 4);

        // A made-up token on the same key: no record, nothing given back.
        let made_up = Reservation {
            token: "0123456789abcdef0123456789abcdef".into(),
            ..six.clone()
        };
        for _ in 0..5 {
            assert_eq!(limits.cancel(&fixed, &made_up).unwrap(), Settled::Unknown);
        }
        assert_eq!(remaining("user:1"), 4, "made-up tokens refund nothing");

        // The genuine token moved to another user's key: no record there.
        limits.check(&fixed, "user:2", Some(10)).unwrap();
        let moved = Reservation {
            key: "user:2".into(),
            ..six.clone()
        };
        assert_eq!(limits.cancel(&fixed, &moved).unwrap(), Settled::Unknown);
        assert_eq!(remaining("user:2"), 0, "another key is not refunded");

        // Its cost raised and its times moved: the record decides, so the
        // cancel gives back the 6 reserved, not 10, and settles once.
        let edited = Reservation {
            cost: 10,
            reserved_at: six.expires_at - 1,
            expires_at: six.expires_at + 86_400_000,
            ..six.clone()
        };
        assert_eq!(limits.cancel(&fixed, &edited).unwrap(), Settled::Settled);
        assert_eq!(remaining("user:1"), 10, "6 given back, and only 6");
        assert_eq!(
            limits.cancel(&fixed, &edited).unwrap(),
            Settled::AlreadySettled
        );

        // A reservation's `expires-at` moved later does not keep it open.
        let late = limits
            .reserve(&fixed, "user:1", 4, 1_000, &entropy)
            .unwrap()
            .reservation
            .unwrap();
        store.advance(1_000);
        let stretched = Reservation {
            expires_at: late.expires_at + 60_000,
            ..late
        };
        assert_eq!(limits.cancel(&fixed, &stretched).unwrap(), Settled::Expired);
        assert_eq!(remaining("user:1"), 6, "the 4 count in full");
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
        ] {
            assert_eq!(refused(limits.settle(&fixed, &r, 1)), field);
        }
        assert_eq!(refused(limits.settle(&fixed, &good, 4)), "actual");
        assert_eq!(refused(limits.settle(&fixed, &good, u32::MAX)), "actual");
    }
}
