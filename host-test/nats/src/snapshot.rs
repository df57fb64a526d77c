//! One partition on NATS: read its snapshot and the server's clock, decide
//! with the in-memory state machine, and write the result back only if
//! nobody wrote in between (`Nats-Expected-Last-Subject-Sequence`).

use std::time::Instant;

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use bytes::Bytes;
use coord_component::keys::is_unwatched;
use coord_component::memory::Partition;

use coord_host::backend::StoreError;
use coord_host::clock::Clock;

use super::seen::{ClockSample, Seen};
use super::{NatsBackend, unavailable};

/// A partition as read: the stream sequence of its message, its state and
/// the latest store time it was decided at.
struct Loaded {
    sequence: u64,
    partition: Partition,
    /// The partition's encoding as read, to tell whether a call changed it.
    encoded: Bytes,
    decided_at: u64,
}

/// Why a conditional publish did not apply.
enum StoreFailure {
    /// Somebody wrote the partition after we read it: read again.
    Raced,
    /// Nothing listened on the subject (a 503 "no responders": the stream
    /// is between leaders, or was deleted), so nothing was stored: read
    /// again after a pause, until the response timeout.
    Unheard(StoreError),
    /// The server did not take it (or may have): the call fails.
    Failed(StoreError),
}

impl NatsBackend {
    /// The server's clock: the `ts` of a stream-info reply from the stream's
    /// leader (or the test clock).
    pub(super) async fn clock(&self) -> Result<u64, StoreError> {
        if let Some(clock) = &self.config.test_clock {
            return Ok(clock.now_ms());
        }
        let subject = format!("$JS.API.STREAM.INFO.{}", self.config.stream);
        let sent = Instant::now();
        let reply = self
            .client
            .request(subject, Bytes::new())
            .await
            .map_err(unavailable)?;
        let received = Instant::now();
        let info: serde_json::Value = serde_json::from_slice(&reply.payload)
            .map_err(|e| unavailable(format!("a stream-info reply that is not JSON: {e}")))?;
        if let Some(error) = info.get("error") {
            return Err(unavailable(format!("stream info: {error}")));
        }
        let ts = info
            .get("ts")
            .and_then(|t| t.as_str())
            .ok_or_else(|| unavailable("a stream-info reply without ts"))?;
        let at = time::OffsetDateTime::parse(ts, &time::format_description::well_known::Rfc3339)
            .map_err(|e| unavailable(format!("stream info ts {ts:?}: {e}")))?;
        let ts = u64::try_from(at.unix_timestamp_nanos() / 1_000_000)
            .map_err(|_| unavailable(format!("stream info ts {ts:?} is before 1970")))?;
        self.sampled(ClockSample {
            ts,
            sent,
            received,
            wall: std::time::SystemTime::now(),
        });
        Ok(ts)
    }

    /// Whether the stream can take a write now: its info answers and, when
    /// it is replicated, names a leader. A surviving server still answers
    /// the stream's info (and the time) with the quorum lost, so readiness
    /// built on the clock alone said ready while every write failed
    /// (outside testers: 5 of 5 `/readyz` 200 with 2 of 3 servers killed).
    pub(super) async fn stream_has_leader(&self) -> Result<(), StoreError> {
        let subject = format!("$JS.API.STREAM.INFO.{}", self.config.stream);
        let reply = self
            .client
            .request(subject, Bytes::new())
            .await
            .map_err(unavailable)?;
        let info: serde_json::Value = serde_json::from_slice(&reply.payload)
            .map_err(|e| unavailable(format!("a stream-info reply that is not JSON: {e}")))?;
        if let Some(error) = info.get("error") {
            return Err(unavailable(format!("stream info: {error}")));
        }
        let replicas = info["config"]["num_replicas"].as_u64().unwrap_or(1);
        self.check_replicas(usize::try_from(replicas).unwrap_or(usize::MAX));
        if replicas <= 1 {
            return Ok(());
        }
        let cluster = &info["cluster"];
        if cluster["leader"].as_str().unwrap_or("").is_empty() {
            return Err(unavailable(format!(
                "the stream {} has no leader",
                self.config.stream
            )));
        }
        // A leader whose followers died keeps calling itself leader for
        // about ten seconds (seen on 2.15), answering the time but taking no
        // write: count the followers it heard from lately.
        let heard = cluster["replicas"].as_array().map_or(0, |followers| {
            followers
                .iter()
                .filter(|f| {
                    f["current"].as_bool() == Some(true)
                        && f["offline"].as_bool() != Some(true)
                        && f["active"]
                            .as_u64()
                            .is_some_and(|ns| ns < FOLLOWER_SILENCE.as_nanos() as u64)
                })
                .count()
        });
        let voters = 1 + heard as u64;
        if voters * 2 <= replicas {
            return Err(unavailable(format!(
                "the stream {} has a quorum of no replicas: its leader heard from {heard} of \
                 {} followers within {} s",
                self.config.stream,
                replicas - 1,
                FOLLOWER_SILENCE.as_secs()
            )));
        }
        Ok(())
    }

