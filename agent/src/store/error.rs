//! Errors of the history store. Every message names the file and says what to do.

use std::path::PathBuf;

/// What can go wrong opening, writing or reading the history store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create the directory of history store {path}: {source} (set [store] path or mount a writable volume)")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open history store {path}: {source} (set [store] path or mount a writable volume)")]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("history store {path} is not a regular file (a FIFO, device or directory would block or fail every write; set [store] path to a file)")]
    NotAFile { path: PathBuf },
    #[error("history store {path} is not an SQLite database: {source} (move the file away or set [store] path to another file)")]
    NotADatabase {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "history store {path} has schema version {found}, newer than this agent knows ({known}); \
         the file was left untouched (upgrade the agent or set [store] path to another file)"
    )]
    TooNew { path: PathBuf, found: i64, known: i64 },
    #[error("cannot migrate history store {path} from schema version {from} to {to}: {source}")]
    Migrate {
        path: PathBuf,
        from: i64,
        to: i64,
        #[source]
        source: rusqlite::Error,
    },
    #[error("history store {path}: {op} failed: {source}")]
    Sqlite {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: rusqlite::Error,
    },
    #[error("cannot store step {step}: {field} is {value}, not a finite number (an attribution bug; the step was not written)")]
    NotFinite { step: u64, field: &'static str, value: f64 },
    #[error("cannot store step {step}: {field} = {value} does not fit SQLite's signed 64-bit integers")]
    OutOfRange { step: u64, field: &'static str, value: u64 },
    #[error("cannot encode step {step} as JSON: {source}")]
    Encode {
        step: u64,
        #[source]
        source: serde_json::Error,
    },
}

/// Maps a sqlite error of operation `op` on the store at `path`.
pub(crate) fn sql<'a>(path: &'a std::path::Path, op: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError + 'a {
    move |source| StoreError::Sqlite { path: path.to_path_buf(), op, source }
}
