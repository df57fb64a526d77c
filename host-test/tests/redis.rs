//! What only the Redis backend must show: one round trip per call, a layout
//! that fits Redis Cluster, no leaked keys, fences that survive a data-losing
//! restart, and "unavailable" — never "busy" or "acquired" — when Redis is
//! out of reach, with recovery after. Runs on a real `redis-server`.

#![allow(clippy::unwrap_used)] // tests may unwrap: a panic is the failure report

mod common;

use common::no_wait;

use std::sync::Arc;
use std::time::Duration;

use common::stall_proxy::StallProxy;
use common::{RedisServer, bounded, redis_config, redis_url};
use coord_host::backend::redis::{RedisBackend, RedisConfig, slot_of};
use coord_host::backend::{
    Backend, ChangeKind, Condition, Entry, MeterAlgorithm, MeterMode, MeterRequest, Outcome,
    StoreError, WriteReply,
};
use coord_host::lock::*;
use coord_host::{Instance, Runtime};

async fn shared_backend(config: impl FnOnce(RedisConfig) -> RedisConfig) -> Arc<RedisBackend> {
    let url = redis_url().await;
    let backend = RedisBackend::connect(config(redis_config(&url, 64, None)))
        .await
        .unwrap();
    Arc::new(backend)
}

/// A backend on the shared Redis with its own prefix and `retention_ms`, an
/// instance of the component on it, and the prefix and URL (to inspect keys).
async fn with_retention(retention_ms: u64) -> (Arc<RedisBackend>, Instance, String, String) {
    let url = redis_url().await;
    let config = RedisConfig {
        retention_ms,
        ..redis_config(&url, 64, None)
    };
    let prefix = config.prefix.clone();
    let backend = Arc::new(RedisBackend::connect(config).await.unwrap());
    let instance = Runtime::new(backend.clone())
        .unwrap()
        .instantiate()
        .await
        .unwrap();
    (backend, instance, prefix, url)
}

async fn private_server() -> (RedisServer, Arc<RedisBackend>) {
    let server = RedisServer::spawn().expect("these tests start their own redis-server");
    let backend = RedisBackend::connect(redis_config(&server.url(), 64, None))
        .await
        .unwrap();
    (server, Arc::new(backend))
}

/// Put `value` under `key` in partition `p` unconditionally; the entry written.
async fn put(backend: &RedisBackend, key: &str, value: &[u8], ttl_ms: Option<u64>) -> Entry {
    match backend
        .put("p", key, value, ttl_ms, &Condition::Always)
        .await
        .unwrap()
        .outcome
    {
        Outcome::Applied(e) => e,
        other => panic!("an unconditional put was refused: {other:?}"),
    }
}

async fn acquire(i: &mut Instance, options: AcquireOptions) -> Result<AcquireOutcome, Error> {
    i.acquire("inventory.stock", "item:1", options)
        .await
        .expect("no trap")
}

fn held(outcome: Result<AcquireOutcome, Error>) -> HeldLock {
    match outcome {
        Ok(AcquireOutcome::Acquired(lock)) => lock,
        other => panic!("expected acquired, got {other:?}"),
    }
}

/// How many times Redis ran `command`, from `INFO commandstats`.
async fn server_calls(url: &str, command: &str) -> u64 {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    let prefix = format!("cmdstat_{command}:");
    info.lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

#[tokio::test]
async fn every_store_call_is_one_redis_round_trip() {
    bounded(async {
        let (server, backend) = private_server().await;
        backend.now().await.unwrap(); // the first script call loads the script
        backend.get("warm-up", "k").await.unwrap();
        let url = server.url();
        let before = backend.round_trips();
        let (evalsha_before, time_before) = (
            server_calls(&url, "evalsha").await,
            server_calls(&url, "time").await,
        );
        let b = &backend;
        b.now().await.unwrap();
        b.put("p", "k", b"v", Some(1000), &Condition::Absent)
            .await
            .unwrap();
        b.get("p", "k").await.unwrap();
        b.list("p", "").await.unwrap();
        b.touch("p", "k", 1000, &Condition::Always).await.unwrap();
        b.changes("p", 0, 10).await.unwrap();
        b.delete("p", "k", &Condition::Always).await.unwrap();
        assert_eq!(
            backend.round_trips() - before,
            7,
            "seven calls, seven round trips"
        );
        // Redis saw six scripts and one TIME (each script also calls TIME inside).
        assert_eq!(server_calls(&url, "evalsha").await - evalsha_before, 6);
        assert_eq!(server_calls(&url, "time").await - time_before, 1 + 6);

        // Through the component: one store call, one round trip each.
        let runtime = Runtime::new(backend.clone()).unwrap();
        let mut i = runtime.instantiate().await.unwrap();
        let before = backend.round_trips();
        let lock = held(acquire(&mut i, no_wait(5000)).await);
        let ExtendOutcome::Extended(lock) = i.extend(&lock, None).await.unwrap().unwrap() else {
            panic!("lost")
        };
        assert!(i.release(&lock).await.unwrap().unwrap());
        assert_eq!(i.store_calls(), 3);
        assert_eq!(backend.round_trips() - before, 3);
    })
    .await
}

#[tokio::test]
async fn every_key_of_a_partition_hashes_to_one_cluster_slot() {
    assert_eq!(
        slot_of("123456789"),
        12739,
        "the CRC16 of Redis's cluster spec"
    );
    let backend = RedisBackend::connect(RedisConfig::new("redis://127.0.0.1:1")).await;
    assert!(
        matches!(backend, Err(StoreError::Unavailable(_))),
        "nothing listens on port 1"
    );
    let backend = shared_backend(|c| c).await;
    let partitions = [
        "~lock:1:a:b",
        "~{",
        "lock:1:a:b",
        "x{y}z",
        "{",
        "}",
        "}{",
        "{}",
        "",
        "%7B",
        "a%b{c}d",
    ];
    let mut seen = std::collections::HashSet::new();
    for p in partitions {
        let mut keys = backend.keys(p).to_vec();
        keys.extend(backend.unwatched_keys(p));
        let slots: std::collections::HashSet<u16> = keys.iter().map(|k| slot_of(k)).collect();
        assert_eq!(slots.len(), 1, "{p:?}: {keys:?} span slots {slots:?}");
        assert!(
            seen.insert(keys[0].clone()),
            "{p:?} shares keys with another partition"
        );
    }
}

#[tokio::test]
async fn every_key_carries_a_ttl_so_nothing_leaks() {
    bounded(async {
        let (backend, mut i, prefix, url) = with_retention(5_000).await;
        let lock = held(acquire(&mut i, no_wait(3_000)).await);
        // A waiter, so that the release writes the lock's wake-up stream too.
        let partition = coord_component::keys::lock_partition("inventory.stock", "item:1");
        let (b, p) = (backend.clone(), partition.clone());
        let waiter = tokio::spawn(async move { b.wait(&p, lock.fence, 60_000).await });
        while backend.waiters(&partition) != 1 {
            tokio::task::yield_now().await;
        }
        assert!(i.release(&lock).await.unwrap().unwrap());
        assert!(waiter.await.unwrap().unwrap() > lock.fence);
        held(acquire(&mut i, no_wait(3_000)).await);
        backend
            .put("eph", "a", b"v", Some(2_000), &Condition::Always)
            .await
            .unwrap();
        backend
            .put("eph", "b", b"v", Some(1_000), &Condition::Always)
            .await
            .unwrap();
        backend
            .delete("eph", "b", &Condition::Always)
            .await
            .unwrap();

        let client = redis::Client::open(url.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}:*"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            keys.len(),
            5,
            "a lock's partition and wake-up stream, an ephemeral partition's three keys: {keys:?}"
        );
        for key in keys {
            let ttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap();
            // Gone by the last entry's expiry plus the retention, at the latest.
            assert!(ttl > 0 && ttl <= 3_000 + 5_000, "{key} has PTTL {ttl}");
        }
    })
    .await
}

