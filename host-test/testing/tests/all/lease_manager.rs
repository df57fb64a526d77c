//! The lease manager: renewal loops, `held` without a round trip, `guard`
//! with the grace and the commit-point check — in tokio's paused time, so
//! the store's clock (`TokioClock`) and every timer move together and a
//! run of minutes takes milliseconds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use coord_host::Runtime;
use coord_host::backend::memory::MemoryBackend;
use coord_host::backend::*;
use coord_host::clock::{Clock, TokioClock};
use coord_host::lease_manager::{GuardError, LeaseManager};
use proptest::prelude::*;

const T0: u64 = 1_750_000_000_000;
const TTL: Duration = Duration::from_secs(3);
const NAME: &str = "store-7";

/// A backend whose calls hang while it is stalled (a network partition or
/// a paused server): they run when the stall ends, late.
struct Stalling {
    inner: Arc<dyn Backend>,
    clock: Arc<dyn Clock>,
    until_ms: AtomicU64,
}

impl Stalling {
    fn stall_for(&self, ms: u64) {
        self.until_ms
            .store(self.clock.now_ms().saturating_add(ms), Ordering::SeqCst);
    }

    async fn pass(&self) {
        let until = self.until_ms.load(Ordering::SeqCst);
        self.clock.sleep_until(until).await;
    }
}

#[async_trait]
impl Backend for Stalling {
    async fn now(&self) -> Result<Millis, StoreError> {
        self.pass().await;
        self.inner.now().await
    }
    async fn get(&self, p: &str, k: &str) -> Result<ReadReply, StoreError> {
        self.pass().await;
        self.inner.get(p, k).await
    }
    async fn list(&self, p: &str, prefix: &str) -> Result<ListReply, StoreError> {
        self.pass().await;
        self.inner.list(p, prefix).await
    }
    async fn put(
        &self,
        p: &str,
        k: &str,
        v: &[u8],
        ttl: Option<u64>,
        c: &Condition,
    ) -> Result<WriteReply, StoreError> {
        self.pass().await;
        self.inner.put(p, k, v, ttl, c).await
    }
    async fn delete(&self, p: &str, k: &str, c: &Condition) -> Result<WriteReply, StoreError> {
        self.pass().await;
        self.inner.delete(p, k, c).await
    }
    async fn touch(
        &self,
        p: &str,
        k: &str,
        ttl: u64,
        c: &Condition,
    ) -> Result<WriteReply, StoreError> {
        self.pass().await;
        self.inner.touch(p, k, ttl, c).await
    }
    async fn changes(&self, p: &str, after: u64, max: u32) -> Result<ChangesReply, StoreError> {
        self.pass().await;
        self.inner.changes(p, after, max).await
    }
    async fn meter(&self, p: &str, k: &str, r: &MeterRequest) -> Result<MeterReply, StoreError> {
        self.pass().await;
        self.inner.meter(p, k, r).await
    }
    async fn wait(&self, p: &str, after: u64, timeout: u64) -> Result<u64, StoreError> {
        self.pass().await;
        self.inner.wait(p, after, timeout).await
    }
}

/// One store on tokio's clock; a stallable path to it for node a, and a
/// direct one for node b and for the observer.
fn stores() -> (Arc<Stalling>, Runtime, Runtime) {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::new(T0));
    let memory: Arc<dyn Backend> = Arc::new(MemoryBackend::new(clock.clone()));
    let stalling = Arc::new(Stalling {
        inner: memory.clone(),
        clock,
        until_ms: AtomicU64::new(0),
    });
    let a = Runtime::new(stalling.clone()).unwrap();
    let direct = Runtime::new(memory).unwrap();
    (stalling, a, direct)
}

#[tokio::test(start_paused = true)]
async fn a_crashed_node_is_replaced_after_the_grace_and_the_new_holder_writes_with_a_higher_epoch()
{
    let (_, a_runtime, direct) = stores();
    let a = LeaseManager::start(a_runtime, "a", TTL);
    let b = LeaseManager::start(direct.clone(), "b", TTL);
    assert!(a.held(NAME).await, "a asked first: it holds");
    assert!(!b.held(NAME).await, "b does not");
    let a_epoch = a
        .guard(NAME, |token| async move { token.epoch() })
        .await
        .unwrap();
    match b.guard(NAME, |_| async {}).await {
        Err(GuardError::NotHolder(Some(holder))) => assert_eq!(holder.node, "a"),
        other => panic!("b is not the holder: {other:?}"),
    }
    // a crashes: its renewals stop, and at once it no longer says it holds.
    a.close();
    assert!(!a.held(NAME).await);
    let crashed = tokio::time::Instant::now();
    // b's loop takes the lease over once a's has run out (within a renewal
    // interval), then must wait the grace before it writes.
    while !b.held(NAME).await {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let taken = crashed.elapsed();
    assert!(
        taken >= TTL - TTL / 3 && taken <= TTL + TTL / 3,
        "taken over after {taken:?}"
    );
    match b.guard(NAME, |_| async {}).await {
        Err(GuardError::InGrace(left)) => assert!(left > Duration::ZERO && left <= TTL),
        other => panic!("b must wait the grace: {other:?}"),
    }
    let b_epoch = loop {
        match b.guard(NAME, |token| async move { token.epoch() }).await {
            Ok(epoch) => break epoch,
            Err(GuardError::InGrace(left)) => tokio::time::sleep(left).await,
            Err(other) => panic!("{other:?}"),
        }
    };
    assert!(b_epoch > a_epoch);
    assert!(
        crashed.elapsed() >= TTL + TTL - TTL / 3,
        "no write before a's lease and its grace had passed: {:?}",
        crashed.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_resign_hands_over_without_a_grace() {
    let (_, a_runtime, direct) = stores();
    let a = LeaseManager::start(a_runtime, "a", TTL);
    let b = LeaseManager::start(direct, "b", TTL);
    assert!(a.held(NAME).await);
    assert!(!b.held(NAME).await);
    assert!(a.resign(NAME).await.unwrap());
    assert!(!a.held(NAME).await);
    tokio::time::sleep(TTL / 3 + Duration::from_millis(10)).await;
    assert!(b.held(NAME).await, "b's loop took it at its next tick");
    assert!(
        b.guard(NAME, |_| async {}).await.is_ok(),
        "and writes at once"
    );
}

/// `held` from the renewal loop never says true after the lease's real
/// expiry in the store, whatever stalls the store's path goes through, and
/// with a rival node ready to take over.
fn held_never_outlives_the_lease(steps: &[(u8, u64)]) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let (stalling, a_runtime, direct) = stores();
        let a = LeaseManager::start(a_runtime, "a", TTL);
        let _b = LeaseManager::start(direct.clone(), "b", TTL);
        let mut observer = direct.instantiate().await.unwrap();
        a.held(NAME).await;
        for &(kind, ms) in steps {
            match kind {
                0 => stalling.stall_for(ms),
                _ => tokio::time::sleep(Duration::from_millis(ms)).await,
            }
            if a.held(NAME).await {
                let holder = observer.lease().observe(NAME).await.unwrap().unwrap();
                let holder = holder.expect("held, so the store has a holder");
                prop_assert_eq!(&holder.node, "a", "held while b holds it");
                prop_assert!(holder.remaining_ms > 0, "held after the lease ran out");
            }
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn held_never_reads_true_after_the_real_expiry(
        steps in proptest::collection::vec((0u8..3, 0u64..4_000), 1..60),
    ) {
        held_never_outlives_the_lease(&steps)?;
    }
}