    /// Whether the stream takes a write now, shown by one: a message on
    /// `<prefix>.p.ready` (no partition's subject: their tokens begin with
    /// `_`), collected after 10 s, acknowledged within the response
    /// timeout. A stream that answers its info but refuses writes (sealed,
    /// out of storage, its account over its limits) is not ready.
    pub(super) async fn takes_a_write(&self) -> Result<(), StoreError> {
        let subject = format!("{}.p.ready", self.config.subject_prefix);
        let message = PublishMessage::build()
            .payload(Bytes::from_static(b"ready"))
            .header("Nats-TTL", "10");
        self.trip();
        let timeout = self.config.response_timeout;
        let acked = async {
            let ack = self
                .jetstream
                .send_publish(subject, message)
                .await
                .map_err(unavailable)?;
            ack.await.map_err(unavailable)
        };
        tokio::time::timeout(timeout, acked)
            .await
            .map_err(|_| {
                unavailable(format!(
                    "the probe write was not acknowledged in {timeout:?}"
                ))
            })?
            .map(|_| ())
    }

    /// The partition's last message, if it has one.
    async fn load(&self, subject: &str) -> Result<Option<Loaded>, StoreError> {
        let stream = self
            .jetstream
            .get_stream_no_info(&self.config.stream)
            .await
            .map_err(unavailable)?;
        // The leader's own read: a direct get may be answered by a replica
        // (or, on one server, ahead of the write just acknowledged) with an
        // older message, and every stale read is a lost race and a retry.
        let message = match stream.get_last_raw_message_by_subject(subject).await {
            Ok(message) => message,
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
            Err(e) => return Err(unavailable(e)),
        };
        let payload = message.payload;
        if payload.len() < 8 {
            return Err(unavailable(format!(
                "the message at {subject} is not a coord partition ({} bytes)",
                payload.len()
            )));
        }
        let mut at = [0; 8];
        at.copy_from_slice(&payload[..8]);
        let encoded = payload.slice(8..);
        let partition = Partition::decode(&encoded).map_err(|e| {
            unavailable(format!(
                "the message at {subject} is not a coord partition: {e}"
            ))
        })?;
        Ok(Some(Loaded {
            sequence: message.sequence,
            partition,
            encoded,
            decided_at: u64::from_le_bytes(at),
        }))
    }

