//! SQLite rows read back: the history file is on a host volume that anything with write
//! access (a bug, a second agent of another version, a person with `sqlite3`) may change.
//! Each input overwrites columns of real-shaped rows with any value — NULL, any integer, any
//! float bit pattern, text that is not UTF-8, blobs, or the stored JSON with a piece spliced
//! in — with the constraints the agent relies on switched off, and every query of the store
//! must then return rows that validate, skip the bad ones, or return a typed error. Never a
//! panic. The corruption is rolled back after each input (a savepoint), or, when the input
//! asks for a retention pass, committed and the rows as written restored.
//!
//! Speed: the database is opened once per process, and `foreign_keys` stays off between
//! inputs — it only matters to writes (the corrupting UPDATEs want it off; retention's
//! cascades and the restore want it on, and get it: one toggle each way per retention).
//! Every `PRAGMA foreign_keys` expires all prepared statements, and SQLite re-parses them at
//! their next use. The corrupting UPDATEs stay prepared too (the statement cache holds them).
#![no_main]

use std::{cell::RefCell, collections::BTreeMap, time::Duration};

use libfuzzer_sys::fuzz_target;
use rusqlite::{config::DbConfig, params, types::Value};
use stepwise::{
    attribution::{attribute, Attribution, Params, StepData},
    store::{StepQuery, Store},
    timeline::{windows::NicInfo, Arrival, Collective, NicWindow, Step, StepSource},
};

/// (table, column, key column): every column of schema v1.
const COLUMNS: &[(&str, &str, &str)] = &[
    ("steps", "job_key", "id"),
    ("steps", "step_id", "id"),
    ("steps", "begin", "id"),
    ("steps", "end", "id"),
    ("steps", "seconds", "id"),
    ("steps", "source", "id"),
    ("steps", "incomplete", "id"),
    ("steps", "collectives", "id"),
    ("steps", "attribution", "id"),
    ("steps", "stored_at", "id"),
    ("steps", "id", "id"),
    ("causes", "step_ref", "idx"),
    ("causes", "idx", "idx"),
    ("causes", "kind", "idx"),
    ("causes", "seconds", "idx"),
    ("causes", "share", "idx"),
    ("causes", "rank", "idx"),
    ("causes", "evidence", "idx"),
    ("causes", "fix", "idx"),
    ("collectives", "id", "id"),
    ("collectives", "step_ref", "id"),
    ("collectives", "comm", "id"),
    ("collectives", "seq", "id"),
    ("collectives", "op", "id"),
    ("collectives", "library", "id"),
    ("collectives", "bytes", "id"),
    ("collectives", "nranks", "id"),
    ("collectives", "first_arrival", "id"),
    ("collectives", "last_arrival", "id"),
    ("collectives", "last_exit", "id"),
    ("collectives", "skew", "id"),
    ("collectives", "late_rank", "id"),
    ("arrivals", "comm", "rank"),
    ("arrivals", "seq", "rank"),
    ("arrivals", "rank", "rank"),
    ("arrivals", "host", "rank"),
    ("arrivals", "pid", "rank"),
    ("arrivals", "enter", "rank"),
    ("arrivals", "exit", "rank"),
    ("arrivals", "aborted", "rank"),
    ("windows", "step_ref", "idx"),
    ("windows", "idx", "idx"),
    ("windows", "nic", "idx"),
    ("windows", "host", "idx"),
    ("windows", "rail", "idx"),
    ("windows", "rate_bytes_per_second", "idx"),
    ("windows", "tx_bytes", "idx"),
    ("windows", "rx_bytes", "idx"),
    ("windows", "pause_seconds", "idx"),
    ("windows", "pause_frames", "idx"),
    ("windows", "ecn_marked", "idx"),
    ("windows", "cnp_sent", "idx"),
    ("windows", "cnp_handled", "idx"),
    ("windows", "xmit_wait_ticks", "idx"),
    ("windows", "retransmits", "idx"),
    ("windows", "drops", "idx"),
    ("windows", "max_backlog_bytes", "idx"),
];

