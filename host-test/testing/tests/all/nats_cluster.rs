//! A three-node JetStream cluster on loopback, the coordination stream at
//! three replicas, and the stream's leader killed while instances contend
//! for locks: no two holders' writes both accepted (the fenced register),
//! fences monotonic, calls during the election unavailable (never busy or
//! acquired wrongly), and work resumed on the new leader, timed.

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::nats_cluster::{Cluster, connect, connect_with_timeout, stream_leader};
use coord_host::backend::Backend as _;
use coord_host::lock::*;
use coord_host::{Instance, Runtime};
use coord_nats::{NatsBackend, NatsConfig};

/// Writes guarded by fences: a write with a fence below the highest seen is refused.
#[derive(Default)]
struct FencedRegister {
    highest: Mutex<HashMap<String, u64>>,
}

impl FencedRegister {
    fn write(&self, resource: &str, fence: u64) -> bool {
        let mut highest = self.highest.lock().unwrap();
        let seen = highest.entry(resource.to_string()).or_default();
        if fence < *seen {
            return false;
        }
        *seen = fence;
        true
    }
}

/// Outside testers: 300 adjusts, 8 at a time, on one item of a 3-replica
/// stream answered 503 122 and 149 times, with no fault at all: racing
/// publishes came back "wrong last sequence" as error 10164, which the
/// client does not map to its wrong-last-sequence kind, so coord reported
/// `unavailable` instead of reading and deciding again. Contention is
/// never `unavailable` while the store answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_on_a_replicated_stream_is_decided_again_never_unavailable() {
    let cluster = Cluster::start("contention");
    // A generous deadline: the test is about contention being decided
    // again, which no deadline hides (before the fix, a lost race failed at
    // once), and a busy machine must not fail it by being slow.
    let backend = connect_with_timeout(&cluster, "COORDCONTEND", Duration::from_secs(15)).await;
    let runtime = Arc::new(Runtime::new(backend).unwrap());
    let limiter = coord_host::ratelimit::Limiter {
        id: "contention".into(),
        limit: 1_000_000,
        window_ms: 60_000,
        algorithm: None,
    };
    // Permits of one semaphore in hand at once, across the 8 tasks.
    let inside = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (runtime, limiter, inside) = (runtime.clone(), limiter.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            let mut instance: Instance = runtime.instantiate().await.unwrap();
            let mut failed = Vec::new();
            for _ in 0..25 {
                // Every check of one key is a write to one partition.
                if let Err(e) = instance
                    .ratelimit()
                    .check(&limiter, "hot", Some(1))
                    .await
                    .unwrap()
                {
                    failed.push(format!("{e:?}"));
                }
                // A minute: waiting is not fair, and on a loaded machine a
                // waiter can lose every race for seconds (see the step-down
                // test below); busy would mean a lock held for ever.
                let options = AcquireOptions::new().ttl_ms(5_000).wait_up_to(60_000);
                match instance
                    .lock()
                    .acquire("stock", "item:hot", options)
                    .await
                    .unwrap()
                {
                    Ok(AcquireOutcome::Acquired(lock)) => {
                        if let Err(e) = instance.lock().release(&lock).await.unwrap() {
                            failed.push(format!("release: {e:?}"));
                        }
                    }
                    Ok(AcquireOutcome::Busy(holder)) => failed.push(format!("busy: {holder:?}")),
                    Err(e) => failed.push(format!("acquire: {e:?}")),
                }
                // A semaphore of 3 on one resource: every permit is a write
                // to one partition, and never more than 3 are in hand (a
                // TTL no loaded machine outstays between two of its lines).
                use coord_host::semaphore as sem;
                let options = sem::AcquireOptions::new().ttl_ms(30_000).wait_up_to(60_000);
                match instance
                    .semaphore()
                    .acquire("api", "hot", 3, options)
                    .await
                    .unwrap()
                {
                    Ok(sem::AcquireOutcome::Acquired(permit)) => {
                        let now_inside = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        assert!(now_inside <= 3, "{now_inside} permits of 3 in hand");
                        tokio::task::yield_now().await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        if let Err(e) = instance.semaphore().release(&permit).await.unwrap() {
                            failed.push(format!("release: {e:?}"));
                        }
                    }
                    Ok(sem::AcquireOutcome::Busy(first)) => failed.push(format!("busy: {first:?}")),
                    Err(e) => failed.push(format!("acquire: {e:?}")),
                }
            }
            failed
        }));
    }
    let mut failed = Vec::new();
    for task in tasks {
        failed.extend(task.await.unwrap());
    }
    // A leader lost to load (no fault is injected, but two cores run three
    // servers and the test) strands the writes in flight at that moment:
    // those alone may fail, as they must (see `in_doubt`).
    failed.retain(|e| !in_doubt(e));
    assert!(
        failed.is_empty(),
        "{} of 600 contended calls failed with the store answering: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
}

