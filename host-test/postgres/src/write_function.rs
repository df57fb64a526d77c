//! The one function coord keeps in the database: the conditional write of a
//! partition's row, `<table>_write_v2`.
//!
//! It holds no rule of the store contract (those run in Rust, in the state
//! machine every store shares): it writes the state a call decided only if
//! the row is still exactly the one the call decided on and the server's
//! clock is within the call's bounds, announces the new revision when a
//! waiter registered, and otherwise returns the row as it is now. It is a
//! function, not a statement sent each time, because PostgreSQL keeps a
//! PL/pgSQL function's plans for the rest of the session: the statement
//! it replaces spent more time being parsed and planned on every call than
//! being run. Nothing of it is session state, so a transaction-mode
//! pooler is still fine. Its name carries a version: a later coord that
//! needs another body adds the next beside it, so processes of both
//! versions can share a table. (`_v2` bounds its own lock waits by the
//! call's deadline, [`bound_lock_waits`]; `_v1` did not.)

use super::durability::commit_setting;
use super::partition::{CLOCK_MS, CLOCK_US};

/// The function's name for `table`.
pub(super) fn name(table: &str) -> String {
    format!("{table}_write_v2")
}

/// Its signature, as `to_regprocedure` reads it.
pub(super) fn signature(table: &str) -> String {
    format!(
        "{}(bytea, bigint, bytea, bigint, bigint, bigint, bytea, bigint, bigint, text, text)",
        name(table)
    )
}

/// The call: a row of (written version, the server's clock in µs, and, when
/// nothing was written, the row's version, time and state; all null when
/// there is no row).
///
/// Parameters: `$1` the partition's name; `$2`–`$4` the row to write (its
/// time, state and collection time); `$5`–`$7` the row it must still be
/// (version, time, state; a null version: there must be no row); `$8` and
/// `$9` the bounds on the server's clock in µs (at least, and before);
/// `$10` and `$11` the channel and payload to announce (a null payload:
/// none).
pub(super) fn call(table: &str) -> String {
    format!(
        "SELECT o_written, o_clock_us, o_version, o_decided_at, o_state \
         FROM {}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        name(table)
    )
}

/// The statement that makes it.
pub(super) fn create(table: &str) -> String {
    let t = table;
    let f = name(table);
    let commit = commit_setting(table);
    format!(
        "CREATE FUNCTION {f}(
           p_name bytea, p_decided_at bigint, p_state bytea, p_collect_at bigint,
           p_version bigint, p_was_decided_at bigint, p_was_state bytea,
           p_at_least_us bigint, p_before_us bigint, p_channel text, p_payload text)
         RETURNS TABLE (o_written bigint, o_clock_us bigint, o_version bigint,
                        o_decided_at bigint, o_state bytea)
         LANGUAGE plpgsql AS $fn$
         DECLARE
           v_written bigint;
           v_waited bigint;
         BEGIN
           {bound_lock_waits}
           -- The commit waits as the table's durability says.
           PERFORM {commit};
           -- The clock is read after the row's lock and any wait for the
           -- table: a write held up past its bounds applies nothing.
           IF p_version IS NULL THEN
             INSERT INTO {t} (name, version, decided_at, state, collect_at)
             SELECT p_name, nextval('{t}_versions'), p_decided_at, p_state, p_collect_at
             WHERE {CLOCK_US} >= p_at_least_us AND {CLOCK_US} < p_before_us
             ON CONFLICT (name) DO NOTHING
             RETURNING version INTO v_written;
           ELSE
             UPDATE {t} r SET version = nextval('{t}_versions'), decided_at = p_decided_at,
                    state = p_state, collect_at = p_collect_at
             WHERE r.name = (SELECT s.name FROM {t} s
                             WHERE s.name = p_name AND s.version = p_version
                             FOR UPDATE SKIP LOCKED)
               AND r.version = p_version AND r.decided_at = p_was_decided_at
               AND r.state = p_was_state
               AND {CLOCK_US} >= p_at_least_us AND {CLOCK_US} < p_before_us
             RETURNING r.version, r.wait_until INTO v_written, v_waited;
           END IF;
           IF v_written IS NOT NULL THEN
             {written}
           ELSE
             {refused}
           END IF;
         END
         $fn$",
        written = answer_written(),
        refused = answer_refused(t),
        bound_lock_waits = bound_lock_waits(),
    )
}

/// The first statement of a write function: no lock wait inside it may
/// outlast the call's deadline (`p_before_us`, on the server's clock). The
/// clock is checked before a write, but an insert of a new partition (or
/// entry row) that another transaction is inserting too waits for that
/// transaction after the check: without this bound, it applied once the
/// other rolled back, after the call had answered `unavailable`. Local to
/// the statement's transaction, so a transaction-mode pooler stays fine.
pub(super) fn bound_lock_waits() -> String {
    format!(
        "-- Lock waits end at the call's deadline (an error: unavailable).
           PERFORM set_config('lock_timeout',
             greatest(1, (p_before_us - {CLOCK_US}) / 1000)::text, true);"
    )
}

/// How a write function ends once it wrote (`v_written`: the new version,
/// `v_waited`: the row's registration): announce the revision, and answer
/// the version and the clock. A new row always announces itself; a row
/// only when a waiter registered on it (read under the row's lock).
pub(super) fn answer_written() -> String {
    format!(
        "IF p_payload IS NOT NULL AND (p_version IS NULL OR v_waited > {CLOCK_MS}) THEN
           PERFORM pg_notify(p_channel, p_payload);
         END IF;
         RETURN QUERY SELECT v_written, {CLOCK_US}, NULL::bigint, NULL::bigint, NULL::bytea;"
    )
}

/// How a write function of `table` ends when it wrote nothing: the clock
/// and the row as it is now (all null: no row).
pub(super) fn answer_refused(table: &str) -> String {
    format!(
        "RETURN QUERY SELECT NULL::bigint, {CLOCK_US}, r.version, r.decided_at, r.state
           FROM (SELECT 1) one LEFT JOIN {table} r ON r.name = p_name;"
    )
}
