//! What an instance holds, so that nothing outlives a request cut short;
//! and releases finished in the background when the store was unreachable.
//!
//! A function that returns keeps what it chose to keep (a route may hand a
//! lock to its client on purpose). But when the runtime ends a request
//! itself — its deadline, a trap, a shutdown past the grace — the locks and
//! leases its instance took were never answered with, and without this they
//! stayed held for their whole TTL (outside testers: one anonymous request
//! with `ttl_ms=86400000` cut at its 2 s deadline locked an item for a day).
//! So the host keeps a ledger of the lock and lease entries an instance's
//! writes created ([`Holdings`]), and [`Holdings::give_back`] removes each
//! with a write guarded by its revision and value: it can only ever remove
//! that holding, never a later one (as ZooKeeper's ephemeral nodes and
//! Consul's sessions end with their session).
//!
//! A release guarded the same way that failed as `unavailable` can be
//! finished later with the same guarantee, so [`finish_in_background`]
//! retries it until it lands or conflicts (the holding already gone: the
//! TTL passed, or somebody freed it), instead of leaving the lock held for
//! the rest of its TTL after the store came back.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use coord_component::keys;
use coord_component::lease::{GiveUp, give_up};
use coord_component::store::{Condition, Guard, Outcome, StoreError, WriteReply};

use crate::backend::Backend;

/// The kind of partition a lock lives in (`keys::lock_partition`).
const LOCK_KIND: &str = "~lock";
/// The kind of partition a lease lives in (`keys::lease_partition`).
const LEASE_KIND: &str = "~lease";
/// The kind of partition a semaphore's permits live in
/// (`keys::semaphore_partition`): each permit is an entry keyed by its
/// owner token, so it is held, given back and taken back as a lock is.
const SEMAPHORE_KIND: &str = "~sem";
/// The kind of partition a read-write lock's grants live in
/// (`keys::rwlock_partition`): the writer's entry and each reader's hold
/// their owner token, so each is held, given back and taken back as a
/// lock is (a cut writer's claim, given back, lets readers in at once).
const RWLOCK_KIND: &str = "~rw";

/// Whether `partition` holds a lock, a lease or permits: the entries a holder owns.
fn kind(partition: &str) -> Option<&'static str> {
    match keys::decode_partition(partition)?.0 {
        LOCK_KIND => Some(LOCK_KIND),
        LEASE_KIND => Some(LEASE_KIND),
        SEMAPHORE_KIND => Some(SEMAPHORE_KIND),
        RWLOCK_KIND => Some(RWLOCK_KIND),
        _ => None,
    }
}

/// One lock or lease entry an instance's write created.
#[derive(Clone, Debug)]
struct Held {
    partition: String,
    key: String,
    revision: u64,
    value: Vec<u8>,
}

/// A lock acquire whose reply never came back (its request was cut while
/// it was in flight): it may apply later. Its owner token is minted per
/// call, so a lock entry holding these bytes is this acquire's.
#[derive(Clone, Debug)]
struct InFlight {
    id: u64,
    partition: String,
    key: String,
    value: Vec<u8>,
    condition: Condition,
    ttl_ms: Option<u64>,
}

/// The ledger of what one instance holds.
#[derive(Debug, Default)]
pub struct Holdings {
    held: Vec<Held>,
    in_flight: Vec<InFlight>,
    next_id: u64,
}

/// A put this ledger is watching, from [`Holdings::sending`].
pub struct Sending(Option<u64>);

impl Holdings {
    /// Before a put is sent: note it if it could take a lock, a permit or
    /// a read-write lock grant.
    pub fn sending(
        &mut self,
        partition: &str,
        key: &str,
        value: &[u8],
        condition: &Condition,
        ttl_ms: Option<u64>,
    ) -> Sending {
        if !matches!(
            kind(partition),
            Some(LOCK_KIND | SEMAPHORE_KIND | RWLOCK_KIND)
        ) {
            return Sending(None);
        }
        self.next_id += 1;
        self.in_flight.push(InFlight {
            id: self.next_id,
            partition: partition.to_string(),
            key: key.to_string(),
            value: value.to_vec(),
            condition: condition.clone(),
            ttl_ms,
        });
        Sending(Some(self.next_id))
    }

