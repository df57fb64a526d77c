//! A `coord serve` process killed (SIGKILL) in the middle of a request:
//! nothing of the process runs any more, no ledger gives anything back, so
//! what it had written must lapse by itself within the bound the WIT states.
//!
//! The read-write lock's promise under test (wit/rwlock.wit, "Writers are
//! preferred"): a waiting writer renews its claim for at most 2000 ms of
//! store time at a time, so a writer that dies while waiting keeps new
//! readers out for at most that long after its last renewal. The bound is
//! checked on the store's clock (the claim's remaining time as the store
//! reports it right after the kill), never on the test's wall clock.

use std::sync::Arc;

use coord_host::backend::Backend;
use coord_host::rwlock::{AcquireOptions, AcquireOutcome, Grant, Mode, WaitPolicy};

use crate::common;
use crate::process::Serve;

/// The longest a waiting writer's claim runs past its last renewal, in
/// store milliseconds (wit/rwlock.wit).
const CLAIM_BOUND_MS: u64 = 2_000;

/// The inventory function's catalog lock (examples/inventory-fn/src/catalog.rs).
const CATALOG: (&str, &str) = ("inventory.catalog", "all");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_writer_killed_while_it_waits_keeps_readers_out_no_longer_than_its_claim() {
    let url = common::redis_url().await;
    let config = common::redis_config(&url, 64, None);
    let prefix = config.prefix.clone();
    let backend = Arc::new(coord_redis::RedisBackend::connect(config).await.unwrap());
    let args = ["--redis", url.as_str(), "--prefix", prefix.as_str()];
    a_killed_waiting_writer_lapses_within_its_claim(backend, &args).await;
    common::delete_prefix(&url, &prefix);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_writer_killed_while_it_waits_keeps_readers_out_no_longer_than_its_claim() {
    let url = common::postgres_url().await;
    let prefix = format!("killed{}", std::process::id());
    let table = coord_postgres::PostgresConfig::table_for(&prefix);
    let config = coord_postgres::PostgresConfig {
        table: table.clone(),
        ..coord_postgres::PostgresConfig::new(&url)
    };
    let backend = Arc::new(
        coord_postgres::PostgresBackend::connect(config)
            .await
            .unwrap(),
    );
    let args = ["--postgres", url.as_str(), "--prefix", prefix.as_str()];
    a_killed_waiting_writer_lapses_within_its_claim(backend, &args).await;
    common::drop_table(url, table);
}

/// This test holds the catalog for reading; a `coord serve` on the same
/// store (`args`) is asked to rebuild it, waits as a writer behind the
/// reader, and is killed while it waits. Right after the kill the claim
/// has at most [`CLAIM_BOUND_MS`] of store time left (its TTL asked for
/// 30 s), and a new reader is granted once it has lapsed, although the
/// first reader still holds and the killed writer never gave anything back.
async fn a_killed_waiting_writer_lapses_within_its_claim(backend: Arc<dyn Backend>, args: &[&str]) {
    let mut i = common::instance_on(backend).await;
    let first = read(&mut i, WaitPolicy::NoWait).await;

    let mut serve = Serve::start(args);
    let address = serve.address.clone();
    // The rebuild's reply never comes: its process is killed while it waits.
    let rebuild = tokio::spawn(async move {
        let _ = send_without_reply(&address, "/catalog/rebuild?wait_ms=30000").await;
    });

    // Until the writer is waiting: its claim is in the store, lowered to
    // the claim's bound because a reader holds.
    let claim = common::bounded(async {
        loop {
            let usage = i.rwlock().inspect(CATALOG.0, CATALOG.1).await.unwrap();
            let usage = usage.unwrap();
            if let Some(writer) = usage.writer
                && writer.remaining_ms <= CLAIM_BOUND_MS
            {
                break writer;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(claim.mode, Mode::Write);

    serve.kill();
    rebuild.abort();

    // Nothing renews the claim any more: on the store's clock it has at
    // most the bound left (or has lapsed already on a slow machine).
    let usage = i.rwlock().inspect(CATALOG.0, CATALOG.1).await.unwrap();
    let usage = usage.unwrap();
    if let Some(writer) = &usage.writer {
        assert_eq!(writer.fence, claim.fence, "another writer appeared");
        assert!(
            writer.remaining_ms <= CLAIM_BOUND_MS,
            "a killed writer's claim runs {} ms more, past the stated {CLAIM_BOUND_MS} ms",
            writer.remaining_ms
        );
    }
    assert_eq!(usage.readers.len(), 1, "the first reader still holds");

    // A new reader waits out the claim and is granted, while the first
    // reader still holds: the dead writer blocks nobody for its TTL.
    let second = read(&mut i, WaitPolicy::Timeout(60_000)).await;
    assert!(
        second.fence > claim.fence,
        "a reader's fence is above the writer's before it"
    );
    let usage = i.rwlock().inspect(CATALOG.0, CATALOG.1).await.unwrap();
    let usage = usage.unwrap();
    assert!(usage.writer.is_none(), "the claim is gone");
    assert_eq!(usage.readers.len(), 2);

    for grant in [&first, &second] {
        assert!(i.rwlock().release(grant).await.unwrap().unwrap());
    }
}

/// Acquire the catalog for reading (a minute's TTL) with `wait`; it must
/// be granted.
async fn read(i: &mut coord_host::Instance, wait: WaitPolicy) -> Grant {
    let options = AcquireOptions {
        ttl_ms: Some(60_000),
        wait: Some(wait),
    };
    let outcome = common::bounded(
        i.rwlock()
            .acquire(CATALOG.0, CATALOG.1, Mode::Read, options),
    );
    match outcome.await.unwrap().unwrap() {
        AcquireOutcome::Acquired(grant) => grant,
        AcquireOutcome::Busy(holder) => panic!("a reader was turned away by {holder:?}"),
    }
}

/// Send `POST path` and read whatever comes back, if anything: the process
/// may die first.
async fn send_without_reply(address: &str, path: &str) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    let request = format!("POST {path} HTTP/1.1\r\nhost: {address}\r\ncontent-length: 0\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut sink = Vec::new();
    stream.read_to_end(&mut sink).await?;
    Ok(())
}
