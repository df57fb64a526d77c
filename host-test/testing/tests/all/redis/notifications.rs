//! Waiters woken by the change Redis publishes, by their re-check when a
//! notification is lost, and by an expiry on Redis's clock.

use std::time::Duration;

use super::{put, shared_backend};
use crate::common::{bounded, redis_url};
use coord_host::backend::{Backend, ChangeKind, Condition, Outcome};
use coord_redis::RedisConfig;

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
