//! The built component's contract: what it imports and exports, checked on
//! the real `coord.wasm` (what `wasm-tools component wit` would print).

#![allow(clippy::unwrap_used)] // tests may unwrap: a panic is the failure report

use coord_host::{COMPONENT, engine_config};
use wasmtime::Engine;
use wasmtime::component::Component;

#[test]
fn the_component_imports_only_the_store_and_randomness_and_exports_the_primitives() {
    let engine = Engine::new(&engine_config()).unwrap();
    let component = Component::new(&engine, COMPONENT).unwrap();
    let ty = component.component_type();
    let mut imports: Vec<String> = ty
        .imports(&engine)
        .map(|(name, _)| name.to_string())
        .collect();
    imports.sort();
    assert_eq!(
        imports,
        ["coord:sync/store@0.1.0", "wasi:random/random@0.2.0"],
        "no wasi:cli, no wasi:io"
    );
    let mut exports: Vec<String> = ty
        .exports(&engine)
        .map(|(name, _)| name.to_string())
        .collect();
    exports.sort();
    assert_eq!(
        exports,
        [
            "coord:sync/ephemeral@0.1.0",
            "coord:sync/lock@0.1.0",
            "coord:sync/ratelimit@0.1.0"
        ]
    );
}