/// Whether a call failed because its write's acknowledgement never came:
/// the leader it reached stepped down before answering, so the write may
/// yet be applied by the next leader or be gone, and nothing can tell which
/// in time. `unavailable` (the call may have taken effect) is the one
/// honest answer, and a failed acquire is taken back in the background.
/// Every other failure while the servers run is a defect.
fn in_doubt(error: &str) -> bool {
    error.contains("didn't receive ack") || error.contains(coord_nats::NO_ACK_IN_TIME)
}

/// Wait until `calls` reaches `target`; panic once it stands still for the
/// watchdog's quiet period (a hang, not slowness).
async fn calls_reach(calls: &AtomicU64, target: u64) {
    let (mut last, mut since) = (calls.load(Ordering::SeqCst), Instant::now());
    while last < target {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = calls.load(Ordering::SeqCst);
        if now != last {
            (last, since) = (now, Instant::now());
        }
        assert!(
            since.elapsed() < common::watchdog::QUIET,
            "no call completed for {:?} ({last} before)",
            common::watchdog::QUIET
        );
    }
}

/// CI: with no fault injected, a loaded machine let the stream's leader
/// lapse, and 300 of 400 contended calls answered `unavailable` ("no
/// stream found for given subject", the client's name for a publish that
/// no leader heard) within the second it took to elect another. A write
/// nobody heard was not stored, and a read changes nothing, so both are
/// made again until the response timeout: here the leader is made to step
/// down three times while eight instances contend, and every call must
/// succeed but the writes in flight at a step-down ([`in_doubt`]). Before
/// the fix, 50 of 116 calls failed (no responders, 10008, read timeouts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stepping_down_mid_contention_costs_a_wait_not_a_failure() {
    let cluster = Cluster::start("stepdown");
    let backend = connect_with_timeout(&cluster, "COORDSTEPDOWN", Duration::from_secs(15)).await;
    let runtime = Arc::new(Runtime::new(backend).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..8 {
        let (runtime, stop, calls) = (runtime.clone(), stop.clone(), calls.clone());
        tasks.push(tokio::spawn(async move {
            let mut instance: Instance = runtime.instantiate().await.unwrap();
            let mut failed = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                // Waiting is not fair: a waiter can lose the race at every
                // release while a step-down slows each one, and a write left
                // in doubt holds its lock for the TTL. A 10 s wait was once
                // answered busy that way under a loaded machine; a minute is
                // past any such run, so busy would mean a lock held for ever.
                let options = AcquireOptions::new().ttl_ms(5_000).wait_up_to(60_000);
                let resource = format!("item:{}", t % 2);
                match instance
                    .lock()
                    .acquire("stock", &resource, options)
                    .await
                    .unwrap()
                {
                    Ok(AcquireOutcome::Acquired(lock)) => {
                        if let Err(e) = instance.lock().release(&lock).await.unwrap() {
                            failed.push(format!("release: {e:?}"));
                        }
                    }
                    Ok(AcquireOutcome::Busy(holder)) => failed.push(format!("busy: {holder:?}")),
                    Err(e) => failed.push(format!("acquire: {e:?}")),
                }
                calls.fetch_add(1, Ordering::SeqCst);
            }
            failed
        }));
    }
    let observer = async_nats::connect(cluster.url().split(',').collect::<Vec<_>>())
        .await
        .unwrap();
    let mut leaders = Vec::new();
    for _ in 0..3 {
        // Let the contenders get going (progress, not a time, decides).
        let before = calls.load(Ordering::SeqCst);
        calls_reach(&calls, before + 20).await;
        let leader = loop {
            if let Some(leader) = stream_leader(&observer, "COORDSTEPDOWN").await {
                break leader;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        leaders.push(leader);
        let _ = observer
            .request(
                "$JS.API.STREAM.LEADER.STEPDOWN.COORDSTEPDOWN".to_string(),
                "".into(),
            )
            .await;
    }
    let before = calls.load(Ordering::SeqCst);
    calls_reach(&calls, before + 20).await;
    stop.store(true, Ordering::SeqCst);
    let mut failed = Vec::new();
    for task in tasks {
        failed.extend(task.await.unwrap());
    }
    let stranded = failed.iter().filter(|e| in_doubt(e)).count();
    failed.retain(|e| !in_doubt(e));
    println!("{stranded} writes in flight at a step-down were answered unavailable");
    assert!(
        failed.is_empty(),
        "{} of {} calls failed across the step-downs of {leaders:?}: {:?}",
        failed.len(),
        calls.load(Ordering::SeqCst),
        &failed[..failed.len().min(5)]
    );
}

/// The stream's replicas change only when an operator asks, and never
/// fall without a second explicit word (issue 48, item 1). Outside
/// testers: a second process given two of three URLs, no flag, set
/// everyone's stream to one replica. Before that: `--nats-replicas 3` was
/// silently ignored on a stream that had one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streams_replicas_change_only_when_asked_and_never_fewer_unless_allowed() {
    let cluster = Cluster::start("replicas");
    let all = cluster.url();
    let two = all.split(',').take(2).collect::<Vec<_>>().join(",");
    let one = all.split(',').next().unwrap().to_string();
    let config = |url: &str, replicas: Option<usize>, allow_fewer_replicas: bool| {
        let mut config = NatsConfig::new(url);
        config.stream = "COORDREP".into();
        config.replicas = replicas;
        config.allow_fewer_replicas = allow_fewer_replicas;
        config
    };
    // The first process, on all three servers: the stream it makes has 3.
    let started = Instant::now();
    let first = loop {
        match NatsBackend::connect(config(&all, None, false)).await {
            Ok(backend) => break backend,
            Err(_) if started.elapsed() < Duration::from_secs(60) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("the cluster never took the stream: {e:?}"),
        }
    };
    let observer = async_nats::connect(all.split(',').collect::<Vec<_>>())
        .await
        .unwrap();
    let replicas = || {
        let observer = observer.clone();
        async move {
            let reply = observer
                .request("$JS.API.STREAM.INFO.COORDREP", "".into())
                .await
                .unwrap();
            let info: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
            info["config"]["num_replicas"].as_u64()
        }
    };
    assert_eq!(replicas().await, Some(3));
    assert_eq!(first.warnings(), Vec::<String>::new());

    // The outside testers' second process: two URLs, no flag. Nothing changes.
    let second = NatsBackend::connect(config(&two, None, false))
        .await
        .unwrap();
    assert_eq!(replicas().await, Some(3), "two URLs lowered the stream");
    assert_eq!(second.warnings(), Vec::<String>::new());

    // Asked for 1 without the second word: kept at 3, and said.
    let asked = NatsBackend::connect(config(&one, Some(1), false))
        .await
        .unwrap();
    assert_eq!(
        replicas().await,
        Some(3),
        "--nats-replicas 1 alone lowered it"
    );
    let said = asked.warnings();
    assert!(
        said.len() == 1 && said[0].contains("--allow-fewer-replicas"),
        "{said:?}"
    );

    // Asked with the second word: lowered; every other process says so.
    let _lowering = NatsBackend::connect(config(&one, Some(1), true))
        .await
        .unwrap();
    assert_eq!(replicas().await, Some(1));
    first.ready().await.unwrap();
    let said = first.warnings();
    assert!(
        said.iter()
            .any(|w| w.contains("another process lowered it")),
        "{said:?}"
    );

    // The number of URLs does not raise it either; a flag does.
    let unasked = NatsBackend::connect(config(&all, None, false))
        .await
        .unwrap();
    assert_eq!(replicas().await, Some(1), "three URLs raised it unasked");
    let said = unasked.warnings();
    assert!(
        said.iter().any(|w| w.contains("--nats-replicas 3")),
        "{said:?}"
    );
    let _raising = NatsBackend::connect(config(&all, Some(3), false))
        .await
        .unwrap();
    assert_eq!(replicas().await, Some(3), "--nats-replicas 3 was ignored");
    first.ready().await.unwrap();
    assert_eq!(first.warnings(), Vec::<String>::new());

    // The stream deleted (an operator), and made again by the first call
    // to need it: that of the process given two URLs, no flag. It comes
    // back with the replicas every process relied on, not its default.
    let deleted = observer
        .request("$JS.API.STREAM.DELETE.COORDREP", "".into())
        .await
        .unwrap();
    let deleted: serde_json::Value = serde_json::from_slice(&deleted.payload).unwrap();
    assert_eq!(deleted["success"], serde_json::json!(true), "{deleted}");
    let started = Instant::now();
    while second
        .put(
            "~lock:1:rep:x",
            "holder",
            b"v",
            Some(60_000),
            &coord_host::backend::Condition::Always,
        )
        .await
        .is_err()
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "never made again"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        replicas().await,
        Some(3),
        "made again with fewer replicas than relied on"
    );
}

