//! The fenced read-write lock: `coord:sync/rwlock`.
//!
//! A read-write lock (`id`, `resource`) is a partition of its own
//! ([`keys::rwlock_partition`]). The writer is the entry
//! [`keys::RWLOCK_WRITER_KEY`], holding its owner token; each reader is an
//! entry [`keys::RWLOCK_READER_PREFIX`] + its owner token, holding the
//! token. A grant's store revision is its fence.
//!
//! **Why two requests, in this order.** The store's conditions see one key
//! and a count, not another mode's keys, so each side writes its own entry
//! first and then reads the other side's:
//!
//! - a reader puts its entry, then reads the writer's key: no live writer
//!   means granted; a writer (holding, or waiting for readers) means it
//!   deletes its entry and waits;
//! - a writer puts the writer's key if absent, then lists the readers: none
//!   live means granted; otherwise it keeps its entry as a claim and waits
//!   for them to leave.
//!
//! Two grants that exclude each other cannot both happen: for a reader R
//! and a writer W both granted, R's read came before W's write (it saw no
//! writer) and W's read came before R's write (it saw no reader), while
//! each wrote before it read: R's write < R's read < W's write < W's read <
//! R's write, a cycle. An entry that expired in between ended its grant,
//! which is why each grant's expiry is its entry's.
//!
//! **Writers are preferred** because a writer's claim stops new readers at
//! their read. A waiting writer lowers its claim's TTL to
//! [`WRITER_CLAIM_MS`] and renews it on every wake-up, so a writer that
//! dies while waiting holds new readers off for at most that long; once the
//! readers are gone it raises the claim back to its TTL (a touch guarded by
//! its revision and token: if the claim lapsed in between, it starts over).
//!
//! **Waiters read before they write.** A reader stepping aside for a writer
//! and a writer waiting for readers wake on every change of the partition,
//! but check with a read; only a wake-up that finds the way clear writes.
//! A waiter that wrote on every wake-up would wake every other waiter with
//! its own write, and they it, for as long as the lock is held.

use crate::bindings::exports::coord::sync::lock;
use crate::bindings::exports::coord::sync::rwlock::{
    AcquireOptions, AcquireOutcome, Error, ExtendOutcome, Grant, Holder, InvalidArgument, Mode,
    Usage, WaitPolicy,
};
use crate::keys::{self, RWLOCK_READER_PREFIX, RWLOCK_WRITER_KEY};
use crate::lock::{
    DEFAULT_RETRY, DEFAULT_TTL_MS, HeldRecord, Patience, check_held_record, check_names,
    check_wait, hex, is_owner_token,
};
use crate::store::{
    Condition, Entropy, Entry, Guard, ListReply, Outcome, ReadReply, Store, StoreError, WriteReply,
};
use crate::validate::{self, Invalid};

/// The most readers one lock grants at once (`coord:sync/rwlock`'s `mode`):
/// every reader is an entry of one partition, which the NATS store reads
/// whole on each write, as the semaphore's limit says.
pub const MAX_READERS: u32 = 1000;

/// The longest a waiting writer's claim lives between two renewals, in
/// milliseconds of store time: how long a writer that died while waiting
/// can keep new readers out.
pub const WRITER_CLAIM_MS: u64 = 2000;

/// How many times one acquire makes its attempt again after its entry
/// expired before the read that would have confirmed it.
const MAX_LAPSED_ATTEMPTS: u32 = 3;

/// The read-write lock operations over a store and a source of randomness.
pub struct RwLocks<S, E> {
    store: S,
    entropy: E,
}

crate::validate::interface_errors!(Error, InvalidArgument);

crate::lock::wait_policy_as_locks!(WaitPolicy);

/// One acquire's own entry: where it is and what it holds.
struct Claim<'a> {
    partition: &'a str,
    key: &'a str,
    owner: &'a str,
    ttl_ms: u64,
}

impl<S: Store, E: Entropy> RwLocks<S, E> {
    /// Read-write lock operations on `store`, minting owner tokens from `entropy`.
    pub fn new(store: S, entropy: E) -> Self {
        RwLocks { store, entropy }
    }

