//! The lease, end to end: the real `coord.wasm` in wasmtime, over every
//! backend, with the store's clock moved by hand.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{Harness, RedisServer, redis_config};
use coord_host::lease::{Error, HeldLease};
use coord_host::{Instance, Runtime};
use coord_redis::{RedisBackend, RedisConfig};

const HISTORY: usize = coord_component::memory::DEFAULT_HISTORY;
const TTL: u64 = 3000;

per_backend!(
    acquire_renew_and_check_cost_one_store_request_each,
    a_crashed_holder_is_taken_over_after_its_lease_and_writes_wait_the_grace,
    a_resign_hands_over_at_once,
    a_restarted_node_adopts_its_lease_at_the_same_epoch,
    a_displaced_holder_fails_the_commit_point_and_its_write_is_refused,
    a_chain_of_takeovers_with_short_ttls_keeps_the_first_holders_grace,
    a_resign_inside_a_grace_ends_that_epoch_for_its_node,
);

async fn acquire(i: &mut Instance, node: &str) -> Result<HeldLease, Error> {
    i.lease().acquire("store-7", node, TTL).await.unwrap()
}

async fn acquire_renew_and_check_cost_one_store_request_each(h: Harness) {
    let mut i = h.instance().await;
    let calls = i.store_calls();
    let lease = acquire(&mut i, "a").await.unwrap();
    assert_eq!(i.store_calls(), calls + 1, "acquire of a free lease");
    h.advance(TTL / 3);
    let renewed = i.lease().renew(&lease).await.unwrap().unwrap();
    assert_eq!(i.store_calls(), calls + 2, "renew");
    assert_eq!(renewed.epoch, lease.epoch);
    let checked = i.lease().check(&renewed).await.unwrap().unwrap();
    assert_eq!(i.store_calls(), calls + 3, "the commit-point check");
    assert_eq!(checked.expires_at, renewed.expires_at);
}

async fn a_crashed_holder_is_taken_over_after_its_lease_and_writes_wait_the_grace(h: Harness) {
    let (mut a, mut b) = (h.instance().await, h.instance().await);
    let held = acquire(&mut a, "a").await.unwrap();
    h.advance(TTL - 1);
    match acquire(&mut b, "b").await {
        Err(Error::NotHolder(Some(holder))) => {
            assert_eq!((holder.node.as_str(), holder.remaining_ms), ("a", 1));
        }
        other => panic!("a still holds it: {other:?}"),
    }
    // a crashed: it never renews. One millisecond later its lease ran out.
    h.advance(1);
    let taken = acquire(&mut b, "b").await.unwrap();
    assert!(taken.epoch > held.epoch);
    assert_eq!(
        taken.writable_at,
        held.expires_at + TTL,
        "the grace: one more TTL"
    );
    h.advance(TTL / 3);
    let taken = b.lease().renew(&taken).await.unwrap().unwrap();
    assert_eq!(
        b.lease().check(&taken).await.unwrap(),
        Err(Error::InGrace(TTL - TTL / 3)),
        "in store time"
    );
    h.advance(TTL / 3);
    let taken = b.lease().renew(&taken).await.unwrap().unwrap();
    h.advance(TTL - 2 * (TTL / 3));
    assert!(
        b.lease().check(&taken).await.unwrap().is_ok(),
        "past the grace"
    );
}

async fn a_resign_hands_over_at_once(h: Harness) {
    let (mut a, mut b) = (h.instance().await, h.instance().await);
    let held = acquire(&mut a, "a").await.unwrap();
    assert!(a.lease().resign(&held).await.unwrap().unwrap());
    let next = acquire(&mut b, "b").await.unwrap();
    assert_eq!(next.writable_at, 0, "no grace after a resign");
    assert!(b.lease().check(&next).await.unwrap().is_ok());
    let seen = a
        .lease()
        .observe("store-7")
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!((seen.node.as_str(), seen.epoch), ("b", next.epoch));
}

async fn a_restarted_node_adopts_its_lease_at_the_same_epoch(h: Harness) {
    let held = acquire(&mut h.instance().await, "a").await.unwrap();
    h.advance(TTL / 2);
    // A new process of node a: no memory of the lease.
    let mut restarted = h.instance().await;
    let adopted = acquire(&mut restarted, "a").await.unwrap();
    assert_eq!(adopted.epoch, held.epoch);
    assert!(
        adopted.expires_at > held.expires_at,
        "renewed by the adoption"
    );
    assert!(restarted.lease().check(&adopted).await.unwrap().is_ok());
}

