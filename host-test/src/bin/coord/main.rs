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
mod terminal;

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, CommandFactory, Parser, Subcommand};
use coord_host::backend::memory::MemoryBackend;
use coord_host::backend::nats::{NatsBackend, NatsConfig};
use coord_host::backend::redis::{RedisBackend, RedisConfig};
use coord_host::backend::{Backend, StoreError};
use coord_host::serve::Server;

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
}

/// Where coordination state lives.
#[derive(Args)]
pub struct StoreArgs {
    /// Keep coordination state in Redis instead of in memory: URL, else
    /// $REDIS_URL, else redis://127.0.0.1:6379 (rediss:// for TLS).
    /// Processes on one Redis share it. Without the flag, a non-empty
    /// $COORD_REDIS_URL means the same as --redis $COORD_REDIS_URL.
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "",
          conflicts_with_all = ["nats", "redis_cluster"])]
    redis: Option<String>,
    /// Keep coordination state in a Redis Cluster: the URLs of one or more
    /// of its nodes, comma-separated (the rest are found from them). A node
    /// after the first may be HOST:PORT alone, as `redis-cli --cluster`
    /// prints them: it takes the first URL's scheme, user and password.
    /// Each call goes to the master serving its partition. Without the
    /// flag, a non-empty $COORD_REDIS_CLUSTER means the same.
    #[arg(long, value_name = "URLS", conflicts_with = "nats", value_parser = cluster_seeds)]
    redis_cluster: Option<String>,
    /// On Redis (one server or a cluster): answer a write only once this
    /// many replicas hold it (WAIT behind each write), else `unavailable`,
    /// so an acquisition survives the master's failover. 0: the master's
    /// word is enough, as Redis does by default.
    #[arg(long, value_name = "N", default_value_t = 0, env = "COORD_REDIS_REPLICA_ACKS",
          value_parser = clap::value_parser!(u32).range(0..=16))]
    redis_replica_acks: u32,
    /// Keep coordination state in NATS JetStream (nats-server 2.11 or
    /// later): URL, else $NATS_URL, else nats://127.0.0.1:4222. Processes
    /// on one NATS share it. Without the flag, a non-empty $COORD_NATS_URL
    /// means the same as --nats $COORD_NATS_URL.
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    nats: Option<String>,
    /// Replicas of the JetStream stream (default: 3 when --nats names three
    /// or more servers, else 1). A stream that exists with another count is
    /// updated to this one.
    #[arg(long, value_name = "N", env = "COORD_NATS_REPLICAS",
          value_parser = clap::value_parser!(u16).range(1..=5))]
    nats_replicas: Option<u16>,
    /// The first part of every Redis key (and every NATS subject).
    #[arg(
        long,
        value_name = "NAME",
        default_value = "coord",
        env = "COORD_PREFIX"
    )]
    prefix: String,
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
    #[arg(long, value_name = "N", default_value_t = coord_host::serve::MAX_CONCURRENT_REQUESTS,
          value_parser = clap::value_parser!(u32).range(1..), env = "COORD_MAX_REQUESTS")]
    max_requests: u32,
    /// How long a client may take to send a request's headers, and then its
    /// body; a slower one gets 408 and holds no instance meanwhile.
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

/// Where coordination state lives, resolved.
pub enum Target {
    /// One process, in memory.
    Memory,
    /// A Redis server, or a cluster, shared by every process pointed at it.
    Redis {
        /// The server's URL, or the cluster nodes' URLs, comma-separated.
        url: String,
        /// Whether `url` names a cluster's nodes.
        cluster: bool,
        /// Replicas that must hold a write before it answers.
        replica_acks: u32,
        /// The key prefix.
        prefix: String,
    },
    /// A NATS JetStream shared by every process pointed at it.
    Nats {
        /// The server's URL.
        url: String,
        /// The subject prefix.
        prefix: String,
        /// The stream's replicas, when given (else by the servers named).
        replicas: Option<usize>,
    },
}

