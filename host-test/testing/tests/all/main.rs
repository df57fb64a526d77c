//! Every integration suite of the host crates, in one test binary (the
//! edge runtime's and the command line's, which run the `coord` binary,
//! are coord-cli's `tests/cli`).
//!
//! One binary instead of one per file: wasmtime and the stores' clients are
//! linked once, not two dozen times, and the suites run side by side, so a
//! test waiting on a TTL or a server leaves the cores to another suite.
//! `cargo test --workspace --test all -- lock::` runs one suite, and
//! `-- lock::redis::` one suite on one backend (the names are the modules
//! below, then the backend `per_backend!` adds).
//!
//! Each test is bounded by lack of progress (`common::watchdog`), never by
//! wall time, so a machine busy with every suite at once stays green.
#![allow(clippy::unwrap_used)] // tests may unwrap: a panic is the failure report

// The harness, `per_backend!`, the server spawners and the fault doubles
// (the crate's library), as `common` to every suite.
#[macro_use]
extern crate coord_testing;
use coord_testing as common;

// The component's contract and the interfaces, end to end on every backend.
mod component;
mod ephemeral;
mod hostile;
mod lease;
mod lease_manager;
mod limits;
mod lock;
mod ratelimit;
mod reservations;
mod rwlock;
mod semaphore;
mod turns;
mod with_lock;

// The store contract, and what each backend must show beyond it.
mod conformance;
mod nats;
mod nats_cluster;
mod postgres;
mod redis;
mod redis_cluster;
mod rows_layout;
mod sqlite;
mod sqlite_faults;
mod sqlite_rows;

// Safety under contention and faults.
mod fault_run;
mod lock_faults;
mod release_retry;
mod reliability;
