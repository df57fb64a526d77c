//! Builds the coord component (`component/`) before the host that embeds
//! it (`coord_host::COMPONENT`), and writes it to `target/coord.wasm` for
//! tools and commands.

#[path = "../guest_build.rs"]
mod guest_build;

fn main() -> anyhow::Result<()> {
    let root = guest_build::workspace_root()?;
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
    guest_build::build_components(
        &root,
        &["coord-component"],
        &[("coord_component.wasm", "coord.wasm")],
    )
}
