//! The database file a backend has open: opening a connection to it, and
//! noticing when its path no longer names the file that was opened.
//!
//! SQLite keeps using an open file after it was deleted or replaced: a
//! process would go on answering from its unlinked copy while others work
//! on the new file, and what it acknowledged would be lost with the copy
//! (outside testers: two processes gave different stock for one item after
//! the file was deleted under them). So the backend records the file's
//! identity (device and inode) when it opens it and compares the path's
//! before every call; once they differ it refuses every call for good.

use std::path::Path;

use rusqlite::{Connection, OpenFlags};

use super::{SqliteConfig, StoreError, unavailable};

/// A file's identity on its filesystem: what a delete and a re-create, or a
/// rename over the path, change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileId {
    device: u64,
    inode: u64,
}

impl FileId {
    /// The identity of the file at `path` now.
    pub(super) fn of(path: &Path) -> std::io::Result<FileId> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path)?;
        Ok(FileId {
            device: meta.dev(),
            inode: meta.ino(),
        })
    }
}

/// Why a backend whose file was opened as `opened` must stop, if `path`
/// names another file now (or none).
pub(super) fn moved(path: &Path, opened: FileId) -> Option<String> {
    let now = match FileId::of(path) {
        Ok(now) if now == opened => return None,
        Ok(_) => "was replaced by another file",
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "was deleted",
        Err(e) => return Some(format!("cannot be checked ({e})")),
    };
    Some(format!(
        "the database file {} {now} while this process had it open: what it holds now \
         is not what this process answered from, so it answers nothing more; restart it \
         to open the file now at that path",
        path.display()
    ))
}

/// A connection to the database `config` names, in WAL mode, with coord's
/// tables made if missing.
pub(super) fn connect(config: &SqliteConfig) -> Result<Connection, StoreError> {
    let connection = match &config.path {
        Some(path) => Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        ),
        None => Connection::open_in_memory(),
    }
    .map_err(|e| match &config.path {
        Some(path) => unavailable(format!("opening {}: {e}", path.display())),
        None => unavailable(e),
    })?;
    connection
        .busy_timeout(config.busy_timeout)
        .map_err(unavailable)?;
    if config.path.is_some() {
        // journal_mode answers with the mode it set: a row to read.
        let mode: String = connection
            .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
            .map_err(unavailable)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(unavailable(format!(
                "the database would not take WAL mode (it is in {mode})"
            )));
        }
    }
    // `coord_entries` holds the entries of the partitions that may hold
    // many, a row each (`rows.rs`).
    // `coord_probe` holds one row that the readiness probe rewrites: a
    // real write, so a file that takes no write is never called ready.
    connection
        .execute_batch(
            "PRAGMA synchronous = NORMAL;
             CREATE TABLE IF NOT EXISTS coord_partitions (
               name BLOB PRIMARY KEY,
               decided_at INTEGER NOT NULL,
               state BLOB NOT NULL,
               collect_at INTEGER
             );
             CREATE INDEX IF NOT EXISTS coord_partitions_collect_at
               ON coord_partitions (collect_at);
             CREATE TABLE IF NOT EXISTS coord_entries (
               partition BLOB NOT NULL,
               key BLOB NOT NULL,
               value BLOB NOT NULL,
               revision INTEGER NOT NULL,
               updated_at INTEGER NOT NULL,
               expires_at INTEGER,
               PRIMARY KEY (partition, key)
             ) WITHOUT ROWID;
             CREATE INDEX IF NOT EXISTS coord_entries_expiry
               ON coord_entries (partition, expires_at, key);
             CREATE TABLE IF NOT EXISTS coord_probe (
               id INTEGER PRIMARY KEY,
               probed_at INTEGER NOT NULL
             );",
        )
        .map_err(unavailable)?;
    Ok(connection)
}
