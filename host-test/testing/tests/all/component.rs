//! The built component's contract: what it imports and exports, checked on
//! the real `coord.wasm` (what `wasm-tools component wit` would print), and
//! how it uses its memory.

use std::sync::Arc;

use coord_host::backend::memory::MemoryBackend;
use coord_host::ephemeral::Space;
use coord_host::lock::{AcquireOptions, AcquireOutcome};
use coord_host::ratelimit::Limiter;
use coord_host::rwlock::{self, Mode};
use coord_host::{COMPONENT, Runtime, engine_config};
use wasmtime::component::Component;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

#[test]
fn the_component_imports_only_the_store_and_randomness_and_exports_the_primitives() {
    let engine = Engine::new(&engine_config()).unwrap();
    let component = Component::new(&engine, COMPONENT).unwrap();
    let ty = component.component_type();
    let mut imports: Vec<String> = ty
        .imports(&engine)
        .map(|(name, _)| name.to_string())
        .collect();
    imports.sort();
    assert_eq!(
        imports,
        ["coord:sync/store@0.1.0", "wasi:random/random@0.2.0"],
        "no wasi:cli, no wasi:io"
    );
    let mut exports: Vec<String> = ty
        .exports(&engine)
        .map(|(name, _)| name.to_string())
        .collect();
    exports.sort();
    assert_eq!(
        exports,
        [
            "coord:sync/ephemeral@0.1.0",
            "coord:sync/lease@0.1.0",
            "coord:sync/lock@0.1.0",
            "coord:sync/ratelimit@0.1.0",
            "coord:sync/rwlock@0.1.0",
            "coord:sync/semaphore@0.1.0"
        ]
    );
}

/// An edge host makes an instance per request, and a memory that grows costs
/// a pooling host an `mprotect` on the grow and another on the slot's reset.
/// coord's allocator serves a call from a region inside the memory the
/// instance starts with, so here, with the memory capped at its initial size
/// (a grow fails, and a failed allocation traps), a fresh instance serves
/// every kind of call, many times over, without a trap: the region empties
/// between calls rather than filling up.
#[tokio::test]
async fn calls_that_fit_never_grow_the_memory_the_instance_starts_with() {
    let probe = Component::new(&Engine::default(), COMPONENT).unwrap();
    let required = probe.resources_required().unwrap();
    assert_eq!(required.num_memories, 1);
    let initial_pages = required.max_initial_memory_size.unwrap();
    let mut pooling = PoolingAllocationConfig::default();
    pooling
        .total_component_instances(1)
        .total_core_instances(8) // the guest's module and wit-component's shims
        .total_memories(8)
        .total_tables(8)
        .max_memory_size(usize::try_from(initial_pages * 65_536).unwrap());
    let mut config = Config::new();
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling));
    let runtime =
        Runtime::with_config(COMPONENT, &config, Arc::new(MemoryBackend::default())).unwrap();

    let no_wait = AcquireOptions::new().ttl_ms(30_000).no_wait();
    let limiter = Limiter {
        id: "memory.limit".into(),
        limit: 1_000_000,
        window_ms: 60_000,
        algorithm: None,
    };
    let space = Space {
        id: "memory.space".into(),
        ttl_ms: 60_000,
        max_value_bytes: 1024,
    };
    let mut instance = runtime.instantiate().await.unwrap();
    for k in 0..500 {
        let key = format!("k{}", k % 20);
        let AcquireOutcome::Acquired(lock) = instance
            .lock()
            .acquire("memory.lock", &key, no_wait)
            .await
            .unwrap()
            .unwrap()
        else {
            panic!("busy on an uncontended lock");
        };
        assert!(instance.lock().release(&lock).await.unwrap().unwrap());
        let mode = if k % 2 == 0 { Mode::Read } else { Mode::Write };
        let rw_options = coord_host::rwlock::AcquireOptions::new()
            .ttl_ms(30_000)
            .no_wait();
        let rwlock::AcquireOutcome::Acquired(grant) = instance
            .rwlock()
            .acquire("memory.rwlock", &key, mode, rw_options)
            .await
            .unwrap()
            .unwrap()
        else {
            panic!("busy on an uncontended read-write lock");
        };
        assert!(instance.rwlock().release(&grant).await.unwrap().unwrap());
        instance
            .ratelimit()
            .check(&limiter, &key, None)
            .await
            .unwrap()
            .unwrap();
        instance
            .ephemeral()
            .upsert(&space, "tenant", &key, &[b'v'; 512])
            .await
            .unwrap()
            .unwrap();
        assert!(
            instance
                .ephemeral()
                .touch(&space, "tenant", &key)
                .await
                .unwrap()
                .unwrap()
        );
        let snapshot = instance
            .ephemeral()
            .snapshot(&space, "tenant", None)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(snapshot.entries.len(), (k + 1).min(20));
    }
}
