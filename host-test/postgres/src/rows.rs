//! A partition that may hold many entries (a semaphore's permits:
//! `coord_component::keys::may_hold_many`) keeps each entry as a row of
//! `<table>_entries`, so that a call's cost does not grow with the entries
//! held. The partition's own row keeps the revision, the feed, the meters
//! and the count of entry rows, in the layout of `coord_host::backend::rows`
//! (which also says which entries a call loads and what it writes back).
//!
//! **Reading** is one call of `<table>_read_rows_v1`: the partition's row,
//! the server's clock and the entry rows the call needs — those due to expire by its now, the
//! first to expire after it, the first of those that never expire, its own
//! key or prefix — each found by an index seek, so O(log n) in the rows
//! held.
//!
//! **Writing** is one call of `<table>_write_rows_v2`: under the partition
//! row's lock, and only if that row is still exactly the one the call
//! decided on and the server's clock is within the call's bounds (the
//! conditions of `write_function.rs`), it deletes and upserts the entry rows
//! the call changed, then writes the partition's row (a new version, so a
//! concurrent call that read the old one cannot write). Every write of an
//! entry row goes through that function, so the partition's version covers
//! its rows: the compare-and-set of `partition.rs` is unchanged.
//!
//! A call speculates (`speculation.rs`) on the rows this process knows: a
//! partition of at most [`KNOWN_ROWS`] entry rows whole (the read loads
//! them all), a larger one in part, up to the first row to expire
//! ([`horizon`]), for a call of one key; the write then also requires that
//! every key it writes as new has no row.

use coord_component::memory::Partition;
use coord_component::store::Entry;
use coord_host::backend::StoreError;
use coord_host::backend::rows::{self as layout, ROWS, RowChanges, Touches};
use tokio_postgres::Row;

use super::durability::commit_setting;
use super::partition::{CLOCK_US, COLLECT_GRAIN_MS, Loaded};
use super::speculation::KNOWN_ROWS;
use super::{unavailable, write_function};

/// The table of entry rows beside `table`.
pub(super) fn entries(table: &str) -> String {
    format!("{table}_entries")
}

/// The statements that make the table of entry rows and its index of
/// expiries, if missing.
pub(super) fn create_table(table: &str) -> String {
    let e = entries(table);
    format!(
        "CREATE TABLE IF NOT EXISTS {e} (
           partition bytea NOT NULL,
           key bytea NOT NULL,
           value bytea NOT NULL,
           revision bigint NOT NULL,
           updated_at bigint NOT NULL,
           expires_at bigint,
           PRIMARY KEY (partition, key)
         );
         CREATE INDEX IF NOT EXISTS {e}_expiry ON {e} (partition, expires_at, key);"
    )
}

/// The columns an entry is read from, in [`entries_of`]'s order.
const COLUMNS: &str = "key, value, revision, updated_at, expires_at";

/// The read of a partition of many: a row of (the server's clock in µs, the
/// partition's version, time and state, all null when it has no row, then
/// the loaded entries as five arrays).
///
/// Parameters: `$1` the partition's name; `$2` the test clock's now (null:
/// the server's); `$3` the call's key, `$4` its prefix (null when it has
/// none). The call's now is the clock in ms, never before the partition's
/// time, as `partition.rs` decides it.
pub(super) fn read(table: &str) -> String {
    format!(
        "SELECT o_now_us, o_version, o_decided_at, o_state, o_keys, o_values, o_revisions, \
         o_updated, o_expires FROM {}($1, $2, $3, $4)",
        read_function_name(table)
    )
}

/// The read's function name for `table`: a function, as the write is, so
/// that its plan is made once per session, not on every call.
pub(super) fn read_function_name(table: &str) -> String {
    format!("{table}_read_rows_v1")
}

/// Its signature, as `to_regprocedure` reads it.
pub(super) fn read_signature(table: &str) -> String {
    format!("{}(bytea, bigint, bytea, bytea)", read_function_name(table))
}

