//! Workloads to run under a profiler (`--profile-acquire`,
//! `--profile-concurrent`) and one whole request's cost.

use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_host::Runtime;
use coord_host::backend::Backend;

use super::{ComponentStep, NativeStep, Op, component_op, native_op, run_tasks};

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
pub(crate) fn unpooled_config() -> wasmtime::Config {
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
