//! An embedder's own wasmtime host: its own `Engine` (no pooling), its own
//! `Linker` over its own state, and coord's imports linked into it with
//! `coord_host::add_to_linker`. Two component instances, each in a `Store`
//! of its own over one in-memory store, contend for a lock the way two
//! edge-function instances would.
//!
//! Run it: `cargo run -p coord-embed` (it exits non-zero if coord answers
//! anything but what the lock promises); `cargo test --workspace` runs it
//! too.

use std::sync::Arc;

use coord_host::HostState;
use coord_host::backend::memory::MemoryBackend;
use coord_host::backend::turns::Turns;
use coord_host::bindings::Coordinator;
use coord_host::lock::{AcquireOptions, AcquireOutcome};
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, Store};

/// What the embedder keeps per instance: coord's state beside its own.
struct AppState {
    /// The state coord's imports are served from.
    coord: HostState,
    /// Something of the embedder's own (here, a name for its log).
    name: &'static str,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> wasmtime::Result<()> {
    contend().await
}

/// Link, instantiate twice, and contend for one lock; an error says which
/// promise was broken.
async fn contend() -> wasmtime::Result<()> {
    let engine = Engine::new(&Config::new())?;
    let mut linker = Linker::<AppState>::new(&engine);
    coord_host::add_to_linker(&mut linker, |state| &mut state.coord)?;
    let component = Component::new(&engine, coord_host::COMPONENT)?;
    // One store for every instance, its lock waiters taking turns.
    let store_backend = Arc::new(Turns::new(Arc::new(MemoryBackend::default())));

    let mut stores = Vec::new();
    for name in ["first", "second"] {
        let state = AppState {
            coord: HostState::new(store_backend.clone()),
            name,
        };
        let mut store = Store::new(&engine, state);
        let coordinator = Coordinator::instantiate_async(&mut store, &component, &linker).await?;
        stores.push((store, coordinator));
    }

    let options = || AcquireOptions::new().ttl_ms(10_000).no_wait();
    let [(first, first_coord), (second, second_coord)] = &mut stores[..] else {
        unreachable!("two instances were made")
    };
    let lock = first_coord.coord_sync_lock();
    let held = match lock
        .call_acquire(&mut *first, "inventory.stock", "item:42", options())
        .await?
    {
        Ok(AcquireOutcome::Acquired(held)) => held,
        other => {
            return Err(wasmtime::format_err!(
                "the free lock was not acquired: {other:?}"
            ));
        }
    };
    println!(
        "{}: acquired item:42 with fence {}",
        first.data().name,
        held.fence
    );

    let rival = second_coord.coord_sync_lock();
    match rival
        .call_acquire(&mut *second, "inventory.stock", "item:42", options())
        .await?
    {
        Ok(AcquireOutcome::Busy(holder)) if holder.fence == held.fence => {
            println!(
                "{}: busy, held by fence {}",
                second.data().name,
                holder.fence
            );
        }
        other => return Err(wasmtime::format_err!("a held lock was not busy: {other:?}")),
    }

    if lock.call_release(&mut *first, &held).await? != Ok(true) {
        return Err(wasmtime::format_err!("the holder's release failed"));
    }
    match rival
        .call_acquire(&mut *second, "inventory.stock", "item:42", options())
        .await?
    {
        Ok(AcquireOutcome::Acquired(next)) if next.fence > held.fence => {
            println!(
                "{}: acquired after the release, fence {} > {}",
                second.data().name,
                next.fence,
                held.fence
            );
        }
        other => return Err(wasmtime::format_err!("the released lock: {other:?}")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The program runs to its end: linked by the embedder's own linker,
    /// the lock is acquired, busy for the rival, and acquired again after
    /// the release with a higher fence.
    #[tokio::test]
    async fn an_embedders_own_linker_runs_coord() {
        super::contend().await.unwrap_or_else(|e| panic!("{e:?}"));
    }
}
