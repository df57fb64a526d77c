//! The rate limiter, end to end: the real `coord.wasm` over every backend,
//! the store's clock moved by hand.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use common::{Harness, T0};
use coord_host::ratelimit::*;
use coord_host::{Instance, Runtime};

const HISTORY: usize = 64;

per_backend!(
    a_check_is_one_store_call_for_every_algorithm,
    a_limited_request_consumes_nothing,
    peek_counts_nothing_and_reset_restores_the_limit,
    the_window_slides_on_the_stores_clock,
    concurrent_instances_share_one_limit_exactly,
    invalid_limiters_and_costs_get_named_errors,
);

fn limiter(limit: u32, algorithm: Option<Algorithm>) -> Limiter {
    Limiter {
        id: "inventory.exports".into(),
        limit,
        window_ms: 60_000,
        algorithm,
    }
}

async fn check(i: &mut Instance, l: &Limiter, key: &str, cost: Option<u32>) -> Decision {
    i.ratelimit().check(l, key, cost).await.unwrap().unwrap()
}

const ALGORITHMS: [Option<Algorithm>; 4] = [
    None,
    Some(Algorithm::SlidingWindow),
    Some(Algorithm::FixedWindow),
    Some(Algorithm::TokenBucket),
];

async fn a_check_is_one_store_call_for_every_algorithm(h: Harness) {
    let (_rt, mut i) = h.runtime_and_instance().await;
    for (n, algorithm) in ALGORITHMS.into_iter().enumerate() {
        let l = Limiter {
            id: format!("limit-{n}"),
            ..limiter(10, algorithm)
        };
        let calls = i.store_calls();
        let d = check(&mut i, &l, "user:1", None).await;
        assert_eq!(i.store_calls() - calls, 1, "{algorithm:?}");
        assert_eq!(
            (d.allowed, d.limit, d.remaining, d.retry_after_ms),
            (true, 10, 9, 0),
            "{algorithm:?}"
        );
    }
}

async fn a_limited_request_consumes_nothing(h: Harness) {
    let (_rt, mut i) = h.runtime_and_instance().await;
    for (n, algorithm) in ALGORITHMS.into_iter().enumerate() {
        let l = Limiter {
            id: format!("limit-{n}"),
            ..limiter(5, algorithm)
        };
        assert!(check(&mut i, &l, "k", Some(3)).await.allowed);
        let over = check(&mut i, &l, "k", Some(3)).await;
        assert!(!over.allowed, "{algorithm:?}: 3 more do not fit in 2");
        assert!(over.retry_after_ms > 0);
        assert_eq!(
            over.remaining, 2,
            "{algorithm:?}: the limited request took nothing"
        );
        let fits = check(&mut i, &l, "k", Some(2)).await;
        assert!(fits.allowed, "{algorithm:?}");
        assert_eq!(fits.remaining, 0);
    }
}

async fn peek_counts_nothing_and_reset_restores_the_limit(h: Harness) {
    let (_rt, mut i) = h.runtime_and_instance().await;
    for (n, algorithm) in ALGORITHMS.into_iter().enumerate() {
        let l = Limiter {
            id: format!("limit-{n}"),
            ..limiter(2, algorithm)
        };
        for _ in 0..5 {
            let peek = i.ratelimit().peek(&l, "k").await.unwrap().unwrap();
            assert_eq!((peek.allowed, peek.remaining), (true, 2), "{algorithm:?}");
        }
        check(&mut i, &l, "k", Some(2)).await;
        assert!(!i.ratelimit().peek(&l, "k").await.unwrap().unwrap().allowed);
        i.ratelimit().reset(&l, "k").await.unwrap().unwrap();
        assert_eq!(
            check(&mut i, &l, "k", None).await.remaining,
            1,
            "{algorithm:?}"
        );
    }
}

