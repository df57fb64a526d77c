//! Work under a semaphore's permit, in a guest: acquire, run, always release.

use crate::semaphore::{self, AcquireOptions, AcquireOutcome, Holder, Permit};

/// What [`with_permit`] came to, when the store answered.
#[derive(Debug)]
pub enum Admitted<T> {
    /// The work ran holding a permit, which was then released (a release
    /// the store did not answer leaves the permit to its TTL).
    Done(T),
    /// Every place was taken; the work did not run. Carries the permit
    /// that expires first.
    Full(Holder),
}

/// Acquire a permit of (`id`, `resource`) under `limit` with `options`, run
/// `work` with it, and release it. `Admitted::Full` when every place stayed
/// taken; `Err` when the acquire failed (`unavailable`: neither admitted nor
/// full as far as can be known, or an invalid argument), and then `work`
/// did not run. The permit is not extended while `work` runs: give a TTL
/// longer than the work, or call `semaphore::extend` between its steps.
pub fn with_permit<T>(
    id: &str,
    resource: &str,
    limit: u32,
    options: AcquireOptions,
    work: impl FnOnce(&Permit) -> T,
) -> Result<Admitted<T>, semaphore::Error> {
    let permit = match semaphore::acquire(id, resource, limit, options)? {
        AcquireOutcome::Acquired(permit) => permit,
        AcquireOutcome::Busy(first) => return Ok(Admitted::Full(first)),
    };
    let output = work(&permit);
    // A failed release leaves the permit to its TTL; the work is done.
    let _ = semaphore::release(&permit);
    Ok(Admitted::Done(output))
}
