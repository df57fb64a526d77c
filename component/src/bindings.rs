//! The types and functions generated from the WIT package in `wit/`.
//!
//! Generated for every target: on `wasm32` the imports call the host; on
//! other targets they are never called (the logic reaches the store only
//! through [`crate::store::Store`]), and the types serve the native build.
#![allow(missing_docs, unsafe_code, clippy::all)]

wit_bindgen::generate!({
    path: "wit",
    world: "coordinator",
    generate_all,
    pub_export_macro: true,
    additional_derives: [PartialEq, Eq],
});
