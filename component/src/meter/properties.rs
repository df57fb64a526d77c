//! Property tests on generated traces: the window algorithms never allow
//! more than they promise.

use proptest::prelude::*;

use super::*;

/// A trace: (gap before the request in ms, cost) pairs, and a limit and window.
fn traces() -> impl Strategy<Value = (u32, u64, Vec<(u64, u32)>)> {
    (1u32..20, 1u64..5_000).prop_flat_map(|(limit, window)| {
        let request = (0..window / 2 + 2, 1..=limit);
        (
            Just(limit),
            Just(window),
            proptest::collection::vec(request, 1..200),
        )
    })
}

/// Run a trace; the (time, cost) of every allowed request.
fn allowed(
    algorithm: MeterAlgorithm,
    limit: u32,
    window: u64,
    trace: &[(u64, u32)],
) -> Vec<(u64, u64)> {
    let (mut state, mut now, mut out) = (None, 1_750_000_000_000u64, Vec::new());
    for &(gap, cost) in trace {
        now += gap;
        let request = MeterRequest {
            algorithm,
            limit,
            window_ms: window,
            cost,
            mode: MeterMode::Consume,
        };
        let (reply, write) = decide(state, &request, now);
        if let Write::Put(s, _) = write {
            state = Some(s);
        }
        if reply.allowed {
            out.push((now, u64::from(cost)));
        }
    }
    out
}

proptest! {
    #[test]
    fn fixed_window_never_allows_more_than_the_limit_in_a_window((limit, window, trace) in traces()) {
        let allowed = allowed(MeterAlgorithm::FixedWindow, limit, window, &trace);
        let mut per_window = std::collections::BTreeMap::new();
        for (t, cost) in allowed {
            *per_window.entry(t / window).or_insert(0u64) += cost;
        }
        for (w, total) in per_window {
            prop_assert!(total <= u64::from(limit), "window {w}: {total} > {limit}");
        }
    }

    #[test]
    fn token_bucket_never_allows_more_than_its_burst_plus_its_refill((limit, window, trace) in traces()) {
        // Over any span [a, b], at most limit + (b - a) × limit / window:
        // the full bucket plus what refills meanwhile.
        let allowed = allowed(MeterAlgorithm::Gcra, limit, window, &trace);
        for i in 0..allowed.len() {
            let mut total = 0u64;
            for &(t, cost) in &allowed[i..] {
                total += cost;
                let span = t - allowed[i].0;
                let bound = u64::from(limit) + span * u64::from(limit) / window;
                prop_assert!(total <= bound, "{total} in {span} ms > {bound}");
            }
        }
    }

    #[test]
    fn token_bucket_never_allows_more_than_twice_the_limit_in_any_window(
        (limit, window, trace) in traces()
    ) {
        // Within one window, never more than 2 × limit (a full bucket, then a full refill).
        let allowed = allowed(MeterAlgorithm::Gcra, limit, window, &trace);
        for i in 0..allowed.len() {
            let total: u64 = allowed[i..].iter().take_while(|(t, _)| *t < allowed[i].0 + window).map(|(_, c)| c).sum();
            prop_assert!(total <= 2 * u64::from(limit));
        }
    }

    #[test]
    fn sliding_window_allows_the_limit_per_aligned_window_and_twice_it_in_any_span(
        (limit, window, trace) in traces()
    ) {
        // The disclosed worst case (README): the counter never lets more
        // than the limit into one aligned window, so any span of one window
        // (which meets two of them) sees at most twice the limit.
        let allowed = allowed(MeterAlgorithm::SlidingWindow, limit, window, &trace);
        let mut per_window = std::collections::BTreeMap::new();
        for &(t, cost) in &allowed {
            *per_window.entry(t / window).or_insert(0u64) += cost;
        }
        for (w, total) in per_window {
            prop_assert!(total <= u64::from(limit), "window {w}: {total} > {limit}");
        }
        for i in 0..allowed.len() {
            let total: u64 = allowed[i..].iter().take_while(|(t, _)| *t < allowed[i].0 + window).map(|(_, c)| c).sum();
            prop_assert!(total <= 2 * u64::from(limit));
        }
    }
}
