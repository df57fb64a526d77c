//! The measured operations, through the component and natively.
//!
//! Over 1 000 lines, on purpose for now: each section is one table of
//! BENCHMARKS.md (per operation, 64 tasks, after idle, handoff, the profile
//! workloads), and every table measures the component, the native path and
//! the references in the same loop, so they share the loop helpers here.
//! Split it by table (`per_operation.rs`, `concurrency.rs`, …) when one
//! more table is added.

use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_component::keys;
use coord_host::backend::redis::RedisBackend;
use coord_host::backend::{
    Backend, Condition, Guard, MeterAlgorithm, MeterMode, MeterRequest, Outcome,
};
use coord_host::ephemeral::Space;
use coord_host::lock::{AcquireOptions, AcquireOutcome, ExtendOutcome, Retry, WaitPolicy};
use coord_host::ratelimit::Limiter;
use coord_host::{Instance, Runtime};

use crate::Effort;
use crate::at_scale::{Reference, ReferenceStep};
use crate::measure::{Stats, Step, failed, fmt_us};

/// The operations of the per-operation table.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op {
    AcquireRelease,
    Acquire,
    Extend,
    Check,
    Upsert,
    Touch,
    Snapshot100,
}

const OPS: [Op; 7] = [
    Op::AcquireRelease,
    Op::Acquire,
    Op::Extend,
    Op::Check,
    Op::Upsert,
    Op::Touch,
    Op::Snapshot100,
];
pub(crate) const LOCK_ID: &str = "bench.lock";

pub(crate) fn space() -> Space {
    Space {
        id: "bench.presence".into(),
        ttl_ms: 60_000,
        max_value_bytes: 256,
    }
}

fn limiter() -> Limiter {
    Limiter {
        id: "bench.limit".into(),
        limit: 10_000_000,
        window_ms: 60_000,
        algorithm: None,
    }
}

fn meter_request() -> MeterRequest {
    MeterRequest {
        algorithm: MeterAlgorithm::SlidingWindow,
        limit: 10_000_000,
        window_ms: 60_000,
        cost: 1,
        mode: MeterMode::Consume,
    }
}

pub(crate) fn no_wait() -> AcquireOptions {
    AcquireOptions::new().ttl_ms(30_000).no_wait()
}

/// One operation through the component, on resource/key `n`.
pub(crate) async fn component_op(op: Op, i: &mut Instance, n: &str) -> wasmtime::Result<()> {
    match op {
        Op::AcquireRelease => {
            let AcquireOutcome::Acquired(lock) = i
                .acquire(LOCK_ID, n, no_wait())
                .await?
                .map_err(|e| failed(&format!("{e:?}")))?
            else {
                return Err(failed("busy"));
            };
            i.release(&lock)
                .await?
                .map_err(|e| failed(&format!("{e:?}")))?;
        }
        Op::Extend | Op::Acquire => return Err(failed("measured by a function of its own")),
        Op::Check => {
            i.check(&limiter(), n, None)
                .await?
                .map_err(|e| failed(&format!("{e:?}")))?;
        }
        Op::Upsert => {
            i.upsert(&space(), "bench", n, b"{\"user\":\"ada\"}")
                .await?
                .map_err(|e| failed(&format!("{e:?}")))?;
        }
        Op::Touch => {
            i.touch(&space(), "bench", n)
                .await?
                .map_err(|e| failed(&format!("{e:?}")))?;
        }
        Op::Snapshot100 => {
            let s = i
                .snapshot(&space(), "bench-100", None)
                .await?
                .map_err(|e| failed(&format!("{e:?}")))?;
            if s.entries.len() != 100 {
                return Err(failed("snapshot size"));
            }
        }
    }
    Ok(())
}

/// The same operation on the same backend, straight from Rust.
async fn native_op(op: Op, b: &dyn Backend, n: &str) -> wasmtime::Result<()> {
    let err = |e| failed(&format!("{e:?}"));
    match op {
        Op::AcquireRelease => {
            let partition = keys::lock_partition(LOCK_ID, n);
            let guard = native_acquire(b, &partition).await?;
            b.delete(&partition, keys::LOCK_HOLDER_KEY, &guard)
                .await
                .map_err(err)?;
        }
        Op::Extend | Op::Acquire => return Err(failed("measured by a function of its own")),
        Op::Check => {
            b.meter(
                &keys::ratelimit_partition("bench.limit", n),
                "meter",
                &meter_request(),
            )
            .await
            .map_err(err)?;
        }
        Op::Upsert => {
            let partition = keys::ephemeral_partition("bench.presence", "bench");
            b.put(
                &partition,
                n,
                b"{\"user\":\"ada\"}",
                Some(60_000),
                &Condition::Always,
            )
            .await
            .map_err(err)?;
        }
        Op::Touch => {
            let partition = keys::ephemeral_partition("bench.presence", "bench");
            b.touch(&partition, n, 60_000, &Condition::Always)
                .await
                .map_err(err)?;
        }
        Op::Snapshot100 => {
            let partition = keys::ephemeral_partition("bench.presence", "bench-100");
            let l = b.list(&partition, "").await.map_err(err)?;
            if l.entries.len() != 100 {
                return Err(failed("snapshot size"));
            }
        }
    }
    Ok(())
}

