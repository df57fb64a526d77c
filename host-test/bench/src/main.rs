//! `coord-bench`: the component against native Rust and against a bare Redis
//! round trip, side by side in one run. Prints tables; see BENCHMARKS.md.
//!
//! `cargo run --release -p coord-bench [-- --redis URL] [--quick]`
//!
//! `coord-bench --profile-acquire N` runs only N in-memory acquire+release
//! pairs through the component, for a profiler (see BENCHMARKS.md); with
//! `--perf-map`, on the real engine configuration with a perf map of the JIT
//! code; with `--native`, the same pairs straight on the backend.
//! `callgrind-acquire.sh` counts the instructions of both.
//!
//! `coord-bench --nats URL` runs only NATS JetStream beside Redis: round
//! trips and latency per call, and rates at 64 tasks (`nats.rs`).
//!
//! `coord-bench --sql [--postgres URL] [--sqlite PATH]` runs only the SQL
//! stores beside Redis: round trips and latency per call, rates at 64
//! tasks, and PostgreSQL's advisory lock and `SELECT 1` (`sql.rs`).
//!
//! `coord-bench --waiters [--nats URL]` runs only the lock handoff beside
//! 1, 8 and 64 waiters: store calls per handoff and its latency
//! (`ops/waiters.rs`).
//!
//! `coord-bench --redis-cluster URLS` runs only a Redis Cluster beside one
//! Redis server: rates at 64 tasks, with and without replica
//! acknowledgement, and the keys' spread over the masters (`cluster.rs`;
//! `start-redis-cluster.sh` starts a cluster on loopback).
//!
//! `coord-bench --profile-redis-check N` runs only rate-limit checks on
//! Redis, N per task in 64 tasks, each through its own component instance;
//! `--native` straight on the backend, `--tasks T` in T tasks, and
//! `--unpooled` on an engine valgrind can run (no pooling allocator).
//! `--profile-redis-pair N` does the same with lock acquire+release pairs.
//!
//! "Native" is the same store operation called on the same backend straight
//! from Rust, with no component in between: on Redis, the same scripts sent
//! by the `redis` crate. The ratio component / native is the cost of the wasm
//! boundary and the component's own work.

mod at_scale;
mod cluster;
mod measure;
mod nats;
mod ops;
mod side_by_side;
mod sql;

use std::sync::Arc;
use std::time::Instant;

use clap::Parser;

use coord_host::backend::Backend;
use coord_host::backend::memory::MemoryBackend;
use coord_host::{COMPONENT, Runtime};
use coord_nats::{NatsBackend, NatsConfig};
use coord_postgres::{PostgresBackend, PostgresConfig};
use coord_redis::{RedisBackend, RedisConfig};
use coord_sqlite::{SqliteBackend, SqliteConfig};
use measure::{Stats, fmt_us};

/// How hard to measure.
#[derive(Clone, Copy)]
pub struct Effort {
    /// Operations per sample set at concurrency 1.
    pub reps: usize,
    /// Operations per task at concurrency 64.
    pub per_task: usize,
    /// Lock handoffs measured.
    pub handoffs: usize,
    /// Calls measured after an idle pause.
    pub idle_calls: usize,
}

