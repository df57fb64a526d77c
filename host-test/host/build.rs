//! Builds the coord component (`component/`) before the host that embeds
//! it (`coord_host::COMPONENT`), and writes it to `target/coord.wasm` for
//! tools and commands. A published crate embeds `prebuilt/coord.wasm`
//! instead (`guest_build.rs` says why).

#[path = "guest_build.rs"]
mod guest_build;

fn main() -> anyhow::Result<()> {
    let root = guest_build::workspace_root()?;
    let outputs = [("coord_component.wasm", "coord.wasm")];
    if !guest_build::in_workspace(&root, "component/src/lib.rs") {
        return guest_build::copy_prebuilt(&outputs);
    }
    guest_build::rerun_if_changed(
        &root,
        &[
            "component/src",
            "component/Cargo.toml",
            "component/region",
            "wit",
            "Cargo.toml",
        ],
    );
    guest_build::build_components(&root, &["coord-component"], &outputs)
}
