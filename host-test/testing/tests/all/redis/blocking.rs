//! `wait-then-put` on a blocking connection: the waiter's put runs in the
//! request it waits in, and a cancelled, timed-out or killed wait never puts
//! twice or wrongly.

use std::sync::Arc;
use std::time::Duration;

use super::{acquire, held, private_server, put, shared_backend};
use crate::common::{RedisServer, bounded, no_wait, redis_config};
use coord_host::backend::{Backend, ChangeKind, Condition, Entry, Outcome, StoreError, WriteReply};
use coord_host::lock::*;
use coord_host::{Instance, Runtime};
use coord_redis::{RedisBackend, RedisConfig};

/// `blocked_clients` from `INFO clients`: connections blocked in a command.
pub(super) async fn blocked_clients(url: &str) -> u64 {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("clients")
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("blocked_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("INFO clients reports blocked_clients")
}

/// Return once exactly `n` connections are blocked on the server at `url`.
pub(super) async fn until_blocked(url: &str, n: u64) {
    while blocked_clients(url).await != n {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A connection to administer the server at `url` (`CLIENT`, `CONFIG`, `ACL`).
pub(super) async fn admin_connection(url: &str) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(url).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

/// Create `k` in `p` with `value` (a minute's TTL) once the partition has
/// changed after `after`, or at `timeout_ms`: a lock waiter's attempt.
pub(super) async fn wait_then_create(
    backend: &RedisBackend,
    value: &[u8],
    after: u64,
    timeout_ms: u64,
) -> Result<WriteReply, StoreError> {
    let absent = Condition::Absent;
    backend
        .wait_then_put("p", "k", value, Some(60_000), &absent, after, timeout_ms)
        .await
}

/// [`wait_then_create`] in a task of its own, with an hour's timeout: in a
/// test's 10 s only a change (or a lost connection) can end its wait.
pub(super) fn spawn_waiter(
    backend: &Arc<RedisBackend>,
    value: &'static [u8],
    after: u64,
) -> tokio::task::JoinHandle<Result<WriteReply, StoreError>> {
    let backend = backend.clone();
    tokio::spawn(async move { wait_then_create(&backend, value, after, 3_600_000).await })
}

/// Delete `k` of `p`, which must be there: the holder's release.
pub(super) async fn release_k(backend: &RedisBackend) {
    applied_entry(
        backend
            .delete("p", "k", &Condition::Always)
            .await
            .unwrap()
            .outcome,
    );
}

/// Two instances on `backend`: one holding the test's lock (for a minute;
/// its held lock is returned too), and one about to wait for it.
async fn held_and_wanted(backend: &Arc<RedisBackend>) -> (Instance, HeldLock, Instance) {
    let runtime = Runtime::new(backend.clone()).unwrap();
    let mut holder = runtime.instantiate().await.unwrap();
    let lock = held(acquire(&mut holder, no_wait(60_000)).await);
    let waiter = runtime.instantiate().await.unwrap();
    (holder, lock, waiter)
}

/// Acquire options that wait up to a minute.
fn wait_a_minute() -> AcquireOptions {
    AcquireOptions::new().ttl_ms(60_000).wait_up_to(60_000)
}

pub(super) fn applied_entry(outcome: Outcome) -> Entry {
    match outcome {
        Outcome::Applied(e) => e,
        other => panic!("expected applied, got {other:?}"),
    }
}

#[tokio::test]
async fn wait_then_put_blocks_on_the_feed_and_puts_in_the_same_request_as_the_release_lands() {
    bounded(async {
        let (server, backend) = private_server().await;
        let url = server.url();
        let held = put(&backend, "k", b"holder", Some(60_000)).await;
        let before = backend.round_trips();
        // An hour's timeout: only the release can end this wait in the test's 10 s.
        let waiter = spawn_waiter(&backend, b"waiter", held.revision);
        until_blocked(&url, 1).await;
        release_k(&backend).await;
        let e = applied_entry(waiter.await.unwrap().unwrap().outcome);
        assert_eq!(e.value, b"waiter");
        assert_eq!(
            backend.round_trips() - before,
            2,
            "the delete, and the waiter's wait and put as one request"
        );
        assert_eq!(backend.blocking_connections_opened(), 1);

        // The connection is kept for the next call. The change is already
        // there, so this one returns at once, and its put finds the waiter.
        let reply = wait_then_create(&backend, b"late", held.revision, 3_600_000)
            .await
            .unwrap();
        assert_eq!(reply.outcome, Outcome::Conflict(Some(e)));
        assert_eq!(backend.blocking_connections_opened(), 1, "reused");
    })
    .await
}

#[tokio::test]
async fn a_cancelled_wait_then_put_never_puts_and_its_connection_is_not_reused() {
    bounded(async {
        let (server, backend) = private_server().await;
        let url = server.url();
        let held = put(&backend, "k", b"holder", Some(60_000)).await;
        let waiter = spawn_waiter(&backend, b"ghost", held.revision);
        until_blocked(&url, 1).await;
        // The caller goes away (an instance dropped mid-call, say).
        waiter.abort();
        assert!(waiter.await.unwrap_err().is_cancelled());
        // Nothing changed the feed and the hour has not passed, so the block
        // can only end with the connection closed, its queued put with it.
        until_blocked(&url, 0).await;
        release_k(&backend).await;
        let reply = wait_then_create(&backend, b"next", held.revision, 3_600_000)
            .await
            .unwrap();
        assert_eq!(applied_entry(reply.outcome).value, b"next");
        assert_eq!(
            backend.blocking_connections_opened(),
            2,
            "the cancelled call's connection was dropped, not reused"
        );
        let feed = backend.changes("p", held.revision, 10).await.unwrap();
        let kinds: Vec<_> = feed.changes.iter().map(|c| c.kind).collect();
        assert_eq!(kinds, [ChangeKind::Delete, ChangeKind::Put], "no ghost put");
    })
    .await
}

#[tokio::test]
async fn a_wait_then_put_that_times_out_still_puts_once() {
    bounded(async {
        let backend = shared_backend(|c| c).await;
        let held = put(&backend, "k", b"holder", Some(60_000)).await;
        let reply = wait_then_create(&backend, b"waiter", held.revision, 20)
            .await
            .unwrap();
        assert_eq!(reply.outcome, Outcome::Conflict(Some(held.clone())));
        assert!(
            reply.now >= held.updated_at + 20,
            "the put ran after the block"
        );
        assert_eq!(backend.blocking_connections_opened(), 1);
    })
    .await
}

#[tokio::test]
async fn a_wait_then_put_after_a_script_flush_loads_the_script_and_puts() {
    bounded(async {
        let (server, backend) = private_server().await;
        let held = put(&backend, "k", b"v1", None).await;
        let mut admin = admin_connection(&server.url()).await;
        let () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut admin)
            .await
            .unwrap();
        // The revision before `held`: the wait ends at once, the put meets NOSCRIPT.
        let guard = Condition::Revision(held.revision);
        let reply = backend
            .wait_then_put("p", "k", b"v2", None, &guard, held.revision - 1, 3_600_000)
            .await
            .unwrap();
        assert_eq!(applied_entry(reply.outcome).value, b"v2");
        assert_eq!(backend.blocking_connections_opened(), 1);
    })
    .await
}

#[tokio::test]
async fn with_no_blocking_connection_free_wait_then_put_waits_on_notifications() {
    bounded(async {
        let backend = shared_backend(|c| RedisConfig {
            blocking_connections: 0,
            ..c
        })
        .await;
        let held = put(&backend, "k", b"holder", Some(60_000)).await;
        let waiter = spawn_waiter(&backend, b"waiter", held.revision);
        while backend.waiters("p") != 1 {
            tokio::task::yield_now().await;
        }
        release_k(&backend).await;
        let e = applied_entry(waiter.await.unwrap().unwrap().outcome);
        assert_eq!(e.value, b"waiter");
        assert_eq!(backend.blocking_connections_opened(), 0);
    })
    .await
}

#[tokio::test]
async fn a_lock_waiter_takes_the_lock_in_the_request_it_waits_in() {
    bounded(async {
        let (server, backend) = private_server().await;
        let url = server.url();
        let (mut holder, lock, mut waiter) = held_and_wanted(&backend).await;
        let waiting = tokio::spawn(async move {
            let options = wait_a_minute();
            let outcome = acquire(&mut waiter, options).await;
            (outcome, waiter.store_calls())
        });
        until_blocked(&url, 1).await;
        assert!(holder.lock().release(&lock).await.unwrap().unwrap());
        let (outcome, store_calls) = waiting.await.unwrap();
        let taken = held(outcome);
        assert!(taken.fence > lock.fence);
        assert_eq!(
            store_calls, 2,
            "a create-if-absent, then one wait-then-put that took the lock"
        );
    })
    .await
}

#[tokio::test]
async fn a_blocking_connection_killed_mid_wait_is_unavailable_never_busy_or_acquired() {
    bounded(async {
        let (server, backend) = private_server().await;
        let url = server.url();
        let (mut holder, lock, mut waiter) = held_and_wanted(&backend).await;
        let waiting = tokio::spawn(async move {
            let options = wait_a_minute();
            (acquire(&mut waiter, options).await, waiter)
        });
        until_blocked(&url, 1).await;
        // Kill exactly the connection blocked in XREAD.
        let mut admin = admin_connection(&server.url()).await;
        let clients: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(&mut admin)
            .await
            .unwrap();
        let blocked = clients
            .lines()
            .find(|l| l.contains("cmd=xread"))
            .and_then(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
            .expect("a client blocked in XREAD")
            .to_string();
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("ID")
            .arg(&blocked)
            .query_async(&mut admin)
            .await
            .unwrap();
        assert_eq!(killed, 1);
        let (outcome, mut waiter) = waiting.await.unwrap();
        assert!(
            matches!(outcome, Err(Error::Unavailable(_))),
            "a lost connection mid-wait must be unavailable, got {outcome:?}"
        );
        // The holder still holds the lock, and the next wait blocks on a
        // fresh connection and takes the lock at the release.
        match acquire(&mut waiter, no_wait(60_000)).await {
            Ok(AcquireOutcome::Busy(h)) => assert_eq!(h.fence, lock.fence),
            other => panic!("the holder must still hold, got {other:?}"),
        }
        let retry = tokio::spawn(async move {
            let options = wait_a_minute();
            acquire(&mut waiter, options).await
        });
        until_blocked(&url, 1).await;
        assert!(holder.lock().release(&lock).await.unwrap().unwrap());
        assert!(held(retry.await.unwrap()).fence > lock.fence);
        assert_eq!(
            backend.blocking_connections_opened(),
            2,
            "the killed connection was not reused"
        );
    })
    .await
}

#[tokio::test]
async fn a_blocking_connection_the_server_closed_while_idle_is_replaced_not_an_error() {
    bounded(async {
        let (server, backend) = private_server().await;
        let first = put(&backend, "k", b"v1", None).await;
        let second = put(&backend, "k", b"v2", None).await;
        // The change is already there: each call below returns at once.
        let reply = backend
            .wait_then_put(
                "p",
                "k",
                b"v3",
                None,
                &Condition::Always,
                first.revision,
                60_000,
            )
            .await
            .unwrap();
        assert_eq!(applied_entry(reply.outcome).value, b"v3");
        assert_eq!(backend.blocking_connections_idle(), 1);
        // The server closes every client connection (as a restart or an idle
        // timeout would), the idle blocking one among them.
        let mut admin = admin_connection(&server.url()).await;
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .arg("SKIPME")
            .arg("yes")
            .query_async(&mut admin)
            .await
            .unwrap();
        assert!(killed >= 1);
        while backend.blocking_connections_idle() != 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let reply = backend
            .wait_then_put(
                "p",
                "k",
                b"v4",
                None,
                &Condition::Always,
                second.revision,
                60_000,
            )
            .await
            .expect("a connection closed while idle is replaced, never reported unavailable");
        assert_eq!(applied_entry(reply.outcome).value, b"v4");
        assert_eq!(backend.blocking_connections_opened(), 2);
    })
    .await
}

#[tokio::test]
async fn a_wait_then_put_ends_its_block_at_its_timeout_not_at_a_cron_tick() {
    bounded(async {
        let (server, backend) = private_server().await;
        // Redis times blocked commands out at its cron tick: once a second
        // here. The host must end the block at the timeout itself.
        let mut admin = admin_connection(&server.url()).await;
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("hz")
            .arg(1)
            .query_async(&mut admin)
            .await
            .unwrap();
        let held = put(&backend, "k", b"holder", Some(60_000)).await;
        let reply = wait_then_create(&backend, b"waiter", held.revision, 30)
            .await
            .unwrap();
        assert_eq!(reply.outcome, Outcome::Conflict(Some(held)));
        assert_eq!(
            backend.blocks_ended_at_timeout(),
            1,
            "the host ended the block (Redis's own timeout is a response timeout later)"
        );
    })
    .await
}

#[tokio::test]
async fn when_redis_refuses_xread_wait_then_put_waits_on_notifications_instead() {
    bounded(async {
        let server = RedisServer::spawn().expect("these tests start their own redis-server");
        let mut admin = admin_connection(&server.url()).await;
        let () = redis::cmd("ACL")
            .arg(&[
                "SETUSER", "noxread", "on", ">pw", "~*", "&*", "+@all", "-xread",
            ])
            .query_async(&mut admin)
            .await
            .unwrap();
        let url = server.url().replace("redis://", "redis://noxread:pw@");
        let backend = Arc::new(
            RedisBackend::connect(redis_config(&url, 64, None))
                .await
                .unwrap(),
        );
        let held = put(&backend, "k", b"holder", Some(60_000)).await;
        let waiter = spawn_waiter(&backend, b"waiter", held.revision);
        // The refused XREAD did not end the wait: the waiter waits on the
        // subscriber connection, and the release wakes it.
        while backend.waiters("p") != 1 {
            tokio::task::yield_now().await;
        }
        release_k(&backend).await;
        let e = applied_entry(waiter.await.unwrap().unwrap().outcome);
        assert_eq!(e.value, b"waiter");
        // Nor is XREAD tried again.
        let reply = wait_then_create(&backend, b"late", held.revision, 3_600_000)
            .await
            .unwrap();
        assert_eq!(reply.outcome, Outcome::Conflict(Some(e)));
        assert_eq!(backend.blocking_connections_opened(), 1);
    })
    .await
}
