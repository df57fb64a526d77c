//! Waiters of one process take turns: of the calls in this process that
//! wait for the same key to become absent (a lock), or for a place under
//! the same limit (a semaphore), only the first one waits on the store, and
//! the others follow it in the order they came.
//!
//! Without it, every waiter of a lock waits on the store, and a release
//! wakes them all: one of them takes the lock and every other makes a call
//! that fails (a thundering herd, issue 52). Turns keeps one line per
//! partition and key for the `wait-then-put`s whose condition is `absent`
//! (a lock's acquire, a read-write lock's writer claim), and one per
//! partition and limit for those under `absent-and-fewer-than` (a
//! semaphore's acquire: each waiter puts its own key, but all count the
//! same places). Waking only the head loses no chance of a grant: all of
//! a line put under the same condition, so when the head's put fails every
//! other's would have failed too, and when it applies the key (or one
//! place) is taken. So:
//!
//! - only the head's call goes to the store; a release wakes it alone, and
//!   a handoff costs the release and the head's call, however many wait;
//! - the head that leaves (granted, busy, failed, or its request cut)
//!   hands its turn to the next, which first raises the revision it waits
//!   after to the last one at which a reply of the line showed its
//!   condition failing (a lock's: the key present, the grant just made
//!   included, so it waits for that holder's release instead of trying at
//!   once and failing; a semaphore's: the places full, so after a grant it
//!   tries at once, as another place may be free, and waits if not), and
//!   cuts its wait to the expiry that reply named (the holder's, or the
//!   permit that expires first), which may come before the one it knew;
//! - a waiter whose own timeout passes before its turn makes its put then,
//!   as `wait-then-put` promises, and returns its reply;
//! - a call that ends in a conflict keeps its place for a short grace
//!   ([`DEFAULT_GRACE`]), by its caller (a lock's value, a semaphore
//!   waiter's key: the owner token either way): a lock's
//!   `attempts` policy waits in slices of `delay-ms`, and each slice is a
//!   call of its own, so without the grace every waiter went to the back
//!   of the line at each slice and the order of arrival churned. The same
//!   acquisition calling again within the grace takes its place back;
//!   while it is away from the head of the line nobody else waits on the
//!   store (a release is not missed: the next call waits after the
//!   revision the line last saw its condition fail at), and one that does
//!   not come back (its acquire ended busy) holds the line for the grace
//!   at most.
//!
//! The order of arrival holds for grants made on a release. A waiter
//! whose own wait ends first (an expiry it knew of, a slice of `attempts`)
//! tries then, from wherever it is in the line, as its policy promises.
//!
//! It is a property of one process: waiters in different processes each
//! have their own line, so a release wakes one waiter per process. Calls
//! under other conditions go straight to the store.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::Notify;

use super::*;

/// A backend whose lock and semaphore waiters take turns (see the module's
/// docs).
/// [`crate::Runtime`] and `coord serve` put it around their backend; an
/// embedder that builds its own `HostState`s for many instances should give
/// them all one `Turns` around the store.
pub struct Turns {
    inner: Arc<dyn Backend>,
    lines: Mutex<Lines>,
    /// How long a call that ended in a conflict keeps its place.
    grace: Mutex<Duration>,
    /// The store's clock as the latest reply told it, and when that reply
    /// came: what a waiter's time in line is counted on, beside the host's.
    clock: Mutex<Option<(Millis, Instant)>>,
}

/// How long a call that ended in a conflict keeps its place in its line,
/// by default: far longer than an acquire takes between two of its calls
/// (microseconds of the component's own work), short beside a lock's
/// `delay-ms` of 200.
pub const DEFAULT_GRACE: Duration = Duration::from_millis(100);

/// What the calls of one line wait for, in one partition.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Goal {
    /// This key absent (`absent`): a lock's holder key.
    Absent(String),
    /// A place under this limit (`absent-and-fewer-than`): a semaphore's.
    Place(u32),
}

/// A line: the partition and what its calls wait for.
type LineId = (String, Goal);

/// Every line, and when places past their grace were last dropped from
/// all of them.
#[derive(Default)]
struct Lines {
    by_key: HashMap<LineId, Line>,
    swept_at: Option<Instant>,
}

/// One call's place in a line.
struct Waiter {
    ticket: u64,
    notify: Arc<Notify>,
    /// Who called: a lock's owner token (its value), a semaphore
    /// waiter's (its key). The same acquisition calling again takes this
    /// place back.
    caller: Vec<u8>,
    /// Set while the call that held this place has ended in a conflict:
    /// until when the place waits for it to call again.
    away_until: Option<Instant>,
}