/// The statement that makes the read's function.
///
/// It also loads every row when the partition's state counts at most
/// [`KNOWN_ROWS`] (`k`: the count is the state's bytes 1 to 8, little
/// endian): a semaphore of a few permits is then known whole and its next
/// call speculates in one round trip (`speculation.rs`). Decided on the
/// count, not by an ordered scan with a limit, which a plan made for a
/// small table runs as a scan of every row and a sort.
///
/// The rows due by now and the first after it are one walk of the index of
/// expiries, a seek per row (`walk`): a plain `expires_at <= now` leaves
/// the planner to guess how many rows match a value it cannot see, and once
/// the table has statistics it guesses a third of them and scans the whole
/// table.
pub(super) fn create_read_function(table: &str) -> String {
    let e = entries(table);
    let f = read_function_name(table);
    let of =
        |filter: &str| format!("SELECT {COLUMNS} FROM {e} WHERE partition = p_name AND {filter}");
    format!(
        "CREATE FUNCTION {f}(p_name bytea, p_now bigint, p_key bytea, p_prefix bytea)
         RETURNS TABLE (o_now_us bigint, o_version bigint, o_decided_at bigint, o_state bytea,
                        o_keys bytea[], o_values bytea[], o_revisions bigint[],
                        o_updated bigint[], o_expires bigint[])
         LANGUAGE plpgsql AS $fn$
         BEGIN
           RETURN QUERY
           WITH RECURSIVE c AS MATERIALIZED (SELECT {CLOCK_US} AS now_us),
           m AS MATERIALIZED (SELECT t.version, t.decided_at, t.state FROM {table} t
                              WHERE t.name = p_name),
           n AS MATERIALIZED (SELECT greatest(coalesce(p_now, (SELECT now_us FROM c) / 1000),
                                              (SELECT decided_at FROM m)) AS now_ms),
           k AS MATERIALIZED (SELECT CASE WHEN length(m.state) >= 9 AND get_byte(m.state, 0) = {ROWS}
                                     THEN get_byte(m.state, 1) <= {KNOWN_ROWS}
                                          AND substr(m.state, 3, 7) = decode('00000000000000', 'hex')
                                     ELSE false END AS few FROM m),
           walk AS (({first} ORDER BY expires_at, key LIMIT 1)
                    UNION ALL
                    SELECT x.* FROM walk w CROSS JOIN LATERAL
                      ({after} ORDER BY expires_at, key LIMIT 1) x
                    WHERE w.expires_at <= (SELECT now_ms FROM n)),
           e AS ((SELECT * FROM walk) UNION ({forever} ORDER BY key LIMIT 1)
                 UNION ({key}) UNION ({prefix})
                 UNION ({all} ORDER BY key LIMIT {few}))
           SELECT c.now_us, m.version, m.decided_at, m.state,
                  a.keys, a.vals, a.revs, a.upds, a.exps
           FROM c LEFT JOIN m ON true CROSS JOIN
             (SELECT array_agg(e.key) keys, array_agg(e.value) vals,
                     array_agg(e.revision) revs, array_agg(e.updated_at) upds,
                     array_agg(e.expires_at) exps FROM e) a;
         END
         $fn$",
        first = of("expires_at IS NOT NULL"),
        after = of("(expires_at, key) > (w.expires_at, w.key)"),
        forever = of("expires_at IS NULL"),
        all = of("coalesce((SELECT few FROM k), false)"),
        few = KNOWN_ROWS + 1,
        key = of("key = p_key"),
        prefix = of("key >= p_prefix AND substr(key, 1, length(p_prefix)) = p_prefix"),
    )
}

/// The key and prefix parameters of [`read`] for `touches`.
pub(super) fn read_params(touches: &Touches) -> (Option<&[u8]>, Option<&[u8]>) {
    match touches {
        Touches::Nothing => (None, None),
        Touches::Key(key) => (Some(key.as_bytes()), None),
        Touches::Prefix(prefix) => (None, Some(prefix.as_bytes())),
    }
}

/// The partition a reply of [`read`] carries from its second column on
/// (`None`: it has no row): its state split into the snapshot and the count
/// of entry rows, with the entry rows loaded beside it.
pub(super) fn loaded_of(name: &str, row: &Row) -> Result<Option<Loaded>, StoreError> {
    let version: Option<i64> = row.try_get(1).map_err(unavailable)?;
    let Some(version) = version else {
        return Ok(None);
    };
    let decided_at: i64 = row.try_get(2).map_err(unavailable)?;
    let encoded: Vec<u8> = row.try_get(3).map_err(unavailable)?;
    let (count, snapshot) = layout::split(&encoded)?.unwrap_or((0, &encoded[..]));
    let partition = Partition::decode(snapshot)
        .map_err(|e| unavailable(format!("the row of {name:?} is not a coord partition: {e}")))?;
    let rows = entries_of(row)?
        .into_iter()
        .map(|entry| (entry.key.clone(), entry))
        .collect();
    Ok(Some(Loaded {
        version,
        partition,
        decided_at: u64::try_from(decided_at).unwrap_or(0),
        rows: Some(Box::new((rows, count))),
        horizon: None,
        encoded,
    }))
}

/// The horizon of a partition of many as read at `now` ([`Loaded::horizon`]):
/// when not every row was loaded, the first loaded row to expire after
/// `now` in (expiry, key) order, which is the first of all (the read walks
/// the rows in that order up to it). `None` when every row was loaded, or
/// none expires after now.
pub(super) fn horizon(loaded: &Loaded, now: u64) -> Option<(u64, String)> {
    let (rows, count) = loaded.rows.as_deref()?;
    if rows.len() as u64 == *count {
        return None;
    }
    rows.values()
        .filter_map(|entry| Some((entry.expires_at?, entry.key.clone())))
        .filter(|(at, _)| *at > now)
        .min()
}

