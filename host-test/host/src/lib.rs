//! Embed coord in a wasmtime host.
//!
//! coord's coordination logic lives in one WebAssembly component
//! ([`COMPONENT`], built from `component/` by this crate's build script). The
//! component imports one capability, `coord:sync/store`, and this crate
//! supplies it from a [`backend::Backend`]: [`backend::memory::MemoryBackend`]
//! here (one process, any number of instances), or the crates `coord-redis`
//! (one server or a Redis Cluster) and `coord-nats` (NATS JetStream, one
//! server or a cluster), or a store of your own.
//!
//! [`Runtime`] compiles the component once and pre-links it
//! (`InstancePre`, pooling allocator), so an [`Instance`] per request is
//! cheap; each instance is its own wasmtime `Store`, and all instances of a
//! runtime share its backend.
//!
//! ```no_run
//! # async fn demo() -> wasmtime::Result<()> {
//! use std::sync::Arc;
//! use coord_host::{Runtime, backend::memory::MemoryBackend, lock::*};
//!
//! let runtime = Runtime::new(Arc::new(MemoryBackend::default()))?;
//! let mut instance = runtime.instantiate().await?;
//! let options = AcquireOptions::new().ttl_ms(10_000).no_wait();
//! match instance.lock().acquire("inventory.stock", "item:42", options).await?? {
//!     AcquireOutcome::Acquired(lock) => {
//!         // ... write, presenting lock.fence at the write boundary ...
//!         instance.lock().release(&lock).await??;
//!     }
//!     AcquireOutcome::Busy(holder) => println!("busy for {} ms more", holder.remaining_ms),
//! }
//! # Ok(()) }
//! ```
//!
//! This crate compiles none of the stores' clients, the edge runtime
//! (`coord-serve`) or the command line (`coord-cli`).
//!
//! An embedder with a wasmtime `Linker` and a state of its own links
//! coord's imports with [`add_to_linker`] and calls the exports through
//! [`bindings::Coordinator`] (`examples/embed` is such a host).

pub mod backend;
pub mod bindings;
pub mod clock;
pub mod holdings;
mod host;
mod instance;
pub mod lease_manager;
pub mod with_lock;

use std::sync::Arc;

use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::error::Context as _;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store};

use backend::Backend;
use backend::turns::Turns;
pub use host::HostState;
pub use instance::{
    EphemeralCalls, EphemeralResult, Instance, LeaseCalls, LeaseResult, LockCalls, LockResult,
    RatelimitCalls, RatelimitResult, RwLockCalls, RwLockResult, SemaphoreCalls, SemaphoreResult,
};

/// The WIT's defaults for an `acquire-options` record (a 30 s TTL, up to 2 s
/// of waiting) and the methods that change them:
/// `AcquireOptions::new().ttl_ms(10_000).no_wait()`. For the lock, the
/// semaphore and the read-write lock, whose records are alike.
macro_rules! acquire_options_builder {
    ($held:literal, $when:literal) => {
        /// The WIT's defaults: a 30 s TTL, and up to 2 s of waiting.
        impl Default for AcquireOptions {
            fn default() -> Self {
                AcquireOptions {
                    ttl_ms: None,
                    wait: None,
                }
            }
        }

        impl AcquireOptions {
            /// The WIT's defaults ([`Default`]), to change with the methods below:
            /// `AcquireOptions::new().ttl_ms(10_000).no_wait()`.
            pub fn new() -> Self {
                AcquireOptions::default()
            }

            #[doc = concat!("Hold ", $held, " for `ttl_ms` milliseconds unless extended (1 to")]
            /// 86 400 000; the WIT's default is 30 000).
            #[must_use]
            pub fn ttl_ms(mut self, ttl_ms: u64) -> Self {
                self.ttl_ms = Some(ttl_ms);
                self
            }

            #[doc = concat!("When ", $when, ", answer `busy` at once.")]
            #[must_use]
            pub fn no_wait(self) -> Self {
                self.wait(WaitPolicy::NoWait)
            }

            #[doc = concat!("When ", $when, ", keep trying (woken by each release or")]
            /// expiry) until `ms` milliseconds of store time have passed (0 to
            /// 600 000).
            #[must_use]
            pub fn wait_up_to(self, ms: u64) -> Self {
                self.wait(WaitPolicy::Timeout(ms))
            }

            #[doc = concat!("When ", $when, ", follow `policy`.")]
            #[must_use]
            pub fn wait(mut self, policy: WaitPolicy) -> Self {
                self.wait = Some(policy);
                self
            }
        }
    };
}

