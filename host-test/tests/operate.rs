//! The operator commands (`coord lock`, `coord ephemeral`, `coord limit`)
//! against Redis: what they print, as a table and as JSON, and their exit
//! codes. The state is made through the component, as functions make it.

#![allow(clippy::unwrap_used)] // tests may unwrap: a panic is the failure report

mod common;

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use common::{redis_config, redis_url};
use coord_host::Runtime;
use coord_host::backend::redis::RedisBackend;
use coord_host::ephemeral::Space;
use coord_host::lock::{AcquireOptions, AcquireOutcome};
use coord_host::ratelimit::Limiter;
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
    assert!(i.is_held(&lock).await.unwrap().unwrap(), "not released");
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
    assert!(!i.is_held(&lock).await.unwrap().unwrap(), "freed");
    assert!(
        !i.release(&lock).await.unwrap().unwrap(),
        "the holder lost it"
    );

    let editors = Space {
        id: "inventory.editors".into(),
        ttl_ms: 30_000,
        max_value_bytes: 4096,
    };
    i.upsert(&editors, "item:9", "s1", br#"{"user":"ada"}"#)
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
        i.check(&limiter, "user:ann", None).await.unwrap().unwrap();
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
        i.peek(&limiter, "user:ann")
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
    match i.acquire(id, resource, options).await.unwrap().unwrap() {
        AcquireOutcome::Acquired(lock) => lock,
        AcquireOutcome::Busy(h) => panic!("busy at fence {}", h.fence),
    }
}

/// Outside testers (7): the prompt showed fence F1; while it waited, F1 was
/// released and the lock taken again (F2) elsewhere; `y` then freed F2, a
/// holder the operator never saw. The release is now guarded by the holder
/// shown (fence and owner): it frees nothing and names the new holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_frees_only_the_holder_it_showed() {
    let url = redis_url().await;
    let (mut i, prefix) = instance_on(&url).await;
    for json in [false, true] {
        let resource = format!("item:swap-{json}");
        let first = take(&mut i, "inventory.stock", &resource).await;
        let mut args = vec!["lock", "release", "--force", "inventory.stock", &resource];
        if json {
            args.push("--json");
        }
        let mut child = spawn_coord(&args, &url, &prefix);
        // Read the prompt as it is written (it ends without a newline).
        let mut stderr = child.stderr.take().unwrap();
        let (prompted, prompt) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut byte = [0u8; 1];
            let mut sent = false;
            while let Ok(1) = std::io::Read::read(&mut stderr, &mut byte) {
                seen.push(byte[0]);
                if !sent && seen.ends_with(b"[y/N] ") {
                    let _ = prompted.send(String::from_utf8_lossy(&seen).into_owned());
                    sent = true;
                }
            }
            String::from_utf8_lossy(&seen).into_owned()
        });
        let shown = prompt
            .recv_timeout(std::time::Duration::from_secs(90))
            .expect("the prompt");
        assert!(shown.contains(&first.fence.to_string()), "{shown}");
        // Meanwhile, elsewhere: F1 is released and the lock taken again.
        assert!(i.release(&first).await.unwrap().unwrap());
        let second = take(&mut i, "inventory.stock", &resource).await;
        assert!(second.fence > first.fence);
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"y\n").unwrap();
        drop(stdin);
        let output = wait_bounded(child, "lock release");
        let stderr = reader.join().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(output.status.code(), Some(1), "{stdout} / {stderr}");
        assert!(
            i.is_held(&second).await.unwrap().unwrap(),
            "the holder the operator never saw keeps its lock: {stdout} / {stderr}"
        );
        if json {
            let answer = json_text(&stdout);
            assert_eq!(answer["released"], false, "{answer}");
            assert_eq!(answer["changed"], true, "{answer}");
            assert_eq!(
                answer["shown"]["fence"],
                first.fence.to_string(),
                "{answer}"
            );
            assert_eq!(answer["now"]["fence"], second.fence.to_string(), "{answer}");
        } else {
            let said = format!("{stdout}{stderr}");
            assert!(!said.contains("released inventory.stock"), "{said}");
            assert!(said.contains("not released"), "{said}");
            assert!(said.contains("changed"), "{said}");
            assert!(
                said.contains(&second.fence.to_string()),
                "names the new holder: {said}"
            );
        }
        assert!(i.release(&second).await.unwrap().unwrap());
    }
    common::delete_prefix(&url, &prefix);
}

