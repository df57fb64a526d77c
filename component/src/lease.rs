//! The single-writer lease: `coord:sync/lease`.
//!
//! A lease `name` is one entry, [`keys::LEASE_HOLDER_KEY`], in a partition
//! of its own. Its value is `<ttl-ms>\n<writable-at>\n<node>` and its store
//! revision is the holding's epoch. The entry lives for *two* TTLs from the
//! last acquire or renewal: the lease proper, then the failover grace. So:
//!
//! - acquire is a create-if-absent (one request): an absent entry means the
//!   lease was never held, was resigned (a resign deletes it), or ran out
//!   more than a grace ago — no grace to keep. A present one (the failed
//!   create returns it) is either the caller's own (adopted: a touch guarded
//!   by its revision, so the epoch stays), another node's still running
//!   (`not-holder`), or another node's that ran out and is in its grace:
//!   taken over by a put guarded by its revision, writable from the
//!   entry's end, when the grace is over;
//! - renew is a touch guarded by the epoch (one request), which renews the
//!   TTL without a new revision, so the epoch stays;
//! - the commit-point check is one read;
//! - resign is a delete guarded by the epoch.
//!
//! Whether a new holder owes a grace is decided by the store's entry, not by
//! any node's memory: a node that never saw the previous holder waits too.

use crate::bindings::exports::coord::sync::lease::{Error, HeldLease, Holder, InvalidArgument};
use crate::keys::{self, LEASE_HOLDER_KEY};
use crate::store::{Condition, Entry, Guard, Outcome, Store};
use crate::validate::{self, Invalid, MAX_ID_BYTES};

crate::validate::interface_errors!(Error, InvalidArgument);

/// How many times an acquire retries after the entry changed under it.
const MAX_RACES: u32 = 4;

/// The lease operations over a store.
pub struct Leases<S> {
    store: S,
}

/// A lease entry's value, decoded.
struct Value<'a> {
    ttl_ms: u64,
    /// 0 for a holding that owed no grace (writable from its acquisition).
    writable_at: u64,
    node: &'a str,
}

impl Value<'_> {
    fn encode(ttl_ms: u64, writable_at: u64, node: &str) -> Vec<u8> {
        format!("{ttl_ms}\n{writable_at}\n{node}").into_bytes()
    }

    fn decode(entry: &Entry) -> Result<Value<'_>, Error> {
        let corrupt = || Error::Internal("a lease entry this interface did not write".into());
        let text = std::str::from_utf8(&entry.value).map_err(|_| corrupt())?;
        let mut parts = text.splitn(3, '\n');
        let (Some(ttl), Some(writable), Some(node)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(corrupt());
        };
        let ttl_ms: u64 = ttl.parse().map_err(|_| corrupt())?;
        if ttl_ms == 0 || entry.expires_at.is_none() {
            return Err(corrupt());
        }
        Ok(Value {
            ttl_ms,
            writable_at: writable.parse().map_err(|_| corrupt())?,
            node,
        })
    }
}

/// What the store's entry says of a holding.
struct Holding<'a> {
    value: Value<'a>,
    epoch: u64,
    /// When the lease proper runs out (the entry's end minus the grace).
    runs_out_at: u64,
    /// When the entry itself ends: the end of the grace.
    grace_ends_at: u64,
    /// When the holder may write; 0 when it owed no grace.
    writable_at: u64,
}

impl<'a> Holding<'a> {
    fn of(entry: &'a Entry) -> Result<Holding<'a>, Error> {
        let value = Value::decode(entry)?;
        let grace_ends_at = entry.expires_at.unwrap_or(0);
        Ok(Holding {
            runs_out_at: grace_ends_at.saturating_sub(value.ttl_ms),
            grace_ends_at,
            writable_at: value.writable_at,
            epoch: entry.revision,
            value,
        })
    }

    fn holder(&self, now: u64) -> Holder {
        Holder {
            node: self.value.node.to_string(),
            epoch: self.epoch,
            remaining_ms: self.runs_out_at.saturating_sub(now),
            grace_ms: self.writable_at.saturating_sub(now),
        }
    }

    fn lease(&self, name: &str) -> HeldLease {
        HeldLease {
            name: name.to_string(),
            node: self.value.node.to_string(),
            epoch: self.epoch,
            ttl_ms: self.value.ttl_ms,
            expires_at: self.runs_out_at,
            writable_at: self.writable_at,
        }
    }
}

/// The store TTL of a lease entry: the lease, then its grace.
fn entry_ttl(ttl_ms: u64) -> u64 {
    ttl_ms.saturating_mul(2)
}

impl<S: Store> Leases<S> {
    /// Lease operations on `store`.
    pub fn new(store: S) -> Self {
        Leases { store }
    }

