//! `coord`: the command line of the coord host.
//!
//! `coord serve` runs an edge function over HTTP (the built-in inventory
//! example by default) with the in-memory store, or Redis when asked;
//! `coord compose` writes a function composed with the coord component;
//! `coord demo` shows component instances contending for locks in one process.

mod demo;
mod inventory;
mod long_work;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use coord_host::backend::Backend;
use coord_host::backend::memory::MemoryBackend;
use coord_host::backend::redis::{RedisBackend, RedisConfig};
use coord_host::serve::Server;

const USAGE: &str = "\
usage: coord serve [FUNCTION.wasm] [--redis [URL]] [--prefix NAME] [--listen ADDR]
                   [--max-requests N] [--read-timeout-ms MS]
       coord compose FUNCTION.wasm -o OUT.wasm
       coord demo [--redis [URL]]
       coord help

  serve            run a wasi:http edge function, one instance per request:
                   FUNCTION.wasm, else the built-in inventory example; a
                   function importing coord:sync/lock, ephemeral or ratelimit
                   is composed with the coord component first
  --listen ADDR    where to listen (default 127.0.0.1:8080)
  --max-requests N requests run at once, each in its own instance (default
                   500); one more is answered 503
  --read-timeout-ms MS
                   how long a client may take to send a request's headers,
                   and then its body (default 10000); a slower one gets 408
                   and holds no instance meanwhile
  --redis [URL]    keep coordination state in Redis instead of in memory:
                   URL, else $REDIS_URL, else redis://127.0.0.1:6379
                   (rediss:// for TLS); processes on one Redis share it
  --prefix NAME    the first part of every Redis key (default coord)
  compose          plug the coord component into FUNCTION.wasm and write the
                   result, which imports only the store and what the
                   function itself imports
  demo             component instances contend for inventory locks, on the
                   in-memory store by default";

/// Where coordination state lives.
pub enum Target {
    /// One process, in memory.
    Memory,
    /// A Redis server shared by every process pointed at it.
    Redis {
        /// The server's URL.
        url: String,
        /// The key prefix.
        prefix: String,
    },
}

/// A parsed command line.
enum Command {
    Demo(Target),
    Serve {
        function: Option<String>,
        target: Target,
        listen: String,
        max_requests: u32,
        read_timeout: Duration,
    },
    Compose {
        function: String,
        out: String,
    },
}

/// The Redis URL `--redis` without one means: `$REDIS_URL`, unless it is
/// unset or empty (an empty variable is unset, as every tool treats it),
/// else the local default.
fn default_redis_url(from_env: Option<String>) -> String {
    from_env
        .filter(|url| !url.trim().is_empty())
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into())
}

