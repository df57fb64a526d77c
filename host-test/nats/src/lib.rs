//! The NATS JetStream backend: the store contract on one JetStream stream,
//! replicated when the stream is.
//!
//! This file holds the configuration, the connection and the stream;
//! `snapshot.rs` reads and writes one partition (a compare-and-set on its
//! subject); `store.rs` is the `Backend` implementation.
//!
//! **The mapping.** Each partition is one subject, `<prefix>.p.<token>`,
//! where the token is `_` and the partition's name in unpadded URL-safe
//! base64 (so any string is a valid, distinct subject token). The stream
//! (`COORD` by default) keeps one message per subject
//! (`max_msgs_per_subject: 1`): the partition's whole state — entries,
//! revision, bounded change feed, meters — as a snapshot that
//! `coord_component::memory::Partition` reads and writes, the same state
//! machine the in-memory backend runs, so the semantics are the same by
//! construction. A call reads the partition's last message (its stream
//! sequence) and, when it changes anything, publishes the new snapshot with
//! `Nats-Expected-Last-Subject-Sequence` set to that sequence: the stream
//! accepts it only if nobody wrote the partition in between, and a call
//! that loses that race reads again and decides again.
//!
//! **Time** is the server's: every call reads the stream leader's clock
//! (the `ts` of a stream-info reply, sent beside the partition read), and
//! never goes back within a partition (each snapshot keeps the latest time
//! it was decided at). Expiry is decided by coord on that clock to the
//! millisecond; JetStream's per-message TTL (`Nats-TTL`, whole seconds,
//! nats-server 2.11+) only collects a partition once nothing in it is live
//! and the retention has passed. Revisions are the partition's own,
//! floored at the clock in µs as in the other backends, so a stream
//! deleted and made again issues revisions above every earlier one.
//!
//! **Round trips.** A read (`get`, `list`, `changes`) is one round trip (the
//! partition and the clock fetched together). A write is one when this host
//! saw the partition last (`seen.rs`: it decides on that state and the
//! publish's condition proves it current), else two: the read, then the
//! conditional publish; a write whose condition fails on a fresh read is
//! one (the conflict carries the entry the read returned). Each lost race
//! adds two.
//! A successful write also publishes the new revision on
//! `<prefix>.n.<token>` (core NATS, no reply awaited), which wakes waiters;
//! a waiter re-checks at least every [`NatsConfig::recheck`], so a lost
//! notification delays it, never strands it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use base64::Engine;

use coord_host::backend::{DEFAULT_RETENTION_MS, StoreError};
use coord_host::clock::ManualClock;

mod replicas;
mod seen;
mod snapshot;
pub use snapshot::{FEED_BYTES, NO_ACK_IN_TIME};
mod store;
pub use store::MAX_PERMITS;

/// The oldest nats-server coord runs on: per-message TTLs (`Nats-TTL`),
/// which collect partitions nobody uses, came in 2.11.
pub const MIN_SERVER_VERSION: (u64, u64, u64) = (2, 11, 0);
/// The default longest sleep of a waiter between checks, in ms.
pub const RECHECK_MS: u64 = 500;

/// How to reach NATS and how to lay out coord's data there.
#[derive(Debug, Clone)]
pub struct NatsConfig {
    /// `nats://[user:password@]host[:port]`, or several, comma-separated
    /// (the servers of one cluster).
    pub url: String,
    /// The JetStream stream that holds every partition; made if missing
    /// (`COORD` by default, see [`NatsConfig::stream_for`]).
    pub stream: String,
    /// The first token of every subject, so deployments can share an account.
    pub subject_prefix: String,
    /// Replicas the operator asked for, if any. A stream this backend makes
    /// gets this many, else [`NatsConfig::default_replicas`] of `url` (3 on
    /// a cluster: an acknowledged write then survives the loss of a server).
    /// A stream that exists keeps its count unless this asks for more
    /// (JetStream copies the data), or for fewer with
    /// [`NatsConfig::allow_fewer_replicas`]: no setting of one process may
    /// lower what every other process relies on, and the number of URLs it
    /// was given is not a request. Any mismatch is logged and reported by
    /// [`Backend::warnings`](coord_host::backend::Backend::warnings).
    pub replicas: Option<usize>,
    /// Whether [`NatsConfig::replicas`] may lower an existing stream's
    /// count (the second explicit word `--allow-fewer-replicas`).
    pub allow_fewer_replicas: bool,
    /// How many changes each partition's feed keeps (fewer when the
    /// partition would not fit in one message otherwise).
    pub history: usize,
    /// How long a partition outlives its last live entry, in ms: the time a
    /// watcher can resume from an old revision after it went quiet.
    pub retention_ms: u64,
    /// How long a request may take before the call fails as unavailable.
    pub response_timeout: Duration,
    /// The longest a waiter sleeps between checks without a notification.
    pub recheck: Duration,
    /// For tests only: take "now" from this clock instead of the server's.
    pub test_clock: Option<Arc<ManualClock>>,
}

