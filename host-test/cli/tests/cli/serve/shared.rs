//! Two `coord serve` processes on one store (Redis, a Redis Cluster, NATS,
//! PostgreSQL, a SQLite file) share locks, presence and limits, and lose
//! no fenced adjustment under contention; the example's items spread over
//! a cluster's masters.

use std::sync::Arc;
use std::time::Duration;

use super::Prefix;
use crate::common;
use crate::process::Serve;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_serve_processes_on_one_redis_share_locks_presence_and_limits() {
    let prefix = Prefix::new("two").await;
    let args = [
        "--redis",
        prefix.url.as_str(),
        "--prefix",
        prefix.name.as_str(),
    ];
    two_processes_share_locks_presence_and_limits(&args).await;
    common::delete_prefix(&prefix.url, &prefix.name);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_serve_processes_on_one_nats_share_locks_presence_and_limits() {
    let url = common::nats_url();
    let subjects = format!("serve{}", std::process::id());
    let args = ["--nats", url.as_str(), "--prefix", subjects.as_str()];
    two_processes_share_locks_presence_and_limits(&args).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_serve_processes_on_one_postgres_share_locks_presence_and_limits() {
    let url = common::postgres_url().await;
    let prefix = format!("serve{}", std::process::id());
    let args = ["--postgres", url.as_str(), "--prefix", prefix.as_str()];
    two_processes_share_locks_presence_and_limits(&args).await;
    common::drop_table(url, coord_postgres::PostgresConfig::table_for(&prefix));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_serve_processes_on_one_sqlite_file_share_locks_presence_and_limits() {
    let path = common::sqlite_path();
    let file = path.display().to_string();
    two_processes_share_locks_presence_and_limits(&["--sqlite", file.as_str()]).await;
    common::delete_sqlite(&path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_serve_processes_on_one_redis_cluster_share_locks_presence_and_limits() {
    let url = tokio::task::spawn_blocking(common::redis_cluster_url)
        .await
        .unwrap();
    let prefix = format!("serve-cluster-{}", std::process::id());
    let args = ["--redis-cluster", url.as_str(), "--prefix", prefix.as_str()];
    two_processes_share_locks_presence_and_limits(&args).await;
    // With one replica acknowledging each write, the same holds.
    let acked = format!("{prefix}-acked");
    let args = [
        "--redis-cluster",
        url.as_str(),
        "--redis-replica-acks",
        "1",
        "--prefix",
        acked.as_str(),
    ];
    two_processes_share_locks_presence_and_limits(&args).await;
    common::delete_prefix(&url, &prefix);
    common::delete_prefix(&url, &acked);
}

/// Outside testers: the example kept every item's stock in one partition,
/// so on a Redis Cluster the whole table lived on one master (its failover
/// stopped every item) and on NATS every write rewrote the whole table. Each
/// item's record is a partition of its own now: twelve items' records land
/// on more than one master, and the export still lists every item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_examples_items_spread_over_a_redis_clusters_masters() {
    use common::redis_cluster::{cli, parse_nodes};
    let url = tokio::task::spawn_blocking(common::redis_cluster_url)
        .await
        .unwrap();
    let prefix = format!("serve-spread-{}", std::process::id());
    let serve = Serve::start(&["--redis-cluster", url.as_str(), "--prefix", prefix.as_str()]);
    for n in 0..12 {
        let made = serve
            .call(
                "POST",
                &format!("/items/s{n}/adjust?delta=-{}", n + 1),
                None,
                "",
            )
            .await;
        assert_eq!(made.status, 200, "item s{n}: {}", made.json);
    }
    let exports = serve.call("POST", "/exports", Some("ann"), "").await;
    let mut listed: Vec<(String, i64)> = exports.json["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["item"].as_str().unwrap().to_string(),
                i["stock"].as_i64().unwrap(),
            )
        })
        .collect();
    listed.sort();
    let mut expected: Vec<(String, i64)> = (0..12).map(|n| (format!("s{n}"), 99 - n)).collect();
    expected.sort();
    assert_eq!(listed, expected, "{}", exports.json);

    let port: u16 = url
        .split(',')
        .next()
        .and_then(|u| u.rsplit(':').next())
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .unwrap();
    let nodes = parse_nodes(&cli(port, &["CLUSTER", "NODES"]).unwrap());
    let mut masters = std::collections::HashSet::new();
    for n in 0..12 {
        let key = format!("{prefix}:{{p:~inventory-record:s{n}}}:s");
        let slot: u16 = cli(port, &["CLUSTER", "KEYSLOT", &key])
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let master = nodes
            .iter()
            .find(|m| m.master && m.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot)))
            .unwrap();
        let exists = cli(master.port, &["EXISTS", &key]).unwrap();
        assert_eq!(exists.trim(), "1", "no record at {key} on its master");
        masters.insert(master.port);
    }
    assert!(
        masters.len() > 1,
        "twelve items' records are all on one master: {masters:?}"
    );
    common::delete_prefix(&url, &prefix);
}

