//! What one request carries through `coord serve`: its WASI and HTTP state,
//! its log line, its hold on a pool slot, how it failed, and the refusal of
//! outgoing requests.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;
use wasmtime_wasi_http::{
    Error as HttpError, WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks, WasiHttpView,
};

use super::metrics::ServeMetrics;
use coord_host::HostState;

/// What a request's log line says, gathered as it runs.
#[derive(Clone)]
pub(super) struct RequestLog {
    pub(super) method: String,
    pub(super) path: String,
    pub(super) arrived: std::time::Instant,
    /// The response's status, once known (0 before).
    pub(super) status: Arc<std::sync::atomic::AtomicU16>,
}

impl RequestLog {
    /// One line per request: method, path, status, duration, store calls,
    /// and how long the request waited for its instance.
    pub(super) fn write(&self, store_calls: u64, instance_wait: Option<Duration>) {
        let status = self.status.load(Ordering::Relaxed);
        let duration_us = self.arrived.elapsed().as_micros();
        let instance_wait_us = instance_wait.map_or(0, |w| w.as_micros());
        if status >= 500 {
            tracing::warn!(target: "coord::request", method = %self.method, path = %self.path,
                status, duration_us, store_calls, instance_wait_us);
        } else {
            tracing::info!(target: "coord::request", method = %self.method, path = %self.path,
                status, duration_us, store_calls, instance_wait_us);
        }
    }
}

/// Counts an instance as in use while it lives.
pub(super) struct InUse(Arc<ServeMetrics>);

impl InUse {
    pub(super) fn new(metrics: &Arc<ServeMetrics>) -> InUse {
        metrics.instances_in_use.inc();
        InUse(metrics.clone())
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        self.0.instances_in_use.dec();
    }
}

/// Why a request got no response from the function.
pub(super) struct Failure {
    pub(super) status: u16,
    pub(super) message: String,
    /// The field at fault: `runtime`, or `body` for the client's own.
    pub(super) field: &'static str,
}

impl Failure {
    pub(super) fn internal(message: impl std::fmt::Display) -> Failure {
        Failure {
            status: 500,
            message: message.to_string(),
            field: "runtime",
        }
    }

    /// The function ran past the request's deadline without responding.
    pub(super) fn deadline(deadline: Duration) -> Failure {
        Failure {
            status: 504,
            message: format!(
                "the function did not respond within the {} ms deadline",
                deadline.as_millis()
            ),
            field: "runtime",
        }
    }

    /// The server shut down, past its grace, before the function responded.
    pub(super) fn shut_down() -> Failure {
        Failure {
            status: 503,
            message: "the server shut down before the function responded".into(),
            field: "runtime",
        }
    }

    pub(super) fn no_instance(error: wasmtime::Error) -> Failure {
        Failure {
            status: 503,
            message: format!("no instance available: {error}"),
            field: "runtime",
        }
    }

    /// The client's request could not be read (too slow, too large); the
    /// connection is closed after the reply.
    pub(super) fn client(status: u16, message: String) -> Failure {
        Failure {
            status,
            message,
            field: "body",
        }
    }

    pub(super) fn into_response(self) -> hyper::Response<HyperOutgoingBody> {
        let body = serde_json::json!({ "error": self.message, "field": self.field }).to_string();
        let body = Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed_unsync();
        let mut response = hyper::Response::new(body);
        *response.status_mut() = hyper::StatusCode::from_u16(self.status)
            .unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/json"),
        );
        if self.field == "body" {
            // What is left of a body that was not read is not a request.
            response.headers_mut().insert(
                hyper::header::CONNECTION,
                hyper::header::HeaderValue::from_static("close"),
            );
        }
        response
    }
}

/// Per-request state: coord's store for the component, WASI and `wasi:http`
/// for the function.
pub struct RequestState {
    pub(super) host: HostState,
    pub(super) wasi: WasiCtx,
    pub(super) http: WasiHttpCtx,
    pub(super) table: ResourceTable,
    pub(super) hooks: NoOutgoingRequests,
}

impl WasiView for RequestState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for RequestState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

/// Functions served here make no outgoing requests: they coordinate through
/// coord, and `wasi:http/outgoing-handler` answers `HTTP request denied`.
pub(super) struct NoOutgoingRequests;

/// The future `send_request` returns.
type SendFuture = Box<
    dyn std::future::Future<
            Output = Result<
                (
                    hyper::Response<wasmtime_wasi_http::WasiBody>,
                    Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send>,
                ),
                HttpError,
            >,
        > + Send,
>;

impl WasiHttpHooks for NoOutgoingRequests {
    fn send_request(
        &mut self,
        _request: hyper::Request<wasmtime_wasi_http::WasiBody>,
        _options: Option<wasmtime_wasi_http::RequestOptions>,
        _response_done: Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send>,
    ) -> SendFuture {
        Box::new(async { Err(HttpError::HttpRequestDenied) })
    }
}