fn parse(args: &[String]) -> Result<Command, String> {
    let (command, rest) = args.split_first().ok_or("no command given")?;
    let mut function = None;
    let mut out = None;
    let mut redis = None;
    let mut prefix = None;
    let mut listen = None;
    let mut max_requests = None;
    let mut read_timeout = None;
    let mut rest = rest.iter().peekable();
    while let Some(arg) = rest.next() {
        let mut value = |flag: &str| {
            rest.next_if(|next| !next.starts_with("--"))
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match arg.as_str() {
            "--redis" => {
                // The URL is optional: take the next argument only if it is one.
                let url = rest.next_if(|next| next.contains("://")).cloned();
                redis =
                    Some(url.unwrap_or_else(|| default_redis_url(std::env::var("REDIS_URL").ok())));
            }
            "--prefix" => prefix = Some(value("--prefix")?),
            "--listen" => listen = Some(value("--listen")?),
            "--max-requests" => {
                let n = value("--max-requests")?;
                let n =
                    n.parse().ok().filter(|&n: &u32| n > 0).ok_or_else(|| {
                        format!("--max-requests must be a positive number, not {n}")
                    })?;
                max_requests = Some(n);
            }
            "--read-timeout-ms" => {
                let ms = value("--read-timeout-ms")?;
                let ms = ms.parse().ok().filter(|&ms: &u64| ms > 0).ok_or_else(|| {
                    format!("--read-timeout-ms must be a positive number, not {ms}")
                })?;
                read_timeout = Some(Duration::from_millis(ms));
            }
            "-o" | "--out" => out = Some(value("-o")?),
            flag if flag.starts_with('-') => return Err(format!("unknown option {flag}")),
            path if function.is_none() => function = Some(path.to_string()),
            extra => return Err(format!("unexpected argument {extra}")),
        }
    }
    let target = match redis {
        Some(url) => Target::Redis {
            url,
            prefix: prefix.unwrap_or_else(|| "coord".into()),
        },
        None if prefix.is_some() => return Err("--prefix needs --redis".into()),
        None => Target::Memory,
    };
    match command.as_str() {
        "demo"
            if function.is_none()
                && listen.is_none()
                && out.is_none()
                && max_requests.is_none()
                && read_timeout.is_none() =>
        {
            Ok(Command::Demo(target))
        }
        "serve" if out.is_none() => Ok(Command::Serve {
            function,
            target,
            listen: listen.unwrap_or_else(|| "127.0.0.1:8080".into()),
            max_requests: max_requests.unwrap_or(coord_host::serve::MAX_CONCURRENT_REQUESTS),
            read_timeout: read_timeout.unwrap_or(coord_host::serve::READ_TIMEOUT),
        }),
        "compose"
            if listen.is_none()
                && max_requests.is_none()
                && read_timeout.is_none()
                && matches!(target, Target::Memory) =>
        {
            Ok(Command::Compose {
                function: function.ok_or("compose needs FUNCTION.wasm")?,
                out: out.ok_or("compose needs -o OUT.wasm")?,
            })
        }
        other => Err(format!("unknown command or options for {other}")),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if matches!(
        args.first().map(String::as_str),
        Some("help" | "--help" | "-h")
    ) {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let command = match parse(&args) {
        Ok(command) => command,
        Err(why) => {
            eprintln!("coord: {why}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let outcome = match command {
        Command::Demo(target) => demo(target).await,
        Command::Serve {
            function,
            target,
            listen,
            max_requests,
            read_timeout,
        } => serve(function, target, &listen, max_requests, read_timeout).await,
        Command::Compose { function, out } => compose(&function, &out),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("coord: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Connect to where coordination state lives; says where, for the log.
async fn backend(target: &Target) -> wasmtime::Result<(Arc<dyn Backend>, String)> {
    match target {
        Target::Memory => Ok((
            Arc::new(MemoryBackend::default()),
            "the in-memory store".into(),
        )),
        Target::Redis { url, prefix } => {
            let mut config = RedisConfig::new(url.clone());
            config.prefix = prefix.clone();
            let backend = RedisBackend::connect(config)
                .await
                .map_err(|e| wasmtime::format_err!("cannot use Redis at {url}: {e:?}"))?;
            Ok((
                Arc::new(backend),
                format!("Redis at {url} (prefix {prefix})"),
            ))
        }
    }
}

async fn demo(target: Target) -> wasmtime::Result<()> {
    let (backend, place) = backend(&target).await?;
    let inventory = match &target {
        Target::Memory => inventory::Inventory::local(),
        Target::Redis { url, .. } => inventory::Inventory::redis(url)
            .await
            .map_err(|e| wasmtime::format_err!("cannot use Redis at {url}: {e}"))?,
    };
    demo::run(backend, inventory, &place).await
}

async fn serve(
    function: Option<String>,
    target: Target,
    listen: &str,
    max_requests: u32,
    read_timeout: Duration,
) -> wasmtime::Result<()> {
    let (bytes, name) = match &function {
        Some(path) => (
            std::fs::read(path).map_err(|e| wasmtime::format_err!("reading {path}: {e}"))?,
            path.clone(),
        ),
        None => (
            coord_host::serve::INVENTORY_FUNCTION.to_vec(),
            "the built-in inventory function".into(),
        ),
    };
    let (backend, place) = backend(&target).await?;
    let server = Arc::new(
        Server::with_capacity(&bytes, backend, max_requests)?.with_read_timeout(read_timeout),
    );
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| wasmtime::format_err!("listening on {listen}: {e}"))?;
    let address = listener.local_addr()?;
    let composed = if server.composed() {
        ", composed with coord"
    } else {
        ""
    };
    // Tests and scripts read this line to learn the port (with --listen ...:0).
    println!("coord serve: listening on http://{address}");
    println!("coord serve: {name}{composed}; state in {place}");
    tokio::select! {
        served = server.serve(listener) => served.map_err(|e| wasmtime::format_err!("serving: {e}")),
        _ = tokio::signal::ctrl_c() => {
            println!("coord serve: stopped");
            Ok(())
        }
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
