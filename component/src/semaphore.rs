//! The fenced counting semaphore: `coord:sync/semaphore`.
//!
//! A semaphore (`id`, `resource`) is a partition of its own
//! ([`keys::semaphore_partition`]); each permit is one entry of it, keyed by
//! the permit's owner token, holding the limit it was acquired under (in
//! decimal), with the permit's TTL. Its store revision is its fence. So:
//!
//! - acquire is a put under `absent-and-fewer-than(limit)`: the store writes
//!   the permit only while fewer than `limit` entries are live, in one
//!   request, and a full semaphore's conflict names the permit that expires
//!   first (the `busy` answer);
//! - release is a delete guarded by (fence, limit) of the owner's key, and
//!   extend a touch guarded the same way: one request each;
//! - a waiter blocks in the store's `wait-then-put` on the revision its full
//!   attempt's reply carried, until the first expiry that reply named, so a
//!   release or an expiry ends the wait and its conditional put runs right
//!   then in the store, where only as many succeed as places were freed.
//!
//! Fences are strictly increasing because store revisions are: every later
//! permit is a later write to the same partition.

use crate::bindings::exports::coord::sync::lock;
use crate::bindings::exports::coord::sync::semaphore::{
    AcquireOptions, AcquireOutcome, Error, ExtendOutcome, Holder, InvalidArgument, Permit, Usage,
    WaitPolicy,
};
use crate::keys;
use crate::lock::{
    DEFAULT_RETRY, DEFAULT_TTL_MS, HeldRecord, Patience, check_held_record, check_names,
    check_wait, hex, is_owner_token,
};
use crate::store::{
    Condition, Entropy, Entry, Guard, Outcome, ReadReply, Store, StoreError, WriteReply,
};
use crate::validate::{self, Invalid};

/// The largest `limit` an acquire may pass. A store may hold fewer permits
/// per semaphore (NATS: 1 000); it refuses a larger limit with `invalid`
/// naming `limit` (wit/store.wit), which [`Semaphores::acquire`] answers as
/// `invalid-argument`.
pub const MAX_LIMIT: u32 = 100_000;

/// The semaphore operations over a store and a source of randomness.
pub struct Semaphores<S, E> {
    store: S,
    entropy: E,
}

crate::validate::interface_errors!(Error, InvalidArgument);

impl<S: Store, E: Entropy> Semaphores<S, E> {
    /// Semaphore operations on `store`, minting owner tokens from `entropy`.
    pub fn new(store: S, entropy: E) -> Self {
        Semaphores { store, entropy }
    }

    /// `acquire` of `coord:sync/semaphore`.
    pub fn acquire(
        &self,
        id: &str,
        resource: &str,
        limit: u32,
        options: AcquireOptions,
    ) -> Result<AcquireOutcome, Error> {
        check_names(id, resource, "id", "resource")?;
        check_limit("limit", limit)?;
        let ttl_ms = options.ttl_ms.unwrap_or(DEFAULT_TTL_MS);
        validate::ttl("options.ttl-ms", ttl_ms)?;
        let policy = options
            .wait
            .map_or(lock::WaitPolicy::Attempts(DEFAULT_RETRY), Into::into);
        check_wait(&policy)?;

        let partition = keys::semaphore_partition(id, resource);
        let owner = hex(&self.entropy.random_16());
        let value = limit_value(limit);
        let place = Condition::AbsentAndFewerThan(limit);
        let mut patience = Patience::new(policy);
        let first = self
            .store
            .put(&partition, &owner, &value, Some(ttl_ms), &place);
        if let Err(StoreError::Invalid(why)) = &first
            && let Some(reason) = why.strip_prefix("limit: ")
        {
            // A limit above what this store holds: refused, nothing written.
            return Err(Invalid::new("limit", reason).into());
        }
        let mut reply = self.or_take_back(first, &partition, &owner, &value)?;
        loop {
            let current = match reply.outcome {
                Outcome::Applied(entry) => entry,
                // This call's own key: an earlier attempt of this call
                // applied and its reply was lost (a request the host retried).
                Outcome::Conflict(Some(current)) if current.key == owner => current,
                Outcome::Conflict(Some(first_to_expire)) => {
                    let first = holder(&first_to_expire, reply.now)?;
                    let Some(wait_ms) = patience.next_wait(reply.now) else {
                        return Ok(AcquireOutcome::Busy(first));
                    };
                    let next = self.wait_for_place(
                        &partition,
                        &owner,
                        ttl_ms,
                        limit,
                        &first_to_expire,
                        (reply.revision, reply.now),
                        wait_ms,
                    );
                    reply = self.or_take_back(next, &partition, &owner, &value)?;
                    continue;
                }
                Outcome::Conflict(None) => {
                    return Err(Error::Internal(
                        "a full semaphore's conflict named no permit".into(),
                    ));
                }
            };
            let expires_at = match granted(&current, &owner, &value, reply.now) {
                Ok(expires_at) => expires_at,
                Err(broken) => {
                    self.take_back(&partition, &owner, &value);
                    return Err(broken);
                }
            };
            return Ok(AcquireOutcome::Acquired(Permit {
                id: id.to_string(),
                resource: resource.to_string(),
                owner,
                fence: current.revision,
                limit,
                ttl_ms,
                expires_at,
            }));
        }
    }

