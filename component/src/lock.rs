//! The distributed lock: `coord:sync/lock`.
//!
//! A lock (`id`, `resource`) is one entry, [`keys::LOCK_HOLDER_KEY`], in a
//! partition of its own. Its value is the holder's owner token and its store
//! revision is the holder's fence, so:
//!
//! - acquire is a create-if-absent with the TTL (one store request);
//! - release is a delete guarded by (fence, owner) (one request);
//! - extend is a touch guarded by (fence, owner) (one request), which renews
//!   the TTL without a new revision, so the fence stays the same;
//! - a waiter blocks in the store's `wait-then-put` on the holder's revision,
//!   so the release (a delete, hence a new revision) or the expiry ends the
//!   wait, and its next create-if-absent runs right then, in the same request.
//!
//! Fences are strictly increasing because store revisions are: every later
//! acquisition is a later write to the same partition.

use crate::bindings::exports::coord::sync::lock::{
    AcquireOptions, AcquireOutcome, Error, ExtendOutcome, HeldLock, Holder, InvalidArgument, Retry,
    WaitPolicy,
};
use crate::keys::{self, LOCK_HOLDER_KEY};
use crate::store::{
    Condition, Entropy, Entry, Guard, Outcome, ReadReply, Store, StoreError, WriteReply,
};
use crate::validate::{self, Invalid, MAX_ID_BYTES, MAX_NAME_BYTES};

/// The TTL when `acquire-options.ttl-ms` is not given (seed 001: 30 s).
pub const DEFAULT_TTL_MS: u64 = 30_000;
/// The wait when `acquire-options.wait` is not given (seed 000: the first
/// attempt and up to ten retries, 200 ms apart: 2 s of store time).
pub const DEFAULT_RETRY: Retry = Retry {
    max_attempts: 11,
    delay_ms: 200,
};
/// The most attempts a `wait-policy.attempts` may ask for.
pub const MAX_ATTEMPTS: u32 = 1000;
/// The longest delay between attempts, in milliseconds.
pub const MAX_DELAY_MS: u64 = 60_000;

/// `From<$policy> for lock::WaitPolicy`, for an interface whose wait policy
/// mirrors the lock's case for case (the semaphore's, the read-write
/// lock's): it gets the same defaults, checks and patience.
macro_rules! wait_policy_as_locks {
    ($policy:ident) => {
        impl From<$policy> for crate::bindings::exports::coord::sync::lock::WaitPolicy {
            fn from(policy: $policy) -> Self {
                use crate::bindings::exports::coord::sync::lock as theirs;
                match policy {
                    $policy::NoWait => theirs::WaitPolicy::NoWait,
                    $policy::Attempts(retry) => theirs::WaitPolicy::Attempts(theirs::Retry {
                        max_attempts: retry.max_attempts,
                        delay_ms: retry.delay_ms,
                    }),
                    $policy::Timeout(ms) => theirs::WaitPolicy::Timeout(ms),
                }
            }
        }
    };
}
pub(crate) use wait_policy_as_locks;

/// The lock operations over a store and a source of randomness.
pub struct Locks<S, E> {
    store: S,
    entropy: E,
}

crate::validate::interface_errors!(Error, InvalidArgument);

/// How long, and how many more times, an acquire keeps trying.
///
/// The budget is store time, counted from the first attempt's reply: a
/// wake-up that finds the lock still held (another waiter took it first, the
/// holder extended, the store woke every waiter of the partition) costs only
/// the time it took, never the rest of the budget. Outside testers saw four
/// contending processes give up after 0.6-0.8 s of a 2 s default when every
/// wake-up spent an attempt.
#[derive(Debug)]
pub(crate) struct Patience {
    /// Attempts still owed after the ones made, whatever the time.
    attempts_left: u32,
    /// The longest single wait (`delay-ms`); `None` waits out the budget.
    slice_ms: Option<u64>,
    /// Store time to keep trying for, from the first reply.
    budget_ms: u64,
    /// The first reply's store time plus the budget, once known.
    deadline: Option<u64>,
}

