//! Composition: plug `coord.wasm` into an edge function that imports coord's
//! interfaces, so the result imports only the store (and whatever else the
//! function imports, such as `wasi:http`).
//!
//! This is what `wac plug --plug coord.wasm function.wasm` does, done here
//! with the `wac-graph` crate so `coord compose` and `coord serve` need no
//! other tool.
//!
//! Which interfaces are coord's is read from the coord component itself
//! (its exported instances), never from a list kept here: a list had
//! forgotten `coord:sync/lease`, so a function importing only the lease was
//! served uncomposed and could not link.

use std::sync::OnceLock;

use wac_graph::types::Package;
use wac_graph::{CompositionGraph, EncodeOptions};
use wasmtime::error::Context as _;

/// Plug `coordinator` (a component exporting coord's interfaces, normally
/// [`coord_host::COMPONENT`]) into `function`, and return the composed component.
/// Fails when the function imports none of coord's interfaces, or when an
/// import's type does not match the export's.
pub fn plug(function: &[u8], coordinator: &[u8]) -> wasmtime::Result<Vec<u8>> {
    let mut graph = CompositionGraph::new();
    let socket = Package::from_bytes("coord:function", None, function, graph.types_mut())
        .map_err(|e| wasmtime::format_err!("reading the function component: {e:#}"))?;
    let socket = graph
        .register_package(socket)
        .context("registering the function")?;
    let coord = Package::from_bytes("coord:sync", None, coordinator, graph.types_mut())
        .map_err(|e| wasmtime::format_err!("reading the coord component: {e:#}"))?;
    let coord = graph
        .register_package(coord)
        .context("registering the coord component")?;
    wac_graph::plug(&mut graph, vec![coord], socket).with_context(|| {
        let offered = exports(coordinator).map_or_else(|e| format!("({e:#})"), |e| e.join(", "));
        format!("plugging coord into the function (does it import one of {offered}?)")
    })?;
    graph
        .encode(EncodeOptions::default())
        .context("encoding the composition")
}

/// The interfaces `coordinator` exports, as named in its bytes
/// (`coord:sync/lock@0.1.0`, …): the outermost component's exported
/// instances, in the order it exports them.
pub fn exports(coordinator: &[u8]) -> wasmtime::Result<Vec<String>> {
    let mut names = Vec::new();
    outermost(coordinator, "the coord component", |payload| {
        if let wasmparser::Payload::ComponentExportSection(section) = payload {
            for export in section.clone() {
                let export = export.map_err(|e| {
                    wasmtime::format_err!("reading the coord component's exports: {e}")
                })?;
                if export.kind == wasmparser::ComponentExternalKind::Instance {
                    names.push(export.name.name.to_string());
                }
            }
        }
        Ok(true)
    })?;
    Ok(names)
}

/// The interfaces the built-in coord component ([`coord_host::COMPONENT`])
/// exports, read from it once.
pub fn coord_exports() -> wasmtime::Result<&'static [String]> {
    static EXPORTS: OnceLock<Result<Vec<String>, String>> = OnceLock::new();
    EXPORTS
        .get_or_init(|| exports(coord_host::COMPONENT).map_err(|e| format!("{e:#}")))
        .as_deref()
        .map_err(|e| wasmtime::format_err!("{e}"))
}

/// Whether a component (its bytes) imports any of coord's interfaces (those
/// the built-in coord component exports), and so must be composed with the
/// coord component before it can run. Read from the bytes, so that nothing
/// is compiled twice.
pub fn imports_coord(component: &[u8]) -> wasmtime::Result<bool> {
    imports_any_of(component, coord_exports()?)
}

/// Whether `component` imports any of `interfaces` (named with or without a
/// version; an import matches an interface at any version).
pub fn imports_any_of(component: &[u8], interfaces: &[String]) -> wasmtime::Result<bool> {
    let unversioned: Vec<&str> = interfaces.iter().map(|name| unversioned(name)).collect();
    let mut found = false;
    outermost(component, "the function", |payload| {
        // Only the outermost component's imports are the host's to give.
        if let wasmparser::Payload::ComponentImportSection(imports) = payload {
            for import in imports.clone() {
                let name = import
                    .map_err(|e| wasmtime::format_err!("reading the function's imports: {e}"))?
                    .name
                    .name;
                if unversioned.iter().any(|coord| is_interface(name, coord)) {
                    found = true;
                    return Ok(false);
                }
            }
        }
        Ok(true)
    })?;
    Ok(found)
}

/// Call `each` with the sections of the outermost component in `bytes` (not
/// those of the modules and components nested in it) until it returns
/// `false`.
fn outermost(
    bytes: &[u8],
    what: &str,
    mut each: impl FnMut(&wasmparser::Payload<'_>) -> wasmtime::Result<bool>,
) -> wasmtime::Result<()> {
    let mut depth = 0usize;
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        match payload.map_err(|e| wasmtime::format_err!("reading {what}: {e}"))? {
            wasmparser::Payload::ModuleSection { .. }
            | wasmparser::Payload::ComponentSection { .. } => depth += 1,
            wasmparser::Payload::End(_) if depth == 0 => break,
            wasmparser::Payload::End(_) => depth -= 1,
            payload if depth == 0 && !each(&payload)? => break,
            _ => {}
        }
    }
    Ok(())
}

/// `coord:sync/lock` of `coord:sync/lock@0.1.0`.
fn unversioned(name: &str) -> &str {
    name.split_once('@').map_or(name, |(bare, _)| bare)
}

/// `name` is `interface` at some version (`coord:sync/lock@0.1.0`).
fn is_interface(name: &str, interface: &str) -> bool {
    name.strip_prefix(interface)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('@'))
}

#[cfg(test)]
mod tests {
    use super::{exports, imports_any_of, is_interface};

    #[test]
    fn interface_names_match_with_or_without_a_version_only() {
        assert!(is_interface("coord:sync/lock@0.1.0", "coord:sync/lock"));
        assert!(is_interface("coord:sync/lock", "coord:sync/lock"));
        assert!(!is_interface("coord:sync/lockx@0.1.0", "coord:sync/lock"));
        assert!(!is_interface("coord:sync/store@0.1.0", "coord:sync/lock"));
    }

    #[test]
    fn coords_interfaces_are_read_from_the_component() {
        let names = exports(coord_host::COMPONENT).unwrap();
        for interface in ["lock", "lease", "ephemeral", "ratelimit"] {
            let wanted = format!("coord:sync/{interface}@");
            assert!(
                names.iter().any(|n| n.starts_with(&wanted)),
                "{interface} missing from {names:?}"
            );
        }
        assert!(
            !names.iter().any(|n| n.starts_with("coord:sync/store")),
            "the store is imported, not exported: {names:?}"
        );
        // The coord component imports the store, not its own exports.
        assert!(!imports_any_of(coord_host::COMPONENT, &names).unwrap());
    }
}
