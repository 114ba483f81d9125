//! Writing a step: one transaction, idempotent. The step row is keyed by
//! `(job_key, step_id, begin)`, a collective by `(comm, seq)`, an arrival by
//! `(comm, seq, rank)`; writing the same step again (an agent restart replaying its last
//! window) updates those rows in place instead of adding copies. The latest write of a step
//! is authoritative for its attribution, causes and windows; arrivals are merged (a rank once
//! seen stays seen).

use rusqlite::{params, TransactionBehavior};

use super::{error::sql, now, Store, StoreError};
use crate::{
    attribution::Attribution,
    timeline::{Collective, NicWindow, StepSource},
};

const UPSERT_STEP: &str = "
INSERT INTO steps (job_key, step_id, begin, end, seconds, source, incomplete, collectives, attribution, stored_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
ON CONFLICT (job_key, step_id, begin) DO UPDATE SET
    end = excluded.end, seconds = excluded.seconds, source = coalesce(excluded.source, steps.source),
    incomplete = excluded.incomplete, collectives = excluded.collectives,
    attribution = excluded.attribution, stored_at = excluded.stored_at
RETURNING id";

const INSERT_CAUSE: &str = "
INSERT INTO causes (step_ref, idx, kind, seconds, share, rank, evidence, fix) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";

const UPSERT_COLLECTIVE: &str = "
INSERT INTO collectives (step_ref, comm, seq, op, library, bytes, nranks, first_arrival, last_arrival, last_exit, skew, late_rank)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
ON CONFLICT (comm, seq) DO UPDATE SET
    step_ref = excluded.step_ref, op = excluded.op, library = excluded.library, bytes = excluded.bytes,
    nranks = excluded.nranks, first_arrival = excluded.first_arrival, last_arrival = excluded.last_arrival,
    last_exit = excluded.last_exit, skew = excluded.skew, late_rank = excluded.late_rank";

const UPSERT_ARRIVAL: &str = "
INSERT INTO arrivals (comm, seq, rank, host, pid, enter, exit, aborted) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
ON CONFLICT (comm, seq, rank) DO UPDATE SET
    host = excluded.host, pid = excluded.pid, enter = excluded.enter, exit = excluded.exit, aborted = excluded.aborted";

const INSERT_WINDOW: &str = "
INSERT INTO windows (step_ref, idx, nic, host, rail, rate_bytes_per_second, tx_bytes, rx_bytes, pause_seconds,
    pause_frames, ecn_marked, cnp_sent, cnp_handled, xmit_wait_ticks, retransmits, drops, max_backlog_bytes)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)";

impl Store {
    /// Stores one attributed step of job `job_key` (the job or communicator key the agent
    /// groups steps by) with its collectives and per-NIC windows, in one transaction.
    pub fn put_step(&mut self, job_key: &str, att: &Attribution, colls: &[Collective], windows: &[NicWindow]) -> Result<(), StoreError> {
        self.put_step_from(job_key, None, att, colls, windows)
    }

