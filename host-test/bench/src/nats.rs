//! NATS JetStream beside Redis, in one run (`coord-bench --nats URL`): the
//! round trips and latency of each call at concurrency 1 against each
//! server's bare round trip (a Redis `PING`; a NATS request answered by a
//! subscriber on the same connection, the physical limit on loopback), and
//! the rates of lock pairs and rate-limit checks at 64 tasks.

use std::sync::Arc;
use std::time::Instant;

use coord_nats::NatsBackend;
use coord_redis::RedisBackend;
use futures_util::StreamExt;

use crate::Effort;
use crate::measure::{Stats, Step, failed, fmt_us};
use crate::ops::{Op, PingStep, component_op, component_rate, run_tasks};
use crate::side_by_side::{Store, extend};

/// A request answered by a subscriber on the same connection.
struct RequestStep(async_nats::Client, String);

impl Step for RequestStep {
    async fn step(&mut self) -> wasmtime::Result<()> {
        self.0
            .request(self.1.clone(), "ping".into())
            .await
            .map_err(|e| failed(&format!("{e:?}")))?;
        Ok(())
    }
}

/// The comparison's two tables.
pub async fn compare(
    redis: Arc<RedisBackend>,
    nats: Arc<NatsBackend>,
    nats_url: &str,
    effort: Effort,
) -> wasmtime::Result<()> {
    let client = async_nats::connect(nats_url)
        .await
        .map_err(|e| failed(&format!("{e:?}")))?;
    let echo = format!("coordbench.echo.{}", std::process::id());
    let mut requests = client
        .subscribe(echo.clone())
        .await
        .map_err(|e| failed(&format!("{e:?}")))?;
    let responder = client.clone();
    tokio::spawn(async move {
        while let Some(request) = requests.next().await {
            if let Some(reply) = request.reply {
                let _ = responder.publish(reply, "pong".into()).await;
            }
        }
    });
    let r = redis.clone();
    let n = nats.clone();
    let mut on_redis = Store::new(redis.clone(), Box::new(move || r.round_trips())).await?;
    let mut on_nats = Store::new(nats.clone(), Box::new(move || n.round_trips())).await?;

    println!("NATS JetStream beside Redis, concurrency 1 (p50 µs; store round trips per call)");
    println!(
        "  {:<26} {:>8} {:>6} {:>8} {:>6} {:>11}",
        "operation", "Redis", "trips", "NATS", "trips", "NATS/Redis"
    );
    let reps = effort.reps;
    let row = |name: &str, (redis, rt): (Stats, f64), (nats, nt): (Stats, f64)| {
        let ratio = nats.median().as_secs_f64() / redis.median().as_secs_f64();
        println!(
            "  {name:<26} {:>8} {rt:>6.2} {:>8} {nt:>6.2} {ratio:>11.2}",
            fmt_us(redis.median()),
            fmt_us(nats.median())
        );
    };
    for (op, name, fresh) in [
        (Op::AcquireRelease, "lock pair (key seen)", false),
        (Op::AcquireRelease, "lock pair (key new)", true),
        (Op::Check, "rate-limit check", false),
        (Op::Upsert, "ephemeral upsert", false),
        (Op::Touch, "ephemeral touch", false),
        (Op::Snapshot100, "snapshot of 100", false),
    ] {
        let run = std::process::id();
        if let Op::Snapshot100 = op {
            on_redis.fill().await?;
            on_nats.fill().await?;
        }
        for rep in 0..reps {
            let key = if fresh {
                format!("{run}-{name}-{rep}")
            } else {
                format!("k{}", rep % 10)
            };
            // Warm each key once, untimed, so "seen" means seen.
            if !fresh && rep < 10 {
                component_op(op, &mut on_redis.instance, &key).await?;
                component_op(op, &mut on_nats.instance, &key).await?;
            }
            on_redis.time(op, &key).await?;
            on_nats.time(op, &key).await?;
        }
        row(name, on_redis.take(reps), on_nats.take(reps));
    }
    let (redis_extend, nats_extend) = (
        extend(&mut on_redis, reps).await?,
        extend(&mut on_nats, reps).await?,
    );
    row("lock extend", redis_extend, nats_extend);
    let (mut ping, mut request) = (Stats::default(), Stats::default());
    for _ in 0..reps {
        let start = Instant::now();
        redis.ping().await.map_err(|e| failed(&format!("{e:?}")))?;
        ping.push(start.elapsed());
        let start = Instant::now();
        RequestStep(client.clone(), echo.clone()).step().await?;
        request.push(start.elapsed());
    }
    row("bare round trip (limit)", (ping, 1.0), (request, 1.0));
    println!();

    const TASKS: usize = 64;
    println!("NATS JetStream beside Redis, {TASKS} tasks (each its own instance and key)");
    println!(
        "  {:<26} {:>10} {:>10} {:>11}",
        "operation", "Redis/s", "NATS/s", "NATS/Redis"
    );
    for (op, name) in [
        (Op::AcquireRelease, "lock pair"),
        (Op::Check, "rate-limit check"),
    ] {
        let mut rates = Vec::new();
        for runtime in [on_redis.runtime.clone(), on_nats.runtime.clone()] {
            let (_, rate) = component_rate(&runtime, op, TASKS, effort.per_task).await?;
            rates.push(rate);
        }
        println!(
            "  {name:<26} {:>10.0} {:>10.0} {:>11.2}",
            rates[0],
            rates[1],
            rates[1] / rates[0]
        );
    }
    let (_, ping_rate) = run_tasks(TASKS, effort.per_task, |_| {
        let redis = redis.clone();
        async move { Ok(PingStep(redis)) }
    })
    .await?;
    let (_, request_rate) = run_tasks(TASKS, effort.per_task, |_| {
        let (client, echo) = (client.clone(), echo.clone());
        async move { Ok(RequestStep(client, echo)) }
    })
    .await?;
    println!(
        "  {:<26} {ping_rate:>10.0} {request_rate:>10.0} {:>11.2}",
        "bare round trip (limit)",
        request_rate / ping_rate
    );
    println!();
    Ok(())
}
