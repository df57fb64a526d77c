//! What `coord serve` counts, in Prometheus' registry: requests by route
//! class and status, their latency, store calls and errors by operation,
//! lock and semaphore permit outcomes, waits on the store (how many wait
//! now and how long each waited), instances in use and pool rejections.
//!
//! Store calls are counted by [`MeteredBackend`], a backend wrapper; lock
//! outcomes are read off the store calls on lock partitions (an applied
//! create is an acquisition, a failed one busy, a failed touch a lost lock,
//! a create or a touch the store failed unavailable). Only the calls that
//! decide an outcome count: the read and the delete with which a failed
//! acquire takes back what it may have written are that acquire's clean-up,
//! not outcomes of their own (they once made one failed acquire count as two
//! `unavailable`); their errors are in the store errors.
//!
//! `/metrics` is encoded in the format the scraper asks for
//! ([`Format::negotiate`]): OpenMetrics text when its `Accept` header names
//! `application/openmetrics-text`, else Prometheus' text format 0.0.4, as
//! Prometheus' own client libraries do.

use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use coord_host::backend::*;

/// At most this many route classes are told apart; the rest are `other`,
/// so a client cannot grow the metrics by inventing paths.
const MAX_ROUTE_CLASSES: usize = 32;

/// A request's labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The method, upper case.
    pub method: String,
    /// The first path segment (`items`, `exports`), or `other`.
    pub route: String,
    /// The response's status code.
    pub status: u16,
}

/// A route class's label, for the latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// The first path segment, or `other`.
    pub route: String,
}

/// A store call's labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreLabels {
    /// The store operation (`get`, `put`, …).
    pub operation: &'static str,
    /// The backend (`memory`, `redis`).
    pub backend: &'static str,
}

/// What a store wait waits for: a `lock`, a `semaphore` place, or `other`
/// (an ephemeral watch, a lease).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WaitLabels {
    /// `lock`, `semaphore` or `other`, from the partition waited on.
    pub kind: &'static str,
}

/// A lock outcome's label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `acquired`, `busy`, `lost` or `unavailable`.
    pub outcome: &'static str,
}

/// An exposition format of `/metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics text 1.0.0: a counter's family is named without
    /// `_total` (`# TYPE coord_requests counter`), its samples with it, and
    /// the text ends with `# EOF`.
    OpenMetrics,
    /// Prometheus' text format 0.0.4: the family carries the sample's name
    /// (`# TYPE coord_requests_total counter`). A 0.0.4 parser given
    /// OpenMetrics text sees a counter without samples and an untyped
    /// `_total` metric beside it.
    Prometheus,
}

impl Format {
    /// The format for a request's `Accept` header, as Prometheus' client
    /// libraries choose: the acceptable media ranges by falling quality
    /// (`q`, 1 by default; 0 is refused), the first that is
    /// `application/openmetrics-text` (version 1.0.0 or none) or
    /// `text/plain`; without one (no header, `*/*`, anything else) the text
    /// format 0.0.4, which every Prometheus reads.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let mut offers: Vec<(f32, Format)> = Vec::new();
        for range in accept.unwrap_or("").split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let mut quality = 1.0f32;
            let mut version = None;
            for parameter in parts {
                let Some((name, value)) = parameter.split_once('=') else {
                    continue;
                };
                let value = value.trim().trim_matches('"');
                match name.trim().to_ascii_lowercase().as_str() {
                    "q" => quality = value.parse().unwrap_or(0.0),
                    "version" => version = Some(value.to_string()),
                    _ => {}
                }
            }
            let format = match media.as_str() {
                "application/openmetrics-text"
                    if version.as_deref().is_none_or(|v| v == "1.0.0") =>
                {
                    Format::OpenMetrics
                }
                "text/plain" => Format::Prometheus,
                _ => continue,
            };
            if quality > 0.0 {
                offers.push((quality, format));
            }
        }
        // Stable: of equal quality, the first named wins.
        offers.sort_by(|a, b| b.0.total_cmp(&a.0));
        offers
            .first()
            .map_or(Format::Prometheus, |(_, format)| *format)
    }

    /// The `Content-Type` of a reply in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        }
    }
}