impl NatsConfig {
    /// The replicas a stream gets by default on the servers `url` names
    /// (comma-separated): 3 for a cluster of three or more, so a cluster is
    /// replicated unless told otherwise; else 1.
    pub fn default_replicas(url: &str) -> usize {
        let servers = url.split(',').filter(|s| !s.trim().is_empty()).count();
        if servers >= 3 { 3 } else { 1 }
    }

    /// The defaults, for a server at `url`.
    pub fn new(url: &str) -> Self {
        NatsConfig {
            url: url.to_string(),
            stream: "COORD".into(),
            subject_prefix: "coord".into(),
            replicas: None,
            allow_fewer_replicas: false,
            history: coord_component::memory::DEFAULT_HISTORY,
            retention_ms: DEFAULT_RETENTION_MS,
            response_timeout: Duration::from_secs(5),
            recheck: Duration::from_millis(RECHECK_MS),
            test_clock: None,
        }
    }

    /// The stream for a subject prefix (`coord` → `COORD`): its name in
    /// capitals, with each character a stream name cannot hold as `_`, so
    /// deployments with their own prefixes get streams of their own.
    pub fn stream_for(subject_prefix: &str) -> String {
        subject_prefix
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c.to_ascii_uppercase()
                } else {
                    '_'
                }
            })
            .collect()
    }
}

/// The store on NATS JetStream.
pub struct NatsBackend {
    config: NatsConfig,
    client: async_nats::Client,
    jetstream: jetstream::Context,
    /// The largest message the server takes, less room for headers.
    max_snapshot_bytes: usize,
    /// Waiters asleep per partition, for [`NatsBackend::waiters`].
    asleep: Mutex<HashMap<String, usize>>,
    /// Each partition's last message as this host saw it (`seen.rs`).
    seen: Mutex<HashMap<String, seen::Seen>>,
    /// The last sample of the server's clock.
    clock_sample: Mutex<Option<seen::ClockSample>>,
    /// Round trips to the server so far (requests sent together count once).
    round_trips: AtomicU64,
    /// The replicas every process relies on: the stream's count once this
    /// backend has made or checked it (or what it was asked to raise it
    /// to). Fewer later means another process lowered it.
    relied_on_replicas: AtomicU64,
    /// What is wrong with the stream's configuration now, for `/readyz`.
    warnings: Mutex<Vec<String>>,
}

/// A connection or server failure: the call may or may not have applied.
fn unavailable(error: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("NATS: {error}"))
}

/// `"2.9.10"` (or `"2.12.0-beta.1"`) as numbers.
fn parse_version(version: &str) -> Option<(u64, u64, u64)> {
    let core = version.trim_start_matches('v').split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    Some((
        parts.next()??,
        parts.next()??,
        parts.next().flatten().unwrap_or(0),
    ))
}

/// How often the client pings its server: three unanswered pings (the
/// client's limit) make about one response timeout.
fn ping_interval(response_timeout: Duration) -> Duration {
    (response_timeout / 3).max(Duration::from_millis(100))
}

impl NatsBackend {
    /// The client port of the server this backend is connected to now.
    pub fn server_port(&self) -> u16 {
        self.client.server_info().port
    }

