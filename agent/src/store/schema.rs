//! Schema and migrations. `PRAGMA user_version` is the schema version; `MIGRATIONS[i]`
//! takes a database from version `i` to `i + 1`. Steps are only ever appended: a released
//! step's SQL never changes (a fix is a new step), so every database reaches the same shape.

use std::path::Path;

use rusqlite::{Connection, TransactionBehavior};

use super::error::{sql, StoreError};

/// Version 1: steps with their attribution, causes by kind, collectives with arrivals, and
/// per-NIC windows. Idempotent writes rely on the UNIQUE keys; deleting a step cascades to
/// its rows (foreign_keys is on for every connection).
const V1: &str = "
CREATE TABLE steps (
    id          INTEGER PRIMARY KEY,
    job_key     TEXT    NOT NULL,
    step_id     INTEGER NOT NULL,
    begin       REAL    NOT NULL,
    end         REAL    NOT NULL,
    seconds     REAL    NOT NULL,
    source      TEXT,
    incomplete  INTEGER NOT NULL,
    collectives INTEGER NOT NULL,
    attribution TEXT    NOT NULL,
    stored_at   REAL    NOT NULL,
    UNIQUE (job_key, step_id, begin)
);
CREATE INDEX steps_begin ON steps (begin);
CREATE INDEX steps_job_begin ON steps (job_key, begin);
CREATE INDEX steps_seconds ON steps (seconds);

CREATE TABLE causes (
    step_ref INTEGER NOT NULL REFERENCES steps (id) ON DELETE CASCADE,
    idx      INTEGER NOT NULL,
    kind     TEXT    NOT NULL,
    seconds  REAL,
    share    REAL,
    rank     INTEGER,
    evidence TEXT    NOT NULL,
    fix      TEXT    NOT NULL,
    PRIMARY KEY (step_ref, idx)
) WITHOUT ROWID;
CREATE INDEX causes_kind ON causes (kind, seconds);

CREATE TABLE collectives (
    id            INTEGER PRIMARY KEY,
    step_ref      INTEGER NOT NULL REFERENCES steps (id) ON DELETE CASCADE,
    comm          TEXT    NOT NULL,
    seq           INTEGER NOT NULL,
    op            TEXT    NOT NULL,
    library       TEXT    NOT NULL,
    bytes         INTEGER,
    nranks        INTEGER,
    first_arrival REAL,
    last_arrival  REAL,
    last_exit     REAL,
    skew          REAL,
    late_rank     INTEGER,
    UNIQUE (comm, seq)
);
CREATE INDEX collectives_step ON collectives (step_ref);

CREATE TABLE arrivals (
    comm    TEXT    NOT NULL,
    seq     INTEGER NOT NULL,
    rank    INTEGER NOT NULL,
    host    TEXT    NOT NULL,
    pid     INTEGER NOT NULL,
    enter   REAL,
    exit    REAL,
    aborted INTEGER NOT NULL,
    PRIMARY KEY (comm, seq, rank),
    FOREIGN KEY (comm, seq) REFERENCES collectives (comm, seq) ON DELETE CASCADE
) WITHOUT ROWID;

CREATE TABLE windows (
    step_ref          INTEGER NOT NULL REFERENCES steps (id) ON DELETE CASCADE,
    idx               INTEGER NOT NULL,
    nic               TEXT    NOT NULL,
    host              TEXT,
    rail              INTEGER,
    rate_bytes_per_second REAL,
    tx_bytes          REAL,
    rx_bytes          REAL,
    pause_seconds     REAL,
    pause_frames      REAL,
    ecn_marked        REAL,
    cnp_sent          REAL,
    cnp_handled       REAL,
    xmit_wait_ticks   REAL,
    retransmits       REAL,
    drops             REAL,
    max_backlog_bytes REAL,
    PRIMARY KEY (step_ref, idx)
) WITHOUT ROWID;
";

/// Every migration step, in order.
pub(crate) const MIGRATIONS: &[&str] = &[V1];

/// The schema version this code writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

pub(crate) fn user_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
}

/// Brings the database to [`SCHEMA_VERSION`], each step and its version bump in one
/// transaction. The version is read again under the write lock, so two agents opening the
/// same file at once do not both migrate.
pub(crate) fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(sql(path, "begin migration"))?;
    let from = user_version(&tx).map_err(|source| StoreError::NotADatabase { path: path.to_path_buf(), source })?;
    if from > SCHEMA_VERSION {
        return Err(StoreError::TooNew { path: path.to_path_buf(), found: from, known: SCHEMA_VERSION });
    }
    // `from` is in 0..=len here.
    for (i, step) in MIGRATIONS.iter().enumerate().skip(from.max(0) as usize) {
        let to = i as i64 + 1;
        let err = |source| StoreError::Migrate { path: path.to_path_buf(), from: i as i64, to, source };
        tx.execute_batch(step).map_err(err)?;
        // PRAGMA takes no bound parameters; `to` is our own integer.
        tx.execute_batch(&format!("PRAGMA user_version = {to}")).map_err(err)?;
    }
    tx.commit().map_err(sql(path, "commit migration"))
}
