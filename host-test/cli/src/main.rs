//! `coord`: the command line of the coord host.
//!
//! `coord serve` runs an edge function over HTTP (the built-in inventory
//! example by default) with the in-memory store, or Redis when asked;
//! `coord compose` writes a function composed with the coord component;
//! `coord demo` shows component instances contending for locks in one process.

mod demo;
mod demo_log;
mod inventory;
mod long_work;
mod operate;
mod store;
mod terminal;

pub use store::{StoreArgs, StoreUnreachable, Target, backend, backend_for, store_failure};

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use coord_serve::Server;
use coord_serve::connecting::Connecting;

/// coord: distributed locks, leases, ephemeral state and rate limits for
/// WebAssembly edge functions.
#[derive(Parser)]
#[command(name = "coord", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a wasi:http edge function, one instance per request.
    ///
    /// FUNCTION.wasm, else the built-in inventory example. A function that
    /// imports coord's interfaces is composed with the coord component first.
    Serve(ServeArgs),
    /// Plug the coord component into FUNCTION.wasm and write the result,
    /// which imports only the store and what the function itself imports.
    Compose {
        /// The function component to compose.
        function: String,
        /// Where to write the composed component.
        #[arg(short, long)]
        out: String,
    },
    /// Component instances contend for inventory locks, a long job keeps its
    /// lock, a lease moves between two nodes.
    Demo {
        #[command(flatten)]
        store: StoreArgs,
    },
    /// See or free a lock, as functions see it (operator commands).
    #[command(subcommand)]
    Lock(operate::LockCommand),
    /// See or follow a tenant's ephemeral entries (operator commands).
    #[command(subcommand)]
    Ephemeral(operate::EphemeralCommand),
    /// Peek at or reset a rate-limit key (operator commands).
    #[command(subcommand)]
    Limit(operate::LimitCommand),
    /// See a semaphore's permits, or free one (operator commands).
    #[command(subcommand)]
    Semaphore(operate::SemaphoreCommand),
    /// See a read-write lock's writer and readers, or free a grant
    /// (operator commands).
    #[command(subcommand)]
    Rwlock(operate::RwLockCommand),
}

#[derive(Args)]
struct ServeArgs {
    /// The wasi:http function to serve (default: the built-in inventory
    /// example).
    function: Option<String>,
    #[command(flatten)]
    store: StoreArgs,
    /// Where to listen: IP:PORT, or HOST:PORT resolved at start.
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:8080",
        env = "COORD_LISTEN",
        value_parser = socket_address
    )]
    listen: SocketAddr,
    /// Requests run at once, each in its own instance; one more is answered
    /// 503.
    #[arg(long, value_name = "N", default_value_t = coord_serve::MAX_CONCURRENT_REQUESTS,
          value_parser = clap::value_parser!(u32).range(1..), env = "COORD_MAX_REQUESTS")]
    max_requests: u32,
    /// Connections open at once; one more is closed as soon as it is
    /// accepted (counted in coord_connections_refused_total).
    #[arg(long, value_name = "N", default_value_t = coord_serve::limits::MAX_CONNECTIONS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..),
          env = "COORD_MAX_CONNECTIONS")]
    max_connections: usize,
    /// Bytes of request bodies held in memory at once, across requests
    /// (each body is at most 2 MiB); a request whose body would pass it
    /// gets 503.
    #[arg(long, value_name = "BYTES", default_value_t = coord_serve::limits::MAX_BUFFERED_BYTES,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..),
          env = "COORD_MAX_BUFFERED_BYTES")]
    max_buffered_bytes: usize,
    /// How long a client may take to send a request's headers, and then its
    /// body; a slower one gets 408 and holds no instance meanwhile. The
    /// --admin listener cuts a client as slow with its headers too.
    #[arg(long, value_name = "MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..), env = "COORD_READ_TIMEOUT_MS")]
    read_timeout_ms: u64,
    /// Each request's deadline from its arrival: a function still running
    /// (or waiting in a host call) then is stopped, its instance freed, and
    /// the client answered 504 if no response was sent yet.
    #[arg(long, value_name = "MS", default_value_t = 60_000,
          value_parser = clap::value_parser!(u64).range(1..), env = "COORD_DEADLINE_MS")]
    deadline_ms: u64,
    /// On SIGTERM or Ctrl-C: stop accepting, and let running requests finish
    /// for up to this long before exiting.
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 10_000,
        env = "COORD_GRACE_MS"
    )]
    grace_ms: u64,
    /// Serve /metrics (Prometheus), /healthz and /readyz on a listener of
    /// their own at ADDR (off by default).
    #[arg(long, value_name = "ADDR", env = "COORD_ADMIN", value_parser = socket_address)]
    admin: Option<SocketAddr>,
    /// Keep compiled functions in DIR, so that the next start with the same
    /// function loads them instead of compiling again (default:
    /// $XDG_CACHE_HOME/coord, else ~/.cache/coord).
    #[arg(long, value_name = "DIR", env = "COORD_CACHE_DIR")]
    cache_dir: Option<std::path::PathBuf>,
    /// Compile the function at every start; keep nothing on disk.
    #[arg(long, conflicts_with = "cache_dir")]
    no_cache: bool,
    /// How long to keep trying a store that does not answer at start before
    /// exiting 1 (default: for ever). Meanwhile the process listens, store
    /// calls answer 503, and /readyz says why.
    #[arg(long, value_name = "MS", env = "COORD_STORE_WAIT_MS",
          value_parser = clap::value_parser!(u64).range(1..))]
    store_wait_ms: Option<u64>,
}

