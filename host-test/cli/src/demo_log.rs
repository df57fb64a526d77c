//! The demo's narration: one line per event, with the time since the demo
//! began and who (which instance, in which process) said it.

use std::time::Instant;

/// Prints a line prefixed by the time since the demo began.
pub struct Log {
    start: Instant,
    pid: u32,
}

impl Log {
    /// A narration starting now, in this process.
    pub fn new() -> Self {
        Log {
            start: Instant::now(),
            pid: std::process::id(),
        }
    }

    /// Print `what`, said by `who`.
    pub fn say(&self, who: &str, what: impl std::fmt::Display) {
        let ms = self.start.elapsed().as_secs_f64() * 1000.0;
        println!("{ms:>6.0} ms  {:<18} {what}", format!("{who}@{}", self.pid));
    }
}