/// The lock interface's types, as the host sees them (`coord:sync/lock`).
pub mod lock {
    pub use crate::bindings::exports::coord::sync::lock::{
        AcquireOptions, AcquireOutcome, Error, ExtendOutcome, HeldLock, Holder, InvalidArgument,
        Retry, WaitPolicy,
    };

    acquire_options_builder!("the lock", "the lock is held");
}

/// The lease interface's types, as the host sees them (`coord:sync/lease`).
pub mod lease {
    pub use crate::bindings::exports::coord::sync::lease::{
        Error, HeldLease, Holder, InvalidArgument,
    };
}

/// The ephemeral-state interface's types, as the host sees them (`coord:sync/ephemeral`).
pub mod ephemeral {
    pub use crate::bindings::exports::coord::sync::ephemeral::{
        Entry, Error, Event, InvalidArgument, Removed, Space, TenantSnapshot, Written,
    };

    /// A watch open in one [`crate::Instance`]; use it only with that instance,
    /// and close it with [`crate::EphemeralCalls::close_watch`] (`instance.ephemeral().close_watch(watcher)`).
    #[derive(Debug)]
    pub struct Watcher(pub(crate) wasmtime::component::ResourceAny);
}

/// The rate limiter's types, as the host sees them (`coord:sync/ratelimit`).
pub mod ratelimit {
    pub use crate::bindings::exports::coord::sync::ratelimit::{
        Algorithm, Decision, Error, InvalidArgument, Limiter, Reservation, Reserved, Settled,
    };
}

/// The read-write lock's types, as the host sees them (`coord:sync/rwlock`).
pub mod rwlock {
    pub use crate::bindings::exports::coord::sync::rwlock::{
        AcquireOptions, AcquireOutcome, Error, ExtendOutcome, Grant, Holder, InvalidArgument, Mode,
        Retry, Usage, WaitPolicy,
    };

    acquire_options_builder!("the grant", "the lock is held in an excluding mode");
}

/// The semaphore's types, as the host sees them (`coord:sync/semaphore`).
pub mod semaphore {
    pub use crate::bindings::exports::coord::sync::semaphore::{
        AcquireOptions, AcquireOutcome, Error, ExtendOutcome, Holder, InvalidArgument, Permit,
        Retry, Usage, WaitPolicy,
    };

    acquire_options_builder!("the permit", "every place is taken");
}

/// The coord component (`coord.wasm`), built from `component/`.
pub const COMPONENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/coord.wasm"));

/// How many component instances may be alive at once in one [`Runtime`].
pub const MAX_INSTANCES: u32 = 1000;

/// A compiled, pre-linked coord component over one store backend. Cloning
/// is cheap: the clones share the compiled component and the backend.
#[derive(Clone)]
pub struct Runtime {
    engine: Engine,
    pre: bindings::CoordinatorPre<HostState>,
    backend: Arc<dyn Backend>,
    turns: Arc<Turns>,
}

impl Runtime {
    /// The built-in component over `backend`.
    pub fn new(backend: Arc<dyn Backend>) -> wasmtime::Result<Self> {
        Runtime::with_component(COMPONENT, backend)
    }

    /// A component given as bytes (a `.wasm` component, or one precompiled by
    /// this engine's configuration) over `backend`.
    pub fn with_component(bytes: &[u8], backend: Arc<dyn Backend>) -> wasmtime::Result<Self> {
        Runtime::with_config(bytes, &engine_config(), backend)
    }

    /// A component given as bytes, compiled with an engine configuration of
    /// the embedder's own (its pooling limits, or none, for example under a
    /// profiler that cannot reserve the pool's address space).
    pub fn with_config(
        bytes: &[u8],
        config: &Config,
        backend: Arc<dyn Backend>,
    ) -> wasmtime::Result<Self> {
        let engine = Engine::new(config)?;
        let component = Component::new(&engine, bytes).context("loading the coord component")?;
        let mut linker = Linker::new(&engine);
        add_to_linker(&mut linker, |state| state)?;
        let pre = bindings::CoordinatorPre::new(linker.instantiate_pre(&component)?)?;
        // The instances' lock waiters take turns: a release wakes one.
        let turns = Arc::new(Turns::new(backend));
        Ok(Runtime {
            engine,
            pre,
            backend: turns.clone(),
            turns,
        })
    }