/// The waiters for one goal of one partition.
#[derive(Default)]
struct Line {
    /// Places in the order their calls first came; the front one is the
    /// head.
    waiting: VecDeque<Waiter>,
    /// The next ticket to give.
    next_ticket: u64,
    /// The latest revision at which a reply of this line's showed its
    /// condition failing (the key present; the places full): no put of the
    /// line can apply before a change after it.
    blocked_at: u64,
    /// The expiry of the entry that reply named (the key's holder; the
    /// permit that expires first), if it had one: the condition may hold
    /// from then on with no write to wake anyone.
    blocked_until: Option<Millis>,
}

impl Turns {
    /// `inner`, with its lock and semaphore waiters taking turns.
    pub fn new(inner: Arc<dyn Backend>) -> Self {
        Turns {
            inner,
            lines: Mutex::default(),
            grace: Mutex::new(DEFAULT_GRACE),
            clock: Mutex::default(),
        }
    }

    /// Set how long a call that ended in a conflict keeps its place
    /// ([`DEFAULT_GRACE`] until set): a test that must not depend on the
    /// machine's speed sets a long one.
    pub fn set_grace(&self, grace: Duration) {
        *self.grace.lock().unwrap_or_else(|e| e.into_inner()) = grace;
    }

    fn grace(&self) -> Duration {
        *self.grace.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many calls wait in the line for `key` of `partition` now, the
    /// head included (not the places kept for calls that ended): for tests
    /// and metrics.
    pub fn in_line(&self, partition: &str, key: &str) -> usize {
        self.waiting(&(partition.to_string(), Goal::Absent(key.to_string())))
    }

    /// How many calls wait in the line for a place under `limit` in
    /// `partition` (a semaphore's) now, as [`in_line`](Self::in_line) counts.
    pub fn in_line_for_a_place(&self, partition: &str, limit: u32) -> usize {
        self.waiting(&(partition.to_string(), Goal::Place(limit)))
    }

    fn waiting(&self, line: &LineId) -> usize {
        self.lines().by_key.get(line).map_or(0, |line| {
            line.waiting
                .iter()
                .filter(|w| w.away_until.is_none())
                .count()
        })
    }

    fn lines(&self) -> MutexGuard<'_, Lines> {
        // A panic while the map was held left it whole: every change to it
        // is one statement.
        self.lines.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Note the store's clock from a reply.
    fn saw(&self, now: Millis) {
        let mut clock = self.clock.lock().unwrap_or_else(|e| e.into_inner());
        if clock.is_none_or(|(seen, _)| now >= seen) {
            *clock = Some((now, Instant::now()));
        }
    }

    /// The store's clock now, as the latest reply and the host's time since
    /// tell it; `None` before any reply.
    fn store_now(&self) -> Option<Millis> {
        let clock = self.clock.lock().unwrap_or_else(|e| e.into_inner());
        clock.map(|(seen, at)| seen.saturating_add(millis(at.elapsed())))
    }

    /// Join the line for `line` (or take back the place the same `caller`
    /// kept, within its grace): this call's place in it.
    fn join(&self, line: &LineId, caller: &[u8]) -> (Place<'_>, Arc<Notify>) {
        let notify = Arc::new(Notify::new());
        let mut lines = self.lines();
        self.sweep(&mut lines);
        let waiting = lines.by_key.entry(line.clone()).or_default();
        waiting.drop_kept(Instant::now());
        let kept = waiting
            .waiting
            .iter_mut()
            .find(|w| w.away_until.is_some() && w.caller == caller);
        let ticket = match kept {
            Some(place) => {
                place.away_until = None;
                place.notify = notify.clone();
                place.ticket
            }
            None => {
                let ticket = waiting.next_ticket;
                waiting.next_ticket += 1;
                waiting.waiting.push_back(Waiter {
                    ticket,
                    notify: notify.clone(),
                    caller: caller.to_vec(),
                    away_until: None,
                });
                ticket
            }
        };
        let place = Place {
            turns: self,
            line: line.clone(),
            ticket,
            keep: false,
        };
        (place, notify)
    }

    /// Drop the places whose grace has passed from every line, at most
    /// once a grace: a line whose callers all went stays no longer.
    fn sweep(&self, lines: &mut Lines) {
        let now = Instant::now();
        let grace = self.grace();
        if lines
            .swept_at
            .is_some_and(|at| now.saturating_duration_since(at) < grace)
        {
            return;
        }
        lines.swept_at = Some(now);
        lines.by_key.retain(|_, line| {
            line.drop_kept(now);
            !line.waiting.is_empty()
        });
    }

    /// Whether `ticket` is the head of `line` now (a place kept past its
    /// grace at the front dropped first), and, when it is not, until when
    /// a place kept at the front may hold the line.
    fn is_head(&self, line: &LineId, ticket: u64) -> (bool, Option<Instant>) {
        let mut lines = self.lines();
        let Some(l) = lines.by_key.get_mut(line) else {
            return (false, None);
        };
        l.drop_kept(Instant::now());
        match l.waiting.front() {
            Some(front) if front.ticket == ticket => (true, None),
            Some(front) => (false, front.away_until),
            None => (false, None),
        }
    }

    /// The revision the head should wait after: its own, or later when the
    /// line saw its condition fail later, with the expiry that reply named
    /// (which the head's own wait may not know of).
    fn after(&self, line: &LineId, after: u64) -> (u64, Option<Millis>) {
        match self.lines().by_key.get(line) {
            Some(l) if l.blocked_at > after => (l.blocked_at, l.blocked_until),
            _ => (after, None),
        }
    }

    /// Note a reply that showed the line's condition failing at `revision`,
    /// naming an entry that expires at `until`.
    fn seen_blocked(&self, line: &LineId, revision: u64, until: Option<Millis>) {
        if let Some(l) = self.lines().by_key.get_mut(line)
            && revision >= l.blocked_at
        {
            (l.blocked_at, l.blocked_until) = (revision, until);
        }
    }

    /// Leave the line, or, with `keep`, keep the place for the grace; when
    /// this was the head, or a kept place is now at the head, wake the first
    /// call waiting (to take its turn, or to learn how long the kept place
    /// may hold it: the call that knew may be this one).
    fn leave(&self, line: &LineId, ticket: u64, keep: bool) {
        let grace = self.grace();
        let mut lines = self.lines();
        self.sweep(&mut lines);
        let Some(l) = lines.by_key.get_mut(line) else {
            return;
        };
        let was_head = l.waiting.front().is_some_and(|w| w.ticket == ticket);
        if keep {
            if let Some(place) = l.waiting.iter_mut().find(|w| w.ticket == ticket) {
                place.away_until = Some(Instant::now() + grace);
            }
        } else {
            l.waiting.retain(|w| w.ticket != ticket);
        }
        if l.waiting.is_empty() {
            lines.by_key.remove(line);
        } else if was_head || l.waiting.front().is_some_and(|w| w.away_until.is_some()) {
            l.wake_next();
        }
    }
}

impl Line {
    /// Drop the places kept past their grace; when the head was one, wake
    /// the new head.
    fn drop_kept(&mut self, now: Instant) {
        let head = self.waiting.front().map(|w| w.ticket);
        self.waiting
            .retain(|w| w.away_until.is_none_or(|until| until > now));
        if self.waiting.front().map(|w| w.ticket) != head {
            self.wake_next();
        }
    }

