//! The measured operations, through the component and natively: the
//! operations themselves here, then a module per table of BENCHMARKS.md,
//! each measuring the component, the native path and the references in the
//! same loop (the loop helpers in `tasks`).

use coord_component::keys;
use coord_host::Instance;
use coord_host::backend::{Backend, Condition, MeterAlgorithm, MeterMode, MeterRequest};
use coord_host::ephemeral::Space;
use coord_host::lock::{AcquireOptions, AcquireOutcome};
use coord_host::ratelimit::Limiter;

use crate::measure::failed;

/// The operations of the per-operation table.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op {
    AcquireRelease,
    /// A semaphore permit's acquire (limit [`PERMITS`]) and release.
    PermitPair,
    Acquire,
    Extend,
    Check,
    Upsert,
    Touch,
    Snapshot100,
}

const OPS: [Op; 8] = [
    Op::AcquireRelease,
    Op::PermitPair,
    Op::Acquire,
    Op::Extend,
    Op::Check,
    Op::Upsert,
    Op::Touch,
    Op::Snapshot100,
];
pub(crate) const LOCK_ID: &str = "bench.lock";
/// The semaphore the permit pairs use, and its limit.
pub(crate) const SEMAPHORE_ID: &str = "bench.semaphore";
pub(crate) const PERMITS: u32 = 10;

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
                .lock()
                .acquire(LOCK_ID, n, no_wait())
                .await?
                .map_err(|e| failed(&format!("{e:?}")))?
            else {
                return Err(failed("busy"));
            };
            i.lock()
                .release(&lock)
                .await?
                .map_err(|e| failed(&format!("{e:?}")))?;
        }
        Op::PermitPair => {
            let options = coord_host::semaphore::AcquireOptions::new()
                .ttl_ms(30_000)
                .no_wait();
            let coord_host::semaphore::AcquireOutcome::Acquired(permit) = i
                .semaphore()
                .acquire(SEMAPHORE_ID, n, PERMITS, options)
                .await?
                .map_err(|e| failed(&format!("{e:?}")))?
            else {
                return Err(failed("busy"));
            };
            i.semaphore()
                .release(&permit)
                .await?
                .map_err(|e| failed(&format!("{e:?}")))?;
        }
        Op::Extend | Op::Acquire => return Err(failed("measured by a function of its own")),
        Op::Check => {
            i.ratelimit()
                .check(&limiter(), n, None)
                .await?
                .map_err(|e| failed(&format!("{e:?}")))?;
        }
        Op::Upsert => {
            i.ephemeral()
                .upsert(&space(), "bench", n, b"{\"user\":\"ada\"}")
                .await?
                .map_err(|e| failed(&format!("{e:?}")))?;
        }
        Op::Touch => {
            i.ephemeral()
                .touch(&space(), "bench", n)
                .await?
                .map_err(|e| failed(&format!("{e:?}")))?;
        }
        Op::Snapshot100 => {
            let s = i
                .ephemeral()
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
        Op::PermitPair => {
            let partition = keys::semaphore_partition(SEMAPHORE_ID, n);
            // A fixed token: each task has its own resource.
            let owner = "0123456789abcdef0123456789abcdef";
            let place = Condition::AbsentAndFewerThan(PERMITS);
            let reply = b
                .put(&partition, owner, b"10", Some(30_000), &place)
                .await
                .map_err(err)?;
            let coord_host::backend::Outcome::Applied(entry) = reply.outcome else {
                return Err(failed("busy"));
            };
            let guard = Condition::RevisionAndValue(coord_host::backend::Guard {
                revision: entry.revision,
                value: entry.value,
            });
            b.delete(&partition, owner, &guard).await.map_err(err)?;
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

mod concurrency;
mod handoff;
mod semaphore;
pub use semaphore::{permits_held, semaphore_beside_lock};
mod per_operation;
mod profile;
mod tasks;
mod waiters;
pub use waiters::handoff_beside_waiters;

pub use concurrency::{after_idle, concurrency};
use concurrency::{idle_pause, native_extend};
pub use handoff::handoff;
pub(crate) use handoff::one_handoff;
use per_operation::native_acquire;
pub use per_operation::per_operation;
pub use profile::{one_request, profile_acquire, profile_concurrent};
pub(crate) use tasks::{ComponentStep, NativeStep, PingStep, Rounds, component_rate, run_tasks};
