//! Rate-limit reservations, end to end: the real `coord.wasm` over every
//! backend: reserve an estimate, settle the real cost, racing settles,
//! expiries and resets.

use crate::common;

use std::sync::Arc;

use common::Harness;
use coord_host::Runtime;
use coord_host::ratelimit::*;

const HISTORY: usize = 64;

per_backend!(
    a_settle_for_less_gives_back_and_for_more_charges_for_every_algorithm,
    racing_settles_and_expiries_count_each_reservation_exactly_once,
    a_reset_between_reserve_and_settle_never_leaves_more_than_the_limit,
    a_forged_edited_or_replayed_reservation_refunds_nothing,
);

fn limiter(limit: u32, algorithm: Algorithm) -> Limiter {
    Limiter {
        id: "llm.tokens".into(),
        limit,
        window_ms: 3_600_000,
        algorithm: Some(algorithm),
    }
}

async fn a_settle_for_less_gives_back_and_for_more_charges_for_every_algorithm(h: Harness) {
    let rt = h.runtime();
    let mut i = rt.instantiate().await.unwrap();
    for algorithm in [
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
    ] {
        let l = limiter(10, algorithm);
        let key = format!("tenant:{algorithm:?}");
        let calls = i.store_calls();
        let reserved = i
            .ratelimit()
            .reserve(&l, &key, 8, 60_000)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            i.store_calls() - calls,
            2,
            "a reserve is two store calls: the count, the record"
        );
        assert!(reserved.decision.allowed);
        assert_eq!(reserved.decision.remaining, 2);
        let r = reserved.reservation.expect("allowed: a reservation");
        let limited = i
            .ratelimit()
            .check(&l, &key, Some(3))
            .await
            .unwrap()
            .unwrap();
        assert!(
            !limited.allowed,
            "{algorithm:?}: 8 reserved, 3 more do not fit"
        );
        let calls = i.store_calls();
        let settled = i.ratelimit().settle(&l, &r, 2).await.unwrap().unwrap();
        assert_eq!(settled, Settled::Settled);
        assert_eq!(
            i.store_calls() - calls,
            3,
            "read the record, claim it, refund"
        );
        let peek = i.ratelimit().peek(&l, &key).await.unwrap().unwrap();
        assert_eq!(peek.remaining, 8, "{algorithm:?}: 6 of 8 given back");
        let again = i.ratelimit().cancel(&l, &r).await.unwrap().unwrap();
        assert_eq!(again, Settled::AlreadySettled);
        // For more: counted past the limit, and the next check is limited.
        let more = i
            .ratelimit()
            .reserve(&l, &key, 8, 60_000)
            .await
            .unwrap()
            .unwrap();
        let more = more.reservation.expect("2 + 8 fit");
        let over = i.ratelimit().settle(&l, &more, 10).await.unwrap().unwrap();
        assert_eq!(over, Settled::Settled);
        let after = i.ratelimit().check(&l, &key, None).await.unwrap().unwrap();
        assert!(!after.allowed, "{algorithm:?}: 12 of 10 counted");
        assert!(after.retry_after_ms > 0);
        // Limited: nothing counted, nothing to settle.
        let refused = i
            .ratelimit()
            .reserve(&l, &key, 1, 60_000)
            .await
            .unwrap()
            .unwrap();
        assert!(!refused.decision.allowed && refused.reservation.is_none());
    }
}

async fn racing_settles_and_expiries_count_each_reservation_exactly_once(h: Harness) {
    const RESERVATIONS: u32 = 12;
    let runtime = Arc::new(Runtime::new(h.backend.clone()).unwrap());
    let l = limiter(1000, Algorithm::FixedWindow);
    let mut i = runtime.instantiate().await.unwrap();
    let mut reservations = Vec::new();
    for n in 0..RESERVATIONS {
        // Half expire 100 ms after being reserved, half an hour later.
        let ttl = if n % 2 == 0 { 100 } else { 1_800_000 };
        let r = i
            .ratelimit()
            .reserve(&l, "tenant:1", 50, ttl)
            .await
            .unwrap()
            .unwrap();
        reservations.push(r.reservation.unwrap());
    }
    // Two settles of each reservation race each other and the clock
    // passing the short TTLs.
    let mut tasks = Vec::new();
    for (n, r) in reservations.iter().enumerate() {
        for _ in 0..2 {
            let (runtime, l, r) = (runtime.clone(), l.clone(), r.clone());
            tasks.push(tokio::spawn(async move {
                let mut i = runtime.instantiate().await.unwrap();
                let actual = (n % 5) as u32 * 10;
                let outcome = i.ratelimit().settle(&l, &r, actual).await.unwrap().unwrap();
                (n, actual, outcome)
            }));
        }
    }
    h.advance(100);
    let mut expected_count = 0;
    let mut outcomes = vec![Vec::new(); RESERVATIONS as usize];
    for task in tasks {
        let (n, actual, outcome) = task.await.unwrap();
        outcomes[n].push((actual, outcome));
    }
    for (n, pair) in outcomes.iter().enumerate() {
        let settled: Vec<_> = pair
            .iter()
            .filter(|(_, o)| *o == Settled::Settled)
            .collect();
        let expired = pair.iter().any(|(_, o)| *o == Settled::Expired);
        assert!(
            settled.len() <= 1,
            "reservation {n} settled twice: {pair:?}"
        );
        assert!(
            pair.iter()
                .all(|(_, o)| *o != Settled::Expired || n % 2 == 0),
            "a long reservation expired: {pair:?}"
        );
        assert!(
            settled.len() == 1 || expired,
            "neither settled nor expired: {pair:?}"
        );
        expected_count += match settled.first() {
            Some((actual, _)) => *actual,
            None => 50,
        };
    }
    let peek = i.ratelimit().peek(&l, "tenant:1").await.unwrap().unwrap();
    assert_eq!(
        peek.remaining,
        1000 - expected_count,
        "each counted exactly once"
    );
}