impl ServeArgs {
    /// Where compiled functions are kept: --cache-dir, else the user's
    /// cache directory; none with --no-cache or without a home.
    fn cache_dir(&self) -> Option<std::path::PathBuf> {
        if self.no_cache {
            return None;
        }
        let nonempty = |name| std::env::var_os(name).filter(|v| !v.is_empty());
        let dir = self.cache_dir.clone().or_else(|| {
            nonempty("XDG_CACHE_HOME")
                .map(std::path::PathBuf::from)
                .or_else(|| nonempty("HOME").map(|home| std::path::Path::new(&home).join(".cache")))
                .map(|dir| dir.join("coord"))
        })?;
        // wasmtime's cache takes only an absolute directory (a relative one
        // was a warning and no cache): resolve it against the working one.
        std::path::absolute(&dir).ok()
    }
}

/// `--listen` and `--admin`: an IP address and port, or a host name and
/// port resolved now (its first address), so that a bad one is a usage
/// error naming the flag before the function is compiled.
fn socket_address(text: &str) -> Result<SocketAddr, String> {
    if let Ok(address) = text.parse::<SocketAddr>() {
        return Ok(address);
    }
    let expected = "expected IP:PORT or HOST:PORT, for example 127.0.0.1:8080 or [::1]:8080";
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(expected.into());
    };
    let Ok(port) = port.parse::<u16>() else {
        return Err(format!(
            "the port must be a number from 0 to 65535; {expected}"
        ));
    };
    if host.is_empty() {
        return Err(expected.into());
    }
    (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addresses| addresses.next())
        .ok_or_else(|| format!("cannot resolve the host {host:?}; {expected}"))
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // Logs go to standard error, one line per request at `info`; the level
    // comes from COORD_LOG (an env filter: `warn`, `coord::request=info`).
    let _request_log = init_logging();
    let outcome = match cli.command {
        Command::Demo { store } => demo(store.target()).await,
        Command::Serve(args) => serve(args).await,
        Command::Compose { function, out } => compose(&function, &out),
        Command::Lock(command) => operate::lock(command).await,
        Command::Ephemeral(command) => operate::ephemeral(command).await,
        Command::Limit(command) => operate::limit(command).await,
        Command::Semaphore(command) => operate::semaphore(command).await,
        Command::Rwlock(command) => operate::rwlock(command).await,
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("coord: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Log to standard error at the level COORD_LOG names (`info` by default).
/// The request log (`coord::request`, a line per request) is written by a
/// thread of its own, so a request's path only queues its line: written on
/// that path, the line cost `coord serve` about a quarter of its throughput
/// against `wasmtime serve` (issue 40). When the queue is full, requests
/// wait for it rather than lose lines. Everything else (startup, warnings,
/// errors) is written at once, so nothing said before an exit is lost.
/// Keep the returned guard until the end: dropping it writes what is queued.
fn init_logging() -> tracing_appender::non_blocking::WorkerGuard {
    use tracing_subscriber::filter::filter_fn;
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_from_env("COORD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let (requests, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .thread_name("coord-request-log")
        .finish(std::io::stderr());
    let is_request = |meta: &tracing::Metadata<'_>| meta.target() == "coord::request";
    tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(requests)
                .with_ansi(ansi)
                .with_filter(filter_fn(is_request)),
        )
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(ansi)
                .with_filter(filter_fn(move |meta| !is_request(meta))),
        )
        .init();
    guard
}

async fn demo(target: Target) -> wasmtime::Result<()> {
    let (backend, place) = backend(&target).await?;
    let inventory = match &target {
        Target::Memory => inventory::Inventory::local(),
        Target::Redis {
            url,
            cluster: false,
            ..
        } => inventory::Inventory::redis(url)
            .await
            .map_err(|e| wasmtime::format_err!("cannot use Redis at {url}: {e}"))?,
        // A cluster, NATS or a SQL store: the inventory lives in coord's own store.
        Target::Redis { cluster: true, .. }
        | Target::Nats { .. }
        | Target::Postgres { .. }
        | Target::Sqlite { .. } => inventory::Inventory::Store(backend.clone()),
    };
    demo::run(backend, inventory, &place).await
}

async fn serve(args: ServeArgs) -> wasmtime::Result<()> {
    let (bytes, name) = match &args.function {
        Some(path) => (
            std::fs::read(path).map_err(|e| wasmtime::format_err!("reading {path}: {e}"))?,
            path.clone(),
        ),
        None => (
            coord_guests::INVENTORY_FUNCTION.to_vec(),
            "the built-in inventory function".into(),
        ),
    };
    // A store that does not answer at start is tried again until it does
    // (or `--store-wait-ms` passes): meanwhile the process listens, and its
    // store calls answer `unavailable`.
    let target = args.store.target();
    let store = Arc::new(Connecting::new(target.kind()));
    let server = Arc::new(
        Server::with_cache(
            &bytes,
            store.clone(),
            args.max_requests,
            args.cache_dir().as_deref(),
        )?
        .with_read_timeout(Duration::from_millis(args.read_timeout_ms))
        .with_deadline(Duration::from_millis(args.deadline_ms))
        .with_max_connections(args.max_connections)
        .with_max_buffered_bytes(args.max_buffered_bytes),
    );
    let listen = args.listen;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| wasmtime::format_err!("cannot listen on --listen {listen}: {e}"))?;
    let address = listener.local_addr()?;
    let composed = if server.composed() {
        ", composed with coord"
    } else {
        ""
    };
    // Bound before the first line below, so the admin routes answer as
    // soon as a script has read it.
    let admin = match &args.admin {
        Some(admin) => Some(
            tokio::net::TcpListener::bind(*admin)
                .await
                .map_err(|e| wasmtime::format_err!("cannot listen on --admin {admin}: {e}"))?,
        ),
        None => None,
    };
    // The admin routes answer from here on, while the store is tried.
    let admin_address = match admin {
        Some(listener) => {
            let address = listener.local_addr()?;
            let (metrics, store) = (server.metrics().clone(), server.store().clone());
            let read_timeout = Duration::from_millis(args.read_timeout_ms);
            tokio::spawn(coord_serve::admin::serve(
                listener,
                metrics,
                store,
                read_timeout,
            ));
            Some(address)
        }
        None => None,
    };
    // The first attempt at the store before the first line, so a script
    // that reads it finds the store reached when it answers at once; a
    // store that does not answer yet is tried again in the background.
    let started = std::time::Instant::now();
    let reached = match backend(&target).await {
        Ok((backend, place)) => {
            store.connected(backend);
            Some(place)
        }
        Err(e) if e.downcast_ref::<StoreUnreachable>().is_some() => {
            store.failed(e.to_string());
            tracing::warn!(target: "coord::serve", "{e}; trying again in the background");
            None
        }
        Err(e) => return Err(e),
    };
    // Tests and scripts read this line to learn the port (with --listen ...:0).
    println!("coord serve: listening on http://{address}");
    match &reached {
        Some(place) => println!("coord serve: {name}{composed}; state in {place}"),
        None => println!("coord serve: {name}{composed}; its store is not reached yet"),
    }
    if let Some(admin) = admin_address {
        println!("coord serve: admin on http://{admin} (/metrics, /healthz, /readyz)");
    }
    let gave_up = Arc::new(GaveUp::default());
    if reached.is_none() {
        tokio::spawn(reach_store(
            target,
            store,
            started,
            args.store_wait_ms.map(Duration::from_millis),
            gave_up.clone(),
        ));
    }
    let grace = Duration::from_millis(args.grace_ms);
    let stop = async {
        tokio::select! {
            () = shutdown_signal() => {}
            () = gave_up.notify.notified() => {}
        }
    };
    server
        .serve_until(listener, stop, grace)
        .await
        .map_err(|e| wasmtime::format_err!("serving: {e}"))?;
    if let Some(error) = gave_up.error.lock().ok().and_then(|mut e| e.take()) {
        return Err(error);
    }
    println!("coord serve: stopped");
    Ok(())
}

