//! A partition that may hold many entries (a semaphore's permits, up to its
//! limit: `coord_component::keys::may_hold_many`) kept as one row per entry
//! by the SQL stores, so that a call's cost does not grow with the entries
//! held. What the stores share: which entries a call must load, the layout
//! of the partition's own state, and what to write back.
//!
//! **The rules stay the state machine's.** A call loads into the partition
//! only the entries it can see or that decide it — every entry due to
//! expire by its now (so each expiry is recorded, as on the whole
//! partition), the one that expires first after it (the holder
//! `absent-and-fewer-than` answers; failing one, the first key of those
//! that never expire), the call's own key or prefix ([`Touches`]) — says how
//! many other entries are live ([`adopt`]), runs the same step as every
//! other partition, and writes back what changed ([`changes`]).
//!
//! **The partition's state in this layout begins with [`ROWS`]**, which no
//! snapshot begins with (its first byte is its version, 1), then the count
//! of entry rows and the snapshot without its entries: a process that
//! predates the layout cannot decode it and answers `unavailable` rather
//! than count no permits and grant past the limit. A partition still in the
//! old layout (its entries inside its state) is read as it is and moves to
//! rows on its next write.

use std::collections::BTreeMap;

use coord_component::memory::Partition;

use super::partitioned::Operation;
use super::{Entry, StoreError};

/// The first byte of a partition's state whose entries are rows.
pub const ROWS: u8 = 0xE1;

/// What a call reads of a partition of many besides what every call loads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Touches {
    /// Nothing more: a check of the revision and the next expiry.
    Nothing,
    /// One key: a read or a write of it.
    Key(String),
    /// Every key with this prefix: a listing.
    Prefix(String),
}

impl Operation<'_> {
    /// The entries this operation reads or writes, by key or prefix.
    pub fn touches(&self) -> Touches {
        match self {
            Operation::Get { key }
            | Operation::Put { key, .. }
            | Operation::Delete { key, .. }
            | Operation::Touch { key, .. } => Touches::Key(key.to_string()),
            Operation::List { prefix } => Touches::Prefix(prefix.to_string()),
            Operation::Changes { .. } | Operation::Meter { .. } => Touches::Nothing,
        }
    }
}

/// The entry rows a call loaded, as they were: what is written back is what
/// differs from these.
pub type Loaded = BTreeMap<String, Entry>;

/// The count of entry rows and the snapshot, when `state` is in this
/// layout; `None` for a snapshot with its entries inside.
pub fn split(state: &[u8]) -> Result<Option<(u64, &[u8])>, StoreError> {
    let Some((&ROWS, rest)) = state.split_first() else {
        return Ok(None);
    };
    let (count, snapshot) = rest.split_first_chunk::<8>().ok_or_else(|| {
        StoreError::Unavailable("a partition's state ends inside its count of rows".into())
    })?;
    Ok(Some((u64::from_le_bytes(*count), snapshot)))
}

/// The state that [`split`] reads back.
pub fn join(rows: u64, snapshot: &[u8]) -> Vec<u8> {
    let mut state = Vec::with_capacity(9 + snapshot.len());
    state.push(ROWS);
    state.extend(rows.to_le_bytes());
    state.extend(snapshot);
    state
}

/// Put the `loaded` entry rows into `partition`, of the `rows` its state
/// counts, and count the others as live outside it. The store loaded every
/// row due to expire by the call's now, so every row it did not load is
/// live.
pub fn adopt(partition: &mut Partition, loaded: &Loaded, rows: u64) {
    let outside = usize::try_from(rows)
        .unwrap_or(usize::MAX)
        .saturating_sub(loaded.len());
    for entry in loaded.values() {
        partition.adopt(entry.clone());
    }
    partition.count_outside(outside);
}

/// What to write back after a step: the rows to write (new or changed) and
/// the keys of the rows to delete.
#[derive(Debug, Default, PartialEq)]
pub struct RowChanges {
    /// Entries whose row is new or differs from the one loaded.
    pub upserts: Vec<Entry>,
    /// Keys of rows loaded that the partition no longer holds.
    pub deletes: Vec<String>,
    /// Keys that must have no row, though the call did not load them: the
    /// keys of `upserts` written as new, and (a PostgreSQL speculation on
    /// rows known in part) a key the call read or guarded as absent. A
    /// store that did not load every row checks they have none.
    pub new_keys: Vec<String>,
}

impl RowChanges {
    /// Whether any row changes.
    pub fn is_empty(&self) -> bool {
        self.upserts.is_empty() && self.deletes.is_empty()
    }
}

/// Take the entries out of `partition` after its step and compare them with
/// the rows as `loaded`. Returns the rows the partition holds now (its state
/// counts them) and what to write. `partition` is left as its state is kept:
/// the revision, the feed and the meters.
pub fn changes(partition: &mut Partition, loaded: &Loaded) -> (u64, RowChanges) {
    let rows = partition.live_count() as u64;
    let held = partition.take_entries();
    let deletes = loaded
        .keys()
        .filter(|key| !held.contains_key(*key))
        .cloned()
        .collect();
    let upserts: Vec<Entry> = held
        .into_values()
        .filter(|entry| loaded.get(&entry.key) != Some(entry))
        .collect();
    let new_keys = upserts
        .iter()
        .filter(|entry| !loaded.contains_key(&entry.key))
        .map(|entry| entry.key.clone())
        .collect();
    (
        rows,
        RowChanges {
            upserts,
            deletes,
            new_keys,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, value: &[u8], expires_at: Option<u64>) -> Entry {
        Entry {
            key: key.into(),
            value: value.to_vec(),
            revision: 1,
            updated_at: 0,
            expires_at,
        }
    }

    #[test]
    fn a_state_in_rows_is_not_a_snapshot_and_splits_back() {
        let snapshot = Partition::new(1).encode();
        assert_ne!(snapshot.first(), Some(&ROWS));
        assert_eq!(split(&snapshot).unwrap(), None);
        let state = join(7, &snapshot);
        assert_eq!(split(&state).unwrap(), Some((7, &snapshot[..])));
        assert!(split(&[ROWS, 1, 2]).is_err());
    }

    #[test]
    fn only_changed_rows_are_written_back() {
        let loaded: Loaded = [
            ("a", entry("a", b"1", Some(10))),
            ("b", entry("b", b"2", None)),
            ("c", entry("c", b"3", Some(20))),
        ]
        .into_iter()
        .map(|(k, e)| (k.to_string(), e))
        .collect();
        let mut partition = Partition::new(1);
        adopt(&mut partition, &loaded, 5);
        assert_eq!(partition.live_count(), 5);
        partition.adopt(entry("b", b"changed", None));
        partition.adopt(entry("d", b"new", Some(30)));
        let (rows, changes_made) = {
            // "c" is gone: a step deleted it.
            let mut held = partition.take_entries();
            held.remove("c");
            for e in held.into_values() {
                partition.adopt(e);
            }
            changes(&mut partition, &loaded)
        };
        assert_eq!(rows, 3 + 2);
        assert_eq!(
            changes_made,
            RowChanges {
                upserts: vec![entry("b", b"changed", None), entry("d", b"new", Some(30))],
                deletes: vec!["c".into()],
                new_keys: vec!["d".into()],
            }
        );
        assert_eq!(partition.live_count(), 2, "only the rows outside remain");
    }
}