/// Outside testers SIGSTOPped the server a `coord serve` was connected
/// to: every request took 10 s and answered 503 for 181 s, until the
/// client's pings (one a minute) gave up on it, while a coord on the other
/// servers answered throughout. A paused server must be left for another
/// within about the response timeout, as a killed one is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_is_left_for_another_as_a_killed_one_is() {
    let cluster = Cluster::start("pause");
    let backend = connect(&cluster, "COORDPAUSE").await;
    let runtime = Runtime::new(backend.clone()).unwrap();
    let mut instance = runtime.instantiate().await.unwrap();
    let limiter = coord_host::ratelimit::Limiter {
        id: "pause".into(),
        limit: 1_000_000,
        window_ms: 60_000,
        algorithm: None,
    };
    instance
        .ratelimit()
        .check(&limiter, "k", Some(1))
        .await
        .unwrap()
        .unwrap();
    let paused = cluster.signal_by_port(backend.server_port(), "STOP");
    let since = Instant::now();
    let mut failed = 0;
    // A hang bound at half the 181 s seen before the fix, not a speed target.
    let recovered = loop {
        match instance
            .ratelimit()
            .check(&limiter, "k", Some(1))
            .await
            .unwrap()
        {
            Ok(_) => break Some(since.elapsed()),
            Err(_) if since.elapsed() < Duration::from_secs(90) => failed += 1,
            Err(_) => break None,
        }
    };
    let now_on = backend.server_port();
    cluster.signal_by_port(
        cluster
            .nodes
            .iter()
            .find(|n| n.name == paused)
            .unwrap()
            .client_port,
        "CONT",
    );
    let recovered = recovered.unwrap_or_else(|| {
        panic!("still failing 90 s after {paused} was paused ({failed} calls failed)")
    });
    eprintln!(
        "{paused} paused: {failed} calls failed; the first success {recovered:?} after, \
         on the server at port {now_on}"
    );
}