impl Patience {
    pub(crate) fn new(policy: WaitPolicy) -> Self {
        match policy {
            WaitPolicy::NoWait => Patience {
                attempts_left: 0,
                slice_ms: Some(0),
                budget_ms: 0,
                deadline: None,
            },
            WaitPolicy::Attempts(retry) => {
                let retries = retry.max_attempts.saturating_sub(1);
                Patience {
                    attempts_left: retries,
                    slice_ms: Some(retry.delay_ms),
                    budget_ms: u64::from(retries).saturating_mul(retry.delay_ms),
                    deadline: None,
                }
            }
            WaitPolicy::Timeout(timeout_ms) => Patience {
                attempts_left: 0,
                slice_ms: None,
                budget_ms: timeout_ms,
                deadline: None,
            },
        }
    }

    /// After a busy attempt whose reply came at store time `now`: how long to
    /// wait for a change before the next attempt, or `None` to give up. It
    /// gives up only once the budget has passed and every owed attempt was
    /// made, and never asks to wait past the deadline once none is owed.
    pub(crate) fn next_wait(&mut self, now: u64) -> Option<u64> {
        let deadline = *self
            .deadline
            .get_or_insert(now.saturating_add(self.budget_ms));
        let owed = self.attempts_left > 0;
        self.attempts_left = self.attempts_left.saturating_sub(1);
        if now >= deadline {
            // Time is up; a schedule whose waits ran short (delay 0, or a
            // store that answered late) still makes the attempts it promised.
            return owed.then(|| self.slice_ms.unwrap_or(0));
        }
        let rest = deadline - now;
        Some(self.slice_ms.map_or(rest, |slice| slice.min(rest)))
    }
}

impl<S: Store, E: Entropy> Locks<S, E> {
    /// Lock operations on `store`, minting owner tokens from `entropy`.
    pub fn new(store: S, entropy: E) -> Self {
        Locks { store, entropy }
    }

    /// The store these operations use.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// `acquire` of `coord:sync/lock`.
    pub fn acquire(
        &self,
        id: &str,
        resource: &str,
        options: AcquireOptions,
    ) -> Result<AcquireOutcome, Error> {
        check_names(id, resource, "id", "resource")?;
        let ttl_ms = options.ttl_ms.unwrap_or(DEFAULT_TTL_MS);
        validate::ttl("options.ttl-ms", ttl_ms)?;
        let policy = options.wait.unwrap_or(WaitPolicy::Attempts(DEFAULT_RETRY));
        check_wait(&policy)?;

        let partition = keys::lock_partition(id, resource);
        let owner = hex(&self.entropy.random_16());
        let mut patience = Patience::new(policy);
        let first = self.store.put(
            &partition,
            LOCK_HOLDER_KEY,
            owner.as_bytes(),
            Some(ttl_ms),
            &Condition::Absent,
        );
        let mut reply = self.or_take_back(first, &partition, &owner)?;
        loop {
            let current = match reply.outcome {
                Outcome::Applied(entry) => entry,
                // This call's own token already holds the lock: an earlier
                // attempt of this call applied and its reply was lost (a
                // request the host retried). The token is unguessable and
                // minted per call, so nobody else can hold it.
                Outcome::Conflict(Some(current)) if current.value == owner.as_bytes() => current,
                Outcome::Conflict(Some(current)) => {
                    check_owner_token(&current)?;
                    let holder = holder(&current, reply.now)?;
                    let Some(wait_ms) = patience.next_wait(reply.now) else {
                        return Ok(AcquireOutcome::Busy(holder));
                    };
                    // Wake on the release (a new revision) or at the holder's
                    // expiry, whichever comes first, and try again at once: the
                    // store sends the attempt with the wait, so it runs the
                    // moment the wait ends.
                    // At least 1 ms: a holder the store answered at its
                    // expiry would otherwise be tried again with no wait,
                    // again and again until the deadline.
                    let wait_ms = wait_ms.min(holder.remaining_ms.max(1));
                    let next = self.store.wait_then_put(
                        &partition,
                        LOCK_HOLDER_KEY,
                        owner.as_bytes(),
                        Some(ttl_ms),
                        &Condition::Absent,
                        current.revision,
                        wait_ms,
                    );
                    reply = self.or_take_back(next, &partition, &owner)?;
                    continue;
                }
                Outcome::Conflict(None) => {
                    return Err(Error::Internal(
                        "create-if-absent failed but the store reported no entry".into(),
                    ));
                }
            };
            let expires_at = match granted(&current, &owner, reply.now) {
                Ok(expires_at) => expires_at,
                Err(broken) => {
                    // The store broke its contract, but it may have written
                    // our token: take back exactly that, never a grant.
                    self.take_back(&partition, &owner);
                    return Err(broken);
                }
            };
            return Ok(AcquireOutcome::Acquired(HeldLock {
                id: id.to_string(),
                resource: resource.to_string(),
                owner,
                fence: current.revision,
                ttl_ms,
                expires_at,
            }));
        }
    }