/// The component against native Rust and a bare Redis round trip, side by
/// side in one run (BENCHMARKS.md). With a --profile-* option, only that
/// workload, for a profiler or callgrind.
#[derive(Parser)]
#[command(name = "coord-bench")]
struct Cli {
    /// The Redis to measure against (default: $REDIS_URL, else
    /// redis://127.0.0.1:6379).
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
    /// Only NATS JetStream at URL beside Redis, in one run.
    #[arg(long, value_name = "URL")]
    nats: Option<String>,
    /// Only the Redis Cluster whose nodes' URLs these are (comma-separated)
    /// beside the one Redis server, in one run.
    #[arg(long, value_name = "URLS")]
    redis_cluster: Option<String>,
    /// Only the SQL stores beside Redis, in one run: PostgreSQL at
    /// --postgres, a SQLite file at --sqlite.
    #[arg(long)]
    sql: bool,
    /// With --sql: the PostgreSQL server (default: $POSTGRES_URL, else
    /// postgres://postgres@127.0.0.1:5432/postgres).
    #[arg(long, value_name = "URL")]
    postgres: Option<String>,
    /// With --sql: the SQLite file, made if missing (default: a new file in
    /// the temporary directory, deleted afterwards).
    #[arg(long, value_name = "PATH")]
    sqlite: Option<std::path::PathBuf>,
    /// Only the semaphore's permit pair beside the lock pair, in memory
    /// and on Redis, at one task and at 64; then the permit pair's store
    /// calls beside 0, 1 000 and 10 000 permits held, in memory, on Redis,
    /// SQLite and PostgreSQL (--postgres).
    #[arg(long)]
    semaphore: bool,
    /// Only the lock handoff beside 1, 8 and 64 waiters (store calls per
    /// handoff, and its latency), in memory, on Redis, and on NATS JetStream
    /// when --nats is given.
    #[arg(long)]
    waiters: bool,
    /// A tenth of the samples.
    #[arg(long)]
    quick: bool,
    /// Only N in-memory acquire+release pairs through the component
    /// (`callgrind-acquire.sh` counts them).
    #[arg(long, value_name = "N")]
    profile_acquire: Option<usize>,
    /// With --profile-acquire: the real engine configuration, with a perf map
    /// of the JIT code.
    #[arg(long)]
    perf_map: bool,
    /// Only N rate-limit checks per task on Redis, each task through its own
    /// instance: the 64-task table's check row.
    #[arg(long, value_name = "N")]
    profile_redis_check: Option<usize>,
    /// Only N lock acquire+release pairs per task on Redis: the 64-task
    /// table's lock row.
    #[arg(long, value_name = "N")]
    profile_redis_pair: Option<usize>,
    /// With a --profile-* option: straight on the backend, no component.
    #[arg(long)]
    native: bool,
    /// With --profile-redis-*: this many tasks.
    #[arg(long, value_name = "T", default_value_t = 64)]
    tasks: usize,
    /// With --profile-redis-*: an engine valgrind can run (no pooling
    /// allocator).
    #[arg(long)]
    unpooled: bool,
}

