//! A release that failed as `unavailable` is finished by the host once the
//! store answers again, guarded by the holder's fence and owner, so it never
//! frees anyone else. Outside testers saw an adjust whose release failed
//! during a failover answer 200 and leave its item busy for the rest of
//! the lock's TTL after the store came back.

use crate::common;

use common::no_wait;

use std::sync::Arc;
use std::time::Duration;

use common::Harness;
use coord_component::keys::lock_partition;
use coord_host::holdings::background_release_pending;
use coord_host::lock::*;
use coord_host::{Instance, Runtime};
use coord_testing::faulty::FaultyBackend;

const HISTORY: usize = coord_component::memory::DEFAULT_HISTORY;

per_backend!(
    a_release_that_failed_is_finished_once_the_store_answers,
    a_finished_release_never_frees_a_later_holder,
);

fn resource() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("item:{}-{nanos}", std::process::id())
}

/// Poll until `done`, for at most 600 rounds of 50 ms: the background
/// retry's first attempt comes 50 ms after the failure; this bound only
/// catches a retry that never comes.
async fn eventually(mut done: impl AsyncFnMut() -> bool) -> bool {
    for _ in 0..600 {
        if done().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Take the free lock on `resource` for `ttl_ms`.
async fn take(instance: &mut Instance, resource: &str, ttl_ms: u64) -> HeldLock {
    match instance
        .lock()
        .acquire("retry", resource, no_wait(ttl_ms))
        .await
        .unwrap()
        .unwrap()
    {
        AcquireOutcome::Acquired(lock) => lock,
        AcquireOutcome::Busy(holder) => panic!("not free at first: {holder:?}"),
    }
}

async fn a_release_that_failed_is_finished_once_the_store_answers(h: Harness) {
    let faulty = Arc::new(FaultyBackend::new(h.backend.clone(), 1));
    let mut holder = common::instance_on(faulty.clone()).await;
    let mut observer = common::instance_on(h.backend.clone()).await;
    let resource = resource();
    let lock = take(&mut holder, &resource, 60_000).await;
    faulty.set_deletes_down(true);
    assert!(matches!(
        holder.lock().release(&lock).await.unwrap(),
        Err(Error::Unavailable(_))
    ));
    assert!(
        observer
            .lock()
            .inspect("retry", &resource)
            .await
            .unwrap()
            .unwrap()
            .is_some(),
        "the store never saw the release"
    );
    faulty.set_deletes_down(false);
    let freed = eventually(async || {
        observer
            .lock()
            .inspect("retry", &resource)
            .await
            .unwrap()
            .unwrap()
            .is_none()
    })
    .await;
    assert!(
        freed,
        "the failed release was never finished: the lock stays held for its TTL"
    );
}

async fn a_finished_release_never_frees_a_later_holder(h: Harness) {
    let faulty = Arc::new(FaultyBackend::new(h.backend.clone(), 2));
    let mut first = common::instance_on(faulty.clone()).await;
    let mut second = common::instance_on(h.backend.clone()).await;
    let resource = resource();
    let old = take(&mut first, &resource, 1000).await;
    faulty.set_deletes_down(true);
    assert!(first.lock().release(&old).await.unwrap().is_err());
    // The old lock runs out while the store refuses deletes; another holder
    // takes it. Then the store answers again, and the retry lands on it.
    h.advance(1000);
    let new = loop {
        match second
            .lock()
            .acquire("retry", &resource, no_wait(60_000))
            .await
            .unwrap()
            .unwrap()
        {
            AcquireOutcome::Acquired(new) => break new,
            // A real store's clock: wait out the second.
            AcquireOutcome::Busy(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    assert!(new.fence > old.fence);
    let partition = lock_partition("retry", &resource);
    assert!(
        background_release_pending(&partition),
        "the failed release is not being finished in the background"
    );
    faulty.set_deletes_down(false);
    assert!(
        eventually(async || !background_release_pending(&partition)).await,
        "background releases never ended"
    );
    assert!(
        second.lock().is_held(&new).await.unwrap().unwrap(),
        "a finished release freed a later holder"
    );
}

/// Outside testers: `--redis-replica-acks 1`, the replica of the master
/// holding two items' locks killed, 16 threads adjusting them: every call
/// answered 503, and afterwards both locks were held by nobody for the
/// rest of their TTL. Each write's `WAIT` holds the shared connection for
/// its timeout, so the component's take-back read timed out queued behind
/// them, and the acquires landed later. A server with no replica at all
/// answers every `WAIT` with 0 after its timeout: the same starvation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_refused_for_want_of_replica_acks_leave_no_lock_held() {
    use coord_redis::RedisBackend;
    let url = common::redis_url().await;
    let mut config = common::redis_config(&url, HISTORY, None);
    let plain = Arc::new(RedisBackend::connect(config.clone()).await.unwrap());
    config.replica_acks = 1;
    let acks = Arc::new(RedisBackend::connect(config).await.unwrap());
    let runtime = Arc::new(Runtime::new(acks).unwrap());
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let runtime = runtime.clone();
            tokio::spawn(async move {
                let mut instance = runtime.instantiate().await.unwrap();
                let resource = format!("item:{}", t % 2);
                instance
                    .lock()
                    .acquire("acks", &resource, no_wait(60_000))
                    .await
                    .unwrap()
            })
        })
        .collect();
    for task in tasks {
        let outcome = task.await.unwrap();
        assert!(
            !matches!(outcome, Ok(AcquireOutcome::Acquired(_))),
            "granted without the replica acknowledging it: {outcome:?}"
        );
    }
    let mut observer = common::instance_on(plain).await;
    for resource in ["item:0", "item:1"] {
        let freed = eventually(async || {
            matches!(
                observer.lock().inspect("acks", resource).await.unwrap(),
                Ok(None)
            )
        })
        .await;
        assert!(
            freed,
            "{resource} is held by nobody for its whole TTL: {:?}",
            observer.lock().inspect("acks", resource).await.unwrap()
        );
    }
}

#[tokio::test]
async fn an_acquire_cut_in_flight_whose_read_failed_is_taken_back_when_it_lands() {
    // A request cut while its acquire was in flight, during a stall: the
    // give-back's read of the lock fails too. The acquire may still land
    // when the store wakes; it must then be taken back, not hold the lock
    // for its TTL with a token nobody has.
    use coord_host::backend::memory::MemoryBackend;
    use coord_host::backend::{Backend, Condition};
    use coord_host::clock::SystemClock;

    let store: Arc<dyn Backend> = Arc::new(MemoryBackend::new(Arc::new(SystemClock)));
    let faulty = Arc::new(FaultyBackend::new(store.clone(), 1));
    let partition = lock_partition("retry", &resource());
    let token = b"a-token-this-acquire-minted".to_vec();
    let mut holdings = coord_host::holdings::Holdings::default();
    let _cut = holdings.sending(
        &partition,
        "holder",
        &token,
        &Condition::Absent,
        Some(60_000),
    );
    faulty.set_rate(1.0);
    let stalled: Arc<dyn Backend> = faulty.clone();
    assert_eq!(holdings.give_back(&stalled).await, 0);
    // The store wakes and runs the acquire it held.
    store
        .put(
            &partition,
            "holder",
            &token,
            Some(60_000),
            &Condition::Absent,
        )
        .await
        .unwrap();
    faulty.set_rate(0.0);
    assert!(
        eventually(async || store
            .get(&partition, "holder")
            .await
            .unwrap()
            .entry
            .is_none())
        .await,
        "the late acquire still holds the lock"
    );
}
