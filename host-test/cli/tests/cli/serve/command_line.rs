//! The `coord` command line: the demo's scenes on each store, two demos at
//! once, the help, and the README's copy of it.

use std::process::Command;

use crate::common;

/// `coord demo`, the README's story without HTTP, runs its five scenes to
/// the end: the stale write and the old epoch refused, the lease handed over.
#[test]
fn the_demo_runs_its_five_scenes() {
    demo_runs_its_five_scenes(&[]);
}

/// [`the_demo_runs_its_five_scenes`] with its state on NATS.
#[test]
fn the_demo_runs_its_five_scenes_on_nats() {
    let url = common::nats_url();
    demo_runs_its_five_scenes(&["--nats", url.as_str()]);
}

/// [`the_demo_runs_its_five_scenes`] with its state on a Redis Cluster.
#[test]
fn the_demo_runs_its_five_scenes_on_a_redis_cluster() {
    let url = common::redis_cluster_url();
    demo_runs_its_five_scenes(&["--redis-cluster", url.as_str()]);
}

/// Outside testers ran `coord demo --redis URL` twice at once: in every
/// round one demo exited 1 ("the lock ... was lost while the work ran",
/// then, once that was fixed, its lease scene found the other demo's node
/// holding the shared lease). Then four at once: one or two exited 1 in
/// every round (a shared ledger, whose fenced write another demo's epoch
/// refused; waits of 2 s, too short for four demos' turns). Four at once
/// on one Redis all run all five scenes: they wait for each other's locks,
/// and tell their own lease story on their own ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_demos_at_once_on_one_redis_all_succeed() {
    let url = common::redis_url().await;
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || demo_runs_its_five_scenes(&["--redis", url.as_str()]))
        })
        .collect();
    for run in runs {
        run.join().unwrap();
    }
}

fn demo_runs_its_five_scenes(store: &[&str]) {
    let output = Command::new(env!("CARGO_BIN_EXE_coord"))
        .arg("demo")
        .args(store)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{text}\n{stderr}");
    // Errors are sentences, as the operator commands say them.
    assert!(!stderr.contains("Error::"), "{stderr}");
    for line in [
        "write refused",
        "done after 1.5 s, five TTLs; released",
        "took the lease over; the grace has",
        "does not write: node-b holds it",
        "Done.",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
}

/// The command line: help for every command, and errors that name the flag.
#[test]
fn the_command_line_has_help_and_names_a_bad_flag() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_coord"))
            .args(args)
            .output()
            .unwrap()
    };
    let help = run(&["--help"]);
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for command in ["serve", "compose", "demo"] {
        assert!(text.contains(command), "{text}");
        let sub = run(&[command, "--help"]);
        assert!(sub.status.success(), "{command} --help");
    }
    let bad = run(&["serve", "--max-requests", "0"]);
    assert_eq!(bad.status.code(), Some(2));
    let error = String::from_utf8_lossy(&bad.stderr);
    assert!(error.contains("--max-requests"), "{error}");
    let unknown = run(&["serve", "--no-such-flag"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("--no-such-flag"));
}

/// README shows `coord --help`; it stays what the binary prints.
#[test]
fn the_readme_shows_the_help_coord_prints() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let shown = readme
        .split("$ coord --help\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("README has a `$ coord --help` block");
    let help = Command::new(env!("CARGO_BIN_EXE_coord"))
        .arg("--help")
        .output()
        .unwrap();
    assert_eq!(
        shown.trim_end(),
        String::from_utf8_lossy(&help.stdout).trim_end()
    );
}
