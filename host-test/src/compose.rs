//! Composition: plug `coord.wasm` into an edge function that imports coord's
//! interfaces, so the result imports only the store (and whatever else the
//! function imports, such as `wasi:http`).
//!
//! This is what `wac plug --plug coord.wasm function.wasm` does, done here
//! with the `wac-graph` crate so `coord compose` and `coord serve` need no
//! other tool.

use wac_graph::types::Package;
use wac_graph::{CompositionGraph, EncodeOptions};
use wasmtime::error::Context as _;

/// The interfaces the coord component exports, by name without version.
pub const COORD_EXPORTS: [&str; 3] = [
    "coord:sync/lock",
    "coord:sync/ephemeral",
    "coord:sync/ratelimit",
];

/// Plug `coordinator` (a component exporting coord's interfaces, normally
/// [`crate::COMPONENT`]) into `function`, and return the composed component.
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
    wac_graph::plug(&mut graph, vec![coord], socket)
        .context("plugging coord into the function (does it import coord:sync/lock, ephemeral or ratelimit?)")?;
    graph
        .encode(EncodeOptions::default())
        .context("encoding the composition")
}

/// Whether a component (its bytes) imports any of coord's interfaces, and
/// so must be composed with the coord component before it can run. Read
/// from the bytes, so that nothing is compiled twice.
pub fn imports_coord(component: &[u8]) -> wasmtime::Result<bool> {
    let mut depth = 0usize;
    for payload in wasmparser::Parser::new(0).parse_all(component) {
        match payload.map_err(|e| wasmtime::format_err!("reading the function: {e}"))? {
            wasmparser::Payload::ModuleSection { .. }
            | wasmparser::Payload::ComponentSection { .. } => depth += 1,
            wasmparser::Payload::End(_) if depth == 0 => break,
            wasmparser::Payload::End(_) => depth -= 1,
            // Only the outermost component's imports are the host's to give.
            wasmparser::Payload::ComponentImportSection(imports) if depth == 0 => {
                for import in imports {
                    let name = import
                        .map_err(|e| wasmtime::format_err!("reading the function's imports: {e}"))?
                        .name
                        .name;
                    if COORD_EXPORTS.iter().any(|coord| is_interface(name, coord)) {
                        return Ok(true);
                    }
                }
            }
            _ => {}
        }
    }
    Ok(false)
}

/// `name` is `interface` at some version (`coord:sync/lock@0.1.0`).
fn is_interface(name: &str, interface: &str) -> bool {
    name.strip_prefix(interface)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('@'))
}

#[cfg(test)]
mod tests {
    use super::is_interface;

    #[test]
    fn interface_names_match_with_or_without_a_version_only() {
        assert!(is_interface("coord:sync/lock@0.1.0", "coord:sync/lock"));
        assert!(is_interface("coord:sync/lock", "coord:sync/lock"));
        assert!(!is_interface("coord:sync/lockx@0.1.0", "coord:sync/lock"));
        assert!(!is_interface("coord:sync/store@0.1.0", "coord:sync/lock"));
    }
}
