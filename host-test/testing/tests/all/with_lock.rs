//! `Runtime::with_lock`: work under a lock that is kept alive while it runs,
//! a lost signal, and a release whatever happens — on memory and on Redis,
//! in real time (the refresher keeps time with tokio, as it does in use), with
//! short TTLs. The runs whose acquire waits for another holder run on Redis
//! in real time, and on memory with the store's clock on tokio's, paused, so
//! that the two clocks move together exactly.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::stall_proxy::StallProxy;
use common::{RedisServer, redis_config, redis_url};
use coord_component::keys::lock_partition;
use coord_host::Runtime;
use coord_host::backend::Backend;
use coord_host::backend::memory::MemoryBackend;
use coord_host::clock::TokioClock;
use coord_host::lock::{AcquireOptions, AcquireOutcome};
use coord_host::with_lock::{LostBecause, Ran, WithLock, WithLockError};
use coord_redis::{RedisBackend, RedisConfig};
use coord_testing::recording::RecordingBackend;
use futures_util::FutureExt as _;

const ID: &str = "reports.nightly";
/// The TTL of most runs here.
const TTL_MS: u64 = 300;
/// The long job's TTL: it renews every third of it, so a test process that
/// is not scheduled for up to two thirds of it (a busy 2-core machine) still
/// keeps the lock.
const LONG_TTL_MS: u64 = 1000;

fn options(ttl_ms: u64) -> AcquireOptions {
    AcquireOptions::new().ttl_ms(ttl_ms).no_wait()
}

/// A store on a real clock, every call recorded.
type Store = Arc<RecordingBackend>;

async fn memory() -> Store {
    Arc::new(RecordingBackend::new(Arc::new(MemoryBackend::default())))
}

async fn redis() -> Store {
    let url = redis_url().await;
    let backend = RedisBackend::connect(redis_config(&url, 64, None))
        .await
        .unwrap();
    Arc::new(RecordingBackend::new(Arc::new(backend)))
}

macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        mod on_memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::memory().await).await
                }
            )*
        }
        mod on_redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::redis().await).await
                }
            )*
        }
    };
}

on_both!(
    a_job_ten_times_its_ttl_keeps_its_lock_and_no_extend_follows_the_release,
    a_force_release_fires_the_lost_signal_and_the_run_is_lost,
    without_refresh_the_signal_fires_when_the_ttl_runs_out,
    a_panicking_job_is_released_and_its_panic_goes_on,
    a_cancelled_run_releases_its_lock,
    a_held_lock_is_busy_and_the_job_does_not_run,
);

async fn a_job_ten_times_its_ttl_keeps_its_lock_and_no_extend_follows_the_release(store: Store) {
    let runtime = Runtime::new(store.clone()).unwrap();
    let mut rival = runtime.instantiate().await.unwrap();
    let resource = "ten-ttls";
    let ran = runtime
        .with_lock(
            ID,
            resource,
            WithLock::refreshing(options(LONG_TTL_MS)),
            |guard| {
                let runtime = runtime.clone();
                async move {
                    let mut observer = runtime.instantiate().await.unwrap();
                    for _ in 0..10 {
                        tokio::time::sleep(Duration::from_millis(LONG_TTL_MS)).await;
                        let holder = observer
                            .lock()
                            .inspect(ID, resource)
                            .await
                            .unwrap()
                            .unwrap();
                        assert_eq!(
                            holder.map(|h| h.fence),
                            Some(guard.fence()),
                            "still held, at the same fence"
                        );
                        assert!(!guard.is_lost());
                    }
                    guard.fence()
                }
            },
        )
        .await
        .unwrap();
    let Ran::Done(fence) = ran else {
        panic!("expected the job to run: {ran:?}")
    };
    assert_eq!(
        rival.lock().inspect(ID, resource).await.unwrap().unwrap(),
        None,
        "released"
    );
    // Long enough for a refresher that outlived the release to extend again.
    tokio::time::sleep(Duration::from_millis(LONG_TTL_MS)).await;
    let partition = lock_partition(ID, resource);
    let calls: Vec<_> = store
        .calls()
        .into_iter()
        .filter(|c| c.partition == partition)
        .map(|c| c.operation)
        .collect();
    let extends = calls.iter().filter(|op| **op == "touch").count();
    assert!(extends >= 20, "extended every TTL/3 for 10 TTLs: {extends}");
    let release = calls.iter().rposition(|op| *op == "delete").unwrap();
    assert!(
        !calls[release..].contains(&"touch"),
        "no extend after the release: {calls:?}"
    );
    assert!(fence > 0);
}