/// The per-operation table at concurrency 1. Each repetition runs the
/// component's operation, the native one and (on Redis) a PING back to back,
/// so all three columns see the same moments of a shared, drifting VM.
pub async fn per_operation(
    label: &str,
    backend: Arc<dyn Backend>,
    redis: Option<(Arc<RedisBackend>, String)>,
    effort: Effort,
) -> wasmtime::Result<()> {
    let runtime = Runtime::new(backend.clone())?;
    let mut i = runtime.instantiate().await?;
    for k in 0..100 {
        component_op(Op::Upsert, &mut i, &format!("k{k}")).await?;
        i.upsert(
            &space(),
            "bench-100",
            &format!("k{k}"),
            b"{\"user\":\"ada\"}",
        )
        .await?
        .map_err(|e| failed(&format!("{e:?}")))?;
    }
    println!("Per operation, {label}, concurrency 1 (p50 µs)");
    if redis.is_some() {
        println!(
            "  {:<16} {:>10} {:>8} {:>8} {:>7} {:>8} {:>8} {:>7} {:>7}",
            "operation",
            "component",
            "native",
            "ratio",
            "PING",
            "×PING c",
            "×PING n",
            "calls",
            "trips"
        );
    } else {
        println!(
            "  {:<16} {:>10} {:>8} {:>8} {:>7}",
            "operation", "component", "native", "ratio", "calls"
        );
    }
    let redis_backend = redis.as_ref().map(|r| r.0.clone());
    for op in OPS {
        let row = match op {
            Op::Extend => {
                time_extend(&mut i, backend.as_ref(), redis_backend.as_ref(), effort).await?
            }
            Op::Acquire => time_acquire(&mut i, backend.as_ref(), &redis_backend, effort).await?,
            _ => {
                let mut row = Row::default();
                for n in 0..effort.reps {
                    let key = format!("k{}", n % 100);
                    let (calls0, trips0) = (i.store_calls(), trips(&redis_backend));
                    let start = Instant::now();
                    component_op(op, &mut i, &key).await?;
                    row.component.push(start.elapsed());
                    row.calls += i.store_calls() - calls0;
                    row.trips += trips(&redis_backend) - trips0;

                    let start = Instant::now();
                    native_op(op, backend.as_ref(), &key).await?;
                    row.native.push(start.elapsed());
                    row.ping(&redis_backend).await?;
                }
                row
            }
        };
        let name = match op {
            Op::AcquireRelease => "acquire+release",
            Op::Acquire => "acquire alone",
            Op::Extend => "extend",
            Op::Check => "ratelimit check",
            Op::Upsert => "upsert",
            Op::Touch => "touch",
            Op::Snapshot100 => "snapshot of 100",
        };
        row.print(name, effort.reps, redis.is_some());
    }
    if let Some((_, url)) = &redis {
        references(url, effort).await?;
    }
    println!();
    Ok(())
}

/// One row of the per-operation table: samples and counters.
#[derive(Default)]
struct Row {
    component: Stats,
    native: Stats,
    pings: Stats,
    calls: u64,
    trips: u64,
}

impl Row {
    /// One PING on `redis`, timed, when the row is on Redis.
    async fn ping(&mut self, redis: &Option<Arc<RedisBackend>>) -> wasmtime::Result<()> {
        if let Some(r) = redis {
            let start = Instant::now();
            r.ping().await.map_err(|e| failed(&format!("{e:?}")))?;
            self.pings.push(start.elapsed());
        }
        Ok(())
    }

    fn print(&self, name: &str, reps: usize, on_redis: bool) {
        let (c, n) = (self.component.median(), self.native.median());
        let ratio = c.as_secs_f64() / n.as_secs_f64();
        let calls = self.calls as f64 / reps as f64;
        let trips = self.trips as f64 / reps as f64;
        if on_redis {
            let p = self.pings.median().as_secs_f64();
            let (cp, np) = (c.as_secs_f64() / p, n.as_secs_f64() / p);
            println!(
                "  {name:<16} {:>10} {:>8} {ratio:>7.2}× {:>7} {cp:>7.2}× {np:>7.2}× {calls:>7.2} {trips:>7.2}",
                fmt_us(c),
                fmt_us(n),
                fmt_us(self.pings.median())
            );
        } else {
            println!(
                "  {name:<16} {:>10} {:>8} {ratio:>7.2}× {calls:>7.2}",
                fmt_us(c),
                fmt_us(n)
            );
        }
    }
}

/// Requests sent to Redis so far, or 0 in memory.
fn trips(redis: &Option<Arc<RedisBackend>>) -> u64 {
    redis.as_ref().map_or(0, |r| r.round_trips())
}