    /// After a put's reply (or its failure): what it created is held; a
    /// failed one is left in flight, since it may still apply.
    pub fn sent(
        &mut self,
        sending: Sending,
        partition: &str,
        key: &str,
        reply: &Result<WriteReply, StoreError>,
    ) {
        let failed = matches!(reply, Err(StoreError::Unavailable(_)));
        if let Some(id) = sending.0
            && !failed
        {
            self.in_flight.retain(|f| f.id != id);
        }
        if let Ok(reply) = reply {
            self.wrote(partition, key, &reply.outcome, true);
        }
    }

    /// After a delete's reply: a removed entry is held no more.
    pub fn deleted(&mut self, partition: &str, key: &str, reply: &Result<WriteReply, StoreError>) {
        if let Ok(reply) = reply {
            self.wrote(partition, key, &reply.outcome, false);
        }
    }

    fn wrote(&mut self, partition: &str, key: &str, outcome: &Outcome, put: bool) {
        let Some(kind) = kind(partition) else {
            return;
        };
        let Outcome::Applied(entry) = outcome else {
            return;
        };
        self.held
            .retain(|h| !(h.partition == partition && h.key == key));
        // A put that wrote a lease's resigned entry gave the lease up.
        let holding = kind != LEASE_KIND || give_up(&entry.value, 0).is_some();
        if put && holding {
            self.held.push(Held {
                partition: partition.to_string(),
                key: key.to_string(),
                revision: entry.revision,
                value: entry.value.clone(),
            });
        }
    }

    /// Whether anything is held or in flight.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty() && self.in_flight.is_empty()
    }

    /// Give back everything this ledger holds, each with a write guarded by
    /// its revision and value; a release the store could not take now is
    /// finished in the background. Returns how many holdings were given back.
    pub async fn give_back(self, backend: &Arc<dyn Backend>) -> usize {
        let mut given = 0;
        for flight in self.in_flight {
            // An acquire cut in flight: if its token holds the lock, it is held.
            if let Ok(read) = backend.get(&flight.partition, &flight.key).await {
                if let Some(entry) = read.entry
                    && entry.value == flight.value
                {
                    let guard = guarded(entry.revision, entry.value);
                    given += release(backend, &flight.partition, &flight.key, guard).await;
                }
                continue;
            }
            // The read failed (the store stalled, as the cut request may
            // have): the acquire may still land, so look for it in the
            // background, as for one answered unavailable.
            take_back_in_background(
                backend.clone(),
                &flight.partition,
                &flight.key,
                &flight.value,
                &flight.condition,
                flight.ttl_ms,
            );
        }
        for held in self.held {
            let guard = guarded(held.revision, held.value.clone());
            if kind(&held.partition) == Some(LEASE_KIND) {
                let Ok(now) = backend.now().await else {
                    // Cannot tell whether it carries a grace: keep it (its
                    // TTL ends it), rather than drop a grace by deleting.
                    continue;
                };
                if let Some(GiveUp::Replace { value, ttl_ms }) = give_up(&held.value, now) {
                    let replaced = backend
                        .put(&held.partition, &held.key, &value, Some(ttl_ms), &guard)
                        .await;
                    given += usize::from(matches!(
                        replaced,
                        Ok(WriteReply {
                            outcome: Outcome::Applied(_),
                            ..
                        })
                    ));
                    continue;
                }
            }
            given += release(backend, &held.partition, &held.key, guard).await;
        }
        given
    }
}

fn guarded(revision: u64, value: Vec<u8>) -> Condition {
    Condition::RevisionAndValue(Guard { revision, value })
}

/// A guarded delete; 1 when it removed the holding now, 0 otherwise (gone
/// already, or handed to the background when the store did not answer).
async fn release(
    backend: &Arc<dyn Backend>,
    partition: &str,
    key: &str,
    guard: Condition,
) -> usize {
    match backend.delete(partition, key, &guard).await {
        Ok(WriteReply {
            outcome: Outcome::Applied(_),
            ..
        }) => 1,
        Ok(_) => 0,
        Err(_) => {
            finish_in_background(backend.clone(), partition, key, guard);
            0
        }
    }
}

