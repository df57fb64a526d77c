//! `coord serve`: a small edge runtime. It runs a `wasi:http` function — one
//! fresh instance per request, from a pre-linked `InstancePre` on the pooling
//! allocator — and supplies `coord:sync/store` from a [`Backend`], so every
//! instance (and every `coord serve` process on the same Redis) shares the
//! same locks, presence and limits.
//!
//! A function that imports coord's interfaces is composed with the embedded
//! coord component first ([`crate::compose::plug`]); one already composed
//! runs as it is.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use tokio::net::TcpListener;
use wasmtime::component::{Component, HasData, Linker, ResourceTable};
use wasmtime::error::Context as _;
use wasmtime::{Config, Engine, Store};
use wasmtime_wasi::WasiCtx;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::p2::bindings::ProxyPre;
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;
use wasmtime_wasi_http::{Error as HttpError, WasiHttpCtx, WasiHttpView};

use coord_host::HostState;
use coord_host::backend::Backend;
use coord_host::backend::turns::Turns;

pub mod admin;
pub mod compose;
pub mod connecting;
pub mod footprint;
pub mod limits;
pub mod metrics;
mod request;

use footprint::Footprint;
use limits::{Allowance, Taken};
use metrics::{MeteredBackend, RequestLabels, RouteLabels, ServeMetrics};
pub use request::RequestState;
use request::{Failure, InUse, NoOutgoingRequests, RequestLog};

/// How many requests may run at once by default; one more gets a 503.
pub const MAX_CONCURRENT_REQUESTS: u32 = 500;

/// A request's deadline by default: this long after the request arrived its
/// handler is stopped, whether it is running wasm (the engine's epoch
/// interrupts it) or waiting in a host call (a store `wait`, a clock), and
/// its instance freed; the client gets 504 if no response was sent yet. A
/// function that loops or waits forever must not hold its slot forever.
/// Reading the request counts against it.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(60);

/// How long a client may take to send a request's headers, and then its
/// body, by default. A client slower than this gets 408 (headers: the
/// connection is closed) and holds nothing: the body is read whole before
/// the request takes an instance, so slow clients never starve fast ones.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest request body accepted; a larger one gets 413.
pub const MAX_BODY_BYTES: usize = 2 << 20;

/// The most a connection's read buffer holds (hyper's default is about
/// 400 KiB): request headers larger than this are refused with 431, and a
/// client sending its headers slowly holds no more than this meanwhile.
pub(crate) const READ_BUFFER_BYTES: usize = 64 << 10;

/// How often the engine's epoch advances; the deadline's resolution.
const EPOCH_TICK: Duration = Duration::from_millis(10);

/// A compiled, pre-linked edge function over one store backend.
pub struct Server {
    pre: ProxyPre<RequestState>,
    /// The store, behind the metrics' counting wrapper.
    backend: Arc<dyn Backend>,
    /// The store as given, for the admin listener's readiness check.
    store: Arc<dyn Backend>,
    composed: bool,
    read_timeout: Duration,
    deadline: Duration,
    /// Connections open now, and how many may be.
    connections: Arc<Allowance>,
    /// Bytes of request bodies held now, and how many may be.
    buffered: Arc<Allowance>,
    metrics: Arc<ServeMetrics>,
    /// Set when a shutdown's grace has passed: every handler still running
    /// is cut, and gives back what it holds.
    cut: tokio::sync::watch::Sender<bool>,
    /// The handlers running now, and a signal each time one ends.
    running: Arc<(std::sync::atomic::AtomicUsize, tokio::sync::Notify)>,
}

/// How long a shutdown waits, after its grace, for the handlers it cut to
/// give back their locks and leases (a few store round trips each).
const GIVE_BACK_WAIT: Duration = Duration::from_secs(5);

impl Server {
    /// Compile `function` (composing it with coord first if it imports
    /// coord's interfaces) and link it to `backend`, WASI and `wasi:http`.
    /// Must be called inside a Tokio runtime (it starts the epoch ticker).
    pub fn new(function: &[u8], backend: Arc<dyn Backend>) -> wasmtime::Result<Server> {
        Server::with_capacity(function, backend, MAX_CONCURRENT_REQUESTS)
    }

    /// [`Server::new`] with room for `max_requests` requests at once (each
    /// holds one instance while it runs); one more is answered 503.
    pub fn with_capacity(
        function: &[u8],
        backend: Arc<dyn Backend>,
        max_requests: u32,
    ) -> wasmtime::Result<Server> {
        Server::with_cache(function, backend, max_requests, None)
    }

