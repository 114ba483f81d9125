//! History store: every attributed step with its causes, collectives (and each rank's
//! arrival) and per-NIC windows, in SQLite (WAL) so `agent diagnose` can read the past and
//! a restarted agent neither loses nor double-counts a step.
//!
//! - [`schema`]: tables and migrations (`PRAGMA user_version`);
//! - `write`: [`Store::put_step`], one transaction per step, idempotent (UNIQUE keys with
//!   `ON CONFLICT DO UPDATE`);
//! - `read`: [`Store::steps`] and friends; rows read back are validated and a bad row is
//!   skipped and counted ([`Store::skipped_rows`]), never a panic;
//! - `retention`: [`Store::retention`] by age and by size.
//!
//! The API is synchronous: the daemon calls it from a blocking thread. A second `Store` on the
//! same file (another thread or process) reads while this one writes (WAL).

mod error;
pub mod health;
mod read;
mod retention;
pub mod schema;
mod write;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_io;

use std::{
    cell::Cell,
    path::{Path, PathBuf},
    time::Duration,
};

use rusqlite::{Connection, ErrorCode, OpenFlags};

pub use error::StoreError;
pub use health::Health;
pub use read::StepQuery;
pub use retention::RetentionReport;
pub use schema::SCHEMA_VERSION;

use error::sql;

/// How long a write waits for another writer (another agent process, a `diagnose` holding a
/// checkpoint) before failing with "database is locked".
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The history store (one SQLite connection).
pub struct Store {
    conn: Connection,
    path: PathBuf,
    /// Rows read back that failed validation (corrupt JSON, out-of-range values).
    skipped: Cell<u64>,
    /// Device and inode of the file when it was opened: [`Store::lost`] compares the path's.
    identity: Option<(u64, u64)>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).field("skipped", &self.skipped.get()).finish()
    }
}

impl Store {
    /// Opens (creating it and its directory, mode 0750, when missing) the store at `path`
    /// and migrates it to [`SCHEMA_VERSION`]. A file that is not SQLite, or whose schema is
    /// newer than this code, is a typed error and is left untouched.
    pub fn open(path: impl AsRef<Path>) -> Result<Store, StoreError> {
        let path = path.as_ref().to_path_buf();
        create_parent(&path)?;
        // SQLite would open a FIFO read-write and block in its first read of the header.
        if std::fs::metadata(&path).is_ok_and(|m| !m.file_type().is_file()) {
            return Err(StoreError::NotAFile { path });
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&path, flags).map_err(|source| StoreError::Open { path: path.clone(), source })?;
        // Before WAL mode: SQLite gives `-wal` and `-shm` the database file's mode.
        restrict_mode(&path);
        let mut store = Store::setup(conn, path, true)?;
        store.identity = identity(&store.path);
        Ok(store)
    }

    /// A store in memory (tests, `agent diagnose` over peers' data).
    pub fn open_in_memory() -> Result<Store, StoreError> {
        let path = PathBuf::from(":memory:");
        let conn = Connection::open_in_memory().map_err(|source| StoreError::Open { path: path.clone(), source })?;
        Store::setup(conn, path, false)
    }

