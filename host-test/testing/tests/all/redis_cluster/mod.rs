//! The Redis backend on a real Redis Cluster (three masters, a replica
//! each, on loopback), beyond the shared suites (`per_backend!` runs those
//! on a cluster too): notifications and blocking waits on the partition's
//! node, keys spread over the masters, scripts lost by every node, replica
//! acknowledgement, a master failed over while instances contend (double
//! grants counted without acknowledgement, none with it), and a slot moved
//! while a lock is held and a tenant watched.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::redis_cluster::RedisCluster;
use coord_component::keys::lock_partition;
use coord_redis::{RedisBackend, RedisConfig, slot_of};

/// A backend on `cluster` with the store's own clock, its own prefix, and
/// `replica_acks` replicas asked to hold each write.
async fn backend(cluster: &RedisCluster, replica_acks: u32) -> Arc<RedisBackend> {
    Arc::new(
        RedisBackend::connect(config(cluster, replica_acks))
            .await
            .unwrap(),
    )
}

/// The configuration [`backend`] connects with.
fn config(cluster: &RedisCluster, replica_acks: u32) -> RedisConfig {
    RedisConfig {
        cluster: true,
        replica_acks,
        replica_ack_timeout: Duration::from_millis(300),
        // A lost notification would be found only this late: a waiter that
        // wakes sooner was woken by the notification.
        recheck: Duration::from_secs(60),
        ..common::redis_config(&cluster.url(), 64, None)
    }
}

/// The master (its port) serving `partition` now.
fn master_of(cluster: &RedisCluster, backend: &RedisBackend, partition: &str) -> u16 {
    cluster
        .master_of(slot_of(&backend.key(partition, "s")))
        .unwrap()
}

/// Partitions of lock resources `item:<n>` served by each master: the
/// first `per_master` found for each.
fn lock_resources_by_master(
    cluster: &RedisCluster,
    backend: &RedisBackend,
    per_master: usize,
) -> HashMap<u16, Vec<String>> {
    let mut by_master: HashMap<u16, Vec<String>> = HashMap::new();
    for n in 0.. {
        let resource = format!("item:{n}");
        let master = master_of(cluster, backend, &lock_partition("stock", &resource));
        let found = by_master.entry(master).or_default();
        if found.len() < per_master {
            found.push(resource);
        }
        if by_master.len() == 3 && by_master.values().all(|r| r.len() == per_master) {
            return by_master;
        }
    }
    unreachable!()
}

mod failover;
mod routing;
mod slot_moves;
