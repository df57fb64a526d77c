//! `coord serve --admin`: the metrics after a known load, read with a real
//! Prometheus text parser, and readiness that follows the store.

use crate::common;

use std::time::Duration;

use crate::process::Serve;
use common::RedisServer;

/// A free port on loopback for the admin listener.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET `path` on the admin listener: status and body.
pub(crate) async fn admin(port: u16, path: &str) -> (u16, String) {
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

/// GET `path` on the admin listener with these `Accept` headers: status,
/// `Content-Type` and body.
async fn admin_accepting(port: u16, path: &str, accept: &[&str]) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let accept: String = accept.iter().map(|a| format!("accept: {a}\r\n")).collect();
    let request =
        format!("GET {path} HTTP/1.1\r\nhost: admin\r\n{accept}connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reply = String::new();
    common::bounded(stream.read_to_string(&mut reply))
        .await
        .unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let content_type = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-type")
                .then(|| value.trim().to_string())
        })
        .unwrap_or_default();
    (status, content_type, body.to_string())
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
    for _ in 0..3 {
        let report = serve.call("POST", "/reports/acme", None, "").await;
        assert_eq!(report.status, 200, "{}", report.json);
    }

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
    let permits = counter(
        &scrape,
        "coord_permit_outcomes_total",
        &[("outcome", "acquired")],
    );
    assert_eq!(
        permits, 3.0,
        "one permit per report, none counted as a lock"
    );
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
    // Ready again once Redis answers: bounded by the tests' watchdog, not
    // by how fast a busy machine reconnects.
    common::bounded(async {
        while admin(port, "/readyz").await.0 != 200 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    drop(serve);
}

/// What Prometheus 2.x and 3.x send by default: OpenMetrics first, the text
/// format 0.0.4 as a fallback.
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,\
    application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_in_the_format_the_scraper_asks_for() {
    let port = free_port();
    let admin_addr = format!("127.0.0.1:{port}");
    let serve = Serve::start(&["--admin", &admin_addr]);
    for _ in 0..2 {
        let reply = serve
            .call("POST", "/items/f/adjust?delta=-1", None, "")
            .await;
        assert_eq!(reply.status, 200, "{}", reply.json);
    }

    // A 0.0.4 scraper (and one that names no format) gets the 0.0.4 text:
    // a counter's TYPE line names its `_total` samples, so a 0.0.4 parser
    // reads them as a counter, not as an untyped metric beside an empty
    // counter (which is what it made of the OpenMetrics text once sent to
    // everyone).
    for accept in [
        &["text/plain; version=0.0.4"][..],
        &["text/plain"],
        &[],
        &["*/*"],
        &["application/json, text/plain;q=0.2"],
        &[
            "application/openmetrics-text; version=1.0.0; q=0",
            "text/plain",
        ],
        &["application/openmetrics-text; version=2.0.0"],
    ] {
        let (status, content_type, text) = admin_accepting(port, "/metrics", accept).await;
        assert_eq!(status, 200, "{accept:?}");
        assert_eq!(
            content_type, "text/plain; version=0.0.4; charset=utf-8",
            "{accept:?}"
        );
        assert!(
            text.contains("# TYPE coord_requests_total counter\n"),
            "{accept:?}:\n{text}"
        );
        assert!(!text.contains("# EOF"), "{accept:?}:\n{text}");
        let scrape =
            prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
        let sample = scrape
            .samples
            .iter()
            .find(|s| {
                s.metric == "coord_requests_total"
                    && s.labels.get("route") == Some("items")
                    && s.labels.get("status") == Some("200")
            })
            .unwrap_or_else(|| panic!("{accept:?}:\n{text}"));
        assert!(
            matches!(sample.value, prometheus_parse::Value::Counter(v) if v == 2.0),
            "{accept:?}: a counter of 2, not {:?}",
            sample.value
        );
        let outcome = scrape
            .samples
            .iter()
            .find(|s| s.metric == "coord_lock_outcomes_total")
            .unwrap();
        assert!(
            matches!(outcome.value, prometheus_parse::Value::Counter(_)),
            "{:?}",
            outcome.value
        );
    }

    // A scraper that asks for OpenMetrics gets it: the family without
    // `_total`, its samples with it, and the closing `# EOF`.
    for accept in [
        &[PROMETHEUS_ACCEPT][..],
        &["application/openmetrics-text"],
        &[
            "text/plain;q=0.5",
            "application/openmetrics-text;version=1.0.0",
        ],
        &["text/plain;version=0.0.4;q=0.4,application/openmetrics-text;q=0.9"],
    ] {
        let (status, content_type, text) = admin_accepting(port, "/metrics", accept).await;
        assert_eq!(status, 200, "{accept:?}");
        assert_eq!(
            content_type, "application/openmetrics-text; version=1.0.0; charset=utf-8",
            "{accept:?}"
        );
        assert!(
            text.contains("# TYPE coord_requests counter\n"),
            "{accept:?}:\n{text}"
        );
        assert!(
            text.contains(
                "coord_requests_total{method=\"POST\",route=\"items\",status=\"200\"} 2\n"
            ),
            "{accept:?}:\n{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{accept:?}:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_the_store_failed_counts_one_unavailable_outcome() {
    let mut redis = RedisServer::spawn().expect("a private redis-server");
    let url = redis.url();
    let port = free_port();
    let admin_addr = format!("127.0.0.1:{port}");
    let serve = Serve::start(&["--redis", &url, "--admin", &admin_addr]);
    let reply = serve
        .call("POST", "/items/u/adjust?delta=-1", None, "")
        .await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    redis.stop();
    let reply = serve
        .call("POST", "/items/u/adjust?delta=-1", None, "")
        .await;
    assert_eq!(reply.status, 503, "{}", reply.json);

    let (status, text) = admin(port, "/metrics").await;
    assert_eq!(status, 200);
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    let outcome = |outcome| {
        counter(
            &scrape,
            "coord_lock_outcomes_total",
            &[("outcome", outcome)],
        )
    };
    assert_eq!(outcome("acquired"), 1.0);
    // The acquire's attempt failed, and so did the read with which it
    // looked for a write of its own to take back: one acquire, one outcome
    // (the read once counted as a second).
    assert_eq!(outcome("unavailable"), 1.0, "{text}");
    let errors = |operation| {
        counter(
            &scrape,
            "coord_store_errors_total",
            &[("operation", operation), ("backend", "redis")],
        )
    };
    assert_eq!(errors("put"), 1.0, "the attempt: {text}");
    // Its clean-up read failed too (a store error, not an outcome), and so
    // may the host's background reads for the attempt landing late.
    assert!(errors("get") >= 1.0, "its clean-up read: {text}");
    drop(serve);
}

/// A stream kept at more replicas than a process asked for is no fault,
/// but the operator hears of it: `/readyz` stays 200 and lists the
/// warning, and `coord_store_warnings` counts it (issue 48, item 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_mismatch_is_shown_by_readyz_and_the_metrics() {
    let cluster = common::nats_cluster::Cluster::start("serve-replicas");
    let url = cluster.url();
    let prefix = format!("rep{}", std::process::id());
    // The first process makes the stream at 3 replicas once the cluster
    // has its meta leader (it waits for the cluster as a start would).
    let port = free_port();
    let admin_addr = format!("127.0.0.1:{port}");
    let first = Serve::start(&["--nats", &url, "--prefix", &prefix, "--admin", &admin_addr]);
    common::bounded(async {
        while admin(port, "/readyz").await.0 != 200 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let (status, body) = admin(port, "/readyz").await;
    assert_eq!((status, body.as_str()), (200, "ready\n"));
    // A second asks for one replica without the second word: kept at 3.
    let one = url.split(',').next().unwrap();
    let port = free_port();
    let admin_addr = format!("127.0.0.1:{port}");
    let second = Serve::start(&[
        "--nats",
        one,
        "--prefix",
        &prefix,
        "--nats-replicas",
        "1",
        "--admin",
        &admin_addr,
    ]);
    let (status, body) = admin(port, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("warning:") && body.contains("--allow-fewer-replicas"),
        "{body}"
    );
    let (_, text) = admin(port, "/metrics").await;
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    let warnings = scrape
        .samples
        .iter()
        .find(|s| s.metric == "coord_store_warnings")
        .map(|s| match s.value {
            prometheus_parse::Value::Gauge(v) => v,
            _ => -1.0,
        });
    assert_eq!(warnings, Some(1.0), "{text}");
    drop((first, second));
}

/// A sample's value read off the text, for the histogram lines the parser
/// folds into one value (`name` with its labels, as printed).
fn sample(text: &str, name_and_labels: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name_and_labels)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Requests waiting on a held lock are counted by `coord_waiting` while
/// they wait, three at once, and each wait is timed once it ends: by the
/// lock's release, or by the request's deadline cutting it (a cut waiter
/// must not stay counted for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_on_a_lock_are_counted_while_they_last_and_timed_when_they_end() {
    let waiting = |text: &str| sample(text, "coord_waiting{kind=\"lock\"}");
    let waits = |text: &str| sample(text, "coord_wait_duration_seconds_count{kind=\"lock\"}");
    let port = free_port();
    let serve = Serve::start(&["--admin", &format!("127.0.0.1:{port}")]);
    let held = serve
        .call("POST", "/items/w/lock?ttl_ms=60000", None, "")
        .await;
    assert_eq!(held.status, 200, "{}", held.json);
    const WAIT: &str = "/items/w/adjust?delta=1&wait_ms=30000";
    let waiter = || serve.call("POST", WAIT, None, "");
    let release = async {
        // Until all three wait (bounded by the tests' watchdog, not by how
        // fast a busy machine gets them there).
        common::bounded(async {
            while waiting(&admin(port, "/metrics").await.1) != 3.0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        let lock = held.json.to_string();
        serve.call("DELETE", "/items/w/lock", None, &lock).await
    };
    let (a, b, c, released) = tokio::join!(waiter(), waiter(), waiter(), release);
    assert_eq!(released.json["released"], true, "{}", released.json);
    for reply in [a, b, c] {
        assert_eq!(reply.status, 200, "each waiter in turn: {}", reply.json);
    }
    let text = admin(port, "/metrics").await.1;
    assert_eq!(waiting(&text), 0.0, "{text}");
    assert!(waits(&text) >= 3.0, "each waiter's wait timed:\n{text}");
    drop(serve);

    // A waiter cut by its deadline while it waits.
    let port = free_port();
    let serve = Serve::start(&[
        "--admin",
        &format!("127.0.0.1:{port}"),
        "--deadline-ms",
        "1000",
    ]);
    let held = serve
        .call("POST", "/items/w/lock?ttl_ms=60000", None, "")
        .await;
    assert_eq!(held.status, 200, "{}", held.json);
    let cut = serve.call("POST", WAIT, None, "").await;
    assert_eq!(cut.status, 504, "{}", cut.json);
    let text = admin(port, "/metrics").await.1;
    assert_eq!(waiting(&text), 0.0, "the cut waiter still counted:\n{text}");
    assert!(waits(&text) >= 1.0, "the cut wait timed:\n{text}");
}
