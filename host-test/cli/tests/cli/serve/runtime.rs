//! The runtime around a function: the instance pool, traps, the deadline,
//! the compile cache, a store that goes down, and a graceful stop.

use super::compose::{HELLO_FUNCTION, get_raw};
use std::process::Command;

use super::Prefix;
use crate::common;
use crate::process::{Reply, Serve};

#[tokio::test]
async fn a_pool_sized_for_one_request_serves_one_request() {
    // The pool is sized from the function's bytes; wasmtime's own adapter
    // modules between the composed components are not in them, and a pool
    // counted without them once answered every request 503.
    let inventory = Serve::start(&["--max-requests", "1"]);
    let reply = inventory.call("GET", "/items/fig", None, "").await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    let hello = Serve::start(&[HELLO_FUNCTION, "--max-requests", "1"]);
    let reply = get_raw(&hello, "/").await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_that_traps_before_responding_costs_a_500_not_a_hung_request_or_its_instance() {
    // Two instances in the pool: had a trapped request kept its instance
    // (it once did, and hung until the client gave up), the third would
    // find none.
    let serve = Serve::start(&[HELLO_FUNCTION, "--max-requests", "2"]);
    for _ in 0..6 {
        let reply = get_raw(&serve, "/trap").await;
        assert!(reply.starts_with("HTTP/1.1 500"), "{reply}");
        assert!(reply.contains("the function trapped"), "{reply}");
        // The kind of trap, not the function's backtrace (the log has it).
        assert!(reply.contains("unreachable"), "{reply}");
        assert!(!reply.contains("backtrace"), "{reply}");
    }
    let reply = get_raw(&serve, "/").await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.ends_with("\r\n\r\nhello"), "{reply}");
}

