//! Where coordination state lives: the store flags every command shares
//! (`--redis`, `--redis-cluster`, `--nats`, `--postgres`, `--sqlite`,
//! their environment variables),
//! what they resolve to, and connecting to it.

use std::sync::Arc;
use std::time::Duration;

use clap::builder::TypedValueParser;
use clap::{Args, CommandFactory};
use coord_host::backend::memory::MemoryBackend;
use coord_host::backend::{Backend, StoreError};
use coord_nats::{NatsBackend, NatsConfig};
use coord_postgres::{Durability, PostgresBackend, PostgresConfig};
use coord_redis::{RedisBackend, RedisConfig};
use coord_sqlite::{SqliteBackend, SqliteConfig};

use crate::Cli;

/// Where coordination state lives.
#[derive(Args)]
pub struct StoreArgs {
    /// Keep coordination state in Redis instead of in memory: URL, else
    /// $REDIS_URL, else redis://127.0.0.1:6379 (rediss:// for TLS).
    /// Processes on one Redis share it. Without the flag, a non-empty
    /// $COORD_REDIS_URL means the same as --redis $COORD_REDIS_URL.
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "",
          conflicts_with_all = ["nats", "redis_cluster", "postgres", "sqlite"])]
    redis: Option<String>,
    /// Keep coordination state in a Redis Cluster: the URLs of one or more
    /// of its nodes, comma-separated (the rest are found from them). A node
    /// after the first may be HOST:PORT alone, as `redis-cli --cluster`
    /// prints them: it takes the first URL's scheme, user and password.
    /// Each call goes to the master serving its partition. Without the
    /// flag, a non-empty $COORD_REDIS_CLUSTER means the same.
    #[arg(long, value_name = "URLS", conflicts_with_all = ["nats", "postgres", "sqlite"],
          value_parser = cluster_seeds)]
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
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "",
          conflicts_with_all = ["postgres", "sqlite"])]
    nats: Option<String>,
    /// Replicas of the JetStream stream. A stream coord makes gets N, else
    /// 3 when --nats names three or more servers, else 1. A stream that
    /// exists keeps its count unless N is more (it is raised), or fewer
    /// with --allow-fewer-replicas: how many URLs a process was given never
    /// changes it. A mismatch is logged and shown by /readyz.
    #[arg(long, value_name = "N", env = "COORD_NATS_REPLICAS",
          value_parser = clap::value_parser!(u16).range(1..=5))]
    nats_replicas: Option<u16>,
    /// Let --nats-replicas lower an existing stream's replicas (every
    /// process on the stream then has fewer copies of each write).
    #[arg(long, requires = "nats_replicas", env = "COORD_ALLOW_FEWER_REPLICAS")]
    allow_fewer_replicas: bool,
    /// Keep coordination state in PostgreSQL: URL
    /// (postgres://USER:PASSWORD@HOST:PORT/DATABASE), else $DATABASE_URL,
    /// else postgres://postgres@127.0.0.1:5432/postgres. Processes on one
    /// database share it, in the table PREFIX_partitions (made if
    /// missing). Without the flag, a non-empty $COORD_POSTGRES_URL means
    /// the same as --postgres $COORD_POSTGRES_URL.
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "",
          conflicts_with = "sqlite")]
    postgres: Option<String>,
    /// On PostgreSQL: where the one connection that LISTENs for changes
    /// goes, when --postgres points at a transaction-mode pooler
    /// (PgBouncer): that connection needs a session of its own, so give it
    /// the server's own URL. Without it, waiters behind such a pooler are
    /// woken only by their re-check, every 500 ms.
    #[arg(long, value_name = "URL", env = "COORD_POSTGRES_LISTEN_URL")]
    postgres_listen_url: Option<String>,
    /// On PostgreSQL: how writes commit. durable (a write is answered once
    /// committed as the server's synchronous_commit says) or relaxed
    /// (synchronous_commit = off for coord's writes: faster, and a server
    /// crash loses about the last 600 ms of them). It is the table's
    /// setting, shared by every process on it: a new table gets what its
    /// first process asks; durable raises an existing table; relaxed
    /// lowers one only with --allow-relaxed-durability. Without the flag,
    /// the table's setting is kept.
    #[arg(long, value_name = "MODE", env = "COORD_POSTGRES_DURABILITY",
          value_parser = clap::builder::PossibleValuesParser::new(["durable", "relaxed"])
              .map(|word| word.parse::<Durability>().expect("a listed value")))]
    postgres_durability: Option<Durability>,
    /// Let --postgres-durability relaxed relax an existing durable table
    /// (every process on it then loses its last moments' writes in a crash).
    #[arg(
        long,
        requires = "postgres_durability",
        env = "COORD_ALLOW_RELAXED_DURABILITY"
    )]
    allow_relaxed_durability: bool,
    /// Keep coordination state in a SQLite file (made if missing): every
    /// process on this host that opens it shares it. Without the flag, a
    /// non-empty $COORD_SQLITE_PATH means the same as --sqlite
    /// $COORD_SQLITE_PATH.
    #[arg(long, value_name = "PATH")]
    sqlite: Option<std::path::PathBuf>,
    /// The first part of every Redis key (and every NATS subject, and the
    /// PostgreSQL table's name).
    #[arg(
        long,
        value_name = "NAME",
        default_value = "coord",
        env = "COORD_PREFIX"
    )]
    prefix: String,
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
    /// A SQLite file shared by every process on this host that opens it.
    Sqlite {
        /// The database file.
        path: std::path::PathBuf,
    },
    /// A PostgreSQL database shared by every process pointed at it.
    Postgres {
        /// The database's URL.
        url: String,
        /// Where the LISTEN connection goes, when not `url`.
        listen_url: Option<String>,
        /// The table's prefix.
        prefix: String,
        /// The durability asked for (see `--postgres-durability`).
        durability: Option<Durability>,
        /// Whether `durability` may relax a durable table.
        allow_relaxed: bool,
    },
    /// A NATS JetStream shared by every process pointed at it.
    Nats {
        /// The server's URL.
        url: String,
        /// The subject prefix.
        prefix: String,
        /// The stream's replicas, when asked for (see `--nats-replicas`).
        replicas: Option<usize>,
        /// Whether `replicas` may lower an existing stream's count.
        allow_fewer_replicas: bool,
    },
}

