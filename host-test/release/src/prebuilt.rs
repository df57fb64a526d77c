//! The components the published crates carry: built from the sources, then
//! written into each embedding crate's `prebuilt/` with the toolchain that
//! built them (`TOOLCHAIN`, `rustc -V`).

use std::path::Path;

use crate::run;

/// Each component: the crate folder that embeds it, and its file name (as
/// the build scripts write it to `target/`).
pub const COMPONENTS: [(&str, &str); 3] = [
    ("host-test/host", "coord.wasm"),
    ("host-test/guests", "inventory-fn.wasm"),
    ("host-test/guests", "hello-fn.wasm"),
];

/// Build the components and write them to the crates' `prebuilt/` folders.
pub fn write(root: &Path) -> anyhow::Result<()> {
    build(root)?;
    let toolchain = run::output("rustc", &["-V"])?;
    for (crate_dir, file) in COMPONENTS {
        let folder = root.join(crate_dir).join("prebuilt");
        std::fs::create_dir_all(&folder)?;
        std::fs::copy(root.join("target").join(file), folder.join(file))?;
        std::fs::write(folder.join("TOOLCHAIN"), format!("{toolchain}\n"))?;
        println!("wrote {crate_dir}/prebuilt/{file} ({toolchain})");
    }
    Ok(())
}

/// Build the components into `target/` (the build scripts of coord-host and
/// coord-guests write them there).
pub fn build(root: &Path) -> anyhow::Result<()> {
    run::run(
        root,
        &run::cargo(),
        &["build", "-p", "coord-host", "-p", "coord-guests"],
    )
}

/// Fail unless every prebuilt component is the fresh build's bytes.
pub fn check(root: &Path) -> anyhow::Result<()> {
    build(root)?;
    for (crate_dir, file) in COMPONENTS {
        let prebuilt = std::fs::read(root.join(crate_dir).join("prebuilt").join(file))?;
        let fresh = std::fs::read(root.join("target").join(file))?;
        anyhow::ensure!(
            prebuilt == fresh,
            "{crate_dir}/prebuilt/{file} is not what the sources build now: \
             run `cargo run -p coord-release -- prebuilt` and commit it"
        );
    }
    Ok(())
}
