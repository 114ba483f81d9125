//! Store on files: restarts, retention, migrations, foreign files, concurrent readers.

use std::{os::unix::fs::PermissionsExt, time::Duration};

use super::{tests::sample, *};
use crate::attribution::{Attribution, CauseKind};

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

fn file_bytes(p: &Path) -> u64 {
    let wal = PathBuf::from(format!("{}-wal", p.display()));
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0) + std::fs::metadata(wal).map(|m| m.len()).unwrap_or(0)
}

fn count(st: &Store, table: &str) -> i64 {
    st.conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0)).expect("count rows")
}

/// Rows whose step (or collective) is gone: must stay 0 after any delete.
fn orphans(st: &Store) -> i64 {
    st.conn
        .query_row(
            "SELECT (SELECT count(*) FROM causes WHERE step_ref NOT IN (SELECT id FROM steps))
                  + (SELECT count(*) FROM windows WHERE step_ref NOT IN (SELECT id FROM steps))
                  + (SELECT count(*) FROM collectives WHERE step_ref NOT IN (SELECT id FROM steps))
                  + (SELECT count(*) FROM arrivals a WHERE NOT EXISTS
                        (SELECT 1 FROM collectives c WHERE c.comm = a.comm AND c.seq = a.seq))",
            [],
            |r| r.get(0),
        )
        .expect("orphan count")
}

#[test]
fn open_creates_directory_0750_wal_and_schema() {
    let d = tmp();
    let path = d.path().join("lib/stepwise/agent.db");
    let st = Store::open(&path).expect("open");
    let mode = std::fs::metadata(path.parent().expect("parent")).expect("dir").permissions().mode() & 0o777;
    assert_eq!(mode, 0o750);
    let jm: String = st.conn.query_row("PRAGMA journal_mode", [], |r| r.get(0)).expect("journal_mode");
    assert_eq!(jm, "wal");
    let sync: i64 = st.conn.query_row("PRAGMA synchronous", [], |r| r.get(0)).expect("synchronous");
    assert_eq!(sync, 1, "NORMAL");
    let av: i64 = st.conn.query_row("PRAGMA auto_vacuum", [], |r| r.get(0)).expect("auto_vacuum");
    assert_eq!(av, 2, "INCREMENTAL");
    assert_eq!(schema::user_version(&st.conn).expect("version"), SCHEMA_VERSION);
    assert_eq!(st.path(), path.as_path());
    assert_eq!(crate::config::DEFAULT_DB_PATH, "/var/lib/stepwise/agent.db");
}