/// Three reference locks and a reference check on Redis, on a connection of
/// their own, each timed in turns with the others and with a PING:
///
/// - the lock the target was set against: seed 000's bare Redis lock
///   (`SET key owner NX PX ttl`, then a compare-and-delete script), with no
///   fence, no change feed and no expiry record;
/// - the least a fenced Lua lock needs: the holder, its expiry and a fence
///   (seeded from the clock, as coord's revisions are) in one hash, read and
///   written by one script each way (`TIME`, `HMGET`, `HSET`; then `HGET`,
///   `HDEL`). It is coord's lock without the change feed, the expiry index
///   and the notification, and it tells what a lock partition without them
///   could reach at best;
/// - coord's own commands with none of its logic: the Redis commands the
///   unwatched partition's script issues for a lock's acquire and release
///   while nobody waits (`TIME`, `GET`, `SET PX`, each way), in order and
///   with values of the same sizes, on the partition's one key. The gap
///   between it and coord's lock is the script's own work; what it costs is
///   the layout's;
/// - the rate-limit check's commands with none of the meter script's logic
///   (`TIME`, `GET`, `SET PX`, with a state and a reply of the meter's
///   sizes): the least any one-script check that keeps its state in one key
///   costs, and the gap to the native check is the meter script's own work.
async fn references(url: &str, effort: Effort) -> wasmtime::Result<()> {
    let err = |e: ::redis::RedisError| failed(&format!("{e:?}"));
    let client = ::redis::Client::open(url).map_err(err)?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(err)?;
    let bare_release = ::redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    );
    let fenced_acquire = ::redis::Script::new(FENCED_ACQUIRE);
    let fenced_release = ::redis::Script::new(FENCED_RELEASE);
    let bare_key = format!("coordbench-bare-{}", std::process::id());
    let fenced_key = format!("coordbench-fenced-{}", std::process::id());
    let commands_acquire = ::redis::Script::new(COMMANDS_ACQUIRE);
    let commands_release = ::redis::Script::new(COMMANDS_RELEASE);
    let commands_key = format!("coordbench-commands-{{{}}}:s", std::process::id());
    // The check's one key, which its script sets with a TTL.
    let check_key = format!("coordbench-check-{}", std::process::id());
    let commands_check = ::redis::Script::new(COMMANDS_CHECK);
    let mut commands_check_call = commands_check.key(&check_key);
    // A meter's state and its reply are 33 bytes each.
    commands_check_call.arg("s".repeat(33)).arg("r".repeat(33));
    // The sizes of a lock's partition with its holder (an 18-byte header, a
    // 36-byte entry header, the key and the 32-byte owner) and without.
    let (with_holder, without) = ("h".repeat(92), "n".repeat(18));
    let owner = "0123456789abcdef0123456789abcdef";
    let (mut bare, mut fenced, mut commands, mut check, mut pings) = (
        Stats::default(),
        Stats::default(),
        Stats::default(),
        Stats::default(),
        Stats::default(),
    );
    // The hash keeps its fence between holders, and this TTL (set once, not
    // by the scripts) lets Redis drop it should the run stop half-way.
    let _: () = ::redis::pipe()
        .hset(&fenced_key, "fence", 0)
        .ignore()
        .pexpire(&fenced_key, 600_000)
        .ignore()
        .query_async(&mut conn)
        .await
        .map_err(err)?;
    // Both take the same key and arguments on every pair.
    let [mut commands_acquire_call, mut commands_release_call] =
        [&commands_acquire, &commands_release].map(|script| script.key(&commands_key));
    for call in [&mut commands_acquire_call, &mut commands_release_call] {
        call.arg(&with_holder).arg(&without);
    }
    let mut last_fence = 0;
    for _ in 0..effort.reps {
        let start = Instant::now();
        let set: Option<String> = ::redis::cmd("SET")
            .arg(&bare_key)
            .arg(owner)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut conn)
            .await
            .map_err(err)?;
        let deleted: i64 = bare_release
            .key(&bare_key)
            .arg(owner)
            .invoke_async(&mut conn)
            .await
            .map_err(err)?;
        bare.push(start.elapsed());
        if set.is_none() || deleted != 1 {
            return Err(failed("the bare lock was not taken and released"));
        }

        let start = Instant::now();
        let fence: i64 = fenced_acquire
            .key(&fenced_key)
            .arg(owner)
            .arg(30_000)
            .invoke_async(&mut conn)
            .await
            .map_err(err)?;
        let released: i64 = fenced_release
            .key(&fenced_key)
            .arg(owner)
            .invoke_async(&mut conn)
            .await
            .map_err(err)?;
        fenced.push(start.elapsed());
        if fence <= last_fence || released != 1 {
            return Err(failed(
                "the fenced lock was not taken with a new fence and released",
            ));
        }
        last_fence = fence;

        let start = Instant::now();
        let written: i64 = commands_acquire_call
            .invoke_async(&mut conn)
            .await
            .map_err(err)?;
        let deleted: i64 = commands_release_call
            .invoke_async(&mut conn)
            .await
            .map_err(err)?;
        commands.push(start.elapsed());
        if written != 1 || deleted != 1 {
            return Err(failed(
                "coord's commands did not write and delete the holder",
            ));
        }

        let start = Instant::now();
        let reply: Vec<u8> = commands_check_call
            .invoke_async(&mut conn)
            .await
            .map_err(err)?;
        check.push(start.elapsed());
        if reply.len() != 33 {
            return Err(failed("the check's commands did not answer its reply"));
        }

        let start = Instant::now();
        let _: String = ::redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .map_err(err)?;
        pings.push(start.elapsed());
    }
    let _: i64 = ::redis::cmd("DEL")
        .arg(&fenced_key)
        .arg(&commands_key)
        .arg(&check_key)
        .query_async(&mut conn)
        .await
        .map_err(err)?;
    let p = pings.median();
    // Their round trips are not counted: by construction two per lock pair
    // and one per check.
    for (name, pair) in [
        ("bare SET NX lock", &bare),
        ("fenced Lua lock", &fenced),
        ("coord's commands", &commands),
        ("check's commands", &check),
    ] {
        let c = pair.median();
        println!(
            "  {:<16} {:>10} {:>8} {:>8} {:>7} {:>8} {:>7.2}× {:>7} {:>7}",
            name,
            "—",
            fmt_us(c),
            "—",
            fmt_us(p),
            "—",
            c.as_secs_f64() / p.as_secs_f64(),
            "—",
            "—"
        );
    }
    Ok(())
}

