//! What bounds the memory clients can make the server hold: the
//! connections open at once, and the request bodies held in memory at once.
//! Without them, clients that open connections, or send bodies slowly,
//! grow the process without limit (each body may take
//! [`crate::MAX_BODY_BYTES`] for the whole read timeout).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Connections open at once by default; one more is closed at once.
pub const MAX_CONNECTIONS: usize = 1024;

/// Bytes of request bodies held in memory at once by default (read so far,
/// or read whole and waiting for or running in an instance); a request
/// whose body would pass it gets 503.
pub const MAX_BUFFERED_BYTES: usize = 64 << 20;

/// How much of a shared bound is taken now, and the bound.
#[derive(Debug)]
pub struct Allowance {
    taken: AtomicUsize,
    limit: usize,
}

impl Allowance {
    /// An allowance of `limit` units, none taken.
    pub fn new(limit: usize) -> Arc<Allowance> {
        Arc::new(Allowance {
            taken: AtomicUsize::new(0),
            limit,
        })
    }

    /// How many units are taken now.
    pub fn taken(&self) -> usize {
        self.taken.load(Ordering::Relaxed)
    }

    /// The bound.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Take `units` if they fit; nothing is taken when they do not.
    fn try_take(&self, units: usize) -> bool {
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |taken| {
                taken
                    .checked_add(units)
                    .filter(|&after| after <= self.limit)
            })
            .is_ok()
    }
}

/// Units taken from an [`Allowance`], given back when dropped.
#[derive(Debug)]
pub struct Taken {
    from: Arc<Allowance>,
    units: usize,
}

impl Taken {
    /// Nothing yet, from `from`.
    pub fn none(from: &Arc<Allowance>) -> Taken {
        Taken {
            from: from.clone(),
            units: 0,
        }
    }

    /// Take `units` more, if they fit in the allowance.
    pub fn more(&mut self, units: usize) -> bool {
        let fits = self.from.try_take(units);
        if fits {
            self.units += units;
        }
        fits
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        self.from.taken.fetch_sub(self.units, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_fit_up_to_the_limit_and_come_back_when_dropped() {
        let allowance = Allowance::new(10);
        let mut first = Taken::none(&allowance);
        assert!(first.more(6));
        let mut second = Taken::none(&allowance);
        assert!(!second.more(5), "6 + 5 is past 10");
        assert!(second.more(4));
        assert_eq!(allowance.taken(), 10);
        drop(first);
        assert_eq!(allowance.taken(), 4);
        assert!(second.more(6));
        drop(second);
        assert_eq!(allowance.taken(), 0);
    }
}