/// Outside testers killed 2 of 3 servers: every `/readyz` answered 200
/// while every adjust was 503 (10008). Ready means the stream can take a
/// write: not ready within seconds of the quorum's loss, ready again once
/// it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_streams_quorum() {
    use coord_host::backend::Backend;
    let mut cluster = Cluster::start("ready");
    let backend = connect(&cluster, "COORDREADY").await;
    // Until a poll says `want`, 240 polls 250 ms apart: a bound on a store
    // that never changes its answer, not a speed target.
    async fn until(backend: &NatsBackend, want: bool) -> bool {
        for _ in 0..240 {
            if backend.ready().await.is_ok() == want {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        false
    }
    assert!(until(&backend, true).await, "never ready with all three up");
    // Keep the stream's leader; kill the other two, so the server that
    // answers is the one that led, as outside testers had it.
    let observer = async_nats::connect(cluster.url().split(',').collect::<Vec<_>>())
        .await
        .unwrap();
    let leader = stream_leader(&observer, "COORDREADY").await.unwrap();
    let others: Vec<String> = ["n0", "n1", "n2"]
        .into_iter()
        .filter(|n| *n != leader)
        .map(str::to_string)
        .collect();
    for other in &others {
        cluster.kill(other);
    }
    assert!(
        until(&backend, false).await,
        "still ready with 2 of 3 servers killed"
    );
    assert!(
        backend
            .put(
                "p",
                "k",
                b"v",
                None,
                &coord_host::backend::Condition::Always
            )
            .await
            .is_err(),
        "and a write fails meanwhile"
    );
    for other in &others {
        cluster.restart(other);
    }
    assert!(
        until(&backend, true).await,
        "not ready again with the quorum back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_stream_leader_mid_contention_grants_nothing_twice_and_work_resumes() {
    let mut cluster = Cluster::start("leader");
    let backend = connect(&cluster, "COORDCLUSTER").await;
    let runtime = Arc::new(Runtime::new(backend).unwrap());
    let register = Arc::new(FencedRegister::default());
    let stop = Arc::new(AtomicBool::new(false));
    let killed_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let resumed_after: Arc<Mutex<Option<Duration>>> = Arc::default();
    let (sections, unavailable, refused) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let fences: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let (runtime, register, stop, killed_at, resumed_after) = (
            runtime.clone(),
            register.clone(),
            stop.clone(),
            killed_at.clone(),
            resumed_after.clone(),
        );
        let (sections, unavailable, refused, fences) = (
            sections.clone(),
            unavailable.clone(),
            refused.clone(),
            fences.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut instance: Instance = runtime.instantiate().await.unwrap();
            let resource = format!("item:{}", t % 2);
            while !stop.load(Ordering::SeqCst) {
                let began = Instant::now();
                let options = AcquireOptions::new().ttl_ms(2_000).wait_up_to(1_000);
                let lock = match instance
                    .lock()
                    .acquire("stock", &resource, options)
                    .await
                    .unwrap()
                {
                    Ok(AcquireOutcome::Acquired(lock)) => lock,
                    Ok(AcquireOutcome::Busy(_)) => continue,
                    Err(_) => {
                        unavailable.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // Work has resumed once an acquire sent after the kill
                // succeeds (one in flight at the kill proves nothing).
                if let Some(at) = *killed_at.lock().unwrap()
                    && began > at
                {
                    resumed_after.lock().unwrap().get_or_insert(at.elapsed());
                }
                fences.lock().unwrap().push((resource.clone(), lock.fence));
                sections.fetch_add(1, Ordering::SeqCst);
                if !register.write(&resource, lock.fence) {
                    refused.fetch_add(1, Ordering::SeqCst);
                }
                let _ = instance.lock().release(&lock).await;
            }
        }));
    }
    // Contend, kill the stream's leader, contend until work resumes.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before_kill = sections.load(Ordering::SeqCst);
    assert!(before_kill > 0, "no lock was taken before the kill");
    let observer = async_nats::connect(cluster.url().split(',').collect::<Vec<_>>())
        .await
        .unwrap();
    let leader = stream_leader(&observer, "COORDCLUSTER").await.unwrap();
    drop(observer);
    cluster.kill(&leader);
    *killed_at.lock().unwrap() = Some(Instant::now());
    let deadline = Instant::now() + Duration::from_secs(40);
    while resumed_after.lock().unwrap().is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }

    let resumed = resumed_after
        .lock()
        .unwrap()
        .expect("no lock was taken after the leader was killed");
    let fences = fences.lock().unwrap();
    let unique: std::collections::HashSet<_> = fences.iter().collect();
    assert_eq!(
        unique.len(),
        fences.len(),
        "two acquisitions shared a fence"
    );
    for resource in ["item:0", "item:1"] {
        let order: Vec<u64> = fences
            .iter()
            .filter(|(r, _)| r == resource)
            .map(|(_, f)| *f)
            .collect();
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "{resource}'s fences went back: {order:?}"
        );
    }
    assert_eq!(
        refused.load(Ordering::SeqCst),
        0,
        "a holder's write was refused: two held one lock"
    );
    println!(
        "leader {leader} killed after {before_kill} sections; an acquire sent after the kill \
         succeeded {} ms after it; {} sections in all, {} calls unavailable meanwhile",
        resumed.as_millis(),
        sections.load(Ordering::SeqCst),
        unavailable.load(Ordering::SeqCst)
    );
}

