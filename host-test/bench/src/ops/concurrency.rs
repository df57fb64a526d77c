//! Many tasks at once (the component against the native path at 64
//! tasks), and the first call after an idle pause.

use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_component::keys;
use coord_host::Runtime;
use coord_host::backend::{Backend, Condition};
use coord_host::lock::{AcquireOutcome, ExtendOutcome};
use coord_redis::RedisBackend;

use super::{
    LOCK_ID, NativeStep, Op, PingStep, Rounds, component_rate, native_acquire, no_wait, run_tasks,
};
use crate::Effort;
use crate::at_scale::{Reference, ReferenceStep};
use crate::measure::{Stats, failed, fmt_us};

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
    for op in [Op::Check, Op::AcquireRelease, Op::PermitPair] {
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
        let config = coord_redis::RedisConfig::new(url.clone());
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
        .lock()
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
                i.lock().extend(&lock, None).await?.map_err(|e| err(&e))?
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
            let reply = i.lock().inspect("", "after-idle").await?;
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
    i.lock().release(&lock).await?.map_err(|e| err(&e))?;
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
pub(crate) async fn idle_pause(n: usize) {
    tokio::time::sleep(Duration::from_millis(20 + (n as u64 * 37) % 150)).await;
}

/// Extend, natively: the store's touch of a natively held lock.
pub(crate) async fn native_extend(
    b: &dyn Backend,
    partition: &str,
    guard: &Condition,
) -> wasmtime::Result<()> {
    b.touch(partition, keys::LOCK_HOLDER_KEY, 30_000, guard)
        .await
        .map_err(|e| failed(&format!("{e:?}")))?;
    Ok(())
}