#[tokio::main]
async fn main() -> wasmtime::Result<()> {
    let cli = Cli::parse();
    let redis_url = cli.redis.clone().unwrap_or_else(|| {
        std::env::var("REDIS_URL")
            .ok()
            // An empty variable is unset, as every tool treats it.
            .filter(|url| !url.trim().is_empty())
            .unwrap_or_else(|| "redis://127.0.0.1:6379".into())
    });
    let effort = if cli.quick {
        Effort {
            reps: 300,
            per_task: 30,
            handoffs: 20,
            idle_calls: 10,
        }
    } else {
        Effort {
            reps: 3000,
            per_task: 200,
            handoffs: 100,
            idle_calls: 30,
        }
    };
    if let Some(n) = cli.profile_acquire {
        // For `valgrind --tool=callgrind`: only in-memory acquire+release
        // through the component, so the profile shows nothing else.
        let backend = Arc::new(MemoryBackend::default());
        return ops::profile_acquire(backend, n, cli.perf_map, cli.native).await;
    }
    let profile_redis = match (cli.profile_redis_check, cli.profile_redis_pair) {
        (Some(n), _) => Some((n, false)),
        (None, Some(n)) => Some((n, true)),
        (None, None) => None,
    };
    if let Some((n, pairs)) = profile_redis {
        // For `perf` and callgrind: only component instances checking rate
        // limits (or taking and releasing locks) on Redis at once (64 by
        // default), the rows of the concurrency table at 64 tasks.
        let config = RedisConfig {
            prefix: format!("coordbench-{}", std::process::id()),
            ..RedisConfig::new(redis_url.clone())
        };
        let redis = RedisBackend::connect(config)
            .await
            .map_err(|e| wasmtime::format_err!("Redis at {redis_url}: {e:?}"))?;
        let (tasks, native, unpooled) = (cli.tasks, cli.native, cli.unpooled);
        return ops::profile_concurrent(Arc::new(redis), tasks, n, pairs, native, unpooled).await;
    }
    println!(
        "coord-bench: {} cores; medians of {} operations per row\n",
        num_cpus(),
        effort.reps
    );
    if cli.waiters {
        return waiters(&cli, &redis_url, effort).await;
    }
    if let Some(nats_url) = &cli.nats {
        let id = std::process::id();
        let redis_config = RedisConfig {
            prefix: format!("coordbench-{id}"),
            ..RedisConfig::new(redis_url.clone())
        };
        let redis = RedisBackend::connect(redis_config)
            .await
            .map_err(|e| wasmtime::format_err!("Redis at {redis_url}: {e:?}"))?;
        return on_own_stream(nats_url, |nats| {
            nats::compare(Arc::new(redis), nats, nats_url, effort)
        })
        .await;
    }

    if cli.sql {
        return sql_stores(&cli, &redis_url, effort).await;
    }

    if let Some(cluster_urls) = &cli.redis_cluster {
        let prefix = format!("coordbench-{}", std::process::id());
        let connect = |url: &str, cluster: bool, replica_acks: u32| {
            let config = RedisConfig {
                prefix: prefix.clone(),
                cluster,
                replica_acks,
                ..RedisConfig::new(url)
            };
            let url = url.to_string();
            async move {
                RedisBackend::connect(config)
                    .await
                    .map(Arc::new)
                    .map_err(|e| wasmtime::format_err!("Redis at {url}: {e:?}"))
            }
        };
        let server = connect(&redis_url, false, 0).await?;
        let on_cluster = connect(cluster_urls, true, 0).await?;
        let acked = connect(cluster_urls, true, 1).await?;
        return cluster::compare(server, on_cluster, acked, cluster_urls, &prefix, effort).await;
    }

    let memory: Arc<dyn Backend> = Arc::new(MemoryBackend::default());
    let config = RedisConfig {
        prefix: format!("coordbench-{}", std::process::id()),
        ..RedisConfig::new(redis_url.clone())
    };
    let redis = Arc::new(
        RedisBackend::connect(config)
            .await
            .map_err(|e| wasmtime::format_err!("Redis at {redis_url}: {e:?}"))?,
    );
    if cli.semaphore {
        ops::semaphore_beside_lock(memory.clone(), redis.clone(), effort).await?;
        return semaphore_stores(&cli, memory, redis, effort).await;
    }

    instance_costs()?;
    ops::per_operation("in memory", memory.clone(), None, effort).await?;

    ops::per_operation(
        "Redis (loopback)",
        redis.clone(),
        Some((redis.clone(), redis_url.clone())),
        effort,
    )
    .await?;

    ops::concurrency(memory.clone(), None, effort).await?;
    ops::concurrency(redis.clone(), Some(redis_url.clone()), effort).await?;

    ops::after_idle("in memory", memory.clone(), None, effort).await?;
    ops::after_idle("Redis", redis.clone(), Some(&redis), effort).await?;

    // The same Redis, with the lock waiter's wait and attempt as two
    // requests: what a handoff cost before `wait-then-put`.
    // Same keys as `redis`: the holder, on `redis`, releases to waiters on either.
    let apart_config = RedisConfig {
        prefix: format!("coordbench-{}", std::process::id()),
        blocking_connections: 0,
        ..RedisConfig::new(redis_url.clone())
    };
    let apart: Arc<dyn Backend> = Arc::new(
        RedisBackend::connect(apart_config)
            .await
            .map_err(|e| wasmtime::format_err!("Redis at {redis_url}: {e:?}"))?,
    );
    ops::handoff("in memory", memory, None, None, effort).await?;
    ops::handoff("Redis", redis, Some(apart), Some(redis_url), effort).await?;
    Ok(())
}

/// `--semaphore`, second part: the permit pair beside permits held, in
/// memory, on Redis, on a SQLite file and on PostgreSQL.
/// `--waiters`: the lock handoff beside 1, 8 and 64 waiters, in memory, on
/// Redis and, with --nats, on NATS JetStream, each store on its own keys
/// (rounds: a fifth of the handoffs setting, at least 2).
async fn waiters(cli: &Cli, redis_url: &str, effort: Effort) -> wasmtime::Result<()> {
    let id = std::process::id();
    let rounds = (effort.handoffs / 20).max(2);
    ops::handoff_beside_waiters("in memory", Arc::new(MemoryBackend::default()), rounds).await?;
    let config = RedisConfig {
        prefix: format!("coordbench-{id}"),
        ..RedisConfig::new(redis_url)
    };
    let redis = RedisBackend::connect(config)
        .await
        .map_err(|e| wasmtime::format_err!("Redis at {redis_url}: {e:?}"))?;
    ops::handoff_beside_waiters("Redis", Arc::new(redis), rounds).await?;
    let Some(nats_url) = &cli.nats else {
        return Ok(());
    };
    on_own_stream(nats_url, |nats| {
        ops::handoff_beside_waiters("NATS JetStream", nats, rounds)
    })
    .await
}

