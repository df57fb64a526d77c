//! `coord`: the command line of the coord host.
//!
//! `coord demo` runs the main job on the embedded default (the in-memory
//! store); `coord demo --redis URL` runs it on Redis, where several `coord`
//! processes contend for the same locks and write the same inventory.

mod demo;
mod inventory;

use std::process::ExitCode;
use std::sync::Arc;

use coord_host::backend::Backend;
use coord_host::backend::memory::MemoryBackend;
use coord_host::backend::redis::{RedisBackend, RedisConfig};

const USAGE: &str = "\
usage: coord demo [--redis [URL]]
       coord help

  demo             component instances contend for inventory locks, on the
                   in-memory store by default
  --redis [URL]    use Redis instead: URL, else $REDIS_URL, else
                   redis://127.0.0.1:6379 (rediss:// for TLS)";

/// Where the demo keeps its locks and its inventory.
pub enum Target {
    /// One process, in memory.
    Memory,
    /// A Redis server shared by every process pointed at it.
    Redis(String),
}

fn parse(args: &[String]) -> Option<Target> {
    match args {
        [demo] if demo == "demo" => Some(Target::Memory),
        [demo, flag] if demo == "demo" && flag == "--redis" => Some(Target::Redis(
            std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into()),
        )),
        [demo, flag, url] if demo == "demo" && flag == "--redis" => {
            Some(Target::Redis(url.clone()))
        }
        _ => None,
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
    let Some(target) = parse(&args) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    match run(target).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("coord: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(target: Target) -> wasmtime::Result<()> {
    let (backend, inventory, place): (Arc<dyn Backend>, inventory::Inventory, String) =
        match &target {
            Target::Memory => (
                Arc::new(MemoryBackend::default()),
                inventory::Inventory::local(),
                "the in-memory store".into(),
            ),
            Target::Redis(url) => {
                let backend = RedisBackend::connect(RedisConfig::new(url.clone()))
                    .await
                    .map_err(|e| wasmtime::format_err!("cannot use Redis at {url}: {e:?}"))?;
                let inventory = inventory::Inventory::redis(url)
                    .await
                    .map_err(|e| wasmtime::format_err!("cannot use Redis at {url}: {e}"))?;
                (Arc::new(backend), inventory, format!("Redis at {url}"))
            }
        };
    demo::run(backend, inventory, &place).await
}
