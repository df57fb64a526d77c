//! The operator's mistakes: errors are sentences naming the argument, bad
//! addresses are usage errors, and a store that never answers is given up
//! on as the README says.

use std::process::{Command, Stdio};

use super::{coord, instance_on, json, spawn_coord, wait_bounded};
use crate::common::{self, redis_url};

/// Outside testers (9): the help's tenant example (`item:42`) is not the
/// tenant the example function uses (the bare item), so it listed nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_helps_example_tenant_is_the_one_the_function_uses() {
    let url = redis_url().await;
    let (_i, prefix) = instance_on(&url).await;
    let serve = crate::process::Serve::start(&["--redis", &url, "--prefix", &prefix]);
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