async fn a_displaced_holder_fails_the_commit_point_and_its_write_is_refused(h: Harness) {
    let (mut a, mut b) = (h.instance().await, h.instance().await);
    let old = acquire(&mut a, "a").await.unwrap();
    // The register at the write boundary: the highest epoch written.
    let mut highest = 0;
    let mut write = |epoch: u64| {
        if epoch < highest {
            return false;
        }
        highest = epoch;
        true
    };
    assert!(a.lease().check(&old).await.unwrap().is_ok());
    assert!(write(old.epoch));
    // a stalls past its lease and the grace; b takes over and writes.
    h.advance(TTL);
    let new = acquire(&mut b, "b").await.unwrap();
    h.advance(TTL / 2);
    let new = b.lease().renew(&new).await.unwrap().unwrap();
    h.advance(TTL / 2);
    assert!(b.lease().check(&new).await.unwrap().is_ok());
    assert!(write(new.epoch));
    // a wakes: the commit point stops it; had it written, the epoch would.
    match a.lease().check(&old).await.unwrap() {
        Err(Error::NotHolder(Some(holder))) => assert_eq!(holder.node, "b"),
        other => panic!("a is not the holder: {other:?}"),
    }
    assert!(matches!(
        a.lease().renew(&old).await.unwrap(),
        Err(Error::NotHolder(_))
    ));
    assert!(!write(old.epoch), "the fence refuses the stale epoch");
}

/// A store that cannot be reached is `unavailable`: never `not-holder`,
/// never `in-grace`, never a lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_store_is_unavailable_never_not_holder() {
    let mut server = RedisServer::spawn().expect("a private redis-server");
    let backend = Arc::new(
        RedisBackend::connect(RedisConfig {
            response_timeout: Duration::from_millis(300),
            ..redis_config(&server.url(), 64, None)
        })
        .await
        .unwrap(),
    );
    let mut i = Runtime::new(backend).unwrap().instantiate().await.unwrap();
    let held = i
        .lease()
        .acquire("store-7", "a", TTL)
        .await
        .unwrap()
        .unwrap();
    server.stop();
    for outcome in [
        i.lease().acquire("store-7", "b", TTL).await.unwrap(),
        i.lease().renew(&held).await.unwrap(),
        i.lease().check(&held).await.unwrap(),
    ] {
        assert!(matches!(outcome, Err(Error::Unavailable(_))), "{outcome:?}");
    }
    assert!(matches!(
        i.lease().observe("store-7").await.unwrap(),
        Err(Error::Unavailable(_))
    ));
}

/// Outside testers: P (ttl 1000) passes the commit point at t; Q takes over
/// at t+1000 with ttl 200 and is told it may write at t+2000, but its entry
/// was stored for 400 ms, so R took over at t+1200 writable at t+1400, or
/// found the lease free at t+1400, while P might still write until t+2000.
async fn a_chain_of_takeovers_with_short_ttls_keeps_the_first_holders_grace(h: Harness) {
    let (mut p, mut q, mut r) = (h.instance().await, h.instance().await, h.instance().await);
    let held = p
        .lease()
        .acquire("chain", "p", 1000)
        .await
        .unwrap()
        .unwrap();
    assert!(p.lease().check(&held).await.unwrap().is_ok());
    let p_may_write_until = held.expires_at + 1000;
    h.advance(1000);
    let taken = q.lease().acquire("chain", "q", 200).await.unwrap().unwrap();
    assert_eq!(taken.writable_at, p_may_write_until);
    // Q renews early, as a holder does, then stops; R keeps trying.
    h.advance(60);
    let taken = q.lease().renew(&taken).await.unwrap().unwrap();
    assert!(
        taken.expires_at + 200 >= p_may_write_until,
        "Q's entry outlives P's grace"
    );
    for _ in 0..20 {
        h.advance(100);
        match r.lease().acquire("chain", "r", 200).await.unwrap() {
            Ok(next) => {
                let now = h.backend.now().await.unwrap();
                assert!(
                    next.writable_at >= p_may_write_until || now >= p_may_write_until,
                    "R is writable at {} (now {now}), inside P's grace to {p_may_write_until}",
                    next.writable_at
                );
                assert!(next.epoch > taken.epoch);
                return;
            }
            Err(Error::NotHolder(Some(holder))) => assert_eq!(holder.node, "q"),
            Err(other) => panic!("{other:?}"),
        }
    }
    panic!("R never took the lease over");
}

/// Outside testers: Q took over, resigned inside the grace (true), resigned
/// again (true), renewed (ok, same epoch) and passed the check after the
/// grace: the resigned node wrote.
async fn a_resign_inside_a_grace_ends_that_epoch_for_its_node(h: Harness) {
    let (mut p, mut q, mut r) = (h.instance().await, h.instance().await, h.instance().await);
    p.lease().acquire("quit", "p", 1000).await.unwrap().unwrap();
    h.advance(1000);
    let taken = q.lease().acquire("quit", "q", 1000).await.unwrap().unwrap();
    h.advance(200);
    assert!(q.lease().resign(&taken).await.unwrap().unwrap());
    assert!(
        !q.lease().resign(&taken).await.unwrap().unwrap(),
        "resign twice"
    );
    assert!(matches!(
        q.lease().renew(&taken).await.unwrap(),
        Err(Error::NotHolder(None))
    ));
    assert_eq!(q.lease().observe("quit").await.unwrap().unwrap(), None);
    let next = r.lease().acquire("quit", "r", 1000).await.unwrap().unwrap();
    assert_eq!(
        next.writable_at, taken.writable_at,
        "the grace is kept for the next holder"
    );
    h.advance(1000);
    assert!(matches!(
        q.lease().check(&taken).await.unwrap(),
        Err(Error::NotHolder(_))
    ));
    let next = r.lease().renew(&next).await.unwrap().unwrap();
    assert!(r.lease().check(&next).await.unwrap().is_ok());
}
