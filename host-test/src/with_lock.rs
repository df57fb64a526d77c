//! Run work under a lock: acquire, keep the lock alive while the work runs,
//! say when it was lost, and always release — seed 000's `withLock`, seed
//! 001's `run()`, seed 002's `Lock.try` with `refresh: true`, Redisson's
//! watchdog.
//!
//! ```no_run
//! # async fn demo(runtime: &coord_host::Runtime) -> Result<(), coord_host::with_lock::WithLockError> {
//! use coord_host::with_lock::{Ran, WithLock};
//! use coord_host::lock::AcquireOptions;
//!
//! let how = WithLock::refreshing(AcquireOptions { ttl_ms: Some(10_000), wait: None });
//! let ran = runtime
//!     .with_lock("reports.nightly", "2026-12-01", how, |guard| async move {
//!         for chunk in 0..100 {
//!             if guard.is_lost() {
//!                 return Err("lost the lock");   // stop writing: someone else may hold it
//!             }
//!             // ... write chunk, presenting guard.fence() at the write boundary ...
//!             # let _ = chunk;
//!         }
//!         Ok(())
//!     })
//!     .await?;
//! match ran {
//!     Ran::Done(result) => println!("finished: {result:?}"),
//!     Ran::Busy(holder) => println!("someone else runs it (fence {})", holder.fence),
//! }
//! # Ok(()) }
//! ```
//!
//! The lock is extended every [`WithLock::refresh_every`] (a third of the
//! TTL by default) by a refresher that runs beside the work, on an instance
//! of its own. An extend that answers `lost`, or a store that stays
//! unreachable until the lock must be presumed expired, cancels the
//! [`LockGuard::lost`] token, and the run returns [`WithLockError::Lost`]
//! once the work has returned. The lock is presumed expired one TTL after
//! the last successful extend (or the acquire) was *sent*: the store applied
//! it later than that, so the real expiry is never earlier.
//!
//! The refresher stops the moment the work ends, before the release is
//! sent, so no extend follows a release. A panicking work is released, then
//! its panic resumed; a run that is itself cancelled (its future dropped)
//! releases from a task it spawns, best effort.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt as _;
use tokio::time::Instant;
pub use tokio_util::sync::CancellationToken;

use crate::lock::{AcquireOptions, AcquireOutcome, Error, ExtendOutcome, HeldLock, Holder};
use crate::{Instance, Runtime};

/// How to acquire, and whether to keep the lock alive while the work runs.
#[derive(Debug, Clone, Copy)]
pub struct WithLock {
    /// How to acquire it (its TTL and wait policy), as for `acquire`.
    pub options: AcquireOptions,
    /// Extend the lock this often while the work runs. `None`: no refresh;
    /// the work must finish within the TTL, and the lost signal fires when
    /// the TTL runs out.
    pub refresh_every: Option<Duration>,
}

impl WithLock {
    /// Acquire with `options` and extend every third of the TTL.
    pub fn refreshing(options: AcquireOptions) -> WithLock {
        let ttl = ttl_of(&options);
        WithLock {
            options,
            refresh_every: Some(ttl / 3),
        }
    }

    /// Acquire with `options` and never extend.
    pub fn once(options: AcquireOptions) -> WithLock {
        WithLock {
            options,
            refresh_every: None,
        }
    }
}

/// What the work is given: the lock it runs under, and the lost signal.
#[derive(Debug, Clone)]
pub struct LockGuard {
    lock: HeldLock,
    lost: CancellationToken,
}

impl LockGuard {
    /// The lock as acquired (its fence never changes while it is held).
    pub fn lock(&self) -> &HeldLock {
        &self.lock
    }

    /// The fence to present at the write boundary.
    pub fn fence(&self) -> u64 {
        self.lock.fence
    }

    /// Cancelled when the lock is lost: await `lost().cancelled()`, or poll
    /// [`LockGuard::is_lost`] between steps, and stop writing.
    pub fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    /// Whether the lock has been lost (or must be presumed so).
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }
}

/// What a run under a lock came to, when nothing failed.
#[derive(Debug)]
pub enum Ran<T> {
    /// The work ran to the end holding the lock, and the lock was released.
    /// (A release the store did not answer leaves the lock to its TTL.)
    Done(T),
    /// The lock was held by someone else; the work did not run.
    Busy(Holder),
}

/// Why the lock was lost while the work ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostBecause {
    /// An extend (or the release) found another owner or no lock: it
    /// expired, or was force-released, and perhaps taken.
    Taken,
    /// The store stayed unreachable until the lock had to be presumed
    /// expired.
    Unreachable,
    /// No refresh was asked for and the TTL ran out while the work ran.
    Expired,
}

/// Why a run under a lock failed.
#[derive(Debug)]
pub enum WithLockError {
    /// The lock was lost while the work ran: its writes after that moment
    /// were not protected by the lock (the fence check at the write
    /// boundary still refuses them once a newer holder wrote). The work ran
    /// to its end; its result is dropped.
    Lost {
        /// The lost acquisition's fence.
        fence: u64,
        /// Why.
        because: LostBecause,
    },
    /// The acquire failed (`unavailable`: neither acquired nor busy, as far
    /// as can be known; or an invalid argument). The work did not run.
    Lock(Error),
    /// A trap in the component or the host (a bug, never caller input).
    Trap(wasmtime::Error),
}

impl std::fmt::Display for WithLockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WithLockError::Lost { fence, because } => {
                write!(
                    f,
                    "the lock (fence {fence}) was lost while the work ran: {because:?}"
                )
            }
            WithLockError::Lock(error) => write!(f, "acquiring the lock failed: {error:?}"),
            WithLockError::Trap(trap) => write!(f, "trap: {trap:#}"),
        }
    }
}

