//! The main job: component instances, each in a wasmtime `Store` of its own,
//! contend for locks on a few inventory items, and every stock write is made
//! at a fenced write boundary.

use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_host::backend::Backend;
use coord_host::lock::*;
use coord_host::{Instance, Runtime};

use crate::demo_log::Log;
use crate::inventory::Inventory;
use crate::operate::Sentence;

const LOCK_ID: &str = "inventory.stock";

/// How long a demo instance waits for a lock another holds: long enough
/// for several demos on one store to take their turns.
const WAIT_MS: u64 = 30_000;

/// A lock call's error as the operator commands say it.
fn failed(e: Error) -> wasmtime::Error {
    wasmtime::format_err!("a lock call failed: {}", e.sentence())
}

/// Run the five scenes on `backend`, writing to `inventory`.
pub async fn run(
    backend: Arc<dyn Backend>,
    inventory: Inventory,
    place: &str,
) -> wasmtime::Result<()> {
    let runtime = Arc::new(Runtime::new(backend)?);
    let inventory = Arc::new(inventory);
    let log = Arc::new(Log::new());
    println!(
        "coord demo: a {}-byte component on {place}\n",
        coord_host::COMPONENT.len()
    );

    println!("1. Six instances adjust three items; each tries once, then waits if busy.");
    let mut workers = Vec::new();
    for n in 0..6 {
        let (runtime, inventory, log) = (runtime.clone(), inventory.clone(), log.clone());
        workers.push(tokio::spawn(async move {
            let mut instance = runtime.instantiate().await?;
            let item = format!("item:{}", n % 3);
            adjust_once(
                &mut instance,
                &format!("worker-{n}"),
                &item,
                -1,
                &inventory,
                &log,
            )
            .await
        }));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for worker in workers {
        worker.await??;
    }

    println!("\n2. A long job extends its lock before the TTL runs out.");
    let mut importer = runtime.instantiate().await?;
    let lock = acquire_waiting(&mut importer, "item:0", 1000).await?;
    log.say(
        "importer",
        format!("acquired item:0, fence {}, ttl 1000 ms", lock.fence),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ExtendOutcome::Extended(lock) = importer
        .lock()
        .extend(&lock, Some(1000))
        .await?
        .map_err(failed)?
    else {
        wasmtime::bail!("the importer lost its lock before its TTL ran out");
    };
    let holder = importer
        .lock()
        .inspect(LOCK_ID, "item:0")
        .await?
        .map_err(failed)?;
    let left = holder.map_or(0, |h| h.remaining_ms);
    log.say(
        "importer",
        format!(
            "extended by 1000 ms: {left} ms left, fence still {}",
            lock.fence
        ),
    );
    importer.lock().release(&lock).await?.map_err(failed)?;
    log.say("importer", "released item:0");

    println!("\n3. A holder pauses past its TTL; its late write is refused by the fence.");
    let mut paused = runtime.instantiate().await?;
    let mut fresh = runtime.instantiate().await?;
    let old = acquire_waiting(&mut paused, "item:1", 100).await?;
    log.say(
        "paused",
        format!(
            "acquired item:1, fence {}, ttl 100 ms; then stalls (a GC pause)",
            old.fence
        ),
    );
    tokio::time::sleep(Duration::from_millis(150)).await;
    let new = acquire_waiting(&mut fresh, "item:1", 1000).await?;
    log.say(
        "fresh",
        format!("acquired item:1 after the expiry, fence {}", new.fence),
    );
    let stock = inventory
        .adjust("item:1", -5, new.fence)
        .await
        .map_err(wasmtime::Error::msg)?;
    log.say(
        "fresh",
        format!("wrote stock of item:1 = {stock} with fence {}", new.fence),
    );
    match inventory.adjust("item:1", -5, old.fence).await {
        Ok(_) => wasmtime::bail!("the stale write was accepted"),
        Err(why) => log.say("paused", format!("wakes and writes: {why}")),
    }
    let released = paused.lock().release(&old).await?.map_err(failed)?;
    log.say(
        "paused",
        format!("release returns {released}: it no longer held the lock"),
    );
    fresh.lock().release(&new).await?.map_err(failed)?;

    let calls = [&importer, &paused, &fresh]
        .iter()
        .map(|i| i.store_calls())
        .sum::<u64>();
    println!("\nScenes 2 and 3 took {calls} store calls in all.");

    println!("\n4. A job of five TTLs under with_lock, its lock refreshed beside it.");
    crate::long_work::job_under_with_lock(&runtime, &inventory, &log).await?;

    println!("\n5. A node holding a lease crashes; another takes over after the grace.");
    crate::long_work::lease_failover(&runtime, &inventory, &log).await?;
    println!("\nDone.");
    Ok(())
}

/// Acquire `item`, waiting (up to [`WAIT_MS`], woken by a release) if
/// another instance or process holds it.
async fn acquire_waiting(
    instance: &mut Instance,
    item: &str,
    ttl_ms: u64,
) -> wasmtime::Result<HeldLock> {
    let options = AcquireOptions::new().ttl_ms(ttl_ms).wait_up_to(WAIT_MS);
    match instance
        .lock()
        .acquire(LOCK_ID, item, options)
        .await?
        .map_err(failed)?
    {
        AcquireOutcome::Acquired(lock) => Ok(lock),
        AcquireOutcome::Busy(holder) => {
            wasmtime::bail!(
                "{item} stayed busy (fence {}, {} ms left)",
                holder.fence,
                holder.remaining_ms
            )
        }
    }
}

/// One worker's turn: try once; if busy, say who holds it and wait (woken by
/// the release); adjust the stock under the lock; release.
async fn adjust_once(
    instance: &mut Instance,
    who: &str,
    item: &str,
    delta: i64,
    inventory: &Inventory,
    log: &Log,
) -> wasmtime::Result<()> {
    let try_once = AcquireOptions::new().ttl_ms(2000).no_wait();
    let lock = match instance
        .lock()
        .acquire(LOCK_ID, item, try_once)
        .await?
        .map_err(failed)?
    {
        AcquireOutcome::Acquired(lock) => lock,
        AcquireOutcome::Busy(holder) => {
            log.say(
                who,
                format!(
                    "{item} busy: fence {} holds it for {} ms more; waiting",
                    holder.fence, holder.remaining_ms
                ),
            );
            let started = Instant::now();
            let lock = acquire_waiting(instance, item, 2000).await?;
            log.say(
                who,
                format!("got it after waiting {} ms", started.elapsed().as_millis()),
            );
            lock
        }
    };
    let stock = inventory
        .adjust(item, delta, lock.fence)
        .await
        .map_err(wasmtime::Error::msg)?;
    log.say(
        who,
        format!(
            "acquired {item} with fence {}; stock now {stock}",
            lock.fence
        ),
    );
    tokio::time::sleep(Duration::from_millis(40)).await; // the critical section's work
    instance.lock().release(&lock).await?.map_err(failed)?;
    log.say(who, format!("released {item}"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Outside testers saw `Error::Unavailable("redis: broken pipe")`: a
    /// demo's errors are the operator commands' sentences.
    #[test]
    fn a_lock_calls_error_is_a_sentence_not_debug() {
        let said = failed(Error::Unavailable("redis: broken pipe".into())).to_string();
        assert_eq!(
            said,
            "a lock call failed: the store is unavailable: redis: broken pipe"
        );
    }
}
