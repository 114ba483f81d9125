//! Queries. Every row read back is validated: a row whose JSON does not parse, whose JSON
//! disagrees with its key columns, or whose integers are out of range is skipped and counted
//! ([`Store::skipped_rows`]) with a warning; `diagnose` still reports the rest.

use rusqlite::{types::Value, Row};

use super::{error::sql, write::non_finite, Store, StoreError};
use crate::{
    attribution::Attribution,
    timeline::{windows::NicInfo, Arrival, Collective, NicWindow},
};

/// Which steps [`Store::steps`] returns. Filters combine (AND).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepQuery {
    /// Only this step id.
    pub step: Option<u64>,
    /// Only steps that began at or after this wall-clock time (seconds since the epoch).
    pub since: Option<f64>,
    /// The K longest steps of the selection, longest first.
    pub slowest: Option<usize>,
    /// At most this many steps: the most recent ones (by begin), still returned oldest
    /// first; with `slowest`, caps K.
    pub limit: Option<usize>,
    /// Only this job.
    pub job_key: Option<String>,
}

impl StepQuery {
    /// `WHERE` clause and its parameters.
    fn filter(&self) -> (String, Vec<Value>) {
        let mut cond = Vec::new();
        let mut args = Vec::new();
        if let Some(s) = self.step {
            // An id beyond i64 cannot have been stored: match nothing.
            cond.push("step_id = ?");
            args.push(Value::Integer(i64::try_from(s).unwrap_or(-1)));
        }
        if let Some(t) = self.since {
            cond.push("begin >= ?");
            args.push(Value::Real(t));
        }
        if let Some(j) = &self.job_key {
            cond.push("job_key = ?");
            args.push(Value::Text(j.clone()));
        }
        let sql = if cond.is_empty() { String::new() } else { format!("WHERE {}", cond.join(" AND ")) };
        (sql, args)
    }
}