impl std::error::Error for WithLockError {}

impl Runtime {
    /// Acquire (`id`, `resource`) as `how` says, run `work` under it, and
    /// release it — also when `work` returns early, panics (the panic is
    /// resumed after the release) or is cancelled. `Ran::Busy` when someone
    /// else held it; [`WithLockError::Lost`] when the lock was lost while
    /// `work` ran (see the module's documentation).
    pub async fn with_lock<T, F, Fut>(
        &self,
        id: &str,
        resource: &str,
        how: WithLock,
        work: F,
    ) -> Result<Ran<T>, WithLockError>
    where
        F: FnOnce(LockGuard) -> Fut,
        Fut: Future<Output = T>,
    {
        let mut instance = self.instantiate().await.map_err(WithLockError::Trap)?;
        let sent = Instant::now();
        let lock = match instance
            .acquire(id, resource, how.options)
            .await
            .map_err(WithLockError::Trap)?
            .map_err(WithLockError::Lock)?
        {
            AcquireOutcome::Acquired(lock) => lock,
            AcquireOutcome::Busy(holder) => return Ok(Ran::Busy(holder)),
        };
        let mut release_on_drop = ReleaseOnDrop {
            runtime: self.clone(),
            lock: Some(lock.clone()),
        };
        let lost = CancellationToken::new();
        let guard = LockGuard {
            lock: lock.clone(),
            lost: lost.clone(),
        };
        // Boxed so that it can be dropped (not merely left unpolled) below.
        let mut keeper = Box::pin(keep_alive(
            instance,
            lock.clone(),
            sent,
            how.refresh_every,
            lost,
        ));
        let work = AssertUnwindSafe(work(guard)).catch_unwind();
        tokio::pin!(work);
        let (output, lost_because) = tokio::select! {
            output = &mut work => (output, None),
            because = &mut keeper => ((&mut work).await, Some(because)),
        };
        // Dropping the refresher here, before the release is sent, is what
        // keeps any extend from following the release.
        drop(keeper);
        let released = release(self, &lock).await;
        release_on_drop.lock = None;
        let output = match output {
            Ok(output) => output,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        let because = match (lost_because, released) {
            (Some(because), _) => because,
            (None, Ok(false)) => LostBecause::Taken,
            (None, Ok(true) | Err(_)) => return Ok(Ran::Done(output)),
        };
        Err(WithLockError::Lost {
            fence: lock.fence,
            because,
        })
    }
}

/// The TTL `acquire` will use for `options`.
fn ttl_of(options: &AcquireOptions) -> Duration {
    Duration::from_millis(
        options
            .ttl_ms
            .unwrap_or(coord_component::lock::DEFAULT_TTL_MS),
    )
}

/// Keep `lock` alive until the lock is lost; returns why. Runs until
/// dropped otherwise. `acquired_at` is when the acquire was sent.
async fn keep_alive(
    mut instance: Instance,
    mut lock: HeldLock,
    acquired_at: Instant,
    every: Option<Duration>,
    lost: CancellationToken,
) -> LostBecause {
    let ttl = Duration::from_millis(lock.ttl_ms);
    // The lock must be presumed expired from here on.
    let mut expires = acquired_at + ttl;
    let Some(every) = every.filter(|every| !every.is_zero()) else {
        tokio::time::sleep_until(expires).await;
        lost.cancel();
        return LostBecause::Expired;
    };
    // After an unavailable extend, try again this soon.
    let retry = (every / 10).clamp(Duration::from_millis(5), Duration::from_secs(1));
    let mut next = Instant::now() + every;
    loop {
        tokio::time::sleep_until(next.min(expires)).await;
        if Instant::now() >= expires {
            lost.cancel();
            return LostBecause::Unreachable;
        }
        let sent = Instant::now();
        let extended = tokio::select! {
            extended = instance.extend(&lock, None) => extended,
            // A store that does not answer in time cannot keep the lock.
            _ = tokio::time::sleep_until(expires) => {
                lost.cancel();
                return LostBecause::Unreachable;
            }
        };
        match extended {
            Ok(Ok(ExtendOutcome::Extended(renewed))) => {
                lock = renewed;
                expires = sent + ttl;
                next = sent + every;
            }
            Ok(Ok(ExtendOutcome::Lost)) => {
                lost.cancel();
                return LostBecause::Taken;
            }
            Ok(Err(Error::Unavailable(_))) => next = Instant::now() + retry,
            // An argument the acquire accepted cannot become invalid, and a
            // trap leaves nothing to extend with: the lock cannot be kept.
            Ok(Err(_)) | Err(_) => {
                lost.cancel();
                return LostBecause::Unreachable;
            }
        }
    }
}

/// Release `lock` from a fresh instance (the refresher's may have been
/// dropped mid-call): whether this freed it.
async fn release(runtime: &Runtime, lock: &HeldLock) -> Result<bool, ()> {
    let mut instance = runtime.instantiate().await.map_err(drop)?;
    match instance.release(lock).await {
        Ok(Ok(released)) => Ok(released),
        _ => Err(()),
    }
}

/// Releases the lock from a spawned task if the run is dropped before it
/// released the lock itself (the run was cancelled).
struct ReleaseOnDrop {
    runtime: Runtime,
    lock: Option<HeldLock>,
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        let Some(lock) = self.lock.take() else {
            return;
        };
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let runtime = self.runtime.clone();
            handle.spawn(async move {
                let _ = release(&runtime, &lock).await;
            });
        }
    }
}
