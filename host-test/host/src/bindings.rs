//! The host side of the WIT package (the `coordinator` world), generated
//! once: every import is async (a store call may wait on the network or on
//! a change), and so is every export call. Public for embedders who
//! instantiate `coord.wasm` in a `Store` of their own
//! ([`crate::add_to_linker`]): [`Coordinator`] instantiates it and reaches
//! each exported interface (`coord_sync_lock()`, `coord_sync_lease()`, …).
#![allow(missing_docs, clippy::all)]

wasmtime::component::bindgen!({
    path: "wit",
    world: "coordinator",
    imports: { default: async },
    exports: { default: async },
    additional_derives: [PartialEq, serde::Serialize, serde::Deserialize],
});