fn json_text(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// Whether `text` holds a character a terminal would act on or hide: a C0
/// or C1 control, DEL, a bidi control, a zero-width character.
fn raw_control(text: &str) -> Option<char> {
    text.chars().find(|&c| {
        (c.is_control() && c != '\n')
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{2028}' | '\u{2029}' | '\u{feff}')
    })
}

/// Outside testers (8): a client named its editor session
/// `evil\nforged-row\x1b[2J` through the example function; `coord ephemeral
/// list` printed the newline raw (a forged row) and the escape (the screen
/// cleared). Every table now shows such characters escaped; `--json` keeps
/// the exact value, and a value that is not UTF-8 comes out as base64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_clients_wrote_cannot_write_on_the_operators_terminal() {
    let url = redis_url().await;
    let (mut i, prefix) = instance_on(&url).await;
    let serve = common::serve::Serve::start(&["--redis", &url, "--prefix", &prefix]);
    let put = serve
        .call(
            "PUT",
            "/items/apple/editors/evil%0Aforged-row%1B%5B2J",
            None,
            "{\"name\":\"\u{202e}gnp.exe\u{9b}2J\u{7f}\"}",
        )
        .await;
    assert_eq!(put.status, 200, "{}", put.json);
    let editors = Space {
        id: "inventory.editors".into(),
        ttl_ms: 30_000,
        max_value_bytes: 4096,
    };
    // Bytes that are not UTF-8, as a function in bytes mode may store them.
    i.upsert(&editors, "apple", "binary", &[0xff, 0x00, b'a', 0x80])
        .await
        .unwrap()
        .unwrap();

    let table = coord(
        &["ephemeral", "list", "inventory.editors", "apple"],
        &url,
        &prefix,
        "",
    );
    assert!(table.status.success());
    let text = String::from_utf8(table.stdout).unwrap();
    assert_eq!(raw_control(&text), None, "{text:?}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "a header, two entries, a count: {text}");
    assert!(!text.lines().any(|l| l.starts_with("forged-row")), "{text}");
    assert!(text.contains("evil\\nforged-row\\x1b[2J"), "{text}");
    assert!(text.contains("\\u{202e}gnp.exe\\u{9b}2J\\x7f"), "{text}");
    assert!(text.contains("\\xff\\x00a\\x80"), "{text}");

    let listed = coord(
        &["ephemeral", "list", "inventory.editors", "apple", "--json"],
        &url,
        &prefix,
        "",
    );
    let raw = String::from_utf8(listed.stdout.clone()).unwrap();
    assert_eq!(raw_control(&raw), None, "JSON escapes them too: {raw:?}");
    let listed = json(&listed);
    let entries = listed["entries"].as_array().unwrap();
    let binary = entries.iter().find(|e| e["key"] == "binary").unwrap();
    assert_eq!(binary["valueBase64"], "/wBhgA==", "{binary}");
    assert!(binary.get("value").is_none(), "{binary}");
    let evil = entries
        .iter()
        .find(|e| e["key"] == "evil\nforged-row\x1b[2J")
        .unwrap();
    assert_eq!(
        evil["value"],
        "{\"name\":\"\u{202e}gnp.exe\u{9b}2J\u{7f}\"}"
    );
    assert!(evil.get("valueBase64").is_none(), "{evil}");

    let watched = coord(
        &[
            "ephemeral",
            "watch",
            "inventory.editors",
            "apple",
            "--for-ms",
            "300",
        ],
        &url,
        &prefix,
        "",
    );
    let raw = String::from_utf8(watched.stdout).unwrap();
    assert_eq!(raw_control(&raw), None, "{raw:?}");
    let events: Vec<Value> = raw.lines().map(json_text).collect();
    assert!(
        events
            .iter()
            .any(|e| e["key"] == "binary" && e["valueBase64"] == "/wBhgA=="),
        "{raw}"
    );
    assert!(
        events.iter().any(|e| e["key"] == "evil\nforged-row\x1b[2J"),
        "{raw}"
    );

    // What the operator typed is echoed escaped too, in every table.
    for args in [
        &["lock", "inspect", "inventory.stock", "item:\x1b[2J"][..],
        &[
            "limit",
            "peek",
            "inventory.exports",
            "user:\u{202e}x",
            "--limit",
            "10",
            "--window",
            "60000",
        ],
    ] {
        let out = coord(args, &url, &prefix, "");
        assert!(
            out.status.success(),
            "{:?}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(raw_control(&text), None, "{text:?}");
    }
    common::delete_prefix(&url, &prefix);
}

/// Outside testers (9): the help's tenant example (`item:42`) is not the
/// tenant the example function uses (the bare item), so it listed nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_helps_example_tenant_is_the_one_the_function_uses() {
    let url = redis_url().await;
    let (_i, prefix) = instance_on(&url).await;
    let serve = common::serve::Serve::start(&["--redis", &url, "--prefix", &prefix]);
    let put = serve
        .call("PUT", "/items/apple/editors/s1", None, "{\"user\":\"ada\"}")
        .await;
    assert_eq!(put.status, 200, "{}", put.json);
    for command in ["list", "watch"] {
        let help = Command::new(env!("CARGO_BIN_EXE_coord"))
            .args(["ephemeral", command, "--help"])
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&help.stdout);
        assert!(!help.contains("item:42"), "{help}");
        assert!(help.contains("`apple`"), "{help}");
    }
    let listed = coord(
        &["ephemeral", "list", "inventory.editors", "apple", "--json"],
        &url,
        &prefix,
        "",
    );
    assert_eq!(json(&listed)["entries"][0]["key"], "s1");
    common::delete_prefix(&url, &prefix);
}