async fn a_force_release_fires_the_lost_signal_and_the_run_is_lost(store: Store) {
    let runtime = Runtime::new(store).unwrap();
    let mut rival = runtime.instantiate().await.unwrap();
    let resource = "taken";
    let saw_it = Arc::new(AtomicBool::new(false));
    let saw = saw_it.clone();
    let run = runtime.with_lock(
        ID,
        resource,
        WithLock::refreshing(options(TTL_MS)),
        |guard| async move {
            tokio::time::timeout(Duration::from_secs(5), guard.lost().cancelled())
                .await
                .expect("the lost signal fires");
            saw.store(true, Ordering::SeqCst);
        },
    );
    let take = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(
            rival
                .lock()
                .force_release(ID, resource)
                .await
                .unwrap()
                .unwrap()
        );
        rival
            .lock()
            .acquire(ID, resource, options(60_000))
            .await
            .unwrap()
            .unwrap()
    };
    let (ran, taken) = tokio::join!(run, take);
    assert!(saw_it.load(Ordering::SeqCst), "the job was told");
    let AcquireOutcome::Acquired(taken) = taken else {
        panic!("the rival took it: {taken:?}")
    };
    match ran {
        Err(WithLockError::Lost { fence, because }) => {
            assert_eq!(because, LostBecause::Taken);
            assert!(taken.fence > fence);
        }
        other => panic!("expected lost, got {other:?}"),
    }
    let holder = rival
        .lock()
        .inspect(ID, resource)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        holder.fence, taken.fence,
        "the lost run freed nobody else's lock"
    );
}

async fn without_refresh_the_signal_fires_when_the_ttl_runs_out(store: Store) {
    let runtime = Runtime::new(store).unwrap();
    let ran = runtime
        .with_lock(
            ID,
            "once",
            WithLock::once(options(200)),
            |guard| async move {
                let started = tokio::time::Instant::now();
                guard.lost().cancelled().await;
                started.elapsed()
            },
        )
        .await;
    match ran {
        Err(WithLockError::Lost { because, .. }) => assert_eq!(because, LostBecause::Expired),
        other => panic!("expected lost, got {other:?}"),
    }
}

async fn a_panicking_job_is_released_and_its_panic_goes_on(store: Store) {
    let runtime = Runtime::new(store).unwrap();
    let mut observer = runtime.instantiate().await.unwrap();
    let run = runtime.with_lock(
        ID,
        "panics",
        WithLock::refreshing(options(TTL_MS)),
        |_guard| async {
            panic!("the job failed");
        },
    );
    let caught = std::panic::AssertUnwindSafe(run).catch_unwind().await;
    assert!(caught.is_err(), "the panic reached the caller");
    assert_eq!(
        observer
            .lock()
            .inspect(ID, "panics")
            .await
            .unwrap()
            .unwrap(),
        None,
        "released"
    );
}

