//! The algorithms' answers at hand-computed moments.

use super::*;

fn req(
    algorithm: MeterAlgorithm,
    limit: u32,
    window_ms: u64,
    cost: u32,
    mode: MeterMode,
) -> MeterRequest {
    MeterRequest {
        algorithm,
        limit,
        window_ms,
        cost,
        mode,
    }
}

/// Run `cost`-1 consumes at each time in `at`, threading the state.
fn run(
    algorithm: MeterAlgorithm,
    limit: u32,
    window: u64,
    at: &[u64],
) -> (Vec<MeterReply>, Option<MeterState>) {
    let mut state = None;
    let mut replies = Vec::new();
    for &now in at {
        let (reply, write) = decide(
            state,
            &req(algorithm, limit, window, 1, MeterMode::Consume),
            now,
        );
        match write {
            Write::Put(s, _) => state = Some(s),
            Write::Delete => state = None,
            Write::Keep => {}
        }
        replies.push(reply);
    }
    (replies, state)
}

#[test]
fn fixed_window_counts_per_aligned_window() {
    let (r, _) = run(
        MeterAlgorithm::FixedWindow,
        2,
        1000,
        &[10_000, 10_100, 10_200, 11_000],
    );
    let allowed: Vec<bool> = r.iter().map(|r| r.allowed).collect();
    assert_eq!(allowed, [true, true, false, true]);
    assert_eq!((r[1].remaining, r[1].reset_in_ms), (0, 900));
    assert_eq!(
        (r[2].retry_after_ms, r[2].reset_in_ms),
        (800, 800),
        "limited until the window ends"
    );
}

#[test]
fn sliding_window_weights_the_previous_window() {
    // 4 requests in [10000, 11000); at 11250 the previous window weighs 0.75: 3 of 4 used.
    let (r, _) = run(
        MeterAlgorithm::SlidingWindow,
        4,
        1000,
        &[10_000, 10_100, 10_200, 10_300, 11_250, 11_260],
    );
    let allowed: Vec<bool> = r.iter().map(|r| r.allowed).collect();
    assert_eq!(allowed, [true, true, true, true, true, false]);
    assert_eq!(r[4].remaining, 0, "3 (weighted) + 1 = 4");
    // Limited at 11260: with curr = 1, room = 4 - 1 - 1 = 2 needs prev × (1000 - d) ≤ 2000,
    // i.e. d ≥ 500: at 11500, 240 ms from now.
    assert_eq!(r[5].retry_after_ms, 240);
    assert_eq!(r[5].reset_in_ms, 740);
}

#[test]
fn gcra_allows_a_burst_of_the_limit_then_the_rate() {
    // 3 per 300 ms: a burst of 3, then one every 100 ms.
    let (r, _) = run(
        MeterAlgorithm::Gcra,
        3,
        300,
        &[1000, 1000, 1000, 1000, 1050, 1100],
    );
    let allowed: Vec<bool> = r.iter().map(|r| r.allowed).collect();
    assert_eq!(allowed, [true, true, true, false, false, true]);
    assert_eq!(r[2].remaining, 0);
    assert_eq!(
        r[2].reset_in_ms, 300,
        "the bucket is full again 300 ms later"
    );
    assert_eq!(r[3].retry_after_ms, 100);
    assert_eq!(r[4].retry_after_ms, 50);
}

#[test]
fn gcra_keeps_fractions_exact() {
    // 3 per 1000 ms: each request costs 333⅓ ms. After 3 at t=0 the next fits at exactly 333⅓ → 334.
    let (r, _) = run(
        MeterAlgorithm::Gcra,
        3,
        1000,
        &[5000, 5000, 5000, 5333, 5334],
    );
    let allowed: Vec<bool> = r.iter().map(|r| r.allowed).collect();
    assert_eq!(allowed, [true, true, true, false, true]);
    assert_eq!(r[3].retry_after_ms, 1);
}

#[test]
fn a_limited_request_consumes_nothing_and_peek_and_reset_count_nothing() {
    for algorithm in [
        MeterAlgorithm::SlidingWindow,
        MeterAlgorithm::FixedWindow,
        MeterAlgorithm::Gcra,
    ] {
        let full = MeterState::default();
        let (_, state) = run(algorithm, 2, 1000, &[7000, 7000]);
        let (limited, write) = decide(state, &req(algorithm, 2, 1000, 1, MeterMode::Consume), 7001);
        assert!(!limited.allowed, "{algorithm:?}");
        assert_eq!(
            write,
            Write::Keep,
            "{algorithm:?}: a limited request writes nothing"
        );
        let (peek, write) = decide(state, &req(algorithm, 2, 1000, 1, MeterMode::Peek), 7001);
        assert_eq!((peek.allowed, write), (false, Write::Keep), "{algorithm:?}");
        let (reset, write) = decide(state, &req(algorithm, 2, 1000, 1, MeterMode::Reset), 7001);
        assert_eq!(
            (reset.allowed, reset.remaining, write),
            (true, 2, Write::Delete),
            "{algorithm:?}"
        );
        let _ = full;
    }
}
