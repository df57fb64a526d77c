//! Meters: answers as the reference algorithms on a generated trace, with
//! state that is no entry and makes no change.

use crate::{Harness, T0};
use coord_host::backend::*;

/// Meter answers as the reference algorithms on a generated trace.
pub async fn meter_answers_as_the_reference_algorithms_on_a_generated_trace(h: Harness) {
    use coord_component::meter::{Write, decide};
    // A limit that divides the window and one that does not: GCRA keeps the
    // remainder of window / limit, which only the second exercises.
    for (algorithm, limit, window_ms) in [
        MeterAlgorithm::SlidingWindow,
        MeterAlgorithm::FixedWindow,
        MeterAlgorithm::Gcra,
    ]
    .into_iter()
    .flat_map(|a| [(a, 5, 1000), (a, 3, 700)])
    {
        let partition = format!("meter-{algorithm:?}-{limit}");
        let (mut reference, mut now, mut seed) = (None, h.backend.now().await.unwrap(), 42u64);
        // When units were last counted: a refund gives them back there.
        let mut counted_at = now;
        for step in 0..300 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let advance = (seed >> 33) % 7 * 45; // 0 to 270 ms, often 0
            h.advance(advance);
            now += advance;
            let mode = match (seed >> 50) % 16 {
                0 => MeterMode::Reset,
                1 | 2 => MeterMode::Peek,
                3 => MeterMode::Charge,
                4 | 5 => MeterMode::Refund(counted_at),
                _ => MeterMode::Consume,
            };
            if mode == MeterMode::Consume {
                counted_at = now;
            }
            let request = MeterRequest {
                algorithm,
                limit,
                window_ms,
                cost: 1 + ((seed >> 40) % 3) as u32,
                mode,
            };
            let got = h
                .backend
                .meter(&partition, "user:1", &request)
                .await
                .unwrap();
            let (expected, write) = decide(reference, &request, now);
            match write {
                Write::Put(state, _) => reference = Some(state),
                Write::Delete => reference = None,
                Write::Keep => {}
            }
            assert_eq!(got, expected, "{algorithm:?} step {step}: {request:?}");
        }
    }
}

/// Meter state is not an entry and makes no changes.
pub async fn meter_state_is_not_an_entry_and_makes_no_changes(h: Harness) {
    let request = MeterRequest {
        algorithm: MeterAlgorithm::SlidingWindow,
        limit: 2,
        window_ms: 1000,
        cost: 1,
        mode: MeterMode::Consume,
    };
    assert!(h.backend.meter("p", "k", &request).await.unwrap().allowed);
    assert!(h.backend.meter("p", "k", &request).await.unwrap().allowed);
    let third = h.backend.meter("p", "k", &request).await.unwrap();
    assert!(!third.allowed, "the state is shared across calls");
    assert_eq!(third.now, T0);
    assert_eq!(h.backend.get("p", "k").await.unwrap().entry, None);
    assert_eq!(h.backend.list("p", "").await.unwrap().entries, vec![]);
    assert_eq!(h.backend.changes("p", 0, 10).await.unwrap().changes, vec![]);
    assert!(
        h.backend
            .meter("other", "k", &request)
            .await
            .unwrap()
            .allowed,
        "per partition"
    );
}
