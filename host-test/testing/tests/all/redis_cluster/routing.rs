//! Calls routed by slot: partitions spread over the masters, handoffs and
//! notifications on each partition's master, scripts loaded again where
//! they were lost, and readiness that follows the cluster's slot coverage.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{backend, config, master_of};
use crate::common::redis_cluster::{RedisCluster, cli, parse_nodes};
use coord_component::keys::lock_partition;
use coord_host::backend::{Backend, Condition, Outcome};
use coord_redis::RedisBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_notifications_wake_waiters_and_handoffs_run_on_each_partitions_master() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::spawn(3, 1).unwrap())
        .await
        .unwrap();
    // Two hosts on one deployment (one prefix).
    let config = config(&cluster, 0);
    let writer = Arc::new(RedisBackend::connect(config.clone()).await.unwrap());
    let waiter = Arc::new(RedisBackend::connect(config).await.unwrap());

    // A watched partition: `wait` is woken by the write's SPUBLISH, not by
    // its 60-second re-check.
    let tenant = "tenant-notified";
    let first = writer
        .put(tenant, "k", b"1", None, &Condition::Always)
        .await
        .unwrap();
    let revision = match first.outcome {
        Outcome::Applied(entry) => entry.revision,
        other => panic!("{other:?}"),
    };
    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.wait(tenant, revision, 30_000).await })
    };
    while waiter.waiters(tenant) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let written = Instant::now();
    writer
        .put(tenant, "k", b"2", None, &Condition::Always)
        .await
        .unwrap();
    let woke = waiting.await.unwrap().unwrap();
    assert!(
        woke > revision,
        "woke at {woke}, not past {revision}, after {:?}",
        written.elapsed()
    );
    assert!(
        written.elapsed() < Duration::from_secs(5),
        "the waiter slept {:?}: no notification reached it",
        written.elapsed()
    );

    // A lock on each master, held, and a waiter on it: the release hands
    // it over through the channel (a lock's partition keeps no wake stream
    // on a cluster), at once although the waiter's re-check is a minute away.
    let locks = partitions_by_master(&cluster, &writer, |n| {
        lock_partition("stock", &format!("item:{n}"))
    });
    for (master, partition) in &locks {
        handoff(&writer, &waiter, partition, *master).await;
    }
    assert_eq!(waiter.blocking_connections_opened(), 0);
    // A watched partition on each master: the waiter blocks on its change
    // feed, on a connection to that master.
    let tenants = partitions_by_master(&cluster, &writer, |n| format!("tenant-{n}"));
    for (master, partition) in &tenants {
        handoff(&writer, &waiter, partition, *master).await;
    }
    assert_eq!(
        waiter.blocking_connections_opened(),
        3,
        "one blocking connection per master"
    );
}

/// One partition served by each master, named by `name(n)` for the first
/// `n` that lands there.
fn partitions_by_master(
    cluster: &RedisCluster,
    backend: &RedisBackend,
    name: impl Fn(u64) -> String,
) -> HashMap<u16, String> {
    let mut by_master = HashMap::new();
    for n in 0.. {
        let partition = name(n);
        by_master
            .entry(master_of(cluster, backend, &partition))
            .or_insert(partition);
        if by_master.len() == 3 {
            break;
        }
    }
    by_master
}

/// `writer` takes `partition`'s "holder" key, `waiter` waits to put it, and
/// the writer's delete hands it over within 5 s.
async fn handoff(writer: &RedisBackend, waiter: &Arc<RedisBackend>, partition: &str, master: u16) {
    let held = writer
        .put(partition, "holder", b"a", Some(30_000), &Condition::Absent)
        .await
        .unwrap();
    let Outcome::Applied(holding) = held.outcome else {
        panic!("not taken on {master}");
    };
    let handoff = {
        let (waiter, partition) = (waiter.clone(), partition.to_string());
        tokio::spawn(async move {
            waiter
                .wait_then_put(
                    &partition,
                    "holder",
                    b"b",
                    Some(30_000),
                    &Condition::Absent,
                    holding.revision,
                    20_000,
                )
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    writer
        .delete(partition, "holder", &Condition::Always)
        .await
        .unwrap();
    let reply = handoff.await.unwrap().unwrap();
    assert!(
        matches!(reply.outcome, Outcome::Applied(ref e) if e.value == b"b"),
        "the waiter on {partition} (master {master}) did not take it: {reply:?}"
    );
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "the handoff on {partition} took {:?}",
        released.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_spread_over_the_masters_and_scripts_lost_everywhere_are_loaded_again() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::spawn(3, 1).unwrap())
        .await
        .unwrap();
    let backend = backend(&cluster, 0).await;
    for n in 0..300 {
        backend
            .put(&format!("tenant-{n}"), "k", b"v", None, &Condition::Always)
            .await
            .unwrap();
    }
    let text = cli(cluster.nodes[0].port, &["CLUSTER", "NODES"]).unwrap();
    let masters: Vec<u16> = parse_nodes(&text)
        .into_iter()
        .filter(|n| n.master)
        .map(|n| n.port)
        .collect();
    assert_eq!(masters.len(), 3);
    let mut counts = Vec::new();
    for port in &masters {
        let keys = cli(*port, &["DBSIZE"])
            .unwrap()
            .trim()
            .parse::<u64>()
            .unwrap();
        counts.push(keys);
    }
    println!("keys per master for 300 partitions: {counts:?}");
    for keys in &counts {
        // 300 partitions of 3 keys each (entries, expiry index, feed):
        // a fair spread gives 300 a master; none may be empty or hold all.
        assert!(
            (150..=450).contains(keys),
            "the partitions did not spread: {counts:?}"
        );
    }

    // Every node forgets every script (a restart, a failover to a replica
    // that never loaded them): calls load them again and go on.
    for node in &cluster.nodes {
        let _ = cli(node.port, &["SCRIPT", "FLUSH"]);
    }
    for n in 0..30 {
        let reply = backend
            .put(&format!("tenant-{n}"), "k", b"w", None, &Condition::Always)
            .await
            .unwrap();
        assert!(matches!(reply.outcome, Outcome::Applied(_)));
    }
}

/// `/readyz` means the store can take a write. On a cluster whose master
/// and its replica are both down, the other masters still tell the time
/// while a third of the partitions take no write: not ready until the
/// cluster serves every slot again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_clusters_slot_coverage() {
    let mut cluster = tokio::task::spawn_blocking(|| RedisCluster::spawn(3, 1).unwrap())
        .await
        .unwrap();
    let backend = RedisBackend::connect(config(&cluster, 0)).await.unwrap();
    // Until `ready` says `want`, 240 polls 250 ms apart: a bound on a store
    // that never changes its answer, not a speed target.
    async fn until(backend: &RedisBackend, want: bool) -> bool {
        for _ in 0..240 {
            if backend.ready().await.is_ok() == want {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        false
    }
    assert!(until(&backend, true).await, "not ready with every node up");
    let master = cluster.master_of(0).unwrap();
    let replica = cluster.replica_of(master).unwrap();
    cluster.kill(replica);
    cluster.kill(master);
    assert!(
        until(&backend, false).await,
        "still ready with slot 0's master and replica dead"
    );
    assert!(
        backend.now().await.is_ok(),
        "while the others tell the time"
    );
    tokio::task::block_in_place(|| {
        cluster.restart(master).unwrap();
        cluster.restart(replica).unwrap();
    });
    assert!(
        until(&backend, true).await,
        "not ready again with both back"
    );
}
