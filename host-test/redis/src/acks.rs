//! The replica acknowledgements the processes on one prefix rely on, kept
//! in Redis so that no process's setting lowers them for the others.
//!
//! `replica_acks` is given to each process, but what it buys is shared: a
//! lock acquired through a process that waits for a replica survives the
//! master's failover only if every process writing the same partitions
//! waits too. A process given fewer (a forgotten flag, an operator
//! command) would write to the master alone, and a failover could lose its
//! acquisition while another holder, told the lock is free, takes it. So
//! each process records the number it was given in `<prefix>:settings`
//! (field `replica_acks`), only ever raising it, and waits for the larger
//! of the two; it reads the record again every [`SETTLE_EVERY`], so a
//! process started before a higher setting learns it, and writes it back
//! if the record was lost (a flush, a restart without persistence).
//! Lowering it is an operator's act: `DEL <prefix>:settings` with every
//! process restarted at the lower number.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ::redis::Value;
use coord_host::backend::StoreError;

use super::link::Link;
use super::{RedisBackend, malformed, unavailable};

/// How often a process reads the record again.
pub(super) const SETTLE_EVERY: Duration = Duration::from_secs(2);

/// Raise the record to `ARGV[1]` if it is lower, and answer what it is now.
const SETTLE: &str = "local have = tonumber(redis.call('HGET', KEYS[1], 'replica_acks') or '0') \
     local want = tonumber(ARGV[1]) \
     if want > have then redis.call('HSET', KEYS[1], 'replica_acks', want) have = want end \
     return have";

/// The acknowledgements a process was asked for and those it relies on.
pub(super) struct Acks {
    /// What this process was given (`RedisConfig::replica_acks`).
    pub(super) asked: u32,
    /// The larger of that and the record, as last read (only ever raised).
    pub(super) relied: Arc<AtomicU32>,
}

impl Acks {
    pub(super) fn new(asked: u32) -> Self {
        Acks {
            asked,
            relied: Arc::new(AtomicU32::new(asked)),
        }
    }
}

/// The record's key under `prefix`.
fn settings_key(prefix: &str) -> String {
    format!("{prefix}:settings")
}

/// Raise the record to what `relied` holds, and `relied` to the record.
async fn settle(conn: &Link, prefix: &str, relied: &AtomicU32) -> Result<u32, StoreError> {
    let mut conn = conn.clone();
    let reply: Value = ::redis::cmd("EVAL")
        .arg(SETTLE)
        .arg(1)
        .arg(settings_key(prefix))
        .arg(relied.load(Ordering::Relaxed))
        .query_async(&mut conn)
        .await
        .map_err(unavailable)?;
    let Value::Int(have) = reply else {
        return Err(malformed(&format!(
            "expected the replica acknowledgements relied on, got {reply:?}"
        )));
    };
    let have = u32::try_from(have).unwrap_or(u32::MAX);
    relied.fetch_max(have, Ordering::Relaxed);
    Ok(relied.load(Ordering::Relaxed))
}

impl RedisBackend {
    /// How many replicas must acknowledge each write: the larger of what
    /// this process was asked for and what the prefix's processes rely on.
    pub(super) fn replica_acks(&self) -> u32 {
        self.acks.relied.load(Ordering::Relaxed)
    }

    /// Record this process's number and learn the prefix's; then keep
    /// doing so every [`SETTLE_EVERY`] while the backend lives.
    pub(super) async fn settle_acks(&self) -> Result<(), StoreError> {
        settle(&self.conn, &self.config.prefix, &self.acks.relied).await?;
        let (conn, prefix) = (self.conn.clone(), self.config.prefix.clone());
        let relied = Arc::downgrade(&self.acks.relied);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(SETTLE_EVERY).await;
                let Some(relied) = relied.upgrade() else {
                    return;
                };
                if let Err(e) = settle(&conn, &prefix, &relied).await {
                    tracing::debug!("reading {prefix}:settings failed: {e:?}");
                }
            }
        });
        Ok(())
    }

    /// A warning when this process waits for more replicas than it was
    /// asked for, because others on its prefix rely on them.
    pub(super) fn acks_warnings(&self) -> Vec<String> {
        let relied = self.replica_acks();
        if relied <= self.acks.asked {
            return Vec::new();
        }
        vec![format!(
            "this process was asked for {} replica acknowledgements, but processes on prefix {:?} \
             rely on {relied} ({}:settings), so its writes wait for {relied}",
            self.acks.asked, self.config.prefix, self.config.prefix
        )]
    }
}
