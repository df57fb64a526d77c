//! Work under a lock, in a guest: acquire, run, always release.

use crate::lock::{self, AcquireOptions, AcquireOutcome, ExtendOutcome, HeldLock, Holder};

/// What [`with_lock`] came to, when the store answered.
#[derive(Debug)]
pub enum Ran<T> {
    /// The work ran under the lock, which was then released (a release the
    /// store did not answer leaves the lock to its TTL).
    Done(T),
    /// Someone else held the lock; the work did not run.
    Busy(Holder),
}

/// Why a lock was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostBecause {
    /// The extend found another owner or no lock: it expired or was
    /// force-released, and perhaps taken.
    Taken,
    /// The store did not answer the extend: the lock cannot be shown to be
    /// held, so it must be treated as lost (correctness over availability).
    Unreachable,
}

/// The lock a [`LockGuard`] ran under was lost: stop writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lost {
    /// The lost acquisition's fence.
    pub fence: u64,
    /// Why.
    pub because: LostBecause,
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the lock (fence {}) was lost: {:?}",
            self.fence, self.because
        )
    }
}

impl std::error::Error for Lost {}

/// The lock a [`with_lock`] work runs under.
#[derive(Debug)]
pub struct LockGuard {
    lock: HeldLock,
    lost: Option<Lost>,
}

impl LockGuard {
    /// The lock as last acquired or extended.
    pub fn lock(&self) -> &HeldLock {
        &self.lock
    }

    /// The fence to present at the write boundary.
    pub fn fence(&self) -> u64 {
        self.lock.fence
    }

    /// Extend the lock for its TTL from the store's now (one store call):
    /// call it between the steps of a job that may outlast the TTL. `Err`
    /// once the lock is lost, or when the store does not answer; from then
    /// on the work must not write, and every later call answers the same.
    pub fn keep_alive(&mut self) -> Result<(), Lost> {
        if let Some(lost) = self.lost {
            return Err(lost);
        }
        let because = match lock::extend(&self.lock, None) {
            Ok(ExtendOutcome::Extended(lock)) => {
                self.lock = lock;
                return Ok(());
            }
            Ok(ExtendOutcome::Lost) => LostBecause::Taken,
            Err(_) => LostBecause::Unreachable,
        };
        let lost = Lost {
            fence: self.lock.fence,
            because,
        };
        self.lost = Some(lost);
        Err(lost)
    }

    /// Whether [`LockGuard::keep_alive`] has found the lock lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_some()
    }
}

/// Acquire (`id`, `resource`) with `options`, run `work` under it, and
/// release it — seed 000's `withLock`. `Ran::Busy` when someone else holds
/// it; `Err` when the acquire failed (`unavailable`: neither busy nor
/// acquired as far as can be known, or an invalid argument), and then
/// `work` did not run. A lock found lost by `keep_alive` is not released
/// (it is no longer this work's).
pub fn with_lock<T>(
    id: &str,
    resource: &str,
    options: AcquireOptions,
    work: impl FnOnce(&mut LockGuard) -> T,
) -> Result<Ran<T>, lock::Error> {
    let lock = match lock::acquire(id, resource, options)? {
        AcquireOutcome::Acquired(lock) => lock,
        AcquireOutcome::Busy(holder) => return Ok(Ran::Busy(holder)),
    };
    let mut guard = LockGuard { lock, lost: None };
    let output = work(&mut guard);
    if guard.lost.is_none() {
        // A failed release leaves the lock to its TTL; the work is done.
        let _ = lock::release(&guard.lock);
    }
    Ok(Ran::Done(output))
}