/// A step as the store tests make it: 4 ranks on two hosts, the last one late, 4 NICs.
fn sample(step: u64, begin: f64, ncoll: usize) -> (Attribution, Vec<Collective>, Vec<NicWindow>) {
    let mut colls = Vec::new();
    let mut t = begin + 0.020;
    for i in 0..ncoll {
        let late = if i == 0 { 0.03 } else { 0.0 };
        let arrivals = (0..4u32)
            .map(|r| Arrival {
                rank: r,
                host: format!("host{}", r % 2),
                pid: 1000 + r,
                enter: if r == 3 { t + late } else { t },
                exit: t + late + 0.002,
                aborted: false,
                clock: Default::default(),
            })
            .collect();
        colls.push(Collective {
            comm: "comm-a".into(),
            seq: step * 1000 + i as u64,
            op: "all_reduce".into(),
            library: "nccl".into(),
            bytes: Some(64 << 20),
            nranks: Some(4),
            arrivals,
        });
        t += late + 0.003;
    }
    let windows: Vec<NicWindow> = (0..4u32)
        .map(|n| NicWindow {
            nic: NicInfo { name: format!("mlx5_{n}"), host: Some("host0".into()), rail: Some(n), rate_bytes_per_second: Some(50e9) },
            tx_bytes: 16e6 * f64::from(n + 1),
            rx_bytes: 16e6,
            pause_seconds: 1e-4 * f64::from(n),
            pause_frames: 3.0,
            ecn_marked: 7.0,
            cnp_sent: 2.0,
            cnp_handled: 1.0,
            xmit_wait_ticks: 1234.0,
            retransmits: 1.0,
            drops: 0.0,
            max_backlog_bytes: 4096.0,
            tcp: Default::default(),
            own_tx: None,
            opaque_tx_bytes: 0.0,
        })
        .collect();
    let s = Step { id: step, begin, end: t + 0.005, source: StepSource::Markers, ranks: BTreeMap::new() };
    let refs: Vec<&Collective> = colls.iter().collect();
    let per: Vec<Vec<NicWindow>> = colls.iter().map(|_| windows.clone()).collect();
    let att = attribute(&StepData { step: &s, collectives: &refs, windows: &per, net: &[], same_host: &[], dropped_events: false }, &Params::default());
    (att, colls, windows)
}

struct Db {
    _dir: tempfile::TempDir,
    store: Store,
    json: Vec<String>,
}

/// The store's tables, parents first.
const TABLES: [&str; 5] = ["steps", "causes", "collectives", "arrivals", "windows"];

impl Db {
    fn new() -> Db {
        let base = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" };
        let dir = tempfile::Builder::new().prefix("stepwise-fuzz-store-").tempdir_in(base).expect("tmp");
        let mut store = Store::open(dir.path().join("agent.db")).expect("store");
        let steps = [sample(1, 1.7e9, 2), sample(2, 1.7e9 + 1.0, 1)];
        let json = steps.iter().map(|(a, ..)| serde_json::to_string(a).expect("json")).collect();
        for (a, col, w) in &steps {
            store.put_step("job", a, col, w).expect("put_step");
        }
        let conn = store.fuzzing_connection();
        // The rows as the agent wrote them, kept in TEMP tables of the same connection:
        // `restore` copies them back after a retention pass.
        for t in TABLES {
            conn.execute_batch(&format!("CREATE TEMP TABLE pristine_{t} AS SELECT * FROM main.{t}")).expect("copy");
        }
        // The store's own statements plus one UPDATE per (column, cast): all stay prepared.
        conn.set_prepared_statement_cache_capacity(256);
        // Plans that do not depend on bound values. Otherwise every `col = ?` statement is
        // re-parsed at its next use: rusqlite clears a statement's bindings when it goes back
        // to the cache, and SQLite then re-plans it (a third of the time per input).
        // Results do not depend on the plan; the store's code runs unchanged.
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true).expect("qpsg");
        let db = Db { _dir: dir, store, json };
        let count =
            |c: &rusqlite::Connection| TABLES.map(|t| c.query_row(&format!("SELECT count(*) FROM main.{t}"), [], |r| r.get::<_, i64>(0)).expect("count"));
        let written = count(db.store.fuzzing_connection());
        db.restore();
        assert_eq!(count(db.store.fuzzing_connection()), written, "restore copies every row back");
        db.store.fuzzing_connection().execute_batch("PRAGMA foreign_keys = OFF").expect("fk off");
        db
    }

    /// Deletes every row (children first) and copies the rows the agent wrote back (after a
    /// committed corruption and a retention pass): the same rows as writing the steps again
    /// with `put_step`, without re-running the writer (the cost of a whole input).
    /// `foreign_keys` is on here, as when the agent writes.
    fn restore(&self) {
        let c = self.store.fuzzing_connection();
        let mut sql = String::new();
        for t in TABLES.iter().rev() {
            sql += &format!("DELETE FROM main.{t};");
        }
        for t in TABLES {
            sql += &format!("INSERT INTO main.{t} SELECT * FROM temp.pristine_{t};");
        }
        c.execute_batch(&sql).expect("restore");
    }
}

