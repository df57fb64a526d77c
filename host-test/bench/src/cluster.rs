//! A Redis Cluster beside one Redis server, in one run
//! (`coord-bench --redis-cluster URLS`): lock pairs, rate-limit checks and
//! bare round trips at 64 tasks on the server, on the cluster, and on the
//! cluster with every write acknowledged by a replica; then how the keys
//! those runs wrote spread over the cluster's masters.

use std::sync::Arc;

use coord_host::Runtime;
use coord_redis::RedisBackend;

use crate::Effort;
use crate::measure::{failed, fmt_us};
use crate::ops::{Op, PingStep, component_rate, run_tasks};

/// How many tasks run at once, each with its own instance and key.
const TASKS: usize = 64;

/// The comparison's table and the keys' spread. `server`, `cluster` and
/// `acked` (the cluster with one replica acknowledging each write) share
/// one key prefix per backend; `cluster_urls` lists the cluster's nodes.
pub async fn compare(
    server: Arc<RedisBackend>,
    cluster: Arc<RedisBackend>,
    acked: Arc<RedisBackend>,
    cluster_urls: &str,
    prefix: &str,
    effort: Effort,
) -> wasmtime::Result<()> {
    println!(
        "A Redis Cluster (3 masters, a replica each) beside one Redis server, {TASKS} tasks \
         (each its own instance and key); calls/s, and p99"
    );
    println!(
        "  {:<22} {:>10} {:>8} {:>10} {:>8} {:>13} {:>8} {:>9}",
        "operation", "server/s", "p99", "cluster/s", "p99", "cluster+ack/s", "p99", "cluster÷"
    );
    let backends = [server.clone(), cluster.clone(), acked.clone()];
    for (op, name) in [
        (Op::AcquireRelease, "lock pair"),
        (Op::Check, "rate-limit check"),
    ] {
        let mut figures = Vec::new();
        for backend in &backends {
            let runtime = Arc::new(Runtime::new(backend.clone())?);
            let (stats, rate) = component_rate(&runtime, op, TASKS, effort.per_task).await?;
            figures.push((rate, stats.p99()));
        }
        row(name, &figures);
    }
    let mut figures = Vec::new();
    for backend in &backends {
        let (stats, rate) = run_tasks(TASKS, effort.per_task, |_| {
            let backend = backend.clone();
            async move { Ok(PingStep(backend)) }
        })
        .await?;
        figures.push((rate, stats.p99()));
    }
    row("bare round trip", &figures);
    println!();
    spread(cluster_urls, prefix)
}

/// One row: each backend's rate and p99, and the cluster's rate over the
/// server's.
fn row(name: &str, figures: &[(f64, std::time::Duration)]) {
    let [
        (server, server_p99),
        (cluster, cluster_p99),
        (acked, acked_p99),
    ] = figures
    else {
        return;
    };
    println!(
        "  {name:<22} {server:>10.0} {:>8} {cluster:>10.0} {:>8} {acked:>13.0} {:>8} {:>9.2}",
        fmt_us(*server_p99),
        fmt_us(*cluster_p99),
        fmt_us(*acked_p99),
        cluster / server
    );
}

/// How the keys under `prefix` spread over the cluster's masters.
fn spread(cluster_urls: &str, prefix: &str) -> wasmtime::Result<()> {
    let seed = cluster_urls.split(',').next().unwrap_or_default().trim();
    let mut seed = redis::Client::open(seed)
        .and_then(|c| c.get_connection())
        .map_err(|e| failed(&format!("{e:?}")))?;
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query(&mut seed)
        .map_err(|e| failed(&format!("{e:?}")))?;
    let mut counts = Vec::new();
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(address), Some(flags)) = (fields.get(1), fields.get(2)) else {
            continue;
        };
        if !flags.contains("master") || flags.contains("fail") {
            continue;
        }
        let address = address.split('@').next().unwrap_or_default();
        let mut node = redis::Client::open(format!("redis://{address}"))
            .and_then(|c| c.get_connection())
            .map_err(|e| failed(&format!("{e:?}")))?;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query(&mut node)
            .map_err(|e| failed(&format!("{e:?}")))?;
        counts.push((address.to_string(), keys.len()));
    }
    let total: usize = counts.iter().map(|(_, n)| n).sum();
    println!("Keys the cluster runs left, per master ({total} in all)");
    for (address, n) in counts {
        println!(
            "  {address:<22} {n:>6} ({:.0}%)",
            100.0 * n as f64 / total.max(1) as f64
        );
    }
    println!();
    Ok(())
}
