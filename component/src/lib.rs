//! coord's coordination logic, compiled two ways.
//!
//! For `wasm32-unknown-unknown` this crate is the coord WebAssembly component:
//! `wasm` (compiled for wasm32 only) binds the logic to the exports of the WIT world `coordinator`
//! (`wit/`), and every store request goes to the host through the imported
//! `coord:sync/store` interface. Natively it is a plain Rust library whose
//! logic runs over any [`store::Store`], which is how the unit tests drive it
//! with a fake store and a clock they move by hand.
//!
//! The types of the WIT contract are generated once, in [`bindings`], and the
//! logic uses them directly, so what a test sees is exactly what crosses the
//! component boundary.
//!
//! - [`store`]: the store trait the logic runs over, mirroring `coord:sync/store`.
//! - [`lock`]: the distributed lock (`coord:sync/lock`).
//! - [`lease`]: the single-writer lease (`coord:sync/lease`).
//! - [`semaphore`]: the fenced counting semaphore (`coord:sync/semaphore`).
//! - [`rwlock`]: the fenced read-write lock, writers preferred (`coord:sync/rwlock`).
//! - [`ephemeral`]: per-tenant entries with TTL, snapshot and watch (`coord:sync/ephemeral`).
//! - [`ratelimit`]: sliding-window, fixed-window and token-bucket limits (`coord:sync/ratelimit`).
//! - [`meter`]: the rate-limit algorithms, as the store runs them.
//! - [`memory`]: the store semantics over plain memory, shared with the host.
//! - [`keys`]: how names become store partitions, injectively.
//! - [`validate`]: argument checks shared by every interface.

pub mod bindings;
pub mod ephemeral;
pub mod keys;
pub mod lease;
pub mod lock;
pub mod memory;
pub mod meter;
pub mod ratelimit;
pub mod rwlock;
pub mod semaphore;
pub mod store;
pub mod validate;

#[cfg(test)]
mod fake;

#[cfg(target_arch = "wasm32")]
mod wasm;

/// Allocations come from a 64 KiB region in the initial memory, so a fresh
/// instance whose calls fit never grows its memory ([`coord_region`] says why).
#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOCATOR: coord_region::Region<{ 64 * 1024 }> = coord_region::Region::new();