#[tokio::test]
async fn fences_stay_monotonic_across_a_restart_that_lost_the_data() {
    bounded(async {
        let (mut server, backend) = private_server().await;
        let runtime = Runtime::new(backend.clone()).unwrap();
        let mut i = runtime.instantiate().await.unwrap();
        let before = held(acquire(&mut i, no_wait(60_000)).await);

        server.stop();
        server.start().unwrap(); // empty: it persists nothing
        let after = loop {
            match acquire(&mut i, no_wait(60_000)).await {
                Err(Error::Unavailable(_)) => tokio::time::sleep(Duration::from_millis(20)).await,
                other => break held(other),
            }
        };
        assert!(
            after.fence > before.fence,
            "fence {} after the restart <= {}",
            after.fence,
            before.fence
        );

        // FLUSHALL is the same loss without the restart.
        let client = redis::Client::open(server.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
        let flushed = held(acquire(&mut i, no_wait(60_000)).await);
        assert!(flushed.fence > after.fence);
    })
    .await
}

#[tokio::test]
async fn a_killed_connection_is_unavailable_never_busy_or_acquired_then_recovers() {
    bounded(async {
        let (server, backend) = private_server().await;
        let runtime = Runtime::new(backend.clone()).unwrap();
        let (mut holder, mut rival) = (
            runtime.instantiate().await.unwrap(),
            runtime.instantiate().await.unwrap(),
        );
        let lock = held(acquire(&mut holder, no_wait(60_000)).await);

        let client = redis::Client::open(server.url()).unwrap();
        let mut admin = client.get_multiplexed_async_connection().await.unwrap();
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .arg("SKIPME")
            .arg("yes")
            .query_async(&mut admin)
            .await
            .unwrap();
        assert!(killed >= 1, "the backend's connection was killed");

        let mut unavailable = 0;
        let holder_seen = loop {
            match acquire(&mut rival, no_wait(1000)).await {
                Err(Error::Unavailable(_)) => unavailable += 1,
                Ok(AcquireOutcome::Busy(holder)) => break holder,
                other => panic!("a held lock must be busy or unavailable, got {other:?}"),
            }
            assert!(
                unavailable < 50,
                "no recovery after the connection was killed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(holder_seen.fence, lock.fence, "the holder survived");
        assert!(holder.release(&lock).await.unwrap().unwrap());
    })
    .await
}

#[tokio::test]
async fn a_stopped_server_is_unavailable_and_work_resumes_when_it_returns() {
    bounded(async {
        let (mut server, backend) = private_server().await;
        let runtime = Runtime::new(backend.clone()).unwrap();
        let mut i = runtime.instantiate().await.unwrap();
        server.stop();
        for _ in 0..3 {
            match acquire(&mut i, no_wait(1000)).await {
                Err(Error::Unavailable(_)) => {}
                other => panic!("with Redis down: expected unavailable, got {other:?}"),
            }
        }
        let now = backend.now().await;
        assert!(matches!(now, Err(StoreError::Unavailable(_))), "{now:?}");
        server.start().unwrap();
        let mut tries = 0;
        loop {
            match acquire(&mut i, no_wait(1000)).await {
                Ok(AcquireOutcome::Acquired(_)) => break,
                Err(Error::Unavailable(_)) if tries < 100 => tries += 1,
                other => panic!("after the restart: {other:?}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

#[tokio::test]
async fn a_waiter_is_woken_by_the_published_change_not_by_its_recheck() {
    bounded(async {
        // A re-check an hour apart: only the notification can wake the waiter.
        let backend = shared_backend(|c| RedisConfig {
            recheck: Duration::from_secs(3600),
            ..c
        })
        .await;
        // TTLs throughout, so the shared Redis forgets these keys by itself.
        let e = put(&backend, "k", b"v", Some(60_000)).await;
        let b = backend.clone();
        let waiter = tokio::spawn(async move { b.wait("p", e.revision, 3_600_000).await });
        while backend.waiters("p") != 1 {
            tokio::task::yield_now().await;
        }
        let e2 = put(&backend, "k", b"w", Some(60_000)).await;
        assert_eq!(waiter.await.unwrap().unwrap(), e2.revision);
    })
    .await
}

#[tokio::test]
async fn a_lost_notification_delays_a_waiter_only_until_its_recheck() {
    bounded(async {
        let backend = shared_backend(|c| RedisConfig {
            recheck: Duration::from_millis(50),
            ..c
        })
        .await;
        // A re-check every 50 ms bounds the delay of a notification that never comes.
        let e = put(&backend, "k", b"v", Some(60_000)).await;
        let b = backend.clone();
        let waiter = tokio::spawn(async move { b.wait("p", e.revision, 3_600_000).await });
        while backend.waiters("p") != 1 {
            tokio::task::yield_now().await;
        }
        // Change the partition with the notification lost: the same script on
        // the same keys, publishing to a channel nobody listens on.
        let url = redis_url().await;
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let [e_key, x, f, _channel] = backend.keys("p");
        let reply: redis::Value = redis::cmd("EVAL")
            .arg(backend.script_text())
            .arg(3)
            .arg(e_key)
            .arg(x)
            .arg(f)
            .arg("put")
            .arg("")
            .arg("nobody-listens")
            .arg("k")
            .arg("lost")
            .arg(60_000)
            .arg("always")
            .query_async(&mut conn)
            .await
            .unwrap();
        let _ = reply;
        let revision = waiter.await.unwrap().unwrap();
        assert!(revision > e.revision, "the re-check found the change");
        let feed = backend.changes("p", e.revision, 10).await.unwrap();
        assert_eq!(feed.changes.len(), 1);
        assert_eq!(feed.changes[0].kind, ChangeKind::Put);
    })
    .await
}

#[tokio::test]
async fn expiry_runs_on_redis_time_and_wakes_a_waiter() {
    bounded(async {
        let backend = shared_backend(|c| c).await;
        let before = backend.now().await.unwrap();
        let system = coord_host::clock::Clock::now_ms(&coord_host::clock::SystemClock);
        assert!(
            before.abs_diff(system) < 5_000,
            "Redis TIME {before} vs this machine {system}"
        );
        let Outcome::Applied(e) = backend
            .put("p", "k", b"v", Some(30), &Condition::Absent)
            .await
            .unwrap()
            .outcome
        else {
            panic!("put failed");
        };
        // Nobody writes: the expiry itself, on Redis's clock, ends the wait.
        let revision = backend.wait("p", e.revision, 60_000).await.unwrap();
        assert!(revision > e.revision);
        let feed = backend.changes("p", e.revision, 10).await.unwrap();
        assert_eq!(feed.changes[0].kind, ChangeKind::Expire);
        assert_eq!(feed.changes[0].at, e.expires_at.unwrap());
    })
    .await
}

#[tokio::test]
async fn rediss_urls_reach_a_tls_only_server() {
    bounded(async {
        let server = RedisServer::spawn_tls().expect("a TLS redis-server");
        assert!(server.url().starts_with("rediss://"));
        let backend = Arc::new(
            RedisBackend::connect(redis_config(&server.url(), 64, None))
                .await
                .unwrap(),
        );
        let runtime = Runtime::new(backend.clone()).unwrap();
        let mut i = runtime.instantiate().await.unwrap();
        let lock = held(acquire(&mut i, no_wait(5000)).await);
        // The waiter's notification comes over the TLS pub/sub connection.
        let partition = coord_component::keys::lock_partition("inventory.stock", "item:1");
        let (b, p) = (backend.clone(), partition.clone());
        let waiter = tokio::spawn(async move { b.wait(&p, lock.fence, 60_000).await });
        while backend.waiters(&partition) != 1 {
            tokio::task::yield_now().await;
        }
        assert!(i.release(&lock).await.unwrap().unwrap());
        assert!(waiter.await.unwrap().unwrap() > lock.fence);
    })
    .await
}

#[tokio::test]
async fn after_every_ttl_and_the_retention_pass_no_key_remains() {
    bounded(async {
        // Redis's own key expiry runs on real time: a short TTL and retention
        // keep this to a fraction of a second.
        let (backend, mut i, prefix, url) = with_retention(50).await;
        held(acquire(&mut i, no_wait(50)).await);
        backend
            .put("eph", "a", b"v", Some(50), &Condition::Always)
            .await
            .unwrap();
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let pattern = format!("{prefix}:*");
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg(&pattern)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            keys.len(),
            4,
            "a lock's one key and an ephemeral partition's three were written: {keys:?}"
        );
        for _ in 0..250 {
            if keys.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            keys = redis::cmd("KEYS")
                .arg(&pattern)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
        panic!("keys outlived every TTL and the retention: {keys:?}");
    })
    .await
}

#[tokio::test]
async fn a_rate_limit_key_expires_two_windows_after_its_last_use() {
    bounded(async {
        let url = redis_url().await;
        let config = redis_config(&url, 64, None);
        let prefix = config.prefix.clone();
        let backend = Arc::new(RedisBackend::connect(config).await.unwrap());
        let runtime = Runtime::new(backend.clone()).unwrap();
        let mut i = runtime.instantiate().await.unwrap();
        let limiter = coord_host::ratelimit::Limiter {
            id: "inventory.exports".into(),
            limit: 10,
            window_ms: 5_000,
            algorithm: None,
        };
        assert!(
            i.check(&limiter, "user:1", None)
                .await
                .unwrap()
                .unwrap()
                .allowed
        );
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}:*"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(keys.len(), 1, "one key per limited key: {keys:?}");
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&keys[0])
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            ttl > 0 && ttl <= 10_000,
            "the state outlives its two windows: PTTL {ttl}"
        );
    })
    .await
}

#[tokio::test]
async fn a_stall_longer_than_the_ttl_is_unavailable_and_the_late_holder_loses() {
    bounded(async {
        let server = RedisServer::spawn().expect("a private redis-server");
        let port: u16 = server.url().rsplit(':').next().unwrap().parse().unwrap();
        let proxy = StallProxy::start(port).await;
        let via_proxy = RedisConfig {
            response_timeout: Duration::from_millis(150),
            ..redis_config(&format!("redis://127.0.0.1:{}", proxy.port), 64, None)
        };
        let prefix = via_proxy.prefix.clone();
        let stalled_backend = Arc::new(RedisBackend::connect(via_proxy).await.unwrap());
        let direct = RedisConfig {
            prefix,
            ..redis_config(&server.url(), 64, None)
        };
        let direct_backend = Arc::new(RedisBackend::connect(direct).await.unwrap());
        let mut holder = Runtime::new(stalled_backend)
            .unwrap()
            .instantiate()
            .await
            .unwrap();
        let mut rival = Runtime::new(direct_backend)
            .unwrap()
            .instantiate()
            .await
            .unwrap();

        let lock = held(acquire(&mut holder, no_wait(300)).await);
        proxy.stall(true);
        // The holder cannot reach Redis: unavailable, never "extended" or "lost".
        let extend = holder.extend(&lock, Some(10_000)).await.unwrap();
        assert!(matches!(extend, Err(Error::Unavailable(_))), "{extend:?}");
        // Its TTL runs out on Redis's clock; the rival, who can reach Redis, takes over.
        let wait = AcquireOptions {
            ttl_ms: Some(60_000),
            wait: Some(WaitPolicy::Attempts(Retry {
                max_attempts: 20,
                delay_ms: 200,
            })),
        };
        let taken = held(acquire(&mut rival, wait).await);
        assert!(taken.fence > lock.fence);
        proxy.stall(false);
        // Back in touch, the late holder learns it lost the lock; the rival keeps it.
        let release = loop {
            match holder.release(&lock).await.unwrap() {
                Err(Error::Unavailable(_)) => tokio::time::sleep(Duration::from_millis(20)).await,
                other => break other,
            }
        };
        assert_eq!(release, Ok(false));
        let holder_seen = rival
            .inspect("inventory.stock", "item:1")
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(holder_seen.fence, taken.fence);
    })
    .await
}

#[tokio::test]
async fn the_feed_keeps_exactly_its_history_and_its_stream_stays_bounded() {
    bounded(async {
        let url = redis_url().await;
        let backend = RedisBackend::connect(redis_config(&url, 64, None))
            .await
            .unwrap();
        let mut written = Vec::new();
        for i in 0..1000 {
            written.push(
                put(&backend, "k", i.to_string().as_bytes(), Some(60_000))
                    .await
                    .revision,
            );
        }
        // The contract's history, exactly: the last 64 changes and no more.
        let dropped = written[1000 - 65];
        let kept = backend.changes("p", dropped, 100).await.unwrap();
        assert_eq!(kept.changes.len(), 64);
        assert_eq!(kept.changes[0].revision, written[1000 - 64]);
        match backend.changes("p", dropped - 1, 100).await {
            Err(StoreError::HistoryGone(after)) => assert_eq!(after, dropped),
            other => panic!("expected history-gone after {dropped}, got {other:?}"),
        }
        // The stream is trimmed by whole nodes (`MAXLEN ~`), so it holds a
        // little more than the history, never an unbounded tail.
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let [_e, _x, f, _w] = backend.keys("p");
        let len: usize = redis::cmd("XLEN")
            .arg(&f)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            (64..=64 + 200).contains(&len),
            "the stream holds {len} messages"
        );

        // A feed that lost messages behind the writer's back (here, all but
        // the newest) is reported as a gap, never read across.
        let newest = *written.last().unwrap();
        let _: usize = redis::cmd("XTRIM")
            .arg(&f)
            .arg("MAXLEN")
            .arg(1)
            .query_async(&mut conn)
            .await
            .unwrap();
        match backend.changes("p", written[1000 - 3], 100).await {
            Err(StoreError::HistoryGone(after)) => assert_eq!(after, written[1000 - 2]),
            other => panic!("expected history-gone, got {other:?}"),
        }
        let last = backend.changes("p", written[1000 - 2], 100).await.unwrap();
        assert_eq!(last.changes.len(), 1);
        assert_eq!(last.changes[0].revision, newest);
    })
    .await
}

/// The index keeps a lower bound of each expiry, so a sweep re-reads the
/// entries themselves; more of them than one `unpack` takes (512) come due
/// together here, half renewed and half not.
#[tokio::test]
async fn a_sweep_of_more_entries_than_one_slice_expires_exactly_the_due_ones() {
    bounded(async {
        let h = common::redis(4096).await;
        let n = 1300;
        let first = h.backend.now().await.unwrap();
        for i in 0..n {
            let key = format!("k{i:04}");
            h.backend
                .put("p", &key, b"v", Some(100), &Condition::Absent)
                .await
                .unwrap();
        }
        let start = h.backend.changes("p", 0, 1).await.unwrap().changes[0].revision - 1;
        h.advance(50);
        for i in (0..n).step_by(2) {
            let key = format!("k{i:04}");
            h.backend
                .touch("p", &key, 1000, &Condition::Always)
                .await
                .unwrap();
        }
        h.advance(100); // every first TTL has run out; the renewed ones live on
        let live = h.backend.list("p", "").await.unwrap();
        let keys: Vec<String> = live.entries.iter().map(|e| e.key.clone()).collect();
        let renewed: Vec<String> = (0..n).step_by(2).map(|i| format!("k{i:04}")).collect();
        assert_eq!(keys, renewed);
        let feed = h.backend.changes("p", start, 4096).await.unwrap().changes;
        let expired: Vec<(String, u64)> = feed
            .iter()
            .filter(|c| c.kind == ChangeKind::Expire)
            .map(|c| (c.key.clone(), c.at))
            .collect();
        let due: Vec<(String, u64)> = (1..n)
            .step_by(2)
            .map(|i| (format!("k{i:04}"), first + 100))
            .collect();
        assert_eq!(
            expired, due,
            "each unrenewed entry expired once, in key order"
        );
        h.advance(1000);
        assert_eq!(h.backend.list("p", "").await.unwrap().entries, vec![]);
    })
    .await
}

#[tokio::test]
async fn an_entry_without_ttl_keeps_its_partition_until_it_is_gone() {
    bounded(async {
        let url = redis_url().await;
        let backend = RedisBackend::connect(redis_config(&url, 64, None))
            .await
            .unwrap();
        let client = redis::Client::open(url.as_str()).unwrap();
        let conn = client.get_multiplexed_async_connection().await.unwrap();
        let ttls = |keys: Vec<String>, mut conn: redis::aio::MultiplexedConnection| async move {
            let mut out = Vec::new();
            for key in keys {
                let ttl: i64 = redis::cmd("PTTL")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                out.push((key, ttl));
            }
            out
        };
        let [e, x, f, _w] = backend.keys("p");
        put(&backend, "a", b"v", Some(1000)).await;
        put(&backend, "forever", b"v", None).await;
        for (key, ttl) in ttls(vec![e.clone(), x.clone(), f.clone()], conn.clone()).await {
            assert_eq!(
                ttl, -1,
                "{key} must persist while an entry without TTL lives"
            );
        }
        backend
            .delete("p", "forever", &Condition::Always)
            .await
            .unwrap();
        for (key, ttl) in ttls(vec![e, x, f], conn.clone()).await {
            assert!(
                ttl > 0,
                "{key} got its TTL back once the entry without TTL was gone: {ttl}"
            );
        }
    })
    .await
}

#[tokio::test]
async fn killed_connections_and_a_lost_restart_mid_run_grant_nothing_wrongly() {
    use std::collections::{HashMap, HashSet};
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    bounded(async {
        let (mut server, backend) = private_server().await;
        let url = server.url();
        let runtime = Arc::new(Runtime::new(backend).unwrap());
        // The external system: per resource the highest fence seen; a write
        // with a lower one is refused, so work done under a lock that Redis
        // forgot is still ordered.
        let register: Arc<Mutex<HashMap<String, (u64, u64)>>> = Arc::default();
        let fences: Arc<Mutex<HashSet<(String, u64)>>> = Arc::default();
        let (stop, unavailable, accepted) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
        );
        let mut workers = Vec::new();
        for w in 0..8u64 {
            let (runtime, register, fences) = (runtime.clone(), register.clone(), fences.clone());
            let (stop, unavailable, accepted) =
                (stop.clone(), unavailable.clone(), accepted.clone());
            workers.push(tokio::spawn(async move {
                let mut i = runtime.instantiate().await.unwrap();
                let mut n = w;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let resource = format!("item:{}", n % 3);
                    let options = AcquireOptions::new().ttl_ms(2_000).no_wait();
                    let lock = match i.acquire("stock", &resource, options).await.unwrap() {
                        Ok(AcquireOutcome::Acquired(lock)) => lock,
                        Ok(AcquireOutcome::Busy(_)) => continue,
                        Err(Error::Unavailable(_)) => {
                            unavailable.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            continue;
                        }
                        Err(other) => panic!("faults must surface as unavailable, got {other:?}"),
                    };
                    assert!(
                        fences
                            .lock()
                            .unwrap()
                            .insert((resource.clone(), lock.fence)),
                        "a fence was reused"
                    );
                    {
                        let mut cells = register.lock().unwrap();
                        let (value, highest) = cells.entry(resource.clone()).or_default();
                        if lock.fence >= *highest {
                            *highest = lock.fence;
                            *value += 1;
                            accepted.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    match i.release(&lock).await.unwrap() {
                        Ok(_) => {}
                        Err(Error::Unavailable(_)) => {
                            unavailable.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(other) => panic!("faults must surface as unavailable, got {other:?}"),
                    }
                }
            }));
        }
        let client = redis::Client::open(url.as_str()).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        for _ in 0..3 {
            // Kill every client connection while the workers run...
            let mut admin = client.get_multiplexed_async_connection().await.unwrap();
            let _: i64 = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("TYPE")
                .arg("normal")
                .arg("SKIPME")
                .arg("yes")
                .query_async(&mut admin)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // ...then restart Redis empty under them.
        server.stop();
        tokio::time::sleep(Duration::from_millis(100)).await;
        server.start().unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, Ordering::SeqCst);
        for w in workers {
            w.await.unwrap();
        }
        let total: u64 = register.lock().unwrap().values().map(|(v, _)| v).sum();
        assert_eq!(total, accepted.load(Ordering::SeqCst));
        assert!(
            unavailable.load(Ordering::SeqCst) > 0,
            "the faults were seen"
        );
        // Work resumes: every resource can be taken and given back.
        let mut i = runtime.instantiate().await.unwrap();
        for r in 0..3 {
            let options = AcquireOptions {
                ttl_ms: Some(1000),
                wait: Some(WaitPolicy::Attempts(Retry {
                    max_attempts: 30,
                    delay_ms: 200,
                })),
            };
            let lock = loop {
                match i
                    .acquire("stock", &format!("item:{r}"), options)
                    .await
                    .unwrap()
                {
                    Ok(AcquireOutcome::Acquired(lock)) => break lock,
                    Err(Error::Unavailable(_)) => {
                        tokio::time::sleep(Duration::from_millis(20)).await
                    }
                    other => panic!("after recovery: {other:?}"),
                }
            };
            assert!(i.release(&lock).await.unwrap().unwrap());
        }
        eprintln!(
            "mid-run faults: {} writes accepted, {} calls unavailable, {} distinct fences",
            accepted.load(Ordering::SeqCst),
            unavailable.load(Ordering::SeqCst),
            fences.lock().unwrap().len()
        );
    })
    .await
}

#[tokio::test]
async fn a_partition_in_an_older_layout_is_refused_not_misread() {
    bounded(async {
        let url = redis_url().await;
        let backend = RedisBackend::connect(redis_config(&url, 64, None))
            .await
            .unwrap();
        // What the previous script wrote: the meta as text, an entry as text.
        let [e, _x, _f, _w] = backend.keys("p");
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let _: () = redis::pipe()
            .cmd("HSET")
            .arg(&e)
            .arg("#")
            .arg("1796040324174001:1796040324174000:1796040924174:0:-1:1")
            .arg("=k")
            .arg("1796040324174001:1796040324174:-1:v")
            .ignore()
            .cmd("PEXPIRE")
            .arg(&e)
            .arg(60_000)
            .ignore()
            .query_async(&mut conn)
            .await
            .unwrap();
        match backend.get("p", "k").await {
            Err(StoreError::Unavailable(why)) => assert!(why.contains("older layout"), "{why}"),
            other => panic!("expected the layout to be refused, got {other:?}"),
        }
        // Nothing was written over it.
        let meta: String = redis::cmd("HGET")
            .arg(&e)
            .arg("#")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            meta,
            "1796040324174001:1796040324174000:1796040924174:0:-1:1"
        );
    })
    .await
}

#[tokio::test]
async fn a_rate_limit_counted_in_the_older_text_layout_keeps_its_count() {
    bounded(async {
        let url = redis_url().await;
        let backend = RedisBackend::connect(redis_config(&url, 64, None))
            .await
            .unwrap();
        let request = MeterRequest {
            algorithm: MeterAlgorithm::FixedWindow,
            limit: 10,
            window_ms: 3_600_000,
            cost: 1,
            mode: MeterMode::Consume,
        };
        // One request counts, which tells the window's start on Redis's clock.
        let first = backend.meter("p", "k", &request).await.unwrap();
        assert_eq!(first.remaining, 9);
        let start = first.now + first.reset_in_ms - 3_600_000;
        // An earlier version wrote its state as text: 6 counted in this window.
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let key = format!("{}k", backend.key("p", "r:"));
        let text = format!("{start}:6:0:{}", start + 3_600_000);
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(&text)
            .arg("PX")
            .arg(3_600_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        let next = backend.meter("p", "k", &request).await.unwrap();
        assert!(next.allowed);
        assert_eq!(next.remaining, 3, "6 counted before, 1 now, of 10");
        let after = backend.meter("p", "k", &request).await.unwrap();
        assert_eq!(
            after.remaining, 2,
            "and the count goes on in the new layout"
        );
    })
    .await
}

/// `blocked_clients` from `INFO clients`: connections blocked in a command.
async fn blocked_clients(url: &str) -> u64 {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("clients")
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("blocked_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("INFO clients reports blocked_clients")
}

/// Return once exactly `n` connections are blocked on the server at `url`.
async fn until_blocked(url: &str, n: u64) {
    while blocked_clients(url).await != n {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A connection to administer the server at `url` (`CLIENT`, `CONFIG`, `ACL`).
async fn admin_connection(url: &str) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(url).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

/// Create `k` in `p` with `value` (a minute's TTL) once the partition has
/// changed after `after`, or at `timeout_ms`: a lock waiter's attempt.
async fn wait_then_create(
    backend: &RedisBackend,
    value: &[u8],
    after: u64,
    timeout_ms: u64,
) -> Result<WriteReply, StoreError> {
    let absent = Condition::Absent;
    backend
        .wait_then_put("p", "k", value, Some(60_000), &absent, after, timeout_ms)
        .await
}

/// [`wait_then_create`] in a task of its own, with an hour's timeout: in a
/// test's 10 s only a change (or a lost connection) can end its wait.
fn spawn_waiter(
    backend: &Arc<RedisBackend>,
    value: &'static [u8],
    after: u64,
) -> tokio::task::JoinHandle<Result<WriteReply, StoreError>> {
    let backend = backend.clone();
    tokio::spawn(async move { wait_then_create(&backend, value, after, 3_600_000).await })
}

/// Delete `k` of `p`, which must be there: the holder's release.
async fn release_k(backend: &RedisBackend) {
    applied_entry(
        backend
            .delete("p", "k", &Condition::Always)
            .await
            .unwrap()
            .outcome,
    );
}

/// Two instances on `backend`: one holding the test's lock (for a minute;
/// its held lock is returned too), and one about to wait for it.
async fn held_and_wanted(backend: &Arc<RedisBackend>) -> (Instance, HeldLock, Instance) {
    let runtime = Runtime::new(backend.clone()).unwrap();
    let mut holder = runtime.instantiate().await.unwrap();
    let lock = held(acquire(&mut holder, no_wait(60_000)).await);
    let waiter = runtime.instantiate().await.unwrap();
    (holder, lock, waiter)
}

/// Acquire options that wait up to a minute.
fn wait_a_minute() -> AcquireOptions {
    AcquireOptions::new().ttl_ms(60_000).wait_up_to(60_000)
}

fn applied_entry(outcome: Outcome) -> Entry {
    match outcome {
        Outcome::Applied(e) => e,
        other => panic!("expected applied, got {other:?}"),
    }
}

#[tokio::test]
async fn wait_then_put_blocks_on_the_feed_and_puts_in_the_same_request_as_the_release_lands() {
    bounded(async {
        let (server, backend) = private_server().await;
        let url = server.url();
        let held = put(&backend, "k", b"holder", Some(60_000)).await;
        let before = backend.round_trips();
        // An hour's timeout: only the release can end this wait in the test's 10 s.
        let waiter = spawn_waiter(&backend, b"waiter", held.revision);
        until_blocked(&url, 1).await;
        release_k(&backend).await;
        let e = applied_entry(waiter.await.unwrap().unwrap().outcome);
        assert_eq!(e.value, b"waiter");
        assert_eq!(
            backend.round_trips() - before,
            2,
            "the delete, and the waiter's wait and put as one request"
        );
        assert_eq!(backend.blocking_connections_opened(), 1);

        // The connection is kept for the next call. The change is already
        // there, so this one returns at once, and its put finds the waiter.
        let reply = wait_then_create(&backend, b"late", held.revision, 3_600_000)
            .await
            .unwrap();
        assert_eq!(reply.outcome, Outcome::Conflict(Some(e)));
        assert_eq!(backend.blocking_connections_opened(), 1, "reused");
    })
    .await
}

#[tokio::test]
async fn a_cancelled_wait_then_put_never_puts_and_its_connection_is_not_reused() {
    bounded(async {
        let (server, backend) = private_server().await;
        let url = server.url();
        let held = put(&backend, "k", b"holder", Some(60_000)).await;
        let waiter = spawn_waiter(&backend, b"ghost", held.revision);
        until_blocked(&url, 1).await;
        // The caller goes away (an instance dropped mid-call, say).
        waiter.abort();
        assert!(waiter.await.unwrap_err().is_cancelled());
        // Nothing changed the feed and the hour has not passed, so the block
        // can only end with the connection closed, its queued put with it.
        until_blocked(&url, 0).await;
        release_k(&backend).await;
        let reply = wait_then_create(&backend, b"next", held.revision, 3_600_000)
            .await
            .unwrap();
        assert_eq!(applied_entry(reply.outcome).value, b"next");
        assert_eq!(
            backend.blocking_connections_opened(),
            2,
            "the cancelled call's connection was dropped, not reused"
        );
        let feed = backend.changes("p", held.revision, 10).await.unwrap();
        let kinds: Vec<_> = feed.changes.iter().map(|c| c.kind).collect();
        assert_eq!(kinds, [ChangeKind::Delete, ChangeKind::Put], "no ghost put");
    })
    .await
}

#[tokio::test]
async fn a_wait_then_put_that_times_out_still_puts_once() {
    bounded(async {
        let backend = shared_backend(|c| c).await;
        let held = put(&backend, "k", b"holder", Some(60_000)).await;
        let reply = wait_then_create(&backend, b"waiter", held.revision, 20)
            .await
            .unwrap();
        assert_eq!(reply.outcome, Outcome::Conflict(Some(held.clone())));
        assert!(
            reply.now >= held.updated_at + 20,
            "the put ran after the block"
        );
        assert_eq!(backend.blocking_connections_opened(), 1);
    })
    .await
}

#[tokio::test]
async fn a_wait_then_put_after_a_script_flush_loads_the_script_and_puts() {
    bounded(async {
        let (server, backend) = private_server().await;
        let held = put(&backend, "k", b"v1", None).await;
        let mut admin = admin_connection(&server.url()).await;
        let () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut admin)
            .await
            .unwrap();
        // The revision before `held`: the wait ends at once, the put meets NOSCRIPT.
        let guard = Condition::Revision(held.revision);
        let reply = backend
            .wait_then_put("p", "k", b"v2", None, &guard, held.revision - 1, 3_600_000)
            .await
            .unwrap();
        assert_eq!(applied_entry(reply.outcome).value, b"v2");
        assert_eq!(backend.blocking_connections_opened(), 1);
    })
    .await
}

#[tokio::test]
async fn with_no_blocking_connection_free_wait_then_put_waits_on_notifications() {
    bounded(async {
        let backend = shared_backend(|c| RedisConfig {
            blocking_connections: 0,
            ..c
        })
        .await;
        let held = put(&backend, "k", b"holder", Some(60_000)).await;
        let waiter = spawn_waiter(&backend, b"waiter", held.revision);
        while backend.waiters("p") != 1 {
            tokio::task::yield_now().await;
        }
        release_k(&backend).await;
        let e = applied_entry(waiter.await.unwrap().unwrap().outcome);
        assert_eq!(e.value, b"waiter");
        assert_eq!(backend.blocking_connections_opened(), 0);
    })
    .await
}

#[tokio::test]
async fn a_lock_waiter_takes_the_lock_in_the_request_it_waits_in() {
    bounded(async {
        let (server, backend) = private_server().await;
        let url = server.url();
        let (mut holder, lock, mut waiter) = held_and_wanted(&backend).await;
        let waiting = tokio::spawn(async move {
            let options = wait_a_minute();
            let outcome = acquire(&mut waiter, options).await;
            (outcome, waiter.store_calls())
        });
        until_blocked(&url, 1).await;
        assert!(holder.release(&lock).await.unwrap().unwrap());
        let (outcome, store_calls) = waiting.await.unwrap();
        let taken = held(outcome);
        assert!(taken.fence > lock.fence);
        assert_eq!(
            store_calls, 2,
            "a create-if-absent, then one wait-then-put that took the lock"
        );
    })
    .await
}

#[tokio::test]
async fn a_blocking_connection_killed_mid_wait_is_unavailable_never_busy_or_acquired() {
    bounded(async {
        let (server, backend) = private_server().await;
        let url = server.url();
        let (mut holder, lock, mut waiter) = held_and_wanted(&backend).await;
        let waiting = tokio::spawn(async move {
            let options = wait_a_minute();
            (acquire(&mut waiter, options).await, waiter)
        });
        until_blocked(&url, 1).await;
        // Kill exactly the connection blocked in XREAD.
        let mut admin = admin_connection(&server.url()).await;
        let clients: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(&mut admin)
            .await
            .unwrap();
        let blocked = clients
            .lines()
            .find(|l| l.contains("cmd=xread"))
            .and_then(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
            .expect("a client blocked in XREAD")
            .to_string();
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("ID")
            .arg(&blocked)
            .query_async(&mut admin)
            .await
            .unwrap();
        assert_eq!(killed, 1);
        let (outcome, mut waiter) = waiting.await.unwrap();
        assert!(
            matches!(outcome, Err(Error::Unavailable(_))),
            "a lost connection mid-wait must be unavailable, got {outcome:?}"
        );
        // The holder still holds the lock, and the next wait blocks on a
        // fresh connection and takes the lock at the release.
        match acquire(&mut waiter, no_wait(60_000)).await {
            Ok(AcquireOutcome::Busy(h)) => assert_eq!(h.fence, lock.fence),
            other => panic!("the holder must still hold, got {other:?}"),
        }
        let retry = tokio::spawn(async move {
            let options = wait_a_minute();
            acquire(&mut waiter, options).await
        });
        until_blocked(&url, 1).await;
        assert!(holder.release(&lock).await.unwrap().unwrap());
        assert!(held(retry.await.unwrap()).fence > lock.fence);
        assert_eq!(
            backend.blocking_connections_opened(),
            2,
            "the killed connection was not reused"
        );
    })
    .await
}

#[tokio::test]
async fn a_blocking_connection_the_server_closed_while_idle_is_replaced_not_an_error() {
    bounded(async {
        let (server, backend) = private_server().await;
        let first = put(&backend, "k", b"v1", None).await;
        let second = put(&backend, "k", b"v2", None).await;
        // The change is already there: each call below returns at once.
        let reply = backend
            .wait_then_put(
                "p",
                "k",
                b"v3",
                None,
                &Condition::Always,
                first.revision,
                60_000,
            )
            .await
            .unwrap();
        assert_eq!(applied_entry(reply.outcome).value, b"v3");
        assert_eq!(backend.blocking_connections_idle(), 1);
        // The server closes every client connection (as a restart or an idle
        // timeout would), the idle blocking one among them.
        let mut admin = admin_connection(&server.url()).await;
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .arg("SKIPME")
            .arg("yes")
            .query_async(&mut admin)
            .await
            .unwrap();
        assert!(killed >= 1);
        while backend.blocking_connections_idle() != 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let reply = backend
            .wait_then_put(
                "p",
                "k",
                b"v4",
                None,
                &Condition::Always,
                second.revision,
                60_000,
            )
            .await
            .expect("a connection closed while idle is replaced, never reported unavailable");
        assert_eq!(applied_entry(reply.outcome).value, b"v4");
        assert_eq!(backend.blocking_connections_opened(), 2);
    })
    .await
}

#[tokio::test]
async fn a_wait_then_put_ends_its_block_at_its_timeout_not_at_a_cron_tick() {
    bounded(async {
        let (server, backend) = private_server().await;
        // Redis times blocked commands out at its cron tick: once a second
        // here. The host must end the block at the timeout itself.
        let mut admin = admin_connection(&server.url()).await;
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("hz")
            .arg(1)
            .query_async(&mut admin)
            .await
            .unwrap();
        let held = put(&backend, "k", b"holder", Some(60_000)).await;
        let reply = wait_then_create(&backend, b"waiter", held.revision, 30)
            .await
            .unwrap();
        assert_eq!(reply.outcome, Outcome::Conflict(Some(held)));
        assert_eq!(
            backend.blocks_ended_at_timeout(),
            1,
            "the host ended the block (Redis's own timeout is a response timeout later)"
        );
    })
    .await
}

#[tokio::test]
async fn when_redis_refuses_xread_wait_then_put_waits_on_notifications_instead() {
    bounded(async {
        let server = RedisServer::spawn().expect("these tests start their own redis-server");
        let mut admin = admin_connection(&server.url()).await;
        let () = redis::cmd("ACL")
            .arg(&[
                "SETUSER", "noxread", "on", ">pw", "~*", "&*", "+@all", "-xread",
            ])
            .query_async(&mut admin)
            .await
            .unwrap();
        let url = server.url().replace("redis://", "redis://noxread:pw@");
        let backend = Arc::new(
            RedisBackend::connect(redis_config(&url, 64, None))
                .await
                .unwrap(),
        );
        let held = put(&backend, "k", b"holder", Some(60_000)).await;
        let waiter = spawn_waiter(&backend, b"waiter", held.revision);
        // The refused XREAD did not end the wait: the waiter waits on the
        // subscriber connection, and the release wakes it.
        while backend.waiters("p") != 1 {
            tokio::task::yield_now().await;
        }
        release_k(&backend).await;
        let e = applied_entry(waiter.await.unwrap().unwrap().outcome);
        assert_eq!(e.value, b"waiter");
        // Nor is XREAD tried again.
        let reply = wait_then_create(&backend, b"late", held.revision, 3_600_000)
            .await
            .unwrap();
        assert_eq!(reply.outcome, Outcome::Conflict(Some(e)));
        assert_eq!(backend.blocking_connections_opened(), 1);
    })
    .await
}

/// Two backends on one Redis with one prefix, as two hosts would be; the
/// first re-checks only hourly, so only a notification can wake it.
async fn two_hosts(url: &str) -> (Arc<RedisBackend>, Arc<RedisBackend>) {
    let config = redis_config(url, 64, None);
    let waiter = RedisBackend::connect(RedisConfig {
        recheck: Duration::from_secs(3600),
        ..config.clone()
    })
    .await
    .unwrap();
    let writer = RedisBackend::connect(config).await.unwrap();
    (Arc::new(waiter), Arc::new(writer))
}

/// A lock's partition, unwatched.
const LOCK: &str = "~lock:1:a:b";

#[tokio::test]
async fn an_unwatched_write_on_another_host_wakes_a_waiter_without_its_recheck() {
    bounded(async {
        let (waiting, writing) = two_hosts(&redis_url().await).await;
        let held = writing
            .put(LOCK, "holder", b"a", Some(60_000), &Condition::Absent)
            .await
            .unwrap();
        let held = applied_entry(held.outcome);
        let w = waiting.clone();
        let waiter = tokio::spawn(async move { w.wait(LOCK, held.revision, 3_600_000).await });
        while waiting.waiters(LOCK) != 1 {
            tokio::task::yield_now().await;
        }
        let gone = writing
            .delete(LOCK, "holder", &Condition::Always)
            .await
            .unwrap();
        assert!(matches!(gone.outcome, Outcome::Applied(_)));
        assert!(waiter.await.unwrap().unwrap() > held.revision);
    })
    .await
}

#[tokio::test]
async fn an_unwatched_wait_then_put_takes_the_key_in_the_request_the_release_of_another_host_lands()
{
    bounded(async {
        let server = RedisServer::spawn().expect("these tests start their own redis-server");
        let url = server.url();
        let (waiting, writing) = two_hosts(&url).await;
        let held = writing
            .put(LOCK, "holder", b"a", Some(60_000), &Condition::Absent)
            .await
            .unwrap();
        let held = applied_entry(held.outcome);
        let w = waiting.clone();
        let waiter = tokio::spawn(async move {
            w.wait_then_put(
                LOCK,
                "holder",
                b"b",
                Some(60_000),
                &Condition::Absent,
                held.revision,
                3_600_000,
            )
            .await
        });
        until_blocked(&url, 1).await;
        let before = waiting.round_trips();
        writing
            .delete(LOCK, "holder", &Condition::Always)
            .await
            .unwrap();
        let taken = applied_entry(waiter.await.unwrap().unwrap().outcome);
        assert_eq!(taken.value, b"b");
        assert_eq!(
            waiting.round_trips(),
            before,
            "no request of the waiter's after the release"
        );
    })
    .await
}

#[tokio::test]
async fn a_release_before_an_unwatched_wait_then_put_blocks_ends_it_at_once() {
    bounded(async {
        let (waiting, writing) = two_hosts(&redis_url().await).await;
        let held = writing
            .put(LOCK, "holder", b"a", Some(60_000), &Condition::Absent)
            .await
            .unwrap();
        let held = applied_entry(held.outcome);
        // Nobody waits yet, so the release wakes nobody and leaves no wake-up...
        writing
            .delete(LOCK, "holder", &Condition::Always)
            .await
            .unwrap();
        // ...and a waiter that saw only the holder must not block for its hour.
        let taken = waiting
            .wait_then_put(
                LOCK,
                "holder",
                b"b",
                Some(60_000),
                &Condition::Absent,
                held.revision,
                3_600_000,
            )
            .await
            .unwrap();
        assert_eq!(applied_entry(taken.outcome).value, b"b");
    })
    .await
}

#[tokio::test]
async fn an_unwatched_partition_nobody_waits_on_is_one_key_with_a_ttl() {
    bounded(async {
        let url = redis_url().await;
        let backend = shared_backend(|c| c).await;
        for _ in 0..3 {
            let e = backend
                .put(LOCK, "holder", b"a", Some(60_000), &Condition::Absent)
                .await
                .unwrap();
            let e = applied_entry(e.outcome);
            backend
                .delete(LOCK, "holder", &Condition::Revision(e.revision))
                .await
                .unwrap();
        }
        let [state, stream, _channel] = backend.unwatched_keys(LOCK);
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let (exists, ttl): (u64, i64) = redis::pipe()
            .cmd("EXISTS")
            .arg(&stream)
            .cmd("PTTL")
            .arg(&state)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(exists, 0, "no wake-up was written with nobody waiting");
        assert!(ttl > 0, "the partition carries a TTL ({ttl})");
        // Another layout's value under the key is refused, not misread.
        let _: () = redis::cmd("SET")
            .arg(&state)
            .arg("\u{2}not a partition")
            .arg("PX")
            .arg(60_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        match backend.get(LOCK, "holder").await {
            Err(StoreError::Unavailable(why)) => assert!(why.contains("another layout"), "{why}"),
            other => panic!("expected the layout to be refused, got {other:?}"),
        }
    })
    .await
}