/// The entries of a reply of [`read`] (its last five columns).
fn entries_of(row: &Row) -> Result<Vec<Entry>, StoreError> {
    let keys: Option<Vec<Vec<u8>>> = row.try_get(4).map_err(unavailable)?;
    let values: Option<Vec<Vec<u8>>> = row.try_get(5).map_err(unavailable)?;
    let revisions: Option<Vec<i64>> = row.try_get(6).map_err(unavailable)?;
    let updated: Option<Vec<i64>> = row.try_get(7).map_err(unavailable)?;
    let expires: Option<Vec<Option<i64>>> = row.try_get(8).map_err(unavailable)?;
    let keys = keys.unwrap_or_default();
    let (values, revisions) = (values.unwrap_or_default(), revisions.unwrap_or_default());
    let (updated, expires) = (updated.unwrap_or_default(), expires.unwrap_or_default());
    if [values.len(), revisions.len(), updated.len(), expires.len()] != [keys.len(); 4] {
        return Err(unavailable(
            "the entry rows came back in arrays of unequal lengths",
        ));
    }
    let unsigned = |n: i64| u64::try_from(n).unwrap_or(0);
    keys.into_iter()
        .zip(values)
        .zip(revisions.into_iter().zip(updated).zip(expires))
        .map(|((key, value), ((revision, updated_at), expires_at))| {
            Ok(Entry {
                // Keys are written from strings; a row that is not is not ours.
                key: String::from_utf8(key)
                    .map_err(|_| unavailable("an entry row's key is not UTF-8"))?,
                value,
                revision: unsigned(revision),
                updated_at: unsigned(updated_at),
                expires_at: expires_at.map(unsigned),
            })
        })
        .collect()
}

/// The entry rows a write sends, as [`call`]'s array parameters.
pub(super) struct RowParams {
    pub(super) keys: Vec<Vec<u8>>,
    pub(super) values: Vec<Vec<u8>>,
    pub(super) revisions: Vec<i64>,
    pub(super) updated: Vec<i64>,
    pub(super) expires: Vec<Option<i64>>,
    pub(super) gone: Vec<Vec<u8>>,
    /// Keys written as new, which must have no row: a call that did not
    /// load every row cannot tell that otherwise.
    pub(super) absent: Vec<Vec<u8>>,
}

/// Keys as the statement's `bytea[]` parameters take them.
fn bytes(keys: &[String]) -> Vec<Vec<u8>> {
    keys.iter().map(|k| k.as_bytes().to_vec()).collect()
}

impl RowParams {
    pub(super) fn new(changes: &RowChanges) -> Self {
        let signed = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let upserts = &changes.upserts;
        RowParams {
            keys: upserts.iter().map(|e| e.key.as_bytes().to_vec()).collect(),
            values: upserts.iter().map(|e| e.value.clone()).collect(),
            revisions: upserts.iter().map(|e| signed(e.revision)).collect(),
            updated: upserts.iter().map(|e| signed(e.updated_at)).collect(),
            expires: upserts.iter().map(|e| e.expires_at.map(signed)).collect(),
            gone: bytes(&changes.deletes),
            absent: bytes(&changes.new_keys),
        }
    }
}

/// The write function's name for `table`.
pub(super) fn write_function_name(table: &str) -> String {
    format!("{table}_write_rows_v2")
}

/// Its signature, as `to_regprocedure` reads it.
pub(super) fn write_signature(table: &str) -> String {
    format!(
        "{}(bytea, bigint, bytea, bigint, bigint, bigint, bytea, bigint, bigint, text, text, \
         bytea[], bytea[], bigint[], bigint[], bigint[], bytea[], bigint, bytea[])",
        write_function_name(table)
    )
}

/// The call, answering as `write_function::call` does. Parameters `$1` to
/// `$11` are that call's; then the entry rows to upsert (`$12` keys, `$13`
/// values, `$14` revisions, `$15` update times, `$16` expiries), `$17` the
/// keys of the rows to delete, `$18` the retention (ms) a partition's row
/// is kept past its last entry row's expiry and `$19` the keys written as
/// new, which must have no row (else nothing is written).
pub(super) fn call(table: &str) -> String {
    format!(
        "SELECT o_written, o_clock_us, o_version, o_decided_at, o_state \
         FROM {}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)",
        write_function_name(table)
    )
}

