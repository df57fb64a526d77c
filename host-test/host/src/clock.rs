//! Time behind a trait, so TTL and expiry tests move a clock instead of sleeping.
//!
//! The in-memory store reads its "now" from a [`Clock`] and sleeps on it
//! (a `wait` with a timeout). [`SystemClock`] is wall time; [`ManualClock`]
//! stands still until a test calls [`ManualClock::advance`], which wakes
//! every sleeper whose deadline has come.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

/// A boxed future, for object-safe async methods.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A source of time in Unix milliseconds that can also be slept on.
pub trait Clock: Send + Sync + 'static {
    /// The current time, in milliseconds.
    fn now_ms(&self) -> u64;
    /// The current time, in microseconds: [`Clock::now_ms`] × 1000 unless
    /// the clock reads finer.
    fn now_us(&self) -> u64 {
        self.now_ms().saturating_mul(1000)
    }
    /// Resolve once [`Clock::now_ms`] has reached `deadline_ms`.
    fn sleep_until(&self, deadline_ms: u64) -> BoxFuture<'_, ()>;
}

/// Wall-clock time.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    fn now_us(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }

    fn sleep_until(&self, deadline_ms: u64) -> BoxFuture<'_, ()> {
        let wait = deadline_ms.saturating_sub(self.now_ms());
        Box::pin(tokio::time::sleep(Duration::from_millis(wait)))
    }
}

/// A clock that moves only when told to.
#[derive(Debug)]
pub struct ManualClock {
    now: watch::Sender<u64>,
}

impl ManualClock {
    /// A clock standing at `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        ManualClock {
            now: watch::Sender::new(start_ms),
        }
    }

    /// Move the clock forward by `ms`, waking sleepers whose deadline has come.
    pub fn advance(&self, ms: u64) {
        self.now.send_modify(|now| *now = now.saturating_add(ms));
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        *self.now.borrow()
    }

    fn sleep_until(&self, deadline_ms: u64) -> BoxFuture<'_, ()> {
        let mut now = self.now.subscribe();
        Box::pin(async move {
            // The sender lives as long as `self`, so this only ends at the deadline.
            let _ = now.wait_for(|now| *now >= deadline_ms).await;
        })
    }
}

/// Tokio's clock: Unix milliseconds that move with `tokio::time`, so that
/// with tokio's time paused (`start_paused`), a test moves the store's time
/// and every host timer (a renewal loop, a refresher) together.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    base: tokio::time::Instant,
    base_ms: u64,
}

impl TokioClock {
    /// A clock that reads `start_ms` now and moves on with tokio's time.
    pub fn new(start_ms: u64) -> Self {
        TokioClock {
            base: tokio::time::Instant::now(),
            base_ms: start_ms,
        }
    }
}

impl Clock for TokioClock {
    fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.base_ms.saturating_add(elapsed)
    }

    fn sleep_until(&self, deadline_ms: u64) -> BoxFuture<'_, ()> {
        let wait = deadline_ms.saturating_sub(self.now_ms());
        Box::pin(tokio::time::sleep(Duration::from_millis(wait)))
    }
}