    /// [`Store::put_step`], recording how the step was delimited (markers or period).
    pub fn put_step_from(
        &mut self,
        job_key: &str,
        source: Option<StepSource>,
        att: &Attribution,
        colls: &[Collective],
        windows: &[NicWindow],
    ) -> Result<(), StoreError> {
        if let Some((field, value)) = non_finite(att) {
            return Err(StoreError::NotFinite { step: att.step, field, value });
        }
        let step = att.step;
        let step_id = int(step, "step", step)?;
        let json = serde_json::to_string(att).map_err(|source| StoreError::Encode { step, source })?;
        let source = source.map(|s| match s {
            StepSource::Markers => "markers",
            StepSource::Period => "period",
        });
        let path = self.path.as_path();
        // IMMEDIATE takes the write lock up front: with another writer on the file, waiting
        // (busy timeout) beats failing on a read-to-write upgrade.
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(sql(path, "begin step write"))?;
        {
            let e = |op| sql(path, op);
            let step_ref: i64 = tx
                .prepare_cached(UPSERT_STEP)
                .and_then(|mut st| {
                    st.query_row(params![job_key, step_id, att.begin, att.end, att.seconds, source, att.incomplete, att.collectives as i64, json, now()], |r| {
                        r.get(0)
                    })
                })
                .map_err(e("write step"))?;

            tx.execute("DELETE FROM causes WHERE step_ref = ?1", [step_ref]).map_err(e("replace causes"))?;
            let mut st = tx.prepare_cached(INSERT_CAUSE).map_err(e("prepare cause insert"))?;
            for (i, c) in att.causes.iter().enumerate() {
                let evidence = serde_json::to_string(&c.evidence).map_err(|source| StoreError::Encode { step, source })?;
                st.execute(params![step_ref, i as i64, c.kind.as_str(), c.seconds, c.share, c.rank, evidence, c.fix]).map_err(e("write cause"))?;
            }

            let mut sc = tx.prepare_cached(UPSERT_COLLECTIVE).map_err(e("prepare collective upsert"))?;
            let mut sa = tx.prepare_cached(UPSERT_ARRIVAL).map_err(e("prepare arrival upsert"))?;
            for c in colls {
                let seq = int(step, "collective seq", c.seq)?;
                let bytes = c.bytes.map(|b| int(step, "collective bytes", b)).transpose()?;
                let has = !c.arrivals.is_empty();
                let (first, last, exit) = if has { (Some(c.first_arrival()), Some(c.last_arrival()), Some(c.last_exit())) } else { (None, None, None) };
                sc.execute(params![step_ref, c.comm, seq, c.op, c.library, bytes, c.nranks, first, last, exit, c.skew(), c.late_rank().map(|a| a.rank)])
                    .map_err(e("write collective"))?;
                for a in &c.arrivals {
                    sa.execute(params![c.comm, seq, a.rank, a.host, a.pid, a.enter, a.exit, a.aborted]).map_err(e("write arrival"))?;
                }
            }

            tx.execute("DELETE FROM windows WHERE step_ref = ?1", [step_ref]).map_err(e("replace windows"))?;
            let mut sw = tx.prepare_cached(INSERT_WINDOW).map_err(e("prepare window insert"))?;
            for (i, w) in windows.iter().enumerate() {
                sw.execute(params![
                    step_ref,
                    i as i64,
                    w.nic.name,
                    w.nic.host,
                    w.nic.rail,
                    w.nic.rate_bytes_per_second,
                    w.tx_bytes,
                    w.rx_bytes,
                    w.pause_seconds,
                    w.pause_frames,
                    w.ecn_marked,
                    w.cnp_sent,
                    w.cnp_handled,
                    w.xmit_wait_ticks,
                    w.retransmits,
                    w.drops,
                    w.max_backlog_bytes
                ])
                .map_err(e("write window"))?;
            }
        }
        tx.commit().map_err(sql(path, "commit step write"))
    }
}

/// u64 → SQLite integer (signed 64-bit).
fn int(step: u64, field: &'static str, value: u64) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| StoreError::OutOfRange { step, field, value })
}

/// The first non-finite number of the attribution, if any. JSON has no NaN (serde_json
/// writes `null`, which then cannot be read back as a number), and the step's times are its
/// key, so such a step is refused rather than stored unreadable.
pub(crate) fn non_finite(att: &Attribution) -> Option<(&'static str, f64)> {
    let step = [("begin", att.begin), ("end", att.end), ("seconds", att.seconds)];
    let causes = att.causes.iter().flat_map(|c| [("cause seconds", c.seconds), ("cause share", c.share)]);
    let ranks = att
        .ranks
        .iter()
        .flat_map(|r| [("rank late_seconds", r.late_seconds), ("rank wait_seconds", r.wait_seconds), ("rank inside_seconds", r.inside_seconds)]);
    step.into_iter().chain(causes).chain(ranks).find(|(_, v)| !v.is_finite())
}