fn lim(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Store {
    /// The attributions of the steps `q` selects: the slowest first with `q.slowest`,
    /// otherwise by begin time.
    pub fn steps(&self, q: &StepQuery) -> Result<Vec<Attribution>, StoreError> {
        let (filter, mut args) = q.filter();
        let cols = "SELECT id, step_id, begin, end, seconds, attribution FROM steps";
        let sql = match (q.slowest, q.limit) {
            (Some(k), limit) => {
                args.push(Value::Integer(lim(limit.map_or(k, |l| l.min(k)))));
                format!("{cols} {filter} ORDER BY seconds DESC, begin ASC LIMIT ?")
            }
            (None, Some(l)) => {
                args.push(Value::Integer(lim(l)));
                format!("SELECT * FROM ({cols} {filter} ORDER BY begin DESC, id DESC LIMIT ?) ORDER BY begin ASC, id ASC")
            }
            (None, None) => format!("{cols} {filter} ORDER BY begin ASC, id ASC"),
        };
        let mut st = self.conn.prepare_cached(&sql).map_err(sql_err(self, "prepare step query"))?;
        let mut causes = self
            .conn
            .prepare_cached("SELECT idx, kind, seconds, share FROM causes WHERE step_ref = ?1 ORDER BY idx")
            .map_err(sql_err(self, "prepare cause query"))?;
        let mut rows = st.query(rusqlite::params_from_iter(args)).map_err(sql_err(self, "query steps"))?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(sql_err(self, "read steps"))? {
            let id: i64 = row.get(0).map_err(sql_err(self, "read step id"))?;
            let mut att = match step_row(row) {
                Ok(a) => a,
                Err(reason) => {
                    self.skip("steps", id, &reason);
                    continue;
                }
            };
            let mut crows = causes.query([id]).map_err(sql_err(self, "query causes"))?;
            let mut exact = Vec::with_capacity(att.causes.len());
            while let Some(c) = crows.next().map_err(sql_err(self, "read causes"))? {
                exact.push(cause_row(c));
            }
            match restore_causes(&mut att, exact) {
                Ok(()) => out.push(att),
                Err(reason) => self.skip("steps", id, &reason),
            }
        }
        Ok(out)
    }

    /// The collectives (with each rank's arrival, by rank) stored with step `step_id` of
    /// `job_key`, by first arrival.
    pub fn collectives_of(&self, job_key: &str, step_id: u64) -> Result<Vec<Collective>, StoreError> {
        let Ok(step_id) = i64::try_from(step_id) else { return Ok(Vec::new()) };
        let mut st = self
            .conn
            .prepare_cached(
                "SELECT c.id, c.comm, c.seq, c.op, c.library, c.bytes, c.nranks,
                        a.rank, a.host, a.pid, a.enter, a.exit, a.aborted
                 FROM steps s JOIN collectives c ON c.step_ref = s.id
                 LEFT JOIN arrivals a ON a.comm = c.comm AND a.seq = c.seq
                 WHERE s.job_key = ?1 AND s.step_id = ?2
                 ORDER BY s.begin, c.first_arrival, c.comm, c.seq, a.rank",
            )
            .map_err(sql_err(self, "prepare collective query"))?;
        let mut rows = st.query(rusqlite::params![job_key, step_id]).map_err(sql_err(self, "query collectives"))?;
        let mut out: Vec<Collective> = Vec::new();
        let mut cur: Option<(i64, Option<Collective>)> = None;
        while let Some(row) = rows.next().map_err(sql_err(self, "read collectives"))? {
            let id: i64 = row.get(0).map_err(sql_err(self, "read collective id"))?;
            if cur.as_ref().map(|c| c.0) != Some(id) {
                if let Some((_, Some(c))) = cur.take() {
                    out.push(c);
                }
                let c = collective_row(row).map_err(|reason| self.skip("collectives", id, &reason)).ok();
                cur = Some((id, c));
            }
            let Some((_, Some(c))) = cur.as_mut() else { continue };
            if row.get_ref(7).map_err(sql_err(self, "read arrival"))?.data_type() == rusqlite::types::Type::Null {
                continue; // no arrivals (LEFT JOIN)
            }
            match arrival_row(row) {
                Ok(a) => c.arrivals.push(a),
                Err(reason) => self.skip("arrivals", id, &reason),
            }
        }
        if let Some((_, Some(c))) = cur {
            out.push(c);
        }
        Ok(out)
    }

    /// The per-NIC windows stored with step `step_id` of `job_key`, in the order written.
    pub fn windows_of(&self, job_key: &str, step_id: u64) -> Result<Vec<NicWindow>, StoreError> {
        let Ok(step_id) = i64::try_from(step_id) else { return Ok(Vec::new()) };
        let mut st = self
            .conn
            .prepare_cached(
                "SELECT w.step_ref, w.nic, w.host, w.rail, w.rate_bytes_per_second, w.tx_bytes, w.rx_bytes,
                        w.pause_seconds, w.pause_frames, w.ecn_marked, w.cnp_sent, w.cnp_handled,
                        w.xmit_wait_ticks, w.retransmits, w.drops, w.max_backlog_bytes
                 FROM steps s JOIN windows w ON w.step_ref = s.id
                 WHERE s.job_key = ?1 AND s.step_id = ?2 ORDER BY s.begin, w.idx",
            )
            .map_err(sql_err(self, "prepare window query"))?;
        let mut rows = st.query(rusqlite::params![job_key, step_id]).map_err(sql_err(self, "query windows"))?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(sql_err(self, "read windows"))? {
            let id: i64 = row.get(0).map_err(sql_err(self, "read window step"))?;
            match window_row(row) {
                Ok(w) => out.push(w),
                Err(reason) => self.skip("windows", id, &reason),
            }
        }
        Ok(out)
    }

    /// The collectives of a step as [`Store::steps`] returned it (its `begin` is the exact
    /// column value): the step's job is looked up by `(step_id, begin)`, and only collectives
    /// that began inside the step are kept (the same job and id may recur after a restart).
    pub fn collectives_of_step(&self, a: &Attribution) -> Result<Vec<Collective>, StoreError> {
        let Ok(step_id) = i64::try_from(a.step) else { return Ok(Vec::new()) };
        let mut st =
            self.conn.prepare_cached("SELECT job_key FROM steps WHERE step_id = ?1 AND begin = ?2 LIMIT 1").map_err(sql_err(self, "prepare job query"))?;
        let mut rows = st.query(rusqlite::params![step_id, a.begin]).map_err(sql_err(self, "query job"))?;
        let Some(row) = rows.next().map_err(sql_err(self, "read job"))? else { return Ok(Vec::new()) };
        let job: String = row.get(0).map_err(sql_err(self, "read job key"))?;
        let mut out = self.collectives_of(&job, a.step)?;
        out.retain(|c| c.first_arrival() >= a.begin - 1e-6 && c.first_arrival() < a.end);
        Ok(out)
    }

    /// Number of stored steps (all jobs).
    pub fn count_steps(&self) -> Result<u64, StoreError> {
        let n: i64 = self.conn.query_row("SELECT count(*) FROM steps", [], |r| r.get(0)).map_err(sql_err(self, "count steps"))?;
        Ok(n.max(0) as u64)
    }

    /// End time (wall seconds) of the latest stored step of `job_key`, `None` when there is
    /// none: a restarted agent stores only steps that end after it.
    pub fn last_step_time(&self, job_key: &str) -> Result<Option<f64>, StoreError> {
        self.conn
            .query_row("SELECT max(end) FROM steps WHERE job_key = ?1", [job_key], |r| r.get::<_, Option<f64>>(0))
            .map_err(sql_err(self, "read last step time"))
    }
}

fn sql_err<'a>(s: &'a Store, op: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError + 'a {
    sql(&s.path, op)
}

