//! The store contract's semantics over plain memory, one partition at a time.
//!
//! [`Partition`] is the single implementation of what `wit/store.wit`
//! promises — conditions, revisions, TTLs, the bounded change feed and its
//! expire events — for every store that keeps its data in this process: the
//! host's in-memory backend wraps it in a lock and adds waiting, and the
//! unit tests' fake store wraps it in a `RefCell` with a clock they move.
//! Time is passed in (`now`) on every call, so the caller owns the clock.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::meter::{self, MeterState, Write};

mod snapshot;
use crate::store::{
    Change, ChangeKind, Condition, Entry, Guard, MeterReply, MeterRequest, Outcome, StoreError,
};

/// How many changes a partition's feed keeps by default.
pub const DEFAULT_HISTORY: usize = 1024;

/// One partition: its live entries, its latest revision and its change feed.
#[derive(Debug, Clone)]
pub struct Partition {
    revision: u64,
    entries: BTreeMap<String, Entry>,
    /// `(expires-at, key)` of every entry with a TTL, so expiry costs
    /// O(log n) per call instead of a scan of the partition.
    expiries: BTreeSet<(u64, String)>,
    feed: VecDeque<Change>,
    history: usize,
    /// The revision this incarnation of the partition started after (its
    /// first write's floor less one; 0 before it): `changes` after 0 reads
    /// from here.
    created: u64,
    /// The feed holds every change with a greater revision than this.
    complete_after: u64,
    /// Rate-limit meters: state and when it expires. Not entries: no revision, no feed.
    meters: BTreeMap<String, (MeterState, u64)>,
    /// The store's clock in microseconds for this call, when the store
    /// reads one finer than its milliseconds: revisions are floored at it.
    /// Not part of the snapshot; it holds for the call that set it.
    clock_us: u64,
    /// Live entries the store keeps outside this value, for a store that
    /// loads only the entries a call touches ([`Partition::count_outside`]).
    /// Not part of the snapshot.
    outside: usize,
}

impl Partition {
    /// An empty partition whose feed keeps the last `history` changes (at least 1).
    pub fn new(history: usize) -> Self {
        Partition {
            revision: 0,
            entries: BTreeMap::new(),
            expiries: BTreeSet::new(),
            feed: VecDeque::new(),
            history: history.max(1),
            created: 0,
            complete_after: 0,
            meters: BTreeMap::new(),
            clock_us: 0,
            outside: 0,
        }
    }

    /// The latest revision (0 before the first write).
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The earliest store time at which a live entry expires.
    pub fn next_expiry(&self) -> Option<u64> {
        self.expiries.first().map(|(at, _)| *at)
    }