/// Run `measure` on the NATS JetStream at `nats_url`, on a stream and
/// subjects of this run's own, and delete the stream afterwards.
async fn on_own_stream<F>(
    nats_url: &str,
    measure: impl FnOnce(Arc<NatsBackend>) -> F,
) -> wasmtime::Result<()>
where
    F: std::future::Future<Output = wasmtime::Result<()>>,
{
    let id = std::process::id();
    let config = NatsConfig {
        stream: format!("COORDBENCH{id}"),
        subject_prefix: format!("coordbench{id}"),
        ..NatsConfig::new(nats_url)
    };
    let stream = config.stream.clone();
    let nats = NatsBackend::connect(config)
        .await
        .map_err(|e| wasmtime::format_err!("NATS at {nats_url}: {e:?}"))?;
    let result = measure(Arc::new(nats)).await;
    if let Ok(client) = async_nats::connect(nats_url).await {
        let _ = async_nats::jetstream::new(client)
            .delete_stream(&stream)
            .await;
    }
    result
}

async fn semaphore_stores(
    cli: &Cli,
    memory: Arc<dyn Backend>,
    redis: Arc<RedisBackend>,
    effort: Effort,
) -> wasmtime::Result<()> {
    let id = std::process::id();
    let path = std::env::temp_dir().join(format!("coordbench-{id}.sqlite"));
    let sqlite = SqliteBackend::open(SqliteConfig::new(Some(path.clone())))
        .await
        .map_err(|e| wasmtime::format_err!("SQLite at {}: {e:?}", path.display()))?;
    let (postgres, _, table, pool) = connect_postgres(cli).await?;
    let result = ops::permits_held(
        vec![
            ("in memory", memory, 10_000),
            ("Redis", redis, 10_000),
            ("SQLite (file)", Arc::new(sqlite), 10_000),
            ("PostgreSQL", Arc::new(postgres), 10_000),
        ],
        effort.reps,
    )
    .await;
    drop_bench_table(&pool, &table).await;
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.clone().into_os_string();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
    result
}

/// A backend on the PostgreSQL server to measure (--postgres, else
/// $POSTGRES_URL, else the local one) with a table of this run's, the
/// server's URL, the table, and a pool for the references (and for
/// [`drop_bench_table`]).
async fn connect_postgres(
    cli: &Cli,
) -> wasmtime::Result<(PostgresBackend, String, String, deadpool_postgres::Pool)> {
    let pg_url = cli.postgres.clone().unwrap_or_else(|| {
        std::env::var("POSTGRES_URL")
            .ok()
            .filter(|url| !url.trim().is_empty())
            .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".into())
    });
    let pg_config = PostgresConfig {
        table: format!("coordbench_{}_partitions", std::process::id()),
        ..PostgresConfig::new(&pg_url)
    };
    let table = pg_config.table.clone();
    let pool = reference_pool(&pg_url, pg_config.pool_size)?;
    let postgres = PostgresBackend::connect(pg_config)
        .await
        .map_err(|e| wasmtime::format_err!("PostgreSQL at {pg_url}: {e:?}"))?;
    Ok((postgres, pg_url, table, pool))
}

/// Remove what a run's PostgreSQL backend made.
async fn drop_bench_table(pool: &deadpool_postgres::Pool, table: &str) {
    if let Ok(client) = pool.get().await {
        let _ = client
            .batch_execute(&coord_postgres::drop_statements(table))
            .await;
    }
}

