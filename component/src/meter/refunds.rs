//! Charges and refunds (reservations settled for more or for less) against
//! exact models written apart from the meter's rolling state, on generated
//! traces: every decision after a refund must be the model's.
//!
//! - fixed window: a count per aligned window; a refund comes off its
//!   window's count only while that window is current;
//! - sliding window: a count per aligned window, the estimate the current
//!   count plus the previous one weighted by its overlap; a refund comes
//!   off the count of the window it was counted in, if that is the current
//!   or the previous one;
//! - GCRA: a bucket's debt in units of 1/limit ms that drains at one per
//!   1/limit ms; a unit costs a window; a refund pays back its units'
//!   debt, never below zero.

use std::collections::HashMap;

use super::*;

const T0: u64 = 1_750_000_000_000;

struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// The exact model of one algorithm, decided afresh from its own records.
struct Model {
    algorithm: MeterAlgorithm,
    limit: u64,
    window: u64,
    /// Window algorithms: units counted per aligned window's start.
    counts: HashMap<u64, u64>,
    /// GCRA: the debt (scaled by the limit) at `debt_at`.
    debt: u64,
    debt_at: u64,
}

impl Model {
    fn new(algorithm: MeterAlgorithm, limit: u32, window: u64) -> Self {
        Model {
            algorithm,
            limit: u64::from(limit),
            window,
            counts: HashMap::new(),
            debt: 0,
            debt_at: 0,
        }
    }

    fn start(&self, t: u64) -> u64 {
        t - t % self.window
    }

    /// The GCRA debt drained to `now`.
    fn drain(&mut self, now: u64) {
        let drained = (now - self.debt_at) * self.limit;
        self.debt = self.debt.saturating_sub(drained);
        self.debt_at = now;
    }

    /// Whether `n` more units fit at `now`.
    fn fits(&mut self, n: u64, now: u64) -> bool {
        let (l, w) = (self.limit, self.window);
        let start = self.start(now);
        let curr = self.counts.get(&start).copied().unwrap_or(0);
        match self.algorithm {
            MeterAlgorithm::FixedWindow => curr + n <= l,
            MeterAlgorithm::SlidingWindow => {
                let prev = start
                    .checked_sub(w)
                    .and_then(|p| self.counts.get(&p))
                    .copied()
                    .unwrap_or(0);
                prev * (w - (now - start)) + curr * w + n * w <= l * w
            }
            MeterAlgorithm::Gcra => {
                self.drain(now);
                self.debt + n * w <= l * w
            }
        }
    }

    fn count(&mut self, n: u64, now: u64) {
        let start = self.start(now);
        *self.counts.entry(start).or_default() += n;
        self.drain(now);
        self.debt += n * self.window;
    }

    fn refund(&mut self, n: u64, at: u64, now: u64) {
        let (start, at_start) = (self.start(now), self.start(at));
        let counted = match self.algorithm {
            MeterAlgorithm::FixedWindow => at_start == start,
            MeterAlgorithm::SlidingWindow => at_start == start || at_start + self.window == start,
            MeterAlgorithm::Gcra => {
                self.drain(now);
                self.debt = self.debt.saturating_sub(n * self.window);
                return;
            }
        };
        if counted && let Some(count) = self.counts.get_mut(&at_start) {
            *count = count.saturating_sub(n);
        }
    }
}

/// Run a generated trace of consumes, charges and refunds (each refund
/// gives back part or all of an earlier allowed consume, at its time)
/// through `decide` and through the model: every consume's decision must
/// agree.
fn agree(algorithm: MeterAlgorithm, limit: u32, window: u64, seed: u64) -> usize {
    let mut rng = Lcg(seed);
    let mut model = Model::new(algorithm, limit, window);
    let (mut state, mut now) = (None, T0);
    let mut open: Vec<(u64, u32)> = Vec::new();
    let mut refunds = 0;
    for step in 0..600 {
        now += rng.below(window / 3 + 1);
        let pick = rng.below(10);
        let (mode, cost) = if pick < 2 && !open.is_empty() {
            let (at, reserved) = open.swap_remove(rng.below(open.len() as u64) as usize);
            let back = 1 + rng.below(u64::from(reserved)) as u32;
            (MeterMode::Refund(at), back)
        } else if pick == 2 {
            (MeterMode::Charge, 1 + rng.below(u64::from(limit)) as u32)
        } else {
            (MeterMode::Consume, 1 + rng.below(u64::from(limit)) as u32)
        };
        let request = MeterRequest {
            algorithm,
            limit,
            window_ms: window,
            cost,
            mode,
        };
        let (reply, write) = decide(state, &request, now);
        match write {
            Write::Put(s, _) => state = Some(s),
            Write::Delete => state = None,
            Write::Keep => {}
        }
        let n = u64::from(cost);
        match mode {
            MeterMode::Consume => {
                let fits = model.fits(n, now);
                assert_eq!(
                    reply.allowed,
                    fits,
                    "{algorithm:?} step {step} at +{}: consume {cost}",
                    now - T0
                );
                if fits {
                    model.count(n, now);
                    open.push((now, cost));
                }
            }
            MeterMode::Charge => {
                assert!(reply.allowed, "a charge is never refused");
                model.count(n, now);
            }
            MeterMode::Refund(at) => {
                model.refund(n, at, now);
                refunds += 1;
            }
            _ => unreachable!(),
        }
    }
    refunds
}

#[test]
fn refunds_and_charges_change_later_decisions_exactly_as_the_models_say() {
    for algorithm in [
        MeterAlgorithm::FixedWindow,
        MeterAlgorithm::SlidingWindow,
        MeterAlgorithm::Gcra,
    ] {
        // Limits that divide the window and ones that do not.
        for (limit, window) in [(5, 1000), (3, 700), (100, 60_000), (7, 10)] {
            for seed in 1..6 {
                let refunds = agree(algorithm, limit, window, seed);
                assert!(refunds > 50, "{algorithm:?}: only {refunds} refunds");
            }
        }
    }
}

#[test]
fn a_fixed_window_refund_lands_only_in_its_own_window() {
    let request = |mode, cost| MeterRequest {
        algorithm: MeterAlgorithm::FixedWindow,
        limit: 10,
        window_ms: 1000,
        cost,
        mode,
    };
    let put = |w: Write| match w {
        Write::Put(s, _) => Some(s),
        other => panic!("{other:?}"),
    };
    let (_, w) = decide(None, &request(MeterMode::Consume, 10), T0);
    let full = put(w);
    // In the same window, giving 4 back lets 4 more in.
    let (r, w) = decide(full, &request(MeterMode::Refund(T0), 4), T0 + 10);
    assert_eq!(r.remaining, 4);
    let (r, _) = decide(put(w), &request(MeterMode::Consume, 4), T0 + 20);
    assert!(r.allowed);
    // In the next window the old window's units are gone anyway: nothing to give.
    let (r, w) = decide(full, &request(MeterMode::Refund(T0), 4), T0 + 1000);
    assert_eq!((r.remaining, w), (10, Write::Keep));
}