    /// `acquire` of `coord:sync/lease`.
    pub fn acquire(&self, name: &str, node: &str, ttl_ms: u64) -> Result<HeldLease, Error> {
        validate::name("name", name, MAX_ID_BYTES)?;
        validate::name("node", node, MAX_ID_BYTES)?;
        validate::ttl("ttl-ms", ttl_ms)?;
        let partition = keys::lease_partition(name);
        for _ in 0..MAX_RACES {
            let reply = self.store.put(
                &partition,
                LEASE_HOLDER_KEY,
                &Value::encode(ttl_ms, 0, node),
                Some(entry_ttl(ttl_ms)),
                &Condition::Absent,
            )?;
            let current = match reply.outcome {
                Outcome::Applied(entry) => return Ok(Holding::of(&entry)?.lease(name)),
                Outcome::Conflict(Some(current)) => current,
                Outcome::Conflict(None) => {
                    return Err(Error::Internal(
                        "create-if-absent failed but the store reported no entry".into(),
                    ));
                }
            };
            let held = Holding::of(&current)?;
            let guard = Condition::Revision(current.revision);
            let outcome = if held.value.node == node {
                // Our own holding, from before a restart: adopt it as it is.
                self.store
                    .touch(
                        &partition,
                        LEASE_HOLDER_KEY,
                        entry_ttl(held.value.ttl_ms),
                        &guard,
                    )?
                    .outcome
            } else if reply.now < held.runs_out_at {
                return Err(Error::NotHolder(Some(held.holder(reply.now))));
            } else {
                // Run out, in its grace: take it over, writable once the
                // grace (the old entry's end) is over.
                let value = Value::encode(ttl_ms, held.grace_ends_at, node);
                self.store
                    .put(
                        &partition,
                        LEASE_HOLDER_KEY,
                        &value,
                        Some(entry_ttl(ttl_ms)),
                        &guard,
                    )?
                    .outcome
            };
            if let Outcome::Applied(entry) = outcome {
                return Ok(Holding::of(&entry)?.lease(name));
            }
            // The entry changed between the two requests: look again.
        }
        Err(Error::Unavailable(format!(
            "the lease {name} changed {MAX_RACES} times during one acquire"
        )))
    }

    /// `renew` of `coord:sync/lease`.
    pub fn renew(&self, lease: &HeldLease) -> Result<HeldLease, Error> {
        check_lease(lease)?;
        let partition = keys::lease_partition(&lease.name);
        let reply = self.store.touch(
            &partition,
            LEASE_HOLDER_KEY,
            entry_ttl(lease.ttl_ms),
            &held_by(lease),
        )?;
        match reply.outcome {
            Outcome::Applied(entry) => Ok(Holding::of(&entry)?.lease(&lease.name)),
            Outcome::Conflict(current) => Err(Error::NotHolder(
                current
                    .map(|entry| Holding::of(&entry).map(|h| h.holder(reply.now)))
                    .transpose()?,
            )),
        }
    }

    /// `check` of `coord:sync/lease`: the commit-point check, one read.
    pub fn check(&self, lease: &HeldLease) -> Result<HeldLease, Error> {
        check_lease(lease)?;
        let reply = self
            .store
            .get(&keys::lease_partition(&lease.name), LEASE_HOLDER_KEY)?;
        let Some(entry) = reply.entry else {
            return Err(Error::NotHolder(None));
        };
        let held = Holding::of(&entry)?;
        if held.epoch != lease.epoch
            || held.value.node != lease.node
            || reply.now >= held.runs_out_at
        {
            return Err(Error::NotHolder(Some(held.holder(reply.now))));
        }
        if reply.now < held.writable_at {
            return Err(Error::InGrace(held.writable_at - reply.now));
        }
        Ok(held.lease(&lease.name))
    }

    /// `resign` of `coord:sync/lease`: `true` when this call gave it up.
    ///
    /// A holding that took over a run-out lease carries that lease's grace.
    /// Resigned before the grace ends, it must not hand the next holder a
    /// lease with no grace (a node could otherwise dodge the grace by taking
    /// over, resigning and acquiring again, which the two-node property test
    /// found): its entry is cut to end with the grace instead, so the next
    /// holder takes it over with the same `writable-at`.
    pub fn resign(&self, lease: &HeldLease) -> Result<bool, Error> {
        check_lease(lease)?;
        let partition = keys::lease_partition(&lease.name);
        if lease.writable_at > 0 {
            let now = self.store.now()?;
            if now < lease.writable_at {
                let reply = self.store.touch(
                    &partition,
                    LEASE_HOLDER_KEY,
                    lease.writable_at - now,
                    &held_by(lease),
                )?;
                return Ok(matches!(reply.outcome, Outcome::Applied(_)));
            }
        }
        let reply = self
            .store
            .delete(&partition, LEASE_HOLDER_KEY, &held_by(lease))?;
        Ok(matches!(reply.outcome, Outcome::Applied(_)))
    }

    /// `observe` of `coord:sync/lease`.
    pub fn observe(&self, name: &str) -> Result<Option<Holder>, Error> {
        validate::name("name", name, MAX_ID_BYTES)?;
        let reply = self
            .store
            .get(&keys::lease_partition(name), LEASE_HOLDER_KEY)?;
        reply
            .entry
            .map(|entry| Holding::of(&entry).map(|h| h.holder(reply.now)))
            .transpose()
    }
}

/// The condition only this holding satisfies: its epoch, and the value its
/// acquire wrote (its node among it).
fn held_by(lease: &HeldLease) -> Condition {
    Condition::RevisionAndValue(Guard {
        revision: lease.epoch,
        value: Value::encode(lease.ttl_ms, lease.writable_at, &lease.node),
    })
}

/// A held-lease record must be one `acquire` could have returned.
fn check_lease(lease: &HeldLease) -> Result<(), Invalid> {
    validate::name("lease.name", &lease.name, MAX_ID_BYTES)?;
    validate::name("lease.node", &lease.node, MAX_ID_BYTES)?;
    if lease.epoch == 0 {
        return Err(Invalid::new("lease.epoch", "must be greater than 0"));
    }
    validate::ttl("lease.ttl-ms", lease.ttl_ms)
}

#[cfg(test)]
mod tests;
