//! `coord`: the command line of the coord host.
//!
//! `coord demo` runs the main job on the embedded default (the in-memory
//! store): component instances, each in a wasmtime `Store` of its own,
//! contend for locks on a few inventory items, and every stock write is
//! checked against the lock's fence at the write boundary.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coord_host::backend::memory::MemoryBackend;
use coord_host::lock::*;
use coord_host::{Instance, Runtime};

const USAGE: &str = "\
usage: coord <command>

commands:
  demo    instances contend for inventory locks on the in-memory store
  help    this text";

const LOCK_ID: &str = "inventory.stock";

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("demo") if args.len() == 1 => demo().await,
        Some("help" | "--help" | "-h") => {
            println!("{USAGE}");
            Ok(())
        }
        _ => {
            eprintln!("{USAGE}");
            return std::process::ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("coord: {e:?}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The system of record the locks protect: stock per item, written only with
/// a fence no lower than the highest it has seen for that item.
#[derive(Default)]
struct Inventory {
    items: Mutex<HashMap<String, (i64, u64)>>,
}

impl Inventory {
    /// Apply `delta` to `item`'s stock if `fence` is not older than the
    /// newest fence already written; the fence check is the write boundary.
    fn adjust(&self, item: &str, delta: i64, fence: u64) -> Result<i64, String> {
        let mut items = self
            .items
            .lock()
            .map_err(|_| "inventory lock poisoned".to_string())?;
        let (stock, highest) = items.entry(item.to_string()).or_insert((100, 0));
        if fence < *highest {
            return Err(format!(
                "fence {fence} is older than {highest}, write refused"
            ));
        }
        *highest = fence;
        *stock += delta;
        Ok(*stock)
    }
}

/// Prints a line prefixed by the time since the demo began.
struct Log(Instant);

impl Log {
    fn say(&self, who: &str, what: impl std::fmt::Display) {
        println!(
            "{:>6.0?} ms  {who:<10} {what}",
            self.0.elapsed().as_secs_f64() * 1000.0
        );
    }
}

fn unavailable(e: Error) -> wasmtime::Error {
    wasmtime::format_err!("lock call failed: {e:?}")
}

async fn demo() -> wasmtime::Result<()> {
    let runtime = Arc::new(Runtime::new(Arc::new(MemoryBackend::default()))?);
    let inventory = Arc::new(Inventory::default());
    let log = Arc::new(Log(Instant::now()));
    println!(
        "coord demo: {} bytes of component, in-memory store\n",
        coord_host::COMPONENT.len()
    );

    println!("1. Six instances adjust three items; each tries once, then waits if busy.");
    let mut workers = Vec::new();
    for n in 0..6 {
        let (runtime, inventory, log) = (runtime.clone(), inventory.clone(), log.clone());
        workers.push(tokio::spawn(async move {
            let mut instance = runtime.instantiate().await?;
            let item = format!("item:{}", n % 3);
            let who = format!("worker-{n}");
            adjust_once(&mut instance, &who, &item, -1, &inventory, &log).await
        }));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for worker in workers {
        worker.await??;
    }

    println!("\n2. A long job extends its lock before the TTL runs out.");
    let mut instance = runtime.instantiate().await?;
    let options = AcquireOptions {
        ttl_ms: Some(300),
        wait: Some(WaitPolicy::NoWait),
    };
    let AcquireOutcome::Acquired(lock) = instance
        .acquire(LOCK_ID, "item:0", options)
        .await?
        .map_err(unavailable)?
    else {
        wasmtime::bail!("item:0 should be free");
    };
    log.say(
        "importer",
        format!("acquired item:0, fence {}, ttl 300 ms", lock.fence),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ExtendOutcome::Extended(lock) = instance
        .extend(&lock, Some(1000))
        .await?
        .map_err(unavailable)?
    else {
        wasmtime::bail!("the importer lost its lock");
    };
    let holder = instance
        .inspect(LOCK_ID, "item:0")
        .await?
        .map_err(unavailable)?;
    log.say(
        "importer",
        format!(
            "extended by 1000 ms: {} ms left, fence still {}",
            holder.map_or(0, |h| h.remaining_ms),
            lock.fence
        ),
    );
    instance.release(&lock).await?.map_err(unavailable)?;
    log.say("importer", "released item:0");

    println!("\n3. A holder pauses past its TTL; its late write is refused by the fence.");
    let mut stale = runtime.instantiate().await?;
    let mut fresh = runtime.instantiate().await?;
    let options = AcquireOptions {
        ttl_ms: Some(100),
        wait: Some(WaitPolicy::NoWait),
    };
    let AcquireOutcome::Acquired(old) = stale
        .acquire(LOCK_ID, "item:1", options)
        .await?
        .map_err(unavailable)?
    else {
        wasmtime::bail!("item:1 should be free");
    };
    log.say(
        "paused",
        format!(
            "acquired item:1, fence {}, ttl 100 ms ... then stalls (GC pause)",
            old.fence
        ),
    );
    tokio::time::sleep(Duration::from_millis(150)).await;
    let AcquireOutcome::Acquired(new) = fresh
        .acquire(LOCK_ID, "item:1", options)
        .await?
        .map_err(unavailable)?
    else {
        wasmtime::bail!("item:1 should have expired");
    };
    log.say(
        "fresh",
        format!("acquired item:1 after the expiry, fence {}", new.fence),
    );
    let stock = inventory
        .adjust("item:1", -5, new.fence)
        .map_err(wasmtime::Error::msg)?;
    log.say(
        "fresh",
        format!("wrote stock of item:1 = {stock} with fence {}", new.fence),
    );
    match inventory.adjust("item:1", -5, old.fence) {
        Ok(_) => wasmtime::bail!("the stale write was accepted"),
        Err(why) => log.say("paused", format!("wakes and writes: {why}")),
    }
    let released = stale.release(&old).await?.map_err(unavailable)?;
    log.say(
        "paused",
        format!("release returns {released}: it no longer held the lock"),
    );
    fresh.release(&new).await?.map_err(unavailable)?;

    println!("\nFinal stock:");
    let items = inventory
        .items
        .lock()
        .map_err(|_| wasmtime::format_err!("poisoned"))?;
    let mut items: Vec<_> = items.iter().collect();
    items.sort();
    for (item, (stock, fence)) in items {
        println!("  {item}: {stock} (last written with fence {fence})");
    }
    Ok(())
}

/// One worker's turn: try once; if busy, say who holds it and wait (the
/// default policy, woken by the release); adjust the stock under the lock.
async fn adjust_once(
    instance: &mut Instance,
    who: &str,
    item: &str,
    delta: i64,
    inventory: &Inventory,
    log: &Log,
) -> wasmtime::Result<()> {
    let try_once = AcquireOptions {
        ttl_ms: Some(2000),
        wait: Some(WaitPolicy::NoWait),
    };
    let lock = match instance
        .acquire(LOCK_ID, item, try_once)
        .await?
        .map_err(unavailable)?
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
            let wait = AcquireOptions {
                ttl_ms: Some(2000),
                wait: None,
            };
            match instance
                .acquire(LOCK_ID, item, wait)
                .await?
                .map_err(unavailable)?
            {
                AcquireOutcome::Acquired(lock) => {
                    log.say(
                        who,
                        format!(
                            "woken by the release after {} ms",
                            started.elapsed().as_millis()
                        ),
                    );
                    lock
                }
                AcquireOutcome::Busy(_) => {
                    log.say(who, format!("gave up on {item}"));
                    return Ok(());
                }
            }
        }
    };
    let stock = inventory
        .adjust(item, delta, lock.fence)
        .map_err(wasmtime::Error::msg)?;
    log.say(
        who,
        format!(
            "acquired {item} with fence {}; stock now {stock}",
            lock.fence
        ),
    );
    tokio::time::sleep(Duration::from_millis(40)).await; // the critical section's work
    instance.release(&lock).await?.map_err(unavailable)?;
    log.say(who, format!("released {item}"));
    Ok(())
}