/// Why `coord serve` stops without a signal: its store refused it for good,
/// or did not answer within `--store-wait-ms`.
#[derive(Default)]
struct GaveUp {
    error: std::sync::Mutex<Option<wasmtime::Error>>,
    notify: tokio::sync::Notify,
}

/// How often a store that still does not answer is logged.
const UNREACHED_LOG_EVERY: Duration = Duration::from_secs(10);
/// The longest pause between two attempts to reach the store.
const MAX_REACH_PAUSE: Duration = Duration::from_secs(5);

/// Keep trying to reach the store `target` names, pausing twice as long
/// each time up to [`MAX_REACH_PAUSE`], and hand it to `store` once it
/// answers. A store that answered no (a configuration it cannot serve), or
/// one that did not answer within `wait`, stops the process through
/// `gave_up`.
async fn reach_store(
    target: Target,
    store: Arc<Connecting>,
    started: std::time::Instant,
    wait: Option<Duration>,
    gave_up: Arc<GaveUp>,
) {
    let mut pause = Duration::from_millis(100);
    // The first attempt, made at start, failed and was logged.
    let mut failures = 1u64;
    let mut logged = Some(std::time::Instant::now());
    let error = loop {
        if let Some(wait) = wait
            && started.elapsed() >= wait
        {
            break wasmtime::format_err!(
                "gave up on the store after --store-wait-ms {}: {}",
                wait.as_millis(),
                store.last_failure()
            );
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_REACH_PAUSE);
        match backend(&target).await {
            Ok((backend, place)) => {
                store.connected(backend);
                println!("coord serve: state in {place}");
                tracing::info!(
                    target: "coord::serve",
                    "the store answered after {failures} failed attempt(s), {} s after start",
                    started.elapsed().as_secs()
                );
                return;
            }
            Err(e) if e.downcast_ref::<StoreUnreachable>().is_some() => {
                failures += 1;
                store.failed(e.to_string());
                if logged.is_none_or(|at| at.elapsed() >= UNREACHED_LOG_EVERY) {
                    tracing::warn!(
                        target: "coord::serve",
                        "{e}; trying again (attempt {failures}; logged every {} s)",
                        UNREACHED_LOG_EVERY.as_secs()
                    );
                    logged = Some(std::time::Instant::now());
                }
            }
            Err(e) => break e,
        }
    };
    if let Ok(mut kept) = gave_up.error.lock() {
        *kept = Some(error);
    }
    gave_up.notify.notify_one();
}

/// Resolves on SIGTERM (what an orchestrator sends) or Ctrl-C.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn compose(function: &str, out: &str) -> wasmtime::Result<()> {
    let bytes =
        std::fs::read(function).map_err(|e| wasmtime::format_err!("reading {function}: {e}"))?;
    let composed = coord_serve::compose::plug(&bytes, coord_host::COMPONENT)?;
    std::fs::write(out, &composed).map_err(|e| wasmtime::format_err!("writing {out}: {e}"))?;
    println!(
        "coord compose: wrote {out} ({} bytes): {function} with coord plugged in",
        composed.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_are_checked_when_parsed() {
        assert_eq!(
            socket_address("127.0.0.1:0"),
            Ok(SocketAddr::from(([127, 0, 0, 1], 0)))
        );
        assert!(socket_address("[::1]:8080").is_ok());
        assert!(socket_address("localhost:8080").is_ok());
        for bad in [
            "nonsense",
            "127.0.0.1",
            "127.0.0.1:99999",
            ":8080",
            "127.0.0.1:http",
        ] {
            assert!(socket_address(bad).is_err(), "{bad:?}");
        }
    }
}