async fn a_reset_between_reserve_and_settle_never_leaves_more_than_the_limit(h: Harness) {
    let rt = h.runtime();
    let mut i = rt.instantiate().await.unwrap();
    for algorithm in [
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
    ] {
        let l = limiter(10, algorithm);
        let key = format!("tenant:{algorithm:?}");
        let r = i
            .ratelimit()
            .reserve(&l, &key, 6, 60_000)
            .await
            .unwrap()
            .unwrap();
        let r = r.reservation.unwrap();
        i.ratelimit().reset(&l, &key).await.unwrap().unwrap();
        i.ratelimit()
            .check(&l, &key, Some(4))
            .await
            .unwrap()
            .unwrap();
        // Giving back 6 units the reset already forgot: never below zero.
        let settled = i.ratelimit().cancel(&l, &r).await.unwrap().unwrap();
        assert_eq!(settled, Settled::Settled);
        let peek = i.ratelimit().peek(&l, &key).await.unwrap().unwrap();
        assert!(
            peek.remaining <= 10,
            "{algorithm:?}: {} of 10",
            peek.remaining
        );
        let mut allowed = 0;
        for _ in 0..12 {
            allowed += u32::from(
                i.ratelimit()
                    .check(&l, &key, None)
                    .await
                    .unwrap()
                    .unwrap()
                    .allowed,
            );
        }
        assert!(
            allowed <= 10,
            "{algorithm:?}: {allowed} allowed after the reset and refund"
        );
    }
}

/// The outside testers' attacks (issue 48, item 7), on a fixed window of 10:
/// a reservation of 6 with its cost edited to 10, made-up tokens on a full
/// key, a genuine token moved to another user's key, and a replay with
/// `reserved-at` moved to just before `expires-at`. Every one of them
/// used to give back budget; none may.
async fn a_forged_edited_or_replayed_reservation_refunds_nothing(h: Harness) {
    let rt = h.runtime();
    let mut i = rt.instantiate().await.unwrap();
    let l = limiter(10, Algorithm::FixedWindow);
    let six = i
        .ratelimit()
        .reserve(&l, "user:ann", 6, 60_000)
        .await
        .unwrap()
        .unwrap()
        .reservation
        .unwrap();
    i.ratelimit()
        .check(&l, "user:ann", Some(4))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        remaining(&mut i, &l, "user:ann").await,
        0,
        "ann's key is full"
    );

    // Five made-up tokens on the full key: no record, nothing back.
    for n in 0..5u8 {
        let made_up = Reservation {
            token: format!("{:032x}", u128::from(n) * 0x1111),
            cost: 10,
            ..six.clone()
        };
        let answer = i.ratelimit().cancel(&l, &made_up).await.unwrap().unwrap();
        assert_eq!(answer, Settled::Unknown, "made-up token {n}");
    }
    assert_eq!(remaining(&mut i, &l, "user:ann").await, 0, "nothing minted");

    // The genuine token moved to bob's full key: bob gets nothing back.
    i.ratelimit()
        .check(&l, "user:bob", Some(10))
        .await
        .unwrap()
        .unwrap();
    let moved = Reservation {
        key: "user:bob".into(),
        ..six.clone()
    };
    let answer = i.ratelimit().cancel(&l, &moved).await.unwrap().unwrap();
    assert_eq!(answer, Settled::Unknown);
    assert_eq!(
        remaining(&mut i, &l, "user:bob").await,
        0,
        "bob not refunded"
    );

    // Its cost edited to 10 and its times moved: the store's record says 6.
    let edited = Reservation {
        cost: 10,
        reserved_at: six.expires_at - 1,
        ..six.clone()
    };
    let answer = i.ratelimit().cancel(&l, &edited).await.unwrap().unwrap();
    assert_eq!(answer, Settled::Settled);
    assert_eq!(
        remaining(&mut i, &l, "user:ann").await,
        6,
        "the 6 reserved came back, not 10"
    );
    // Replayed, as edited and as issued: settled once only.
    for again in [&edited, &six] {
        let answer = i.ratelimit().cancel(&l, again).await.unwrap().unwrap();
        assert_eq!(answer, Settled::AlreadySettled);
    }
    assert_eq!(remaining(&mut i, &l, "user:ann").await, 6);
}

/// Units still available to `key` under `l`, counting nothing.
async fn remaining(i: &mut coord_host::Instance, l: &Limiter, key: &str) -> u32 {
    i.ratelimit().peek(l, key).await.unwrap().unwrap().remaining
}
