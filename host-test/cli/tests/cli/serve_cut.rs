//! Requests the runtime ends itself — at their deadline, on a trap, at a
//! shutdown past its grace — give back the locks they took; a function that
//! returns keeps what it chose to keep. Driven over HTTP against a real
//! `coord serve` process, as an outside tester did: one anonymous request
//! with a day-long TTL, cut at its deadline, had locked an item for a day.

use crate::common;

use crate::process::Serve;

fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

/// An audit holds the item's lock for five steps of a second each; the
/// deadline cuts it after one. The 504 comes back with the lock free: the
/// next adjust is served, not 409 for the rest of the lock's minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_cut_by_its_deadline_gives_back_its_lock() {
    let serve = Serve::start(&["--deadline-ms", "1000"]);
    let cut = serve
        .call(
            "POST",
            "/items/d1/audit?steps=5&step_ms=1000&ttl_ms=60000",
            None,
            "",
        )
        .await;
    assert_eq!(cut.status, 504, "{}", cut.json);
    let next = serve
        .call("POST", "/items/d1/adjust?delta=1", None, "")
        .await;
    assert_eq!(
        next.status, 200,
        "the cut request's lock is still held: {}",
        next.json
    );
}

/// A lock the function hands out on purpose (it returned normally) stays
/// held for its holder, and one the client asks for is at most a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_handed_out_on_purpose_is_kept_and_its_ttl_is_capped() {
    let serve = Serve::start(&["--deadline-ms", "1000"]);
    let held = serve
        .call("POST", "/items/d2/lock?ttl_ms=60000", None, "")
        .await;
    assert_eq!(held.status, 200, "{}", held.json);
    let busy = serve
        .call("POST", "/items/d2/adjust?delta=1", None, "")
        .await;
    assert_eq!(
        busy.status, 409,
        "the handed-out lock was freed: {}",
        busy.json
    );
    for path in [
        "/items/d3/lock?ttl_ms=60001",
        "/items/d3/audit?ttl_ms=86400000",
    ] {
        let refused = serve.call("POST", path, None, "").await;
        assert_eq!(refused.status, 400, "{path}: {}", refused.json);
        assert_eq!(refused.json["field"], "ttl_ms", "{path}: {}", refused.json);
    }
}

/// SIGTERM with a grace shorter than a running audit: the process cuts it
/// and gives its lock back before it exits, so a second process on the same
/// Redis finds the item free at once instead of for the lock's whole TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_past_its_grace_gives_back_the_cut_requests_lock() {
    let url = common::redis_url().await;
    let prefix = unique("cut");
    let args = [
        "--redis",
        url.as_str(),
        "--prefix",
        prefix.as_str(),
        "--grace-ms",
        "200",
    ];
    let mut first = Serve::start(&args);
    // The audit's request, sent by hand: the process will end under it, so
    // its reply may never come.
    let mut audit = tokio::net::TcpStream::connect(&first.address)
        .await
        .unwrap();
    let request = "POST /items/d4/audit?steps=5&step_ms=2000&ttl_ms=60000 HTTP/1.1\r\n\
                   host: coord\r\ncontent-length: 0\r\n\r\n";
    tokio::io::AsyncWriteExt::write_all(&mut audit, request.as_bytes())
        .await
        .unwrap();
    // Let the audit take its lock (its first step sleeps 2 s), then stop.
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    first.terminate();
    first.wait();
    drop(audit);
    let second = Serve::start(&args);
    let next = second
        .call("POST", "/items/d4/adjust?delta=1", None, "")
        .await;
    assert_eq!(
        next.status, 200,
        "the cut request's lock outlived its process: {}",
        next.json
    );
    common::delete_prefix(&url, &prefix);
}

/// A rebuild waiting for a reader keeps a writer's claim, which turns new
/// readers away; cut by its deadline, its claim is given back, so readers
/// are let in again at once rather than when the claim lapses (up to 2 s
/// later). The reader is this test's own, on the same Redis, so it is known
/// to hold before the rebuild is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_cut_while_it_waits_gives_back_its_claim_to_the_readers() {
    use coord_host::rwlock::{AcquireOptions, AcquireOutcome, Mode};
    let url = common::redis_url().await;
    let config = common::redis_config(&url, 64, None);
    let prefix = config.prefix.clone();
    let backend = std::sync::Arc::new(coord_redis::RedisBackend::connect(config).await.unwrap());
    let mut i = coord_host::Runtime::new(backend)
        .unwrap()
        .instantiate()
        .await
        .unwrap();
    // The inventory function's catalog lock, held for reading.
    let options = AcquireOptions::new().ttl_ms(60_000).no_wait();
    let outcome = i
        .rwlock()
        .acquire("inventory.catalog", "all", Mode::Read, options);
    let AcquireOutcome::Acquired(reader) = outcome.await.unwrap().unwrap() else {
        panic!("a reader on a free lock");
    };
    let log = std::env::temp_dir().join(format!("{}.log", unique("coord-claim")));
    let args = [
        "--redis",
        url.as_str(),
        "--prefix",
        prefix.as_str(),
        "--deadline-ms",
        "1000",
    ];
    let serve = Serve::start_logging_to(&args, &log);
    let cut = serve
        .call("POST", "/catalog/rebuild?wait_ms=30000", None, "")
        .await;
    assert_eq!(cut.status, 504, "{}", cut.json);
    // The give-back runs after the 504 is sent: wait for its log line.
    let given = coord_testing::bounded(async {
        loop {
            let written = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(line) = written.lines().find(|l| l.contains("gave back")) {
                break line.to_string();
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(given.contains("gave back 1 "), "{given}");
    let next = serve.call("GET", "/catalog", None, "").await;
    assert_eq!(
        next.status, 200,
        "the cut rebuild's claim still turns readers away: {}",
        next.json
    );
    assert!(i.rwlock().release(&reader).await.unwrap().unwrap());
    let _ = std::fs::remove_file(&log);
    common::delete_prefix(&url, &prefix);
}