/// Every metric `coord serve` keeps, and the registry that encodes them.
pub struct ServeMetrics {
    registry: Registry,
    /// Requests answered, by method, route class and status.
    pub requests: Family<RequestLabels, Counter>,
    /// Request latency in seconds, by route class.
    pub latency: Family<RouteLabels, Histogram>,
    /// Store calls, by operation and backend.
    pub store_calls: Family<StoreLabels, Counter>,
    /// Store calls that failed, by operation and backend.
    pub store_errors: Family<StoreLabels, Counter>,
    /// Lock outcomes, as the store calls on lock partitions show them.
    pub lock_outcomes: Family<OutcomeLabels, Counter>,
    /// Semaphore permit outcomes, read off the store calls on semaphore
    /// partitions as the lock's are.
    pub permit_outcomes: Family<OutcomeLabels, Counter>,
    /// Store waits in progress, by what they wait for: with many requests
    /// waiting on one lock, how many there are now.
    pub waiting: Family<WaitLabels, Gauge>,
    /// How long each store wait lasted, in seconds, by what it waited for,
    /// whether it ended by a change, its timeout or its request being cut.
    pub wait_duration: Family<WaitLabels, Histogram>,
    /// Instances running a request now.
    pub instances_in_use: Gauge<i64, std::sync::atomic::AtomicI64>,
    /// Requests refused because every instance was in use.
    pub pool_rejections: Counter<u64, AtomicU64>,
    /// Connections closed as soon as accepted, because the most allowed
    /// (`--max-connections`, or 64 on the `--admin` listener) were open.
    pub connections_refused: Counter<u64, AtomicU64>,
    /// Configuration warnings the store reports (listed by `/readyz`), as
    /// of the last scrape.
    pub store_warnings: Gauge<i64, std::sync::atomic::AtomicI64>,
    routes: Mutex<HashSet<String>>,
}

impl Default for ServeMetrics {
    fn default() -> Self {
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<RouteLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.000_1, 2.0, 18))) as fn() -> Histogram,
        );
        let store_calls = Family::<StoreLabels, Counter>::default();
        let store_errors = Family::<StoreLabels, Counter>::default();
        let lock_outcomes = Family::<OutcomeLabels, Counter>::default();
        let permit_outcomes = Family::<OutcomeLabels, Counter>::default();
        let waiting = Family::<WaitLabels, Gauge>::default();
        let wait_duration = Family::<WaitLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.000_1, 2.0, 20))) as fn() -> Histogram,
        );
        let instances_in_use = Gauge::default();
        let pool_rejections = Counter::default();
        let connections_refused = Counter::default();
        let store_warnings = Gauge::default();
        let mut registry = Registry::with_prefix("coord");
        registry.register("requests", "Requests answered", requests.clone());
        registry.register(
            "request_duration_seconds",
            "Time from a request's arrival to its response",
            latency.clone(),
        );
        registry.register("store_calls", "Store calls", store_calls.clone());
        registry.register(
            "store_errors",
            "Store calls that failed",
            store_errors.clone(),
        );
        registry.register(
            "lock_outcomes",
            "Lock acquisitions, busy answers, lost locks, and acquire attempts and extends the store failed",
            lock_outcomes.clone(),
        );
        registry.register(
            "permit_outcomes",
            "Semaphore permits acquired, busy answers (every place taken), lost permits, and acquire attempts and extends the store failed",
            permit_outcomes.clone(),
        );
        registry.register(
            "waiting",
            "Store waits in progress (requests waiting for a lock, a semaphore place, a read-write lock grant or a change), by what they wait for",
            waiting.clone(),
        );
        registry.register(
            "wait_duration_seconds",
            "How long each store wait lasted, by what it waited for, however it ended",
            wait_duration.clone(),
        );
        registry.register(
            "instances_in_use",
            "Instances running a request now",
            instances_in_use.clone(),
        );
        registry.register(
            "pool_rejections",
            "Requests refused with every instance in use",
            pool_rejections.clone(),
        );
        registry.register(
            "connections_refused",
            "Connections closed as soon as accepted, with the most allowed open (--max-connections; 64 on the --admin listener)",
            connections_refused.clone(),
        );
        registry.register(
            "store_warnings",
            "What is wrong with the store's configuration now, though it works (listed by /readyz): a NATS stream with fewer replicas than asked for or relied on",
            store_warnings.clone(),
        );
        ServeMetrics {
            registry,
            requests,
            latency,
            store_calls,
            store_errors,
            lock_outcomes,
            permit_outcomes,
            waiting,
            wait_duration,
            instances_in_use,
            pool_rejections,
            connections_refused,
            store_warnings,
            routes: Mutex::new(HashSet::new()),
        }
    }
}

