//! A fault run in the spirit of Jepsen's: two hosts put contended load on
//! one replicated store while a script of faults runs; every reply is
//! recorded with when it was sent and received, and the history is checked
//! afterwards for what a replicated store may not do:
//!
//! - **double grants**: a lock granted while an earlier grant of it was
//!   certainly still held (before its release was sent and its TTL, counted
//!   from the earlier request's send, had run out);
//! - **shared fences** and **fences that went back** (a grant received
//!   before another was sent has the lower fence);
//! - **stale reads**: a snapshot showing a counter below a value whose
//!   upsert was acknowledged before the snapshot was sent;
//! - **lost updates**: a final value below the last acknowledged one, and
//!   **phantom values**: one above anything written.
//!
//! Each counter has one writer (one key per writer), so any of these is the
//! store's or coord's fault, not the workload's. For each fault the report
//! gives the time from its start, and from its healing, to the first call
//! sent afterwards that succeeded.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coord_host::ephemeral::Space;
use coord_host::lock::{AcquireOptions, AcquireOutcome};
use coord_host::{Instance, Runtime};

/// The locks the lock workers contend for.
const RESOURCES: usize = 2;
/// Lock workers per host.
const LOCKERS: usize = 3;
/// A grant's TTL.
const TTL_MS: u64 = 3_000;

/// The space the counters live in.
fn space() -> Space {
    Space {
        id: "faultrun".into(),
        ttl_ms: 3_600_000,
        max_value_bytes: 32,
    }
}

/// One lock grant as its holder saw it.
#[derive(Clone, Debug)]
struct Grant {
    resource: String,
    fence: u64,
    sent: Instant,
    received: Instant,
    /// When its release was sent: the holder's critical section ended
    /// then, whatever the release's answer.
    release_sent: Instant,
    /// The release's error, if it failed (the lock then stayed held until
    /// its TTL, or until the host finished the release in the background).
    release_failed: Option<String>,
}

/// Everything the workers saw.
#[derive(Default)]
struct History {
    grants: Vec<Grant>,
    /// Per counter key: (value, acknowledgement received).
    acks: HashMap<String, Vec<(u64, Instant)>>,
    /// Per counter key: the highest value ever sent.
    attempted: HashMap<String, u64>,
    /// Snapshots: when sent, and each counter's value in it.
    reads: Vec<(Instant, HashMap<String, u64>)>,
    /// Calls that succeeded: (sent, received).
    successes: Vec<(Instant, Instant)>,
    /// Calls answered with an error: (sent, answered, the error's text).
    failures: Vec<(Instant, Instant, String)>,
}

/// A fault as the script ran it.
struct Fault {
    name: String,
    started: Instant,
    healed: Instant,
}

/// The load, running; [`Load::finish`] stops it and checks the history.
pub struct Load {
    history: Arc<Mutex<History>>,
    stop: Arc<AtomicBool>,
    succeeded: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    faults: Vec<Fault>,
}

/// What the checks found, and the faults' recovery times.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Locks granted and released or expired.
    pub grants: usize,
    /// Acknowledged counter upserts.
    pub acked_writes: usize,
    /// Snapshots checked.
    pub reads: usize,
    /// Calls answered with an error (all `unavailable` unless listed in `wrong_errors`).
    pub failed_calls: usize,
    /// Errors that were not `unavailable`.
    pub wrong_errors: Vec<String>,
    /// Grants made while an earlier one was certainly held.
    pub double_grants: usize,
    /// The first few double grants, each with its times and the fault it
    /// fell in, to tell a store's fault from coord's.
    pub double_grant_examples: Vec<String>,
    /// Fences two grants of one lock shared.
    pub shared_fences: usize,
    /// Grants whose fence was below that of a grant received before they were sent.
    pub fences_back: usize,
    /// Snapshot values below an earlier acknowledged write.
    pub stale_reads: usize,
    /// Counters whose final value is below their last acknowledged write.
    pub lost_updates: usize,
    /// Counters whose final value is above anything written.
    pub phantom_values: usize,
    /// Per fault, what the clients saw of it.
    pub recoveries: Vec<Recovery>,
}

