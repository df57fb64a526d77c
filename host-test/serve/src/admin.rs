//! `coord serve --admin ADDR`: a listener apart from the functions' one,
//! for the operator: `/metrics` (Prometheus' text format 0.0.4, or
//! OpenMetrics text to a scraper whose `Accept` header asks for it),
//! `/healthz` (the process is up) and `/readyz` (the store can take a write).

use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use tokio::net::TcpListener;
use wasmtime_wasi_http::io::TokioIo;

use super::READ_BUFFER_BYTES;
use super::limits::{Allowance, Taken};
use super::metrics::{Format, ServeMetrics};
use coord_host::backend::Backend;

/// How long `/readyz` waits for the store's clock before answering 503.
pub const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// Connections the admin listener keeps open at once (a scraper and a
/// probe or two need a handful); one more is closed as soon as accepted.
pub const ADMIN_CONNECTIONS: usize = 64;

/// Serve the admin routes on `listener` until the task is dropped. A
/// client that takes longer than `read_timeout` to send a request's
/// headers is disconnected, as on the functions' listener, and at most
/// [`ADMIN_CONNECTIONS`] are open at once, with headers of 64 KiB at most:
/// slow clients cannot pile up connections here either.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<ServeMetrics>,
    store: Arc<dyn Backend>,
    read_timeout: Duration,
) -> std::io::Result<()> {
    let open = Allowance::new(ADMIN_CONNECTIONS);
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let mut slot = Taken::none(&open);
        if !slot.more(1) {
            metrics.connections_refused.inc();
            continue;
        }
        let (metrics, store) = (metrics.clone(), store.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |request| {
                let (metrics, store) = (metrics.clone(), store.clone());
                async move { Ok::<_, std::convert::Infallible>(route(request, &metrics, &store).await) }
            });
            let _ = http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(read_timeout)
                .max_buf_size(READ_BUFFER_BYTES)
                .max_header_size(READ_BUFFER_BYTES)
                .serve_connection(TokioIo::new(client), service)
                .await;
        });
    }
}

async fn route(
    request: hyper::Request<Incoming>,
    metrics: &ServeMetrics,
    store: &Arc<dyn Backend>,
) -> hyper::Response<Full<Bytes>> {
    match (request.method().as_str(), request.uri().path()) {
        ("GET", "/metrics") => {
            let accept = request
                .headers()
                .get_all(hyper::header::ACCEPT)
                .iter()
                .filter_map(|value| value.to_str().ok())
                .collect::<Vec<_>>()
                .join(",");
            let format = Format::negotiate(Some(&accept));
            metrics
                .store_warnings
                .set(i64::try_from(store.warnings().len()).unwrap_or(i64::MAX));
            reply(200, format.content_type(), metrics.encode(format))
        }
        ("GET", "/healthz") => reply(200, "text/plain", "ok\n".into()),
        ("GET", "/readyz") => {
            let (status, mut body) = match tokio::time::timeout(READY_TIMEOUT, store.ready()).await
            {
                Ok(Ok(())) => (200, "ready\n".to_string()),
                Ok(Err(error)) => (503, format!("store unavailable: {error:?}\n")),
                Err(_) => (
                    503,
                    format!(
                        "the store did not answer within {} ms\n",
                        READY_TIMEOUT.as_millis()
                    ),
                ),
            };
            // Ready or not, what is wrong with the store's configuration.
            for warning in store.warnings() {
                body.push_str(&format!("warning: {warning}\n"));
            }
            reply(status, "text/plain", body)
        }
        _ => reply(
            404,
            "text/plain",
            "no such admin route: /metrics, /healthz, /readyz\n".into(),
        ),
    }
}

fn reply(status: u16, content_type: &'static str, body: String) -> hyper::Response<Full<Bytes>> {
    let mut response = hyper::Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}