/// `--sql`: connect to the three stores and the reference pool, compare,
/// and remove what the run made.
async fn sql_stores(cli: &Cli, redis_url: &str, effort: Effort) -> wasmtime::Result<()> {
    let id = std::process::id();
    let redis_config = RedisConfig {
        prefix: format!("coordbench-{id}"),
        ..RedisConfig::new(redis_url)
    };
    let redis = RedisBackend::connect(redis_config)
        .await
        .map_err(|e| wasmtime::format_err!("Redis at {redis_url}: {e:?}"))?;
    let (postgres, pg_url, table, pool) = connect_postgres(cli).await?;
    let (path, made_here) = match &cli.sqlite {
        Some(path) => (path.clone(), false),
        None => (
            std::env::temp_dir().join(format!("coordbench-{id}.sqlite")),
            true,
        ),
    };
    let sqlite = SqliteBackend::open(SqliteConfig::new(Some(path.clone())))
        .await
        .map_err(|e| wasmtime::format_err!("SQLite at {}: {e:?}", path.display()))?;
    println!(
        "Redis at {redis_url}; PostgreSQL at {pg_url}; SQLite at {}\n",
        path.display()
    );
    // A second backend on each store, for the handoffs: another host's on
    // the servers, another process's on the file.
    let other_redis = RedisBackend::connect(RedisConfig {
        prefix: format!("coordbench-{id}"),
        ..RedisConfig::new(redis_url)
    })
    .await
    .map_err(|e| wasmtime::format_err!("Redis at {redis_url}: {e:?}"))?;
    let other_postgres = PostgresBackend::connect(PostgresConfig {
        table: table.clone(),
        ..PostgresConfig::new(&pg_url)
    })
    .await
    .map_err(|e| wasmtime::format_err!("PostgreSQL at {pg_url}: {e:?}"))?;
    let other_sqlite = SqliteBackend::open(SqliteConfig::new(Some(path.clone())))
        .await
        .map_err(|e| wasmtime::format_err!("SQLite at {}: {e:?}", path.display()))?;
    let others: [Arc<dyn Backend>; 3] = [
        Arc::new(other_redis),
        Arc::new(other_postgres),
        Arc::new(other_sqlite),
    ];
    let result = sql::compare(
        Arc::new(redis),
        Arc::new(postgres),
        pool.clone(),
        Arc::new(sqlite),
        others,
        effort,
    )
    .await;
    drop_bench_table(&pool, &table).await;
    if made_here {
        for suffix in ["", "-wal", "-shm"] {
            let mut file = path.clone().into_os_string();
            file.push(suffix);
            let _ = std::fs::remove_file(file);
        }
    }
    result
}

/// A pool of `size` connections to `url`, for the PostgreSQL references.
fn reference_pool(url: &str, size: usize) -> wasmtime::Result<deadpool_postgres::Pool> {
    let config: tokio_postgres::Config = url
        .parse()
        .map_err(|e| wasmtime::format_err!("--postgres {url}: {e}"))?;
    let manager = deadpool_postgres::Manager::new(config, tokio_postgres::NoTls);
    deadpool_postgres::Pool::builder(manager)
        .max_size(size)
        .build()
        .map_err(|e| wasmtime::format_err!("a pool on {url}: {e}"))
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Compile, load and instantiate costs, and the component's size.
fn instance_costs() -> wasmtime::Result<()> {
    let engine = wasmtime::Engine::new(&coord_host::engine_config())?;
    let mut compile = Stats::default();
    for _ in 0..5 {
        let start = Instant::now();
        let _ = wasmtime::component::Component::new(&engine, COMPONENT)?;
        compile.push(start.elapsed());
    }
    let precompiled = engine.precompile_component(COMPONENT)?;
    let mut load = Stats::default();
    for _ in 0..50 {
        let start = Instant::now();
        // SAFETY: the bytes were produced just above by `precompile_component`
        // of this same engine, in this process, and not modified since.
        #[allow(unsafe_code)]
        let _ = unsafe { wasmtime::component::Component::deserialize(&engine, &precompiled)? };
        load.push(start.elapsed());
    }
    let runtime = Runtime::new(Arc::new(MemoryBackend::default()))?;
    let rt = tokio::runtime::Handle::current();
    let mut instantiate = Stats::default();
    let mut request = Stats::default();
    tokio::task::block_in_place(|| {
        rt.block_on(async {
            for _ in 0..2000 {
                let start = Instant::now();
                let instance = runtime.instantiate().await?;
                instantiate.push(start.elapsed());
                drop(instance);
            }
            for k in 0..2000 {
                request.push(ops::one_request(&runtime, &format!("k{}", k % 100)).await?);
            }
            Ok::<_, wasmtime::Error>(())
        })
    })?;
    println!("Instance cost");
    println!("  component size           {:>10} bytes", COMPONENT.len());
    println!(
        "  compile (Cranelift)      {:>10} ms (median of 5)",
        format!("{:.1}", compile.median().as_secs_f64() * 1e3)
    );
    println!(
        "  load precompiled         {:>10} µs (median of 50)",
        fmt_us(load.median())
    );
    println!(
        "  instantiate (InstancePre + pooling)  p50 {} µs, p99 {} µs (2000 instances)",
        fmt_us(instantiate.median()),
        fmt_us(instantiate.p99())
    );
    println!(
        "  a request: instantiate, one in-memory check, drop  p50 {} µs, p99 {} µs (2000 requests)\n",
        fmt_us(request.median()),
        fmt_us(request.p99())
    );
    Ok(())
}