    /// Wake the first call waiting (behind a kept head, to learn how long
    /// it may wait).
    fn wake_next(&self) {
        // A permit is kept if the call is not listening yet.
        if let Some(next) = self.waiting.iter().find(|w| w.away_until.is_none()) {
            next.notify.notify_one();
        }
    }
}

/// A call's place in a line; leaving it (however the call ends, a cut
/// request included) passes the turn on.
struct Place<'a> {
    turns: &'a Turns,
    line: LineId,
    ticket: u64,
    /// Whether the call ended in a conflict: its place is kept for the
    /// grace, for the same acquisition's next call.
    keep: bool,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.turns.leave(&self.line, self.ticket, self.keep);
    }
}

#[async_trait]
impl Backend for Turns {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    async fn now(&self) -> Result<Millis, StoreError> {
        let now = self.inner.now().await?;
        self.saw(now);
        Ok(now)
    }
    async fn ready(&self) -> Result<(), StoreError> {
        self.inner.ready().await
    }
    fn warnings(&self) -> Vec<String> {
        self.inner.warnings()
    }
    async fn get(&self, partition: &str, key: &str) -> Result<ReadReply, StoreError> {
        let reply = self.inner.get(partition, key).await?;
        self.saw(reply.now);
        Ok(reply)
    }
    async fn list(&self, partition: &str, prefix: &str) -> Result<ListReply, StoreError> {
        let reply = self.inner.list(partition, prefix).await?;
        self.saw(reply.now);
        Ok(reply)
    }
    async fn put(
        &self,
        partition: &str,
        key: &str,
        value: &[u8],
        ttl_ms: Option<u64>,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        let reply = self
            .inner
            .put(partition, key, value, ttl_ms, condition)
            .await?;
        self.saw(reply.now);
        Ok(reply)
    }
    async fn delete(
        &self,
        partition: &str,
        key: &str,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        self.inner.delete(partition, key, condition).await
    }
    async fn touch(
        &self,
        partition: &str,
        key: &str,
        ttl_ms: u64,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        self.inner.touch(partition, key, ttl_ms, condition).await
    }
    async fn changes(
        &self,
        partition: &str,
        after: u64,
        max: u32,
    ) -> Result<ChangesReply, StoreError> {
        self.inner.changes(partition, after, max).await
    }
    async fn meter(
        &self,
        partition: &str,
        key: &str,
        request: &MeterRequest,
    ) -> Result<MeterReply, StoreError> {
        self.inner.meter(partition, key, request).await
    }
    async fn wait(&self, partition: &str, after: u64, timeout_ms: u64) -> Result<u64, StoreError> {
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
        let (goal, caller) = match condition {
            Condition::Absent if timeout_ms > 0 => (Goal::Absent(key.to_string()), value),
            Condition::AbsentAndFewerThan(limit) if timeout_ms > 0 => {
                (Goal::Place(*limit), key.as_bytes())
            }
            _ => {
                return self
                    .inner
                    .wait_then_put(partition, key, value, ttl_ms, condition, after, timeout_ms)
                    .await;
            }
        };
        let started = Instant::now();
        let started_store = self.store_now();
        let line = (partition.to_string(), goal);
        let (mut place, notify) = self.join(&line, caller);
        // The timeout is on the store's clock. While the call waits its
        // turn here the host's clock stands in for it, and at its turn the
        // time spent is the more of the two clocks' (a store's clock may
        // be a test's, moved by hand); what is left goes to the store.
        let until = started + Duration::from_millis(timeout_ms);
        let (mut head, mut kept_until) = self.is_head(&line, place.ticket);
        while !head {
            // A place kept at the head holds the line no longer than its
            // grace: wake then to look again.
            let wake = kept_until.map_or(until, |kept: Instant| kept.min(until));
            tokio::select! {
                () = notify.notified() => {}
                () = tokio::time::sleep_until(wake.into()) => {
                    if Instant::now() >= until {
                        break;
                    }
                }
            }
            (head, kept_until) = self.is_head(&line, place.ticket);
        }
        let (after, wait_ms) = if head {
            let on_store = match (started_store, self.store_now()) {
                (Some(then), Some(now)) => now.saturating_sub(then),
                _ => 0,
            };
            let spent = millis(started.elapsed()).max(on_store);
            let wait_ms = timeout_ms.saturating_sub(spent);
            let (after, blocked_until) = self.after(&line, after);
            // Wake at the expiry the line learned of, at least 1 ms on: an
            // entry named at its expiry must not make a call with no wait.
            let wait_ms = match (blocked_until, self.store_now()) {
                (Some(until), Some(now)) => wait_ms.min(until.saturating_sub(now).max(1)),
                _ => wait_ms,
            };
            (after, wait_ms)
        } else {
            // Its timeout passed before its turn: put now, as promised.
            (after, 0)
        };
        let reply = self
            .inner
            .wait_then_put(partition, key, value, ttl_ms, condition, after, wait_ms)
            .await;
        if let Ok(reply) = &reply {
            self.saw(reply.now);
            place.keep = matches!(reply.outcome, Outcome::Conflict(_));
            let blocked = match (&line.1, &reply.outcome) {
                // The key present: granted to this call, or held.
                (Goal::Absent(_), Outcome::Applied(entry)) => Some(entry),
                (Goal::Absent(_), Outcome::Conflict(Some(entry))) if entry.key == key => {
                    Some(entry)
                }
                // Full (a conflict naming another permit); a grant may
                // leave a place free for the next.
                (Goal::Place(_), Outcome::Conflict(Some(entry))) if entry.key != key => Some(entry),
                _ => None,
            };
            if let Some(entry) = blocked {
                self.seen_blocked(&line, reply.revision, entry.expires_at);
            }
        }
        drop(place);
        reply
    }
}

/// A duration in whole milliseconds.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
