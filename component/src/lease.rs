//! The single-writer lease: `coord:sync/lease`.
//!
//! A lease `name` is one entry, [`keys::LEASE_HOLDER_KEY`], in a partition
//! of its own. While held, its value is `<ttl-ms>\n<writable-at>\n<node>`
//! and its store revision is the holding's epoch.
//!
//! **The grace belongs to the lease, not to its holder.** A holder that
//! passed the commit-point check at `c` may still be writing until `c` plus
//! its TTL. So the entry is kept alive until every write that may still be
//! in flight has had its TTL: it ends at `max(last renewal + 2 × ttl,
//! writable-at)`, and the holding runs out one TTL before the entry ends.
//! Whoever takes it over is writable from the old entry's end, which covers
//! the old holder's writes and every grace it carried in turn; and because
//! the entry outlives them all, an acquire that finds it gone owes nobody a
//! grace. (Outside testers found a chain P → Q → R in which Q, with a short
//! TTL, stored an entry that ended before P's grace did, so R was told it
//! could write while P still might.)
//!
//! - acquire is a create-if-absent (one request): an absent entry means the
//!   lease was never held, was resigned with no grace left, or its entry
//!   ended — nobody may still be writing. A present one (the failed create
//!   returns it) is the caller's own (adopted: a touch guarded by its
//!   revision, so the epoch stays), another node's still running
//!   (`not-holder`), another node's that ran out, or a resigned holding
//!   whose grace is not over: both taken over by a put guarded by its
//!   revision, writable from the old entry's end;
//! - renew is a touch guarded by the epoch and value, which renews the TTL
//!   without a new revision, so the epoch stays. A holding that carries a
//!   grace (`writable-at` > 0) first reads the store's clock, so that its
//!   touch never cuts the entry short of that grace: two requests;
//! - the commit-point check is one read, decided from the reply's `now` and
//!   the entry's end, whatever else the store said;
//! - resign is a delete guarded by the epoch; a holding still inside a grace
//!   it carries is replaced instead by a *resigned* entry that lives until
//!   the grace ends, so the epoch is over for its node (a second resign is
//!   `false`, renew and check are `not-holder`) and the next holder still
//!   waits out the grace.
//!
//! Whether a new holder owes a grace is decided by the store's entry, not by
//! any node's memory: a node that never saw the previous holder waits too.

use crate::bindings::exports::coord::sync::lease::{Error, HeldLease, Holder, InvalidArgument};
use crate::keys::{self, LEASE_HOLDER_KEY};
use crate::store::{Condition, Entry, Guard, Outcome, Store};
use crate::validate::{self, Invalid, MAX_ID_BYTES, MAX_TTL_MS};

crate::validate::interface_errors!(Error, InvalidArgument);

/// How many times an acquire retries after the entry changed under it.
const MAX_RACES: u32 = 4;

/// The value of a resigned holding's entry, kept until its grace ends.
const RESIGNED: &[u8] = b"resigned";

/// The lease operations over a store.
pub struct Leases<S> {
    store: S,
}

/// A holding's value, decoded.
struct Value<'a> {
    ttl_ms: u64,
    node: &'a str,
}

impl Value<'_> {
    fn encode(ttl_ms: u64, writable_at: u64, node: &str) -> Vec<u8> {
        format!("{ttl_ms}\n{writable_at}\n{node}").into_bytes()
    }
}

/// What a lease entry says, checked against everything this interface
/// could have written: anything else is the store breaking its contract,
/// answered `internal`, never read as a holder or a grant.
enum State<'a> {
    /// A node holds it (or held it: it may have run out, in its grace).
    Held(Holding<'a>),
    /// Resigned inside a grace; nobody holds it until the entry ends.
    Resigned {
        /// When the entry ends: the end of the grace it keeps.
        grace_ends_at: u64,
    },
}

/// What the store's entry says of a holding.
struct Holding<'a> {
    value: Value<'a>,
    epoch: u64,
    /// When the holding runs out unless renewed: one TTL before the entry
    /// ends, so that a write begun just before still fits in the entry.
    runs_out_at: u64,
    /// When the entry itself ends: no write of this holding or of any
    /// holding before it may still be in flight after this.
    grace_ends_at: u64,
    /// When the holder may write; 0 when it owed no grace.
    writable_at: u64,
}

fn corrupt(what: &str) -> Error {
    Error::Internal(format!(
        "a lease entry this interface did not write: {what}"
    ))
}

