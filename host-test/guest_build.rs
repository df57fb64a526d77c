//! Building guest crates into components, shared by the build scripts of
//! `coord-host` (coord.wasm) and `coord-guests` (the example functions).
//!
//! The guests are compiled for `wasm32-unknown-unknown` with a nested
//! `cargo build` into a target directory of their own (sharing the outer
//! one would deadlock on its lock), then wrapped into components with
//! `wit-component`.
//!
//! A crate published from this workspace has no workspace around it: its
//! tarball carries the components as they were built for the release
//! (`prebuilt/`, written by `cargo run -p coord-release`), and this script
//! copies those instead of building. In the workspace it always builds, so
//! an edit to a guest is what the tests run; `packaging.rs` in coord-testing
//! proves the prebuilt bytes equal to that fresh build (docs/packaging.md).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root, two folders above the crate being built.
pub fn workspace_root() -> anyhow::Result<PathBuf> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    manifest_dir
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .ok_or_else(|| anyhow::anyhow!("{} is not two folders deep", manifest_dir.display()))
}

/// Rebuild when any of `watched` (paths under the workspace root) changes.
pub fn rerun_if_changed(root: &Path, watched: &[&str]) {
    for path in watched {
        println!("cargo:rerun-if-changed={}", root.join(path).display());
    }
}

/// Whether the guests' sources are here (a checkout of the workspace), not
/// only this crate (a published tarball, or its verification by `cargo
/// package`): `marker` is a file of the guests' sources under the root.
pub fn in_workspace(root: &Path, marker: &str) -> bool {
    root.join(marker).is_file() && root.join("wit/world.wit").is_file()
}

/// Copy each component of `outputs` from this crate's `prebuilt/` folder to
/// `OUT_DIR`: what a published crate embeds.
pub fn copy_prebuilt(outputs: &[(&str, &str)]) -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    for (_, component) in outputs {
        let prebuilt = manifest_dir.join("prebuilt").join(component);
        println!("cargo:rerun-if-changed={}", prebuilt.display());
        std::fs::copy(&prebuilt, out_dir.join(component)).map_err(|error| {
            anyhow::anyhow!(
                "{} (the component this crate ships): {error}",
                prebuilt.display()
            )
        })?;
    }
    Ok(())
}

/// Build `packages` with the `guest` profile and write each
/// `(module, component)` pair's component to `OUT_DIR` and to the outer
/// target directory (for tools and commands).
pub fn build_components(
    root: &Path,
    packages: &[&str],
    outputs: &[(&str, &str)],
) -> anyhow::Result<()> {
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let guest_target = target_dir.join("guest");
    ensure_guest_target()?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(root)
        .args(["build", "--profile", "guest", "--locked"]);
    for package in packages {
        command.args(["-p", package]);
    }
    command
        .args(["--target", GUEST_TARGET, "--target-dir"])
        .arg(&guest_target)
        // The outer build's wrappers (clippy, coverage) and flags are for the host, not the guest.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR");
    // Registry sources are named by where this machine keeps them: remapped,
    // the bytes do not depend on it (prebuilt/ must equal a fresh build).
    if let Some(cargo_home) = cargo_home() {
        command.env(
            "CARGO_ENCODED_RUSTFLAGS",
            format!("--remap-path-prefix={}=/cargo", cargo_home.display()),
        );
    }
    let status = command.status()?;
    anyhow::ensure!(status.success(), "building {packages:?} failed: {status}");

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let built = guest_target.join(GUEST_TARGET).join("guest");
    for (module, component) in outputs {
        let encoded = encode(&built.join(module))?;
        std::fs::write(out_dir.join(component), &encoded)?;
        std::fs::write(target_dir.join(component), &encoded)?;
    }
    Ok(())
}

/// Cargo's home: `CARGO_HOME`, else `~/.cargo`.
fn cargo_home() -> Option<PathBuf> {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")))
}

/// The target the guests are compiled for.
const GUEST_TARGET: &str = "wasm32-unknown-unknown";

/// Install the guests' target when the toolchain lacks it.
///
/// `rust-toolchain.toml` names it, but rustup adds a toolchain file's
/// targets only when it installs the toolchain itself: on a machine whose
/// stable toolchain was already there, the README's first command stopped
/// in this script with "can't find crate for `std`".
fn ensure_guest_target() -> anyhow::Result<()> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let sysroot = Command::new(&rustc).args(["--print", "sysroot"]).output()?;
    anyhow::ensure!(
        sysroot.status.success(),
        "`{rustc} --print sysroot` failed: {}",
        String::from_utf8_lossy(&sysroot.stderr)
    );
    let sysroot = PathBuf::from(String::from_utf8(sysroot.stdout)?.trim());
    if sysroot
        .join("lib/rustlib")
        .join(GUEST_TARGET)
        .join("lib")
        .is_dir()
    {
        return Ok(());
    }
    println!("cargo:warning=installing the {GUEST_TARGET} target with rustup (once)");
    let mut rustup = Command::new("rustup");
    rustup.args(["target", "add", GUEST_TARGET]);
    // Under rustup's proxies this names the toolchain this build runs on.
    if let Ok(toolchain) = std::env::var("RUSTUP_TOOLCHAIN") {
        rustup.args(["--toolchain", &toolchain]);
    }
    let installed = rustup.status().map(|status| status.success());
    anyhow::ensure!(
        matches!(installed, Ok(true)),
        "the {GUEST_TARGET} target is missing and `rustup target add {GUEST_TARGET}` \
         failed ({installed:?}); install it by hand, or with your toolchain's installer"
    );
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
