//! A partition that may hold many entries (a semaphore's permits, up to its
//! limit: `coord_component::keys::may_hold_many`) keeps each entry as a row
//! of `coord_entries`, so that a call's cost does not grow with the entries
//! held. Its row in `coord_partitions` keeps the rest (revision, feed,
//! meters) and the count of entry rows.
//!
//! **The rules stay the state machine's.** A call loads into the partition
//! only the rows it can see or that decide it — every row due to expire by
//! its now (so each expiry is recorded, as on the whole partition), the
//! row that expires first after it (the holder `absent-and-fewer-than`
//! answers), the call's own key or prefix — tells the partition how many
//! other rows are live ([`Partition::count_outside`]), runs the same
//! `decide` as every other partition, and writes back the rows that
//! changed. Each lookup is one seek of the primary key or of the index of
//! expiries: O(log n) in the rows held.
//!
//! **A state in this layout begins with [`ROWS`]**, which no snapshot
//! begins with: a process that predates the layout cannot decode it and
//! answers `unavailable` rather than count no permits and grant past the
//! limit. A partition still in the old layout (its entries inside its
//! state) is read as it is and moves to rows on its next write.

use std::collections::BTreeMap;

use coord_component::memory::Partition;
use coord_component::store::Entry;
use coord_host::backend::StoreError;
use rusqlite::{OptionalExtension, Transaction};

use super::unavailable;

/// The first byte of a partition's state whose entries are rows; a
/// snapshot's first byte is its version (1).
const ROWS: u8 = 0xE1;

/// What a call reads besides what every call loads.
pub(super) enum Touches {
    /// Nothing more: a check of the revision and the next expiry.
    Nothing,
    /// One key: a read or a write of it.
    Key(String),
    /// Every key with this prefix: a listing.
    Prefix(String),
}

/// The rows a call loaded, as they were: what is written back is what
/// differs from these.
pub(super) type Loaded = BTreeMap<String, Entry>;

/// The count of entry rows and the snapshot, when `state` is in this
/// layout; `None` for a snapshot with its entries inside.
pub(super) fn split(state: &[u8]) -> Result<Option<(u64, &[u8])>, StoreError> {
    let Some((&ROWS, rest)) = state.split_first() else {
        return Ok(None);
    };
    let (count, snapshot) = rest
        .split_first_chunk::<8>()
        .ok_or_else(|| unavailable("a partition's state ends inside its count of rows"))?;
    Ok(Some((u64::from_le_bytes(*count), snapshot)))
}

/// The state that [`split`] reads back.
pub(super) fn join(rows: u64, snapshot: &[u8]) -> Vec<u8> {
    let mut state = Vec::with_capacity(9 + snapshot.len());
    state.push(ROWS);
    state.extend(rows.to_le_bytes());
    state.extend(snapshot);
    state
}

/// The columns every query below selects, in [`entry`]'s order.
const COLUMNS: &str = "key, value, revision, updated_at, expires_at";

/// An entry from a row of `COLUMNS`.
fn entry(row: &rusqlite::Row<'_>) -> rusqlite::Result<Entry> {
    let key: Vec<u8> = row.get(0)?;
    let expires_at: Option<i64> = row.get(4)?;
    Ok(Entry {
        // Keys are written from strings; a row that is not is not ours.
        key: String::from_utf8(key).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Blob, e.into())
        })?,
        value: row.get(1)?,
        revision: row.get::<_, i64>(2)? as u64,
        updated_at: row.get::<_, i64>(3)? as u64,
        expires_at: expires_at.map(|at| u64::try_from(at).unwrap_or(0)),
    })
}