/// What the clients saw of one fault, from the calls sent between its start
/// and the next fault's (or the run's end).
#[derive(Debug)]
pub struct Recovery {
    /// The fault.
    pub fault: String,
    /// How long it was held before healing, ms.
    pub held_ms: u128,
    /// Calls answered `unavailable`.
    pub failed_calls: usize,
    /// From its start to the answer of the last call that failed: how long
    /// it cost the clients, ms (0 if no call failed).
    pub failing_for_ms: u128,
    /// From its healing to the first success of a call sent after it, ms.
    pub first_success_after_heal_ms: Option<u128>,
    /// The distinct errors the failed calls were answered with.
    pub errors: Vec<String>,
}

impl Verdict {
    /// The safety findings are all zero.
    pub fn safe(&self) -> bool {
        self.wrong_errors.is_empty()
            && self.double_grants == 0
            && self.shared_fences == 0
            && self.fences_back == 0
            && self.stale_reads == 0
            && self.lost_updates == 0
            && self.phantom_values == 0
    }
}

impl Load {
    /// Start the load: on each runtime (a host), [`LOCKERS`] lock workers,
    /// one counter writer and one reader.
    pub async fn start(runtimes: &[Arc<Runtime>]) -> Load {
        let history = Arc::new(Mutex::new(History::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let succeeded = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for (host, runtime) in runtimes.iter().enumerate() {
            for worker in 0..LOCKERS {
                let instance = runtime.instantiate().await.unwrap();
                let resource = format!("res:{}", (host * LOCKERS + worker) % RESOURCES);
                let locker = Worker::new(instance, &history, &stop, &succeeded);
                tasks.push(tokio::spawn(locker.lock_loop(resource)));
            }
            let instance = runtime.instantiate().await.unwrap();
            let writer = Worker::new(instance, &history, &stop, &succeeded);
            tasks.push(tokio::spawn(writer.write_loop(format!("w{host}"))));
            let instance = runtime.instantiate().await.unwrap();
            let reader = Worker::new(instance, &history, &stop, &succeeded);
            tasks.push(tokio::spawn(reader.read_loop()));
        }
        Load {
            history,
            stop,
            succeeded,
            tasks,
            faults: Vec::new(),
        }
    }

    /// Wait until `n` more calls have succeeded; panic when none has for
    /// the watchdog's quiet period (a store that never comes back).
    pub async fn progress(&self, n: u64) {
        let target = self.succeeded.load(Ordering::SeqCst) + n;
        let (mut last, mut since) = (self.succeeded.load(Ordering::SeqCst), Instant::now());
        while last < target {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now = self.succeeded.load(Ordering::SeqCst);
            if now != last {
                (last, since) = (now, Instant::now());
            }
            assert!(
                since.elapsed() < super::QUIET,
                "no call succeeded for {:?}: the store never came back",
                super::QUIET
            );
        }
    }

    /// Note that the fault `name` starts now (inject it next).
    pub fn begin(&mut self, name: &str) {
        let now = Instant::now();
        self.faults.push(Fault {
            name: name.into(),
            started: now,
            healed: now,
        });
    }

    /// Note that the last fault [`Load::begin`] started is healed now, then
    /// wait until calls succeed again.
    pub async fn healed(&mut self) {
        if let Some(fault) = self.faults.last_mut() {
            fault.healed = Instant::now();
        }
        self.progress(20).await;
    }

    /// Stop the load, take a final snapshot through `runtime`, and check
    /// the history.
    pub async fn finish(self, runtime: &Runtime) -> Verdict {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            task.await.unwrap();
        }
        let mut instance = runtime.instantiate().await.unwrap();
        let started = Instant::now();
        let last = loop {
            match instance
                .ephemeral()
                .snapshot(&space(), "t", None)
                .await
                .unwrap()
            {
                Ok(snapshot) => break counters(&snapshot),
                Err(e) => {
                    assert!(started.elapsed() < super::QUIET, "no final read: {e:?}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        let history = self.history.lock().unwrap();
        check(&history, &last, &self.faults)
    }
}

/// One instance's loop and what it records.
struct Worker {
    instance: Instance,
    history: Arc<Mutex<History>>,
    stop: Arc<AtomicBool>,
    succeeded: Arc<AtomicU64>,
}

impl Worker {
    fn new(
        instance: Instance,
        history: &Arc<Mutex<History>>,
        stop: &Arc<AtomicBool>,
        succeeded: &Arc<AtomicU64>,
    ) -> Worker {
        Worker {
            instance,
            history: history.clone(),
            stop: stop.clone(),
            succeeded: succeeded.clone(),
        }
    }

    /// Record a call's outcome: `Ok` a success sent at `sent`, `Err` its error.
    fn outcome(&self, sent: Instant, result: Result<(), String>) {
        let mut history = self.history.lock().unwrap();
        match result {
            Ok(()) => {
                history.successes.push((sent, Instant::now()));
                self.succeeded.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => history.failures.push((sent, Instant::now(), e)),
        }
    }

    /// A failed call: pause briefly, as a client would before trying again.
    async fn failed(&self, sent: Instant, error: String) {
        self.outcome(sent, Err(error));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    async fn lock_loop(mut self, resource: String) {
        while !self.stop.load(Ordering::SeqCst) {
            let options = AcquireOptions::new().ttl_ms(TTL_MS).wait_up_to(1_000);
            let sent = Instant::now();
            let held = match self
                .instance
                .lock()
                .acquire("faultrun", &resource, options)
                .await
            {
                Ok(Ok(AcquireOutcome::Acquired(held))) => held,
                Ok(Ok(AcquireOutcome::Busy(_))) => {
                    self.outcome(sent, Ok(()));
                    continue;
                }
                Ok(Err(e)) => {
                    self.failed(sent, format!("{e:?}")).await;
                    continue;
                }
                Err(trap) => panic!("acquire trapped: {trap:?}"),
            };
            let received = Instant::now();
            self.outcome(sent, Ok(()));
            // The critical section: long enough for a rival to try.
            tokio::time::sleep(Duration::from_millis(20)).await;
            let release_sent = Instant::now();
            let released = self.instance.lock().release(&held).await;
            let result = match &released {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(format!("{e:?}")),
                Err(trap) => panic!("release trapped: {trap:?}"),
            };
            self.history.lock().unwrap().grants.push(Grant {
                resource: resource.clone(),
                fence: held.fence,
                sent,
                received,
                release_sent,
                release_failed: result.as_ref().err().cloned(),
            });
            match result {
                Ok(()) => self.outcome(release_sent, Ok(())),
                Err(e) => self.failed(release_sent, e).await,
            }
        }
    }

    async fn write_loop(mut self, key: String) {
        let mut value = 0u64;
        while !self.stop.load(Ordering::SeqCst) {
            value += 1;
            self.history
                .lock()
                .unwrap()
                .attempted
                .insert(key.clone(), value);
            let sent = Instant::now();
            match self
                .instance
                .ephemeral()
                .upsert(&space(), "t", &key, value.to_string().as_bytes())
                .await
            {
                Ok(Ok(_)) => {
                    let received = Instant::now();
                    let mut history = self.history.lock().unwrap();
                    history
                        .acks
                        .entry(key.clone())
                        .or_default()
                        .push((value, received));
                    drop(history);
                    self.outcome(sent, Ok(()));
                }
                Ok(Err(e)) => self.failed(sent, format!("{e:?}")).await,
                Err(trap) => panic!("upsert trapped: {trap:?}"),
            }
        }
    }

    async fn read_loop(mut self) {
        while !self.stop.load(Ordering::SeqCst) {
            let sent = Instant::now();
            match self
                .instance
                .ephemeral()
                .snapshot(&space(), "t", None)
                .await
            {
                Ok(Ok(snapshot)) => {
                    self.history
                        .lock()
                        .unwrap()
                        .reads
                        .push((sent, counters(&snapshot)));
                    self.outcome(sent, Ok(()));
                }
                Ok(Err(e)) => self.failed(sent, format!("{e:?}")).await,
                Err(trap) => panic!("snapshot trapped: {trap:?}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Each counter's value in a snapshot.
fn counters(snapshot: &coord_host::ephemeral::TenantSnapshot) -> HashMap<String, u64> {
    snapshot
        .entries
        .iter()
        .map(|e| {
            let value = std::str::from_utf8(&e.value)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(u64::MAX);
            (e.key.clone(), value)
        })
        .collect()
}

/// The checks of the module's head, over `history` and the final values.
/// A double grant for the report: both grants' times in ms from the first
/// fault's start, and the fault the second one was received in.
fn describe_double_grant(a: &Grant, b: &Grant, faults: &[Fault]) -> String {
    let Some(origin) = faults.first().map(|f| f.started) else {
        return format!("{a:?} then {b:?}");
    };
    let ms = |t: Instant| {
        if t >= origin {
            t.duration_since(origin).as_millis() as i128
        } else {
            -(origin.duration_since(t).as_millis() as i128)
        }
    };
    let during = faults
        .iter()
        .rev()
        .find(|f| f.started <= b.received)
        .map_or("before the faults".to_string(), |f| {
            format!(
                "{} (started {} ms, healed {} ms)",
                f.name,
                ms(f.started),
                ms(f.healed)
            )
        });
    format!(
        "{}: fence {} sent {} received {} release sent {} (failed: {:?}); fence {} sent {} received {}; during {during}",
        a.resource,
        a.fence,
        ms(a.sent),
        ms(a.received),
        ms(a.release_sent),
        a.release_failed,
        b.fence,
        ms(b.sent),
        ms(b.received),
    )
}

fn check(history: &History, last: &HashMap<String, u64>, faults: &[Fault]) -> Verdict {
    let mut verdict = Verdict {
        grants: history.grants.len(),
        acked_writes: history.acks.values().map(Vec::len).sum(),
        reads: history.reads.len(),
        failed_calls: history.failures.len(),
        wrong_errors: history
            .failures
            .iter()
            .filter(|(_, _, e)| !e.starts_with("Error::Unavailable("))
            .map(|(_, _, e)| e.clone())
            .collect(),
        ..Verdict::default()
    };
    let ttl = Duration::from_millis(TTL_MS);
    for a in &history.grants {
        // In its critical section until its release was sent (whether the
        // release then succeeded, failed, or was finished by the host in
        // the background: the holder had stopped), and at most until its
        // TTL, counted from its request's send, ran out.
        let held_until = a.release_sent.min(a.sent + ttl);
        for b in &history.grants {
            if a.resource != b.resource || std::ptr::eq(a, b) {
                continue;
            }
            if a.fence == b.fence {
                verdict.shared_fences += 1;
            } else if a.fence < b.fence && b.received < held_until {
                verdict.double_grants += 1;
                if verdict.double_grant_examples.len() < 5 {
                    verdict
                        .double_grant_examples
                        .push(describe_double_grant(a, b, faults));
                }
            }
            if a.received < b.sent && a.fence > b.fence {
                verdict.fences_back += 1;
            }
        }
    }
    verdict.shared_fences /= 2;
    for (sent, values) in &history.reads {
        for (key, acks) in &history.acks {
            let acked = acks
                .iter()
                .filter(|(_, at)| at < sent)
                .map(|(v, _)| *v)
                .max();
            if let Some(acked) = acked
                && values.get(key).copied().unwrap_or(0) < acked
            {
                verdict.stale_reads += 1;
            }
        }
    }
    for (key, acks) in &history.acks {
        let acked = acks.iter().map(|(v, _)| *v).max().unwrap_or(0);
        let value = last.get(key).copied().unwrap_or(0);
        if value < acked {
            verdict.lost_updates += 1;
        }
        if value > history.attempted.get(key).copied().unwrap_or(0) {
            verdict.phantom_values += 1;
        }
    }
    for (i, fault) in faults.iter().enumerate() {
        let until = faults.get(i + 1).map(|f| f.started);
        let within = |sent: &Instant| *sent >= fault.started && until.is_none_or(|u| *sent < u);
        let failures: Vec<&(Instant, Instant, String)> = history
            .failures
            .iter()
            .filter(|(sent, _, _)| within(sent))
            .collect();
        let mut errors: Vec<String> = failures.iter().map(|(_, _, e)| e.clone()).collect();
        errors.sort();
        errors.dedup();
        verdict.recoveries.push(Recovery {
            fault: fault.name.clone(),
            held_ms: fault.healed.duration_since(fault.started).as_millis(),
            failed_calls: failures.len(),
            failing_for_ms: failures
                .iter()
                .map(|(_, at, _)| at.duration_since(fault.started).as_millis())
                .max()
                .unwrap_or(0),
            first_success_after_heal_ms: history
                .successes
                .iter()
                .filter(|(sent, _)| *sent >= fault.healed)
                .map(|(_, received)| received.duration_since(fault.healed).as_millis())
                .min(),
            errors,
        });
    }
    verdict
}
