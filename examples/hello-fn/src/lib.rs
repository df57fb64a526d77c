//! The smallest `wasi:http` function: every request gets 200 and `hello`
//! (but `/trap`, which traps).
//!
//! It imports nothing of coord's, so any `wasi:http` runtime runs it as it
//! is. `examples/hello-fn/load.sh` serves it from `coord serve` and from
//! `wasmtime serve` under the same `wrk` load, so the two runtimes are
//! compared on the same function (BENCHMARKS.md, "Edge runtime over HTTP").

// Natively (for `cargo test` and clippy) the handler is not exported: export
// names such as `wasi:http/incoming-handler@0.2.12#handle` only link in wasm.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

/// Allocations come from a region in the memory the instance starts with,
/// as coord's and the inventory function's do: a request never grows its
/// memory, so neither runtime pays an `mprotect` per request, and a slot
/// is reset in place when the next request reuses it.
#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOCATOR: coord_region::Region<{ 64 * 1024 }> = coord_region::Region::new();

/// The body every request gets.
pub const BODY: &[u8] = b"hello";

/// The one path that gets no response: the function traps before it sets
/// one (the runtime's tests use it to show a trapping function costs a 500,
/// not a hung request or a lost instance).
pub const TRAP_PATH: &str = "/trap";

/// The function's `wasi:http/incoming-handler` export.
struct Function;

#[cfg(target_arch = "wasm32")]
impl wasip2::exports::http::incoming_handler::Guest for Function {
    fn handle(
        request: wasip2::http::types::IncomingRequest,
        out: wasip2::http::types::ResponseOutparam,
    ) {
        use wasip2::http::types::{Fields, OutgoingBody, OutgoingResponse, ResponseOutparam};
        if request.path_with_query().as_deref() == Some(TRAP_PATH) {
            // Fail before responding, as a function with a bug does.
            core::arch::wasm32::unreachable();
        }
        // A known length: no chunked encoding for either runtime.
        let length = [("content-length".to_string(), b"5".to_vec())];
        let headers = Fields::from_list(&length).unwrap_or_else(|_| Fields::new());
        let response = OutgoingResponse::new(headers);
        let Ok(body) = response.body() else {
            return;
        };
        ResponseOutparam::set(out, Ok(response));
        if let Ok(stream) = body.write() {
            // Five bytes fit any stream's first write.
            let _ = stream.blocking_write_and_flush(BODY);
        }
        let _ = OutgoingBody::finish(body, None);
    }
}

#[cfg(target_arch = "wasm32")]
wasip2::http::proxy::export!(Function);