    /// `acquire` of `coord:sync/rwlock`.
    pub fn acquire(
        &self,
        id: &str,
        resource: &str,
        mode: Mode,
        options: AcquireOptions,
    ) -> Result<AcquireOutcome, Error> {
        check_names(id, resource, "id", "resource")?;
        let ttl_ms = options.ttl_ms.unwrap_or(DEFAULT_TTL_MS);
        validate::ttl("options.ttl-ms", ttl_ms)?;
        let policy = options
            .wait
            .map_or(lock::WaitPolicy::Attempts(DEFAULT_RETRY), Into::into);
        check_wait(&policy)?;

        let partition = keys::rwlock_partition(id, resource);
        let owner = hex(&self.entropy.random_16());
        let key = key_of(mode, &owner);
        let claim = Claim {
            partition: &partition,
            key: &key,
            owner: &owner,
            ttl_ms,
        };
        let mut patience = Patience::new(policy);
        let granted = match mode {
            Mode::Read => self.acquire_read(&claim, &mut patience)?,
            Mode::Write => self.acquire_write(&claim, &mut patience)?,
        };
        Ok(match granted {
            Ok((fence, expires_at)) => AcquireOutcome::Acquired(Grant {
                id: id.to_string(),
                resource: resource.to_string(),
                mode,
                owner,
                fence,
                ttl_ms,
                expires_at,
            }),
            Err(holder) => AcquireOutcome::Busy(holder),
        })
    }

    /// A reader: put its entry (while fewer than [`MAX_READERS`] entries
    /// are live, a writer's counted), then read the writer's key. Answers the
    /// grant's (fence, expiry), or the holder in the way.
    fn acquire_read(
        &self,
        claim: &Claim,
        patience: &mut Patience,
    ) -> Result<Result<(u64, u64), Holder>, Error> {
        let place = Condition::AbsentAndFewerThan(MAX_READERS);
        let mut lapses = 0;
        loop {
            let put = self.store.put(
                claim.partition,
                claim.key,
                claim.owner.as_bytes(),
                Some(claim.ttl_ms),
                &place,
            );
            let reply = self.or_take_back(put, claim)?;
            let mine = match reply.outcome {
                Outcome::Applied(entry) => entry,
                // This call's own key: an earlier attempt of this call
                // applied and its reply was lost (a request the host retried).
                Outcome::Conflict(Some(entry)) if entry.key == claim.key => entry,
                Outcome::Conflict(Some(first_to_expire)) => {
                    // Every place taken: wait for a change, then try again.
                    let holder = holder(&first_to_expire, reply.now)?;
                    let listing = self.store.list(claim.partition, RWLOCK_WRITER_KEY)?;
                    if !self.wait_for_change(
                        claim.partition,
                        patience,
                        &listing,
                        holder.remaining_ms,
                    )? {
                        return Ok(Err(holder));
                    }
                    continue;
                }
                Outcome::Conflict(None) => {
                    return Err(Error::Internal(
                        "a full read-write lock's conflict named no grant".into(),
                    ));
                }
            };
            let expires_at = self.checked(&mine, claim, reply.now)?;
            let listing =
                self.or_take_back(self.store.list(claim.partition, RWLOCK_WRITER_KEY), claim)?;
            let Some(writer) = self.or_give_back(live_writer(&listing), claim)? else {
                if expires_at > listing.now {
                    return Ok(Ok((mine.revision, expires_at)));
                }
                self.lapsed(claim, &mut lapses)?;
                continue;
            };
            // A writer holds the lock or waits for its readers: step aside,
            // then wait, reading, until its entry is gone.
            let stepped_aside = self.store.delete(
                claim.partition,
                claim.key,
                &guard(mine.revision, claim.owner),
            );
            self.or_take_back(stepped_aside, claim)?;
            let mut holder = holder(writer, listing.now)?;
            let mut listing = listing;
            loop {
                if !self.wait_for_change(
                    claim.partition,
                    patience,
                    &listing,
                    holder.remaining_ms,
                )? {
                    return Ok(Err(holder));
                }
                listing = self.store.list(claim.partition, RWLOCK_WRITER_KEY)?;
                match live_writer(&listing)? {
                    Some(writer) => holder = self::holder(writer, listing.now)?,
                    None => break,
                }
            }
        }
    }

