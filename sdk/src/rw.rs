//! Work under a read-write lock, in a guest: acquire in one mode, run,
//! always release.

use crate::rwlock::{self, AcquireOptions, AcquireOutcome, Grant, Holder, Mode};

/// What [`with_read`] or [`with_write`] came to, when the store answered.
#[derive(Debug)]
pub enum Granted<T> {
    /// The work ran holding the grant, which was then released (a release
    /// the store did not answer leaves the grant to its TTL).
    Done(T),
    /// The lock was held in a mode that excludes this one (for a reader, a
    /// writer holding or waiting; for a writer, another writer or
    /// readers); the work did not run. Carries a holder in the way.
    Busy(Holder),
}

/// Acquire (`id`, `resource`) for reading with `options`, run `work` with
/// the grant beside any other readers, and release it. `Granted::Busy` when
/// a writer held or waited throughout; `Err` when the acquire failed
/// (`unavailable`: neither granted nor busy as far as can be known, or an
/// invalid argument), and then `work` did not run. The grant is not
/// extended while `work` runs: give a TTL longer than the work, or call
/// `rwlock::extend` between its steps.
pub fn with_read<T>(
    id: &str,
    resource: &str,
    options: AcquireOptions,
    work: impl FnOnce(&Grant) -> T,
) -> Result<Granted<T>, rwlock::Error> {
    with_mode(id, resource, Mode::Read, options, work)
}

/// Acquire (`id`, `resource`) for writing with `options`, run `work` with
/// no reader and no other writer holding it, and release it; otherwise as
/// [`with_read`]. Present `grant.fence` at the write boundary.
pub fn with_write<T>(
    id: &str,
    resource: &str,
    options: AcquireOptions,
    work: impl FnOnce(&Grant) -> T,
) -> Result<Granted<T>, rwlock::Error> {
    with_mode(id, resource, Mode::Write, options, work)
}

fn with_mode<T>(
    id: &str,
    resource: &str,
    mode: Mode,
    options: AcquireOptions,
    work: impl FnOnce(&Grant) -> T,
) -> Result<Granted<T>, rwlock::Error> {
    let grant = match rwlock::acquire(id, resource, mode, options)? {
        AcquireOutcome::Acquired(grant) => grant,
        AcquireOutcome::Busy(holder) => return Ok(Granted::Busy(holder)),
    };
    let output = work(&grant);
    // A failed release leaves the grant to its TTL; the work is done.
    let _ = rwlock::release(&grant);
    Ok(Granted::Done(output))
}
