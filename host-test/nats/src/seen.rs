//! What this host last saw: each partition's last message, and a sample of
//! the server's clock. They let a write skip its read — one round trip
//! instead of two — when this host wrote or read the partition last: it
//! decides on the state it saw, at a bound of the server's clock, and
//! publishes with that state's sequence as the condition, so the server
//! itself proves the state was current (or refuses, and the call reads).

use std::time::{Duration, Instant};

use bytes::Bytes;

use coord_host::clock::Clock;

use super::NatsBackend;

/// How many partitions are remembered; past it, the memory starts afresh.
const SEEN_PARTITIONS: usize = 4096;
/// Partitions larger than this are not remembered (their writes read first),
/// so the memory stays under 4096 × 64 KiB.
const SEEN_BYTES: usize = 64 * 1024;
/// How far the monotonic and the wall clock may disagree about the time
/// since a sample before it is dropped: a host suspended (a laptop asleep,
/// a VM paused) stops its monotonic clock, not the server's.
const SUSPEND_TOLERANCE: Duration = Duration::from_millis(5);
/// How long a clock sample bounds the server's clock: clocks drift apart
/// by microseconds in this time (100 ppm is 0.1 ms a second).
const SAMPLE_LIFETIME: Duration = Duration::from_secs(1);

/// A partition's last message as this host saw it.
#[derive(Clone)]
pub(super) struct Seen {
    /// Its stream sequence: the condition of the next write.
    pub(super) sequence: u64,
    /// The partition's encoding.
    pub(super) encoded: Bytes,
    /// The latest store time it was decided at.
    pub(super) decided_at: u64,
}

/// The server's clock read at `ts`, by a request sent at `sent` and
/// answered at `received` (local monotonic time).
#[derive(Clone, Copy)]
pub(super) struct ClockSample {
    pub(super) ts: u64,
    pub(super) sent: Instant,
    pub(super) received: Instant,
    /// The wall clock at `received`, to notice a suspended host.
    pub(super) wall: std::time::SystemTime,
}

impl ClockSample {
    /// The lower bound of the server's clock it gives now.
    fn low(&self) -> u64 {
        let ms = u64::try_from(self.received.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.ts.saturating_add(ms)
    }
}

impl NatsBackend {
    /// The partition as this host last saw it, if it remembers.
    pub(super) fn seen(&self, partition: &str) -> Option<Seen> {
        self.seen.lock().ok()?.get(partition).cloned()
    }

    /// Remember the partition's last message (unless it is large).
    pub(super) fn remember(&self, partition: &str, seen: Seen) {
        if seen.encoded.len() > SEEN_BYTES {
            self.forget(partition);
            return;
        }
        if let Ok(mut map) = self.seen.lock() {
            if map.len() >= SEEN_PARTITIONS && !map.contains_key(partition) {
                map.clear();
            }
            map.insert(partition.to_string(), seen);
        }
    }

    /// Forget the partition: what was seen is stale.
    pub(super) fn forget(&self, partition: &str) {
        if let Ok(mut map) = self.seen.lock() {
            map.remove(partition);
        }
    }

    /// Forget every partition: the stream was deleted or made again.
    pub(super) fn forget_all(&self) {
        if let Ok(mut map) = self.seen.lock() {
            map.clear();
        }
    }

    /// Keep a clock sample for [`NatsBackend::clock_bounds`]: the one with
    /// the higher lower bound, since replies of calls in flight together
    /// arrive in any order.
    pub(super) fn sampled(&self, sample: ClockSample) {
        if let Ok(mut last) = self.clock_sample.lock()
            && last.is_none_or(|old| {
                old.received.elapsed() > SAMPLE_LIFETIME || sample.low() >= old.low()
            })
        {
            *last = Some(sample);
        }
    }

    /// `(low, high)` bounds of the server's clock now, from the last sample
    /// while it is fresh: the server stamped `ts` after the request was sent
    /// and before it was answered, so now it reads at least `ts` plus the
    /// time since the answer and at most `ts` plus the time since the
    /// request. With a test clock, its time, exactly.
    pub(super) fn clock_bounds(&self) -> Option<(u64, u64)> {
        if let Some(clock) = &self.config.test_clock {
            let now = clock.now_ms();
            return Some((now, now));
        }
        let sample = (*self.clock_sample.lock().ok()?)?;
        let since = sample.received.elapsed();
        let wall_since = sample.wall.elapsed().ok()?;
        if since > SAMPLE_LIFETIME || wall_since.abs_diff(since) > SUSPEND_TOLERANCE {
            return None;
        }
        // `ts` is the server's time cut to the millisecond: the true time
        // of the stamp is below `ts + 1`. Rounding the elapsed times down
        // for the low bound and up for the high one covers the rest.
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let low = sample.low();
        let high = sample
            .ts
            .saturating_add(ms(sample.sent.elapsed()))
            .saturating_add(2);
        Some((low, high))
    }
}
