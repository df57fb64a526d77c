//! Builds the example edge functions (`examples/inventory-fn`,
//! `examples/hello-fn`) into components, embedded by this crate and written
//! to `target/inventory-fn.wasm` and `target/hello-fn.wasm`. A published
//! crate embeds `prebuilt/` instead (`guest_build.rs` says why).

#[path = "guest_build.rs"]
mod guest_build;

fn main() -> anyhow::Result<()> {
    let root = guest_build::workspace_root()?;
    let outputs = [
        ("coord_inventory_fn.wasm", "inventory-fn.wasm"),
        ("coord_hello_fn.wasm", "hello-fn.wasm"),
    ];
    if !guest_build::in_workspace(&root, "examples/inventory-fn/Cargo.toml") {
        return guest_build::copy_prebuilt(&outputs);
    }
    guest_build::rerun_if_changed(
        &root,
        &[
            "sdk/src",
            "sdk/Cargo.toml",
            "examples/inventory-fn/src",
            "examples/inventory-fn/wit",
            "examples/inventory-fn/Cargo.toml",
            "examples/hello-fn/src",
            "examples/hello-fn/Cargo.toml",
            "component/region",
            "wit",
            "Cargo.toml",
        ],
    );
    guest_build::build_components(&root, &["coord-inventory-fn", "coord-hello-fn"], &outputs)
}