    /// The wasmtime engine the component was compiled with.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The backend every instance of this runtime shares: the one it was
    /// given, inside a [`Turns`] (its lock and semaphore waiters take turns).
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The lines in which this runtime's lock and semaphore waiters take turns.
    pub fn turns(&self) -> &Turns {
        &self.turns
    }

    /// A fresh component instance in a wasmtime `Store` of its own.
    pub async fn instantiate(&self) -> wasmtime::Result<Instance> {
        let mut store = Store::new(&self.engine, HostState::new(self.backend.clone()));
        let coordinator = self.pre.instantiate_async(&mut store).await?;
        Ok(Instance { store, coordinator })
    }
}

/// Link every import of `coord.wasm` (`coord:sync/store` and
/// `wasi:random/random`) into an embedder's own `linker`, served for each
/// wasmtime `Store` by the [`HostState`] that `get` finds in the embedder's
/// state. Instantiate the component with [`bindings::Coordinator`] and call
/// its exports (`coordinator.coord_sync_lock().call_acquire(&mut store, …)`).
/// Give every `HostState` the same backend, inside one
/// [`backend::turns::Turns`], so that a release wakes one of the
/// instances' lock (or semaphore) waiters instead of all of them.
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> &mut HostState,
) -> wasmtime::Result<()> {
    bindings::Coordinator::add_to_linker::<T, HasSelf<HostState>>(linker, get)
}

/// The engine configuration every runtime uses: the pooling allocator, for
/// cheap instantiation. (Async host calls need no setting in wasmtime 48.)
pub fn engine_config() -> Config {
    pooled_config(MAX_INSTANCES, &PoolSlot::ONE_MODULE)
}

/// The most an instance's linear memory may grow to (each memory's slot in
/// the pool).
pub const MAX_MEMORY_BYTES: u64 = 64 << 20;

/// What one instance takes from the pool: its core instances, memories
/// and tables, and the per-module bounds of each.
#[derive(Clone, Copy, Debug)]
pub struct PoolSlot {
    /// Core module instances per instance.
    pub core_instances: u32,
    /// Linear memories per instance.
    pub memories: u32,
    /// Tables per instance.
    pub tables: u32,
    /// The most memories one core module defines.
    pub memories_per_module: u32,
    /// The most tables one core module defines.
    pub tables_per_module: u32,
    /// The most elements one table may hold.
    pub table_elements: usize,
}

impl PoolSlot {
    /// The coord component alone: one module, one memory, one table.
    pub const ONE_MODULE: PoolSlot = PoolSlot {
        core_instances: 1,
        memories: 1,
        tables: 1,
        memories_per_module: 1,
        tables_per_module: 1,
        table_elements: 20_000,
    };
}

/// A configuration with the pooling allocator sized for `instances`
/// instances of `slot` each.
///
/// Freed slots are reset without `madvise` where that is cheaper: the
/// resident pages of a memory, table or async stack are found with Linux's
/// `PAGEMAP_SCAN` (6.7+) and zeroed in place, and the remaining decommits are
/// batched. Otherwise each freed instance costs an `madvise` whose TLB
/// shootdown interrupts every core — measured as 70 % of `coord serve`'s time
/// under load (BENCHMARKS.md, "Edge runtime over HTTP").
pub fn pooled_config(instances: u32, slot: &PoolSlot) -> Config {
    let total = |per_instance: u32| instances.saturating_mul(per_instance.max(1));
    let mut pooling = PoolingAllocationConfig::default();
    pooling
        .total_component_instances(instances)
        .total_core_instances(total(slot.core_instances))
        .total_memories(total(slot.memories))
        .total_tables(total(slot.tables))
        .max_memories_per_module(slot.memories_per_module.max(1))
        .max_tables_per_module(slot.tables_per_module.max(1))
        .table_elements(slot.table_elements)
        .max_memory_size(MAX_MEMORY_BYTES as usize)
        .pagemap_scan(wasmtime::Enabled::Auto)
        .linear_memory_keep_resident(2 << 20)
        .table_keep_resident(64 << 10)
        .async_stack_keep_resident(256 << 10)
        .decommit_batch_size(1);
    let mut config = Config::new();
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling));
    config
}
