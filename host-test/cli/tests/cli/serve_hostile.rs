//! `coord serve` and the example function as outside testers attacked them:
//! a made-up lock at the fenced write boundary, retried writes, a table grown
//! without bound, and clients that send slowly.

use crate::common;

use std::time::{Duration, Instant};

use crate::process::Serve;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The outside testers' forged lock: a made-up owner and the largest fence.
fn forged(item: &str, owner: &str, fence: &str) -> String {
    serde_json::json!({
        "id": "inventory.stock",
        "resource": format!("item:{item}"),
        "owner": owner,
        "fence": fence,
        "ttlMs": 10000,
        "expiresAt": 0,
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_made_up_lock_cannot_write_and_honest_writers_are_not_locked_out() {
    let serve = Serve::start(&[]);
    let zeros = "0".repeat(32);
    let attack = forged("victim", &zeros, &u64::MAX.to_string());
    let refused = serve
        .call("POST", "/items/victim/adjust?delta=-50", None, &attack)
        .await;
    assert_eq!(refused.status, 409, "{}", refused.json);
    assert_eq!(refused.json["field"], "body", "{}", refused.json);
    let shown = serve.call("GET", "/items/victim", None, "").await;
    assert_eq!(shown.json["stock"], 100, "nothing was written");
    assert_eq!(shown.json["fence"], "0", "no fence was recorded");
    let honest = serve
        .call("POST", "/items/victim/adjust?delta=-1", None, "")
        .await;
    assert_eq!(
        honest.status, 200,
        "an honest adjust still works: {}",
        honest.json
    );

    // While someone really holds the lock, its public fence with a made-up
    // owner is refused too.
    let held = serve.call("POST", "/items/victim/lock", None, "").await;
    assert_eq!(held.status, 200, "{}", held.json);
    let fence = held.json["fence"].as_str().unwrap();
    let impostor = forged("victim", &"f".repeat(32), fence);
    let refused = serve
        .call("POST", "/items/victim/adjust?delta=-50", None, &impostor)
        .await;
    assert_eq!(refused.status, 409, "{}", refused.json);
    assert_eq!(refused.json["field"], "body");
    let real = serve
        .call(
            "POST",
            "/items/victim/adjust?delta=-2",
            None,
            &held.json.to_string(),
        )
        .await;
    assert_eq!(
        real.status, 200,
        "the holder's own lock writes: {}",
        real.json
    );
    assert_eq!(real.json["stock"], 97);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_adjust_with_its_idempotency_key_applies_once() {
    let serve = Serve::start(&[]);
    let key = [("idempotency-key", "order-7")];
    let first = serve
        .call_with("POST", "/items/plum/adjust?delta=-7", &key, "")
        .await;
    assert_eq!(first.status, 200, "{}", first.json);
    assert_eq!(first.json["stock"], 93);
    // Another write lands in between; the retry (its first reply lost, as a
    // 503 for a write that applied would be) answers as the first did.
    let other = serve
        .call("POST", "/items/plum/adjust?delta=-1", None, "")
        .await;
    assert_eq!(other.json["stock"], 92);
    for _ in 0..3 {
        let retry = serve
            .call_with("POST", "/items/plum/adjust?delta=-7", &key, "")
            .await;
        assert_eq!(retry.status, 200, "{}", retry.json);
        assert_eq!(retry.json["stock"], 93, "the first answer");
        assert_eq!(retry.json["fence"], first.json["fence"]);
        assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    }
    let shown = serve.call("GET", "/items/plum", None, "").await;
    assert_eq!(shown.json["stock"], 92, "applied once");

    let reused = serve
        .call_with("POST", "/items/plum/adjust?delta=-3", &key, "")
        .await;
    assert_eq!(reused.status, 422, "{}", reused.json);
    assert_eq!(reused.json["field"], "idempotency-key");
    let long = "k".repeat(129);
    let too_long = serve
        .call_with(
            "POST",
            "/items/plum/adjust?delta=-1",
            &[("idempotency-key", &long)],
            "",
        )
        .await;
    assert_eq!(too_long.status, 400);
    assert_eq!(too_long.json["field"], "idempotency-key");
    assert_eq!(
        serve.call("GET", "/items/plum", None, "").await.json["stock"],
        92
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_cannot_grow_the_stock_table_without_bound() {
    let serve = Serve::start(&[]);
    // A new item that does not change writes no row.
    let zero = serve
        .call("POST", "/items/ghost/adjust?delta=0", None, "")
        .await;
    assert_eq!(zero.status, 200, "{}", zero.json);
    let exports = serve.call("POST", "/exports", Some("ann"), "").await;
    assert_eq!(
        exports.json["items"].as_array().unwrap().len(),
        0,
        "{}",
        exports.json
    );
    let long = "x".repeat(65);
    let named = serve
        .call("POST", &format!("/items/{long}/adjust?delta=-1"), None, "")
        .await;
    assert_eq!(named.status, 400);
    assert_eq!(named.json["field"], "item");

    // The table holds 1000 items; the 1001st new one is refused.
    for n in 0..1000 {
        let made = serve
            .call("POST", &format!("/items/i{n}/adjust?delta=-1"), None, "")
            .await;
        assert_eq!(made.status, 200, "item {n}: {}", made.json);
    }
    let full = serve
        .call("POST", "/items/one-more/adjust?delta=-1", None, "")
        .await;
    assert_eq!(full.status, 409, "{}", full.json);
    assert_eq!(full.json["field"], "item");
    let existing = serve
        .call("POST", "/items/i0/adjust?delta=-1", None, "")
        .await;
    assert_eq!(existing.status, 200, "items already there still adjust");
    assert_eq!(existing.json["stock"], 98);
}

/// Open a connection and send a request's headers and the first byte of a
/// 100-byte body, then nothing more.
async fn slow_body(address: &str) -> tokio::net::TcpStream {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream
        .write_all(
            b"POST /items/slow/adjust?delta=-1 HTTP/1.1\r\nhost: x\r\n\
              content-length: 100\r\n\r\n{",
        )
        .await
        .unwrap();
    stream
}

/// Read what the server sends until it closes the connection.
async fn read_to_close(stream: &mut tokio::net::TcpStream) -> String {
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply).await;
    String::from_utf8_lossy(&reply).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_get_408_and_never_starve_a_fast_one() {
    // As many slow clients as there are instances: before, every other
    // request was 503 for over 200 s and the slow ones were never answered.
    let serve = Serve::start(&["--max-requests", "3", "--read-timeout-ms", "1000"]);
    let started = Instant::now();
    let mut slow = Vec::new();
    for _ in 0..3 {
        slow.push(slow_body(&serve.address).await);
    }
    let mut slow_headers = tokio::net::TcpStream::connect(&serve.address)
        .await
        .unwrap();
    slow_headers
        .write_all(b"GET /items/slow HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    for _ in 0..5 {
        let fast = serve.call("GET", "/items/fast", None, "").await;
        assert_eq!(fast.status, 200, "a fast client is served: {}", fast.json);
    }
    for mut stream in slow {
        let reply = common::bounded(read_to_close(&mut stream)).await;
        assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
        assert!(reply.contains("\"field\":\"body\""), "{reply}");
    }
    // Headers that never end: the connection is closed (hyper answers 408).
    let reply = common::bounded(read_to_close(&mut slow_headers)).await;
    assert!(
        reply.is_empty() || reply.starts_with("HTTP/1.1 408"),
        "{reply}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "slow clients were cut off at their read timeout, not held: {:?}",
        started.elapsed()
    );
    let after = serve.call("GET", "/items/slow", None, "").await;
    assert_eq!(
        after.json["stock"], 100,
        "a body that never arrived wrote nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_on_the_admin_listener_is_cut_at_the_read_timeout() {
    // Headers that never end, on the operator's listener: closed at the
    // read timeout, as on the functions' one, not held for ever.
    let port = crate::serve_admin::free_port();
    let admin = format!("127.0.0.1:{port}");
    let _serve = Serve::start(&["--admin", &admin, "--read-timeout-ms", "1000"]);
    let mut slow = tokio::net::TcpStream::connect(&admin).await.unwrap();
    slow.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let reply = common::bounded(read_to_close(&mut slow)).await;
    assert!(
        reply.is_empty() || reply.starts_with("HTTP/1.1 408"),
        "{reply}"
    );
}

/// Send a request on `stream` and read its reply's status line and
/// headers, leaving the connection open (keep-alive). `None`: the server
/// closed it with no reply.
async fn status_of(stream: &mut tokio::net::TcpStream, request: &[u8]) -> Option<String> {
    stream.write_all(request).await.ok()?;
    let mut reply = Vec::new();
    let mut byte = [0u8; 1];
    while !reply.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte).await {
            Ok(1) => reply.push(byte[0]),
            _ => return None,
        }
    }
    let head = String::from_utf8_lossy(&reply).into_owned();
    // The reply's body, so the next request on this connection starts clean.
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map_or(0, |n| n.trim().parse::<usize>().unwrap());
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.ok()?;
    Some(head.lines().next().unwrap_or_default().to_string())
}

const GET: &[u8] = b"GET /items/held HTTP/1.1\r\nhost: x\r\n\r\n";

/// Open a connection the server serves and keep it open, trying again
/// while the server still counts connections that were just closed.
async fn held_connection(address: &str) -> tokio::net::TcpStream {
    loop {
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        if let Some(status) = status_of(&mut stream, GET).await {
            assert!(status.starts_with("HTTP/1.1 200"), "{status}");
            return stream;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_most_allowed_are_closed_until_one_is_freed() {
    // Before, every connection accepted was kept (each may hold a read
    // buffer and a body for the read timeout): clients opening connections
    // grew the process without bound.
    let serve = Serve::start(&["--max-connections", "3", "--read-timeout-ms", "60000"]);
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(common::bounded(held_connection(&serve.address)).await);
    }
    for _ in 0..3 {
        let mut past = tokio::net::TcpStream::connect(&serve.address)
            .await
            .unwrap();
        let status = common::bounded(status_of(&mut past, GET)).await;
        assert_eq!(status, None, "a fourth connection is closed unanswered");
    }
    // Those held are still served.
    for stream in &mut held {
        let status = common::bounded(status_of(stream, GET)).await.unwrap();
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    }
    drop(held.pop());
    common::bounded(held_connection(&serve.address)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_past_the_bytes_held_at_once_get_503_and_the_held_one_is_served() {
    // Before, bodies were held whatever their total: a client sending 2 MiB
    // bodies slowly on many connections grew the process by 2 MiB each.
    let serve = Serve::start(&["--max-buffered-bytes", "150", "--read-timeout-ms", "60000"]);
    let head = |length: usize| {
        format!(
            "POST /items/slow/adjust?delta=-1 HTTP/1.1\r\nhost: x\r\ncontent-length: {length}\r\n\r\n"
        )
    };
    // Two clients send 80 of 100 bytes, and then nothing for now: whichever
    // the server reads second passes 150 and is refused at once, while the
    // other is held, waiting for the rest of its body.
    let mut slow = Vec::new();
    for _ in 0..2 {
        let mut stream = tokio::net::TcpStream::connect(&serve.address)
            .await
            .unwrap();
        stream
            .write_all(format!("{}{}", head(100), " ".repeat(80)).as_bytes())
            .await
            .unwrap();
        slow.push(stream);
    }
    let (mut first, mut second) = (slow.remove(0), slow.remove(0));
    let (refused, mut held) = common::bounded(async {
        tokio::select! {
            status = status_of(&mut first, b"") => (status, second),
            status = status_of(&mut second, b"") => (status, first),
        }
    })
    .await;
    let refused = refused.unwrap();
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    held.write_all(" ".repeat(20).as_bytes()).await.unwrap();
    let status = common::bounded(status_of(&mut held, b"")).await.unwrap();
    assert!(
        !status.starts_with("HTTP/1.1 503"),
        "the body held is served: {status}"
    );
    // Its bytes given back, the next body fits again.
    let mut after = tokio::net::TcpStream::connect(&serve.address)
        .await
        .unwrap();
    let request = format!("{}{}", head(100), " ".repeat(100));
    let status = common::bounded(status_of(&mut after, request.as_bytes()))
        .await
        .unwrap();
    assert!(!status.starts_with("HTTP/1.1 503"), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_past_64_kib_are_refused_not_buffered() {
    // hyper's own bound is about 400 KiB a connection, which a client
    // sending headers slowly held for the read timeout.
    let serve = Serve::start(&[]);
    let mut stream = tokio::net::TcpStream::connect(&serve.address)
        .await
        .unwrap();
    let request = format!(
        "GET /items/big HTTP/1.1\r\nhost: x\r\nx-padding: {}\r\n\r\n",
        "a".repeat(100 << 10)
    );
    // The server may close before it has read everything sent.
    let _ = stream.write_all(request.as_bytes()).await;
    let reply = common::bounded(read_to_close(&mut stream)).await;
    assert!(
        reply.is_empty() || reply.starts_with("HTTP/1.1 431"),
        "{reply}"
    );
    let fine = serve.call("GET", "/items/big", None, "").await;
    assert_eq!(fine.status, 200, "{}", fine.json);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_keeps_64_connections_at_most() {
    let port = crate::serve_admin::free_port();
    let admin = format!("127.0.0.1:{port}");
    let _serve = Serve::start(&["--admin", &admin, "--read-timeout-ms", "60000"]);
    const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n";
    // Each connection served once and kept open (a refused one is closed
    // unanswered: tried again, as the server may still count one just
    // closed).
    let mut held = common::bounded(async {
        let mut held = Vec::new();
        while held.len() < 64 {
            let mut stream = tokio::net::TcpStream::connect(&admin).await.unwrap();
            if let Some(status) = status_of(&mut stream, HEALTHZ).await {
                assert!(status.starts_with("HTTP/1.1 200"), "{status}");
                held.push(stream);
            }
        }
        held
    })
    .await;
    let mut past = tokio::net::TcpStream::connect(&admin).await.unwrap();
    let status = common::bounded(status_of(&mut past, HEALTHZ)).await;
    assert_eq!(status, None, "a 65th connection is closed unanswered");
    drop(held.pop());
    common::bounded(async {
        loop {
            let mut stream = tokio::net::TcpStream::connect(&admin).await.unwrap();
            if status_of(&mut stream, HEALTHZ).await.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}
