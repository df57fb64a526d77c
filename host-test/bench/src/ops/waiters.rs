//! Lock handoff beside the number of waiters (issue 52): what a
//! release costs when 1, 8 or 64 instances wait for the lock.
//!
//! A round: a holder takes the lock, `n` instances (each its own, as edge
//! functions would be) start waiting for it, and the holder releases;
//! every waiter, once it holds the lock, releases it at once, until all
//! `n` have held it: `n` handoffs. Counted, not timed: the store calls of
//! every party from the first release on (each release, and each call a
//! waiter makes after its first attempt), over the handoffs. Timed: from
//! a release's start to the next holder's grant.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coord_host::Runtime;
use coord_host::backend::Backend;
use coord_host::lock::{AcquireOptions, AcquireOutcome, WaitPolicy};

use super::{LOCK_ID, no_wait};
use crate::measure::{Stats, failed, fmt_us};

/// The numbers of waiters compared.
const WAITERS: [usize; 3] = [1, 8, 64];

/// How long each holder keeps the lock: the work of a critical section.
const HOLD: Duration = Duration::from_millis(5);

/// A release's start or a grant, when it happened.
#[derive(Clone, Copy, PartialEq)]
enum Event {
    Release,
    Grant,
}

/// Print, for `label`'s store, the store calls per handoff and the
/// handoff's latency at each number of waiters, over `rounds` rounds each.
pub async fn handoff_beside_waiters(
    label: &str,
    backend: Arc<dyn Backend>,
    rounds: usize,
) -> wasmtime::Result<()> {
    let runtime = Arc::new(Runtime::new(backend)?);
    println!("Lock handoff beside waiters, {label} ({rounds} rounds each)");
    for waiters in WAITERS {
        let mut calls = 0u64;
        let mut handoffs = 0usize;
        let mut latency = Stats::default();
        for r in 0..rounds {
            let resource = format!("waiters-{waiters}-{r}-{}", std::process::id());
            let (round_calls, times) = round(&runtime, waiters, &resource).await?;
            calls += round_calls;
            handoffs += waiters;
            for t in times {
                latency.push(t);
            }
        }
        println!(
            "  {waiters:>2} waiting: {:>6.2} store calls per handoff  p50 {:>9} µs  p99 {:>9} µs",
            calls as f64 / handoffs as f64,
            fmt_us(latency.median()),
            fmt_us(latency.p99()),
        );
    }
    println!();
    Ok(())
}

/// One round on `resource`: the store calls from the first release on, and
/// each handoff's latency.
async fn round(
    runtime: &Arc<Runtime>,
    waiters: usize,
    resource: &str,
) -> wasmtime::Result<(u64, Vec<Duration>)> {
    let mut holder = runtime.instantiate().await?;
    let AcquireOutcome::Acquired(held) = holder
        .lock()
        .acquire(LOCK_ID, resource, no_wait())
        .await?
        .map_err(|e| failed(&format!("{e:?}")))?
    else {
        return Err(failed("the round's lock was busy"));
    };
    let events = Arc::new(Mutex::new(Vec::new()));
    let started = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..waiters {
        let (runtime, events, started) = (runtime.clone(), events.clone(), started.clone());
        let resource = resource.to_string();
        tasks.push(tokio::spawn(async move {
            let mut waiter = runtime.instantiate().await?;
            started.fetch_add(1, Ordering::SeqCst);
            let wait = AcquireOptions {
                ttl_ms: Some(30_000),
                wait: Some(WaitPolicy::Timeout(300_000)),
            };
            let outcome = waiter.lock().acquire(LOCK_ID, &resource, wait).await?;
            let AcquireOutcome::Acquired(held) = outcome.map_err(|e| failed(&format!("{e:?}")))?
            else {
                return Err(failed("a waiter gave up"));
            };
            record(&events, Event::Grant);
            tokio::time::sleep(HOLD).await;
            record(&events, Event::Release);
            waiter
                .lock()
                .release(&held)
                .await?
                .map_err(|e| failed(&format!("{e:?}")))?;
            // Its first attempt found the lock held, before any release.
            Ok::<u64, wasmtime::Error>(waiter.store_calls() - 1)
        }));
    }
    // Every waiter's first attempt finds the lock held and its wait starts.
    while started.load(Ordering::SeqCst) < waiters {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(100 + 2 * waiters as u64)).await;
    record(&events, Event::Release);
    holder
        .lock()
        .release(&held)
        .await?
        .map_err(|e| failed(&format!("{e:?}")))?;
    // The holder's release hands the lock on and the last waiter's hands
    // nothing on: one counted for the other.
    let mut calls = 0;
    for task in tasks {
        calls += task.await??;
    }
    let mut events = lock(&events).clone();
    events.sort_by_key(|(at, _)| *at);
    let mut times = Vec::new();
    for pair in events.chunks(2) {
        if let [(released, Event::Release), (granted, Event::Grant)] = pair {
            times.push(granted.saturating_duration_since(*released));
        }
    }
    Ok((calls, times))
}

type Events = Mutex<Vec<(Instant, Event)>>;

/// Note that `event` happens now.
fn record(events: &Events, event: Event) {
    lock(events).push((Instant::now(), event));
}

fn lock(events: &Events) -> std::sync::MutexGuard<'_, Vec<(Instant, Event)>> {
    // A waiter that panicked while recording left the list as it was.
    events
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