impl<'a> State<'a> {
    fn of(entry: &'a Entry) -> Result<State<'a>, Error> {
        if entry.revision == 0 {
            return Err(corrupt("revision 0"));
        }
        let Some(ends_at) = entry.expires_at else {
            return Err(corrupt("no expiry"));
        };
        if entry.value == RESIGNED {
            return Ok(State::Resigned {
                grace_ends_at: ends_at,
            });
        }
        let text = std::str::from_utf8(&entry.value).map_err(|_| corrupt("not UTF-8"))?;
        let mut parts = text.splitn(3, '\n');
        let (Some(ttl), Some(writable), Some(node)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(corrupt("not three lines"));
        };
        let ttl_ms: u64 = ttl
            .parse()
            .map_err(|_| corrupt("a TTL that is not a number"))?;
        if ttl_ms == 0 || ttl_ms > MAX_TTL_MS {
            return Err(corrupt("a TTL out of range"));
        }
        if node.is_empty() || node.len() > MAX_ID_BYTES {
            return Err(corrupt("a node out of range"));
        }
        let writable_at: u64 = writable
            .parse()
            .map_err(|_| corrupt("a writable-at that is not a number"))?;
        Ok(State::Held(Holding {
            runs_out_at: ends_at.saturating_sub(ttl_ms),
            grace_ends_at: ends_at,
            writable_at,
            epoch: entry.revision,
            value: Value { ttl_ms, node },
        }))
    }

    /// The holder, if a node holds it.
    fn holder(&self, now: u64) -> Option<Holder> {
        match self {
            State::Held(held) => Some(held.holder(now)),
            State::Resigned { .. } => None,
        }
    }
}

impl<'a> Holding<'a> {
    /// The holding an entry that an acquire or renew wrote must be.
    fn written(entry: &'a Entry) -> Result<Holding<'a>, Error> {
        match State::of(entry)? {
            State::Held(held) => Ok(held),
            State::Resigned { .. } => Err(corrupt("a resigned entry where a holding was written")),
        }
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

/// The store TTL of a holding's entry written at store time `now`: the
/// lease, then its own grace, and never ending before the grace it carries
/// (`writable_at`).
fn entry_ttl(ttl_ms: u64, writable_at: u64, now: u64) -> u64 {
    ttl_ms
        .saturating_mul(2)
        .max(writable_at.saturating_sub(now))
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
                Some(entry_ttl(ttl_ms, 0, 0)),
                &Condition::Absent,
            )?;
            let current = match reply.outcome {
                Outcome::Applied(entry) => return granted(&entry, name, node, reply.now),
                Outcome::Conflict(Some(current)) => current,
                Outcome::Conflict(None) => {
                    return Err(Error::Internal(
                        "create-if-absent failed but the store reported no entry".into(),
                    ));
                }
            };
            let guard = Condition::Revision(current.revision);
            let outcome = match State::of(&current)? {
                // Our own holding, from before a restart: adopt it as it is.
                State::Held(held) if held.value.node == node => {
                    let ttl = entry_ttl(held.value.ttl_ms, held.writable_at, reply.now);
                    self.store
                        .touch(&partition, LEASE_HOLDER_KEY, ttl, &guard)?
                        .outcome
                }
                State::Held(held) if reply.now < held.runs_out_at => {
                    return Err(Error::NotHolder(Some(held.holder(reply.now))));
                }
                // Run out, or resigned, with a grace not over: take it over,
                // writable once every write the old entry covers is done.
                State::Held(Holding { grace_ends_at, .. }) | State::Resigned { grace_ends_at } => {
                    let value = Value::encode(ttl_ms, grace_ends_at, node);
                    let ttl = entry_ttl(ttl_ms, grace_ends_at, reply.now);
                    self.store
                        .put(&partition, LEASE_HOLDER_KEY, &value, Some(ttl), &guard)?
                        .outcome
                }
            };
            if let Outcome::Applied(entry) = outcome {
                return granted(&entry, name, node, reply.now);
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
        // A grace carried may reach past this renewal's two TTLs; only the
        // store's clock can tell, and the touch must not cut it short.
        let now = if lease.writable_at > 0 {
            self.store.now()?
        } else {
            0
        };
        let reply = self.store.touch(
            &partition,
            LEASE_HOLDER_KEY,
            entry_ttl(lease.ttl_ms, lease.writable_at, now),
            &held_by(lease),
        )?;
        match reply.outcome {
            Outcome::Applied(entry) => granted(&entry, &lease.name, &lease.node, reply.now),
            Outcome::Conflict(current) => Err(Error::NotHolder(match current {
                Some(entry) => State::of(&entry)?.holder(reply.now),
                None => None,
            })),
        }
    }

    /// `check` of `coord:sync/lease`: the commit-point check, one read.
    ///
    /// Decided from the reply's `now` and the entry's end alone: an entry
    /// the store returned although it has ended is not held.
    pub fn check(&self, lease: &HeldLease) -> Result<HeldLease, Error> {
        check_lease(lease)?;
        let reply = self
            .store
            .get(&keys::lease_partition(&lease.name), LEASE_HOLDER_KEY)?;
        let Some(entry) = reply.entry else {
            return Err(Error::NotHolder(None));
        };
        let held = match State::of(&entry)? {
            State::Held(held) => held,
            State::Resigned { .. } => return Err(Error::NotHolder(None)),
        };
        if held.epoch != lease.epoch
            || held.value.node != lease.node
            || reply.now >= held.runs_out_at
            || reply.now >= held.grace_ends_at
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
    /// A holding that took over carries the grace of the holders before it.
    /// Resigned before that grace ends, it must not hand the next holder a
    /// lease with no grace (a node could otherwise dodge the grace by taking
    /// over, resigning and acquiring again, which the two-node property test
    /// found): its entry is replaced by a resigned one that ends with the
    /// grace, so the next holder takes it over with the same `writable-at`.
    /// Being a new write, it also ends this epoch for good: a second resign,
    /// a renewal or a check with it finds no holding (outside testers
    /// resigned twice, renewed and wrote when the resign only cut the TTL).
    pub fn resign(&self, lease: &HeldLease) -> Result<bool, Error> {
        check_lease(lease)?;
        let partition = keys::lease_partition(&lease.name);
        if lease.writable_at > 0 {
            let now = self.store.now()?;
            if now < lease.writable_at {
                let reply = self.store.put(
                    &partition,
                    LEASE_HOLDER_KEY,
                    RESIGNED,
                    Some(lease.writable_at - now),
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
        match reply.entry {
            Some(entry) if entry.expires_at.is_some_and(|end| end <= reply.now) => Ok(None),
            Some(entry) => Ok(State::of(&entry)?.holder(reply.now)),
            None => Ok(None),
        }
    }
}

/// The lease an applied acquire or renew wrote, checked: the store must have
/// written what was asked (this node's holding, at a revision above 0) and
/// kept it alive past `now`; anything else is `internal`, never a grant.
fn granted(entry: &Entry, name: &str, node: &str, now: u64) -> Result<HeldLease, Error> {
    let held = Holding::written(entry)?;
    if held.value.node != node {
        return Err(corrupt(
            "another node's holding where this node's was written",
        ));
    }
    if held.grace_ends_at <= now {
        return Err(corrupt("a holding that had already ended when written"));
    }
    Ok(held.lease(name))
}

/// How to give up a holding whose holder can no longer do it itself: a
/// runtime that cut short the request that took it (its deadline, a trap,
/// a shutdown past the grace). The write this returns is guarded by the
/// holding's revision and value, so it never touches another holding.
#[derive(Debug, PartialEq, Eq)]
pub enum GiveUp {
    /// Delete the entry: it carries no grace past `now`.
    Delete,
    /// Replace the entry with this value for this TTL: it still carries a
    /// grace, which the next holder must wait out (a resign does the same).
    Replace {
        /// The resigned entry's value.
        value: Vec<u8>,
        /// Until the grace ends.
        ttl_ms: u64,
    },
}

/// [`GiveUp`] for the holding whose entry holds `value`, at store time
/// `now`: what [`Leases::resign`] would do. `None` when `value` is not a
/// holding (a resigned entry, or one this interface did not write).
pub fn give_up(value: &[u8], now: u64) -> Option<GiveUp> {
    let entry = Entry {
        key: LEASE_HOLDER_KEY.to_string(),
        value: value.to_vec(),
        revision: 1,
        updated_at: now,
        expires_at: Some(u64::MAX),
    };
    match State::of(&entry).ok()? {
        State::Held(held) if held.writable_at > now => Some(GiveUp::Replace {
            value: RESIGNED.to_vec(),
            ttl_ms: held.writable_at - now,
        }),
        State::Held(_) => Some(GiveUp::Delete),
        State::Resigned { .. } => None,
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
