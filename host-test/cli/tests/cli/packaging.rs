//! What the packages carry: the prebuilt components the published crates
//! embed are what the sources build today, and every package says the one
//! version (docs/packaging.md, docs/versioning.md).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root (this crate is `host-test/cli`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The version every package must carry: the workspace's.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Each prebuilt component, beside the bytes this build made from the sources.
fn prebuilt_and_fresh() -> [(&'static str, &'static [u8]); 3] {
    [
        ("host-test/host/prebuilt/coord.wasm", coord_host::COMPONENT),
        (
            "host-test/guests/prebuilt/inventory-fn.wasm",
            coord_guests::INVENTORY_FUNCTION,
        ),
        (
            "host-test/guests/prebuilt/hello-fn.wasm",
            coord_guests::HELLO_FUNCTION,
        ),
    ]
}

/// The toolchain the prebuilt components were built with (their `TOOLCHAIN`).
fn prebuilt_toolchain(folder: &str) -> String {
    let path = root().join(folder).join("TOOLCHAIN");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()))
        .trim()
        .to_owned()
}

/// The toolchain building this workspace, as `rustc -V` prints it.
fn this_toolchain() -> String {
    let out = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .arg("-V")
        .output()
        .expect("rustc -V");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// The WIT world a component exports and imports, printed: what a host
/// links against, whichever compiler produced the code.
fn world_of(component: &[u8]) -> String {
    let decoded = wit_component::decode(component).expect("a component");
    let resolve = decoded.resolve();
    let mut printer = wit_component::WitPrinter::default();
    printer
        .print(resolve, decoded.package(), &[])
        .expect("the component's WIT prints");
    printer.output.to_string()
}

/// The published crates embed the prebuilt components, not a fresh build
/// (their tarballs hold no workspace to build from): the prebuilt bytes
/// must be what the sources build. The build is reproducible for one
/// toolchain (paths are remapped, the profile is fixed), so with the
/// toolchain that wrote `TOOLCHAIN` the bytes must be equal; with another
/// (a newer stable on a contributor's machine) the code differs but the
/// contract must not, so the components' worlds must be.
#[test]
fn prebuilt_components_are_what_the_sources_build() {
    let toolchain = this_toolchain();
    let mut stale = Vec::new();
    for (path, fresh) in prebuilt_and_fresh() {
        let folder = Path::new(path).parent().unwrap().to_str().unwrap();
        let prebuilt =
            std::fs::read(root().join(path)).unwrap_or_else(|error| panic!("{path}: {error}"));
        if prebuilt_toolchain(folder) == toolchain {
            if prebuilt != fresh {
                stale.push(format!(
                    "{path}: {} bytes, the fresh build {}",
                    prebuilt.len(),
                    fresh.len()
                ));
            }
        } else if world_of(&prebuilt) != world_of(fresh) {
            stale.push(format!(
                "{path}: its WIT world differs from the fresh build's"
            ));
        }
    }
    assert!(
        stale.is_empty(),
        "prebuilt components are not what the sources build ({toolchain}); run \
         `cargo run -p coord-release -- prebuilt` and commit them:\n{}",
        stale.join("\n")
    );
}

/// The world comparison above can tell two components apart: the
/// component and an example function export different worlds.
#[test]
fn different_components_have_different_worlds() {
    assert_ne!(
        world_of(coord_host::COMPONENT),
        world_of(coord_guests::HELLO_FUNCTION)
    );
}

/// Reads a file of the repository.
fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|error| panic!("{path}: {error}"))
}

/// The `version = "…"` of a TOML table (`[project]`, `[package]`), read
/// line by line: the manifests keep it on one line.
fn toml_version(text: &str, table: &str) -> Option<String> {
    let mut in_table = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_table = line == table;
        } else if in_table && let Some(value) = line.strip_prefix("version") {
            let value = value.trim_start().strip_prefix('=')?.trim();
            return Some(value.trim_matches('"').to_owned());
        }
    }
    None
}

/// One version everywhere (docs/versioning.md): the crates, the WIT
/// package, the npm package and its lock file, the Python distribution,
/// and the CHANGELOG's newest entry.
#[test]
fn every_package_says_one_version() {
    let mut found = Vec::new();

    found.push((
        "Cargo.toml [workspace.package]",
        toml_version(&read("Cargo.toml"), "[workspace.package]"),
    ));

    let mut resolve = wit_parser::Resolve::default();
    let (package, _) = resolve.push_dir(root().join("wit")).expect("wit/ parses");
    let wit_version = resolve.packages[package]
        .name
        .version
        .as_ref()
        .map(ToString::to_string);
    found.push(("wit/ (package coord:sync@…)", wit_version));

    let package_json: serde_json::Value =
        serde_json::from_str(&read("examples/js-host/package.json")).unwrap();
    found.push((
        "examples/js-host/package.json",
        package_json["version"].as_str().map(str::to_owned),
    ));
    let lock: serde_json::Value =
        serde_json::from_str(&read("examples/js-host/package-lock.json")).unwrap();
    found.push((
        "examples/js-host/package-lock.json",
        lock["version"].as_str().map(str::to_owned),
    ));

    found.push((
        "examples/py-host/pyproject.toml [project]",
        toml_version(&read("examples/py-host/pyproject.toml"), "[project]"),
    ));

    let changelog = read("CHANGELOG.md");
    let newest = changelog
        .lines()
        .find(|line| line.starts_with("## "))
        .unwrap_or_default();
    found.push((
        "CHANGELOG.md, its newest entry",
        newest.contains(VERSION).then(|| VERSION.to_owned()),
    ));

    // The workspace's own crates are required at this version, so that a
    // published crate asks for its siblings of the same release.
    for line in read("Cargo.toml")
        .lines()
        .filter(|line| line.starts_with("coord-") && line.contains("version"))
    {
        let required = line
            .split("version = \"")
            .nth(1)
            .and_then(|rest| rest.split('"').next());
        found.push((
            "Cargo.toml [workspace.dependencies]",
            required.map(str::to_owned),
        ));
    }

    let wrong: Vec<String> = found
        .iter()
        .filter(|(_, version)| version.as_deref() != Some(VERSION))
        .map(|(place, version)| format!("{place}: {version:?}"))
        .collect();
    assert!(found.len() >= 7, "the places were not all read: {found:?}");
    assert!(
        wrong.is_empty(),
        "not version {VERSION}:\n{}",
        wrong.join("\n")
    );
}
