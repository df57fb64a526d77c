//! What only the Redis backend must show: one round trip per call, a layout
//! that fits Redis Cluster, no leaked keys, fences that survive a data-losing
//! restart, and "unavailable" — never "busy" or "acquired" — when Redis is
//! out of reach, with recovery after. Runs on a real `redis-server`.

use crate::common;

use std::sync::Arc;

use common::{RedisServer, redis_config, redis_url};
use coord_host::backend::{Backend, Condition, Entry, Outcome};
use coord_host::lock::*;
use coord_host::{Instance, Runtime};
use coord_redis::{RedisBackend, RedisConfig};

async fn shared_backend(config: impl FnOnce(RedisConfig) -> RedisConfig) -> Arc<RedisBackend> {
    let url = redis_url().await;
    let backend = RedisBackend::connect(config(redis_config(&url, 64, None)))
        .await
        .unwrap();
    Arc::new(backend)
}

/// A backend on the shared Redis with its own prefix and `retention_ms`, an
/// instance of the component on it, and the prefix and URL (to inspect keys).
async fn with_retention(retention_ms: u64) -> (Arc<RedisBackend>, Instance, String, String) {
    let url = redis_url().await;
    let config = RedisConfig {
        retention_ms,
        ..redis_config(&url, 64, None)
    };
    let prefix = config.prefix.clone();
    let backend = Arc::new(RedisBackend::connect(config).await.unwrap());
    let instance = Runtime::new(backend.clone())
        .unwrap()
        .instantiate()
        .await
        .unwrap();
    (backend, instance, prefix, url)
}

async fn private_server() -> (RedisServer, Arc<RedisBackend>) {
    let server = RedisServer::spawn().expect("these tests start their own redis-server");
    let backend = RedisBackend::connect(redis_config(&server.url(), 64, None))
        .await
        .unwrap();
    (server, Arc::new(backend))
}

/// Put `value` under `key` in partition `p` unconditionally; the entry written.
async fn put(backend: &RedisBackend, key: &str, value: &[u8], ttl_ms: Option<u64>) -> Entry {
    match backend
        .put("p", key, value, ttl_ms, &Condition::Always)
        .await
        .unwrap()
        .outcome
    {
        Outcome::Applied(e) => e,
        other => panic!("an unconditional put was refused: {other:?}"),
    }
}

async fn acquire(i: &mut Instance, options: AcquireOptions) -> Result<AcquireOutcome, Error> {
    i.lock()
        .acquire("inventory.stock", "item:1", options)
        .await
        .expect("no trap")
}

fn held(outcome: Result<AcquireOutcome, Error>) -> HeldLock {
    match outcome {
        Ok(AcquireOutcome::Acquired(lock)) => lock,
        other => panic!("expected acquired, got {other:?}"),
    }
}

/// How many times Redis ran `command`, from `INFO commandstats`.
async fn server_calls(url: &str, command: &str) -> u64 {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    let prefix = format!("cmdstat_{command}:");
    info.lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

mod blocking;
mod faults;
mod notifications;
mod unwatched;
mod wire;
