//! The demo's system of record: stock per item, guarded by fences.
//!
//! This is the write boundary seed 000 asks for: a write carries the fence of
//! the lock it was made under, and the inventory refuses a fence lower than
//! the highest it has accepted for that item — so a holder that paused past
//! its TTL cannot overwrite the work of the holder after it. In memory for
//! one process; in Redis (one small script, atomic) when several processes
//! share the demo; on any other shared store (NATS), as one entry per item
//! in a partition of coord's own store, written with a revision condition.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use coord_host::backend::{Backend, Condition, Outcome};

/// Every item starts with this much stock.
const INITIAL_STOCK: i64 = 100;

/// Check the fence, then apply the delta, atomically. `KEYS[1]` is the item's
/// hash; `ARGV[1]` the delta, `ARGV[2]` the fence, `ARGV[3]` the initial stock.
const ADJUST: &str = r"
local highest = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[2]) < highest then
  return {0, redis.call('HGET', KEYS[1], 'fence')}
end
redis.call('HSETNX', KEYS[1], 'stock', ARGV[3])
redis.call('HSET', KEYS[1], 'fence', ARGV[2])
local stock = redis.call('HINCRBY', KEYS[1], 'stock', ARGV[1])
redis.call('PEXPIRE', KEYS[1], 3600000)
return {1, tostring(stock)}
";

/// Stock per item and the highest fence each item has accepted.
pub enum Inventory {
    /// In this process.
    Local(Mutex<HashMap<String, (i64, u64)>>),
    /// In Redis, shared by every demo process.
    Redis(redis::aio::MultiplexedConnection),
    /// In a partition of a shared store, every item's `stock fence` as text.
    Store(Arc<dyn Backend>),
}

/// The store partition that holds the demo's inventory.
const INVENTORY_PARTITION: &str = "coord-demo-inventory";

impl Inventory {
    /// An inventory in this process.
    pub fn local() -> Self {
        Inventory::Local(Mutex::new(HashMap::new()))
    }

    /// An inventory in the Redis at `url`.
    pub async fn redis(url: &str) -> Result<Self, redis::RedisError> {
        let client = redis::Client::open(url)?;
        Ok(Inventory::Redis(
            client.get_multiplexed_async_connection().await?,
        ))
    }

    /// Apply `delta` to `item`'s stock if `fence` is not older than the
    /// newest fence already written. Returns the new stock, or why the write
    /// was refused.
    pub async fn adjust(&self, item: &str, delta: i64, fence: u64) -> Result<i64, String> {
        match self {
            Inventory::Local(items) => {
                let mut items = items
                    .lock()
                    .map_err(|_| "inventory lock poisoned".to_string())?;
                let (stock, highest) = items.entry(item.to_string()).or_insert((INITIAL_STOCK, 0));
                if fence < *highest {
                    return Err(format!(
                        "fence {fence} is older than {highest}: write refused"
                    ));
                }
                *highest = fence;
                *stock += delta;
                Ok(*stock)
            }
            Inventory::Store(store) => loop {
                let read = store
                    .get(INVENTORY_PARTITION, item)
                    .await
                    .map_err(|e| format!("inventory unavailable: {e:?}"))?;
                let (stock, highest, condition) = match &read.entry {
                    Some(entry) => {
                        let text = String::from_utf8_lossy(&entry.value);
                        let mut fields = text.split(' ').map(|f| f.parse::<i64>().ok());
                        let (Some(Some(stock)), Some(Some(highest))) =
                            (fields.next(), fields.next())
                        else {
                            return Err(format!("bad inventory entry {text:?}"));
                        };
                        (stock, highest, Condition::Revision(entry.revision))
                    }
                    None => (INITIAL_STOCK, 0, Condition::Absent),
                };
                if i64::try_from(fence).unwrap_or(i64::MAX) < highest {
                    return Err(format!(
                        "fence {fence} is older than {highest}: write refused"
                    ));
                }
                let stock = stock + delta;
                let value = format!("{stock} {fence}");
                let written = store
                    .put(
                        INVENTORY_PARTITION,
                        item,
                        value.as_bytes(),
                        None,
                        &condition,
                    )
                    .await
                    .map_err(|e| format!("inventory unavailable: {e:?}"))?;
                // Another process wrote the item in between: read it again.
                if let Outcome::Applied(_) = written.outcome {
                    return Ok(stock);
                }
            },
            Inventory::Redis(conn) => {
                let (accepted, value): (i64, String) = redis::Script::new(ADJUST)
                    .key(format!("coord-demo:{{inventory}}:{item}"))
                    .arg(delta)
                    .arg(fence)
                    .arg(INITIAL_STOCK)
                    .invoke_async(&mut conn.clone())
                    .await
                    .map_err(|e| format!("inventory unavailable: {e}"))?;
                if accepted == 1 {
                    value.parse().map_err(|_| format!("bad stock {value}"))
                } else {
                    Err(format!(
                        "fence {fence} is older than {value}: write refused"
                    ))
                }
            }
        }
    }
}