    /// [`Server::with_capacity`], keeping what it compiles in `cache_dir`
    /// (wasmtime's cache: each compiled module under a hash of its code, the
    /// compiler and its settings) so that the next start with the same
    /// function and engine loads it instead of compiling it again.
    pub fn with_cache(
        function: &[u8],
        backend: Arc<dyn Backend>,
        max_requests: u32,
        cache_dir: Option<&std::path::Path>,
    ) -> wasmtime::Result<Server> {
        // Composed or not is read from the bytes, so the function is
        // compiled once (a Python function takes minutes in a debug build).
        let composed = compose::imports_coord(function)?;
        let composition;
        let bytes = if composed {
            composition = compose::plug(function, coord_host::COMPONENT)?;
            &composition[..]
        } else {
            function
        };
        let footprint = Footprint::of(bytes)?;
        footprint.check()?;
        tracing::info!(
            core_instances = footprint.core_instances,
            adapter_instances = footprint.adapter_instances,
            memories = footprint.memories,
            tables = footprint.tables,
            max_requests,
            "instance pool sized for the function"
        );
        let mut config = engine_config(max_requests, &footprint);
        let cache = cache_dir.and_then(|dir| {
            let mut settings = wasmtime::CacheConfig::new();
            settings.with_directory(dir);
            // A cache that cannot be made (a read-only home, say) costs a
            // compile per start, not the start.
            wasmtime::Cache::new(settings)
                .inspect_err(|e| {
                    tracing::warn!(directory = %dir.display(), "no compile cache: {e:#}");
                })
                .ok()
        });
        config.cache(cache.clone());
        let engine = Engine::new(&config).with_context(|| {
            format!(
                "making an instance pool for {max_requests} requests of {} core instances \
                 (and at most {} adapters), {} memories and {} tables each \
                 (fewer --max-requests need less)",
                footprint.core_instances,
                footprint.adapter_instances,
                footprint.memories,
                footprint.tables
            )
        })?;
        let what = if composed {
            "compiling the composed function"
        } else {
            "compiling the function"
        };
        let component = Component::new(&engine, bytes).context(what)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
        coord_host::bindings::coord::sync::store::add_to_linker::<_, CoordStore>(
            &mut linker,
            |state: &mut RequestState| &mut state.host,
        )?;
        let pre = ProxyPre::new(linker.instantiate_pre(&component)?)
            .context("the function must export wasi:http/incoming-handler")?;
        if let Some(cache) = &cache {
            tracing::info!(
                directory = %cache.directory().display(),
                modules_loaded = cache.cache_hits(),
                modules_compiled = cache.cache_misses(),
                "compile cache"
            );
        }
        start_epoch_ticker(&engine);
        let metrics = Arc::new(ServeMetrics::default());
        // The requests' lock waiters take turns: a release wakes one.
        let metered = Arc::new(MeteredBackend::new(
            Arc::new(Turns::new(backend.clone())),
            metrics.clone(),
            backend.kind(),
        ));
        Ok(Server {
            pre,
            backend: metered,
            store: backend,
            composed,
            read_timeout: READ_TIMEOUT,
            deadline: REQUEST_DEADLINE,
            connections: Allowance::new(limits::MAX_CONNECTIONS),
            buffered: Allowance::new(limits::MAX_BUFFERED_BYTES),
            metrics,
            cut: tokio::sync::watch::channel(false).0,
            running: Arc::default(),
        })
    }

    /// What this server counts (served by [`admin::serve`]).
    pub fn metrics(&self) -> &Arc<ServeMetrics> {
        &self.metrics
    }

    /// The store this server was given (not the counting wrapper).
    pub fn store(&self) -> &Arc<dyn Backend> {
        &self.store
    }

    /// This server with `timeout` for reading a request's headers, and
    /// again for its body, instead of [`READ_TIMEOUT`].
    pub fn with_read_timeout(mut self, timeout: Duration) -> Server {
        self.read_timeout = timeout;
        self
    }

    /// This server with `deadline` for each request, from its arrival,
    /// instead of [`REQUEST_DEADLINE`].
    pub fn with_deadline(mut self, deadline: Duration) -> Server {
        self.deadline = deadline;
        self
    }

    /// This server with at most `connections` open at once, instead of
    /// [`limits::MAX_CONNECTIONS`]; one more is closed as soon as it is
    /// accepted.
    pub fn with_max_connections(mut self, connections: usize) -> Server {
        self.connections = Allowance::new(connections);
        self
    }

