//! coord for edge functions written in Rust — in the role the `wasip2`
//! crate plays for WASI.
//!
//! An edge function built with this crate imports coord's interfaces (the
//! `client` world of `wit/world.wit`) and is composed with `coord.wasm`
//! before it runs (`coord compose`, or `coord serve`, which composes on the
//! fly). This crate gives it:
//!
//! - the generated interfaces, as they are: [`lock`], [`lease`],
//!   [`ephemeral`], [`ratelimit`], [`semaphore`], [`rwlock`];
//! - [`with_permit`]: run work holding one of a semaphore's permits, and
//!   always release it;
//! - [`with_read`] and [`with_write`]: run work under a read-write lock in
//!   one mode, and always release it;
//! - [`ReservationGuard`]: reserve an estimated cost, record what the work
//!   used, and settle that when the guard is dropped;
//! - [`with_lock`]: run work under a lock and always release it. A WASI 0.2
//!   guest has no background task, so a long job keeps its lock alive by
//!   hand, calling [`LockGuard::keep_alive`] between steps (seed 002's
//!   "refreshing by hand");
//! - [`Space`]: ephemeral state whose values are any serde type (seed 000's
//!   `ephemeral<{ userId }>`).
//!
//! ```no_run
//! use coord_sdk::{with_lock, Ran, Space, lock};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Editor { user: String }
//!
//! let options = lock::AcquireOptions { ttl_ms: Some(10_000), wait: None };
//! match with_lock("inventory.stock", "item:42", options, |guard| {
//!     // ... write, presenting guard.fence() at the write boundary ...
//!     guard.keep_alive()?;          // between steps of a long job
//!     Ok::<_, coord_sdk::Lost>(())
//! }) {
//!     Ok(Ran::Done(Ok(()))) => {}
//!     Ok(Ran::Done(Err(lost))) => { /* the lock was lost mid-way: stop */ let _ = lost; }
//!     Ok(Ran::Busy(holder)) => { /* 409, retry after holder.remaining_ms */ let _ = holder; }
//!     Err(error) => { /* 503: unavailable is never busy and never acquired */ let _ = error; }
//! }
//!
//! let editors: Space<Editor> = Space::new("inventory.editors", 30_000, 4096);
//! editors.upsert("item:42", "session-1", &Editor { user: "ada".into() }).ok();
//! ```

mod permit;
mod reservation;
mod run;
mod rw;
mod space;

pub use permit::{Admitted, with_permit};
pub use reservation::ReservationGuard;
pub use run::{LockGuard, Lost, LostBecause, Ran, with_lock};
pub use rw::{Granted, with_read, with_write};
pub use space::{Entry, Snapshot, Space, SpaceError};

/// The generated bindings of the `client` world. Another crate's
/// `wit_bindgen::generate!` can reuse them with its `with` option (as the
/// example function does), so one module never holds two copies.
pub mod bindings {
    #![allow(missing_docs, unsafe_code, clippy::all)]
    wit_bindgen::generate!({
        path: "wit",
        world: "coord:sync/client",
        generate_all,
    });
}

pub use bindings::coord::sync::{ephemeral, lease, lock, ratelimit, rwlock, semaphore};
