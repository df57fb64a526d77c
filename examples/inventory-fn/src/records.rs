//! The stock table: this example's system of record, with the fence checked
//! at the write boundary.
//!
//! k2b's lock guide keeps business records in a database and asks that the
//! lock's fence be persisted and compared where the write lands, because a
//! lease alone cannot stop a holder that paused past its TTL. Here each
//! item's record is a partition of the host's store of its own, so items
//! spread over a cluster's shards and a write costs the item's record, not
//! the table; each write is a compare-and-set on the record's revision, so
//! "fence not older than the newest one written" and the write itself are
//! one atomic step. An index partition names every item written, for the
//! export and the table's bound.

use crate::bindings::coord::sync::store::{self, Condition, Outcome};
use serde::{Deserialize, Serialize};

/// The partition of `item`'s record: unwatched (`~`), as nobody follows a
/// record's change feed, and one per item (outside testers found one
/// partition for the whole table put every item on one Redis Cluster master
/// and made every NATS write rewrite the table).
pub fn partition(item: &str) -> String {
    format!("{RECORD_PARTITION_PREFIX}{item}")
}

/// What an item's record partition is called before the item's name.
pub const RECORD_PARTITION_PREFIX: &str = "~inventory-record:";

/// The key of the record in its item's partition.
pub const RECORD_KEY: &str = "record";

/// The partition naming every item ever written (key: the item; value:
/// empty), written once per item, before its first record.
pub const ITEMS: &str = "inventory-items";

/// Every item starts with this much stock.
pub const INITIAL_STOCK: i64 = 100;

/// How many times a write retries after losing a compare-and-set race.
const MAX_RACES: u32 = 16;

/// The most items the table holds: a new item beyond it is refused, so no
/// client can grow the table without bound.
pub const MAX_ITEMS: usize = 1000;

/// How many idempotency keys each record remembers (its latest adjustments).
pub const MAX_KEYS_PER_ITEM: usize = 32;

/// How long an idempotency key is remembered, in ms of store time (a day).
pub const KEY_TTL_MS: u64 = 86_400_000;

/// One item's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Units in stock.
    pub stock: i64,
    /// The highest fence any accepted write carried.
    pub fence: u64,
    /// The idempotency keys of the latest adjustments, oldest first, each
    /// with its answer. They are written in the same compare-and-set as the
    /// stock: a request that applied is known to have applied whatever its
    /// reply was (a 503 for a write that landed after the store stalled).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applied: Vec<Applied>,
}

/// An adjustment made under an idempotency key, and what it answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// The request's `Idempotency-Key`.
    pub key: String,
    /// The delta it applied.
    pub delta: i64,
    /// The stock right after it.
    pub stock: i64,
    /// The fence it was written with.
    pub fence: u64,
    /// Store time of the write.
    pub at: u64,
}

impl Default for Record {
    fn default() -> Self {
        Record {
            stock: INITIAL_STOCK,
            fence: 0,
            applied: Vec::new(),
        }
    }
}

/// What an adjustment answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Adjusted {
    /// Units in stock after it.
    pub stock: i64,
    /// The fence it was written with.
    pub fence: u64,
    /// Whether this is the answer of an earlier request with the same
    /// idempotency key, which applied; nothing was applied now.
    pub replayed: bool,
}

/// Why a write did not land.
#[derive(Debug)]
pub enum Refused {
    /// The write's fence is older than one already written: its lock was lost.
    Stale {
        /// The newest fence the record has accepted.
        newest: u64,
    },
    /// The stock would go below zero.
    Insufficient {
        /// Units in stock now.
        stock: i64,
    },
    /// The idempotency key was used before with another delta.
    KeyReused {
        /// The delta it was used with.
        delta: i64,
    },
    /// The item is new and the table already holds [`MAX_ITEMS`].
    TableFull,
    /// The store failed or the record is unreadable.
    Store(String),
}

/// Read `item`'s record (the initial one if it was never written).
pub fn read(item: &str) -> Result<Record, String> {
    let reply = store::get(&partition(item), RECORD_KEY).map_err(describe)?;
    match reply.entry {
        Some(entry) => decode(&entry.value),
        None => Ok(Record::default()),
    }
}