    /// Whether the partition holds no live entries and no meters.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.meters.is_empty()
    }

    /// The latest store time at which a live entry or a meter of the
    /// partition expires (`Some(0)` when it holds neither); `None` when an
    /// entry never expires. After it, the partition holds nothing live.
    pub fn lives_until(&self) -> Option<u64> {
        if self.entries.values().any(|e| e.expires_at.is_none()) {
            return None;
        }
        let entries = self.expiries.last().map_or(0, |(at, _)| *at);
        let meters = self.meters.values().map(|(_, at)| *at).max().unwrap_or(0);
        Some(entries.max(meters))
    }

    /// Keep at most the `keep` latest changes of the feed, as its bound does:
    /// a reader from before the dropped ones is told `history-gone`. For a
    /// store whose values have a size limit (one message per partition).
    pub fn trim_feed(&mut self, keep: usize) {
        while self.feed.len() > keep {
            if let Some(dropped) = self.feed.pop_front() {
                self.complete_after = dropped.revision;
            }
        }
    }

    /// How many changes the feed holds now.
    pub fn feed_len(&self) -> usize {
        self.feed.len()
    }

    /// About how many bytes the live entries take when encoded: their keys
    /// and values, and a fixed allowance for the rest of each.
    pub fn live_bytes(&self) -> usize {
        self.entries
            .iter()
            .map(|(key, entry)| key.len() + entry.value.len() + 32)
            .sum()
    }

    /// About how many bytes the feed's changes take when encoded: their
    /// keys and values, and a fixed allowance for the rest of each.
    pub fn feed_bytes(&self) -> usize {
        self.feed.iter().map(change_bytes).sum()
    }

    /// Drop the oldest changes of the feed until it takes at most
    /// `max_bytes` ([`Partition::feed_bytes`]), as [`Partition::trim_feed`]
    /// does: a reader from before the dropped ones is told `history-gone`.
    /// For a store that writes the whole partition on every write, so that
    /// a write's cost is bounded by the live entries plus this.
    pub fn trim_feed_to_bytes(&mut self, max_bytes: usize) {
        let mut bytes = self.feed_bytes();
        while bytes > max_bytes {
            let Some(dropped) = self.feed.pop_front() else {
                break;
            };
            bytes -= change_bytes(&dropped);
            self.complete_after = dropped.revision;
        }
    }

    /// Run the rate-limit meter on `key` at `now` (see [`meter::decide`]).
    pub fn meter(&mut self, key: &str, request: &MeterRequest, now: u64) -> MeterReply {
        let state = self
            .meters
            .get(key)
            .filter(|(_, expires)| *expires > now)
            .map(|(s, _)| *s);
        let (reply, write) = meter::decide(state, request, now);
        match write {
            Write::Keep => {}
            Write::Put(state, ttl) => {
                self.meters
                    .insert(key.to_string(), (state, now.saturating_add(ttl)));
            }
            Write::Delete => {
                self.meters.remove(key);
            }
        }
        reply
    }

    /// Floor the revisions this call issues at the store's clock in
    /// microseconds, `clock_us`, as well as at its milliseconds × 1000: a
    /// store that reads a finer clock (PostgreSQL's, the host's) then keeps
    /// fences rising across a restart in the same millisecond as the last
    /// write before it.
    pub fn floor_at_micros(&mut self, clock_us: u64) {
        self.clock_us = clock_us;
    }

    /// Put an entry the store kept elsewhere back into this partition as it
    /// was stored: no new revision, no change in the feed. For a store that
    /// keeps a partition's entries apart (a row each) and loads only those
    /// a call touches; an entry already here is replaced.
    pub fn adopt(&mut self, entry: Entry) {
        self.unindex(&entry.key);
        if let Some(at) = entry.expires_at {
            self.expiries.insert((at, entry.key.clone()));
        }
        self.entries.insert(entry.key.clone(), entry);
    }

    /// Take every entry out of this partition (to store each apart), in
    /// key order; what remains is the revision, the feed and the meters.
    pub fn take_entries(&mut self) -> BTreeMap<String, Entry> {
        self.expiries.clear();
        std::mem::take(&mut self.entries)
    }

    /// How many live entries the store keeps outside this partition's
    /// value for the call at hand: counted by `absent-and-fewer-than` as if
    /// they were here. A store that loads only some entries of a partition
    /// ([`Partition::adopt`]) says how many others are live, having loaded
    /// every entry due to expire by the call's now and the one that
    /// expires first after it, so that expiry and the conflict's holder
    /// are decided as on the whole partition. Not part of the snapshot.
    pub fn count_outside(&mut self, live: usize) {
        self.outside = live;
    }

    /// How many live entries the partition holds, this value's and
    /// [`Partition::count_outside`]'s together.
    pub fn live_count(&self) -> usize {
        self.entries.len() + self.outside
    }

    /// Expire every entry whose TTL has run out by `now`, recording an
    /// `expire` change for each, in the order they expired. Returns how many.
    pub fn sweep(&mut self, now: u64) -> usize {
        self.meters.retain(|_, (_, expires)| *expires > now);
        let mut expired = 0;
        while let Some((at, key)) = self.expiries.pop_first() {
            if at > now {
                self.expiries.insert((at, key));
                break;
            }
            self.entries.remove(&key);
            self.record(ChangeKind::Expire, &key, Vec::new(), at);
            expired += 1;
        }
        expired
    }

    /// The live entry under `key`.
    pub fn get(&mut self, key: &str, now: u64) -> Option<Entry> {
        self.sweep(now);
        self.entries.get(key).cloned()
    }

    /// The live entries whose keys start with `prefix`, in key order.
    pub fn list(&mut self, prefix: &str, now: u64) -> Vec<Entry> {
        self.sweep(now);
        self.entries
            .range(prefix.to_string()..)
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(_, e)| e.clone())
            .collect()
    }

    /// Write `value` under `key` if `condition` holds.
    pub fn put(
        &mut self,
        key: &str,
        value: &[u8],
        ttl_ms: Option<u64>,
        condition: &Condition,
        now: u64,
    ) -> Outcome {
        self.sweep(now);
        if let Some(conflict) = self.check(key, condition) {
            return conflict;
        }
        let revision = self.record(ChangeKind::Put, key, value.to_vec(), now);
        let entry = Entry {
            key: key.to_string(),
            value: value.to_vec(),
            revision,
            updated_at: now,
            expires_at: ttl_ms.map(|ttl| now.saturating_add(ttl)),
        };
        self.unindex(key);
        if let Some(at) = entry.expires_at {
            self.expiries.insert((at, key.to_string()));
        }
        self.entries.insert(key.to_string(), entry.clone());
        Outcome::Applied(entry)
    }

    /// Remove `key` if it is live and `condition` holds.
    pub fn delete(&mut self, key: &str, condition: &Condition, now: u64) -> Outcome {
        self.sweep(now);
        if let Some(conflict) = self.check_live(key, condition) {
            return conflict;
        }
        self.unindex(key);
        let Some(entry) = self.entries.remove(key) else {
            return Outcome::Conflict(None);
        };
        self.record(ChangeKind::Delete, key, Vec::new(), now);
        Outcome::Applied(entry)
    }

    /// Renew the TTL of the live entry under `key` if `condition` holds; no new revision.
    pub fn touch(&mut self, key: &str, ttl_ms: u64, condition: &Condition, now: u64) -> Outcome {
        self.sweep(now);
        if let Some(conflict) = self.check_live(key, condition) {
            return conflict;
        }
        self.unindex(key);
        match self.entries.get_mut(key) {
            Some(entry) => {
                let at = now.saturating_add(ttl_ms);
                entry.expires_at = Some(at);
                self.expiries.insert((at, key.to_string()));
                Outcome::Applied(entry.clone())
            }
            None => Outcome::Conflict(None),
        }
    }

    /// At most `max` changes with a revision greater than `after`, or
    /// `history-gone` when the feed no longer reaches back that far (or
    /// `after` is a revision this partition never reached).
    pub fn changes(&mut self, after: u64, max: u32, now: u64) -> Result<Vec<Change>, StoreError> {
        self.sweep(now);
        // 0 reads from this incarnation's first change.
        let after = if after == 0 { self.created } else { after };
        // A revision from before this incarnation, or one it never reached,
        // means the store lost data.
        if after < self.complete_after || after > self.revision {
            return Err(StoreError::HistoryGone(self.complete_after));
        }
        Ok(self
            .feed
            .iter()
            .filter(|c| c.revision > after)
            .take(max as usize)
            .cloned()
            .collect())
    }

    /// Drop `key`'s entry, if any, from the expiry index.
    fn unindex(&mut self, key: &str) {
        if let Some(at) = self.entries.get(key).and_then(|e| e.expires_at) {
            self.expiries.remove(&(at, key.to_string()));
        }
    }

    /// `None` when `condition` holds for `key`, else the conflict to report.
    fn check(&self, key: &str, condition: &Condition) -> Option<Outcome> {
        let current = self.entries.get(key);
        let holds = match (condition, current) {
            (Condition::Always, _) => true,
            (Condition::Absent, current) => current.is_none(),
            (Condition::Revision(rev), Some(e)) => e.revision == *rev,
            (Condition::RevisionAndValue(Guard { revision, value }), Some(e)) => {
                e.revision == *revision && e.value == *value
            }
            (Condition::AbsentAndFewerThan(limit), None) => {
                if self.live_count() < *limit as usize {
                    return None;
                }
                return Some(Outcome::Conflict(self.first_to_expire()));
            }
            (Condition::AbsentAndFewerThan(_), Some(_)) => false,
            (_, None) => false,
        };
        (!holds).then(|| Outcome::Conflict(current.cloned()))
    }

    /// The live entry that expires first; one without an expiry only when
    /// none has one (`absent-and-fewer-than`'s conflict).
    fn first_to_expire(&self) -> Option<Entry> {
        let key = match self.expiries.first() {
            Some((_, key)) => key,
            None => self.entries.keys().next()?,
        };
        self.entries.get(key).cloned()
    }

    /// Like `check`, but an absent key never satisfies the condition (delete, touch).
    fn check_live(&self, key: &str, condition: &Condition) -> Option<Outcome> {
        if !self.entries.contains_key(key) {
            return Some(Outcome::Conflict(None));
        }
        self.check(key, condition)
    }

    /// Append a change with the next revision, trimming the feed to its bound.
    ///
    /// No revision is below the store time in microseconds (`at` × 1000,
    /// or the finer clock [`Partition::floor_at_micros`] gave), the floor
    /// the Redis script also keeps: a partition that starts afresh
    /// (a new process; a partition dropped and made again) issues revisions
    /// above every one an earlier incarnation issued, as `wit/store.wit`
    /// requires, as long as the clock does not go back and the partition
    /// did not average more than one write per microsecond.
    fn record(&mut self, kind: ChangeKind, key: &str, value: Vec<u8>, at: u64) -> u64 {
        let floor = at.saturating_mul(1000).max(self.clock_us);
        if self.revision == 0 {
            // A new incarnation: its feed is complete from here on.
            self.created = floor.saturating_sub(1);
            self.complete_after = self.created;
            self.revision = self.created;
        }
        self.revision = self.revision.saturating_add(1).max(floor);
        self.feed.push_back(Change {
            kind,
            key: key.to_string(),
            value,
            revision: self.revision,
            at,
        });
        self.trim_feed(self.history);
        self.revision
    }
}

