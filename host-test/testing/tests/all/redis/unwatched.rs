//! Unwatched partitions (a lock's): no feed, one key with a TTL, and a
//! waiter on one host woken by a write on another.

use super::blocking::{applied_entry, until_blocked};
use std::sync::Arc;
use std::time::Duration;

use super::shared_backend;
use crate::common::{RedisServer, bounded, redis_config, redis_url};
use coord_host::backend::{Backend, Condition, Outcome, StoreError};
use coord_redis::{RedisBackend, RedisConfig};

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