async fn a_cancelled_run_releases_its_lock(store: Store) {
    let runtime = Runtime::new(store).unwrap();
    let mut observer = runtime.instantiate().await.unwrap();
    let started = Arc::new(tokio::sync::Notify::new());
    let running = started.clone();
    let spawned = runtime.clone();
    let task = tokio::spawn(async move {
        spawned
            .with_lock(
                ID,
                "cancelled",
                WithLock::refreshing(options(60_000)),
                |_guard| async move {
                    running.notify_one();
                    std::future::pending::<()>().await;
                },
            )
            .await
    });
    started.notified().await;
    assert!(
        observer
            .lock()
            .inspect(ID, "cancelled")
            .await
            .unwrap()
            .unwrap()
            .is_some()
    );
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    // Released from a spawned task, long before the 60 s TTL.
    let freed = tokio::time::timeout(Duration::from_secs(5), async {
        while observer
            .lock()
            .inspect(ID, "cancelled")
            .await
            .unwrap()
            .unwrap()
            .is_some()
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(freed.is_ok(), "the cancelled run's lock was released");
}

async fn a_held_lock_is_busy_and_the_job_does_not_run(store: Store) {
    let runtime = Runtime::new(store).unwrap();
    let mut rival = runtime.instantiate().await.unwrap();
    let AcquireOutcome::Acquired(held) = rival
        .lock()
        .acquire(ID, "held", options(60_000))
        .await
        .unwrap()
        .unwrap()
    else {
        panic!("the rival could not take it")
    };
    let ran = runtime
        .with_lock(
            ID,
            "held",
            WithLock::refreshing(options(TTL_MS)),
            |_guard| async { must_not_run() },
        )
        .await
        .unwrap();
    let Ran::Busy(holder) = ran else {
        panic!("expected busy")
    };
    assert_eq!(holder.fence, held.fence);
}

/// The store stalls (a proxy holds the traffic) past the TTL while the job
/// runs: the refresher cannot extend, the lost signal fires about one TTL
/// after the last extend was sent, and a rival takes the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_stalled_past_the_ttl_fires_the_lost_signal() {
    let server = RedisServer::spawn().expect("a private redis-server");
    let port: u16 = server.url().rsplit(':').next().unwrap().parse().unwrap();
    let proxy = StallProxy::start(port).await;
    let via_proxy = RedisConfig {
        response_timeout: Duration::from_secs(2),
        ..redis_config(&format!("redis://127.0.0.1:{}", proxy.port), 64, None)
    };
    let prefix = via_proxy.prefix.clone();
    let stalled: Arc<dyn Backend> = Arc::new(RedisBackend::connect(via_proxy).await.unwrap());
    let direct: Arc<dyn Backend> = Arc::new(
        RedisBackend::connect(RedisConfig {
            prefix,
            ..redis_config(&server.url(), 64, None)
        })
        .await
        .unwrap(),
    );
    let runtime = Runtime::new(stalled).unwrap();
    let mut rival = Runtime::new(direct).unwrap().instantiate().await.unwrap();
    let proxy = &proxy;
    let ran = runtime
        .with_lock(
            ID,
            "stalled",
            WithLock::refreshing(options(TTL_MS)),
            |guard| async move {
                tokio::time::sleep(Duration::from_millis(TTL_MS)).await;
                proxy.stall(true);
                let stalled_at = tokio::time::Instant::now();
                tokio::time::timeout(Duration::from_secs(5), guard.lost().cancelled())
                    .await
                    .expect("the lost signal fires during the stall");
                stalled_at.elapsed()
            },
        )
        .await;
    match ran {
        Err(WithLockError::Lost { because, .. }) => {
            assert_eq!(because, LostBecause::Unreachable)
        }
        other => panic!("expected lost, got {other:?}"),
    }
    // The lock really expired on Redis: a rival connected directly takes it.
    let taken = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if let AcquireOutcome::Acquired(lock) = rival
                .lock()
                .acquire(ID, "stalled", options(60_000))
                .await
                .unwrap()
                .unwrap()
            {
                return lock;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
    assert!(taken.fence > 0);
    proxy.stall(false);
}

/// A job for a run that must not start.
fn must_not_run() -> u32 {
    panic!("the job must not run while another holds the lock")
}

/// A store in memory on tokio's clock: with tokio's time paused, the store's
/// time and the refresher's timers move together, to the millisecond.
fn memory_on_tokio_time() -> Arc<dyn Backend> {
    Arc::new(MemoryBackend::new(Arc::new(TokioClock::new(
        1_750_000_000_000,
    ))))
}

async fn redis_store() -> Arc<dyn Backend> {
    redis().await
}

/// The tests of an acquire that waits for another holder longer than its
/// own TTL: on memory with the store's clock and tokio's paused together,
/// and on Redis in real time.
macro_rules! waiting {
    ($($name:ident),* $(,)?) => {
        mod waiting_on_memory {
            $(
                #[tokio::test(start_paused = true)]
                async fn $name() {
                    super::$name(super::memory_on_tokio_time()).await
                }
            )*
        }
        mod waiting_on_redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::redis_store().await).await
                }
            )*
        }
    };
}

waiting!(
    an_acquire_that_waited_past_its_ttl_keeps_its_lock,
    two_runs_on_one_lock_take_turns_and_neither_is_lost,
    without_refresh_a_waited_lock_is_presumed_expired_one_ttl_after_it_was_taken,
);

/// Acquire with a wait long enough for any holder here, and `ttl_ms`.
fn waiting(ttl_ms: u64) -> AcquireOptions {
    AcquireOptions::new().ttl_ms(ttl_ms).wait_up_to(30_000)
}

