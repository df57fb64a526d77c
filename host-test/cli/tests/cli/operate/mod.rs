//! The operator commands (`coord lock`, `coord ephemeral`, `coord limit`)
//! against Redis: what they print, as a table and as JSON, and their exit
//! codes. The state is made through the component, as functions make it.

use crate::common;

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use common::{redis_config, redis_url};
use coord_host::Runtime;
use coord_host::ephemeral::Space;
use coord_host::lock::{AcquireOptions, AcquireOutcome};
use coord_host::ratelimit::Limiter;
use coord_redis::RedisBackend;
use serde_json::Value;

/// Run `coord ARGS --redis URL --prefix PREFIX`, feeding `stdin`.
fn coord(args: &[&str], url: &str, prefix: &str, stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_coord"))
        .args(args)
        .args(["--redis", url, "--prefix", prefix])
        .env("COORD_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn json(output: &Output) -> Value {
    let text = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {text} / {}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_ephemeral_and_limit_commands_see_and_change_what_functions_see() {
    let url = redis_url().await;
    let config = redis_config(&url, 64, None);
    let prefix = config.prefix.clone();
    let backend = Arc::new(RedisBackend::connect(config).await.unwrap());
    let mut i = Runtime::new(backend).unwrap().instantiate().await.unwrap();
    let options = AcquireOptions::new().ttl_ms(60_000).no_wait();
    let AcquireOutcome::Acquired(lock) = i
        .lock()
        .acquire("inventory.stock", "item:9", options)
        .await
        .unwrap()
        .unwrap()
    else {
        panic!("acquire")
    };

    let inspected = coord(
        &["lock", "inspect", "inventory.stock", "item:9", "--json"],
        &url,
        &prefix,
        "",
    );
    assert!(inspected.status.success());
    let seen = json(&inspected);
    assert_eq!(seen["held"], true);
    assert_eq!(seen["fence"], lock.fence.to_string());
    let table = coord(
        &["lock", "inspect", "inventory.stock", "item:9"],
        &url,
        &prefix,
        "",
    );
    assert!(String::from_utf8_lossy(&table.stdout).contains(&format!("fence  {}", lock.fence)));

    // Declined at the prompt: exit 1, still held.
    let declined = coord(
        &["lock", "release", "--force", "inventory.stock", "item:9"],
        &url,
        &prefix,
        "n\n",
    );
    assert_eq!(declined.status.code(), Some(1));
    assert!(
        i.lock().is_held(&lock).await.unwrap().unwrap(),
        "not released"
    );
    let without_force = coord(
        &["lock", "release", "inventory.stock", "item:9"],
        &url,
        &prefix,
        "",
    );
    assert_eq!(without_force.status.code(), Some(2), "--force is required");
    let released = coord(
        &[
            "lock",
            "release",
            "--force",
            "--yes",
            "inventory.stock",
            "item:9",
            "--json",
        ],
        &url,
        &prefix,
        "",
    );
    assert!(released.status.success());
    assert_eq!(json(&released)["released"], true);
    assert!(!i.lock().is_held(&lock).await.unwrap().unwrap(), "freed");
    assert!(
        !i.lock().release(&lock).await.unwrap().unwrap(),
        "the holder lost it"
    );

    let editors = Space {
        id: "inventory.editors".into(),
        ttl_ms: 30_000,
        max_value_bytes: 4096,
    };
    i.ephemeral()
        .upsert(&editors, "item:9", "s1", br#"{"user":"ada"}"#)
        .await
        .unwrap()
        .unwrap();
    let listed = coord(
        &["ephemeral", "list", "inventory.editors", "item:9", "--json"],
        &url,
        &prefix,
        "",
    );
    assert!(listed.status.success());
    let listed = json(&listed);
    assert_eq!(listed["entries"][0]["key"], "s1");
    assert_eq!(listed["entries"][0]["value"], r#"{"user":"ada"}"#);
    let watched = coord(
        &[
            "ephemeral",
            "watch",
            "inventory.editors",
            "item:9",
            "--for-ms",
            "300",
        ],
        &url,
        &prefix,
        "",
    );
    assert!(watched.status.success());
    let first: Value = serde_json::from_str(
        String::from_utf8_lossy(&watched.stdout)
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        (first["type"].as_str(), first["key"].as_str()),
        (Some("upsert"), Some("s1"))
    );

    let limiter = Limiter {
        id: "inventory.exports".into(),
        limit: 10,
        window_ms: 60_000,
        algorithm: None,
    };
    for _ in 0..3 {
        i.ratelimit()
            .check(&limiter, "user:ann", None)
            .await
            .unwrap()
            .unwrap();
    }
    let limit = [
        "inventory.exports",
        "user:ann",
        "--limit",
        "10",
        "--window",
        "60000",
        "--json",
    ];
    let peeked = coord(
        &[&["limit", "peek"][..], &limit].concat(),
        &url,
        &prefix,
        "",
    );
    assert_eq!(json(&peeked)["remaining"], 7, "peek counts nothing");
    let reset = coord(
        &[&["limit", "reset"][..], &limit].concat(),
        &url,
        &prefix,
        "",
    );
    assert_eq!(json(&reset)["remaining"], 10);
    assert_eq!(
        i.ratelimit()
            .peek(&limiter, "user:ann")
            .await
            .unwrap()
            .unwrap()
            .remaining,
        10,
        "functions see the reset"
    );
    common::delete_prefix(&url, &prefix);
}

#[test]
fn operator_commands_refuse_the_in_memory_store_and_bad_input() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_coord"))
            .args(args)
            .env_remove("COORD_REDIS_URL")
            .env("COORD_LOG", "warn")
            .output()
            .unwrap()
    };
    let memory = run(&["lock", "inspect", "a", "b"]);
    assert_eq!(memory.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&memory.stderr).contains("--redis"));
    let missing = run(&["limit", "peek", "l", "k", "--window", "10"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("--limit"));
    for command in [
        &["lock", "--help"][..],
        &["ephemeral", "--help"],
        &["limit", "--help"],
    ] {
        assert!(run(command).status.success());
    }
}

/// A `coord ARGS --redis URL --prefix PREFIX` process, its pipes open.
fn spawn_coord(args: &[&str], url: &str, prefix: &str) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_coord"))
        .args(args)
        .args(["--redis", url, "--prefix", prefix])
        .env("COORD_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Wait for `child` with a generous watchdog (a deadlock detector, not a
/// speed target: the machine may be busy); kill it and fail past it.
fn wait_bounded(mut child: std::process::Child, what: &str) -> Output {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("{what} did not finish within 90 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

async fn instance_on(url: &str) -> (coord_host::Instance, String) {
    let config = redis_config(url, 64, None);
    let prefix = config.prefix.clone();
    let backend = Arc::new(RedisBackend::connect(config).await.unwrap());
    (
        Runtime::new(backend).unwrap().instantiate().await.unwrap(),
        prefix,
    )
}

async fn take(
    i: &mut coord_host::Instance,
    id: &str,
    resource: &str,
) -> coord_host::lock::HeldLock {
    let options = AcquireOptions::new().ttl_ms(60_000).no_wait();
    match i
        .lock()
        .acquire(id, resource, options)
        .await
        .unwrap()
        .unwrap()
    {
        AcquireOutcome::Acquired(lock) => lock,
        AcquireOutcome::Busy(h) => panic!("busy at fence {}", h.fence),
    }
}

mod errors;
mod hostile;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_commands_show_the_permits_and_free_exactly_the_one_named() {
    use coord_host::semaphore::{AcquireOptions, AcquireOutcome};
    let url = redis_url().await;
    let config = redis_config(&url, 64, None);
    let prefix = config.prefix.clone();
    let backend = Arc::new(RedisBackend::connect(config).await.unwrap());
    let mut i = Runtime::new(backend).unwrap().instantiate().await.unwrap();
    let mut permits = Vec::new();
    for _ in 0..2 {
        let options = AcquireOptions::new().ttl_ms(60_000).no_wait();
        let outcome = i.semaphore().acquire("partner.api", "tenant:1", 3, options);
        let AcquireOutcome::Acquired(permit) = outcome.await.unwrap().unwrap() else {
            panic!("acquire")
        };
        permits.push(permit);
    }
    let args = ["semaphore", "inspect", "partner.api", "tenant:1"];
    let inspected = coord(&[&args[..], &["--json"]].concat(), &url, &prefix, "");
    assert!(inspected.status.success());
    let seen = json(&inspected);
    let fences: Vec<String> = permits.iter().map(|p| p.fence.to_string()).collect();
    assert_eq!(seen["permits"][0]["fence"], fences[0]);
    assert_eq!(seen["permits"][1]["fence"], fences[1]);
    assert_eq!(seen["permits"][1]["limit"], 3);
    let table = String::from_utf8_lossy(&coord(&args, &url, &prefix, "").stdout).to_string();
    assert!(table.contains("held   2"), "{table}");
    assert!(
        !table.contains(&permits[0].owner),
        "no owner token is shown"
    );

    let release = ["semaphore", "release", "--force", "partner.api", "tenant:1"];
    let declined = coord(
        &[&release[..], &[&fences[0]]].concat(),
        &url,
        &prefix,
        "n\n",
    );
    assert_eq!(declined.status.code(), Some(1));
    assert!(i.semaphore().is_held(&permits[0]).await.unwrap().unwrap());
    let released = coord(
        &[&release[..], &["--yes", &fences[0], "--json"]].concat(),
        &url,
        &prefix,
        "",
    );
    assert!(released.status.success());
    assert_eq!(json(&released)["released"], true);
    assert!(
        !i.semaphore().is_held(&permits[0]).await.unwrap().unwrap(),
        "freed"
    );
    assert!(
        i.semaphore().is_held(&permits[1]).await.unwrap().unwrap(),
        "only that one"
    );
    let again = coord(
        &[&release[..], &["--yes", &fences[0]]].concat(),
        &url,
        &prefix,
        "",
    );
    assert_eq!(again.status.code(), Some(1), "no live permit at that fence");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rwlock_commands_show_the_writer_waiting_and_free_exactly_the_grant_named() {
    use coord_host::rwlock::{AcquireOptions, AcquireOutcome, Mode};
    let url = redis_url().await;
    let config = redis_config(&url, 64, None);
    let prefix = config.prefix.clone();
    let backend = Arc::new(RedisBackend::connect(config).await.unwrap());
    let runtime = Runtime::new(backend).unwrap();
    let mut i = runtime.instantiate().await.unwrap();
    let options = AcquireOptions::new().ttl_ms(60_000).no_wait();
    let mut readers = Vec::new();
    for _ in 0..2 {
        let outcome = i.rwlock().acquire("catalog", "all", Mode::Read, options);
        let AcquireOutcome::Acquired(grant) = outcome.await.unwrap().unwrap() else {
            panic!("acquire")
        };
        readers.push(grant);
    }
    // A writer waiting for them, on an instance of its own.
    let mut w = runtime.instantiate().await.unwrap();
    let writer = tokio::spawn(async move {
        let wait = AcquireOptions::new().ttl_ms(60_000).wait_up_to(600_000);
        let outcome = w.rwlock().acquire("catalog", "all", Mode::Write, wait);
        outcome.await.unwrap().unwrap()
    });
    let args = ["rwlock", "inspect", "catalog", "all"];
    let seen = loop {
        let inspected = coord(&[&args[..], &["--json"]].concat(), &url, &prefix, "");
        assert!(inspected.status.success());
        let seen = json(&inspected);
        if !seen["writer"].is_null() {
            break seen;
        }
        assert!(
            !writer.is_finished(),
            "the writer got in beside two readers"
        );
    };
    let fences: Vec<String> = readers.iter().map(|g| g.fence.to_string()).collect();
    assert_eq!(seen["readers"][0]["fence"], fences[0]);
    assert_eq!(seen["readers"][1]["fence"], fences[1]);
    assert_eq!(seen["writer"]["waiting"], true);
    let table = String::from_utf8_lossy(&coord(&args, &url, &prefix, "").stdout).to_string();
    assert!(table.contains("readers 2"), "{table}");
    assert!(table.contains("writer waiting"), "{table}");
    assert!(
        !table.contains(&readers[0].owner),
        "no owner token is shown"
    );

    let release = ["rwlock", "release", "--force", "catalog", "all"];
    let declined = coord(
        &[&release[..], &[&fences[0]]].concat(),
        &url,
        &prefix,
        "n\n",
    );
    assert_eq!(declined.status.code(), Some(1));
    assert!(i.rwlock().is_held(&readers[0]).await.unwrap().unwrap());
    for fence in &fences {
        let released = coord(
            &[&release[..], &["--yes", fence, "--json"]].concat(),
            &url,
            &prefix,
            "",
        );
        assert!(released.status.success());
        assert_eq!(json(&released)["released"], true);
    }
    // Both readers freed by the operator: the waiting writer gets in.
    let AcquireOutcome::Acquired(granted) = writer.await.unwrap() else {
        panic!("the writer stayed busy");
    };
    assert!(!i.rwlock().is_held(&readers[0]).await.unwrap().unwrap());
    let shown = json(&coord(
        &[&args[..], &["--json"]].concat(),
        &url,
        &prefix,
        "",
    ));
    assert_eq!(shown["writer"]["fence"], granted.fence.to_string());
    assert_eq!(shown["writer"]["waiting"], false);
    let again = coord(
        &[&release[..], &["--yes", &fences[0]]].concat(),
        &url,
        &prefix,
        "",
    );
    assert_eq!(again.status.code(), Some(1), "no live grant at that fence");
}
