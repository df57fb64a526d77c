//! The lock on a real Redis, as outside testers tried it: many waiters
//! contending at once, and a server that stalls (`DEBUG SLEEP`) while an
//! acquire is on its way.

use crate::common;

use common::no_wait;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{RedisServer, redis_config, redis_url};
use coord_component::keys::lock_partition;
use coord_host::backend::Backend;
use coord_host::lock::*;
use coord_redis::{RedisBackend, RedisConfig};

const ID: &str = "inventory.stock";

/// Outside testers started four processes at once; waiters gave up after
/// 0.6-0.8 s of the documented 2 s, each wake-up spending an attempt. Here
/// six instances, each on its own connection, take turns on one lock with
/// the default policy, each holding it 600 ms: five waiting behind a holder
/// cannot all be served within 2 s, so some give up, and every `busy` must
/// come after at least 2 s. The instances are all made before any starts,
/// so they contend from the first attempt however slowly a busy machine
/// makes them; the run ends after a count of acquisitions, not a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contending_waiters_each_keep_trying_for_the_default_two_seconds() {
    const WAITERS: usize = 6;
    const ACQUISITIONS: usize = 12;
    let url = redis_url().await;
    let config = redis_config(&url, 64, None);
    let prefix = config.prefix.clone();
    let resource = "item:contended";
    let mut instances = Vec::new();
    for _ in 0..WAITERS {
        let backend = Arc::new(
            RedisBackend::connect(RedisConfig {
                prefix: prefix.clone(),
                ..redis_config(&url, 64, None)
            })
            .await
            .unwrap(),
        );
        instances.push(common::instance_on(backend).await);
    }
    let total = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for mut i in instances {
        let total = total.clone();
        tasks.push(tokio::spawn(async move {
            let (mut acquired, mut gave_up) = (0, Vec::new());
            while total.load(std::sync::atomic::Ordering::SeqCst) < ACQUISITIONS {
                let started = Instant::now();
                let options = AcquireOptions::new().ttl_ms(10_000);
                match i
                    .lock()
                    .acquire(ID, resource, options)
                    .await
                    .unwrap()
                    .unwrap()
                {
                    AcquireOutcome::Acquired(lock) => {
                        acquired += 1;
                        total.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        // Hold it a while; extend once, which wakes nobody.
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        let _ = i.lock().extend(&lock, None).await.unwrap().unwrap();
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        assert!(i.lock().release(&lock).await.unwrap().unwrap());
                    }
                    AcquireOutcome::Busy(_) => gave_up.push(started.elapsed()),
                }
            }
            (acquired, gave_up)
        }));
    }
    let (mut acquired, mut gave_up) = (0, Vec::new());
    for task in tasks {
        let (a, g) = task.await.unwrap();
        acquired += a;
        gave_up.extend(g);
    }
    println!(
        "{WAITERS} waiters: {acquired} acquisitions, {} gave up after {:?}",
        gave_up.len(),
        gave_up
    );
    assert!(
        acquired >= ACQUISITIONS,
        "the lock changed hands: {acquired}"
    );
    assert!(
        !gave_up.is_empty(),
        "with {WAITERS} contending for 600 ms holds, some must give up, or this tests nothing"
    );
    for waited in &gave_up {
        assert!(
            *waited >= Duration::from_millis(2000),
            "a waiter gave up after {waited:?}, before the default's 2 s"
        );
    }
    common::delete_prefix(&url, &prefix);
}

/// Outside testers: during `DEBUG SLEEP 3` an acquire was answered
/// `unavailable` after the 2 s response timeout, then applied when Redis
/// woke, and for the lock's whole 10 s TTL every request was busy behind a
/// holder nobody had. Now the acquire takes its own attempt back before it
/// answers, so the lock is free as soon as it has answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_timed_out_in_a_stall_leaves_the_lock_free_after_recovery() {
    let server = RedisServer::spawn().expect("a private redis-server");
    let stalled = RedisConfig {
        response_timeout: Duration::from_millis(500),
        ..redis_config(&server.url(), 64, None)
    };
    let prefix = stalled.prefix.clone();
    let backend = Arc::new(RedisBackend::connect(stalled).await.unwrap());
    let observer = Arc::new(
        RedisBackend::connect(RedisConfig {
            prefix,
            ..redis_config(&server.url(), 64, None)
        })
        .await
        .unwrap(),
    );
    let mut caller = common::instance_on(backend).await;
    let mut rival = common::instance_on(observer.clone()).await;
    let partition = lock_partition(ID, "item:1");

    for rival_holds in [false, true] {
        let rivals = if rival_holds {
            match rival
                .lock()
                .acquire(ID, "item:1", no_wait(60_000))
                .await
                .unwrap()
            {
                Ok(AcquireOutcome::Acquired(lock)) => Some(lock),
                other => panic!("the rival could not take the lock: {other:?}"),
            }
        } else {
            None
        };
        // The lock's partition is unwatched (no feed), so its revision, which
        // only a write moves, shows what happened.
        let before = observer.list(&partition, "").await.unwrap().revision;
        let client = redis::Client::open(server.url()).unwrap();
        let no_timeout = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        let mut admin = client
            .get_multiplexed_async_connection_with_config(&no_timeout)
            .await
            .unwrap();
        let sleeping = tokio::spawn(async move {
            // 0.8 s: longer than the 0.5 s response timeout, shorter than two.
            let _: () = redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg("0.8")
                .query_async(&mut admin)
                .await
                .unwrap();
            Instant::now()
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let outcome = caller
            .lock()
            .acquire(ID, "item:1", no_wait(10_000))
            .await
            .unwrap();
        let answered = Instant::now();
        assert!(
            matches!(outcome, Err(Error::Unavailable(_))),
            "a stalled store is unavailable: {outcome:?}"
        );
        let woke = sleeping.await.unwrap();
        let holder = rival.lock().inspect(ID, "item:1").await.unwrap().unwrap();
        match &rivals {
            None => {
                assert_eq!(holder, None, "no ghost holder once the acquire answered");
                // The stalled put did apply (only a write moves the
                // revision, and nobody else wrote), then was taken back: the
                // test saw the case it names.
                let after = observer.list(&partition, "").await.unwrap();
                assert!(after.revision > before, "the stalled put never applied");
                assert_eq!(after.entries, vec![], "taken back");
                println!(
                    "free {:?} after Redis woke (the acquire answered then)",
                    answered.saturating_duration_since(woke)
                );
            }
            Some(lock) => {
                let holder = holder.expect("the rival still holds its lock");
                assert_eq!(holder.fence, lock.fence, "another owner is never freed");
                assert!(rival.lock().release(lock).await.unwrap().unwrap());
            }
        }
    }
}
