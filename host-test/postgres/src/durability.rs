//! How a write's commit waits, and who may change it.
//!
//! **Durable** (the default): a write is answered once PostgreSQL has
//! committed it as the session's `synchronous_commit` says (`on`: flushed to
//! this server's disk; `remote_apply`: applied on the synchronous standbys
//! too). **Relaxed**: coord's own write transactions run with
//! `synchronous_commit = off`, so a commit is answered before its WAL is
//! flushed; a crash of the server (not of PostgreSQL's processes alone:
//! the operating system or the machine) loses the writes of about the last
//! `3 × wal_writer_delay` (600 ms by default), and a synchronous standby is
//! not waited for. The setting is `SET LOCAL`'s (set inside the write's own
//! transaction, by the write function itself), so it never reaches another
//! statement on a pooled connection: pooler-safe, and no extra round trip.
//!
//! Every process on a table relies on its durability: an acknowledged
//! acquisition survives a crash only while every writer commits durably. So
//! the mode is the table's, kept in `<table>_settings` and read by every
//! write, never one process's: a process that asks for relaxed
//! commits on a durable table keeps it durable unless it also says
//! [`PostgresConfig::allow_relaxed`] (a second, explicit word, as
//! `--allow-fewer-replicas` is on NATS); asking for durable always raises
//! it; a new table gets what its first process asked for. What differs
//! from what was asked, or from what the table had when this process
//! started, is logged and reported by `warnings` (so by `/readyz` and the
//! metrics), re-checked at every readiness probe.

use std::fmt;
use std::str::FromStr;

use coord_host::backend::StoreError;
use tokio_postgres::types::Type;

use super::{PostgresBackend, PostgresConfig, refused, unavailable};

/// How a write's commit waits (see the module's documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Answered once committed as the server's `synchronous_commit` says.
    Durable,
    /// Answered before the commit reaches the disk (`synchronous_commit =
    /// off` for coord's writes): a server crash loses the last moments'.
    Relaxed,
}

impl Durability {
    /// The word the settings table keeps.
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Durable => "durable",
            Durability::Relaxed => "relaxed",
        }
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Durability {
    type Err = String;

    fn from_str(word: &str) -> Result<Self, String> {
        match word {
            "durable" => Ok(Durability::Durable),
            "relaxed" => Ok(Durability::Relaxed),
            other => Err(format!(
                "durability: {other:?} is neither \"durable\" nor \"relaxed\""
            )),
        }
    }
}

/// The mode to give a table that has `have`, if it is to change: only
/// what was asked for, and relaxed only when allowed to.
fn to_set(config: &PostgresConfig, have: Durability) -> Option<Durability> {
    let asked = config.durability?;
    let raise = asked == Durability::Durable && have == Durability::Relaxed;
    let lower = asked == Durability::Relaxed && have == Durability::Durable && config.allow_relaxed;
    (raise || lower).then_some(asked)
}

/// The expression every write runs first (`write_function.rs`): it sets
/// `synchronous_commit` for the rest of its own transaction from the
/// table's mode (`off` when relaxed; else the session's own value, so a
/// server's `remote_apply` stays).
pub(super) fn commit_setting(table: &str) -> String {
    format!(
        "set_config('synchronous_commit', coalesce((SELECT 'off' FROM {table}_settings \
         WHERE durability = 'relaxed'), current_setting('synchronous_commit')), true)"
    )
}

/// The mode of `table`, read through `client`.
async fn read_durability(
    client: &deadpool_postgres::Object,
    table: &str,
) -> Result<Durability, StoreError> {
    let rows = client
        .query_typed(&format!("SELECT durability FROM {table}_settings"), &[])
        .await
        .map_err(refused)?;
    // A settings row deleted by hand: writes commit durably.
    let Some(row) = rows.first() else {
        return Ok(Durability::Durable);
    };
    let word: String = row.try_get(0).map_err(unavailable)?;
    word.parse().map_err(unavailable)
}