/// A store time as the index orders it.
fn column(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// Load into `partition` the rows of `name` that a call at `now` touching
/// `touches` must see, of the `rows` the partition holds, and count the
/// others as live outside it. Returns the rows as loaded.
pub(super) fn load(
    tx: &Transaction<'_>,
    name: &str,
    now: u64,
    touches: &Touches,
    rows: u64,
    partition: &mut Partition,
) -> Result<Loaded, StoreError> {
    let mut loaded = Loaded::new();
    let mut add = |found: Vec<Entry>| {
        for entry in found {
            loaded.entry(entry.key.clone()).or_insert(entry);
        }
    };
    let query = |sql: &str, params: &[&dyn rusqlite::ToSql]| -> Result<Vec<Entry>, StoreError> {
        let mut statement = tx.prepare_cached(sql).map_err(unavailable)?;
        statement
            .query_map(params, entry)
            .map_err(unavailable)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(unavailable)
    };
    let name = name.as_bytes();
    let now = column(now);
    // Due to expire: the sweep records each.
    add(query(
        &format!(
            "SELECT {COLUMNS} FROM coord_entries \
             WHERE partition = ?1 AND expires_at <= ?2 ORDER BY expires_at, key"
        ),
        &[&name, &now],
    )?);
    // The first to expire after now; failing that (no live entry has a
    // TTL), the first key of those that never expire, as the partition's
    // own choice of holder.
    let first = query(
        &format!(
            "SELECT {COLUMNS} FROM coord_entries \
             WHERE partition = ?1 AND expires_at > ?2 ORDER BY expires_at, key LIMIT 1"
        ),
        &[&name, &now],
    )?;
    if first.is_empty() {
        add(query(
            &format!(
                "SELECT {COLUMNS} FROM coord_entries \
                 WHERE partition = ?1 AND expires_at IS NULL ORDER BY key LIMIT 1"
            ),
            &[&name],
        )?);
    }
    add(first);
    match touches {
        Touches::Nothing => {}
        Touches::Key(key) => add(query(
            &format!("SELECT {COLUMNS} FROM coord_entries WHERE partition = ?1 AND key = ?2"),
            &[&name, &key.as_bytes()],
        )?),
        Touches::Prefix(prefix) => {
            let under = query(
                &format!(
                    "SELECT {COLUMNS} FROM coord_entries \
                     WHERE partition = ?1 AND key >= ?2 ORDER BY key"
                ),
                &[&name, &prefix.as_bytes()],
            )?;
            add(under
                .into_iter()
                .take_while(|e| e.key.starts_with(prefix.as_str()))
                .collect());
        }
    }
    let outside = usize::try_from(rows)
        .unwrap_or(usize::MAX)
        .saturating_sub(loaded.len());
    for entry in loaded.values() {
        partition.adopt(entry.clone());
    }
    partition.count_outside(outside);
    Ok(loaded)
}

/// Write back the rows of `name` that the call changed against `loaded`,
/// taking the entries out of `partition`. Returns the rows the partition
/// holds now and whether any row was written.
pub(super) fn store(
    tx: &Transaction<'_>,
    name: &str,
    loaded: &Loaded,
    partition: &mut Partition,
) -> Result<(u64, bool), StoreError> {
    let rows = partition.live_count() as u64;
    let now_held = partition.take_entries();
    let name = name.as_bytes();
    let mut written = false;
    for (key, entry) in &now_held {
        if loaded.get(key) == Some(entry) {
            continue;
        }
        tx.prepare_cached(
            "INSERT OR REPLACE INTO coord_entries \
             (partition, key, value, revision, updated_at, expires_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .and_then(|mut s| {
            s.execute(rusqlite::params![
                name,
                key.as_bytes(),
                entry.value,
                entry.revision as i64,
                entry.updated_at as i64,
                entry.expires_at.map(column),
            ])
        })
        .map_err(unavailable)?;
        written = true;
    }
    for key in loaded.keys().filter(|key| !now_held.contains_key(*key)) {
        tx.prepare_cached("DELETE FROM coord_entries WHERE partition = ?1 AND key = ?2")
            .and_then(|mut s| s.execute(rusqlite::params![name, key.as_bytes()]))
            .map_err(unavailable)?;
        written = true;
    }
    Ok((rows, written))
}

/// The latest store time at which an entry row of `name` expires (`Some(0)`
/// for none); `None` when one never does.
pub(super) fn lives_until(tx: &Transaction<'_>, name: &str) -> Result<Option<u64>, StoreError> {
    let name = name.as_bytes();
    let forever = tx
        .query_row(
            "SELECT 1 FROM coord_entries WHERE partition = ?1 AND expires_at IS NULL LIMIT 1",
            [name],
            |_| Ok(()),
        )
        .optional()
        .map_err(unavailable)?;
    if forever.is_some() {
        return Ok(None);
    }
    let last: Option<i64> = tx
        .query_row(
            "SELECT expires_at FROM coord_entries WHERE partition = ?1 \
             ORDER BY expires_at DESC LIMIT 1",
            [name],
            |row| row.get(0),
        )
        .optional()
        .map_err(unavailable)?
        .flatten();
    Ok(Some(last.map_or(0, |at| u64::try_from(at).unwrap_or(0))))
}