/// `coord serve ARGS` twice: a lock, presence and a limit through one are
/// the same through the other.
async fn two_processes_share_locks_presence_and_limits(args: &[&str]) {
    let a = Serve::start(args);
    let b = Serve::start(args);

    // A lock taken through one process is busy through the other.
    let held = a.call("POST", "/items/lime/lock", None, "").await;
    assert_eq!(held.status, 200, "{}", held.json);
    let busy = b.call("POST", "/items/lime/adjust?delta=1", None, "").await;
    assert_eq!(busy.status, 409, "{}", busy.json);
    assert_eq!(busy.json["holderFence"], held.json["fence"]);
    let released = b
        .call("DELETE", "/items/lime/lock", None, &held.json.to_string())
        .await;
    assert_eq!(
        released.json["released"], true,
        "released through the other"
    );
    let written = b
        .call("POST", "/items/lime/adjust?delta=-2", None, "")
        .await;
    assert_eq!(written.status, 200, "{}", written.json);
    let fence = |reply: &serde_json::Value| -> u128 {
        reply["fence"]
            .as_str()
            .and_then(|f| f.parse().ok())
            .unwrap()
    };
    assert!(
        fence(&written.json) > fence(&held.json),
        "the second holder's fence rises: {} then {}",
        held.json,
        written.json
    );
    assert_eq!(
        a.call("GET", "/items/lime", None, "").await.json["stock"],
        98
    );

    // Presence written through one is seen through the other.
    a.call("PUT", "/items/lime/editors/s1", None, r#"{"userId":"ann"}"#)
        .await;
    let seen = b.call("GET", "/items/lime/editors", None, "").await;
    assert_eq!(seen.json["editors"][0]["value"]["userId"], "ann");

    // The export limit is one limit across both processes.
    for n in 0..10 {
        let via = if n % 2 == 0 { &a } else { &b };
        let reply = via.call("POST", "/exports", Some("cat"), "").await;
        assert_eq!(reply.status, 200, "export {n}: {}", reply.json);
    }
    assert_eq!(
        a.call("POST", "/exports", Some("cat"), "").await.status,
        429
    );
    assert_eq!(
        b.call("POST", "/exports", Some("cat"), "").await.status,
        429
    );

    drop((a, b));
}

/// Two processes on one store, four clients each, adjust one item 80
/// times at once through the example's fenced write, each client retrying
/// while the lock is busy: every adjustment answered 200 is in the stock,
/// and no other is.
async fn two_processes_lose_no_adjustment(args: &[&str]) {
    const CLIENTS: usize = 4;
    const EACH: i64 = 10;
    let serves = [Arc::new(Serve::start(args)), Arc::new(Serve::start(args))];
    let item = format!("race{}", std::process::id());
    let mut clients = Vec::new();
    for serve in &serves {
        for _ in 0..CLIENTS {
            let (serve, item) = (serve.clone(), item.clone());
            clients.push(tokio::spawn(async move {
                let mut applied = 0;
                while applied < EACH {
                    let reply = serve
                        .call("POST", &format!("/items/{item}/adjust?delta=-1"), None, "")
                        .await;
                    match reply.status {
                        200 => applied += 1,
                        // Busy: another client holds the item's lock.
                        409 => tokio::time::sleep(Duration::from_millis(2)).await,
                        other => panic!("adjust answered {other}: {}", reply.json),
                    }
                }
                applied
            }));
        }
    }
    let mut applied = 0;
    for client in clients {
        applied += common::bounded(client).await.unwrap();
    }
    assert_eq!(applied, 2 * CLIENTS as i64 * EACH);
    for serve in &serves {
        let shown = serve.call("GET", &format!("/items/{item}"), None, "").await;
        assert_eq!(shown.status, 200, "{}", shown.json);
        assert_eq!(
            shown.json["stock"].as_i64(),
            Some(100 - applied),
            "an adjustment answered 200 was lost or doubled: {}",
            shown.json
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_serve_processes_on_one_postgres_lose_no_adjustment() {
    let url = common::postgres_url().await;
    let prefix = format!("race{}", std::process::id());
    two_processes_lose_no_adjustment(&["--postgres", url.as_str(), "--prefix", prefix.as_str()])
        .await;
    common::drop_table(url, coord_postgres::PostgresConfig::table_for(&prefix));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_serve_processes_on_one_sqlite_file_lose_no_adjustment() {
    let path = common::sqlite_path();
    let file = path.display().to_string();
    two_processes_lose_no_adjustment(&["--sqlite", file.as_str()]).await;
    common::delete_sqlite(&path);
}