impl ServeMetrics {
    /// The registry in `format`.
    pub fn encode(&self, format: Format) -> String {
        let mut text = String::new();
        let _ = match format {
            Format::OpenMetrics => {
                prometheus_client::encoding::text::encode(&mut text, &self.registry)
            }
            Format::Prometheus => {
                prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)
            }
        };
        text
    }

    /// The route class of `path`: its first segment, while fewer than
    /// `MAX_ROUTE_CLASSES` have been seen, else `other`.
    pub fn route_class(&self, path: &str) -> String {
        let first = path.split('/').find(|s| !s.is_empty()).unwrap_or("");
        let plain = !first.is_empty()
            && first.len() <= 32
            && first
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !plain {
            return "other".into();
        }
        let Ok(mut routes) = self.routes.lock() else {
            return "other".into();
        };
        if routes.contains(first) || routes.len() < MAX_ROUTE_CLASSES {
            routes.insert(first.to_string());
            first.to_string()
        } else {
            "other".into()
        }
    }
}

/// A backend that counts every call into [`ServeMetrics`], then passes it on.
pub struct MeteredBackend {
    inner: Arc<dyn Backend>,
    metrics: Arc<ServeMetrics>,
    backend: &'static str,
}

impl MeteredBackend {
    /// Count the calls made to `inner`, a backend of kind `backend`.
    pub fn new(inner: Arc<dyn Backend>, metrics: Arc<ServeMetrics>, backend: &'static str) -> Self {
        MeteredBackend {
            inner,
            metrics,
            backend,
        }
    }

    /// Count a call, its error, and the lock outcome `outcome` reads off
    /// it (`None` for a call that decides no outcome).
    fn count<T>(
        &self,
        operation: &'static str,
        partition: &str,
        result: &Result<T, StoreError>,
        outcome: impl FnOnce(Result<&T, &StoreError>) -> Option<&'static str>,
    ) {
        let labels = StoreLabels {
            operation,
            backend: self.backend,
        };
        self.metrics.store_calls.get_or_create(&labels).inc();
        if result.is_err() {
            self.metrics.store_errors.get_or_create(&labels).inc();
        }
        let family = if partition.starts_with("~lock:") {
            &self.metrics.lock_outcomes
        } else if partition.starts_with("~sem:") {
            &self.metrics.permit_outcomes
        } else {
            return;
        };
        if let Some(outcome) = outcome(result.as_ref()) {
            family.get_or_create(&OutcomeLabels { outcome }).inc();
        }
    }
}

/// A store wait in progress: counted in [`ServeMetrics::waiting`] while it
/// lives, its time observed when it ends. Dropped, not only finished, when
/// its request is cut (a deadline, a closed connection), so a cut waiter
/// never stays counted.
struct Waiting<'a> {
    metrics: &'a ServeMetrics,
    labels: WaitLabels,
    since: std::time::Instant,
}

impl<'a> Waiting<'a> {
    fn begin(metrics: &'a ServeMetrics, partition: &str) -> Self {
        let kind = if partition.starts_with("~lock:") {
            "lock"
        } else if partition.starts_with("~sem:") {
            "semaphore"
        } else if partition.starts_with("~rw:") {
            "rwlock"
        } else {
            "other"
        };
        let labels = WaitLabels { kind };
        metrics.waiting.get_or_create(&labels).inc();
        Waiting {
            metrics,
            labels,
            since: std::time::Instant::now(),
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.metrics.waiting.get_or_create(&self.labels).dec();
        self.metrics
            .wait_duration
            .get_or_create(&self.labels)
            .observe(self.since.elapsed().as_secs_f64());
    }
}

/// The outcome a create-if-absent (a lock's or a permit's acquire attempt)
/// shows; other writes show none.
fn attempt(
    result: Result<&WriteReply, &StoreError>,
    condition: &Condition,
) -> Option<&'static str> {
    if !matches!(
        condition,
        Condition::Absent | Condition::AbsentAndFewerThan(_)
    ) {
        return None;
    }
    Some(match result {
        Ok(WriteReply {
            outcome: Outcome::Applied(_),
            ..
        }) => "acquired",
        Ok(WriteReply {
            outcome: Outcome::Conflict(_),
            ..
        }) => "busy",
        Err(_) => "unavailable",
    })
}