    /// This server holding at most `bytes` of request bodies at once,
    /// instead of [`limits::MAX_BUFFERED_BYTES`]; a request whose body
    /// would pass it gets 503.
    pub fn with_max_buffered_bytes(mut self, bytes: usize) -> Server {
        self.buffered = Allowance::new(bytes);
        self
    }

    /// Whether the function given to [`Server::new`] was composed with coord.
    pub fn composed(&self) -> bool {
        self.composed
    }

    /// Accept connections on `listener` and serve them until the task is
    /// dropped. HTTP/1.1 with keep-alive.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) -> std::io::Result<()> {
        self.serve_until(listener, std::future::pending(), Duration::ZERO)
            .await
    }

    /// [`Server::serve`] until `shutdown` resolves; then stop accepting, let
    /// the requests already running finish (keep-alive connections close
    /// after their current request) for up to `grace`, and return.
    pub async fn serve_until(
        self: Arc<Self>,
        listener: TcpListener,
        shutdown: impl std::future::Future<Output = ()>,
        grace: Duration,
    ) -> std::io::Result<()> {
        let connections = hyper_util::server::graceful::GracefulShutdown::new();
        tokio::pin!(shutdown);
        loop {
            let client = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((client, _)) => client,
                    // Out of file descriptors (many clients at once) is a
                    // moment, not the end of the server: the timeouts free them.
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                },
                () = &mut shutdown => break,
            };
            // Past the bound, closed at once: each open connection may hold
            // a read buffer, and a body, for the whole read timeout.
            let mut slot = Taken::none(&self.connections);
            if !slot.more(1) {
                self.metrics.connections_refused.inc();
                drop(client);
                continue;
            }
            // Small replies must not wait for Nagle's algorithm.
            let _ = client.set_nodelay(true);
            let server = self.clone();
            let service = hyper::service::service_fn(move |request| {
                let server = server.clone();
                async move { Ok::<_, std::convert::Infallible>(server.handle(request).await) }
            });
            let connection = http1::Builder::new()
                .keep_alive(true)
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(self.read_timeout)
                .max_buf_size(READ_BUFFER_BYTES)
                .max_header_size(READ_BUFFER_BYTES)
                .serve_connection(TokioIo::new(client), service);
            let connection = connections.watch(connection);
            // A client that hangs up mid-request is not the server's error.
            tokio::spawn(async move {
                let _ = connection.await;
                drop(slot);
            });
        }
        drop(listener);
        if tokio::time::timeout(grace, connections.shutdown())
            .await
            .is_err()
        {
            // Past the grace: cut what still runs, and let each handler give
            // back the locks and leases it took before the process ends
            // (else they outlived it by their whole TTL).
            self.cut.send_replace(true);
            let (count, ended) = &*self.running;
            let _ = tokio::time::timeout(GIVE_BACK_WAIT, async {
                loop {
                    let notified = ended.notified();
                    if count.load(Ordering::Acquire) == 0 {
                        break;
                    }
                    notified.await;
                }
            })
            .await;
        }
        // Releases and take-backs that failed and are being retried get
        // their chance before the process (and its runtime) ends.
        let left = coord_host::holdings::finish_background(GIVE_BACK_WAIT).await;
        if left > 0 {
            tracing::warn!(
                target: "coord::serve",
                "stopping with {left} release(s) still failing: left to their TTLs"
            );
        }
        Ok(())
    }

    /// Run one request in a fresh instance of the function. Failures of the
    /// runtime (no free instance, a trap) become 503 or 500 replies.
    pub async fn handle(
        &self,
        request: hyper::Request<Incoming>,
    ) -> hyper::Response<HyperOutgoingBody> {
        let arrived = std::time::Instant::now();
        let log = RequestLog {
            method: request.method().to_string(),
            path: request.uri().path().to_string(),
            arrived,
            status: Arc::new(std::sync::atomic::AtomicU16::new(0)),
        };
        let response = match self.run(request, arrived, log.clone()).await {
            Ok(response) => response,
            Err(failure) => {
                let response = failure.into_response();
                // No handler ran: the line is written here.
                log.status
                    .store(response.status().as_u16(), Ordering::Relaxed);
                log.write(0, None);
                response
            }
        };
        let status = response.status().as_u16();
        log.status.store(status, Ordering::Relaxed);
        let route = self.metrics.route_class(&log.path);
        self.metrics
            .requests
            .get_or_create(&RequestLabels {
                method: log.method.clone(),
                route: route.clone(),
                status,
            })
            .inc();
        self.metrics
            .latency
            .get_or_create(&RouteLabels { route })
            .observe(arrived.elapsed().as_secs_f64());
        response
    }

    /// Read the body whole, within the read timeout, the size limit and
    /// the bytes all bodies may hold at once, before the request may take
    /// an instance. The body's bytes count against that bound until the
    /// returned [`Taken`] is dropped.
    async fn read_whole(
        &self,
        request: hyper::Request<Incoming>,
    ) -> Result<(hyper::Request<Full<Bytes>>, Taken), Failure> {
        let (parts, mut body) = request.into_parts();
        let too_large = || Failure::client(413, format!("larger than {MAX_BODY_BYTES} bytes"));
        if hyper::body::Body::size_hint(&body)
            .exact()
            .is_some_and(|declared| declared > MAX_BODY_BYTES as u64)
        {
            return Err(too_large());
        }
        let mut held = Taken::none(&self.buffered);
        let reading = async {
            let mut whole = Vec::new();
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| Failure::client(400, format!("unreadable: {e}")))?;
                let Ok(data) = frame.into_data() else {
                    continue; // trailers: nothing a function reads
                };
                if whole.len() + data.len() > MAX_BODY_BYTES {
                    return Err(too_large());
                }
                if !held.more(data.len()) {
                    return Err(Failure::client(
                        503,
                        format!(
                            "the server holds {} bytes of request bodies at most, and other \
                             requests hold them now: try again shortly",
                            self.buffered.limit()
                        ),
                    ));
                }
                whole.extend_from_slice(&data);
            }
            Ok(whole)
        };
        match tokio::time::timeout(self.read_timeout, reading).await {
            Err(_) => Err(Failure::client(
                408,
                format!(
                    "the body did not arrive within {} ms",
                    self.read_timeout.as_millis()
                ),
            )),
            Ok(Err(failure)) => Err(failure),
            Ok(Ok(whole)) => Ok((
                hyper::Request::from_parts(parts, Full::new(Bytes::from(whole))),
                held,
            )),
        }
    }

    async fn run(
        &self,
        request: hyper::Request<Incoming>,
        arrived: std::time::Instant,
        log: RequestLog,
    ) -> Result<hyper::Response<HyperOutgoingBody>, Failure> {
        let (request, _body_held) = self.read_whole(request).await?;
        let mut store = Store::new(
            self.pre.engine(),
            RequestState {
                host: HostState::keeping_holdings(self.backend.clone()),
                wasi: WasiCtx::builder().build(),
                http: WasiHttpCtx::new(),
                table: ResourceTable::new(),
                hooks: NoOutgoingRequests,
            },
        );
        let left = self.deadline.saturating_sub(arrived.elapsed());
        let ticks = left.as_millis() / EPOCH_TICK.as_millis();
        store.set_epoch_deadline(u64::try_from(ticks).unwrap_or(u64::MAX));
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let incoming = store
            .data_mut()
            .http()
            .new_incoming_request(
                Scheme::Http,
                request.map(|body| body.map_err(|never| -> HttpError { match never {} })),
            )
            .map_err(Failure::internal)?;
        let outparam = store
            .data_mut()
            .http()
            .new_response_outparam(sender)
            .map_err(Failure::internal)?;
        let waiting = std::time::Instant::now();
        let proxy = match self.pre.instantiate_async(&mut store).await {
            Ok(proxy) => proxy,
            Err(error) => {
                self.metrics.pool_rejections.inc();
                return Err(Failure::no_instance(error));
            }
        };
        let instance_wait = waiting.elapsed();
        let in_use = InUse::new(&self.metrics);
        // The handler runs on its own task: it may go on streaming the body
        // after it has set the response. Its log line is written when it ends.
        let (status_known, status) = tokio::sync::oneshot::channel::<u16>();
        // How the handler ended, sent before anything it left is given
        // back: the client's answer never waits for the store.
        let (ended, handler_ended) = tokio::sync::oneshot::channel::<wasmtime::Result<()>>();
        let mut cut = self.cut.subscribe();
        let running = Running::start(&self.running);
        let task = async move {
            let handle = proxy
                .wasi_http_incoming_handler()
                .call_handle(&mut store, incoming, outparam);
            // The epoch stops wasm at the deadline; this stops a handler
            // waiting in a host call, reported as the same interrupt; and a
            // shutdown past its grace cuts it the same way.
            let handled = tokio::select! {
                handled = handle => handled,
                () = tokio::time::sleep(left) => Err(wasmtime::Trap::Interrupt.into()),
                _ = cut.wait_for(|cut| *cut) => Err(wasmtime::Error::new(ShutDown)),
            };
            drop(in_use);
            let store_calls = store.data().host.store_calls();
            let left_behind = match handled {
                Ok(()) => None,
                Err(_) => store.data_mut().host.take_holdings(),
            };
            let backend = store.data().host.store().clone();
            // Free the instance now, and with it the response sender its
            // table holds: a handler that trapped before responding leaves
            // the sender there, and the request would wait for it.
            drop(store);
            let _ = ended.send(handled);
            if let Some(holdings) = left_behind
                && !holdings.is_empty()
            {
                // The runtime ended this request, not the function: what
                // its instance took it never answered with. Give it back,
                // each write guarded by the holding's revision and value,
                // after the client was answered (a stalled store must not
                // hold the answer past the deadline).
                let given = holdings.give_back(&backend).await;
                tracing::info!(
                    target: "coord::serve",
                    "a request cut short gave back {given} lock(s) and lease(s)"
                );
            }
            drop(running);
            // A response was sent: its line, with every store call the
            // handler made. (Without one, `handle` writes the line.)
            if let Ok(code) = status.await {
                log.status.store(code, Ordering::Relaxed);
                log.write(store_calls, Some(instance_wait));
            }
        };
        tokio::spawn(task);
        let (mut receiver, mut handler_ended) = (receiver, handler_ended);
        let received = tokio::select! {
            biased;
            received = &mut receiver => received,
            // The handler ended; a response it set before is waiting.
            handled = &mut handler_ended => match receiver.try_recv() {
                Ok(set) => Ok(set),
                Err(_) => return Err(self.failure(handled)),
            },
        };
        if let Ok(Ok(response)) = &received {
            let _ = status_known.send(response.status().as_u16());
        } else {
            drop(status_known);
        }
        match received {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(code)) => Err(Failure::internal(format!("the function failed: {code:?}"))),
            // The sender was dropped with the instance: the handler ended
            // without a response, and says how (at once: it is sent right
            // after the instance is dropped).
            Err(_) => Err(self.failure(handler_ended.await)),
        }
    }

    /// The answer to a request whose handler ended (`handled`) without
    /// setting a response.
    fn failure(
        &self,
        handled: Result<wasmtime::Result<()>, tokio::sync::oneshot::error::RecvError>,
    ) -> Failure {
        match handled {
            Ok(Ok(())) => Failure::internal("the function never set a response"),
            Ok(Err(trap)) if trap.downcast_ref() == Some(&wasmtime::Trap::Interrupt) => {
                Failure::deadline(self.deadline)
            }
            Ok(Err(cut)) if cut.is::<ShutDown>() => Failure::shut_down(),
            Ok(Err(trap)) => {
                // The wasm backtrace is the operator's, in the log; the
                // client learns only the kind of trap.
                tracing::warn!(target: "coord::function", "the function trapped: {trap:?}");
                Failure::internal(format!("the function trapped: {}", trap.root_cause()))
            }
            Err(_) => Failure::internal("the request task ended without a word"),
        }
    }
}

