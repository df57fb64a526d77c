//! The example function's two admission routes over HTTP, on Redis: reports
//! limited to a few at once per tenant (a semaphore), and summaries charged
//! the bytes they produced (a rate-limit reservation). The test holds
//! permits itself through the component on the same Redis, so no request
//! has to be kept running for a while.

use std::sync::Arc;

use super::Prefix;
use crate::common;
use crate::process::Serve;
use coord_host::Runtime;
use coord_host::semaphore::{AcquireOptions, AcquireOutcome};
use coord_redis::RedisBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_runs_at_most_two_reports_at_once_across_every_instance() {
    let prefix = Prefix::new("reports").await;
    let serve = Serve::start(&["--redis", &prefix.url, "--prefix", &prefix.name]);
    let mut config = common::redis_config(&prefix.url, 64, None);
    config.prefix = prefix.name.clone();
    let backend = Arc::new(RedisBackend::connect(config).await.unwrap());
    let mut i = Runtime::new(backend).unwrap().instantiate().await.unwrap();

    // Two reports of tenant acme are running elsewhere (another instance).
    let mut running = Vec::new();
    for _ in 0..2 {
        let options = AcquireOptions::new().ttl_ms(60_000).no_wait();
        let outcome = i
            .semaphore()
            .acquire("inventory.reports", "tenant:acme", 2, options);
        let AcquireOutcome::Acquired(permit) = outcome.await.unwrap().unwrap() else {
            panic!("a free place")
        };
        running.push(permit);
    }
    let full = serve.call("POST", "/reports/acme", None, "").await;
    assert_eq!(full.status, 429, "{}", full.json);
    assert_eq!(full.json["limit"], 2);
    assert!(full.header("retry-after").is_some());
    let other = serve.call("POST", "/reports/globex", None, "").await;
    assert_eq!(
        other.status, 200,
        "another tenant has its own places: {}",
        other.json
    );

    // One finishes: one place, and the route's permit is released after.
    assert!(i.semaphore().release(&running[0]).await.unwrap().unwrap());
    let ran = serve.call("POST", "/reports/acme", None, "").await;
    assert_eq!(ran.status, 200, "{}", ran.json);
    let fence: u64 = ran.json["fence"].as_str().unwrap().parse().unwrap();
    assert!(fence > running[1].fence, "a later permit, a higher fence");
    let usage = i
        .semaphore()
        .inspect("inventory.reports", "tenant:acme")
        .await;
    assert_eq!(
        usage.unwrap().unwrap().permits.len(),
        1,
        "released after the report"
    );

    // Full again; a waiter is let in by the release of a running report.
    let options = AcquireOptions::new().ttl_ms(60_000).no_wait();
    let taken = i
        .semaphore()
        .acquire("inventory.reports", "tenant:acme", 2, options);
    let AcquireOutcome::Acquired(second) = taken.await.unwrap().unwrap() else {
        panic!("the second place")
    };
    let waiting = serve.call("POST", "/reports/acme?wait_ms=30000&work_ms=1", None, "");
    let release = async {
        // Whether the waiter is waiting yet or not, it runs once these go.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        for permit in [&running[1], &second] {
            assert!(i.semaphore().release(permit).await.unwrap().unwrap());
        }
    };
    let (waited, ()) = tokio::join!(waiting, release);
    assert_eq!(waited.status, 200, "{}", waited.json);

    let bad = serve
        .call("POST", "/reports/acme?work_ms=10001", None, "")
        .await;
    assert_eq!(
        (bad.status, bad.json["field"].as_str()),
        (400, Some("work_ms"))
    );
    common::delete_prefix(&prefix.url, &prefix.name);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_summary_is_charged_the_bytes_it_produced_not_its_estimate() {
    let serve = Serve::start(&[]);
    // Its estimate, 4000 of the 4096-byte budget, fits; what it used is far less.
    let first = serve
        .call("POST", "/summaries?estimate=4000", Some("ann"), "")
        .await;
    assert_eq!(first.status, 200, "{}", first.json);
    let used = first.json["usedBytes"].as_u64().unwrap();
    assert!(used < 1000, "{}", first.json);
    // Had the estimate been counted, 3000 more would not fit: it was settled.
    let second = serve
        .call("POST", "/summaries?estimate=3000", Some("ann"), "")
        .await;
    assert_eq!(
        second.status, 200,
        "the difference was given back: {}",
        second.json
    );
    // A whole budget no longer fits beside what was used.
    let third = serve
        .call("POST", "/summaries?estimate=4096", Some("ann"), "")
        .await;
    assert_eq!(third.status, 429, "{}", third.json);
    assert!(third.header("retry-after").is_some());
    let other = serve
        .call("POST", "/summaries?estimate=4096", Some("bob"), "")
        .await;
    assert_eq!(other.status, 200, "another user's budget: {}", other.json);
    let bad = serve
        .call("POST", "/summaries?estimate=4097", Some("ann"), "")
        .await;
    assert_eq!(
        (bad.status, bad.json["field"].as_str()),
        (400, Some("estimate"))
    );
    let anonymous = serve.call("POST", "/summaries", None, "").await;
    assert_eq!(anonymous.status, 400);
}