    /// A writer: put the writer's key if absent, then list the readers;
    /// while any is live, keep the entry as a claim and wait. Answers the
    /// grant's (fence, expiry), or the holder in the way.
    fn acquire_write(
        &self,
        claim: &Claim,
        patience: &mut Patience,
    ) -> Result<Result<(u64, u64), Holder>, Error> {
        let put = self.store.put(
            claim.partition,
            claim.key,
            claim.owner.as_bytes(),
            Some(claim.ttl_ms),
            &Condition::Absent,
        );
        let mut reply = self.or_take_back(put, claim)?;
        let mut lapses = 0;
        // Once this writer has waited for readers, every claim it writes
        // again is short and raised only when granted: dying after its
        // first wait, it never keeps readers out for its whole TTL.
        let mut waited_for_readers = false;
        let claim_ms = claim.ttl_ms.min(WRITER_CLAIM_MS);
        'claim: loop {
            let put_ttl_ms = if waited_for_readers {
                claim_ms
            } else {
                claim.ttl_ms
            };
            let mine = match reply.outcome {
                Outcome::Applied(entry) => entry,
                Outcome::Conflict(Some(entry)) if entry.value == claim.owner.as_bytes() => entry,
                Outcome::Conflict(Some(other)) => {
                    // Another writer: wake on a change of the partition (its
                    // release, or its expiry) and try again in the same
                    // request. The partition's revision comes from a read:
                    // the other writer's own is older than the readers'
                    // writes, and a wait on it would end at once, again and
                    // again, while that writer holds.
                    let holder = holder(&other, reply.now)?;
                    let Some(wait_ms) = patience.next_wait(reply.now) else {
                        return Ok(Err(holder));
                    };
                    let listing = self.store.list(claim.partition, RWLOCK_WRITER_KEY)?;
                    let wait_ms = match live_writer(&listing)? {
                        Some(writer) => {
                            wait_ms.min(self::holder(writer, listing.now)?.remaining_ms)
                        }
                        None => 0,
                    };
                    let next = self.store.wait_then_put(
                        claim.partition,
                        claim.key,
                        claim.owner.as_bytes(),
                        Some(put_ttl_ms),
                        &Condition::Absent,
                        listing.revision,
                        wait_ms,
                    );
                    reply = self.or_take_back(next, claim)?;
                    continue;
                }
                Outcome::Conflict(None) => {
                    return Err(Error::Internal(
                        "create-if-absent failed but the store reported no entry".into(),
                    ));
                }
            };
            let expires_at = self.checked(&mine, claim, reply.now)?;
            let mut lowered = waited_for_readers;
            loop {
                let listing = self.or_take_back(
                    self.store.list(claim.partition, RWLOCK_READER_PREFIX),
                    claim,
                )?;
                let first_reader = self.or_give_back(first_live_reader(&listing), claim)?;
                let Some(reader) = first_reader else {
                    if !lowered {
                        if expires_at > listing.now {
                            return Ok(Ok((mine.revision, expires_at)));
                        }
                        self.lapsed(claim, &mut lapses)?;
                        reply = self.claim_again(claim, put_ttl_ms)?;
                        continue 'claim;
                    }
                    // The readers left while the claim was lowered: raise
                    // it to the grant's TTL, if it is still this claim.
                    let raise = self.store.touch(
                        claim.partition,
                        claim.key,
                        claim.ttl_ms,
                        &guard(mine.revision, claim.owner),
                    );
                    let raised = self.or_take_back(raise, claim)?;
                    match raised.outcome {
                        Outcome::Applied(entry) => {
                            let expires_at = self.checked(&entry, claim, raised.now)?;
                            return Ok(Ok((mine.revision, expires_at)));
                        }
                        Outcome::Conflict(_) => {
                            reply = self.claim_again(claim, claim_ms)?;
                            continue 'claim;
                        }
                    }
                };
                let holder = holder(reader, listing.now)?;
                let Some(wait_ms) = patience.next_wait(listing.now) else {
                    // Give up the claim, so readers need not wait out its
                    // TTL. A store that cannot be reached makes the answer
                    // `unavailable`, never `busy`, after a take-back.
                    let give_up = self.store.delete(
                        claim.partition,
                        claim.key,
                        &guard(mine.revision, claim.owner),
                    );
                    self.or_take_back(give_up, claim)?;
                    return Ok(Err(holder));
                };
                // Renew the claim for a short while only, so that a writer
                // that dies waiting does not keep readers out for its TTL.
                waited_for_readers = true;
                let renew = self.store.touch(
                    claim.partition,
                    claim.key,
                    claim_ms,
                    &guard(mine.revision, claim.owner),
                );
                let renewed = self.or_take_back(renew, claim)?;
                match renewed.outcome {
                    Outcome::Applied(entry) => {
                        self.checked(&entry, claim, renewed.now)?;
                        lowered = true;
                    }
                    Outcome::Conflict(_) => {
                        reply = self.claim_again(claim, claim_ms)?;
                        continue 'claim;
                    }
                }
                // Renewed at half the claim's life; at least 1 ms, so that
                // a TTL of a few milliseconds does not make it spin.
                let wait_ms = wait_ms.min(holder.remaining_ms).min((claim_ms / 2).max(1));
                self.or_take_back(
                    self.store.wait(claim.partition, listing.revision, wait_ms),
                    claim,
                )?;
            }
        }
    }

    /// A writer's claim lapsed while it waited (it expired, or was
    /// force-released): put it again, for `ttl_ms`.
    fn claim_again(&self, claim: &Claim, ttl_ms: u64) -> Result<WriteReply, Error> {
        let put = self.store.put(
            claim.partition,
            claim.key,
            claim.owner.as_bytes(),
            Some(ttl_ms),
            &Condition::Absent,
        );
        self.or_take_back(put, claim)
    }

    /// Block until `partition` changes after `listing` (or `cap_ms`, or
    /// the patience's next wait, passes); `false` when patience ran out.
    fn wait_for_change(
        &self,
        partition: &str,
        patience: &mut Patience,
        listing: &ListReply,
        cap_ms: u64,
    ) -> Result<bool, Error> {
        let Some(wait_ms) = patience.next_wait(listing.now) else {
            return Ok(false);
        };
        self.store
            .wait(partition, listing.revision, wait_ms.min(cap_ms))?;
        Ok(true)
    }

    /// After an attempt whose entry expired before the read that would
    /// have confirmed it (its TTL is shorter than the time the store took,
    /// or the caller was paused): such an entry never held the lock, and
    /// the attempt is made again, at most [`MAX_LAPSED_ATTEMPTS`] times in
    /// one acquire; past them the store is too slow for the TTL asked.
    fn lapsed(&self, claim: &Claim, lapses: &mut u32) -> Result<(), Error> {
        *lapses += 1;
        if *lapses > MAX_LAPSED_ATTEMPTS {
            return Err(Error::Unavailable(format!(
                "the grant's TTL ({} ms) ran out before the store confirmed it, {} times",
                claim.ttl_ms, *lapses
            )));
        }
        Ok(())
    }

    /// The expiry of this acquire's own entry as a write just left it,
    /// checked as the lock's grant is: written for this owner at a revision
    /// above 0 and alive past `now`. Anything else takes back what may be
    /// this call's and is `internal`.
    fn checked(&self, entry: &Entry, claim: &Claim, now: u64) -> Result<u64, Error> {
        let broken = |what: &str| {
            self.take_back(claim);
            Err(Error::Internal(format!(
                "the store granted a read-write lock {what} (revision {})",
                entry.revision
            )))
        };
        if entry.revision == 0 {
            return broken("at revision 0");
        }
        if entry.key != claim.key || entry.value != claim.owner.as_bytes() {
            return broken("to another owner");
        }
        match entry.expires_at {
            None => broken("with no expiry"),
            Some(end) if end <= now => broken("that had already expired"),
            Some(end) => Ok(end),
        }
    }

    /// Pass a reply on; when the store failed, first take back what this
    /// acquire may have written. Whatever the error: an `unavailable` write
    /// may still apply (as for the lock's acquire), and a read that failed
    /// after this acquire's write applied leaves that write behind.
    fn or_take_back<T>(&self, reply: Result<T, StoreError>, claim: &Claim) -> Result<T, Error> {
        reply.map_err(|error| {
            self.take_back(claim);
            error.into()
        })
    }

    /// Pass a decision on; when it is an error (the store broke its
    /// contract), first take back what this acquire may have written.
    fn or_give_back<T>(&self, decided: Result<T, Error>, claim: &Claim) -> Result<T, Error> {
        if decided.is_err() {
            self.take_back(claim);
        }
        decided
    }

    /// Free this acquire's entry if the store holds it: one read of its
    /// key and a delete guarded by what it found. Best effort.
    fn take_back(&self, claim: &Claim) {
        if let Ok(ReadReply {
            entry: Some(entry), ..
        }) = self.store.get(claim.partition, claim.key)
            && entry.value == claim.owner.as_bytes()
        {
            let _ = self.store.delete(
                claim.partition,
                claim.key,
                &guard(entry.revision, claim.owner),
            );
        }
    }

    /// `release` of `coord:sync/rwlock`: `true` when this call freed the grant.
    pub fn release(&self, grant: &Grant) -> Result<bool, Error> {
        check_grant(grant)?;
        let partition = keys::rwlock_partition(&grant.id, &grant.resource);
        let reply = self.store.delete(
            &partition,
            &key_of(grant.mode, &grant.owner),
            &guard(grant.fence, &grant.owner),
        )?;
        Ok(matches!(reply.outcome, Outcome::Applied(_)))
    }

    /// `extend` of `coord:sync/rwlock`.
    pub fn extend(&self, grant: &Grant, ttl_ms: Option<u64>) -> Result<ExtendOutcome, Error> {
        check_grant(grant)?;
        let ttl_ms = ttl_ms.unwrap_or(grant.ttl_ms);
        validate::ttl("ttl-ms", ttl_ms)?;
        let partition = keys::rwlock_partition(&grant.id, &grant.resource);
        let reply = self.store.touch(
            &partition,
            &key_of(grant.mode, &grant.owner),
            ttl_ms,
            &guard(grant.fence, &grant.owner),
        )?;
        match reply.outcome {
            Outcome::Applied(entry) => match entry.expires_at {
                Some(expires_at) if expires_at > reply.now && entry.revision == grant.fence => {
                    Ok(ExtendOutcome::Extended(Grant {
                        ttl_ms,
                        expires_at,
                        ..grant.clone()
                    }))
                }
                _ => Err(Error::Internal(format!(
                    "the store extended a read-write lock's grant to no live expiry (revision {})",
                    entry.revision
                ))),
            },
            Outcome::Conflict(_) => Ok(ExtendOutcome::Lost),
        }
    }

    /// `is-held` of `coord:sync/rwlock`: from one read, decided on the
    /// reply's `now` and the entry's expiry, whatever else the store said.
    pub fn is_held(&self, grant: &Grant) -> Result<bool, Error> {
        check_grant(grant)?;
        let partition = keys::rwlock_partition(&grant.id, &grant.resource);
        let reply = self
            .store
            .get(&partition, &key_of(grant.mode, &grant.owner))?;
        Ok(reply.entry.is_some_and(|entry| {
            entry.revision == grant.fence
                && entry.value == grant.owner.as_bytes()
                && entry.expires_at.is_some_and(|end| end > reply.now)
        }))
    }

    /// `inspect` of `coord:sync/rwlock`: the writer's entry and the live
    /// readers, in fence order.
    pub fn inspect(&self, id: &str, resource: &str) -> Result<Usage, Error> {
        check_names(id, resource, "id", "resource")?;
        let listing = self.store.list(&keys::rwlock_partition(id, resource), "")?;
        let mut writer = None;
        let mut readers = Vec::new();
        for entry in live(&listing) {
            let holder = holder(entry, listing.now)?;
            match holder.mode {
                Mode::Write => writer = Some(holder),
                Mode::Read => readers.push(holder),
            }
        }
        readers.sort_by_key(|h| h.fence);
        Ok(Usage {
            writer,
            readers,
            now: listing.now,
        })
    }

    /// `force-release` of `coord:sync/rwlock`: `true` when the grant with
    /// this fence was removed.
    pub fn force_release(&self, id: &str, resource: &str, fence: u64) -> Result<bool, Error> {
        check_names(id, resource, "id", "resource")?;
        if fence == 0 {
            return Err(Invalid::new("fence", "must be greater than 0").into());
        }
        let partition = keys::rwlock_partition(id, resource);
        let listing = self.store.list(&partition, "")?;
        let Some(grant) = live(&listing).find(|e| e.revision == fence) else {
            return Ok(false);
        };
        let reply = self
            .store
            .delete(&partition, &grant.key, &Condition::Revision(fence))?;
        Ok(matches!(reply.outcome, Outcome::Applied(_)))
    }
}