/// Why a handler was cut: the server's shutdown, past its grace.
#[derive(Debug)]
struct ShutDown;

impl std::fmt::Display for ShutDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("cut by the server's shutdown")
    }
}

impl std::error::Error for ShutDown {}

/// One handler running, counted until it ends (see [`Server::serve_until`]).
struct Running(Arc<(std::sync::atomic::AtomicUsize, tokio::sync::Notify)>);

impl Running {
    fn start(running: &Arc<(std::sync::atomic::AtomicUsize, tokio::sync::Notify)>) -> Running {
        running.0.fetch_add(1, Ordering::AcqRel);
        Running(running.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::AcqRel);
        self.0.1.notify_waiters();
    }
}

/// Selects the store's host state inside [`RequestState`] for the linker.
struct CoordStore;

impl HasData for CoordStore {
    type Data<'a> = &'a mut HostState;
}

/// Pooling for `max_requests` instances of a function, each taking what
/// its footprint counts (a composed function: its own core instances,
/// memories and tables, coord's, and the adapters').
fn engine_config(max_requests: u32, footprint: &Footprint) -> Config {
    let mut config = coord_host::pooled_config(max_requests, &footprint.slot());
    config.epoch_interruption(true);
    config
}

/// Advance `engine`'s epoch every tick, for as long as the engine lives.
fn start_epoch_ticker(engine: &Engine) {
    let engine = engine.weak();
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(EPOCH_TICK);
        loop {
            ticker.tick().await;
            match engine.upgrade() {
                Some(engine) => engine.increment_epoch(),
                None => return,
            }
        }
    });
}