/// `id, step_id, begin, end, seconds, attribution` → a validated attribution.
///
/// serde_json's default float parsing is best effort (it may land one ULP off), so the
/// numbers that have their own REAL column come from the column, exact: the step's key
/// times here, the causes' seconds and shares in [`restore_causes`]. The JSON must agree
/// with the columns to within that error, or the row is corrupt.
fn step_row(row: &Row<'_>) -> Result<Attribution, String> {
    let step_id: i64 = row.get(1).map_err(|e| format!("step_id: {e}"))?;
    let begin: f64 = row.get(2).map_err(|e| format!("begin: {e}"))?;
    let end: f64 = row.get(3).map_err(|e| format!("end: {e}"))?;
    let seconds: f64 = row.get(4).map_err(|e| format!("seconds: {e}"))?;
    let json: String = row.get(5).map_err(|e| format!("attribution: {e}"))?;
    let mut att: Attribution = serde_json::from_str(&json).map_err(|e| format!("attribution JSON: {e}"))?;
    if u64::try_from(step_id).ok() != Some(att.step) {
        return Err(format!("step_id {step_id} disagrees with the attribution's step {}", att.step));
    }
    for (name, col, json) in [("begin", begin, &mut att.begin), ("end", end, &mut att.end), ("seconds", seconds, &mut att.seconds)] {
        if !close(col, *json) {
            return Err(format!("{name} {col} disagrees with the attribution's {json}"));
        }
        *json = col;
    }
    if let Some((field, v)) = non_finite(&att) {
        return Err(format!("{field} is {v}"));
    }
    Ok(att)
}