/// The fenced reference lock's acquire (its header says what it takes).
const FENCED_ACQUIRE: &str = include_str!("fenced-acquire.lua");

/// The fenced reference lock's release.
const FENCED_RELEASE: &str = include_str!("fenced-release.lua");

/// coord's lock commands without its logic, acquire (its header says more).
const COMMANDS_ACQUIRE: &str = include_str!("commands-acquire.lua");

/// coord's lock commands without its logic, release.
const COMMANDS_RELEASE: &str = include_str!("commands-release.lua");

/// The rate-limit check's commands without the meter script's logic.
const COMMANDS_CHECK: &str = include_str!("commands-check.lua");

/// Acquire alone, interleaved like the other rows: each lock is released
/// outside the timed part, so the row is the cost of one acquire.
async fn time_acquire(
    i: &mut Instance,
    b: &dyn Backend,
    redis: &Option<Arc<RedisBackend>>,
    effort: Effort,
) -> wasmtime::Result<Row> {
    let err = |e| failed(&format!("{e:?}"));
    let mut row = Row::default();
    for n in 0..effort.reps {
        let resource = format!("k{}", n % 100);
        let (calls0, trips0) = (i.store_calls(), trips(redis));
        let start = Instant::now();
        let AcquireOutcome::Acquired(lock) = i
            .acquire(LOCK_ID, &resource, no_wait())
            .await?
            .map_err(|e| failed(&format!("{e:?}")))?
        else {
            return Err(failed("busy"));
        };
        row.component.push(start.elapsed());
        row.calls += i.store_calls() - calls0;
        row.trips += trips(redis) - trips0;
        i.release(&lock)
            .await?
            .map_err(|e| failed(&format!("{e:?}")))?;

        let partition = keys::lock_partition(LOCK_ID, &resource);
        let start = Instant::now();
        let guard = native_acquire(b, &partition).await?;
        row.native.push(start.elapsed());
        b.delete(&partition, keys::LOCK_HOLDER_KEY, &guard)
            .await
            .map_err(err)?;
        row.ping(redis).await?;
    }
    Ok(row)
}

/// Extend, interleaved like the other rows: the component extends its held
/// lock, then the same touch runs natively on a lock of its own.
async fn time_extend(
    i: &mut Instance,
    b: &dyn Backend,
    redis: Option<&Arc<RedisBackend>>,
    effort: Effort,
) -> wasmtime::Result<Row> {
    let redis = redis.cloned();
    let AcquireOutcome::Acquired(mut lock) = i
        .acquire(LOCK_ID, "extend-me", no_wait())
        .await?
        .map_err(|e| failed(&format!("{e:?}")))?
    else {
        return Err(failed("busy"));
    };
    let partition = keys::lock_partition(LOCK_ID, "extend-native");
    let err = |e| failed(&format!("{e:?}"));
    let guard = native_acquire(b, &partition).await?;
    let mut row = Row::default();
    for _ in 0..effort.reps {
        let (calls0, trips0) = (i.store_calls(), trips(&redis));
        let start = Instant::now();
        let ExtendOutcome::Extended(next) = i
            .extend(&lock, None)
            .await?
            .map_err(|e| failed(&format!("{e:?}")))?
        else {
            return Err(failed("lost"));
        };
        row.component.push(start.elapsed());
        row.calls += i.store_calls() - calls0;
        row.trips += trips(&redis) - trips0;
        lock = next;

        let start = Instant::now();
        native_extend(b, &partition, &guard).await?;
        row.native.push(start.elapsed());
        row.ping(&redis).await?;
    }
    i.release(&lock)
        .await?
        .map_err(|e| failed(&format!("{e:?}")))?;
    b.delete(&partition, keys::LOCK_HOLDER_KEY, &guard)
        .await
        .map_err(err)?;
    Ok(row)
}

/// A lock acquired natively, as the component would: create-if-absent with a
/// TTL; the condition that only this holder satisfies.
async fn native_acquire(b: &dyn Backend, partition: &str) -> wasmtime::Result<Condition> {
    let owner = b"0123456789abcdef0123456789abcdef";
    let reply = b
        .put(
            partition,
            keys::LOCK_HOLDER_KEY,
            owner,
            Some(30_000),
            &Condition::Absent,
        )
        .await
        .map_err(|e| failed(&format!("{e:?}")))?;
    let Outcome::Applied(entry) = reply.outcome else {
        return Err(failed("busy"));
    };
    Ok(Condition::RevisionAndValue(Guard {
        revision: entry.revision,
        value: owner.to_vec(),
    }))
}

