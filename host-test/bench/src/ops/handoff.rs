//! A lock handed from its holder to a waiter: from the release to the
//! waiter's grant.

use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_host::Runtime;
use coord_host::backend::Backend;
use coord_host::lock::{AcquireOptions, AcquireOutcome, Retry, WaitPolicy};
use coord_redis::RedisBackend;

use super::{LOCK_ID, idle_pause, no_wait};
use crate::Effort;
use crate::measure::{Stats, failed, fmt_us};

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
            RedisBackend::connect(coord_redis::RedisConfig::new(url.clone()))
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
pub(crate) async fn one_handoff(
    holder: &mut coord_host::Instance,
    runtime: &Arc<Runtime>,
    resource: &str,
    poll: bool,
    n: usize,
) -> wasmtime::Result<Duration> {
    let AcquireOutcome::Acquired(lock) = holder
        .lock()
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
                    .lock()
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
            .lock()
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
        .lock()
        .release(&lock)
        .await?
        .map_err(|e| failed(&format!("{e:?}")))?;
    let acquired = waiter.await??;
    Ok(acquired.saturating_duration_since(released))
}
