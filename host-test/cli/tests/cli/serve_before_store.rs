//! `coord serve` started before its store (issue 48, item 2), as a compose
//! file or an init system starts both at once: it listens, answers
//! `/healthz` 200 and `/readyz` 503 with the reason, answers store calls
//! 503, and keeps trying until the store answers. Before, it exited 1
//! (`jetstream request timed out` on a NATS cluster without its meta
//! leader yet; the same with Redis or PostgreSQL not yet listening).

use std::time::Duration;

use crate::common;
use crate::process::Serve;
use crate::serve_admin::{admin, free_port};
use common::RedisServer;
use common::nats_cluster::Cluster;

/// Poll `/readyz` until it answers 200 (bounded by the tests' watchdog).
async fn until_ready(admin_port: u16) -> String {
    common::bounded(async {
        loop {
            let (status, body) = admin(admin_port, "/readyz").await;
            if status == 200 {
                break body;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_started_before_redis_waits_for_it_answering_503_meanwhile() {
    let mut redis = RedisServer::spawn().unwrap();
    let url = redis.url();
    redis.stop();
    let admin_port = free_port();
    let admin_addr = format!("127.0.0.1:{admin_port}");
    let serve = Serve::start(&["--redis", &url, "--admin", &admin_addr]);
    let (health, _) = admin(admin_port, "/healthz").await;
    assert_eq!(health, 200);
    let (ready, why) = admin(admin_port, "/readyz").await;
    assert_eq!(ready, 503, "{why}");
    assert!(why.contains("not reached yet"), "{why}");
    let early = serve
        .call("POST", "/items/b1/adjust?delta=1", None, "")
        .await;
    assert_eq!(early.status, 503, "{}", early.json);
    redis.start().unwrap();
    until_ready(admin_port).await;
    let served = serve
        .call("POST", "/items/b1/adjust?delta=1", None, "")
        .await;
    assert_eq!(served.status, 200, "{}", served.json);
}

/// The outside testers' start: a 3-node JetStream cluster and `coord serve
/// --nats` at the same moment, before the cluster has a meta leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_started_with_a_nats_cluster_waits_for_its_meta_leader() {
    let cluster = Cluster::start("serve-first");
    let admin_port = free_port();
    let admin_addr = format!("127.0.0.1:{admin_port}");
    let url = cluster.url();
    let serve = Serve::start(&["--nats", &url, "--admin", &admin_addr]);
    let ready = until_ready(admin_port).await;
    assert!(ready.starts_with("ready"), "{ready}");
    let served = serve
        .call("POST", "/items/b2/adjust?delta=1", None, "")
        .await;
    assert_eq!(served.status, 200, "{}", served.json);
}

/// `--store-wait-ms` bounds the wait: a store that never answers makes the
/// process exit 1 saying so; and a store that answers no (here a NATS
/// server without JetStream) is not waited for at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_gives_up_after_its_store_wait_or_at_once_on_a_refusal() {
    let port = free_port();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_coord"))
            .args(["serve", "--no-cache", "--listen", "127.0.0.1:0"])
            .args(["--redis", &format!("redis://127.0.0.1:{port}")])
            .args(["--store-wait-ms", "300"])
            .env("COORD_LOG", "warn")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("gave up on the store after --store-wait-ms 300"),
        "{stderr}"
    );
    let binary = common::nats_server_binary().unwrap();
    let no_jetstream = common::NatsServer::spawn(&binary, &[]).unwrap();
    let url = no_jetstream.url();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_coord"))
            .args([
                "serve",
                "--no-cache",
                "--listen",
                "127.0.0.1:0",
                "--nats",
                &url,
            ])
            .env("COORD_LOG", "warn")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("JetStream"), "{stderr}");
}