/// Run `tasks` tasks of `per_task` timed steps each; all samples and the
/// overall rate. `task(t)` makes task `t`'s step function.
pub(crate) async fn run_tasks<F, S, Fut>(
    tasks: usize,
    per_task: usize,
    task: F,
) -> wasmtime::Result<(Stats, f64)>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = wasmtime::Result<S>> + Send + 'static,
    S: Step + Send + 'static,
{
    let started = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let make = task(t);
        handles.push(tokio::spawn(async move {
            let mut step = make.await?;
            let mut s = Stats::default();
            for _ in 0..per_task {
                let start = Instant::now();
                step.step().await?;
                s.push(start.elapsed());
            }
            Ok::<_, wasmtime::Error>(s)
        }));
    }
    let mut all = Stats::default();
    for h in handles {
        all.extend(h.await??);
    }
    Ok((
        all,
        (tasks * per_task) as f64 / started.elapsed().as_secs_f64(),
    ))
}

/// The samples and elapsed time of several runs of [`run_tasks`].
#[derive(Default)]
struct Rounds {
    samples: Stats,
    operations: f64,
    seconds: f64,
}

impl Rounds {
    /// Add one run's samples and its rate.
    fn add(&mut self, (samples, rate): (Stats, f64)) {
        let operations = samples.len() as f64;
        self.operations += operations;
        self.seconds += operations / rate;
        self.samples.extend(samples);
    }

    /// Operations per second over all runs.
    fn rate(&self) -> f64 {
        self.operations / self.seconds
    }

    /// All samples and the overall rate, as one run reports them.
    fn total(self) -> (Stats, f64) {
        let rate = self.rate();
        (self.samples, rate)
    }
}

/// An operation through a component instance of its own.
pub(crate) struct ComponentStep(pub(crate) Op, pub(crate) Instance, pub(crate) String);
/// The same operation on the backend, natively.
struct NativeStep(Op, Arc<dyn Backend>, String);
/// A bare PING.
pub(crate) struct PingStep(pub(crate) Arc<RedisBackend>);

/// `op` in `tasks` tasks, `per_task` each, every task through an instance
/// of its own on its own key (`task-<n>`): the latencies and the rate.
pub(crate) async fn component_rate(
    runtime: &Arc<Runtime>,
    op: Op,
    tasks: usize,
    per_task: usize,
) -> wasmtime::Result<(Stats, f64)> {
    run_tasks(tasks, per_task, |t| {
        let runtime = runtime.clone();
        async move {
            Ok(ComponentStep(
                op,
                runtime.instantiate().await?,
                format!("task-{t}"),
            ))
        }
    })
    .await
}

impl Step for ComponentStep {
    async fn step(&mut self) -> wasmtime::Result<()> {
        component_op(self.0, &mut self.1, &self.2).await
    }
}

impl Step for NativeStep {
    async fn step(&mut self) -> wasmtime::Result<()> {
        native_op(self.0, self.1.as_ref(), &self.2).await
    }
}

impl Step for PingStep {
    async fn step(&mut self) -> wasmtime::Result<()> {
        self.0.ping().await.map_err(|e| failed(&format!("{e:?}")))
    }
}