/// The statement that makes the write function.
pub(super) fn create_write_function(table: &str) -> String {
    let t = table;
    let e = entries(table);
    let f = write_function_name(table);
    let commit = commit_setting(table);
    let grain = COLLECT_GRAIN_MS;
    let bound_lock_waits = write_function::bound_lock_waits();
    format!(
        "CREATE FUNCTION {f}(
           p_name bytea, p_decided_at bigint, p_state bytea, p_collect_at bigint,
           p_version bigint, p_was_decided_at bigint, p_was_state bytea,
           p_at_least_us bigint, p_before_us bigint, p_channel text, p_payload text,
           p_keys bytea[], p_values bytea[], p_revisions bigint[], p_updated bigint[],
           p_expires bigint[], p_gone bytea[], p_retention bigint, p_absent bytea[])
         RETURNS TABLE (o_written bigint, o_clock_us bigint, o_version bigint,
                        o_decided_at bigint, o_state bytea)
         LANGUAGE plpgsql AS $fn$
         DECLARE
           v_ok boolean;
           v_written bigint;
           v_waited bigint;
           v_until bigint;
           v_collect bigint := p_collect_at;
           v_key bytea;
         BEGIN
           {bound_lock_waits}
           PERFORM {commit};
           -- First the partition's row, locked and as the call decided on
           -- (or made, for a new one); the clock is read after the lock.
           IF p_version IS NULL THEN
             INSERT INTO {t} (name, version, decided_at, state, collect_at)
             SELECT p_name, nextval('{t}_versions'), p_decided_at, p_state, NULL
             WHERE {CLOCK_US} >= p_at_least_us AND {CLOCK_US} < p_before_us
             ON CONFLICT (name) DO NOTHING
             RETURNING true INTO v_ok;
           ELSE
             SELECT true INTO v_ok FROM {t} r
             WHERE r.name = p_name AND r.version = p_version
               AND r.decided_at = p_was_decided_at AND r.state = p_was_state
             FOR UPDATE SKIP LOCKED;
             v_ok := v_ok AND {CLOCK_US} >= p_at_least_us AND {CLOCK_US} < p_before_us;
             -- A key written as new has no row (a new partition has none).
             IF v_ok THEN
               FOREACH v_key IN ARRAY p_absent LOOP
                 IF EXISTS (SELECT 1 FROM {e} x WHERE x.partition = p_name AND x.key = v_key) THEN
                   v_ok := false;
                   EXIT;
                 END IF;
               END LOOP;
             END IF;
           END IF;
           IF v_ok AND p_version IS NULL THEN
             -- A partition with no row has no entries: rows left by a
             -- partition whose row went some other way (an operator's
             -- `TRUNCATE` of the partitions) are not its.
             DELETE FROM {e} WHERE partition = p_name;
           END IF;
           IF v_ok THEN
             -- One delete per key, each by the primary key (a plan for
             -- `key = ANY (…)` may scan the partition's rows instead).
             FOREACH v_key IN ARRAY p_gone LOOP
               DELETE FROM {e} WHERE partition = p_name AND key = v_key;
             END LOOP;
             INSERT INTO {e} (partition, key, value, revision, updated_at, expires_at)
             SELECT p_name, u.k, u.v, u.r, u.a, u.x
             FROM unnest(p_keys, p_values, p_revisions, p_updated, p_expires) AS u (k, v, r, a, x)
             ON CONFLICT (partition, key) DO UPDATE SET value = excluded.value,
               revision = excluded.revision, updated_at = excluded.updated_at,
               expires_at = excluded.expires_at;
             -- The row is kept while an entry row lives, and the retention
             -- after the last (one seek of the index of expiries, from its
             -- end: a row that never expires comes first).
             IF v_collect IS NOT NULL THEN
               SELECT x.expires_at INTO v_until FROM {e} x WHERE x.partition = p_name
               ORDER BY x.expires_at DESC NULLS FIRST LIMIT 1;
               IF FOUND THEN
                 v_collect := CASE WHEN v_until IS NULL THEN NULL ELSE greatest(v_collect,
                   (least(v_until, 4000000000000000000) + p_retention + {grain} - 1) / {grain} * {grain})
                   END;
               END IF;
             END IF;
             UPDATE {t} SET version = nextval('{t}_versions'), decided_at = p_decided_at,
                    state = p_state, collect_at = v_collect
             WHERE name = p_name
             RETURNING version, wait_until INTO v_written, v_waited;
             {written}
           ELSE
             {refused}
           END IF;
         END
         $fn$",
        written = write_function::answer_written(),
        refused = write_function::answer_refused(t),
    )
}

/// The collection of expired partitions: their rows and their entry rows,
/// in one statement (`$1`: the store's now).
pub(super) fn collect(table: &str) -> String {
    format!(
        "WITH gone AS (DELETE FROM {table} WHERE collect_at < $1 RETURNING name) \
         DELETE FROM {} WHERE partition IN (SELECT name FROM gone)",
        entries(table)
    )
}
