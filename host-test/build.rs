//! Builds the coord component before the host that embeds it.
//!
//! The guest crates (`component/`, and the example edge function in
//! `examples/inventory-fn/`) are compiled for `wasm32-unknown-unknown`
//! with a nested `cargo build` into its own target directory (sharing the
//! outer one would deadlock on its lock), then wrapped into components with
//! `wit-component`. They are embedded (`coord_host::COMPONENT`,
//! `coord_host::serve::INVENTORY_FUNCTION`) and also written to
//! `target/coord.wasm` and `target/inventory-fn.wasm` for tools and commands.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let root = manifest_dir
        .parent()
        .ok_or_else(|| anyhow::anyhow!("host-test has no parent directory"))?;
    for watched in [
        "component/src",
        "component/Cargo.toml",
        "component/region",
        "sdk/src",
        "sdk/Cargo.toml",
        "examples/inventory-fn/src",
        "examples/inventory-fn/wit",
        "examples/inventory-fn/Cargo.toml",
        "examples/hello-fn/src",
        "examples/hello-fn/Cargo.toml",
        "wit",
        "Cargo.toml",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }

    // The example functions are served by `coord serve` (the `serve`
    // feature); a memory-only embedder builds the component alone.
    let serve = std::env::var_os("CARGO_FEATURE_SERVE").is_some();
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let guest_target = target_dir.join("guest");
    ensure_guest_target()?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(root)
        .args([
            "build",
            "--profile",
            "guest",
            "--locked",
            "-p",
            "coord-component",
        ])
        .args(if serve {
            &["-p", "coord-inventory-fn", "-p", "coord-hello-fn"][..]
        } else {
            &[]
        })
        .args(["--target", GUEST_TARGET, "--target-dir"])
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

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let release = guest_target.join(GUEST_TARGET).join("guest");
    let functions = [
        ("coord_inventory_fn.wasm", "inventory-fn.wasm"),
        ("coord_hello_fn.wasm", "hello-fn.wasm"),
    ];
    let built = [("coord_component.wasm", "coord.wasm")]
        .into_iter()
        .chain(functions.into_iter().filter(|_| serve));
    for (module, component) in built {
        let encoded = encode(&release.join(module))?;
        std::fs::write(out_dir.join(component), &encoded)?;
        std::fs::write(target_dir.join(component), &encoded)?;
    }
    Ok(())
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