/// [`Partition::feed_bytes`] of one change: its key and value, and 32 bytes
/// for its kind, revision, time and lengths.
fn change_bytes(change: &Change) -> usize {
    change.key.len() + change.value.len() + 32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_feed_trimmed_to_bytes_keeps_the_newest_changes_and_says_what_it_dropped() {
        let mut p = Partition::new(1024);
        for n in 0..100u64 {
            p.put("k", &[b'x'; 1000], None, &Condition::Always, n);
        }
        assert_eq!(p.feed_len(), 100);
        p.trim_feed_to_bytes(10_000);
        assert!(p.feed_bytes() <= 10_000, "{} bytes", p.feed_bytes());
        assert_eq!(p.feed_len(), 9, "the newest that fit: 9 of 1033 bytes");
        let latest = p.revision();
        // A reader from before the kept changes is told history-gone; one
        // from the last dropped change reads all that were kept.
        assert!(p.changes(0, 100, 100).is_err());
        let kept = p.changes(p.complete_after, 100, 100).unwrap();
        assert_eq!(kept.len(), 9);
        assert_eq!(kept.last().map(|c| c.revision), Some(latest));
    }

    /// The expiry index against a scan of the entries, after every step.
    fn assert_index_matches(p: &Partition) {
        let scanned: BTreeSet<(u64, String)> = p
            .entries
            .iter()
            .filter_map(|(k, e)| e.expires_at.map(|at| (at, k.clone())))
            .collect();
        assert_eq!(p.expiries, scanned);
    }

    #[test]
    fn the_expiry_index_follows_puts_touches_deletes_and_expiries() {
        let mut p = Partition::new(16);
        let put = |p: &mut Partition, key: &str, ttl: Option<u64>, now: u64| {
            p.put(key, b"v", ttl, &Condition::Always, now);
            assert_index_matches(p);
        };
        put(&mut p, "a", Some(100), 0);
        put(&mut p, "b", Some(50), 0);
        put(&mut p, "c", None, 0);
        assert_eq!(p.next_expiry(), Some(50));
        put(&mut p, "b", None, 10); // rewritten without a TTL
        assert_eq!(p.next_expiry(), Some(100));
        p.touch("a", 500, &Condition::Always, 20);
        assert_index_matches(&p);
        assert_eq!(p.next_expiry(), Some(520));
        put(&mut p, "d", Some(5), 30);
        p.delete("d", &Condition::Always, 31);
        assert_index_matches(&p);
        put(&mut p, "e", Some(10), 40);
        put(&mut p, "f", Some(10), 40);
        assert_eq!(p.sweep(49), 0);
        assert_eq!(p.sweep(50), 2, "e and f expire at 50");
        assert_index_matches(&p);
        let expired: Vec<_> = p
            .feed
            .iter()
            .filter(|c| c.kind == ChangeKind::Expire)
            .map(|c| (c.key.clone(), c.at))
            .collect();
        assert_eq!(expired, [("e".to_string(), 50), ("f".to_string(), 50)]);
        assert_eq!(p.sweep(10_000), 1, "a expires");
        assert_eq!(p.next_expiry(), None);
        assert!(p.get("a", 10_000).is_none());
        assert!(p.get("c", 10_000).is_some(), "no TTL, no expiry");
    }

    #[test]
    fn revisions_start_above_the_clock_so_a_restarted_store_never_reissues_one() {
        let mut before = Partition::new(16);
        let first = before.put("a", b"v", None, &Condition::Always, 5);
        let second = before.put("a", b"w", None, &Condition::Always, 5);
        let (Outcome::Applied(first), Outcome::Applied(second)) = (first, second) else {
            panic!("unconditional puts apply");
        };
        // The first write of a new partition gets the store time in µs;
        // writes within one millisecond count up from there.
        assert_eq!((first.revision, second.revision), (5_000, 5_001));
        // A write a millisecond later jumps to the clock.
        before.delete("a", &Condition::Always, 6);
        assert_eq!(before.revision(), 6_000);

        // The process restarts with nothing: a new partition, a millisecond on.
        let mut after = Partition::new(16);
        after.put("b", b"v", None, &Condition::Always, 7);
        assert!(after.revision() > before.revision());
        // A reader from before the loss must resync; 0 still reads the
        // new incarnation from its first change.
        assert!(matches!(
            after.changes(before.revision(), 10, 7),
            Err(StoreError::HistoryGone(_))
        ));
        let from_start = after.changes(0, 10, 7).map(|c| c.len());
        assert!(matches!(from_start, Ok(1)), "{from_start:?}");
    }
}
