//! What Redis is sent and what it keeps: one round trip per call, a
//! partition in one cluster slot, a TTL on every key, TLS, the retention pass,
//! the feed's bound, sweeps, and partitions in older layouts.

use std::sync::Arc;
use std::time::Duration;

use super::{acquire, held, private_server, put, server_calls, shared_backend, with_retention};
use crate::common::{self, RedisServer, bounded, no_wait, redis_config, redis_url};
use coord_host::Runtime;
use coord_host::backend::{
    Backend, ChangeKind, Condition, MeterAlgorithm, MeterMode, MeterRequest, StoreError,
};
use coord_host::lock::*;
use coord_redis::{RedisBackend, RedisConfig, slot_of};

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
        let ExtendOutcome::Extended(lock) = i.lock().extend(&lock, None).await.unwrap().unwrap()
        else {
            panic!("lost")
        };
        assert!(i.lock().release(&lock).await.unwrap().unwrap());
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
        assert!(i.lock().release(&lock).await.unwrap().unwrap());
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
        assert!(i.lock().release(&lock).await.unwrap().unwrap());
        assert!(waiter.await.unwrap().unwrap() > lock.fence);
    })
    .await
}

#[tokio::test]
async fn after_every_ttl_and_the_retention_pass_no_key_remains() {
    bounded(async {
        // Redis's own key expiry runs on real time, so the count of the
        // keys written is asserted only when it was taken (on Redis's
        // clock) before the shortest TTL could run out: a busy machine that
        // stalls this test past it may find fewer, and that is no defect.
        // Every key must go afterwards, however slow the machine.
        const TTL: u64 = 1_000;
        let (backend, mut i, prefix, url) = with_retention(50).await;
        let written_from = backend.now().await.unwrap();
        held(acquire(&mut i, no_wait(TTL)).await);
        backend
            .put("eph", "a", b"v", Some(TTL), &Condition::Always)
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
        if backend.now().await.unwrap() < written_from + TTL {
            assert_eq!(
                keys.len(),
                4,
                "a lock's one key and an ephemeral partition's three were written: {keys:?}"
            );
        }
        // Redis expires keys as it samples them: bounded by the test's
        // watchdog, not by a speed.
        for _ in 0..3_000 {
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
            i.ratelimit()
                .check(&limiter, "user:1", None)
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