impl StoreArgs {
    /// Where these arguments (and COORD_REDIS_URL, COORD_REDIS_CLUSTER,
    /// COORD_NATS_URL) say the state lives.
    pub fn target(&self) -> Target {
        let env = |name| {
            std::env::var(name)
                .ok()
                .filter(|url: &String| !url.trim().is_empty())
        };
        if self.redis.is_none()
            && let Some(url) = self.nats.clone().or_else(|| env("COORD_NATS_URL"))
        {
            return Target::Nats {
                url: if url.trim().is_empty() {
                    default_url(std::env::var("NATS_URL").ok(), "nats://127.0.0.1:4222")
                } else {
                    url
                },
                prefix: self.prefix.clone(),
                replicas: self.nats_replicas.map(usize::from),
            };
        }
        if self.redis.is_none()
            && let Some(urls) = self.redis_cluster.clone().or_else(|| {
                env("COORD_REDIS_CLUSTER").map(|urls| {
                    // What the flag's parser would have said of it: a usage
                    // error (exit 2) before any work.
                    cluster_seeds(&urls).unwrap_or_else(|why| {
                        Cli::command()
                            .error(
                                clap::error::ErrorKind::InvalidValue,
                                format!(
                                    "invalid value {urls:?} in $COORD_REDIS_CLUSTER \
                                     (--redis-cluster): {why}"
                                ),
                            )
                            .exit()
                    })
                })
            })
        {
            return Target::Redis {
                url: urls,
                cluster: true,
                replica_acks: self.redis_replica_acks,
                prefix: self.prefix.clone(),
            };
        }
        let from_env = env("COORD_REDIS_URL");
        match self.redis.clone().or(from_env).as_deref() {
            None => Target::Memory,
            Some(url) => Target::Redis {
                url: if url.trim().is_empty() {
                    default_redis_url(std::env::var("REDIS_URL").ok())
                } else {
                    url.to_string()
                },
                cluster: false,
                replica_acks: self.redis_replica_acks,
                prefix: self.prefix.clone(),
            },
        }
    }
}