/// The history is not for every local user: an existing world-readable file is narrowed to
/// 0640 on open, and the WAL and shared-memory files SQLite creates follow it.
#[test]
fn the_database_and_its_wal_are_not_readable_by_others() {
    let d = tmp();
    let path = d.path().join("agent.db");
    std::fs::write(&path, b"").expect("empty file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let mut st = Store::open(&path).expect("open");
    let (a, c, w) = sample(1, 1.7e9, 0.0, 2, 1);
    st.put_step("job", &a, &c, &w).expect("put");
    for suffix in ["", "-wal", "-shm"] {
        let p = d.path().join(format!("agent.db{suffix}"));
        let mode = std::fs::metadata(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).permissions().mode() & 0o777;
        assert_eq!(mode & 0o137, 0, "{} is {mode:o}", p.display());
    }
}

#[test]
fn restart_keeps_everything_and_knows_the_last_step() {
    let d = tmp();
    let path = d.path().join("agent.db");
    let mut written = Vec::new();
    {
        let mut st = Store::open(&path).expect("open");
        assert_eq!(st.last_step_time("job").expect("last"), None);
        for i in 0..5 {
            let (a, c, w) = sample(i, 100.0 + i as f64, 0.0, 4, 2);
            st.put_step("job", &a, &c, &w).expect("put");
            written.push((a, c, w));
        }
    } // dropped: the agent stops.
    let mut st = Store::open(&path).expect("reopen");
    assert_eq!(st.count_steps().expect("count"), 5);
    let last = written.last().map(|(a, _, _)| a.end);
    assert_eq!(st.last_step_time("job").expect("last"), last);
    super::tests::assert_same(&st.steps(&StepQuery::default()).expect("steps"), &written.iter().map(|w| w.0.clone()).collect::<Vec<_>>());
    assert_eq!(st.collectives_of("job", 4).expect("colls"), written[4].1);
    assert_eq!(st.windows_of("job", 4).expect("windows"), written[4].2);
    // The restarted agent replays its last step: still 5.
    let (a, c, w) = &written[4];
    st.put_step("job", a, c, w).expect("replay");
    assert_eq!(st.count_steps().expect("count"), 5);
    assert_eq!(count(&st, "arrivals"), 5 * 2 * 4);
}

#[test]
fn retention_by_age_deletes_old_steps_and_their_rows() {
    let mut st = Store::open(tmp().path().join("a.db")).expect("open");
    let day = 86_400.0;
    for i in 0..10u64 {
        // Steps 0..5 are 3 days old, 5..10 one hour old.
        let begin = if i < 5 { 10.0 * day + i as f64 } else { 13.0 * day - 3600.0 + i as f64 };
        let (a, c, w) = sample(i, begin, 0.0, 4, 2);
        st.put_step("job", &a, &c, &w).expect("put");
    }
    let r = st.retention_at(13.0 * day, Duration::from_secs(2 * 86_400), u64::MAX).expect("retention");
    assert_eq!((r.deleted_by_age, r.deleted_by_size, r.steps_left), (5, 0, 5));
    let left: Vec<u64> = st.steps(&StepQuery::default()).expect("steps").iter().map(|a| a.step).collect();
    assert_eq!(left, vec![5, 6, 7, 8, 9]);
    assert!(st.collectives_of("job", 0).expect("colls").is_empty() && st.windows_of("job", 0).expect("w").is_empty());
    assert_eq!(count(&st, "arrivals"), 5 * 2 * 4, "arrivals of deleted collectives are gone");
    assert_eq!(count(&st, "causes"), 5 * CauseKind::ALL.len() as i64);
    assert_eq!(orphans(&st), 0);
}

#[test]
fn retention_deletes_in_batches_until_done() {
    let mut st = Store::open(tmp().path().join("b.db")).expect("open");
    let (a, _, _) = sample(0, 0.0, 0.0, 2, 1);
    for i in 0..2500u64 {
        let b = Attribution { step: i, begin: 100.0 + i as f64, end: 100.5 + i as f64, ..a.clone() };
        st.put_step("job", &b, &[], &[]).expect("put");
    }
    let r = st.retention_at(2100.0, Duration::from_secs(10), u64::MAX).expect("retention");
    assert_eq!((r.deleted_by_age, r.steps_left), (1990, 510), "{r:?}");
}

#[test]
fn retention_by_size_deletes_the_oldest_and_shrinks_the_file() {
    let d = tmp();
    let path = d.path().join("s.db");
    let mut st = Store::open(&path).expect("open");
    for i in 0..300u64 {
        let (a, c, w) = sample(i, 1000.0 + i as f64, 0.001 * (i % 7) as f64, 8, 6);
        st.put_step("job", &a, &c, &w).expect("put");
    }
    st.checkpoint().expect("checkpoint");
    let full = st.size_bytes().expect("size");
    let file_full = file_bytes(&path);
    let budget = full / 3;
    let r = st.retention(Duration::from_secs(u64::MAX / 4), budget).expect("retention");
    assert_eq!(r.deleted_by_age, 0, "nothing is old: {r:?}");
    assert!(r.deleted_by_size > 150 && r.steps_left + r.deleted_by_size == 300, "{r:?}");
    assert!(r.bytes_after <= budget && r.bytes_after < r.bytes_before, "{r:?} budget {budget}");
    assert!(st.size_bytes().expect("size") <= budget);
    let file_after = file_bytes(&path);
    assert!(file_after < file_full / 2, "file shrank: {file_full} → {file_after}");
    // The oldest went; the newest stay, with their rows.
    let left: Vec<u64> = st.steps(&StepQuery::default()).expect("steps").iter().map(|a| a.step).collect();
    assert_eq!(left.first().copied(), Some(300 - r.steps_left));
    assert_eq!(left.last().copied(), Some(299));
    assert_eq!(st.collectives_of("job", 299).expect("colls").len(), 6);
    assert_eq!(orphans(&st), 0);
    // A budget below the empty schema deletes everything and stops.
    let r = st.retention(Duration::from_secs(3600 * 24 * 365 * 1000), 1).expect("retention");
    assert_eq!(r.steps_left, 0);
    assert_eq!(count(&st, "arrivals") + count(&st, "windows") + count(&st, "causes"), 0);
}

#[test]
fn migrates_an_empty_database_and_refuses_a_newer_one() {
    let d = tmp();
    let path = d.path().join("m.db");
    // An empty SQLite file made by someone else (version 0, no tables).
    drop(rusqlite::Connection::open(&path).expect("plain sqlite"));
    let st = Store::open(&path).expect("migrate from empty");
    assert_eq!(schema::user_version(&st.conn).expect("v"), SCHEMA_VERSION);
    drop(st);
    Store::open(&path).expect("reopen is a no-op migration");

    let newer = SCHEMA_VERSION + 1;
    {
        let c = rusqlite::Connection::open(&path).expect("raw");
        c.execute_batch(&format!("PRAGMA user_version = {newer}")).expect("bump");
    }
    let before = std::fs::read(&path).expect("read db");
    match Store::open(&path) {
        Err(e @ StoreError::TooNew { found, known, .. }) => {
            assert_eq!((found, known), (newer, SCHEMA_VERSION));
            let msg = e.to_string();
            assert!(msg.contains("m.db") && msg.contains("upgrade the agent"), "{msg}");
        }
        other => panic!("expected TooNew, got {other:?}"),
    }
    assert_eq!(std::fs::read(&path).expect("read db"), before, "refused file untouched");
}

#[test]
fn a_file_that_is_not_sqlite_is_a_typed_error() {
    let d = tmp();
    let path = d.path().join("garbage.db");
    let junk: Vec<u8> = (0..8192u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(&path, &junk).expect("write junk");
    match Store::open(&path) {
        Err(e @ StoreError::NotADatabase { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("garbage.db") && msg.contains("not an SQLite database"), "{msg}");
            assert!(std::error::Error::source(&e).is_some(), "sqlite error kept as source");
        }
        other => panic!("expected NotADatabase, got {other:?}"),
    }
    assert_eq!(std::fs::read(&path).expect("junk"), junk, "left untouched");

    // A directory where the file should be, or a parent that cannot be created.
    let e = Store::open(d.path()).expect_err("a directory");
    assert!(e.to_string().contains("set [store] path"), "{e}");
    std::fs::write(d.path().join("file"), b"x").expect("file");
    let e = Store::open(d.path().join("file/sub/agent.db")).expect_err("parent is a file");
    assert!(matches!(e, StoreError::CreateDir { .. }) && e.to_string().contains("mount a writable volume"), "{e}");
}

#[test]
fn a_reader_sees_committed_steps_while_a_writer_works() {
    let d = tmp();
    let path = d.path().join("c.db");
    let mut w = Store::open(&path).expect("writer");
    let (a, c, win) = sample(0, 10.0, 0.0, 4, 2);
    w.put_step("job", &a, &c, &win).expect("put");

    let r = Store::open(&path).expect("reader");
    // The writer holds an open write transaction: the reader is not blocked and sees the
    // last committed state (WAL).
    w.conn.execute_batch("BEGIN IMMEDIATE; DELETE FROM steps;").expect("uncommitted delete");
    assert_eq!(r.count_steps().expect("read during write"), 1);
    assert_eq!(r.steps(&StepQuery::default()).expect("steps").len(), 1);
    w.conn.execute_batch("ROLLBACK").expect("rollback");

    // A writer thread and a reader thread on the same file.
    let writer = std::thread::spawn(move || {
        for i in 1..=100u64 {
            let (a, c, win) = sample(i, 10.0 + i as f64, 0.0, 4, 2);
            w.put_step("job", &a, &c, &win).expect("concurrent put");
        }
    });
    let mut seen = 0;
    while seen < 101 && !writer.is_finished() {
        let n = r.count_steps().expect("concurrent count");
        assert!(n >= seen, "count never goes back: {n} < {seen}");
        let got = r.steps(&StepQuery { slowest: Some(3), ..Default::default() }).expect("concurrent query");
        assert!(!got.is_empty());
        seen = n;
    }
    writer.join().expect("writer thread");
    assert_eq!(r.count_steps().expect("final count"), 101);
    assert_eq!(r.skipped_rows(), 0);
}