/// How many background releases may be pending at once; past this, a
/// failed release is left to its TTL (and logged), so a store that is down
/// for long cannot make the host pile up tasks without bound.
pub const MAX_BACKGROUND_RELEASES: usize = 4096;

/// The first wait between background attempts; doubled up to [`MAX_RETRY_WAIT`].
const FIRST_RETRY_WAIT: Duration = Duration::from_millis(50);
/// The longest wait between background attempts.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(2);
/// After this long the holding's TTL has run out whatever it was (a lease's
/// entry lives at most twice the longest TTL): nothing is left to release.
const GIVE_UP_AFTER: Duration = Duration::from_secs(2 * 86_400);

static PENDING: AtomicUsize = AtomicUsize::new(0);
/// The partitions of the pending background releases (one entry each), so
/// a caller can tell when its own has ended whatever others are pending.
static PENDING_PARTITIONS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
static TAKE_BACKS: AtomicUsize = AtomicUsize::new(0);

/// Whether `partition` and `condition` make a delete that can only ever
/// remove one holding: a lock's or lease's, guarded by revision and value.
pub fn finishable(partition: &str, condition: &Condition) -> bool {
    kind(partition).is_some() && matches!(condition, Condition::RevisionAndValue(_))
}

/// Retry a guarded delete of a lock or lease entry in the background until
/// it lands or conflicts. Does nothing outside a tokio runtime, for any
/// other delete, or past [`MAX_BACKGROUND_RELEASES`].
pub fn finish_in_background(
    backend: Arc<dyn Backend>,
    partition: &str,
    key: &str,
    condition: Condition,
) {
    if !finishable(partition, &condition) {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if PENDING.fetch_add(1, Ordering::Relaxed) >= MAX_BACKGROUND_RELEASES {
        PENDING.fetch_sub(1, Ordering::Relaxed);
        tracing::warn!(
            target: "coord::store",
            "{MAX_BACKGROUND_RELEASES} releases already pending; {partition} is left to its TTL"
        );
        return;
    }
    let (partition, key) = (partition.to_string(), key.to_string());
    if let Ok(mut pending) = PENDING_PARTITIONS.lock() {
        pending.push(partition.clone());
    }
    runtime.spawn(async move {
        let started = tokio::time::Instant::now();
        let mut wait = FIRST_RETRY_WAIT;
        loop {
            tokio::time::sleep(wait).await;
            match backend.delete(&partition, &key, &condition).await {
                Ok(reply) => {
                    let landed = matches!(reply.outcome, Outcome::Applied(_));
                    tracing::info!(
                        target: "coord::store",
                        "a release that failed was finished in the background ({}): {partition}",
                        if landed { "released" } else { "already gone" }
                    );
                    break;
                }
                Err(_) if started.elapsed() < GIVE_UP_AFTER => {
                    wait = (wait * 2).min(MAX_RETRY_WAIT)
                }
                Err(_) => break,
            }
        }
        if let Ok(mut pending) = PENDING_PARTITIONS.lock()
            && let Some(at) = pending.iter().position(|p| *p == partition)
        {
            pending.swap_remove(at);
        }
        PENDING.fetch_sub(1, Ordering::Relaxed);
    });
}

/// How long a background take-back looks closely (reads at most
/// [`MAX_TAKE_BACK_WAIT`] apart) for an acquire that may still land: a
/// write queued behind others on a connection (a `WAIT` for replicas holds
/// the connection up to its timeout, per write) lands within this.
const TAKE_BACK_WINDOW: Duration = Duration::from_secs(30);
/// The longest wait between a take-back's reads within [`TAKE_BACK_WINDOW`].
const MAX_TAKE_BACK_WAIT: Duration = Duration::from_secs(1);
/// The longest wait between its reads after that: a write held in a paused
/// server's input (Redis `CLIENT PAUSE`, a stopped process) or in a
/// client's queue across a reconnection can land at any time within the
/// entry's TTL, so it looks for the whole TTL, less often.
const LATE_TAKE_BACK_WAIT: Duration = Duration::from_secs(10);

/// After a lock acquire (a create-if-absent of an owner token) failed as
/// `unavailable`: keep looking, in the background, for its write landing
/// late, and free it when it does, with a delete guarded by the revision
/// found and the token — which this acquire alone minted, so nothing else
/// is ever freed. The component already looks once, right away; but its
/// read can time out queued behind the very writes that failed (outside
/// testers: with `--redis-replica-acks 1` and a replica down, every write's
/// `WAIT` held the shared connection for half a second, the take-back read
/// timed out behind them, the acquires landed later, and two locks stayed
/// held by nobody for their TTL). Looks for the entry's TTL (an entry with
/// none: two days), closely for the first 30 s.
pub fn take_back_in_background(
    backend: Arc<dyn Backend>,
    partition: &str,
    key: &str,
    token: &[u8],
    condition: &Condition,
    ttl_ms: Option<u64>,
) {
    let acquires = match kind(partition) {
        Some(LOCK_KIND) => matches!(condition, Condition::Absent),
        Some(SEMAPHORE_KIND) => matches!(condition, Condition::AbsentAndFewerThan(_)),
        Some(RWLOCK_KIND) => matches!(
            condition,
            Condition::Absent | Condition::AbsentAndFewerThan(_)
        ),
        _ => false,
    };
    if !acquires {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if TAKE_BACKS.fetch_add(1, Ordering::Relaxed) >= MAX_BACKGROUND_RELEASES {
        TAKE_BACKS.fetch_sub(1, Ordering::Relaxed);
        return;
    }
    let window = ttl_ms.map_or(GIVE_UP_AFTER, Duration::from_millis);
    let (partition, key, token) = (partition.to_string(), key.to_string(), token.to_vec());
    runtime.spawn(async move {
        let started = tokio::time::Instant::now();
        let until = started + window;
        let mut wait = FIRST_RETRY_WAIT;
        while tokio::time::Instant::now() < until {
            if let Ok(read) = backend.get(&partition, &key).await
                && let Some(entry) = read.entry
                && entry.value == token
            {
                let guard = guarded(entry.revision, entry.value);
                if backend.delete(&partition, &key, &guard).await.is_ok() {
                    tracing::info!(
                        target: "coord::store",
                        "an acquire that failed landed later; taken back: {partition}"
                    );
                    break;
                }
            }
            tokio::time::sleep(wait).await;
            let most = if started.elapsed() < TAKE_BACK_WINDOW {
                MAX_TAKE_BACK_WAIT
            } else {
                LATE_TAKE_BACK_WAIT
            };
            wait = (wait * 2).min(most);
        }
        TAKE_BACKS.fetch_sub(1, Ordering::Relaxed);
    });
}

/// Wait, up to `within`, for the background releases and take-backs
/// pending now to end (a stopping process gives them their chance before
/// its runtime ends them); how many were still pending then, left to their
/// TTLs.
pub async fn finish_background(within: Duration) -> usize {
    let until = tokio::time::Instant::now() + within;
    loop {
        let pending = background_releases() + background_take_backs();
        if pending == 0 || tokio::time::Instant::now() >= until {
            return pending;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How many background releases are pending now.
pub fn background_releases() -> usize {
    PENDING.load(Ordering::Relaxed)
}

/// Whether a background release of a holding in `partition` is pending
/// now: other callers' releases, to other stores, do not count.
pub fn background_release_pending(partition: &str) -> bool {
    PENDING_PARTITIONS
        .lock()
        .map(|pending| pending.iter().any(|p| p == partition))
        .unwrap_or(false)
}

/// How many background take-backs of failed acquires are looking now (at
/// most [`MAX_BACKGROUND_RELEASES`] more).
pub fn background_take_backs() -> usize {
    TAKE_BACKS.load(Ordering::Relaxed)
}