    /// Write `partition` decided at `now` if the subject's last message is
    /// still `sequence` (0: it has none), its acknowledgement awaited until
    /// the call's `deadline` at most.
    async fn store(
        &self,
        subject: &str,
        partition: &mut Partition,
        now: u64,
        sequence: u64,
        deadline: Instant,
    ) -> Result<(u64, Bytes), StoreFailure> {
        // Every write rewrites the whole partition, so the feed it carries
        // is bounded in bytes as well as in changes, by the live entries'
        // size: a write costs at most twice the live entries, or 16 KiB
        // more for small ones (outside testers: a partition's message grew
        // to 1 MB after 400 keyed adjusts, and a sequential adjust slowed
        // from 43 ms to 107 ms).
        partition.trim_feed_to_bytes(FEED_BYTES.max(partition.live_bytes()));
        let mut encoded = partition.encode();
        // One message holds the whole partition: drop the oldest changes of
        // the feed (its readers are told history-gone) until it fits.
        while encoded.len() + 8 > self.max_snapshot_bytes && partition.feed_len() > 0 {
            partition.trim_feed(partition.feed_len() / 2);
            encoded = partition.encode();
        }
        if encoded.len() + 8 > self.max_snapshot_bytes {
            return Err(StoreFailure::Failed(StoreError::Invalid(format!(
                "value: the partition would take {} bytes, over the {} one NATS message holds \
                 here (the server's max_payload)",
                encoded.len() + 8,
                self.max_snapshot_bytes
            ))));
        }
        let mut payload = Vec::with_capacity(encoded.len() + 8);
        payload.extend(now.to_le_bytes());
        payload.extend(&encoded);
        let mut message = PublishMessage::build()
            .payload(payload.into())
            .expected_last_subject_sequence(sequence);
        if let Some(ttl) = self.collect_after(partition, now) {
            message = message.header("Nats-TTL", ttl.to_string());
        }
        // A write begun with no time left would be answered `unavailable`
        // while it may still apply: not sent, it certainly does not.
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(StoreFailure::Failed(unavailable(
                "the response timeout passed before the write was sent; nothing was applied",
            )));
        }
        self.trip();
        let acked = async {
            let ack = self
                .jetstream
                .send_publish(subject.to_string(), message)
                .await
                .map_err(|e| StoreFailure::Failed(unavailable(e)))?;
            Ok(ack.await)
        };
        // The client's own wait is the whole response timeout; the call's
        // bound is what is left of it.
        let acked = match tokio::time::timeout(left, acked).await {
            Ok(acked) => acked?,
            Err(_) => {
                return Err(StoreFailure::Failed(unavailable(format!(
                    "{NO_ACK_IN_TIME} ({left:?} left of the response timeout); the write may \
                     yet apply"
                ))));
            }
        };
        match acked {
            Ok(ack) => Ok((ack.sequence, encoded.into())),
            Err(e) if lost_a_race(&e) => Err(StoreFailure::Raced),
            // The client's name for a 503 "no responders" to the publish.
            Err(e) if e.kind() == PublishErrorKind::StreamNotFound => {
                Err(StoreFailure::Unheard(unavailable(e)))
            }
            Err(e) => Err(StoreFailure::Failed(unavailable(e))),
        }
    }

    /// Whole seconds after which JetStream may drop the partition's message:
    /// once nothing in it is live and the retention has passed (none while
    /// an entry never expires). Only collection: expiry itself is decided
    /// by coord, to the millisecond.
    fn collect_after(&self, partition: &Partition, now: u64) -> Option<u64> {
        let lives_until = partition.lives_until()?;
        let retention = if partition.revision() > 0 {
            self.config.retention_ms
        } else {
            0
        };
        let keep_ms = lives_until
            .max(now)
            .saturating_add(retention)
            .saturating_sub(now);
        Some(keep_ms.div_ceil(1000).max(1))
    }

    /// Run `decide` on the partition at the server's now, after recording
    /// due expiries, and write the result back if it changed anything —
    /// again from a fresh read whenever another call wrote first, until the
    /// response timeout. Returns `decide`'s answer and the store's now.
    ///
    /// With `skip_read`, when this host saw the partition last and has a
    /// fresh clock sample, the first attempt skips the read: it decides on
    /// what it saw at the clock's lower bound, and a publish the server
    /// accepts proves that state current (one round trip). A decision that
    /// writes nothing proves nothing, so it is made again on a fresh read.
    pub(super) async fn transact<T>(
        &self,
        name: &str,
        skip_read: bool,
        mut decide: impl FnMut(&mut Partition, u64) -> T,
    ) -> Result<(T, u64), StoreError> {
        let subject = self.state_subject(name);
        // One bound for the whole call: the fast path's write, every read
        // and write after it.
        let started = Instant::now();
        let deadline = started + self.config.response_timeout;
        if let (true, Some(seen), Some((low, high))) =
            (skip_read, self.seen(name), self.clock_bounds())
            && let Ok(mut partition) = Partition::decode(&seen.encoded)
        {
            let now = low.max(seen.decided_at);
            let revision = partition.revision();
            partition.sweep(now);
            let answer = decide(&mut partition, now);
            if partition.encode() != seen.encoded.as_ref() {
                match self
                    .store(&subject, &mut partition, now, seen.sequence, deadline)
                    .await
                {
                    Ok(stored) => {
                        self.stored(name, &partition, revision, now, stored).await;
                        // The reply's now is the clock's upper bound: a
                        // holder then counts its TTL from no later than the
                        // server does.
                        return Ok((answer, high.max(now)));
                    }
                    // Too big, judged on a state that may be stale: the
                    // fresh read decides.
                    Err(
                        StoreFailure::Raced
                        | StoreFailure::Unheard(_)
                        | StoreFailure::Failed(StoreError::Invalid(_)),
                    ) => self.forget(name),
                    Err(StoreFailure::Failed(error)) => {
                        self.forget(name);
                        return Err(error);
                    }
                }
            }
        }
        let mut races = 0u32;
        let mut unheard = 0u32;
        loop {
            self.trip();
            let read = self
                .reading(started, || async {
                    tokio::try_join!(self.load(&subject), self.clock())
                })
                .await;
            let (loaded, clock) = match read {
                Ok(read) => read,
                // The stream was deleted (an operator, a test): make it
                // again and read once more; the data is gone, and
                // revisions, floored at the clock, still only go up. Any
                // other failure (a timeout, no server) is the answer.
                Err(error) if stream_missing(&error) => {
                    self.forget_all();
                    self.ensure_stream().await?;
                    tokio::try_join!(self.load(&subject), self.clock())?
                }
                Err(error) => return Err(error),
            };
            let (mut partition, sequence, before, now) = match loaded {
                Some(l) => {
                    let now = clock.max(l.decided_at);
                    self.remember(
                        name,
                        Seen {
                            sequence: l.sequence,
                            encoded: l.encoded.clone(),
                            decided_at: l.decided_at,
                        },
                    );
                    (l.partition, l.sequence, Some(l.encoded), now)
                }
                None => {
                    self.forget(name);
                    // An unwatched partition's feed is never read: keep one
                    // change, not the history, in every message.
                    let history = if is_unwatched(name) {
                        1
                    } else {
                        self.config.history
                    };
                    (Partition::new(history), 0, None, clock)
                }
            };
            let revision = partition.revision();
            partition.sweep(now);
            let answer = decide(&mut partition, now);
            let changed = match &before {
                Some(before) => partition.encode() != before.as_ref(),
                None => partition.revision() > 0 || !partition.is_empty(),
            };
            if !changed {
                return Ok((answer, now));
            }
            match self
                .store(&subject, &mut partition, now, sequence, deadline)
                .await
            {
                Ok(stored) => {
                    self.stored(name, &partition, revision, now, stored).await;
                    return Ok((answer, now));
                }
                Err(StoreFailure::Raced) => {
                    races += 1;
                    if started.elapsed() > self.config.response_timeout {
                        return Err(StoreError::Unavailable(format!(
                            "NATS: {races} writes to partition {name:?} raced this one \
                             within the response timeout; nothing of it was applied"
                        )));
                    }
                }
                Err(StoreFailure::Unheard(error)) => {
                    // A stream between leaders (an election, which a busy
                    // machine can cause without any fault) or deleted: the
                    // write reached nobody, so it is safe to make again on
                    // a fresh read (which finds a deleted stream and makes
                    // it). Answering at once made an election of a second
                    // fail every call in it (CI: 300 of 400 contended calls
                    // on a 3-replica stream, with no fault injected).
                    self.forget(name);
                    unheard += 1;
                    if started.elapsed() > self.config.response_timeout {
                        return Err(StoreError::Unavailable(format!(
                            "NATS: nothing took the write to partition {name:?} within the \
                             response timeout ({unheard} tries; the stream has no leader): {error}"
                        )));
                    }
                    tokio::time::sleep(unheard_pause(unheard)).await;
                }
                Err(StoreFailure::Failed(error)) => {
                    self.forget(name);
                    return Err(error);
                }
            }
        }
    }

    /// Run the read `attempt` until it answers, again while the stream is
    /// between leaders (JetStream's 10008 "temporarily unavailable", no
    /// responders, or no answer within a third of the response timeout: a
    /// leader stepping down drops requests), until the response timeout
    /// since `started` has passed. A read changes nothing, so trying it
    /// again is always safe; a leader stepping down under contention made
    /// 50 of 116 calls `unavailable` before reads were tried again.
    pub(super) async fn reading<T, F>(
        &self,
        started: Instant,
        mut attempt: impl FnMut() -> F,
    ) -> Result<T, StoreError>
    where
        F: std::future::Future<Output = Result<T, StoreError>>,
    {
        let budget = self.config.response_timeout;
        let mut tries = 0u32;
        loop {
            tries += 1;
            let left = budget.saturating_sub(started.elapsed());
            // A third of the budget per try: a request the server dropped
            // (its API queue full under load, a leader still settling)
            // costs a third of the response timeout, and two more tries
            // remain (with halves, outside testers saw three adjusts in
            // the first 12 s of a loaded 3-replica run fail after two).
            let bound = (budget / 3)
                .min(left)
                .max(std::time::Duration::from_millis(50));
            let error = match tokio::time::timeout(bound, attempt()).await {
                Ok(Ok(read)) => return Ok(read),
                Ok(Err(error)) if !between_leaders(&error) => return Err(error),
                Ok(Err(error)) => error,
                Err(_) => unavailable(format!("a read unanswered after {bound:?}")),
            };
            if started.elapsed() >= budget {
                let said = match error {
                    StoreError::Unavailable(said) => said,
                    other => other.to_string(),
                };
                return Err(StoreError::Unavailable(format!(
                    "{said} ({tries} tries within the response timeout)"
                )));
            }
            tokio::time::sleep(unheard_pause(tries)).await;
        }
    }

    /// After a write the server took: remember it, and wake waiters
    /// anywhere if it made a new revision (a touch, a meter does not;
    /// nothing waits for the announcement to arrive).
    async fn stored(
        &self,
        name: &str,
        partition: &Partition,
        revision_before: u64,
        now: u64,
        (sequence, encoded): (u64, Bytes),
    ) {
        self.remember(
            name,
            Seen {
                sequence,
                encoded,
                decided_at: now,
            },
        );
        if partition.revision() == revision_before {
            return;
        }
        let revision = partition.revision().to_string();
        let _ = self
            .client
            .publish(self.notify_subject(name), revision.into())
            .await;
    }
}