    /// Connect, check the server, and make the stream if it is missing.
    /// Fails with `unavailable` when the server cannot be reached, and with
    /// `invalid` naming what is wrong when it is too old, runs without
    /// JetStream, or the stream exists with another layout.
    pub async fn connect(config: NatsConfig) -> Result<Self, StoreError> {
        let client = async_nats::ConnectOptions::new()
            .request_timeout(Some(config.response_timeout))
            .connection_timeout(config.response_timeout)
            // A server that stops answering (paused, hung) is left after
            // three unanswered pings, so within about the response timeout,
            // for another of the URLs: with the client's default of a ping a
            // minute, outside testers' coord answered 503 for 181 s after
            // its server was SIGSTOPped, while the stream had a new leader
            // within 10 s and a coord on the other servers answered.
            .ping_interval(ping_interval(config.response_timeout))
            .connect(
                config
                    .url
                    .split(',')
                    .map(str::trim)
                    .filter(|u| !u.is_empty())
                    .collect::<Vec<_>>(),
            )
            .await
            .map_err(unavailable)?;
        let info = client.server_info();
        let version = parse_version(&info.version);
        if version.is_none_or(|v| v < MIN_SERVER_VERSION) {
            let (a, b, c) = MIN_SERVER_VERSION;
            return Err(StoreError::Invalid(format!(
                "url: the NATS server at {} is version {}; coord needs nats-server {a}.{b}.{c} \
                 or later (per-message TTLs)",
                config.url, info.version
            )));
        }
        if !info.jetstream {
            return Err(StoreError::Invalid(format!(
                "url: the NATS server at {} runs without JetStream (start it with -js)",
                config.url
            )));
        }
        let mut jetstream = jetstream::new(client.clone());
        jetstream.set_timeout(config.response_timeout);
        // Headers (the expected sequence, the TTL) take well under 256 bytes.
        let max_snapshot_bytes = info.max_payload.saturating_sub(256);
        let backend = NatsBackend {
            config,
            client,
            jetstream,
            max_snapshot_bytes,
            asleep: Mutex::default(),
            seen: Mutex::default(),
            clock_sample: Mutex::default(),
            round_trips: AtomicU64::new(0),
            relied_on_replicas: AtomicU64::new(0),
            warnings: Mutex::default(),
        };
        backend.ensure_stream().await?;
        backend.until_the_stream_has_a_leader().await;
        Ok(backend)
    }

    /// Wait, up to the response timeout, until the stream names a leader
    /// with a quorum: a stream just made (or a cluster just started) elects
    /// its leader in its first seconds, and calls in that window waited
    /// out their reads. A stream still without one after that is left to
    /// the calls (`unavailable`) and to `/readyz`, which says so.
    async fn until_the_stream_has_a_leader(&self) {
        let started = std::time::Instant::now();
        let mut pause = Duration::from_millis(20);
        while self.stream_has_leader().await.is_err()
            && started.elapsed() < self.config.response_timeout
        {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// The stream's layout as coord makes it.
    fn stream_config(&self) -> stream::Config {
        // Sequences start at the wall clock in µs, so a stream deleted and
        // made again never reissues a sequence an earlier one gave: a host
        // that remembers a partition's sequence (`seen.rs`) then finds its
        // condition refused instead of met by a stranger's message.
        let first_sequence = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| {
                u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
            });
        stream::Config {
            name: self.config.stream.clone(),
            subjects: vec![format!("{}.p.>", self.config.subject_prefix)],
            max_messages_per_subject: 1,
            allow_message_ttl: true,
            num_replicas: self.replicas_to_make(),
            storage: stream::StorageType::File,
            discard: stream::DiscardPolicy::Old,
            first_sequence: Some(first_sequence),
            ..Default::default()
        }
    }

    /// Make the stream if it is missing (first start, or somebody deleted
    /// it); refuse one whose layout would break the contract, naming the
    /// first field that would: a limit that drops a partition's message
    /// while it still holds live entries (age, bytes, messages, a retention
    /// other than limits) would free a held lock.
    async fn ensure_stream(&self) -> Result<(), StoreError> {
        let wanted = self.stream_config();
        let mut stream = self
            .jetstream
            .get_or_create_stream(wanted.clone())
            .await
            .map_err(unavailable)?;
        let mut info = stream.info().await.map_err(unavailable)?;
        if let Some(change) = self.replicas_to_set(info.config.num_replicas) {
            let from = info.config.num_replicas;
            let mut changed = info.config.clone();
            changed.num_replicas = change;
            self.jetstream.update_stream(changed).await.map_err(|e| {
                StoreError::Invalid(format!(
                    "replicas: the stream {:?} has {from} replicas and could not be given {change}: {e}",
                    wanted.name
                ))
            })?;
            tracing::warn!(
                target: "coord::store",
                "the JetStream stream {:?} had {from} replicas; updated to {change}, as asked",
                wanted.name
            );
            info = stream.info().await.map_err(unavailable)?;
        }
        let have_replicas = info.config.num_replicas;
        self.rely_on_replicas(have_replicas);
        self.check_replicas(have_replicas);
        for warning in self.warnings() {
            tracing::warn!(target: "coord::store", "{warning}");
        }
        let have = &info.config;
        let wrong = if !have.subjects.contains(&wanted.subjects[0]) {
            Some(format!(
                "subjects {:?}, not {:?}",
                have.subjects, wanted.subjects[0]
            ))
        } else if have.max_messages_per_subject != 1 {
            Some(format!(
                "max_msgs_per_subject {}, not 1",
                have.max_messages_per_subject
            ))
        } else if !have.allow_message_ttl {
            Some("allow_msg_ttl false, not true".to_string())
        } else if have.retention != stream::RetentionPolicy::Limits {
            Some(format!("retention {:?}, not limits", have.retention))
        } else if !have.max_age.is_zero() {
            Some(format!("max_age {:?}, not none", have.max_age))
        } else if have.max_bytes > 0 {
            Some(format!("max_bytes {}, not unlimited", have.max_bytes))
        } else if have.max_messages > 0 {
            Some(format!("max_msgs {}, not unlimited", have.max_messages))
        } else {
            None
        };
        match wrong {
            Some(field) => Err(StoreError::Invalid(format!(
                "stream: the JetStream stream {:?} exists with {field}: coord's partitions \
                 would be dropped or refused (delete it, or name another with --prefix)",
                have.name
            ))),
            None => Ok(()),
        }
    }

    /// The subject token of a partition: any string, no two alike.
    fn token(partition: &str) -> String {
        format!(
            "_{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(partition)
        )
    }

    /// The subject that holds a partition's snapshot.
    fn state_subject(&self, partition: &str) -> String {
        format!(
            "{}.p.{}",
            self.config.subject_prefix,
            Self::token(partition)
        )
    }

    /// The subject a partition's new revisions are announced on.
    fn notify_subject(&self, partition: &str) -> String {
        format!(
            "{}.n.{}",
            self.config.subject_prefix,
            Self::token(partition)
        )
    }

    /// Round trips to the server so far: a read (the partition and the
    /// clock, sent together) counts one, a conditional publish one.
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    /// Count a round trip.
    fn trip(&self) {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
    }

    /// How many `wait` calls are asleep on `partition` right now (lets a
    /// test know a waiter is asleep before it acts).
    pub fn waiters(&self, partition: &str) -> usize {
        self.asleep
            .lock()
            .map_or(0, |a| a.get(partition).copied().unwrap_or(0))
    }

    /// Count a waiter on `partition` as asleep until the value drops.
    fn asleep(&self, partition: &str) -> Asleep<'_> {
        if let Ok(mut a) = self.asleep.lock() {
            *a.entry(partition.to_string()).or_default() += 1;
        }
        Asleep {
            backend: self,
            partition: partition.to_string(),
        }
    }
}

