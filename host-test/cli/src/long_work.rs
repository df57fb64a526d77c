//! The demo's last two scenes: a job under `with_lock` that outlives its
//! TTL, and a lease that moves between two nodes when one crashes.

use std::time::Duration;

use coord_host::Runtime;
use coord_host::lease_manager::{GuardError, LeaseManager};
use coord_host::lock::AcquireOptions;
use coord_host::with_lock::{Ran, WithLock};

use crate::demo_log::Log;
use crate::inventory::Inventory;

/// Scene 4: a job five times its TTL, kept alive by `with_lock`'s refresher.
pub async fn job_under_with_lock(
    runtime: &Runtime,
    inventory: &Inventory,
    log: &Log,
) -> wasmtime::Result<()> {
    let how = WithLock::refreshing(AcquireOptions::new().ttl_ms(300).wait_up_to(30_000));
    let ran = runtime
        .with_lock("inventory.stock", "item:2", how, |guard| async move {
            log.say(
                "recount",
                format!(
                    "holds item:2, fence {}, ttl 300 ms, refreshed every 100 ms",
                    guard.fence()
                ),
            );
            for step in 1..=5 {
                tokio::time::sleep(Duration::from_millis(300)).await;
                if guard.is_lost() {
                    return Err(wasmtime::format_err!("lost the lock at step {step}"));
                }
                let stock = inventory
                    .adjust("item:2", 0, guard.fence())
                    .await
                    .map_err(wasmtime::Error::msg)?;
                log.say(
                    "recount",
                    format!(
                        "step {step}: {stock} in stock, written with fence {}",
                        guard.fence()
                    ),
                );
            }
            Ok(())
        })
        .await
        .map_err(|e| wasmtime::format_err!("{e}"))?;
    match ran {
        Ran::Done(result) => {
            result?;
            log.say("recount", "done after 1.5 s, five TTLs; released");
        }
        Ran::Busy(holder) => log.say(
            "recount",
            format!("busy: fence {} holds it (another demo's job)", holder.fence),
        ),
    }
    Ok(())
}

/// Scene 5: node a holds the ledger's lease and crashes; node b takes it
/// over, waits out the grace, writes with a higher epoch; a restarts and
/// does not write.
pub async fn lease_failover(
    runtime: &Runtime,
    inventory: &Inventory,
    log: &Log,
) -> wasmtime::Result<()> {
    // A lease and a ledger of this run's own: demos on one store at once
    // each tell their own crash story. On a shared lease name, the second
    // found the first's node-b holding it; on a shared ledger, one demo's
    // write was refused by another's epoch (correct, but not this story).
    let name = format!("inventory.ledger.{}", std::process::id());
    let name = name.as_str();
    let ledger = format!("ledger.{}", std::process::id());
    let ledger = ledger.as_str();
    let ttl = Duration::from_millis(600);
    let write = |node: &'static str| {
        move |token: coord_host::lease_manager::Token| async move {
            let stock = inventory.adjust(ledger, 1, token.epoch()).await;
            (node, token.epoch(), stock)
        }
    };
    let a = LeaseManager::start(runtime.clone(), "node-a", ttl);
    let b = LeaseManager::start(runtime.clone(), "node-b", ttl);
    a.held(name).await;
    b.held(name).await;
    let (_, a_epoch, _) = a.guard(name, write("node-a")).await?;
    log.say(
        "node-a",
        format!("holds the ledger lease, epoch {a_epoch}; writes"),
    );
    log.say("node-b", format!("held: {}", b.held(name).await));
    a.close();
    log.say("node-a", "crashes (no more renewals, no resign)");
    loop {
        match b.guard(name, write("node-b")).await {
            Ok((_, epoch, stock)) => {
                let stock = stock.map_err(wasmtime::Error::msg)?;
                log.say(
                    "node-b",
                    format!("writes with epoch {epoch}: ledger = {stock}"),
                );
                break;
            }
            Err(GuardError::InGrace(left)) => {
                log.say(
                    "node-b",
                    format!(
                        "took the lease over; the grace has {} ms left",
                        left.as_millis()
                    ),
                );
                tokio::time::sleep(left).await;
            }
            Err(GuardError::NotHolder(_)) => tokio::time::sleep(ttl / 6).await,
            Err(other) => return Err(wasmtime::format_err!("{other}")),
        }
    }
    let restarted = LeaseManager::start(runtime.clone(), "node-a", ttl);
    log.say(
        "node-a",
        format!("restarts; held: {}", restarted.held(name).await),
    );
    match restarted.guard(name, write("node-a")).await {
        Err(GuardError::NotHolder(Some(holder))) => log.say(
            "node-a",
            format!(
                "does not write: {} holds it at epoch {}",
                holder.node, holder.epoch
            ),
        ),
        Ok((_, epoch, _)) => {
            wasmtime::bail!("the restarted node-a wrote at epoch {epoch}: it must not")
        }
        Err(other) => {
            wasmtime::bail!("the restarted node-a was refused for another reason: {other}")
        }
    }
    match inventory.adjust(ledger, 1, a_epoch).await {
        Ok(_) => wasmtime::bail!("a write with node-a's old epoch was accepted"),
        Err(why) => log.say("node-a", format!("a write with its old epoch: {why}")),
    }
    Ok(())
}