/// The lock outcome a touch (an extend) shows: lost when the lock was no
/// longer this holder's.
fn extend(result: Result<&WriteReply, &StoreError>) -> Option<&'static str> {
    match result {
        Ok(reply) => matches!(reply.outcome, Outcome::Conflict(_)).then_some("lost"),
        Err(_) => Some("unavailable"),
    }
}

#[async_trait]
impl Backend for MeteredBackend {
    async fn now(&self) -> Result<Millis, StoreError> {
        let result = self.inner.now().await;
        self.count("now", "", &result, |_| None);
        result
    }
    async fn get(&self, partition: &str, key: &str) -> Result<ReadReply, StoreError> {
        let result = self.inner.get(partition, key).await;
        self.count("get", partition, &result, |_| None);
        result
    }
    async fn list(&self, partition: &str, prefix: &str) -> Result<ListReply, StoreError> {
        let result = self.inner.list(partition, prefix).await;
        self.count("list", partition, &result, |_| None);
        result
    }
    async fn put(
        &self,
        partition: &str,
        key: &str,
        value: &[u8],
        ttl_ms: Option<u64>,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        let result = self
            .inner
            .put(partition, key, value, ttl_ms, condition)
            .await;
        self.count("put", partition, &result, |r| attempt(r, condition));
        result
    }
    async fn delete(
        &self,
        partition: &str,
        key: &str,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        let result = self.inner.delete(partition, key, condition).await;
        self.count("delete", partition, &result, |_| None);
        result
    }
    async fn touch(
        &self,
        partition: &str,
        key: &str,
        ttl_ms: u64,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        let result = self.inner.touch(partition, key, ttl_ms, condition).await;
        self.count("touch", partition, &result, extend);
        result
    }
    async fn changes(
        &self,
        partition: &str,
        after: u64,
        max: u32,
    ) -> Result<ChangesReply, StoreError> {
        let result = self.inner.changes(partition, after, max).await;
        self.count("changes", partition, &result, |_| None);
        result
    }
    async fn meter(
        &self,
        partition: &str,
        key: &str,
        request: &MeterRequest,
    ) -> Result<MeterReply, StoreError> {
        let result = self.inner.meter(partition, key, request).await;
        self.count("meter", partition, &result, |_| None);
        result
    }
    async fn wait(&self, partition: &str, after: u64, timeout_ms: u64) -> Result<u64, StoreError> {
        let waiting = Waiting::begin(&self.metrics, partition);
        let result = self.inner.wait(partition, after, timeout_ms).await;
        drop(waiting);
        self.count("wait", partition, &result, |_| None);
        result
    }
    async fn wait_then_put(
        &self,
        partition: &str,
        key: &str,
        value: &[u8],
        ttl_ms: Option<u64>,
        condition: &Condition,
        after: u64,
        timeout_ms: u64,
    ) -> Result<WriteReply, StoreError> {
        let waiting = Waiting::begin(&self.metrics, partition);
        let result = self
            .inner
            .wait_then_put(partition, key, value, ttl_ms, condition, after, timeout_ms)
            .await;
        drop(waiting);
        self.count("wait-then-put", partition, &result, |r| {
            attempt(r, condition)
        });
        result
    }
}

#[cfg(test)]
mod tests {
    use super::Format;

    #[test]
    fn the_format_is_negotiated_as_prometheus_clients_do() {
        let negotiate = |accept| Format::negotiate(Some(accept));
        assert_eq!(Format::negotiate(None), Format::Prometheus);
        assert_eq!(negotiate(""), Format::Prometheus);
        assert_eq!(
            negotiate("Application/OpenMetrics-Text; Version=\"1.0.0\""),
            Format::OpenMetrics
        );
        // A quality that is not a number is no quality.
        assert_eq!(
            negotiate("application/openmetrics-text;q=x"),
            Format::Prometheus
        );
        // Only the OpenMetrics version encoded here.
        assert_eq!(
            negotiate("application/openmetrics-text;version=0.0.1"),
            Format::Prometheus
        );
        // Of equal quality, the first named.
        assert_eq!(
            negotiate("text/plain, application/openmetrics-text"),
            Format::Prometheus
        );
        assert_eq!(
            negotiate("application/openmetrics-text, text/plain"),
            Format::OpenMetrics
        );
        assert_eq!(
            negotiate("text/plain;q=0.3, application/openmetrics-text;q=0.31"),
            Format::OpenMetrics
        );
    }
}