/// 64 concurrent instances (or native callers), each on its own key.
pub async fn concurrency(
    backend: Arc<dyn Backend>,
    redis: Option<String>,
    effort: Effort,
) -> wasmtime::Result<()> {
    const TASKS: usize = 64;
    let label = if redis.is_some() {
        "Redis (loopback)"
    } else {
        "in memory"
    };
    println!("Concurrency 1 vs 64, {label}: ops/s, p50 µs, p99 µs");
    println!(
        "  {:<24} {:>5} {:>10} {:>9} {:>9}",
        "operation", "tasks", "ops/s", "p50", "p99"
    );
    let row = |name: &str, tasks: usize, (all, rate): (Stats, f64)| {
        println!(
            "  {name:<24} {tasks:>5} {rate:>10.0} {:>9} {:>9}",
            fmt_us(all.median()),
            fmt_us(all.p99())
        );
    };
    // One task does as many operations as eight of the 64 do.
    let per_task = |tasks: usize| effort.per_task * if tasks == 1 { 8 } else { 1 };
    // Component and native take turns, a fifth of the operations at a time,
    // so that both see the same stretches of a drifting VM.
    const ROUNDS: usize = 5;
    let runtime = Arc::new(Runtime::new(backend.clone())?);
    // The component's rate at 64 tasks, for the references' ratios.
    let mut at_64 = std::collections::HashMap::new();
    for op in [Op::Check, Op::AcquireRelease] {
        for tasks in [1, TASKS] {
            let (mut component, mut native) = (Rounds::default(), Rounds::default());
            for _ in 0..ROUNDS {
                component.add(component_rate(&runtime, op, tasks, per_task(tasks) / ROUNDS).await?);
                native.add(
                    run_tasks(tasks, per_task(tasks) / ROUNDS, |t| {
                        let backend = backend.clone();
                        async move { Ok(NativeStep(op, backend, format!("task-{t}"))) }
                    })
                    .await?,
                );
            }
            let ratio = component.rate() / native.rate();
            if tasks == TASKS {
                at_64.insert(format!("{op:?}"), component.rate());
            }
            row(&format!("{op:?} component"), tasks, component.total());
            row(&format!("{op:?} native"), tasks, native.total());
            println!("  {:<24} {tasks:>5} {ratio:>10.2}", "  component / native");
        }
    }
    if let Some(url) = redis {
        let config = coord_host::backend::redis::RedisConfig::new(url.clone());
        let r = Arc::new(
            RedisBackend::connect(config)
                .await
                .map_err(|e| failed(&format!("{e:?}")))?,
        );
        for tasks in [1, TASKS] {
            let ping = run_tasks(tasks, per_task(tasks), |_| {
                let r = r.clone();
                async move { Ok(PingStep(r)) }
            })
            .await?;
            row("PING", tasks, ping);
        }
        // What a user would run instead, on a connection of its own shared
        // by the tasks as coord's is.
        let client = ::redis::Client::open(url.as_str()).map_err(|e| failed(&format!("{e:?}")))?;
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| failed(&format!("{e:?}")))?;
        for (reference, name, coord) in [
            (
                Reference::BareLockPair,
                "bare lock pair (ref)",
                "AcquireRelease",
            ),
            (Reference::PlainWindowCheck, "plain window (ref)", "Check"),
        ] {
            for tasks in [1, TASKS] {
                let rate = run_tasks(tasks, per_task(tasks), |t| {
                    let conn = conn.clone();
                    async move { Ok(ReferenceStep::new(reference, conn, t)) }
                })
                .await?;
                let reference_rate = rate.1;
                row(name, tasks, rate);
                if let (TASKS, Some(component)) = (tasks, at_64.get(coord)) {
                    println!(
                        "  {:<24} {tasks:>5} {:>10.2}",
                        format!("  {coord} / reference"),
                        component / reference_rate
                    );
                }
            }
        }
    }
    println!();
    Ok(())
}

/// The first call after the process sat idle for 20-170 ms, against the
/// call right after it: what a sporadic request pays for cold caches, the
/// component against native, and beside them a component call that only
/// rejects its input (the cold cost of entering the component at all).
/// Explains most of the handoff (see BENCHMARKS.md).
pub async fn after_idle(
    label: &str,
    backend: Arc<dyn Backend>,
    redis: Option<&Arc<RedisBackend>>,
    effort: Effort,
) -> wasmtime::Result<()> {
    let err = |e: &dyn std::fmt::Debug| failed(&format!("{e:?}"));
    let runtime = Runtime::new(backend.clone())?;
    let mut i = runtime.instantiate().await?;
    let AcquireOutcome::Acquired(mut lock) = i
        .acquire(LOCK_ID, "after-idle", no_wait())
        .await?
        .map_err(|e| err(&e))?
    else {
        return Err(failed("busy"));
    };
    let partition = keys::lock_partition(LOCK_ID, "after-idle-native");
    let guard = native_acquire(backend.as_ref(), &partition).await?;
    let mut component = [Stats::default(), Stats::default()];
    let mut native = [Stats::default(), Stats::default()];
    let mut ping = [Stats::default(), Stats::default()];
    let mut rejected = [Stats::default(), Stats::default()];
    for n in 0..effort.idle_calls {
        idle_pause(n).await;
        for stats in &mut component {
            let start = Instant::now();
            let ExtendOutcome::Extended(next) =
                i.extend(&lock, None).await?.map_err(|e| err(&e))?
            else {
                return Err(failed("lost"));
            };
            stats.push(start.elapsed());
            lock = next;
        }
        idle_pause(n).await;
        // The least a component call does: enter, reject an empty id, and
        // return the error, with no store call.
        for stats in &mut rejected {
            let start = Instant::now();
            let reply = i.inspect("", "after-idle").await?;
            stats.push(start.elapsed());
            if reply.is_ok() {
                return Err(failed("an empty lock id was accepted"));
            }
        }
        idle_pause(n).await;
        for stats in &mut native {
            let start = Instant::now();
            native_extend(backend.as_ref(), &partition, &guard).await?;
            stats.push(start.elapsed());
        }
        if let Some(r) = redis {
            idle_pause(n).await;
            for stats in &mut ping {
                let start = Instant::now();
                r.ping().await.map_err(|e| err(&e))?;
                stats.push(start.elapsed());
            }
        }
    }
    i.release(&lock).await?.map_err(|e| err(&e))?;
    backend
        .delete(&partition, keys::LOCK_HOLDER_KEY, &guard)
        .await
        .map_err(|e| err(&e))?;
    println!(
        "First call after 20-170 ms idle, {label} (p50 of {}; then the call right after it)",
        effort.idle_calls
    );
    let row = |what: &str, s: &[Stats; 2]| {
        println!(
            "  {what:<28} {:>9} µs  then {:>9} µs",
            fmt_us(s[0].median()),
            fmt_us(s[1].median())
        );
    };
    row("extend, component", &component);
    row("rejected input, component", &rejected);
    row("the same touch, native", &native);
    if redis.is_some() {
        row("PING", &ping);
    }
    println!();
    Ok(())
}

