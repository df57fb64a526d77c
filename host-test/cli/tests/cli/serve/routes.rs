//! The example function's routes over HTTP: fenced adjusts, locks held
//! across requests, limited exports, presence, and bad requests.

use crate::process::Serve;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_is_adjusted_under_a_fenced_lock_over_http() {
    let serve = Serve::start(&[]);
    let first = serve
        .call("POST", "/items/apple/adjust?delta=-3", None, "")
        .await;
    assert_eq!(first.status, 200, "{}", first.json);
    assert_eq!(first.json["stock"], 97);
    let second = serve
        .call("POST", "/items/apple/adjust?delta=5", None, "")
        .await;
    assert_eq!(second.json["stock"], 102);
    let (f1, f2): (u64, u64) = (
        first.json["fence"].as_str().unwrap().parse().unwrap(),
        second.json["fence"].as_str().unwrap().parse().unwrap(),
    );
    assert!(f2 > f1, "fences grow: {f1} then {f2}");
    let shown = serve.call("GET", "/items/apple", None, "").await;
    assert_eq!(shown.json["stock"], 102);
    assert_eq!(shown.json["fence"], second.json["fence"]);

    let refused = serve
        .call("POST", "/items/apple/adjust?delta=-500", None, "")
        .await;
    assert_eq!(refused.status, 409);
    assert_eq!(refused.json["field"], "delta");
    assert_eq!(
        serve.call("GET", "/items/apple", None, "").await.json["stock"],
        102,
        "a refused write changes nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_across_requests_blocks_others_and_a_lost_one_cannot_write() {
    let serve = Serve::start(&[]);
    let held = serve.call("POST", "/items/pear/lock", None, "").await;
    assert_eq!(held.status, 200, "{}", held.json);
    let lock = held.json.to_string();

    let busy = serve
        .call("POST", "/items/pear/adjust?delta=1", None, "")
        .await;
    assert_eq!(busy.status, 409);
    assert_eq!(busy.json["holderFence"], held.json["fence"]);
    assert!(busy.header("retry-after").is_some());

    let written = serve
        .call("POST", "/items/pear/adjust?delta=-1", None, &lock)
        .await;
    assert_eq!(written.status, 200, "{}", written.json);
    assert_eq!(written.json["fence"], held.json["fence"]);
    let extended = serve
        .call("POST", "/items/pear/lock/extend?ttl_ms=20000", None, &lock)
        .await;
    assert_eq!(extended.status, 200, "{}", extended.json);
    assert_eq!(extended.json["ttlMs"], 20000);
    let released = serve.call("DELETE", "/items/pear/lock", None, &lock).await;
    assert_eq!(released.json["released"], true);
    let again = serve.call("DELETE", "/items/pear/lock", None, &lock).await;
    assert_eq!(again.json["released"], false, "a released lock is gone");

    // A lock that lapses (1 ms TTL) is taken over; the old holder's write is
    // refused at the write boundary because a newer fence has written.
    let short = serve
        .call("POST", "/items/pear/lock?ttl_ms=1", None, "")
        .await;
    assert_eq!(short.status, 200, "{}", short.json);
    let newer = serve
        .call("POST", "/items/pear/adjust?delta=1&wait_ms=5000", None, "")
        .await;
    assert_eq!(newer.status, 200, "{}", newer.json);
    let stale = serve
        .call(
            "POST",
            "/items/pear/adjust?delta=1",
            None,
            &short.json.to_string(),
        )
        .await;
    // The commit-point check refuses it before the fence is even compared.
    assert_eq!(stale.status, 409, "{}", stale.json);
    assert_eq!(stale.json["field"], "body", "{}", stale.json);
    let lost = serve
        .call(
            "POST",
            "/items/pear/lock/extend",
            None,
            &short.json.to_string(),
        )
        .await;
    assert_eq!(lost.status, 409, "an expired lock cannot be extended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_are_limited_per_user_with_retry_after() {
    let serve = Serve::start(&[]);
    for n in 0..10 {
        let reply = serve.call("POST", "/exports", Some("ann"), "").await;
        assert_eq!(reply.status, 200, "export {n}: {}", reply.json);
        assert_eq!(reply.json["remaining"], 9 - n);
    }
    let limited = serve.call("POST", "/exports", Some("ann"), "").await;
    assert_eq!(limited.status, 429);
    let retry: u64 = limited.header("retry-after").unwrap().parse().unwrap();
    let retry_ms = limited.json["retryAfterMs"].as_u64().unwrap();
    // Sliding window: the previous window's count decays into the next one,
    // so a retry can be up to two windows away, never sooner than now.
    assert!((1..=120_000).contains(&retry_ms), "retryAfterMs {retry_ms}");
    assert_eq!(
        retry,
        retry_ms.div_ceil(1000),
        "the header is the body, in seconds"
    );
    let other = serve.call("POST", "/exports", Some("bob"), "").await;
    assert_eq!(other.status, 200, "another user has its own limit");
    let anonymous = serve.call("POST", "/exports", None, "").await;
    assert_eq!(anonymous.status, 400);
    assert_eq!(anonymous.json["field"], "x-user-id");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn editors_presence_upsert_touch_snapshot_watch_and_delete() {
    let serve = Serve::start(&[]);
    let before = serve.call("GET", "/items/fig/editors", None, "").await;
    assert_eq!(before.json["editors"], serde_json::json!([]));
    let joined = serve
        .call("PUT", "/items/fig/editors/s1", None, r#"{"userId":"ann"}"#)
        .await;
    assert_eq!(joined.status, 200, "{}", joined.json);
    let touched = serve
        .call("POST", "/items/fig/editors/s1/touch", None, "")
        .await;
    assert_eq!(touched.json["renewed"], true);
    let missing = serve
        .call("POST", "/items/fig/editors/nobody/touch", None, "")
        .await;
    assert_eq!(missing.status, 404);

    let snapshot = serve.call("GET", "/items/fig/editors", None, "").await;
    assert_eq!(snapshot.json["editors"][0]["session"], "s1");
    assert_eq!(snapshot.json["editors"][0]["value"]["userId"], "ann");
    let revision = snapshot.json["revision"].as_str().unwrap().to_string();

    // A watch after the snapshot's revision sees the next change only.
    let watch = format!("/items/fig/editors/watch?after={revision}&timeout_ms=5000");
    let watcher = serve.call("GET", &watch, None, "");
    let leave = async {
        // The watch is open before the delete or after it; it sees it either way.
        serve
            .call("DELETE", "/items/fig/editors/s1", None, "")
            .await
    };
    let (events, left) = tokio::join!(watcher, leave);
    assert_eq!(left.json["deleted"], true);
    assert_eq!(
        events.json["events"][0]["type"], "delete",
        "{}",
        events.json
    );
    assert_eq!(events.json["events"][0]["session"], "s1");
    let quiet = serve
        .call(
            "GET",
            &format!(
                "/items/fig/editors/watch?after={}&timeout_ms=10",
                events.json["revision"].as_str().unwrap()
            ),
            None,
            "",
        )
        .await;
    assert_eq!(
        quiet.json["events"],
        serde_json::json!([]),
        "nothing after the delete"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_errors_that_name_the_field() {
    let serve = Serve::start(&[]);
    let cases = [
        ("POST", "/items/kiwi/adjust?delta=lots", "", "delta"),
        ("POST", "/items/kiwi/adjust", "", "delta"),
        (
            "POST",
            "/items/kiwi/adjust?delta=1&wait_ms=-1",
            "",
            "wait_ms",
        ),
        ("POST", "/items/kiwi/adjust?delta=1", "{\"id\":1}", "body"),
        (
            "POST",
            "/items/kiwi/adjust?delta=1",
            r#"{"id":"inventory.stock","resource":"item:kiwi","owner":"x","fence":"ten","ttlMs":1,"expiresAt":1}"#,
            "body.fence",
        ),
        (
            "DELETE",
            "/items/kiwi/lock",
            r#"{"id":"inventory.stock","resource":"item:plum","owner":"x","fence":"1","ttlMs":1,"expiresAt":1}"#,
            "body.resource",
        ),
        ("POST", "/items/kiwi/lock?ttl_ms=999999999999", "", "ttl_ms"),
        ("PUT", "/items/kiwi/editors/s1", "not json", "body"),
        ("GET", "/nowhere", "", "path"),
    ];
    for (method, path, body, field) in cases {
        let reply = serve.call(method, path, None, body).await;
        assert!(
            (400..500).contains(&reply.status),
            "{method} {path}: {} {}",
            reply.status,
            reply.json
        );
        assert_eq!(
            reply.json["field"], field,
            "{method} {path}: {}",
            reply.json
        );
    }
    let big = "x".repeat(5000);
    let too_big = serve
        .call("PUT", "/items/kiwi/editors/s1", None, &format!("\"{big}\""))
        .await;
    assert_eq!(too_big.status, 400, "{}", too_big.json);
    assert_eq!(too_big.json["field"], "value");
    // Nothing was written by any of them.
    let stock = serve.call("GET", "/items/kiwi", None, "").await;
    assert_eq!(stock.json["fence"], "0");
    let editors = serve.call("GET", "/items/kiwi/editors", None, "").await;
    assert_eq!(editors.json["editors"], serde_json::json!([]));
}

/// The SDK's `with_lock` with `keep_alive` between steps, in the function:
/// a job of 5 × 150 ms under a lock of 300 ms keeps it to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_audit_keeps_its_lock_alive_by_hand_past_its_ttl() {
    let serve = Serve::start(&[]);
    let audit = serve.call(
        "POST",
        "/items/fig/audit?steps=5&step_ms=150&ttl_ms=300",
        None,
        "",
    );
    let meanwhile = async {
        // Past the lock's first TTL: without keep_alive it would be free.
        tokio::time::sleep(std::time::Duration::from_millis(450)).await;
        serve
            .call("POST", "/items/fig/adjust?delta=-1", None, "")
            .await
    };
    let (audit, meanwhile) = tokio::join!(audit, meanwhile);
    assert_eq!(audit.status, 200, "{}", audit.json);
    assert_eq!(audit.json["steps"], 5);
    assert_eq!(meanwhile.status, 409, "still held: {}", meanwhile.json);
    assert_eq!(meanwhile.json["holderFence"], audit.json["fence"]);
    let after = serve
        .call("POST", "/items/fig/adjust?delta=-1", None, "")
        .await;
    assert_eq!(after.status, 200, "released at the end: {}", after.json);
    let limits = serve
        .call("POST", "/items/fig/audit?steps=21", None, "")
        .await;
    assert_eq!(limits.status, 400);
    assert_eq!(limits.json["field"], "steps");
}
