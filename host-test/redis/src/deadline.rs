//! A write's deadline on Redis's own clock, which its script checks: a
//! call held in a paused or stalled server, and run there after its caller
//! answered `unavailable`, changes nothing (the script answers `LATE`).
//! Without it, a lock acquire held by `CLIENT PAUSE` applied once the pause
//! ended, long after its caller had given up.
//!
//! The deadline comes from the latest reply that told Redis's time: a
//! reply read at local instant `heard` said Redis's clock was `server_ms`
//! at some moment before it, so at any later instant `t` Redis's clock
//! reads at least `server_ms + (t - heard)`. The call's deadline on Redis's
//! clock is that bound at the instant the caller gives up: a script that
//! sees its clock at or below it ran before the caller gave up. Clocks that
//! run at different rates are allowed for with a millisecond per second of
//! the sample's age, and a sample older than [`SAMPLE_LIFE`] is not used.
//! On a cluster each slot's master keeps its own clock, so samples are kept
//! per slot.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a sample of Redis's clock is used for deadlines: past it, a
/// call goes without one (and its reply gives a fresh sample).
const SAMPLE_LIFE: Duration = Duration::from_secs(60);

/// The most slots whose samples are kept; past it they are all forgotten
/// (only a cluster has more than one).
const SLOTS_KEPT: usize = 16_384;

/// Redis's clock as last heard, per slot (one slot, 0, on a single server).
#[derive(Debug, Default)]
pub(super) struct ServerClock {
    samples: Mutex<HashMap<u16, Sample>>,
}

/// Redis's clock said `server_ms` before the reply was read at `heard`.
#[derive(Clone, Copy, Debug)]
struct Sample {
    server_ms: u64,
    heard: Instant,
}

impl ServerClock {
    /// A reply read just now from `slot`'s server said its clock read
    /// `server_ms`.
    pub(super) fn heard(&self, slot: u16, server_ms: u64) {
        let Ok(mut samples) = self.samples.lock() else {
            return;
        };
        if samples.len() >= SLOTS_KEPT && !samples.contains_key(&slot) {
            samples.clear();
        }
        samples.insert(
            slot,
            Sample {
                server_ms,
                heard: Instant::now(),
            },
        );
    }

    /// The latest time on `slot`'s server clock at which a call whose
    /// caller gives up at `gives_up` may still apply; `None` without a
    /// recent sample (the call then goes without a deadline).
    pub(super) fn deadline_ms(&self, slot: u16, gives_up: Instant) -> Option<u64> {
        let sample = *self.samples.lock().ok()?.get(&slot)?;
        let age = sample.heard.elapsed();
        if age > SAMPLE_LIFE {
            return None;
        }
        let ahead = gives_up.saturating_duration_since(sample.heard);
        // A millisecond per second of age: clocks that drift apart by up
        // to 1 000 ppm still never let a late call through.
        let drift = age.as_millis() / 1000 + 1;
        let deadline = u128::from(sample.server_ms) + ahead.as_millis();
        u64::try_from(deadline.saturating_sub(drift)).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_is_never_later_than_the_sample_moved_to_when_the_caller_gives_up() {
        let clock = ServerClock::default();
        assert_eq!(clock.deadline_ms(0, Instant::now()), None, "no sample");
        let before = Instant::now();
        clock.heard(0, 1_000_000);
        let after = Instant::now();
        // The sample was heard at `before` or later, so Redis's clock reads
        // at least 1 000 000 + (t - before) at any t after it: the caller
        // gives up 2 s after `before`, at 1 002 000 or later on Redis.
        let deadline = clock
            .deadline_ms(0, before + Duration::from_secs(2))
            .unwrap();
        assert!(deadline < 1_002_000, "{deadline}");
        // And no earlier than its lower bound, less the drift allowance.
        let gives_up = before + Duration::from_secs(2);
        let least = 1_000_000 + gives_up.saturating_duration_since(after).as_millis() as u64;
        assert!(deadline + 2 >= least, "{deadline} < {least}");
        assert_eq!(clock.deadline_ms(1, Instant::now()), None, "another slot");
    }
}