/// Sleep 20-170 ms, spread over the range by `n`: the pause before a cold
/// call or a handoff, so that each starts from an idle process and server.
async fn idle_pause(n: usize) {
    tokio::time::sleep(Duration::from_millis(20 + (n as u64 * 37) % 150)).await;
}

/// Extend, natively: the store's touch of a natively held lock.
async fn native_extend(
    b: &dyn Backend,
    partition: &str,
    guard: &Condition,
) -> wasmtime::Result<()> {
    b.touch(partition, keys::LOCK_HOLDER_KEY, 30_000, guard)
        .await
        .map_err(|e| failed(&format!("{e:?}")))?;
    Ok(())
}

/// How long after a release a waiting instance holds the lock: woken by the
/// release (the component's `wait-then-put`) against polling every 200 ms.
/// With `apart` (Redis with its blocking connections off), also the same
/// handoff with the waiter's wait and its attempt as two requests, in turns
/// with the first, so both see the same moments of the VM.
pub async fn handoff(
    label: &str,
    backend: Arc<dyn Backend>,
    apart: Option<Arc<dyn Backend>>,
    redis: Option<String>,
    effort: Effort,
) -> wasmtime::Result<()> {
    let runtime = Arc::new(Runtime::new(backend)?);
    let apart = apart.map(Runtime::new).transpose()?.map(Arc::new);
    let mut holder = runtime.instantiate().await?;
    let mut woken = Stats::default();
    let mut woken_apart = Stats::default();
    let mut polled = Stats::default();
    // A handoff starts after the waiter, the releaser's connection and Redis
    // itself sat idle for 20-170 ms; so does this PING, unlike the
    // back-to-back PINGs of the tables above. It takes its turn right after
    // each handoff, so that both see the same phases of the VM.
    let mut idle_ping = Stats::default();
    let pinger = match &redis {
        Some(url) => Some(
            RedisBackend::connect(coord_host::backend::redis::RedisConfig::new(url.clone()))
                .await
                .map_err(|e| failed(&format!("{e:?}")))?,
        ),
        None => None,
    };
    for n in 0..effort.handoffs {
        woken.push(one_handoff(&mut holder, &runtime, &format!("handoff-{n}"), false, n).await?);
        if let Some(apart) = &apart {
            let resource = format!("handoff-apart-{n}");
            woken_apart.push(one_handoff(&mut holder, apart, &resource, false, n).await?);
        }
        if let Some(r) = &pinger {
            idle_pause(n).await;
            let sent = Instant::now();
            r.ping().await.map_err(|e| failed(&format!("{e:?}")))?;
            idle_ping.push(sent.elapsed());
        }
    }
    for n in 0..effort.handoffs / 5 {
        polled
            .push(one_handoff(&mut holder, &runtime, &format!("handoff-poll-{n}"), true, n).await?);
    }
    // The floor under any handoff here: waking a task parked on another
    // thread (an idle vCPU on a VM), with nothing else to do.
    let mut wake = Stats::default();
    for n in 0..effort.handoffs {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let waiter = tokio::spawn(async move {
            let _ = rx.await;
            Instant::now()
        });
        idle_pause(n).await;
        let sent = Instant::now();
        let _ = tx.send(());
        wake.push(waiter.await?.saturating_duration_since(sent));
    }
    let rt = if redis.is_some() {
        " (one Redis round trip is the PING above)"
    } else {
        ""
    };
    println!("Lock handoff, {label}: release → the waiter holds it{rt}");
    println!(
        "  woken by the release   p50 {:>9} µs  p99 {:>9} µs  ({} handoffs)",
        fmt_us(woken.median()),
        fmt_us(woken.p99()),
        effort.handoffs
    );
    if apart.is_some() {
        println!(
            "  wait, then a separate put (blocking connections off)  p50 {:>9} µs  p99 {:>9} µs",
            fmt_us(woken_apart.median()),
            fmt_us(woken_apart.p99()),
        );
    }
    println!(
        "  polling every 200 ms   p50 {:>9} µs  p99 {:>9} µs  ({} handoffs)",
        fmt_us(polled.median()),
        fmt_us(polled.p99()),
        effort.handoffs / 5
    );
    println!(
        "  (a bare task wake-up   p50 {:>9} µs  p99 {:>9} µs: the scheduling floor)",
        fmt_us(wake.median()),
        fmt_us(wake.p99())
    );
    if redis.is_some() {
        println!(
            "  (a PING after the same idle  p50 {:>9} µs  p99 {:>9} µs: one cold round trip)",
            fmt_us(idle_ping.median()),
            fmt_us(idle_ping.p99())
        );
        let cold_trips = woken.median().as_secs_f64() / idle_ping.median().as_secs_f64();
        println!("  woken by the release, p50 in cold round trips: {cold_trips:.2} (target ≤ 2)");
    }
    println!();
    Ok(())
}

