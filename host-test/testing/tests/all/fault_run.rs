//! The fault runs (issue 39): two hosts put contended load on a replicated
//! store while a script of faults runs, and the recorded history is checked
//! for double grants, shared or backward fences, stale reads, lost updates
//! and phantom values (`common/fault_run.rs`).
//!
//! CI runs the script once per store. The long form runs it more times:
//! `COORD_FAULT_ROUNDS=10 cargo test --workspace --test all -- fault_run --nocapture`
//! (RELIABILITY.md has its figures).

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::fault_run::{Load, Verdict};
use common::nats_cluster::{Cluster, connect_with_timeout, stream_leader};
use common::redis_cluster::RedisCluster;
use coord_component::keys::{ephemeral_partition, lock_partition};
use coord_host::Runtime;
use coord_redis::{RedisBackend, RedisConfig, slot_of};

/// How many times to run each store's script: 1, or `COORD_FAULT_ROUNDS`.
fn rounds() -> usize {
    std::env::var("COORD_FAULT_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1)
}

/// Print the verdict and fail on any safety finding.
fn judge(store: &str, verdict: &Verdict) {
    println!(
        "{store}: {} grants, {} acknowledged writes, {} reads, {} calls unavailable; \
         double grants {}, shared fences {}, fences back {}, stale reads {}, lost updates {}, \
         phantom values {}",
        verdict.grants,
        verdict.acked_writes,
        verdict.reads,
        verdict.failed_calls,
        verdict.double_grants,
        verdict.shared_fences,
        verdict.fences_back,
        verdict.stale_reads,
        verdict.lost_updates,
        verdict.phantom_values
    );
    for r in &verdict.recoveries {
        println!(
            "{store}: {} (held {} ms): {} calls unavailable, the last answered {} ms after the \
             fault; first success {} ms after healing",
            r.fault,
            r.held_ms,
            r.failed_calls,
            r.failing_for_ms,
            r.first_success_after_heal_ms
                .map_or("-".into(), |m| m.to_string()),
        );
        for error in &r.errors {
            println!("{store}:     {error}");
        }
    }
    assert!(
        verdict.grants > 0,
        "{store}: no lock was granted: the run shows nothing"
    );
    assert!(
        verdict.acked_writes > 0,
        "{store}: no write was acknowledged"
    );
    assert!(verdict.reads > 0, "{store}: nothing was read");
    assert!(
        verdict.safe(),
        "{store}: the history breaks a promise: {verdict:#?}"
    );
}

/// Wait, bounded by lack of change, until `check` holds.
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < common::QUIET, "{what} never happened");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// NATS, a three-server cluster, the stream at three replicas: kill the
/// stream's leader; pause it; pause the server one host is attached to;
/// kill two of the three servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_at_three_replicas_keeps_every_promise_through_the_fault_script() {
    let mut cluster = Cluster::start("faultrun");
    let stream = "COORDFAULTRUN";
    // Two hosts, each given every server's URL, as two `coord serve`s
    // would be; the store's default response timeout.
    let timeout = Duration::from_secs(5);
    let hosts = [
        connect_with_timeout(&cluster, stream, timeout).await,
        connect_with_timeout(&cluster, stream, timeout).await,
    ];
    let runtimes: Vec<Arc<Runtime>> = hosts
        .iter()
        .map(|b| Arc::new(Runtime::new(b.clone()).unwrap()))
        .collect();
    let observer = async_nats::connect(cluster.url().split(',').collect::<Vec<_>>())
        .await
        .unwrap();
    let leader = async || {
        loop {
            if let Some(leader) = stream_leader(&observer, stream).await {
                return leader;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let mut load = Load::start(&runtimes).await;
    load.progress(50).await;
    for _ in 0..rounds() {
        let name = leader().await;
        load.begin("kill the stream leader");
        cluster.kill(&name);
        tokio::time::sleep(Duration::from_secs(3)).await;
        cluster.restart(&name);
        load.healed().await;

        let name = leader().await;
        load.begin("pause the stream leader 4 s");
        let port = cluster.port_of(&name);
        cluster.signal_by_port(port, "STOP");
        tokio::time::sleep(Duration::from_secs(4)).await;
        cluster.signal_by_port(port, "CONT");
        load.healed().await;

        let port = hosts[0].server_port();
        load.begin("pause the server host 0 is attached to 4 s");
        cluster.signal_by_port(port, "STOP");
        tokio::time::sleep(Duration::from_secs(4)).await;
        cluster.signal_by_port(port, "CONT");
        load.healed().await;

        let names: Vec<String> = cluster.nodes.iter().map(|n| n.name.clone()).collect();
        load.begin("kill two of the three servers for 3 s");
        cluster.kill(&names[0]);
        cluster.kill(&names[1]);
        tokio::time::sleep(Duration::from_secs(3)).await;
        cluster.restart(&names[0]);
        cluster.restart(&names[1]);
        load.healed().await;
    }
    let verdict = load.finish(&runtimes[1]).await;
    judge("NATS, 3 replicas", &verdict);
}

/// Redis Cluster, three masters with a replica each, every write
/// acknowledged by a replica (`--redis-replica-acks 1`): kill the master of
/// the counters; pause the master of a lock past the node timeout; move a
/// lock's slot to another master and back; cut a master's replication
/// (its replica paused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_with_replica_acks_keeps_every_promise_through_the_fault_script() {
    let mut cluster = tokio::task::spawn_blocking(|| RedisCluster::spawn(3, 1).unwrap())
        .await
        .unwrap();
    let config = RedisConfig {
        cluster: true,
        replica_acks: 1,
        ..common::redis_config(&cluster.url(), 64, None)
    };
    let mut hosts = Vec::new();
    for _ in 0..2 {
        hosts.push(Arc::new(
            RedisBackend::connect(config.clone()).await.unwrap(),
        ));
    }
    let runtimes: Vec<Arc<Runtime>> = hosts
        .iter()
        .map(|b| Arc::new(Runtime::new(b.clone()).unwrap()))
        .collect();
    let slot = |partition: String| slot_of(&hosts[0].key(&partition, "s"));
    let counters = slot(ephemeral_partition("faultrun", "t"));
    let lock = slot(lock_partition("faultrun", "res:0"));
    let mut load = Load::start(&runtimes).await;
    load.progress(50).await;
    for _ in 0..rounds() {
        let master = cluster.master_of(counters).unwrap();
        load.begin("kill the counters' master");
        cluster.kill(master);
        until("the counters' failover", || {
            cluster.master_of(counters).is_some_and(|m| m != master)
        })
        .await;
        cluster.restart(master).unwrap();
        load.healed().await;
        until("the killed master's return as a replica", || {
            cluster.until_healthy(3, Duration::ZERO).is_ok()
        })
        .await;

        let master = cluster.master_of(lock).unwrap();
        load.begin("pause a lock's master 3 s (past the node timeout)");
        cluster.signal(master, "STOP");
        tokio::time::sleep(Duration::from_secs(3)).await;
        cluster.signal(master, "CONT");
        load.healed().await;
        until("the paused master's return", || {
            cluster.until_healthy(3, Duration::ZERO).is_ok()
        })
        .await;

        let from = cluster.master_of(lock).unwrap();
        let to = cluster.masters().into_iter().find(|p| *p != from).unwrap();
        load.begin("move a lock's slot to another master and back");
        let cluster_ref = &cluster;
        tokio::task::block_in_place(|| {
            cluster_ref.migrate_slot(lock, from, to, Duration::from_millis(100));
            cluster_ref.migrate_slot(lock, to, from, Duration::from_millis(100));
        });
        load.healed().await;

        let master = cluster.master_of(counters).unwrap();
        let replica = cluster.replica_of(master).unwrap();
        load.begin("cut the counters' replication 3 s (replica paused)");
        cluster.signal(replica, "STOP");
        tokio::time::sleep(Duration::from_secs(3)).await;
        cluster.signal(replica, "CONT");
        load.healed().await;
        until("the replica's return", || {
            cluster.until_healthy(3, Duration::ZERO).is_ok()
        })
        .await;
    }
    let verdict = load.finish(&runtimes[1]).await;
    judge("Redis Cluster, replica acks 1", &verdict);
}
