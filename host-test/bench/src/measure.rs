//! Latency samples and their summaries.

use std::time::Duration;

/// A set of latency samples.
#[derive(Default, Clone)]
pub struct Stats {
    samples: Vec<Duration>,
}

impl Stats {
    /// Add one sample.
    pub fn push(&mut self, d: Duration) {
        self.samples.push(d);
    }

    /// Add every sample of `other`.
    pub fn extend(&mut self, other: Stats) {
        self.samples.extend(other.samples);
    }

    /// How many samples there are.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    fn quantile(&self, q: f64) -> Duration {
        if self.samples.is_empty() {
            return Duration::ZERO;
        }
        let mut s = self.samples.clone();
        s.sort_unstable();
        let i = ((s.len() - 1) as f64 * q).round() as usize;
        s[i]
    }

    /// The median.
    pub fn median(&self) -> Duration {
        self.quantile(0.5)
    }

    /// The 99th percentile.
    pub fn p99(&self) -> Duration {
        self.quantile(0.99)
    }
}

/// Microseconds with one decimal.
pub fn fmt_us(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

/// One timed operation of a concurrent task.
pub trait Step {
    /// Do it once.
    fn step(&mut self) -> impl std::future::Future<Output = wasmtime::Result<()>> + Send;
}

/// A benchmark operation that did not do what it should: the run stops.
pub fn failed(what: &str) -> wasmtime::Error {
    wasmtime::format_err!("benchmark operation failed: {what}")
}
