//! Redis restarted empty, flushed, killed, stopped and stalled: fences keep
//! rising, and a call is `unavailable`, never busy or acquired.

use std::sync::Arc;
use std::time::Duration;

use super::{acquire, held, private_server};
use crate::common::stall_proxy::StallProxy;
use crate::common::{RedisServer, bounded, no_wait, redis_config};
use coord_host::Runtime;
use coord_host::backend::{
    Backend, Condition, MeterAlgorithm, MeterMode, MeterRequest, StoreError,
};
use coord_host::lock::*;
use coord_redis::{RedisBackend, RedisConfig};

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
        assert!(holder.lock().release(&lock).await.unwrap().unwrap());
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
        let extend = holder.lock().extend(&lock, Some(10_000)).await.unwrap();
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
            match holder.lock().release(&lock).await.unwrap() {
                Err(Error::Unavailable(_)) => tokio::time::sleep(Duration::from_millis(20)).await,
                other => break other,
            }
        };
        assert_eq!(release, Ok(false));
        let holder_seen = rival
            .lock()
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
                    let lock = match i.lock().acquire("stock", &resource, options).await.unwrap() {
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
                    match i.lock().release(&lock).await.unwrap() {
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
                    .lock()
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
            assert!(i.lock().release(&lock).await.unwrap().unwrap());
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
async fn ready_exercises_a_write_and_says_no_while_writes_are_refused() {
    // A server that still tells the time but refuses every write (out of
    // memory under noeviction; made a replica, so read-only) is not ready.
    bounded(async {
        let (server, backend) = private_server().await;
        backend.ready().await.unwrap();
        let client = redis::Client::open(server.url()).unwrap();
        let mut admin = client.get_multiplexed_async_connection().await.unwrap();
        send(
            &mut admin,
            &["CONFIG", "SET", "maxmemory-policy", "noeviction"],
        )
        .await;
        send(&mut admin, &["CONFIG", "SET", "maxmemory", "1"]).await;
        backend.now().await.unwrap();
        let refused = backend.ready().await;
        assert!(
            matches!(&refused, Err(StoreError::Unavailable(m)) if m.contains("OOM")),
            "ready while every write is refused: {refused:?}"
        );
        send(&mut admin, &["CONFIG", "SET", "maxmemory", "0"]).await;
        backend.ready().await.unwrap();

        let nobody = crate::common::free_ports(1).unwrap()[0].to_string();
        send(&mut admin, &["REPLICAOF", "127.0.0.1", &nobody]).await;
        backend.now().await.unwrap();
        let refused = backend.ready().await;
        assert!(
            matches!(&refused, Err(StoreError::Unavailable(m)) if m.contains("read only replica")),
            "ready as a read-only replica: {refused:?}"
        );
        send(&mut admin, &["REPLICAOF", "NO", "ONE"]).await;
        backend.ready().await.unwrap();
    })
    .await
}

#[tokio::test]
async fn a_process_given_fewer_replica_acks_waits_for_what_the_others_rely_on() {
    // One process waits for a replica behind every write, so its holders
    // survive a failover; another on the same prefix, given none, must not
    // write to the master alone beside it. The server has no replica, so a
    // write that waits for one is unavailable: that is what shows it waits.
    bounded(async {
        let server = RedisServer::spawn().expect("these tests start their own redis-server");
        let lax = redis_config(&server.url(), 64, None);
        let strict = RedisConfig {
            replica_acks: 1,
            replica_ack_timeout: Duration::from_millis(100),
            ..lax.clone()
        };
        let write = async |backend: &RedisBackend| {
            backend
                .put(
                    "~lock:1:acks:x",
                    "holder",
                    b"v",
                    Some(60_000),
                    &Condition::Always,
                )
                .await
        };
        let started_before = RedisBackend::connect(lax.clone()).await.unwrap();
        write(&started_before).await.unwrap();
        assert!(started_before.warnings().is_empty());

        let relying = RedisBackend::connect(strict).await.unwrap();
        assert!(matches!(
            write(&relying).await,
            Err(StoreError::Unavailable(_))
        ));
        let started_after = RedisBackend::connect(lax).await.unwrap();
        let alone = write(&started_after).await;
        assert!(
            matches!(alone, Err(StoreError::Unavailable(_))),
            "a process given no acknowledgements wrote to the master alone: {alone:?}"
        );
        assert_eq!(started_after.warnings().len(), 1, "it says why it waits");
        // The process started before learns it at its next reading.
        while write(&started_before).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(started_before.warnings().len(), 1);
    })
    .await
}

#[tokio::test]
async fn a_write_held_by_a_paused_server_is_unavailable_and_never_applied_later() {
    // A paused server (CLIENT PAUSE, a stopped process, a stalled network)
    // runs the commands it holds once it resumes. Before, a write its
    // caller had answered `unavailable` for then applied: a lock acquired
    // by a token nobody had, an entry a caller believed refused. The
    // script now refuses to run past the caller's deadline on Redis's clock.
    bounded(async {
        let server = RedisServer::spawn().expect("these tests start their own redis-server");
        let config = RedisConfig {
            response_timeout: Duration::from_millis(1_000),
            ..redis_config(&server.url(), 64, None)
        };
        let backend = RedisBackend::connect(config).await.unwrap();
        let client = redis::Client::open(server.url()).unwrap();
        let mut admin = client.get_multiplexed_async_connection().await.unwrap();
        // A lock's partition (kept as one string) and a tenant's (a hash and
        // a feed): one script each.
        for partition in ["~lock:1:late:x", "tenant"] {
            backend
                .put(partition, "first", b"v", Some(60_000), &Condition::Always)
                .await
                .unwrap();
            send(&mut admin, &["CLIENT", "PAUSE", "3000", "WRITE"]).await;
            let held = backend
                .put(partition, "late", b"v", Some(60_000), &Condition::Absent)
                .await;
            assert!(
                matches!(held, Err(StoreError::Unavailable(_))),
                "a write held past the response timeout: {held:?}"
            );
            // On the same connection, behind the held write: once this read
            // is answered, the held write has run, or been refused.
            let seen = loop {
                match backend.get(partition, "late").await {
                    Ok(read) => break read.entry,
                    Err(StoreError::Unavailable(_)) => {}
                    Err(other) => panic!("{other:?}"),
                }
            };
            assert_eq!(
                seen, None,
                "{partition}: a write answered unavailable applied once the server resumed"
            );
        }
        // A rate limit's count (its own script) likewise.
        let request = |mode| MeterRequest {
            algorithm: MeterAlgorithm::FixedWindow,
            limit: 10,
            window_ms: 3_600_000,
            cost: 1,
            mode,
        };
        let counted = backend
            .meter("limits", "k", &request(MeterMode::Consume))
            .await;
        assert_eq!(counted.unwrap().remaining, 9);
        send(&mut admin, &["CLIENT", "PAUSE", "3000", "WRITE"]).await;
        let held = backend
            .meter("limits", "k", &request(MeterMode::Consume))
            .await;
        assert!(
            matches!(held, Err(StoreError::Unavailable(_))),
            "a count held past the response timeout: {held:?}"
        );
        // A peek, on the same connection behind the held count.
        let remaining = loop {
            match backend
                .meter("limits", "k", &request(MeterMode::Peek))
                .await
            {
                Ok(reply) => break reply.remaining,
                Err(StoreError::Unavailable(_)) => {}
                Err(other) => panic!("{other:?}"),
            }
        };
        assert_eq!(
            remaining, 9,
            "a count answered unavailable was counted later"
        );
    })
    .await
}

/// Send `command` (its name, then its arguments) on `admin`; it must succeed.
async fn send(admin: &mut redis::aio::MultiplexedConnection, command: &[&str]) {
    let _: () = redis::cmd(command[0])
        .arg(&command[1..])
        .query_async(admin)
        .await
        .unwrap();
}
