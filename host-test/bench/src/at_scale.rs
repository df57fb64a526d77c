//! The references of the 64-task rows: what a user would run on Redis
//! instead of coord, called the way coord's rows call coord — many tasks on
//! one multiplexed connection, each on a key of its own.

use std::time::{SystemTime, UNIX_EPOCH};

use ::redis::Script;
use ::redis::aio::MultiplexedConnection;

use crate::measure::{Step, failed};

/// Which reference a task runs.
#[derive(Clone, Copy, Debug)]
pub enum Reference {
    /// k2b's bare lock: `SET key owner NX PX ttl`, then a
    /// compare-and-delete script. No fence, no recorded expiry.
    BareLockPair,
    /// `plain-window.lua`: the two-counter sliding window on the caller's
    /// clock, with a limit no task reaches.
    PlainWindowCheck,
}

/// The bare lock's release: delete the key if it still holds the owner.
const BARE_RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// The plain sliding-window check (its header says what it takes).
const PLAIN_WINDOW: &str = include_str!("../scripts/plain-window.lua");

/// The window of the plain check, as coord's bench limiter's: a minute.
const WINDOW_MS: u64 = 60_000;

/// One task's reference operation on its own key.
pub struct ReferenceStep {
    reference: Reference,
    conn: MultiplexedConnection,
    key: String,
    script: Script,
}

impl ReferenceStep {
    /// Task `task`'s step: its keys carry the process id and the task.
    pub fn new(reference: Reference, conn: MultiplexedConnection, task: usize) -> Self {
        let key = format!("coordbench-ref-{}-{task}", std::process::id());
        let script = Script::new(match reference {
            Reference::BareLockPair => BARE_RELEASE,
            Reference::PlainWindowCheck => PLAIN_WINDOW,
        });
        ReferenceStep {
            reference,
            conn,
            key,
            script,
        }
    }
}

impl Step for ReferenceStep {
    async fn step(&mut self) -> wasmtime::Result<()> {
        let err = |e: ::redis::RedisError| failed(&format!("{e:?}"));
        match self.reference {
            Reference::BareLockPair => {
                let owner = "0123456789abcdef0123456789abcdef";
                let taken: Option<String> = ::redis::cmd("SET")
                    .arg(&self.key)
                    .arg(owner)
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query_async(&mut self.conn)
                    .await
                    .map_err(err)?;
                let deleted: i64 = self
                    .script
                    .key(&self.key)
                    .arg(owner)
                    .invoke_async(&mut self.conn)
                    .await
                    .map_err(err)?;
                if taken.is_none() || deleted != 1 {
                    return Err(failed("the bare lock was not taken and released"));
                }
            }
            Reference::PlainWindowCheck => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64);
                let window = now / WINDOW_MS;
                // One hash tag per task: both counters in one cluster slot.
                let current = format!("{{{}}}:{window}", self.key);
                let previous = format!("{{{}}}:{}", self.key, window.saturating_sub(1));
                let left: i64 = self
                    .script
                    .key(current)
                    .key(previous)
                    .arg(10_000_000)
                    .arg(now)
                    .arg(WINDOW_MS)
                    .arg(1)
                    .invoke_async(&mut self.conn)
                    .await
                    .map_err(err)?;
                if left < 0 {
                    return Err(failed("the plain window refused a check"));
                }
            }
        }
        Ok(())
    }
}
