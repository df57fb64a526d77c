//! The `coord` command's suites, in one test binary: `coord serve` over real
//! HTTP, its admin listener, requests its deadline cuts, hostile clients,
//! the operator's commands (each runs the built `coord` binary), and what
//! the packages carry.
//!
//! `cargo test --workspace --test cli -- serve::` runs one suite. The
//! harness and the server spawners are coord-testing's.
#![allow(clippy::unwrap_used)] // tests may unwrap: a panic is the failure report

use coord_testing as common;

// The `coord serve` process the suites drive.
mod process;

mod operate;
mod packaging;
mod serve;
mod serve_admin;
mod serve_before_store;
mod serve_cut;
mod serve_hostile;
mod serve_killed;
mod serve_stalled;