thread_local! {
    static DB: RefCell<Option<Db>> = const { RefCell::new(None) };
}

fn splice(orig: &str, at: usize, cut: usize, with: &[u8]) -> Vec<u8> {
    let b = orig.as_bytes();
    let at = at % (b.len() + 1);
    let end = (at + cut).min(b.len());
    [&b[..at], with, &b[end..]].concat()
}

fn check(a: &Attribution) {
    assert!(a.begin.is_finite() && a.end.is_finite() && a.seconds.is_finite(), "{a:?}");
    assert!(a.causes.iter().all(|c| c.seconds.is_finite() && c.share.is_finite()), "{a:?}");
    assert!(a.ranks.iter().all(|r| r.late_seconds.is_finite() && r.wait_seconds.is_finite() && r.inside_seconds.is_finite()), "{a:?}");
}

fuzz_target!(|data: &[u8]| {
    DB.with(|cell| {
        let mut slot = cell.borrow_mut();
        let db = slot.get_or_insert_with(Db::new);
        let retention = data.chunks(4).any(|c| c.first() == Some(&0xff));
        let conn = db.store.fuzzing_connection();
        // A writer that ignores the constraints: `foreign_keys` is off here (see `Db::new`;
        // it only changes outside a transaction, and only writes depend on it).
        if !retention {
            conn.execute_batch("SAVEPOINT fuzz").expect("savepoint");
        }
        let mut rest = data;
        while let [sel, kind, key, len, tail @ ..] = rest {
            let n = usize::from(*len).min(tail.len());
            let (bytes, next) = tail.split_at(n);
            rest = next;
            if *sel == 0xff {
                continue;
            }
            let (table, column, key_col) = COLUMNS[usize::from(*sel) % COLUMNS.len()];
            let mut word = [0u8; 8];
            word[..n.min(8)].copy_from_slice(&bytes[..n.min(8)]);
            let value = match kind % 7 {
                0 => Value::Null,
                1 => Value::Integer(i64::from_le_bytes(word)),
                2 => Value::Real(f64::from_bits(u64::from_le_bytes(word))),
                3 | 4 => Value::Blob(bytes.to_vec()),
                // The stored JSON with a piece replaced: nearly valid, so validation runs deep.
                _ => {
                    let j = &db.json[usize::from(*key) % db.json.len()];
                    Value::Blob(splice(j, usize::from(u16::from_le_bytes([word[0], word[1]])), usize::from(word[2] % 16), bytes.get(3..).unwrap_or_default()))
                }
            };
            // Text that is not UTF-8: SQLite keeps the bytes of a blob cast to TEXT.
            let expr = if matches!(kind % 7, 3 | 5 | 6) { "CAST(?1 AS TEXT)" } else { "?1" };
            let column = match (kind % 7 >= 5, table) {
                (true, "steps") => "attribution",
                (true, "causes") => "evidence",
                _ => column,
            };
            if let Ok(mut st) = conn.prepare_cached(&format!("UPDATE {table} SET {column} = {expr} WHERE {key_col} = ?2")) {
                let _ = st.execute(params![value, i64::from(*key % 8)]);
            }
        }

        // One query per input (each parses every selected row's JSON; all four would
        // quarter the rate), chosen by the input's length.
        let q = match data.len() % 4 {
            0 => StepQuery::default(),
            1 => StepQuery { slowest: Some(3), ..Default::default() },
            2 => StepQuery { limit: Some(1), job_key: Some("job".into()), ..Default::default() },
            _ => StepQuery { step: Some(1), since: Some(0.0), ..Default::default() },
        };
        if let Ok(steps) = db.store.steps(&q) {
            for a in &steps {
                check(a);
                let _ = db.store.collectives_of_step(a);
            }
        }
        let step = [1, 2, u64::MAX][data.len() % 3];
        if let Ok(cs) = db.store.collectives_of("job", step) {
            for c in &cs {
                let _ = (c.skew(), c.late_rank(), c.transfer(), c.complete());
            }
        }
        let _ = db.store.windows_of("job", step);
        let _ = (db.store.count_steps(), db.store.last_step_time("job"), db.store.size_bytes());
        if retention {
            conn.execute_batch("PRAGMA foreign_keys = ON").expect("fk on");
            let _ = db.store.retention_at(1.7e9 + 10.0, Duration::from_secs(5), 1 << 30);
            db.restore();
            db.store.fuzzing_connection().execute_batch("PRAGMA foreign_keys = OFF").expect("fk off");
        } else {
            conn.execute_batch("ROLLBACK TO fuzz; RELEASE fuzz").expect("rollback");
        }
    });
});