    /// After a full attempt: send the next attempt with a wait on the
    /// revision the full attempt saw, so a release or an expiry ends the
    /// wait and the put runs right then in the store, or the first expiry
    /// the full attempt named comes, or `wait_ms` passes. No listing: the
    /// attempt's reply carries what the wait needs, so waiting costs the
    /// same beside 10 permits held as beside 10 000.
    #[allow(clippy::too_many_arguments)] // one attempt's whole context, named
    fn wait_for_place(
        &self,
        partition: &str,
        owner: &str,
        ttl_ms: u64,
        limit: u32,
        first_to_expire: &Entry,
        (revision, now): (u64, u64),
        wait_ms: u64,
    ) -> Result<WriteReply, StoreError> {
        // At least 1 ms: a permit named at its expiry must not make the
        // next attempt come with no wait, again and again.
        let first_expiry = first_to_expire
            .expires_at
            .map_or(wait_ms, |end| end.saturating_sub(now).max(1));
        self.store.wait_then_put(
            partition,
            owner,
            &limit_value(limit),
            Some(ttl_ms),
            &Condition::AbsentAndFewerThan(limit),
            revision,
            wait_ms.min(first_expiry),
        )
    }

    /// Pass an attempt's reply on; when the store failed, whatever the
    /// error, first take back what the attempt may have written (as the
    /// lock's acquire does: the key is this call's own token, so nothing
    /// else is ever freed).
    fn or_take_back(
        &self,
        reply: Result<WriteReply, StoreError>,
        partition: &str,
        owner: &str,
        value: &[u8],
    ) -> Result<WriteReply, Error> {
        reply.map_err(|error| {
            self.take_back(partition, owner, value);
            error.into()
        })
    }

    /// Free this call's permit if its attempt wrote one: one read of the
    /// owner's key and a delete guarded by what it found. Best effort.
    fn take_back(&self, partition: &str, owner: &str, value: &[u8]) {
        if let Ok(ReadReply {
            entry: Some(entry), ..
        }) = self.store.get(partition, owner)
            && entry.value == value
        {
            let _ = self.store.delete(
                partition,
                owner,
                &Condition::RevisionAndValue(Guard {
                    revision: entry.revision,
                    value: entry.value,
                }),
            );
        }
    }

    /// `release` of `coord:sync/semaphore`: `true` when this call freed the permit.
    pub fn release(&self, permit: &Permit) -> Result<bool, Error> {
        check_permit(permit)?;
        let partition = keys::semaphore_partition(&permit.id, &permit.resource);
        let reply = self
            .store
            .delete(&partition, &permit.owner, &owned_by(permit))?;
        Ok(matches!(reply.outcome, Outcome::Applied(_)))
    }

    /// `extend` of `coord:sync/semaphore`.
    pub fn extend(&self, permit: &Permit, ttl_ms: Option<u64>) -> Result<ExtendOutcome, Error> {
        check_permit(permit)?;
        let ttl_ms = ttl_ms.unwrap_or(permit.ttl_ms);
        validate::ttl("ttl-ms", ttl_ms)?;
        let partition = keys::semaphore_partition(&permit.id, &permit.resource);
        let reply = self
            .store
            .touch(&partition, &permit.owner, ttl_ms, &owned_by(permit))?;
        match reply.outcome {
            Outcome::Applied(entry) => Ok(ExtendOutcome::Extended(Permit {
                ttl_ms,
                expires_at: granted(&entry, &permit.owner, &limit_value(permit.limit), reply.now)?,
                ..permit.clone()
            })),
            Outcome::Conflict(_) => Ok(ExtendOutcome::Lost),
        }
    }

    /// `is-held` of `coord:sync/semaphore`: from one read, decided on the
    /// reply's `now` and the entry's expiry, whatever else the store said.
    pub fn is_held(&self, permit: &Permit) -> Result<bool, Error> {
        check_permit(permit)?;
        let partition = keys::semaphore_partition(&permit.id, &permit.resource);
        let reply = self.store.get(&partition, &permit.owner)?;
        Ok(reply.entry.is_some_and(|entry| {
            entry.revision == permit.fence
                && entry.value == limit_value(permit.limit)
                && entry.expires_at.is_some_and(|end| end > reply.now)
        }))
    }