    /// Pass an attempt's reply on; when the store failed, first take back
    /// what the attempt may have written.
    ///
    /// An `unavailable` put may still apply: a request that timed out at
    /// the host runs when the store wakes. Its owner token was minted by
    /// this call alone, so a read that finds that token holding the lock
    /// proves the attempt applied, and a delete guarded by its revision and
    /// token frees exactly that acquisition, never another owner's. Both
    /// travel after the attempt (on Redis, on the same connection, which
    /// runs commands in order), so the lock is free again within a round
    /// trip of the store's recovery instead of a ghost holder keeping it
    /// for the whole TTL. Whatever the error: any failed write may have
    /// applied (the store contract says so of every error), and an acquire
    /// that answers `internal` promises to free what it wrote. Best effort
    /// and bounded: one read and at most one delete, whose failures leave
    /// the original error to the caller.
    fn or_take_back(
        &self,
        reply: Result<WriteReply, StoreError>,
        partition: &str,
        owner: &str,
    ) -> Result<WriteReply, Error> {
        reply.map_err(|error| {
            self.take_back(partition, owner);
            error.into()
        })
    }

    /// Free the lock if this call's `owner` token holds it: one read, and a
    /// delete guarded by the revision and token it found. Best effort: its
    /// own failures are ignored (the caller reports the first error).
    fn take_back(&self, partition: &str, owner: &str) {
        if let Ok(ReadReply {
            entry: Some(entry), ..
        }) = self.store.get(partition, LOCK_HOLDER_KEY)
            && entry.value == owner.as_bytes()
        {
            let _ = self.store.delete(
                partition,
                LOCK_HOLDER_KEY,
                &Condition::RevisionAndValue(Guard {
                    revision: entry.revision,
                    value: entry.value,
                }),
            );
        }
    }

    /// `is-held` of `coord:sync/lock`: whether this acquisition (owner and
    /// fence) still holds the lock, from one read.
    ///
    /// Decided from the reply's `now` and the entry's expiry, whatever else
    /// the store said: an entry it returned at or past its expiry is not
    /// held (outside testers' store answered one, and this said `true`).
    pub fn is_held(&self, lock: &HeldLock) -> Result<bool, Error> {
        check_held(lock)?;
        let reply = self.store.get(
            &keys::lock_partition(&lock.id, &lock.resource),
            LOCK_HOLDER_KEY,
        )?;
        Ok(reply.entry.is_some_and(|entry| {
            entry.revision == lock.fence
                && entry.value == lock.owner.as_bytes()
                && entry.expires_at.is_some_and(|end| end > reply.now)
        }))
    }

