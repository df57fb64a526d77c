//! The release folder: every artifact a user downloads or installs, and
//! their SHA-256 sums.

use std::fmt::Write as _;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::{prebuilt, run};

/// The version every package carries (the workspace's).
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Write the release folder `out`, the `coord` binary built with `profile`.
pub fn write(root: &Path, out: &Path, profile: &str) -> anyhow::Result<()> {
    prebuilt::check(root)?;
    std::fs::create_dir_all(out)?;
    let mut files = Vec::new();

    std::fs::copy(
        root.join("host-test/host/prebuilt/coord.wasm"),
        out.join("coord.wasm"),
    )?;
    files.push("coord.wasm".to_owned());

    let wit = format!("coord-sync-{VERSION}.wit.wasm");
    std::fs::write(out.join(&wit), encode_wit(&root.join("wit"))?)?;
    files.push(wit);

    files.push(binary(root, out, profile)?);
    files.push(npm_tarball(root, out)?);
    files.push(wheel(root, out)?);

    let mut sums = String::new();
    for file in &files {
        let digest = Sha256::digest(std::fs::read(out.join(file))?);
        let hex = digest.iter().fold(String::new(), |mut hex, byte| {
            let _ = write!(hex, "{byte:02x}");
            hex
        });
        let _ = writeln!(sums, "{hex}  {file}");
    }
    std::fs::write(out.join("SHA256SUMS"), &sums)?;
    print!("{sums}");
    println!("release {VERSION} written to {}", out.display());
    Ok(())
}

/// The WIT package `coord:sync` encoded as a wasm package, as `wasm-tools
/// component wit --wasm` writes it: what an OCI registry (`wkg`) takes.
pub fn encode_wit(dir: &Path) -> anyhow::Result<Vec<u8>> {
    let mut resolve = wit_parser::Resolve::default();
    let (package, _) = resolve.push_dir(dir)?;
    let name = &resolve.packages[package].name;
    anyhow::ensure!(
        name.version.as_ref().map(ToString::to_string).as_deref() == Some(VERSION),
        "wit/ is {name}, not version {VERSION}"
    );
    wit_component::encode(&resolve, package, false)
}

/// The `coord` binary for this machine, named with its target.
fn binary(root: &Path, out: &Path, profile: &str) -> anyhow::Result<String> {
    run::run(
        root,
        &run::cargo(),
        &["build", "-p", "coord-cli", "--profile", profile, "--locked"],
    )?;
    let folder = if profile == "dev" { "debug" } else { profile };
    let host = run::output("rustc", &["-vV"])?
        .lines()
        .find_map(|line| line.strip_prefix("host: ").map(str::to_owned))
        .ok_or_else(|| anyhow::anyhow!("`rustc -vV` names no host"))?;
    let name = format!("coord-{VERSION}-{host}");
    std::fs::copy(
        root.join("target").join(folder).join("coord"),
        out.join(&name),
    )?;
    Ok(name)
}

/// `npm pack` of the JavaScript host (examples/js-host).
fn npm_tarball(root: &Path, out: &Path) -> anyhow::Result<String> {
    let package = root.join("examples/js-host");
    if !package.join("node_modules").is_dir() {
        run::run(&package, "npm", &["ci"])?;
    }
    let destination = out
        .to_str()
        .ok_or_else(|| anyhow::anyhow!("{} is not UTF-8", out.display()))?;
    run::run(
        &package,
        "npm",
        &["pack", "--pack-destination", destination],
    )?;
    Ok(format!("coord-sync-{VERSION}.tgz"))
}

/// The wheel of the Python host (examples/py-host).
fn wheel(root: &Path, out: &Path) -> anyhow::Result<String> {
    let destination = out
        .to_str()
        .ok_or_else(|| anyhow::anyhow!("{} is not UTF-8", out.display()))?;
    run::run(
        &root.join("examples/py-host"),
        "python3",
        &[
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--wheel-dir",
            destination,
            ".",
        ],
    )?;
    Ok(format!("coord_sync-{VERSION}-py3-none-any.whl"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The encoded package decodes to `coord:sync` at the workspace's
    /// version, with every interface of wit/.
    #[test]
    fn the_wit_package_decodes_to_the_contract() {
        let root = run::workspace_root().expect("the workspace root");
        let bytes = encode_wit(&root.join("wit")).expect("wit/ encodes");
        let decoded = wit_component::decode(&bytes).expect("a wasm WIT package");
        let wit_component::DecodedWasm::WitPackage(resolve, package) = decoded else {
            panic!("the encoding is a component, not a WIT package");
        };
        let package = &resolve.packages[package];
        assert_eq!(package.name.to_string(), format!("coord:sync@{VERSION}"));
        let mut interfaces: Vec<&str> = package.interfaces.keys().map(String::as_str).collect();
        interfaces.sort_unstable();
        assert_eq!(
            interfaces,
            [
                "ephemeral",
                "lease",
                "lock",
                "ratelimit",
                "rwlock",
                "semaphore",
                "store"
            ]
        );
    }
}