/// The key of a grant's entry: the writer's, or this reader's own.
fn key_of(mode: Mode, owner: &str) -> String {
    match mode {
        Mode::Write => RWLOCK_WRITER_KEY.to_string(),
        Mode::Read => format!("{RWLOCK_READER_PREFIX}{owner}"),
    }
}

/// The condition only this grant satisfies: its revision and owner token.
fn guard(fence: u64, owner: &str) -> Condition {
    Condition::RevisionAndValue(Guard {
        revision: fence,
        value: owner.as_bytes().to_vec(),
    })
}

/// The listing's entries that are live at its `now` (an entry a store
/// returns at or past its expiry holds nothing).
fn live(listing: &ListReply) -> impl Iterator<Item = &Entry> {
    listing
        .entries
        .iter()
        .filter(|e| e.expires_at.is_none_or(|end| end > listing.now))
}

/// The writer's entry in a listing of the writer's key, if live.
fn live_writer(listing: &ListReply) -> Result<Option<&Entry>, Error> {
    // The prefix `w` lists the writer's key and nothing else this
    // interface writes; anything else there is checked by `holder`.
    let writer = live(listing).next();
    if let Some(entry) = writer {
        holder(entry, listing.now)?;
    }
    Ok(writer)
}

/// The live reader that expires first in a listing of the readers.
fn first_live_reader(listing: &ListReply) -> Result<Option<&Entry>, Error> {
    let mut first: Option<&Entry> = None;
    for entry in live(listing) {
        holder(entry, listing.now)?;
        if first.is_none_or(|f| entry.expires_at < f.expires_at) {
            first = Some(entry);
        }
    }
    Ok(first)
}