/// One handoff of a lock on `resource`: `holder` takes it, a new instance of
/// `runtime` waits for it (or polls, every 200 ms), and after an idle pause
/// the holder releases it. From the release to the waiter holding it.
async fn one_handoff(
    holder: &mut coord_host::Instance,
    runtime: &Arc<Runtime>,
    resource: &str,
    poll: bool,
    n: usize,
) -> wasmtime::Result<Duration> {
    let AcquireOutcome::Acquired(lock) = holder
        .acquire(LOCK_ID, resource, no_wait())
        .await?
        .map_err(|e| failed(&format!("{e:?}")))?
    else {
        return Err(failed("busy"));
    };
    let runtime2 = runtime.clone();
    let r2 = resource.to_string();
    let waiter = tokio::spawn(async move {
        let mut i = runtime2.instantiate().await?;
        if poll {
            loop {
                if let AcquireOutcome::Acquired(_) = i
                    .acquire(LOCK_ID, &r2, no_wait())
                    .await?
                    .map_err(|e| failed(&format!("{e:?}")))?
                {
                    return Ok::<_, wasmtime::Error>(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        let wait = AcquireOptions {
            ttl_ms: Some(30_000),
            wait: Some(WaitPolicy::Attempts(Retry {
                max_attempts: 10,
                delay_ms: 200,
            })),
        };
        match i
            .acquire(LOCK_ID, &r2, wait)
            .await?
            .map_err(|e| failed(&format!("{e:?}")))?
        {
            AcquireOutcome::Acquired(_) => Ok(Instant::now()),
            AcquireOutcome::Busy(_) => Err(failed("the waiter gave up")),
        }
    });
    // Let the waiter reach its wait (or its poll sleep) at a random phase.
    idle_pause(n).await;
    let released = Instant::now();
    holder
        .release(&lock)
        .await?
        .map_err(|e| failed(&format!("{e:?}")))?;
    let acquired = waiter.await??;
    Ok(acquired.saturating_duration_since(released))
}

/// `n` acquire+release pairs through the component on `backend`, nothing else;
/// with `native`, the same pairs straight on the backend instead, so that
/// callgrind can count both sides (`callgrind-acquire.sh`).
///
/// For `perf` (`perf_map`), the real engine configuration with a perf map of
/// the JIT-compiled code, so `perf report` names the guest's functions.
pub async fn profile_acquire(
    backend: Arc<dyn Backend>,
    n: usize,
    perf_map: bool,
    native: bool,
) -> wasmtime::Result<()> {
    if native {
        for k in 0..n {
            native_op(
                Op::AcquireRelease,
                backend.as_ref(),
                &format!("k{}", k % 100),
            )
            .await?;
        }
        println!("{n} acquire+release pairs, native");
        return Ok(());
    }
    let config = if perf_map {
        let mut config = coord_host::engine_config();
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        config
    } else {
        unpooled_config()
    };
    let runtime = Runtime::with_config(coord_host::COMPONENT, &config, backend)?;
    let mut i = runtime.instantiate().await?;
    for k in 0..n {
        component_op(Op::AcquireRelease, &mut i, &format!("k{}", k % 100)).await?;
    }
    println!("{n} acquire+release pairs, {} store calls", i.store_calls());
    Ok(())
}

/// One edge request as a host serves it: a fresh instance from the pool,
/// one in-memory rate-limit check, the instance dropped (its slot reset for
/// the next). Returns the request's time.
pub async fn one_request(runtime: &Runtime, key: &str) -> wasmtime::Result<Duration> {
    let start = Instant::now();
    let mut i = runtime.instantiate().await?;
    component_op(Op::Check, &mut i, key).await?;
    drop(i);
    Ok(start.elapsed())
}

/// An engine without pooling and with a small memory reservation, for
/// valgrind, which cannot map the pool's terabytes of address space. The
/// per-call path, which is what is profiled, is the same.
fn unpooled_config() -> wasmtime::Config {
    let mut config = wasmtime::Config::new();
    config
        .memory_reservation(64 << 20)
        .memory_guard_size(64 << 10);
    config
}

/// `tasks` tasks doing `n` rate-limit checks (or, with `pairs`, lock
/// acquire+release pairs) each on `backend`, through one component instance
/// per task or (`native`) straight on the backend, for a profiler;
/// `unpooled`, on [`unpooled_config`]'s engine.
pub async fn profile_concurrent(
    backend: Arc<dyn Backend>,
    tasks: usize,
    n: usize,
    pairs: bool,
    native: bool,
    unpooled: bool,
) -> wasmtime::Result<()> {
    let (op, what) = if pairs {
        (Op::AcquireRelease, "lock pairs")
    } else {
        (Op::Check, "checks")
    };
    let runtime = Arc::new(if unpooled {
        Runtime::with_config(coord_host::COMPONENT, &unpooled_config(), backend.clone())?
    } else {
        Runtime::new(backend.clone())?
    });
    let (_, rate) = if native {
        run_tasks(tasks, n, |t| {
            let backend = backend.clone();
            async move { Ok(NativeStep(op, backend, format!("task-{t}"))) }
        })
        .await?
    } else {
        run_tasks(tasks, n, |t| {
            let runtime = runtime.clone();
            async move {
                Ok(ComponentStep(
                    op,
                    runtime.instantiate().await?,
                    format!("task-{t}"),
                ))
            }
        })
        .await?
    };
    println!("{tasks} tasks × {n} {what}: {rate:.0} {what}/s");
    Ok(())
}