impl PostgresBackend {
    /// The settings table, made if missing, with the mode a new table gets
    /// (what was asked, else durable); then the asked mode applied where
    /// [`to_set`] allows. Records the mode this process relies on.
    pub(super) async fn settle_durability(&self) -> Result<(), StoreError> {
        let t = &self.config.table;
        let asked = self.config.durability.unwrap_or(Durability::Durable);
        let client = self.client().await?;
        client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {t}_settings (
                   one boolean PRIMARY KEY DEFAULT true CHECK (one),
                   durability text NOT NULL CHECK (durability IN ('durable', 'relaxed'))
                 )"
            ))
            .await
            .map_err(refused)?;
        client
            .query_typed(
                &format!(
                    "INSERT INTO {t}_settings (durability) VALUES ($1) ON CONFLICT DO NOTHING"
                ),
                &[(&asked.as_str(), Type::TEXT)],
            )
            .await
            .map_err(refused)?;
        let have = read_durability(&client, t).await?;
        let now = match to_set(&self.config, have) {
            Some(set) => {
                client
                    .query_typed(
                        &format!("UPDATE {t}_settings SET durability = $1"),
                        &[(&set.as_str(), Type::TEXT)],
                    )
                    .await
                    .map_err(refused)?;
                tracing::info!("table {t}: commits are {set} now (they were {have})");
                set
            }
            None => have,
        };
        if let Ok(mut relied_on) = self.relied_on_durability.lock() {
            *relied_on = Some(now);
        }
        self.check_durability(now);
        for warning in self.warnings() {
            tracing::warn!("{warning}");
        }
        Ok(())
    }

    /// The table's mode as it is now.
    pub(super) async fn table_durability(&self) -> Result<Durability, StoreError> {
        let client = self.client().await?;
        read_durability(&client, &self.config.table).await
    }

    /// Record what is wrong with a table whose commits are `have` now.
    pub(super) fn check_durability(&self, have: Durability) {
        let t = &self.config.table;
        let relied_on = self.relied_on_durability.lock().ok().and_then(|r| *r);
        let mut warnings = Vec::new();
        if have == Durability::Relaxed
            && relied_on == Some(Durability::Durable)
            && !self.config.allow_relaxed
        {
            warnings.push(format!(
                "the table {t} commits relaxed, though it was durable when this process \
                 started: another process relaxed it (a server crash now loses the last \
                 moments' acquisitions)"
            ));
        }
        if self.config.durability == Some(Durability::Relaxed)
            && have == Durability::Durable
            && !self.config.allow_relaxed
        {
            warnings.push(format!(
                "relaxed commits were asked for (--postgres-durability relaxed) and the table \
                 {t} is durable: kept durable, since relaxing it needs a second explicit word \
                 (--allow-relaxed-durability)"
            ));
        }
        if let Ok(mut kept) = self.durability_warnings.lock() {
            *kept = warnings;
        }
    }

    /// The table's durability when this process connected (after its own
    /// setting applied).
    pub fn durability(&self) -> Durability {
        self.relied_on_durability
            .lock()
            .ok()
            .and_then(|r| *r)
            .unwrap_or(Durability::Durable)
    }

    /// What is wrong with the table's durability, as last checked.
    pub fn warnings(&self) -> Vec<String> {
        self.durability_warnings
            .lock()
            .map(|w| w.clone())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(asked: Option<Durability>, allow_relaxed: bool) -> PostgresConfig {
        PostgresConfig {
            durability: asked,
            allow_relaxed,
            ..PostgresConfig::new("postgres://localhost/x")
        }
    }

    #[test]
    fn only_an_explicit_second_word_relaxes_a_durable_table() {
        use Durability::*;
        assert_eq!(to_set(&config(None, false), Relaxed), None);
        assert_eq!(to_set(&config(None, false), Durable), None);
        assert_eq!(to_set(&config(Some(Relaxed), false), Durable), None);
        assert_eq!(to_set(&config(Some(Relaxed), true), Durable), Some(Relaxed));
        assert_eq!(
            to_set(&config(Some(Durable), false), Relaxed),
            Some(Durable)
        );
        assert_eq!(to_set(&config(Some(Durable), false), Durable), None);
        assert_eq!(to_set(&config(Some(Relaxed), true), Relaxed), None);
    }

    #[test]
    fn the_word_round_trips_and_a_wrong_one_names_the_field() {
        for mode in [Durability::Durable, Durability::Relaxed] {
            assert_eq!(mode.as_str().parse::<Durability>(), Ok(mode));
        }
        let error = "fast".parse::<Durability>().unwrap_err();
        assert!(error.starts_with("durability:"), "{error}");
    }
}