impl StoreArgs {
    /// Where these arguments (and COORD_REDIS_URL, COORD_REDIS_CLUSTER,
    /// COORD_NATS_URL, COORD_POSTGRES_URL, COORD_SQLITE_PATH) say the state
    /// lives.
    pub fn target(&self) -> Target {
        let env = |name| {
            std::env::var(name)
                .ok()
                .filter(|url: &String| !url.trim().is_empty())
        };
        if self.redis.is_none()
            && self.nats.is_none()
            && self.postgres.is_none()
            && let Some(path) = self
                .sqlite
                .clone()
                .or_else(|| env("COORD_SQLITE_PATH").map(Into::into))
        {
            return Target::Sqlite { path };
        }
        if self.redis.is_none()
            && self.nats.is_none()
            && let Some(url) = self.postgres.clone().or_else(|| env("COORD_POSTGRES_URL"))
        {
            return Target::Postgres {
                url: if url.trim().is_empty() {
                    default_url(
                        std::env::var("DATABASE_URL").ok(),
                        "postgres://postgres@127.0.0.1:5432/postgres",
                    )
                } else {
                    url
                },
                listen_url: self.postgres_listen_url.clone(),
                prefix: self.prefix.clone(),
                durability: self.postgres_durability,
                allow_relaxed: self.allow_relaxed_durability,
            };
        }
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
                allow_fewer_replicas: self.allow_fewer_replicas,
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

/// A URL as the log shows it: with its password, if any, replaced.
fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.rsplit_once('@') {
        Some((credentials, host)) => match credentials.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

/// A URL from the environment unless it is unset or empty, else `local`.
fn default_url(from_env: Option<String>, local: &str) -> String {
    from_env
        .filter(|url| !url.trim().is_empty())
        .unwrap_or_else(|| local.into())
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

/// The store did not answer (it may still be starting, or restarting): an
/// attempt later may succeed, where a store that answered no (too old, no
/// JetStream, a stream of another layout) never will.
#[derive(Debug)]
pub struct StoreUnreachable(pub String);

impl std::fmt::Display for StoreUnreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StoreUnreachable {}

impl Target {
    /// The kind of store this is, as its backend names itself.
    pub fn kind(&self) -> &'static str {
        match self {
            Target::Memory => "memory",
            Target::Redis { .. } => "redis",
            Target::Nats { .. } => "nats",
            Target::Postgres { .. } => "postgres",
            Target::Sqlite { .. } => "sqlite",
        }
    }
}

/// [`backend`], with the Redis client's response timeout set when given.
pub async fn backend_for(
    target: &Target,
    redis_response_timeout: Option<Duration>,
) -> wasmtime::Result<(Arc<dyn Backend>, String)> {
    // Says what could not be used, and why, as a sentence.
    let cannot = |what: &str, url: &str, e: StoreError| match e {
        StoreError::Unavailable(why) => wasmtime::Error::new(StoreUnreachable(format!(
            "the store is unavailable: cannot use {what} at {url}: {why}"
        ))),
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
        Target::Sqlite { path } => {
            let backend = SqliteBackend::open(SqliteConfig::new(Some(path.clone())))
                .await
                .map_err(|e| cannot("SQLite", &path.display().to_string(), e))?;
            Ok((Arc::new(backend), format!("SQLite at {}", path.display())))
        }
        Target::Postgres {
            url,
            listen_url,
            prefix,
            durability,
            allow_relaxed,
        } => {
            let config = PostgresConfig {
                listen_url: listen_url.clone(),
                table: PostgresConfig::table_for(prefix),
                durability: *durability,
                allow_relaxed: *allow_relaxed,
                ..PostgresConfig::new(url)
            };
            let table = config.table.clone();
            let backend = PostgresBackend::connect(config)
                .await
                .map_err(|e| cannot("PostgreSQL", &redacted(url), e))?;
            let commits = backend.durability();
            Ok((
                Arc::new(backend),
                format!(
                    "PostgreSQL at {} (table {table}, {commits} commits)",
                    redacted(url)
                ),
            ))
        }
        Target::Nats {
            url,
            prefix,
            replicas,
            allow_fewer_replicas,
        } => {
            let mut config = NatsConfig::new(url);
            config.stream = NatsConfig::stream_for(prefix);
            config.subject_prefix = prefix.clone();
            config.replicas = *replicas;
            config.allow_fewer_replicas = *allow_fewer_replicas;
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