/// How long to wait before the `tries`-th new try of a write nothing took:
/// 20 ms doubling to 320 ms, as an election takes from a fraction of a
/// second to a few.
fn unheard_pause(tries: u32) -> std::time::Duration {
    std::time::Duration::from_millis(20 << tries.clamp(1, 5).saturating_sub(1))
}

/// Whether a read failed only because the stream has no leader now, so
/// that the same read may be answered in a moment.
fn between_leaders(error: &StoreError) -> bool {
    matches!(error, StoreError::Unavailable(message)
        if message.contains("10008")
            || message.contains("no responders")
            || message.contains("timed out"))
}

/// Whether a read failed because the stream does not exist (JetStream's
/// error code 10059, which both the message read and the stream info
/// report in their text).
fn stream_missing(error: &StoreError) -> bool {
    matches!(error, StoreError::Unavailable(message) if message.contains("10059"))
}

/// The bytes of change feed a NATS partition always may carry
/// ([`Partition::feed_bytes`]): 16 KiB, or as much as its live entries
/// take ([`Partition::live_bytes`]) if that is more, beside at most
/// [`NatsConfig::history`](super::NatsConfig::history) changes. A watcher further behind than that is
/// told `history-gone` and resynchronises from a snapshot.
pub const FEED_BYTES: usize = 16 * 1024;

/// How long a follower may go unheard before readiness stops counting it
/// toward the stream's quorum (a healthy follower is heard from every
/// second or so).
const FOLLOWER_SILENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether a publish failed because another write to the subject came
/// first: contention, to decide again on a fresh read, never `unavailable`.
///
/// The server says so with error 10071 (the client's `WrongLastSequence`)
/// or, on a replicated stream, 10164 ("wrong last sequence", a constant
/// message), which the client maps to `Other`: outside testers saw 122 and
/// 149 of 300 contended adjusts on a 3-replica stream answer 503 with it.
fn lost_a_race(error: &async_nats::jetstream::context::PublishError) -> bool {
    use async_nats::jetstream::ErrorCode;
    if error.kind() == PublishErrorKind::WrongLastSequence {
        return true;
    }
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<async_nats::jetstream::Error>())
        .is_some_and(|e| {
            matches!(
                e.error_code(),
                ErrorCode::STREAM_WRONG_LAST_SEQUENCE
                    | ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT
            )
        })
}

/// How a write whose acknowledgement did not come within the call's bound
/// is reported: in doubt, as async-nats's own "didn't receive ack" is.
pub const NO_ACK_IN_TIME: &str = "no acknowledgement of the write came in time";
