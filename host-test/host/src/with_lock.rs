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
//! let how = WithLock::refreshing(AcquireOptions::new().ttl_ms(10_000));
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
//! the last successful extend was *sent*: the store applied it later than
//! that, so the real expiry is never earlier.
//!
//! After the acquire, the same bound would be wrong: an acquire that waits
//! for another holder's release is one store call (`wait-then-put`; on
//! Redis the put runs on the server when the release wakes it), sent before
//! the wait, so an acquire that waited longer than its TTL once handed the
//! refresher a lock it already presumed expired, and the run was reported
//! lost while it held the lock. The lock's own expiry (`expires-at`, on the
//! store's clock) is used instead, placed on the host's clock by the
//! acquire's store replies: a reply's time `now` was read after its call was
//! sent, so store time `t` came no earlier than `sent + (t - now)` on the
//! host (`StoreClock`). Only differences of one clock's readings are
//! used, so an offset between the host's clock and the store's changes
//! nothing; the presumption is never later than the real expiry, and early
//! by at most the time from sending one of the acquire's calls to the store
//! reading its clock (for the first attempt, about half a round trip). It
//! is kept between one TTL after the acquire was sent and one TTL after it
//! returned, which hold whatever the store's clock does.
//!
//! The refresher stops the moment the work ends, before the release is
//! sent, so no extend follows a release. A panicking work is released, then
//! its panic resumed; a run that is itself cancelled (its future dropped)
//! releases from a task it spawns, best effort.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::FutureExt as _;
use tokio::time::Instant;
pub use tokio_util::sync::CancellationToken;

use crate::backend::{
    Backend, ChangesReply, Condition, ListReply, MeterReply, MeterRequest, Millis, ReadReply,
    StoreError, WriteReply,
};
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
        // The acquire's instance reads the store's clock off its replies.
        let watch = Arc::new(ClockWatch::new(self.backend.clone()));
        let watched = Runtime {
            backend: watch.clone(),
            ..self.clone()
        };
        let mut instance = watched.instantiate().await.map_err(WithLockError::Trap)?;
        let sent = Instant::now();
        let acquired = instance.lock().acquire(id, resource, how.options).await;
        let returned = Instant::now();
        let lock = match acquired
            .map_err(WithLockError::Trap)?
            .map_err(WithLockError::Lock)?
        {
            AcquireOutcome::Acquired(lock) => lock,
            AcquireOutcome::Busy(holder) => return Ok(Ran::Busy(holder)),
        };
        let expires = presumed_expiry(&lock, watch.reading(), sent, returned);
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
            expires,
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

/// When a lock just acquired must be presumed expired, on the host's
/// clock: its expiry on the store's clock placed on the host's by `clock`
/// (the earliest it can come), kept between one TTL after the acquire was
/// `sent` (the store took the lock after that) and one TTL after it
/// `returned` (the store took it before). See the module's documentation.
fn presumed_expiry(
    lock: &HeldLock,
    clock: Option<StoreClock>,
    sent: Instant,
    returned: Instant,
) -> Instant {
    let ttl = Duration::from_millis(lock.ttl_ms);
    let earliest = sent + ttl;
    let latest = returned + ttl;
    clock
        .and_then(|clock| clock.earliest(lock.expires_at))
        .map_or(earliest, |at| at.clamp(earliest, latest))
}

