//! The semaphore's permit pair beside the lock pair (issue 42), in one run:
//! at one task (p50, store calls and round trips per pair, a PING beside
//! on Redis) and at 64 tasks (each its own instance and resource),
//! component and native, in memory and on Redis.

use std::sync::Arc;

use coord_host::Runtime;
use coord_host::backend::Backend;
use coord_redis::RedisBackend;

use super::per_operation::time_op;
use super::{NativeStep, Op, Rounds, component_rate, run_tasks};
use crate::Effort;
use crate::measure::{Stats, failed, fmt_us};

/// The permit pair and the lock pair on `memory` and on `redis`.
pub async fn semaphore_beside_lock(
    memory: Arc<dyn Backend>,
    redis: Arc<RedisBackend>,
    effort: Effort,
) -> wasmtime::Result<()> {
    const TASKS: usize = 64;
    const ROUNDS: usize = 5;
    let on_redis: Arc<dyn Backend> = redis.clone();
    for (label, backend, counted) in [
        ("in memory", memory, None),
        ("Redis (loopback)", on_redis, Some(redis)),
    ] {
        let runtime = Arc::new(Runtime::new(backend.clone())?);
        let mut i = runtime.instantiate().await?;
        println!(
            "Permit pair beside lock pair, {label}: one task (p50 µs), then {TASKS} tasks (ops/s)"
        );
        println!(
            "  {:<12} {:>9} {:>9} {:>7} {:>7} {:>7} {:>11} {:>11} {:>6}",
            "pair", "component", "native", "PING", "calls", "trips", "64 comp/s", "64 nat/s", "c/n"
        );
        for (op, name) in [(Op::AcquireRelease, "lock"), (Op::PermitPair, "permit")] {
            let row = time_op(op, &mut i, backend.as_ref(), &counted, effort.reps).await?;
            // Component and native take turns, a fifth at a time.
            let (mut component, mut native) = (Rounds::default(), Rounds::default());
            for _ in 0..ROUNDS {
                component.add(component_rate(&runtime, op, TASKS, effort.per_task / ROUNDS).await?);
                native.add(
                    run_tasks(TASKS, effort.per_task / ROUNDS, |t| {
                        let backend = backend.clone();
                        async move { Ok(NativeStep(op, backend, format!("task-{t}"))) }
                    })
                    .await?,
                );
            }
            let reps = effort.reps as f64;
            let ping = if counted.is_some() {
                fmt_us(row.pings.median())
            } else {
                "—".into()
            };
            println!(
                "  {name:<12} {:>9} {:>9} {ping:>7} {:>7.2} {:>7.2} {:>11.0} {:>11.0} {:>6.2}",
                fmt_us(row.component.median()),
                fmt_us(row.native.median()),
                row.calls as f64 / reps,
                row.trips as f64 / reps,
                component.rate(),
                native.rate(),
                component.rate() / native.rate()
            );
        }
        println!();
    }
    Ok(())
}

/// How many permits are held beside the measured pair.
const HELD: [usize; 3] = [0, 1_000, 10_000];

/// The permit pair's store calls (issue 50) beside 0, 1 000 and 10 000
/// permits held in the same semaphore, on each store: the `put` under
/// `absent-and-fewer-than` an acquire sends and the guarded `delete` a
/// release sends, straight on the backend (the component caps a limit at
/// 1 000; this is what a call costs the store, which the component does
/// not change). The sizes take turns, a fifth of the pairs at a time, so
/// that drift in the machine falls on each alike. A store is filled only
/// up to its `max_held`.
pub async fn permits_held(
    stores: Vec<(&str, Arc<dyn Backend>, usize)>,
    reps: usize,
) -> wasmtime::Result<()> {
    use coord_host::backend::{Condition, Outcome};
    const ROUNDS: usize = 5;
    const LIMIT: u32 = 20_000;
    println!("Permit pair (put under absent-and-fewer-than + guarded delete) beside permits held");
    println!(
        "  {:<20} {:>8} {:>10} {:>10} {:>8}",
        "store", "held", "p50 µs", "p99 µs", "÷ at 0"
    );
    for (label, backend, max_held) in stores {
        let sizes: Vec<usize> = HELD.into_iter().filter(|&n| n <= max_held).collect();
        let partition = |held: usize| {
            coord_component::keys::semaphore_partition(
                "bench.held",
                &format!("{held}-{}", std::process::id()),
            )
        };
        for &held in &sizes {
            for k in 0..held {
                backend
                    .put(
                        &partition(held),
                        &format!("held-{k}"),
                        b"1000",
                        Some(600_000),
                        &Condition::Always,
                    )
                    .await
                    .map_err(|e| failed(&format!("{e:?}")))?;
            }
        }
        let mut stats = vec![Stats::default(); sizes.len()];
        for _ in 0..ROUNDS {
            for (s, &held) in sizes.iter().enumerate() {
                let p = partition(held);
                for _ in 0..reps / ROUNDS {
                    let started = std::time::Instant::now();
                    let put = backend
                        .put(
                            &p,
                            "probe",
                            b"1000",
                            Some(30_000),
                            &Condition::AbsentAndFewerThan(LIMIT),
                        )
                        .await
                        .map_err(|e| failed(&format!("{e:?}")))?;
                    let Outcome::Applied(entry) = put.outcome else {
                        return Err(failed("the probe permit was not granted"));
                    };
                    backend
                        .delete(&p, "probe", &Condition::Revision(entry.revision))
                        .await
                        .map_err(|e| failed(&format!("{e:?}")))?;
                    stats[s].push(started.elapsed());
                }
            }
        }
        let base = stats[0].median().as_secs_f64();
        for (s, held) in sizes.iter().enumerate() {
            println!(
                "  {label:<20} {held:>8} {:>10} {:>10} {:>8.2}",
                fmt_us(stats[s].median()),
                fmt_us(stats[s].p99()),
                stats[s].median().as_secs_f64() / base
            );
        }
    }
    println!();
    Ok(())
}