/// A waiter connected to one node and a writer to another, with re-checks
/// an hour apart: the waiter's subscription must reach the writer's node
/// before the write's announcement, or the waiter answers only because
/// something else woke it. 30 rounds, half writing the moment the waiter
/// sleeps. Run by hand (`-- --ignored nats_cluster::a_waiter_on_one_node`)
/// until it has a record in CI's load: it passed 4 runs of 30 rounds,
/// 3 of them with both cores kept busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a 3-node experiment on cross-node wake-ups, run by hand"]
async fn a_waiter_on_one_node_is_woken_by_a_write_through_another() {
    use coord_host::backend::{Backend, Condition, Outcome};
    let cluster = Cluster::start("crossnode");
    let on_node = |name: &str| {
        let mut config = NatsConfig::new(&format!("nats://127.0.0.1:{}", cluster.port_of(name)));
        config.replicas = Some(3);
        config.stream = "COORDCROSS".into();
        config.response_timeout = Duration::from_secs(15);
        config.recheck = Duration::from_secs(3600);
        config
    };
    let connect_to = |config: NatsConfig| async move {
        let started = Instant::now();
        loop {
            match NatsBackend::connect(config.clone()).await {
                Ok(backend) => return Arc::new(backend),
                Err(_) if started.elapsed() < Duration::from_secs(60) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("the cluster never took the stream: {e:?}"),
            }
        }
    };
    let waiting = connect_to(on_node("n0")).await;
    let writer = connect_to(on_node("n2")).await;
    for round in 0..30 {
        let p = format!("eph:1:cross:{}", round % 3);
        let after = waiting.list(&p, "").await.unwrap().revision;
        let waiter = {
            let (waiting, p) = (waiting.clone(), p.clone());
            tokio::spawn(async move { waiting.wait(&p, after, 3_600_000).await })
        };
        if round % 2 == 0 {
            common::bounded(async {
                while waiting.waiters(&p) == 0 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
            .await;
        }
        let reply = writer
            .put(
                &p,
                "k",
                format!("{round}").as_bytes(),
                None,
                &Condition::Always,
            )
            .await
            .unwrap();
        let Outcome::Applied(written) = reply.outcome else {
            panic!("round {round}: {reply:?}");
        };
        let woken = common::bounded(waiter).await.unwrap().unwrap();
        assert!(
            woken >= written.revision && woken > after,
            "round {round}: woken at {woken}, written at {}",
            written.revision
        );
    }
}
