//! An edge function on `wasi:http` that coordinates through coord: the
//! inventory service of seed 000.
//!
//! It is written against coord's `client` world (`lock`, `lease`,
//! `ephemeral` and `ratelimit`, through `coord-sdk`); it uses no lease, and
//! wit-component keeps only the imports a module uses, so the component
//! imports `coord:sync/lock`, `ephemeral` and `ratelimit` (and the store). It
//! is composed with `coord.wasm` before it runs (`coord compose`, or `coord
//! serve`, which composes on the fly). Routes:
//!
//! | Route | What it does |
//! |---|---|
//! | `GET /items/{item}` | the item's stock and newest fence |
//! | `POST /items/{item}/adjust?delta=N[&wait_ms=T]` | lock, write with the fence, release |
//! | `POST /items/{item}/lock[?ttl_ms=T]` | hold the item's lock across requests (`T` ≤ 60 000); replies with the lock |
//! | `POST /items/{item}/audit[?steps=N&step_ms=S&ttl_ms=T]` | a long job under the lock (`T` ≤ 60 000), kept alive between steps |
//! | `POST /items/{item}/adjust?delta=N` + lock body | write under a lock held across requests |
//! | `POST /items/{item}/lock/extend[?ttl_ms=T]` + lock body | extend it (`T` ≤ 60 000; 409 when lost) |
//! | `DELETE /items/{item}/lock` + lock body | release it |
//! | `POST /exports` (`x-user-id`) | all stock, at most 10 per user per minute (429 + `retry-after`) |
//! | `PUT /items/{item}/editors/{session}` + JSON body | announce an editor (30 s TTL) |
//! | `POST /items/{item}/editors/{session}/touch` | renew it (404 when it expired) |
//! | `DELETE /items/{item}/editors/{session}` | leave |
//! | `GET /items/{item}/editors` | snapshot of the editors, with its revision |
//! | `GET /items/{item}/editors/watch[?after=R][&timeout_ms=T]` | long-poll the changes after `R` |
//! | `GET /catalog[?work_ms=W&wait_ms=T]` | the items, under a read grant beside other readers (409 while a rebuild holds or waits) |
//! | `POST /catalog/rebuild[?work_ms=W&wait_ms=T]` | hold the catalog alone for `W` ms (≤ 10 000), as a rebuild would |
//!
//! Fences and revisions are JSON strings: they are 64-bit and JavaScript
//! numbers are not (seed 000: "convert a fence to a string").

// Natively (for `cargo test` and clippy) the handler is not exported: export
// names such as `wasi:http/incoming-handler@0.2.12#handle` only link in wasm.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

/// A request's allocations come from a region in the memory the instance
/// starts with, as coord's do, so an instance per request never grows its
/// memory: a pooling host would answer each grow with an `mprotect`, and
/// another when it reuses the slot (`coord_region` says more).
#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOCATOR: coord_region::Region<{ 64 * 1024 }> = coord_region::Region::new();

mod catalog;
mod http;
mod inventory;
mod records;

/// Bindings to the store, this example's system of record. coord's own
/// interfaces come from `coord-sdk`, whose bindings these reuse.
mod bindings {
    wit_bindgen::generate!({
        path: ["../../wit", "wit"],
        world: "coord-example:inventory/function",
        with: {
            "coord:sync/lock@0.1.0": coord_sdk::lock,
            "coord:sync/lease@0.1.0": coord_sdk::lease,
            "coord:sync/ephemeral@0.1.0": coord_sdk::ephemeral,
            "coord:sync/ratelimit@0.1.0": coord_sdk::ratelimit,
            "coord:sync/semaphore@0.1.0": coord_sdk::semaphore,
            "coord:sync/rwlock@0.1.0": coord_sdk::rwlock,
        },
        generate_all,
    });
}

/// The function's `wasi:http/incoming-handler` export.
struct Function;

#[cfg(target_arch = "wasm32")]
impl wasip2::exports::http::incoming_handler::Guest for Function {
    fn handle(
        request: wasip2::http::types::IncomingRequest,
        out: wasip2::http::types::ResponseOutparam,
    ) {
        let reply = match http::Request::read(&request) {
            Ok(request) => inventory::route(&request),
            Err(reply) => reply,
        };
        reply.send(out);
    }
}

#[cfg(target_arch = "wasm32")]
wasip2::http::proxy::export!(Function);
