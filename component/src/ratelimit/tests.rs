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
