//! A partition that may hold many entries (a semaphore's permits) keeps
//! each entry as a row of `coord_entries`, so that a call's cost does not
//! grow with the entries held; its row in `coord_partitions` keeps the rest
//! (revision, feed, meters) and the count of entry rows. Which rows a call
//! loads, the partition's state and what is written back are the layout's
//! (`coord_host::backend::rows`); this file holds its SQL. Each lookup is
//! one seek of the primary key or of the index of expiries: O(log n) in the
//! rows held.

use coord_component::memory::Partition;
use coord_component::store::Entry;
use coord_host::backend::StoreError;
use coord_host::backend::rows::{self, Loaded, Touches};
use rusqlite::{OptionalExtension, Transaction};

use super::unavailable;

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
    rows::adopt(partition, &loaded, rows);
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
    let (rows, changes) = rows::changes(partition, loaded);
    let name = name.as_bytes();
    for entry in &changes.upserts {
        tx.prepare_cached(
            "INSERT OR REPLACE INTO coord_entries \
             (partition, key, value, revision, updated_at, expires_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .and_then(|mut s| {
            s.execute(rusqlite::params![
                name,
                entry.key.as_bytes(),
                entry.value,
                entry.revision as i64,
                entry.updated_at as i64,
                entry.expires_at.map(column),
            ])
        })
        .map_err(unavailable)?;
    }
    for key in &changes.deletes {
        tx.prepare_cached("DELETE FROM coord_entries WHERE partition = ?1 AND key = ?2")
            .and_then(|mut s| s.execute(rusqlite::params![name, key.as_bytes()]))
            .map_err(unavailable)?;
    }
    Ok((rows, !changes.is_empty()))
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