/// Another holder keeps the lock (a 60 s TTL) for two of the run's TTLs,
/// then releases it: the run's acquire waits that long, then takes it. The
/// refresher once counted the TTL from when the acquire was sent, so it
/// found the lock presumed expired before the work began and the run was
/// reported lost (`Unreachable`) while it held the lock all along.
async fn an_acquire_that_waited_past_its_ttl_keeps_its_lock(store: Arc<dyn Backend>) {
    let runtime = Runtime::new(store).unwrap();
    let mut holder = runtime.instantiate().await.unwrap();
    let resource = "waited";
    let AcquireOutcome::Acquired(held) = holder
        .lock()
        .acquire(ID, resource, options(60_000))
        .await
        .unwrap()
        .unwrap()
    else {
        panic!("the holder could not take it")
    };
    let hold = Duration::from_millis(2 * LONG_TTL_MS);
    let started = tokio::time::Instant::now();
    let run = runtime.with_lock(
        ID,
        resource,
        WithLock::refreshing(waiting(LONG_TTL_MS)),
        |guard| {
            let runtime = runtime.clone();
            async move {
                let waited = started.elapsed();
                let mut observer = runtime.instantiate().await.unwrap();
                let mut seen = Vec::new();
                // Three TTLs of work, the lock refreshed beside it.
                for _ in 0..3 {
                    tokio::time::sleep(Duration::from_millis(LONG_TTL_MS)).await;
                    let holder = observer
                        .lock()
                        .inspect(ID, resource)
                        .await
                        .unwrap()
                        .unwrap();
                    seen.push((guard.is_lost(), holder.map(|h| h.fence)));
                }
                (waited, guard.fence(), seen)
            }
        },
    );
    let release = async {
        tokio::time::sleep(hold).await;
        assert!(holder.lock().release(&held).await.unwrap().unwrap());
    };
    let (ran, ()) = tokio::join!(run, release);
    let (waited, fence, seen) = match ran {
        Ok(Ran::Done(done)) => done,
        other => panic!("the run held the lock throughout, yet: {other:?}"),
    };
    assert!(waited >= hold, "the acquire waited {waited:?}");
    assert!(fence > held.fence);
    assert_eq!(
        seen,
        vec![(false, Some(fence)); 3],
        "never lost, always held"
    );
}

/// `coord demo` run twice at once on one store: each runs a job of a few
/// TTLs under `with_lock`, so one acquire waits for the other's release,
/// more than its TTL. In every round one demo once exited with "the lock
/// (fence …) was lost while the work ran: Unreachable".
async fn two_runs_on_one_lock_take_turns_and_neither_is_lost(store: Arc<dyn Backend>) {
    let runtime = Runtime::new(store).unwrap();
    let running = Arc::new(AtomicBool::new(false));
    let run = |name: &'static str| {
        let running = running.clone();
        runtime.with_lock(
            ID,
            "turns",
            WithLock::refreshing(waiting(LONG_TTL_MS)),
            move |guard| async move {
                assert!(!running.swap(true, Ordering::SeqCst), "one at a time");
                tokio::time::sleep(Duration::from_millis(2 * LONG_TTL_MS)).await;
                running.store(false, Ordering::SeqCst);
                (name, guard.fence(), guard.is_lost())
            },
        )
    };
    let (a, b) = tokio::join!(run("a"), run("b"));
    let (Ok(Ran::Done((_, fa, false))), Ok(Ran::Done((_, fb, false)))) = (&a, &b) else {
        panic!("both ran to the end holding the lock: {a:?} {b:?}")
    };
    assert_ne!(fa, fb);
}

/// Without refresh, the lost signal fires when the lock must be presumed
/// expired: one TTL after the store took it (never later: the work began
/// after that), not one TTL after the acquire that waited was sent.
async fn without_refresh_a_waited_lock_is_presumed_expired_one_ttl_after_it_was_taken(
    store: Arc<dyn Backend>,
) {
    // On tokio's paused clock, exact; in real time, the timer's rounding up
    // to the next millisecond, the store's millisecond clock and a busy
    // machine's scheduling come on top.
    let slack = if store.kind() == "memory" {
        Duration::ZERO
    } else {
        Duration::from_millis(LONG_TTL_MS / 10)
    };
    let runtime = Runtime::new(store).unwrap();
    let mut holder = runtime.instantiate().await.unwrap();
    let resource = "waited-once";
    let AcquireOutcome::Acquired(held) = holder
        .lock()
        .acquire(ID, resource, options(60_000))
        .await
        .unwrap()
        .unwrap()
    else {
        panic!("the holder could not take it")
    };
    let signalled = Arc::new(Mutex::new(None));
    let after = signalled.clone();
    let run = runtime.with_lock(
        ID,
        resource,
        WithLock::once(waiting(LONG_TTL_MS)),
        |guard| async move {
            let began = tokio::time::Instant::now();
            guard.lost().cancelled().await;
            *after.lock().unwrap() = Some(began.elapsed());
        },
    );
    let release = async {
        tokio::time::sleep(Duration::from_millis(2 * LONG_TTL_MS)).await;
        assert!(holder.lock().release(&held).await.unwrap().unwrap());
    };
    let (ran, ()) = tokio::join!(run, release);
    match ran {
        Err(WithLockError::Lost { because, .. }) => assert_eq!(because, LostBecause::Expired),
        other => panic!("expected lost, got {other:?}"),
    }
    let signalled = signalled.lock().unwrap().unwrap();
    let ttl = Duration::from_millis(LONG_TTL_MS);
    assert!(
        signalled <= ttl + slack && signalled >= ttl * 3 / 4,
        "the signal fired {signalled:?} into the work, for a TTL of {ttl:?}"
    );
}