/// Outside testers (9): errors printed Rust's Debug form
/// (`Error::InvalidArgument(InvalidArgument { field: "id", … })`); each is
/// now a sentence naming the argument.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_errors_are_sentences_that_name_the_argument() {
    let url = redis_url().await;
    let prefix = format!("coord-operate-errors-{}", std::process::id());
    for (args, says) in [
        (
            &["lock", "inspect", "", "item:1"][..],
            "invalid argument `id`: must not be empty",
        ),
        (
            &["lock", "release", "--force", "--yes", "inventory.stock", ""],
            "invalid argument `resource`: must not be empty",
        ),
        (
            &["ephemeral", "list", "inventory.editors", ""],
            "invalid argument `tenant`: must not be empty",
        ),
        (
            &["ephemeral", "watch", "", "apple"],
            "invalid argument `space`: must not be empty",
        ),
        (
            &[
                "limit",
                "peek",
                "inventory.exports",
                "user:1",
                "--limit",
                "0",
                "--window",
                "1000",
            ],
            "invalid argument `--limit`",
        ),
        (
            &[
                "limit",
                "reset",
                "inventory.exports",
                "user:1",
                "--limit",
                "1",
                "--window",
                "0",
            ],
            "invalid argument `--window`",
        ),
    ] {
        let out = coord(args, &url, &prefix, "");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        for debug in ["Error::", "InvalidArgument {", "field:"] {
            assert!(!stderr.contains(debug), "{args:?}: {stderr}");
        }
    }
    // A store that refuses the connection: a sentence, not Debug.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let refused = coord(
        &["lock", "inspect", "inventory.stock", "item:1"],
        &format!("redis://127.0.0.1:{port}"),
        &prefix,
        "",
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("the store is unavailable"), "{stderr}");
    assert!(!stderr.contains("Error::"), "{stderr}");
}