/// `coord serve --cache-dir DIR` started in `cwd`, read until it listens,
/// then stopped: its compile-cache log line's (modules loaded, modules
/// compiled).
fn start_with_cache(cwd: &std::path::Path, args: &[&str]) -> (u64, u64) {
    use std::io::{BufRead, BufReader, Read};
    let mut child = Command::new(env!("CARGO_BIN_EXE_coord"))
        .current_dir(cwd)
        .arg("serve")
        .args(args)
        .args(["--listen", "127.0.0.1:0"])
        .env("COORD_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    for line in stdout.lines() {
        if line.unwrap().contains("listening on") {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let mut log = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    let field = |name: &str| -> u64 {
        let at = log
            .find(&format!("{name}="))
            .unwrap_or_else(|| panic!("no {name} in the log: {log}"));
        log[at + name.len() + 1..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    (field("modules_loaded"), field("modules_compiled"))
}

/// The second start of the same function loads what the first compiled;
/// `--no-cache` keeps nothing.
#[test]
fn a_second_start_loads_the_compiled_function_from_the_cache() {
    let dir = std::env::temp_dir().join(format!("coord-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cache = dir.to_str().unwrap();
    let here = std::env::temp_dir();
    let (loaded, compiled) = start_with_cache(&here, &["--cache-dir", cache]);
    assert_eq!(loaded, 0, "an empty cache loaded something");
    assert!(compiled > 0, "the first start compiled nothing");
    let (loaded, compiled) = start_with_cache(&here, &["--cache-dir", cache]);
    assert_eq!(compiled, 0, "the second start compiled again");
    assert!(loaded > 0, "the second start loaded nothing");

    // A relative directory is the working directory's (wasmtime's cache
    // takes only absolute ones: it was a warning and no cache at all).
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    start_with_cache(&work, &["--cache-dir", "relative"]);
    let (loaded, compiled) = start_with_cache(&work, &["--cache-dir", "relative"]);
    assert_eq!(compiled, 0, "a relative --cache-dir kept nothing");
    assert!(loaded > 0 && work.join("relative").is_dir());
    let _ = std::fs::remove_dir_all(&dir);

    let untouched = dir.join("untouched");
    let mut child = Command::new(env!("CARGO_BIN_EXE_coord"))
        .args(["serve", "--no-cache", "--listen", "127.0.0.1:0"])
        .env("XDG_CACHE_HOME", &untouched)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    for line in std::io::BufRead::lines(stdout) {
        if line.unwrap().contains("listening on") {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!untouched.exists(), "--no-cache wrote a cache");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_every_route_answers_503_and_work_resumes_after() {
    let mut server = common::RedisServer::spawn().unwrap();
    let url = server.url();
    let serve = Serve::start(&["--redis", url.as_str()]);
    let before = serve
        .call("POST", "/items/fig/adjust?delta=-1", None, "")
        .await;
    assert_eq!(before.status, 200, "{}", before.json);

    server.stop();
    // Unreachable is unavailable: never "busy", never a write, never a 429.
    let requests = [
        ("POST", "/items/fig/adjust?delta=-1", None, ""),
        ("POST", "/items/fig/lock", None, ""),
        ("POST", "/exports", Some("ann"), ""),
        ("PUT", "/items/fig/editors/s1", None, "{}"),
        ("GET", "/items/fig/editors", None, ""),
        ("GET", "/items/fig", None, ""),
    ];
    for (method, path, user, body) in requests {
        let reply = serve.call(method, path, user, body).await;
        assert_eq!(reply.status, 503, "{method} {path}: {}", reply.json);
    }

    // Restarted empty: the connection is re-made in the background, and the
    // fence still grows (revisions are seeded from the clock).
    server.start().unwrap();
    let mut after = None;
    for _ in 0..100 {
        let reply = serve
            .call("POST", "/items/fig/adjust?delta=-1", None, "")
            .await;
        if reply.status == 200 {
            after = Some(reply);
            break;
        }
        assert_eq!(
            reply.status, 503,
            "only unavailable while reconnecting: {}",
            reply.json
        );
        tokio::task::yield_now().await;
    }
    let after = after.expect("work resumes once Redis answers");
    let fence = |reply: &Reply| -> u64 { reply.json["fence"].as_str().unwrap().parse().unwrap() };
    assert!(
        fence(&after) > fence(&before),
        "fences stay monotonic across the restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_beyond_the_instance_limit_gets_503_until_one_frees() {
    let prefix = Prefix::new("full").await;
    let shared = [
        "--redis",
        prefix.url.as_str(),
        "--prefix",
        prefix.name.as_str(),
    ];
    let limited = Serve::start(&[&shared[..], &["--max-requests", "2"]].concat());
    let other = Serve::start(&shared);
    let snapshot = other.call("GET", "/items/box/editors", None, "").await;
    let watch = format!(
        "/items/box/editors/watch?after={}&timeout_ms=30000",
        snapshot.json["revision"].as_str().unwrap()
    );
    // A watch holds its instance until a change arrives; one that raced the
    // probe below for a slot is answered 503 and tries again.
    let hold = || async {
        loop {
            let reply = limited.call("GET", &watch, None, "").await;
            if reply.status != 503 {
                return reply;
            }
        }
    };
    let probe = async {
        let mut refused = None;
        for _ in 0..5000 {
            let reply = limited.call("GET", "/items/box", None, "").await;
            if reply.status == 503 {
                refused = Some(reply);
                break;
            }
            tokio::task::yield_now().await;
        }
        // Wake both watches through the other process.
        let joined = other.call("PUT", "/items/box/editors/s1", None, "{}").await;
        assert_eq!(joined.status, 200, "{}", joined.json);
        refused
    };
    let (first, second, refused) = tokio::join!(hold(), hold(), probe);
    let refused = refused.expect("with both instances held, a third request is refused");
    assert_eq!(refused.json["field"], "runtime", "{}", refused.json);
    for watched in [first, second] {
        assert_eq!(watched.status, 200, "{}", watched.json);
        assert_eq!(
            watched.json["events"][0]["type"], "upsert",
            "{}",
            watched.json
        );
    }
    // The instances are back in the pool: requests are served again.
    let mut served = false;
    for _ in 0..1000 {
        if limited.call("GET", "/items/box", None, "").await.status == 200 {
            served = true;
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(served, "requests are served once the watches returned");
    drop((limited, other));
    common::delete_prefix(&prefix.url, &prefix.name);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_waiting_past_the_deadline_gets_504_and_frees_its_instance() {
    // One instance and a 1 s deadline: an acquire waiting 20 s on a held
    // lock, and a watch long-polling 30 s, wait in host calls, where the
    // engine's epoch cannot stop them. The deadline must.
    let serve = Serve::start(&["--deadline-ms", "1000", "--max-requests", "1"]);
    // A request's instance is freed just after its response is sent, so the
    // next request may find it still taken for a moment: retry a 503 briefly
    // (a slot a waiting request kept would stay taken for 20 s).
    let when_free = |method: &'static str, path: String| {
        let serve = &serve;
        async move {
            for _ in 0..200 {
                let reply = serve.call(method, &path, None, "").await;
                if reply.status != 503 {
                    return reply;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            panic!("{method} {path}: no instance was freed within 2 s");
        }
    };
    let held = when_free("POST", "/items/plum/lock?ttl_ms=60000".into()).await;
    assert_eq!(held.status, 200, "{}", held.json);
    let watched = when_free("GET", "/items/plum/editors".into()).await;
    let watch = format!(
        "/items/plum/editors/watch?timeout_ms=30000&after={}",
        watched.json["revision"].as_str().unwrap()
    );
    for (method, path) in [
        ("POST", "/items/plum/adjust?delta=1&wait_ms=20000"),
        ("GET", watch.as_str()),
    ] {
        let started = std::time::Instant::now();
        let reply = when_free(method, path.to_string()).await;
        let took = started.elapsed();
        assert_eq!(reply.status, 504, "{path}: {}", reply.json);
        assert_eq!(reply.json["field"], "runtime", "{}", reply.json);
        let (least, most) = (
            std::time::Duration::from_millis(900),
            std::time::Duration::from_secs(5),
        );
        assert!(
            took >= least && took < most,
            "{path}: answered after {took:?}"
        );
        // The one instance is free again.
        let served = when_free("GET", "/items/plum".into()).await;
        assert_eq!(served.status, 200, "{}", served.json);
    }
}

/// SIGTERM while a request runs: the server stops accepting, lets the
/// running request finish within the grace period, and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_running_requests_finish_then_exits_zero() {
    let mut serve = Serve::start(&["--grace-ms", "5000"]);
    let address = serve.address.clone();
    let running = serve.call(
        "POST",
        "/items/kiwi/audit?steps=4&step_ms=250&ttl_ms=10000",
        None,
        "",
    );
    let stop = async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        serve.terminate();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        // No longer accepting.
        tokio::net::TcpStream::connect(&address).await.is_err()
    };
    let (finished, refused) = tokio::join!(running, stop);
    assert_eq!(finished.status, 200, "not cut off: {}", finished.json);
    assert_eq!(finished.json["steps"], 4);
    assert!(refused, "new connections are refused after SIGTERM");
    let status = serve.wait();
    assert!(status.success(), "exits 0: {status:?}");
}