    /// `release` of `coord:sync/lock`: `true` when this call freed the lock.
    pub fn release(&self, lock: &HeldLock) -> Result<bool, Error> {
        check_held(lock)?;
        let partition = keys::lock_partition(&lock.id, &lock.resource);
        let reply = self
            .store
            .delete(&partition, LOCK_HOLDER_KEY, &owned_by(lock))?;
        Ok(matches!(reply.outcome, Outcome::Applied(_)))
    }

    /// `extend` of `coord:sync/lock`.
    pub fn extend(&self, lock: &HeldLock, ttl_ms: Option<u64>) -> Result<ExtendOutcome, Error> {
        check_held(lock)?;
        let ttl_ms = ttl_ms.unwrap_or(lock.ttl_ms);
        validate::ttl("ttl-ms", ttl_ms)?;
        let partition = keys::lock_partition(&lock.id, &lock.resource);
        let reply = self
            .store
            .touch(&partition, LOCK_HOLDER_KEY, ttl_ms, &owned_by(lock))?;
        match reply.outcome {
            Outcome::Applied(entry) => Ok(ExtendOutcome::Extended(HeldLock {
                ttl_ms,
                expires_at: granted(&entry, &lock.owner, reply.now)?,
                ..lock.clone()
            })),
            Outcome::Conflict(_) => Ok(ExtendOutcome::Lost),
        }
    }

    /// `inspect` of `coord:sync/lock`.
    pub fn inspect(&self, id: &str, resource: &str) -> Result<Option<Holder>, Error> {
        check_names(id, resource, "id", "resource")?;
        let reply = self
            .store
            .get(&keys::lock_partition(id, resource), LOCK_HOLDER_KEY)?;
        reply
            .entry
            // An entry returned at or past its expiry holds nothing.
            .filter(|entry| entry.expires_at.is_none_or(|end| end > reply.now))
            .map(|entry| {
                check_owner_token(&entry)?;
                holder(&entry, reply.now)
            })
            .transpose()
    }

    /// `force-release` of `coord:sync/lock`: `true` when a holder was removed.
    pub fn force_release(&self, id: &str, resource: &str) -> Result<bool, Error> {
        check_names(id, resource, "id", "resource")?;
        let reply = self.store.delete(
            &keys::lock_partition(id, resource),
            LOCK_HOLDER_KEY,
            &Condition::Always,
        )?;
        Ok(matches!(reply.outcome, Outcome::Applied(_)))
    }
}

/// The condition that only this acquisition satisfies.
fn owned_by(lock: &HeldLock) -> Condition {
    Condition::RevisionAndValue(Guard {
        revision: lock.fence,
        value: lock.owner.as_bytes().to_vec(),
    })
}

fn expiry(entry: &Entry) -> Result<u64, Error> {
    entry
        .expires_at
        .ok_or_else(|| Error::Internal("a lock entry has no expiry".into()))
}

/// The expiry of the holding a write just granted to `owner`, checked: the
/// store must have written this owner's token at a revision above 0 (a
/// fence is never 0) and kept it alive past `now`. Anything else is the
/// store breaking its contract: `internal`, never a grant.
fn granted(entry: &Entry, owner: &str, now: u64) -> Result<u64, Error> {
    let broken = |what: &str| {
        Err(Error::Internal(format!(
            "the store granted a lock {what} (revision {})",
            entry.revision
        )))
    };
    if entry.revision == 0 {
        return broken("at revision 0");
    }
    if entry.value != owner.as_bytes() {
        return broken("to another owner");
    }
    match entry.expires_at {
        None => broken("with no expiry"),
        Some(end) if end <= now => broken("that had already expired"),
        Some(end) => Ok(end),
    }
}

/// A lock entry holds an owner token, as `acquire` wrote it; anything else
/// (a key written by another program, a corrupted value) is the store
/// breaking its contract, not a holder to wait for.
fn check_owner_token(entry: &Entry) -> Result<(), Error> {
    if entry.revision == 0 {
        return Err(Error::Internal(
            "a lock entry at revision 0 (a fence is never 0)".into(),
        ));
    }
    if is_owner_token(&entry.value) {
        return Ok(());
    }
    Err(Error::Internal(format!(
        "the lock entry is not an owner token ({} bytes at revision {})",
        entry.value.len(),
        entry.revision
    )))
}

