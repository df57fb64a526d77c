//! Builds the coord component before the host that embeds it.
//!
//! The guest crate (`component/`) is compiled for `wasm32-unknown-unknown`
//! with a nested `cargo build` into its own target directory (sharing the
//! outer one would deadlock on its lock), then wrapped into a component with
//! `wit-component`. The result is embedded by `coord_host::COMPONENT` and
//! also written to `target/coord.wasm` for tools (`wasm-tools component wit`).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let root = manifest_dir
        .parent()
        .ok_or_else(|| anyhow::anyhow!("host-test has no parent directory"))?;
    for watched in ["component/src", "component/Cargo.toml", "wit", "Cargo.toml"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }

    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let guest_target = target_dir.join("guest");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(root)
        .args(["build", "--release", "--locked", "-p", "coord-component"])
        .args(["--target", "wasm32-unknown-unknown", "--target-dir"])
        .arg(&guest_target)
        // The outer build's wrappers (clippy, coverage) and flags are for the host, not the guest.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .status()?;
    anyhow::ensure!(
        status.success(),
        "building the guest crate failed: {status}"
    );

    let module_path = guest_target.join("wasm32-unknown-unknown/release/coord_component.wasm");
    let component = encode(&module_path)?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("coord.wasm");
    std::fs::write(&out, &component)?;
    std::fs::write(target_dir.join("coord.wasm"), &component)?;
    Ok(())
}

/// Wrap the core module into a component whose imports are exactly the WIT's.
fn encode(module_path: &Path) -> anyhow::Result<Vec<u8>> {
    let module = std::fs::read(module_path)?;
    wit_component::ComponentEncoder::default()
        .module(&module)?
        .validate(true)
        .encode()
}
