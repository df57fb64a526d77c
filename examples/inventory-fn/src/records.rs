//! The stock table: this example's system of record, with the fence checked
//! at the write boundary.
//!
//! Seed 000 keeps business records in a database and asks that the lock's
//! fence be persisted and compared where the write lands, because a lease
//! alone cannot stop a holder that paused past its TTL. Here the table is one
//! partition of the host's store; each write is a compare-and-set on the
//! record's revision, so "fence not older than the newest one written" and
//! the write itself are one atomic step.

use crate::bindings::coord::sync::store::{self, Condition, Outcome};
use serde::{Deserialize, Serialize};

/// The partition holding every item's record (one partition, so an export can
/// list them all in one call).
const PARTITION: &str = "inventory-records";

/// Every item starts with this much stock.
pub const INITIAL_STOCK: i64 = 100;

/// How many times a write retries after losing a compare-and-set race.
const MAX_RACES: u32 = 16;

/// One item's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Units in stock.
    pub stock: i64,
    /// The highest fence any accepted write carried.
    pub fence: u64,
}

impl Default for Record {
    fn default() -> Self {
        Record {
            stock: INITIAL_STOCK,
            fence: 0,
        }
    }
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
    /// The store failed or the record is unreadable.
    Store(String),
}

/// Read `item`'s record (the initial one if it was never written).
pub fn read(item: &str) -> Result<Record, String> {
    let reply = store::get(PARTITION, item).map_err(describe)?;
    match reply.entry {
        Some(entry) => decode(&entry.value),
        None => Ok(Record::default()),
    }
}

/// Every record written so far, by item.
pub fn list() -> Result<Vec<(String, Record)>, String> {
    let reply = store::list(PARTITION, "").map_err(describe)?;
    reply
        .entries
        .into_iter()
        .map(|entry| Ok((entry.key, decode(&entry.value)?)))
        .collect()
}

/// Add `delta` to `item`'s stock under a lock whose fence is `fence`.
pub fn adjust(item: &str, delta: i64, fence: u64) -> Result<Record, Refused> {
    for _ in 0..MAX_RACES {
        let current = store::get(PARTITION, item)
            .map_err(|e| Refused::Store(describe(e)))?
            .entry;
        let (record, condition) = match &current {
            Some(entry) => (
                decode(&entry.value).map_err(Refused::Store)?,
                Condition::Revision(entry.revision),
            ),
            None => (Record::default(), Condition::Absent),
        };
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
        let next = Record { stock, fence };
        let bytes = serde_json::to_vec(&next).map_err(|e| Refused::Store(e.to_string()))?;
        let reply = store::put(PARTITION, item, &bytes, None, &condition)
            .map_err(|e| Refused::Store(describe(e)))?;
        match reply.outcome {
            Outcome::Applied(_) => return Ok(next),
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