/// Every item written so far, with its record: the index, then one read per
/// item (at most [`MAX_ITEMS`]).
pub fn list() -> Result<Vec<(String, Record)>, String> {
    let index = store::list(ITEMS, "").map_err(describe)?;
    index
        .entries
        .into_iter()
        .map(|entry| {
            let record = read(&entry.key)?;
            Ok((entry.key, record))
        })
        .collect()
}

/// Name `item` in the index before its first record is written, refusing a
/// new item once the index holds [`MAX_ITEMS`].
fn index(item: &str) -> Result<(), Refused> {
    let store_error = |e| Refused::Store(describe(e));
    if store::get(ITEMS, item)
        .map_err(store_error)?
        .entry
        .is_some()
    {
        return Ok(());
    }
    let items = store::list(ITEMS, "").map_err(store_error)?;
    if items.entries.len() >= MAX_ITEMS {
        return Err(Refused::TableFull);
    }
    // A conflict means another request named it first: as good.
    store::put(ITEMS, item, b"", None, &Condition::Absent).map_err(store_error)?;
    Ok(())
}

/// Add `delta` to `item`'s stock under a lock whose fence is `fence`. With
/// an idempotency key already applied to this item, answer as that request
/// did and apply nothing.
pub fn adjust(
    item: &str,
    delta: i64,
    fence: u64,
    idempotency_key: Option<&str>,
) -> Result<Adjusted, Refused> {
    let store_error = |e| Refused::Store(describe(e));
    for _ in 0..MAX_RACES {
        let read = store::get(&partition(item), RECORD_KEY).map_err(store_error)?;
        let (record, condition) = match &read.entry {
            Some(entry) => (
                decode(&entry.value).map_err(Refused::Store)?,
                Condition::Revision(entry.revision),
            ),
            None => (Record::default(), Condition::Absent),
        };
        // A retry is answered before the fence is compared: its lock may be
        // long gone, and it must not apply again either way.
        if let Some(key) = idempotency_key
            && let Some(earlier) = record
                .applied
                .iter()
                .find(|a| a.key == key && read.now < a.at.saturating_add(KEY_TTL_MS))
        {
            if earlier.delta != delta {
                return Err(Refused::KeyReused {
                    delta: earlier.delta,
                });
            }
            return Ok(Adjusted {
                stock: earlier.stock,
                fence: earlier.fence,
                replayed: true,
            });
        }
        if fence < record.fence {
            return Err(Refused::Stale {
                newest: record.fence,
            });
        }
        let stock = record.stock.saturating_add(delta);
        if stock < 0 {
            return Err(Refused::Insufficient {
                stock: record.stock,
            });
        }
        let adjusted = Adjusted {
            stock,
            fence,
            replayed: false,
        };
        if read.entry.is_none() {
            // Nothing to record for a new item that does not change.
            if delta == 0 && idempotency_key.is_none() {
                return Ok(adjusted);
            }
            index(item)?;
        }
        let mut applied: Vec<Applied> = record
            .applied
            .into_iter()
            .filter(|a| read.now < a.at.saturating_add(KEY_TTL_MS))
            .collect();
        if let Some(key) = idempotency_key {
            applied.push(Applied {
                key: key.to_string(),
                delta,
                stock,
                fence,
                at: read.now,
            });
        }
        let excess = applied.len().saturating_sub(MAX_KEYS_PER_ITEM);
        applied.drain(..excess);
        let next = Record {
            stock,
            fence,
            applied,
        };
        let bytes = serde_json::to_vec(&next).map_err(|e| Refused::Store(e.to_string()))?;
        let reply = store::put(&partition(item), RECORD_KEY, &bytes, None, &condition)
            .map_err(store_error)?;
        match reply.outcome {
            Outcome::Applied(_) => return Ok(adjusted),
            // Another write landed between the read and this one: read again.
            Outcome::Conflict(_) => continue,
        }
    }
    Err(Refused::Store(format!(
        "the record of {item} changed {MAX_RACES} times during one write"
    )))
}

fn decode(bytes: &[u8]) -> Result<Record, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("unreadable stock record: {e}"))
}

fn describe(error: store::Error) -> String {
    match error {
        store::Error::Unavailable(why) => format!("store unavailable: {why}"),
        store::Error::HistoryGone(revision) => format!("store history gone after {revision}"),
        store::Error::Invalid(why) => format!("store refused the call: {why}"),
    }
}