    fn setup(mut conn: Connection, path: PathBuf, wal: bool) -> Result<Store, StoreError> {
        conn.busy_timeout(BUSY_TIMEOUT).map_err(sql(&path, "set busy timeout"))?;
        // The first read of the header: a file that is not SQLite fails here, before anything
        // is written to it.
        let version = schema::user_version(&conn).map_err(|source| classify_open(&path, source))?;
        if version > SCHEMA_VERSION {
            return Err(StoreError::TooNew { path, found: version, known: SCHEMA_VERSION });
        }
        if version == 0 && is_empty(&conn).map_err(|source| classify_open(&path, source))? {
            // Only takes effect before the first table exists; lets retention give pages
            // back to the file system with `incremental_vacuum`.
            conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL").map_err(sql(&path, "set auto_vacuum"))?;
        }
        if wal {
            let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0)).map_err(|source| classify_open(&path, source))?;
            if !mode.eq_ignore_ascii_case("wal") {
                tracing::warn!(path = %path.display(), mode, "history store is not in WAL mode: readers may wait for writers");
            }
        }
        // NORMAL is durable across process crashes in WAL mode; a power loss may lose the
        // last steps, which the agent re-attributes or simply misses.
        conn.execute_batch("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;").map_err(sql(&path, "set pragmas"))?;
        // Plans that do not depend on bound values: rusqlite clears a cached statement's
        // bindings when it returns to the cache, and SQLite then re-plans every `col = ?`
        // statement at its next use (a third of a read's time in the `store_rows` fuzz target).
        // The store's queries are keyed lookups whose best plan does not depend on the values.
        conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true).map_err(sql(&path, "set query planner stability"))?;
        schema::migrate(&mut conn, &path)?;
        Ok(Store { conn, path, skipped: Cell::new(0), identity: None })
    }

    /// The connection itself, for the `store_rows` fuzz target, which corrupts rows inside a
    /// transaction it then rolls back. Not an API.
    #[doc(hidden)]
    pub fn fuzzing_connection(&self) -> &Connection {
        &self.conn
    }

    /// The file this store lives in (`:memory:` for an in-memory store).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Why the path no longer names the file this store writes, if it does not: the file was
    /// deleted or replaced while open (a cleanup job, an operator), and every write since went
    /// to an unlinked inode nobody can read. The caller reopens ([`Store::open`] recreates the
    /// schema). `None` while the path still names the open file, and for an in-memory store.
    pub fn lost(&self) -> Option<String> {
        let opened = self.identity?;
        match identity(&self.path) {
            None => Some(format!("{} was deleted while open", self.path.display())),
            Some(now) if now != opened => Some(format!("{} was replaced by another file while open", self.path.display())),
            Some(_) => None,
        }
    }

    /// Rows skipped on read since this store was opened because they failed validation.
    pub fn skipped_rows(&self) -> u64 {
        self.skipped.get()
    }

    fn skip(&self, table: &'static str, id: i64, reason: &str) {
        self.skipped.set(self.skipped.get() + 1);
        tracing::warn!(path = %self.path.display(), table, id, reason, "skipping corrupt row of the history store");
    }

    /// Bytes the database occupies: `page_count × page_size` (the WAL not included).
    pub fn size_bytes(&self) -> Result<u64, StoreError> {
        let pages: i64 = self.conn.query_row("PRAGMA page_count", [], |r| r.get(0)).map_err(sql(&self.path, "read page_count"))?;
        Ok(pages.max(0) as u64 * self.page_size()?)
    }

    /// `PRAGMA integrity_check`: `["ok"]` when the database is intact, else SQLite's list of
    /// problems (at most 100).
    pub fn integrity_check(&self) -> Result<Vec<String>, StoreError> {
        let mut st = self.conn.prepare("PRAGMA integrity_check").map_err(sql(&self.path, "integrity_check"))?;
        let rows = st.query_map([], |r| r.get::<_, String>(0)).map_err(sql(&self.path, "integrity_check"))?;
        rows.collect::<Result<Vec<String>, _>>().map_err(sql(&self.path, "integrity_check"))
    }

    fn page_size(&self) -> Result<u64, StoreError> {
        let size: i64 = self.conn.query_row("PRAGMA page_size", [], |r| r.get(0)).map_err(sql(&self.path, "read page_size"))?;
        Ok(size.max(0) as u64)
    }
}

/// Device and inode of the file at `path` (`None` when nothing is there).
fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

fn is_empty(conn: &Connection) -> rusqlite::Result<bool> {
    conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get::<_, i64>(0)).map(|n| n == 0)
}

fn classify_open(path: &Path, source: rusqlite::Error) -> StoreError {
    match source.sqlite_error_code() {
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => StoreError::NotADatabase { path: path.to_path_buf(), source },
        _ => StoreError::Open { path: path.to_path_buf(), source },
    }
}

/// Creates the parent directory with mode 0750 (the history names hosts and jobs: not for
/// every local user) when it does not exist; an existing directory is left as it is.
fn create_parent(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) else { return Ok(()) };
    if dir.exists() {
        return Ok(());
    }
    let err = |source| StoreError::CreateDir { path: path.to_path_buf(), source };
    std::fs::DirBuilder::new().recursive(true).mode(0o750).create(dir).map_err(err)?;
    // The umask may have removed bits; the leaf gets exactly 0750.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o750)).map_err(err)
}

/// Takes every permission away from other users (the history names hosts, jobs and ranks;
/// docs/security.md): at most 0640 whatever the umask or an existing file said. Best effort:
/// a file this user does not own keeps its mode.
fn restrict_mode(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(m) = std::fs::metadata(path) else { return };
    let mode = m.permissions().mode();
    if m.is_file() && mode & 0o137 != 0 {
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o640));
    }
}

/// Wall-clock seconds since the epoch.
fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}
