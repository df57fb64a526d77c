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
use crate::measure::fmt_us;

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