/// Outside testers (9): `--listen nonsense` exited 1 without naming
/// `--listen`, after compiling the function; a bad `--redis-cluster` was
/// `Error::Unavailable(… InvalidClientConfig)`, exit 1. Both are usage
/// errors now (exit 2, naming the flag) found before any work.
#[test]
fn bad_addresses_are_usage_errors_naming_the_flag() {
    let run = |args: &[&str]| {
        let child = Command::new(env!("CARGO_BIN_EXE_coord"))
            .args(args)
            .env_remove("COORD_REDIS_URL")
            .env_remove("COORD_REDIS_CLUSTER")
            .env_remove("COORD_LISTEN")
            .env("COORD_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_bounded(child, &format!("{args:?}"))
    };
    for (args, flag) in [
        (
            &["serve", "--no-cache", "--listen", "nonsense"][..],
            "--listen",
        ),
        (
            &["serve", "--no-cache", "--listen", "127.0.0.1:99999"],
            "--listen",
        ),
        (
            &[
                "serve",
                "--no-cache",
                "--listen",
                "127.0.0.1:0",
                "--admin",
                "nonsense",
            ],
            "--admin",
        ),
        (
            &[
                "serve",
                "--no-cache",
                "--redis-cluster",
                "redis://127.0.0.1:7301,:7302",
            ],
            "--redis-cluster",
        ),
        (
            &[
                "lock",
                "inspect",
                "a",
                "b",
                "--redis-cluster",
                "redis://127.0.0.1:7301,127.0.0.1:notaport",
            ],
            "--redis-cluster",
        ),
        (
            &[
                "lock",
                "inspect",
                "a",
                "b",
                "--redis-cluster",
                "http://127.0.0.1:7301",
            ],
            "--redis-cluster",
        ),
        (
            &["lock", "inspect", "a", "b", "--redis-cluster", " , "],
            "--redis-cluster",
        ),
    ] {
        let out = run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
        assert!(
            String::from_utf8_lossy(&out.stdout).is_empty(),
            "{args:?}: did work"
        );
    }
}

/// Outside testers (9): `--redis-cluster` seeds as `redis-cli --cluster`
/// prints them (no scheme after the first) are the first seed's kind.
#[test]
fn cluster_seeds_without_a_scheme_take_the_first_seeds() {
    let url = common::redis_cluster_url();
    let mut seeds = url.split(',');
    let first = seeds.next().unwrap().to_string();
    let rest: Vec<&str> = seeds
        .map(|seed| seed.trim().strip_prefix("redis://").unwrap_or(seed))
        .collect();
    let listed = [first.as_str()]
        .into_iter()
        .chain(rest)
        .collect::<Vec<_>>()
        .join(",");
    let child = Command::new(env!("CARGO_BIN_EXE_coord"))
        .args(["lock", "inspect", "inventory.stock", "item:1", "--json"])
        .args(["--redis-cluster", &listed])
        .env("COORD_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_bounded(child, "lock inspect on a cluster");
    assert!(
        out.status.success(),
        "{listed}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json(&out)["held"], false);
}

/// Outside testers (9): with Redis hung, operator commands gave up after
/// 6.6 s where README states 2 s. A listener that accepts and never
/// answers: each command fails with a sentence saying so (its time is not
/// asserted: the machine may be busy; the watchdog only catches a hang).
#[test]
fn a_store_that_never_answers_is_given_up_on_with_a_sentence() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            held.push(stream); // accepted, never read, never answered
        }
    });
    let children: Vec<_> = [
        &["lock", "inspect", "inventory.stock", "item:1"][..],
        &[
            "lock",
            "release",
            "--force",
            "--yes",
            "inventory.stock",
            "item:1",
        ],
        &["ephemeral", "list", "inventory.editors", "apple"],
        &["ephemeral", "watch", "inventory.editors", "apple"],
        &[
            "limit",
            "peek",
            "inventory.exports",
            "user:1",
            "--limit",
            "10",
            "--window",
            "60000",
        ],
    ]
    .into_iter()
    .map(|args| (args, spawn_coord(args, &url, "hung")))
    .collect();
    for (args, child) in children {
        let out = wait_bounded(child, &format!("{args:?}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains("the store did not answer within 2 s"),
            "{args:?}: {stderr}"
        );
    }
}