/// A grant's entry as `acquire` wrote it, seen at store time `now`;
/// anything else (a key written by another program) is the store breaking
/// its contract, not a holder to wait for.
fn holder(entry: &Entry, now: u64) -> Result<Holder, Error> {
    let token = is_owner_token(&entry.value);
    let mode = if entry.key == RWLOCK_WRITER_KEY {
        Some(Mode::Write)
    } else {
        entry
            .key
            .strip_prefix(RWLOCK_READER_PREFIX)
            .filter(|owner| owner.as_bytes() == entry.value.as_slice())
            .map(|_| Mode::Read)
    };
    match (mode, entry.expires_at) {
        (Some(mode), Some(end)) if token && entry.revision > 0 => Ok(Holder {
            mode,
            fence: entry.revision,
            remaining_ms: end.saturating_sub(now),
        }),
        _ => Err(Error::Internal(format!(
            "a read-write lock entry is not a grant ({} key bytes, {} value bytes at revision {})",
            entry.key.len(),
            entry.value.len(),
            entry.revision
        ))),
    }
}

/// A grant record must be one `acquire` could have returned; a forged or
/// corrupted one is rejected by name before the store is asked.
fn check_grant(grant: &Grant) -> Result<(), Invalid> {
    check_held_record(
        HeldRecord::Grant,
        (&grant.id, &grant.resource, &grant.owner),
        grant.fence,
        grant.ttl_ms,
    )
}

#[cfg(test)]
mod tests;