/// A waiter counted as asleep.
struct Asleep<'a> {
    backend: &'a NatsBackend,
    partition: String,
}

impl Drop for Asleep<'_> {
    fn drop(&mut self) {
        if let Ok(mut a) = self.backend.asleep.lock()
            && let Some(n) = a.get_mut(&self.partition)
        {
            *n -= 1;
            if *n == 0 {
                a.remove(&self.partition);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_as_numbers() {
        assert_eq!(parse_version("2.9.10"), Some((2, 9, 10)));
        assert!(parse_version("2.9.10").is_some_and(|v| v < MIN_SERVER_VERSION));
        assert!(parse_version("2.11.0").is_some_and(|v| v >= MIN_SERVER_VERSION));
        assert!(parse_version("2.12.0-beta.1").is_some_and(|v| v >= MIN_SERVER_VERSION));
        assert!(parse_version("2.10.99").is_some_and(|v| v < MIN_SERVER_VERSION));
        assert_eq!(parse_version("junk"), None);
    }

    #[test]
    fn each_subject_prefix_has_a_stream_of_its_own() {
        assert_eq!(NatsConfig::stream_for("coord"), "COORD");
        assert_eq!(NatsConfig::stream_for("app.coord"), "APP_COORD");
        assert_eq!(NatsConfig::stream_for("a b/c>*"), "A_B_C__");
    }

    #[test]
    fn partition_tokens_are_subject_tokens_and_never_meet() {
        let names = ["", "a", "a.b", "a b", "*", ">", "é", "~lock", "a\0"];
        let tokens: std::collections::HashSet<_> =
            names.iter().map(|n| NatsBackend::token(n)).collect();
        assert_eq!(tokens.len(), names.len());
        for t in &tokens {
            assert!(!t.is_empty());
            assert!(
                t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                "{t}"
            );
        }
    }
}
