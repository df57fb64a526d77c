//! The host side of the WIT package, generated once: every import is async
//! (a store call may wait on the network or on a change), and so is every
//! export call.
#![allow(missing_docs, clippy::all)]

wasmtime::component::bindgen!({
    path: "../wit",
    world: "coordinator",
    imports: { default: async },
    exports: { default: async },
    additional_derives: [PartialEq, serde::Serialize, serde::Deserialize],
});
