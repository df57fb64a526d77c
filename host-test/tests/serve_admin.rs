//! `coord serve --admin`: the metrics after a known load, read with a real
//! Prometheus text parser, and readiness that follows the store.

#![allow(clippy::unwrap_used)] // tests may unwrap: a panic is the failure report

mod common;

use std::time::Duration;

use common::RedisServer;
use common::serve::Serve;

/// A free port on loopback for the admin listener.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET `path` on the admin listener: status and body.
async fn admin(port: u16, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reply = String::new();
    common::bounded(stream.read_to_string(&mut reply))
        .await
        .unwrap();
    let status = reply
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = reply.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

/// The value of the counter sample `name` with exactly these labels.
fn counter(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .find(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
            prometheus_parse::Value::Gauge(v) => v,
            _ => f64::NAN,
        })
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_count_a_known_load() {
    let port = free_port();
    let admin_addr = format!("127.0.0.1:{port}");
    let serve = Serve::start(&["--admin", &admin_addr]);
    for n in 0..20 {
        let reply = serve
            .call(
                "POST",
                &format!("/items/m{}/adjust?delta=-1", n % 4),
                None,
                "",
            )
            .await;
        assert_eq!(reply.status, 200, "{}", reply.json);
    }
    for _ in 0..3 {
        assert_eq!(
            serve.call("POST", "/exports", Some("ann"), "").await.status,
            200
        );
    }
    for _ in 0..2 {
        assert_eq!(serve.call("GET", "/nope", None, "").await.status, 404);
    }
    let held = serve.call("POST", "/items/h/lock", None, "").await;
    assert_eq!(held.status, 200);
    let busy = serve
        .call("POST", "/items/h/adjust?delta=-1", None, "")
        .await;
    assert_eq!(busy.status, 409);

    let (status, text) = admin(port, "/metrics").await;
    assert_eq!(status, 200);
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    let requests = |method, route, status| {
        counter(
            &scrape,
            "coord_requests_total",
            &[("method", method), ("route", route), ("status", status)],
        )
    };
    assert_eq!(
        requests("POST", "items", "200"),
        21.0,
        "20 adjusts and the lock"
    );
    assert_eq!(requests("POST", "items", "409"), 1.0);
    assert_eq!(requests("POST", "exports", "200"), 3.0);
    assert_eq!(requests("GET", "nope", "404"), 2.0);
    let outcome = |outcome| {
        counter(
            &scrape,
            "coord_lock_outcomes_total",
            &[("outcome", outcome)],
        )
    };
    assert_eq!(outcome("acquired"), 21.0, "20 adjusts and the held lock");
    assert_eq!(outcome("busy"), 1.0);
    assert_eq!(
        counter(
            &scrape,
            "coord_store_calls_total",
            &[("operation", "meter"), ("backend", "memory")]
        ),
        3.0,
        "one meter call per export"
    );
    assert_eq!(counter(&scrape, "coord_instances_in_use", &[]), 0.0);
    assert_eq!(counter(&scrape, "coord_pool_rejections_total", &[]), 0.0);
    assert!(
        text.contains("coord_request_duration_seconds_count{route=\"items\"} 22"),
        "latency observed per request:\n{text}"
    );
    assert_eq!(admin(port, "/healthz").await.0, 200);
    assert_eq!(admin(port, "/nothing").await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_the_store() {
    let mut redis = RedisServer::spawn().expect("a private redis-server");
    let url = redis.url();
    let port = free_port();
    let admin_addr = format!("127.0.0.1:{port}");
    let serve = Serve::start(&["--redis", &url, "--admin", &admin_addr]);
    assert_eq!(admin(port, "/readyz").await.0, 200);
    redis.stop();
    let (status, body) = admin(port, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        admin(port, "/healthz").await.0,
        200,
        "the process is still up"
    );
    redis.start().unwrap();
    let mut ready = false;
    for _ in 0..100 {
        if admin(port, "/readyz").await.0 == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready, "ready again once Redis answers");
    drop(serve);
}