    /// `inspect` of `coord:sync/semaphore`: the live permits in fence order.
    pub fn inspect(&self, id: &str, resource: &str) -> Result<Usage, Error> {
        check_names(id, resource, "id", "resource")?;
        let listing = self
            .store
            .list(&keys::semaphore_partition(id, resource), "")?;
        let mut permits = listing
            .entries
            .iter()
            // An entry returned at or past its expiry holds nothing.
            .filter(|e| e.expires_at.is_none_or(|end| end > listing.now))
            .map(|e| holder(e, listing.now))
            .collect::<Result<Vec<_>, _>>()?;
        permits.sort_by_key(|h| h.fence);
        Ok(Usage {
            permits,
            now: listing.now,
        })
    }

    /// `force-release` of `coord:sync/semaphore`: `true` when the permit
    /// with this fence was removed.
    pub fn force_release(&self, id: &str, resource: &str, fence: u64) -> Result<bool, Error> {
        check_names(id, resource, "id", "resource")?;
        if fence == 0 {
            return Err(Invalid::new("fence", "must be greater than 0").into());
        }
        let partition = keys::semaphore_partition(id, resource);
        let listing = self.store.list(&partition, "")?;
        let Some(permit) = listing.entries.iter().find(|e| e.revision == fence) else {
            return Ok(false);
        };
        let reply = self
            .store
            .delete(&partition, &permit.key, &Condition::Revision(fence))?;
        Ok(matches!(reply.outcome, Outcome::Applied(_)))
    }
}

crate::lock::wait_policy_as_locks!(WaitPolicy);

/// A permit entry's value: the limit it was acquired under, in decimal.
fn limit_value(limit: u32) -> Vec<u8> {
    limit.to_string().into_bytes()
}

/// The limit a permit entry holds; `None` when it is not one `acquire`
/// wrote (decimal digits without a leading zero, at least 1).
fn parse_limit(value: &[u8]) -> Option<u32> {
    if value.first() == Some(&b'0') || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

fn check_limit(field: &str, limit: u32) -> Result<(), Invalid> {
    validate::in_range(field, u64::from(limit), 1, u64::from(MAX_LIMIT))
}

/// The condition only this permit satisfies (its key is the owner token).
fn owned_by(permit: &Permit) -> Condition {
    Condition::RevisionAndValue(Guard {
        revision: permit.fence,
        value: limit_value(permit.limit),
    })
}

/// The expiry of the permit a write just granted, checked: the store must
/// have written this owner's key with this limit at a revision above 0 and
/// kept it alive past `now`. Anything else is `internal`, never a grant.
fn granted(entry: &Entry, owner: &str, value: &[u8], now: u64) -> Result<u64, Error> {
    let broken = |what: &str| {
        Err(Error::Internal(format!(
            "the store granted a permit {what} (revision {})",
            entry.revision
        )))
    };
    if entry.revision == 0 {
        return broken("at revision 0");
    }
    if entry.key != owner || entry.value != value {
        return broken("to another owner");
    }
    match entry.expires_at {
        None => broken("with no expiry"),
        Some(end) if end <= now => broken("that had already expired"),
        Some(end) => Ok(end),
    }
}

/// A permit entry as `acquire` wrote it, seen at store time `now`; anything
/// else (a key written by another program) is the store breaking its
/// contract, not a holder to wait for.
fn holder(entry: &Entry, now: u64) -> Result<Holder, Error> {
    let limit = parse_limit(&entry.value).filter(|_| is_owner_token(entry.key.as_bytes()));
    match (limit, entry.expires_at) {
        (Some(limit), Some(end)) if entry.revision > 0 => Ok(Holder {
            fence: entry.revision,
            remaining_ms: end.saturating_sub(now),
            limit,
        }),
        _ => Err(Error::Internal(format!(
            "a semaphore entry is not a permit ({} key bytes, {} value bytes at revision {})",
            entry.key.len(),
            entry.value.len(),
            entry.revision
        ))),
    }
}

/// A permit record must be one `acquire` could have returned; a forged or
/// corrupted one is rejected by name before the store is asked.
fn check_permit(permit: &Permit) -> Result<(), Invalid> {
    check_held_record(
        HeldRecord::Permit,
        (&permit.id, &permit.resource, &permit.owner),
        permit.fence,
        permit.ttl_ms,
    )?;
    check_limit("permit.limit", permit.limit)
}

#[cfg(test)]
mod tests;