/// Equal up to JSON's parsing error (a few ULPs).
fn close(a: f64, b: f64) -> bool {
    a == b || (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
}

/// `idx, kind, seconds, share` of a cause row.
fn cause_row(row: &Row<'_>) -> Result<(usize, String, f64, f64), String> {
    Ok((int(row, 0)?, text(row, 1)?, real(row, 2)?, real(row, 3)?))
}

/// Puts the exact seconds and shares of the `causes` rows into the attribution's causes;
/// they must be the same causes, in the same order.
fn restore_causes(att: &mut Attribution, rows: Vec<Result<(usize, String, f64, f64), String>>) -> Result<(), String> {
    if rows.len() != att.causes.len() {
        return Err(format!("{} cause rows for {} causes in the attribution", rows.len(), att.causes.len()));
    }
    for (i, (row, c)) in rows.into_iter().zip(att.causes.iter_mut()).enumerate() {
        let (idx, kind, seconds, share) = row.map_err(|e| format!("cause {i}: {e}"))?;
        if idx != i || kind != c.kind.as_str() || !close(seconds, c.seconds) || !close(share, c.share) {
            return Err(format!("cause row {idx} ({kind}, {seconds}) disagrees with the attribution's {} ({}, {})", i, c.kind.as_str(), c.seconds));
        }
        c.seconds = seconds;
        c.share = share;
    }
    Ok(())
}

/// A stored REAL; NULL is how SQLite stores NaN, so it reads back as NaN.
fn real(row: &Row<'_>, i: usize) -> Result<f64, String> {
    row.get::<_, Option<f64>>(i).map(|v| v.unwrap_or(f64::NAN)).map_err(|e| format!("column {i}: {e}"))
}

/// A stored integer that must fit `T` (negative or too large values are corrupt).
fn int<T: TryFrom<i64>>(row: &Row<'_>, i: usize) -> Result<T, String> {
    let v: i64 = row.get(i).map_err(|e| format!("column {i}: {e}"))?;
    T::try_from(v).map_err(|_| format!("column {i}: {v} is out of range"))
}

fn opt_int<T: TryFrom<i64>>(row: &Row<'_>, i: usize) -> Result<Option<T>, String> {
    match row.get::<_, Option<i64>>(i).map_err(|e| format!("column {i}: {e}"))? {
        None => Ok(None),
        Some(v) => T::try_from(v).map(Some).map_err(|_| format!("column {i}: {v} is out of range")),
    }
}

fn text(row: &Row<'_>, i: usize) -> Result<String, String> {
    row.get(i).map_err(|e| format!("column {i}: {e}"))
}

/// `c.id, comm, seq, op, library, bytes, nranks, …` → a collective without arrivals.
fn collective_row(row: &Row<'_>) -> Result<Collective, String> {
    Ok(Collective {
        comm: text(row, 1)?,
        seq: int(row, 2)?,
        op: text(row, 3)?,
        library: text(row, 4)?,
        bytes: opt_int(row, 5)?,
        nranks: opt_int(row, 6)?,
        arrivals: Vec::new(),
    })
}

/// `…, rank, host, pid, enter, exit, aborted` (columns 7..=12).
fn arrival_row(row: &Row<'_>) -> Result<Arrival, String> {
    Ok(Arrival {
        rank: int(row, 7)?,
        host: text(row, 8)?,
        pid: int(row, 9)?,
        enter: real(row, 10)?,
        exit: real(row, 11)?,
        aborted: int::<u8>(row, 12)? != 0,
        clock: Default::default(),
    })
}

fn window_row(row: &Row<'_>) -> Result<NicWindow, String> {
    let rate = row.get::<_, Option<f64>>(4).map_err(|e| format!("rate: {e}"))?;
    Ok(NicWindow {
        nic: NicInfo { name: text(row, 1)?, host: row.get(2).map_err(|e| format!("host: {e}"))?, rail: opt_int(row, 3)?, rate_bytes_per_second: rate },
        tx_bytes: real(row, 5)?,
        rx_bytes: real(row, 6)?,
        pause_seconds: real(row, 7)?,
        pause_frames: real(row, 8)?,
        ecn_marked: real(row, 9)?,
        cnp_sent: real(row, 10)?,
        cnp_handled: real(row, 11)?,
        xmit_wait_ticks: real(row, 12)?,
        retransmits: real(row, 13)?,
        drops: real(row, 14)?,
        max_backlog_bytes: real(row, 15)?,
        // Not kept by the store, like the TCP figures.
        tcp: Default::default(),
        own_tx: None,
        opaque_tx_bytes: 0.0,
    })
}