/// The Redis URL `--redis` without one means: `$REDIS_URL`, unless it is
/// unset or empty (an empty variable is unset, as every tool treats it),
/// else the local default.
fn default_redis_url(from_env: Option<String>) -> String {
    default_url(from_env, "redis://127.0.0.1:6379")
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

/// `--redis-cluster` (and $COORD_REDIS_CLUSTER): the seeds as URLs,
/// comma-separated. A seed without a scheme (`10.0.0.2:7000`, as
/// `redis-cli --cluster` prints the nodes) is the first seed's URL with its
/// host and port: the same scheme (TLS or not), user, password and
/// database. Every seed is checked as the Redis client will read it.
fn cluster_seeds(text: &str) -> Result<String, String> {
    let seeds: Vec<&str> = text
        .split(',')
        .map(str::trim)
        .filter(|seed| !seed.is_empty())
        .collect();
    let Some(first) = seeds.first() else {
        return Err(
            "expected the URL of at least one of the cluster's nodes, for example \
                    redis://10.0.0.1:7000,10.0.0.2:7000"
                .into(),
        );
    };
    // A node's URL, parsed: `redis://`, `rediss://` or Valkey's spellings
    // of them (a cluster has no Unix-socket nodes).
    let redis_node_url = |url: &str| {
        redis::parse_redis_url(url)
            .filter(|url| matches!(url.scheme(), "redis" | "rediss" | "valkey" | "valkeys"))
    };
    let with_scheme = |seed: &str| {
        if seed.contains("://") {
            seed.to_string()
        } else {
            format!("redis://{seed}")
        }
    };
    let base = redis_node_url(&with_scheme(first)).ok_or_else(|| {
        format!("{first:?} is not a redis:// or rediss:// URL of a node (redis://HOST:PORT)")
    })?;
    let mut urls = Vec::with_capacity(seeds.len());
    for seed in seeds {
        let url = if seed.contains("://") {
            seed.to_string()
        } else {
            let Some((host, port)) = seed.rsplit_once(':') else {
                return Err(format!("{seed:?} has no port: expected HOST:PORT or a URL"));
            };
            let port = port
                .parse::<u16>()
                .ok()
                .filter(|port| *port > 0)
                .ok_or_else(|| format!("{seed:?}: the port must be a number from 1 to 65535"))?;
            if host.is_empty() {
                return Err(format!("{seed:?} has no host: expected HOST:PORT or a URL"));
            }
            let mut url = base.clone();
            url.set_host(Some(host))
                .map_err(|e| format!("{seed:?}: not a host ({e})"))?;
            url.set_port(Some(port))
                .map_err(|()| format!("{seed:?}: not a port"))?;
            url.to_string()
        };
        if redis_node_url(&url).is_none()
            || redis::IntoConnectionInfo::into_connection_info(url.as_str()).is_err()
        {
            return Err(format!(
                "{seed:?} is not a redis:// or rediss:// URL of a node (redis://HOST:PORT)"
            ));
        }
        urls.push(url);
    }
    Ok(urls.join(","))
}

/// A URL from the environment unless it is unset or empty, else `local`.
fn default_url(from_env: Option<String>, local: &str) -> String {
    from_env
        .filter(|url| !url.trim().is_empty())
        .unwrap_or_else(|| local.into())
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

/// A store's error as a sentence.
pub fn store_failure(error: &StoreError) -> String {
    match error {
        StoreError::Unavailable(why) => format!("the store is unavailable: {why}"),
        StoreError::Invalid(why) => format!("the store refused the request: {why}"),
        StoreError::HistoryGone(after) => format!(
            "the store's change history no longer reaches back (it is complete after revision {after})"
        ),
    }
}

/// Connect to where coordination state lives; says where, for the log.
pub async fn backend(target: &Target) -> wasmtime::Result<(Arc<dyn Backend>, String)> {
    backend_for(target, None).await
}

/// [`backend`], with the Redis client's response timeout set when given.
pub async fn backend_for(
    target: &Target,
    redis_response_timeout: Option<Duration>,
) -> wasmtime::Result<(Arc<dyn Backend>, String)> {
    // Says what could not be used, and why, as a sentence.
    let cannot = |what: &str, url: &str, e: StoreError| match e {
        StoreError::Unavailable(why) => {
            wasmtime::format_err!("the store is unavailable: cannot use {what} at {url}: {why}")
        }
        other => wasmtime::format_err!("cannot use {what} at {url}: {}", store_failure(&other)),
    };
    match target {
        Target::Memory => Ok((
            Arc::new(MemoryBackend::default()),
            "the in-memory store".into(),
        )),
        Target::Redis {
            url,
            cluster,
            replica_acks,
            prefix,
        } => {
            let mut config = RedisConfig::new(url.clone());
            config.prefix = prefix.clone();
            config.cluster = *cluster;
            config.replica_acks = *replica_acks;
            if let Some(timeout) = redis_response_timeout {
                config.response_timeout = timeout;
            }
            let what = if *cluster {
                "the Redis Cluster"
            } else {
                "Redis"
            };
            let backend = RedisBackend::connect(config)
                .await
                .map_err(|e| cannot(what, url, e))?;
            let acks = match replica_acks {
                0 => String::new(),
                n => format!(", writes held by {n} replicas"),
            };
            Ok((
                Arc::new(backend),
                format!("{what} at {url} (prefix {prefix}{acks})"),
            ))
        }
        Target::Nats {
            url,
            prefix,
            replicas,
        } => {
            let mut config = NatsConfig::new(url);
            config.stream = NatsConfig::stream_for(prefix);
            config.subject_prefix = prefix.clone();
            if let Some(replicas) = replicas {
                config.replicas = *replicas;
            }
            let backend = NatsBackend::connect(config)
                .await
                .map_err(|e| cannot("NATS", url, e))?;
            Ok((
                Arc::new(backend),
                format!(
                    "NATS JetStream at {url} (stream {})",
                    NatsConfig::stream_for(prefix)
                ),
            ))
        }
    }
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
        // A cluster or NATS: the inventory lives in coord's own store.
        Target::Redis { cluster: true, .. } | Target::Nats { .. } => {
            inventory::Inventory::Store(backend.clone())
        }
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
            coord_host::serve::INVENTORY_FUNCTION.to_vec(),
            "the built-in inventory function".into(),
        ),
    };
    let (backend, place) = backend(&args.store.target()).await?;
    let server = Arc::new(
        Server::with_cache(
            &bytes,
            backend,
            args.max_requests,
            args.cache_dir().as_deref(),
        )?
        .with_read_timeout(Duration::from_millis(args.read_timeout_ms))
        .with_deadline(Duration::from_millis(args.deadline_ms)),
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
    // Tests and scripts read this line to learn the port (with --listen ...:0).
    println!("coord serve: listening on http://{address}");
    println!("coord serve: {name}{composed}; state in {place}");
    if let Some(listener) = admin {
        println!(
            "coord serve: admin on http://{} (/metrics, /healthz, /readyz)",
            listener.local_addr()?
        );
        let (metrics, store) = (server.metrics().clone(), server.store().clone());
        tokio::spawn(coord_host::serve::admin::serve(listener, metrics, store));
    }
    let grace = Duration::from_millis(args.grace_ms);
    server
        .serve_until(listener, shutdown_signal(), grace)
        .await
        .map_err(|e| wasmtime::format_err!("serving: {e}"))?;
    println!("coord serve: stopped");
    Ok(())
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
    let composed = coord_host::compose::plug(&bytes, coord_host::COMPONENT)?;
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
    fn cluster_seeds_without_a_scheme_take_the_first_seeds_scheme_and_credentials() {
        assert_eq!(
            cluster_seeds("redis://127.0.0.1:7301,127.0.0.1:7302, 127.0.0.1:7303 ,"),
            Ok("redis://127.0.0.1:7301,redis://127.0.0.1:7302,redis://127.0.0.1:7303".into())
        );
        assert_eq!(
            cluster_seeds("rediss://ann:secret@db1:7000/0,db2:7001,redis://db3:7002"),
            Ok(
                "rediss://ann:secret@db1:7000/0,rediss://ann:secret@db2:7001/0,redis://db3:7002"
                    .into()
            )
        );
        assert_eq!(
            cluster_seeds("10.0.0.1:7000,[::1]:7001"),
            Ok("redis://10.0.0.1:7000,redis://[::1]:7001".into())
        );
        for bad in [
            "",
            " , ",
            "http://127.0.0.1:7301",
            "unix:///tmp/redis.sock",
            "redis://127.0.0.1:7301,:7302",
            "redis://127.0.0.1:7301,127.0.0.1",
            "redis://127.0.0.1:7301,127.0.0.1:notaport",
            "redis://127.0.0.1:7301,127.0.0.1:0",
            "redis://127.0.0.1:7301,127.0.0.1:70000",
            "redis://127.0.0.1:7301,bad host:7302",
        ] {
            assert!(cluster_seeds(bad).is_err(), "{bad:?}");
        }
    }

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

    #[test]
    fn an_empty_redis_url_variable_is_unset() {
        assert_eq!(default_redis_url(None), "redis://127.0.0.1:6379");
        assert_eq!(
            default_redis_url(Some(String::new())),
            "redis://127.0.0.1:6379"
        );
        assert_eq!(
            default_redis_url(Some("  ".into())),
            "redis://127.0.0.1:6379"
        );
        assert_eq!(
            default_redis_url(Some("redis://db:6380".into())),
            "redis://db:6380"
        );
    }
}