/// Keep `lock` alive until the lock is lost; returns why. Runs until
/// dropped otherwise. `expires` is when the lock, as acquired, must be
/// presumed expired.
async fn keep_alive(
    mut instance: Instance,
    mut lock: HeldLock,
    mut expires: Instant,
    every: Option<Duration>,
    lost: CancellationToken,
) -> LostBecause {
    let ttl = Duration::from_millis(lock.ttl_ms);
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
            extended = instance.lock().extend(&lock, None) => extended,
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
    match instance.lock().release(lock).await {
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

/// What a store reply says of the store's clock against the host's: the
/// store read its time `now` after the call was `sent` (on the host's
/// monotonic clock), so any store time `t` came no earlier than
/// `sent + (t - now)` on the host. The readings of one store clock are only
/// ever subtracted from each other, never compared with the host's, so an
/// offset between the two clocks changes nothing; the clocks are taken to
/// run at the same rate (a drift of parts per million is microseconds over
/// a TTL).
#[derive(Clone, Copy, Debug)]
struct StoreClock {
    sent: Instant,
    now: Millis,
}

impl StoreClock {
    /// The earliest host instant at which the store's clock can have read
    /// `at` (`None` when that cannot be said: an instant too far off).
    fn earliest(self, at: Millis) -> Option<Instant> {
        if at >= self.now {
            self.sent.checked_add(Duration::from_millis(at - self.now))
        } else {
            self.sent.checked_sub(Duration::from_millis(self.now - at))
        }
    }

    /// Of two readings, the one that places the store's times later: both
    /// are lower bounds, so the later is the tighter.
    fn tighter(self, other: StoreClock) -> StoreClock {
        let at = self.now.max(other.now);
        match (self.earliest(at), other.earliest(at)) {
            (Some(mine), Some(theirs)) if theirs > mine => other,
            _ => self,
        }
    }
}

/// A backend that passes every call on and keeps the tightest
/// `StoreClock` its replies gave: the acquire's instance in a run, whose
/// calls all go to the lock's partition, so to one clock.
struct ClockWatch {
    inner: Arc<dyn Backend>,
    reading: Mutex<Option<StoreClock>>,
}

impl ClockWatch {
    fn new(inner: Arc<dyn Backend>) -> ClockWatch {
        ClockWatch {
            inner,
            reading: Mutex::new(None),
        }
    }

    /// The tightest reading so far, if any call was answered.
    fn reading(&self) -> Option<StoreClock> {
        self.reading.lock().ok().and_then(|reading| *reading)
    }

    /// Keep what `reply` (to a call sent at `sent`) says of the store's
    /// clock, and pass it on.
    fn saw<T>(
        &self,
        sent: Instant,
        reply: Result<T, StoreError>,
        now: impl FnOnce(&T) -> Millis,
    ) -> Result<T, StoreError> {
        if let Ok(answer) = &reply
            && let Ok(mut reading) = self.reading.lock()
        {
            let seen = StoreClock {
                sent,
                now: now(answer),
            };
            *reading = Some(reading.map_or(seen, |kept| kept.tighter(seen)));
        }
        reply
    }
}

// Every method is passed on, the provided ones too: `wait_then_put` keeps
// the backend's own (on Redis, the put sent with the wait).
#[async_trait]
impl Backend for ClockWatch {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    async fn now(&self) -> Result<Millis, StoreError> {
        let sent = Instant::now();
        self.saw(sent, self.inner.now().await, |now| *now)
    }
    async fn get(&self, partition: &str, key: &str) -> Result<ReadReply, StoreError> {
        let sent = Instant::now();
        self.saw(sent, self.inner.get(partition, key).await, |r| r.now)
    }
    async fn list(&self, partition: &str, prefix: &str) -> Result<ListReply, StoreError> {
        let sent = Instant::now();
        self.saw(sent, self.inner.list(partition, prefix).await, |r| r.now)
    }
    async fn put(
        &self,
        partition: &str,
        key: &str,
        value: &[u8],
        ttl_ms: Option<u64>,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        let sent = Instant::now();
        let reply = self
            .inner
            .put(partition, key, value, ttl_ms, condition)
            .await;
        self.saw(sent, reply, |r| r.now)
    }
    async fn delete(
        &self,
        partition: &str,
        key: &str,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        let sent = Instant::now();
        let reply = self.inner.delete(partition, key, condition).await;
        self.saw(sent, reply, |r| r.now)
    }
    async fn touch(
        &self,
        partition: &str,
        key: &str,
        ttl_ms: u64,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        let sent = Instant::now();
        let reply = self.inner.touch(partition, key, ttl_ms, condition).await;
        self.saw(sent, reply, |r| r.now)
    }
    async fn changes(
        &self,
        partition: &str,
        after: u64,
        max: u32,
    ) -> Result<ChangesReply, StoreError> {
        let sent = Instant::now();
        let reply = self.inner.changes(partition, after, max).await;
        self.saw(sent, reply, |r| r.now)
    }
    async fn meter(
        &self,
        partition: &str,
        key: &str,
        request: &MeterRequest,
    ) -> Result<MeterReply, StoreError> {
        let sent = Instant::now();
        let reply = self.inner.meter(partition, key, request).await;
        self.saw(sent, reply, |r| r.now)
    }
    async fn wait(&self, partition: &str, after: u64, timeout_ms: u64) -> Result<u64, StoreError> {
        // A revision, no time.
        self.inner.wait(partition, after, timeout_ms).await
    }
    async fn wait_then_put(
        &self,
        partition: &str,
        key: &str,
        value: &[u8],
        ttl_ms: Option<u64>,
        condition: &Condition,
        after: u64,
        timeout_ms: u64,
    ) -> Result<WriteReply, StoreError> {
        let sent = Instant::now();
        let reply = self
            .inner
            .wait_then_put(partition, key, value, ttl_ms, condition, after, timeout_ms)
            .await;
        self.saw(sent, reply, |r| r.now)
    }
}

#[cfg(test)]
mod tests;