/// 32 lowercase hex digits.
pub(crate) fn is_owner_token(bytes: &[u8]) -> bool {
    bytes.len() == 32 && bytes.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn holder(entry: &Entry, now: u64) -> Result<Holder, Error> {
    Ok(Holder {
        fence: entry.revision,
        remaining_ms: expiry(entry)?.saturating_sub(now),
    })
}

pub(crate) fn check_names(
    id: &str,
    resource: &str,
    id_field: &str,
    resource_field: &str,
) -> Result<(), Invalid> {
    validate::name(id_field, id, MAX_ID_BYTES)?;
    validate::name(resource_field, resource, MAX_NAME_BYTES)
}

pub(crate) fn check_wait(policy: &WaitPolicy) -> Result<(), Invalid> {
    match policy {
        WaitPolicy::NoWait => Ok(()),
        WaitPolicy::Attempts(retry) => {
            validate::in_range(
                "options.wait.attempts.max-attempts",
                u64::from(retry.max_attempts),
                1,
                u64::from(MAX_ATTEMPTS),
            )?;
            validate::in_range(
                "options.wait.attempts.delay-ms",
                retry.delay_ms,
                0,
                MAX_DELAY_MS,
            )
        }
        WaitPolicy::Timeout(ms) => {
            validate::in_range("options.wait.timeout", *ms, 0, validate::MAX_WAIT_MS)
        }
    }
}

/// A held-lock record must be one `acquire` could have returned; a forged or
/// corrupted one is rejected by name before the store is asked.
fn check_held(lock: &HeldLock) -> Result<(), Invalid> {
    check_held_record(
        HeldRecord::Lock,
        (&lock.id, &lock.resource, &lock.owner),
        lock.fence,
        lock.ttl_ms,
    )
}

/// The kinds of record a caller hands back to prove what it holds (a lock,
/// a semaphore's permit, a read-write lock's grant), for the field names
/// their errors give.
#[derive(Clone, Copy)]
pub(crate) enum HeldRecord {
    Lock,
    Permit,
    Grant,
}

impl HeldRecord {
    /// The names of its id, resource, owner, fence and TTL fields.
    fn fields(self) -> [&'static str; 5] {
        match self {
            HeldRecord::Lock => [
                "lock.id",
                "lock.resource",
                "lock.owner",
                "lock.fence",
                "lock.ttl-ms",
            ],
            HeldRecord::Permit => [
                "permit.id",
                "permit.resource",
                "permit.owner",
                "permit.fence",
                "permit.ttl-ms",
            ],
            HeldRecord::Grant => [
                "grant.id",
                "grant.resource",
                "grant.owner",
                "grant.fence",
                "grant.ttl-ms",
            ],
        }
    }
}

/// The fields every held record shares, checked as `acquire` made them:
/// valid names, an owner token of 32 lowercase hex digits, a fence above 0
/// and a TTL in range. Each error names the record's own field.
pub(crate) fn check_held_record(
    record: HeldRecord,
    (id, resource, owner): (&str, &str, &str),
    fence: u64,
    ttl_ms: u64,
) -> Result<(), Invalid> {
    let [
        id_field,
        resource_field,
        owner_field,
        fence_field,
        ttl_field,
    ] = record.fields();
    check_names(id, resource, id_field, resource_field)?;
    if !is_owner_token(owner.as_bytes()) {
        return Err(Invalid::new(owner_field, "must be 32 lowercase hex digits"));
    }
    if fence == 0 {
        return Err(Invalid::new(fence_field, "must be greater than 0"));
    }
    validate::ttl(ttl_field, ttl_ms)
}

/// Lowercase hex, two digits per byte. By table rather than `format!`: the
/// formatting machinery was a fifth of the guest's time in an acquire (`perf`).
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

#[cfg(test)]
mod tests;