async fn the_window_slides_on_the_stores_clock(h: Harness) {
    let (_rt, mut i) = h.runtime_and_instance().await;
    let l = limiter(4, None); // sliding window, 4 per minute
    assert_eq!(T0 % 60_000, 40_000, "the clock starts 40 s into a minute");
    for _ in 0..4 {
        assert!(check(&mut i, &l, "k", None).await.allowed);
    }
    let limited = check(&mut i, &l, "k", None).await;
    assert!(!limited.allowed);
    assert_eq!(
        limited.reset_in_ms, 20_000,
        "the current window ends in 20 s"
    );
    // In the next window the 4 weigh 4 × (60 − elapsed)/60; one more fits once
    // that is at most 3: 15 s into it, 35 s from now.
    assert_eq!(limited.retry_after_ms, 35_000);
    h.advance(34_999);
    assert!(!check(&mut i, &l, "k", None).await.allowed, "1 ms early");
    h.advance(1);
    assert!(
        check(&mut i, &l, "k", None).await.allowed,
        "exactly at retry-after"
    );
}

async fn concurrent_instances_share_one_limit_exactly(h: Harness) {
    const INSTANCES: usize = 8;
    const TRIES: usize = 20;
    let (runtime, _) = h.runtime_and_instance().await;
    let allowed = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for _ in 0..INSTANCES {
        let (runtime, allowed) = (runtime.clone(), allowed.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = runtime.instantiate().await.unwrap();
            let l = limiter(50, Some(Algorithm::FixedWindow));
            for _ in 0..TRIES {
                if check(&mut i, &l, "shared", None).await.allowed {
                    allowed.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        allowed.load(Ordering::SeqCst),
        50,
        "160 tries, exactly the limit allowed"
    );
}

async fn invalid_limiters_and_costs_get_named_errors(h: Harness) {
    fn field<T: std::fmt::Debug>(r: Result<T, Error>) -> String {
        match r {
            Err(Error::InvalidArgument(InvalidArgument { field, .. })) => field,
            other => panic!("expected invalid-argument, got {other:?}"),
        }
    }
    let (_rt, mut i) = h.runtime_and_instance().await;
    let l = limiter(5, None);
    assert_eq!(
        field(
            i.ratelimit()
                .check(
                    &Limiter {
                        limit: 0,
                        ..l.clone()
                    },
                    "k",
                    None
                )
                .await
                .unwrap()
        ),
        "limiter.limit"
    );
    assert_eq!(
        field(
            i.ratelimit()
                .check(
                    &Limiter {
                        window_ms: 0,
                        ..l.clone()
                    },
                    "k",
                    None
                )
                .await
                .unwrap()
        ),
        "limiter.window-ms"
    );
    let absurd = Limiter {
        limit: u32::MAX,
        window_ms: u64::MAX,
        ..l.clone()
    };
    assert_eq!(
        field(i.ratelimit().check(&absurd, "k", None).await.unwrap()),
        "limiter.limit"
    );
    assert_eq!(
        field(i.ratelimit().check(&l, "k", Some(0)).await.unwrap()),
        "cost"
    );
    assert_eq!(
        field(i.ratelimit().check(&l, "k", Some(6)).await.unwrap()),
        "cost"
    );
    assert_eq!(
        field(
            i.ratelimit()
                .check(&l, &"k".repeat(1 << 20), None)
                .await
                .unwrap()
        ),
        "key"
    );
    assert_eq!(
        field(
            i.ratelimit()
                .reset(
                    &Limiter {
                        id: String::new(),
                        ..l
                    },
                    "k"
                )
                .await
                .unwrap()
        ),
        "limiter.id"
    );
    assert_eq!(i.store_calls(), 0);
}

#[tokio::test]
async fn unused_keys_leave_nothing_behind_in_memory() {
    let h = common::memory(HISTORY);
    let clock = h.clone_clock();
    let backend = Arc::new(coord_host::backend::memory::MemoryBackend::new(
        clock.clone(),
    ));
    let runtime = Runtime::new(backend.clone()).unwrap();
    let mut i = runtime.instantiate().await.unwrap();
    for n in 0..100 {
        check(&mut i, &limiter(5, None), &format!("user:{n}"), None).await;
    }
    assert_eq!(backend.partitions(), 100);
    clock.advance(120_000); // two windows: every meter has expired
    check(&mut i, &limiter(5, None), "user:0", None).await;
    assert_eq!(backend.partitions(), 1, "only the key just used remains");
}
