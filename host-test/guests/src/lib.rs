//! The example edge functions as components, built by this crate's build
//! script from `examples/`: what `coord serve` runs when given no function,
//! and what the benchmarks and the tests serve.

/// `examples/inventory-fn`: the inventory service on wasi:http, importing
/// coord's lock, ephemeral state and rate limits (`coord serve`'s default).
pub const INVENTORY_FUNCTION: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/inventory-fn.wasm"));

/// `examples/hello-fn`: the smallest wasi:http function, importing nothing
/// of coord (the HTTP floor).
pub const HELLO_FUNCTION: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hello-fn.wasm"));

/// Where [`HELLO_FUNCTION`] is on disk, for a `coord serve` process.
pub const HELLO_FUNCTION_PATH: &str = concat!(env!("OUT_DIR"), "/hello-fn.wasm");

/// Where [`INVENTORY_FUNCTION`] is on disk, for a `coord serve` process.
pub const INVENTORY_FUNCTION_PATH: &str = concat!(env!("OUT_DIR"), "/inventory-fn.wasm");
