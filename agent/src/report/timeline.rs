//! Per-rank timeline of one step from its collectives' arrivals: what each rank was doing at
//! each moment, on the step's own time axis (seconds from the step's begin).
//!
//! For each rank, in the order of its calls:
//! - `compute`: outside any collective before its last call (forward/backward, data loading);
//! - `wait`: inside a collective, before the last rank arrived (readiness skew seen from
//!   this rank, docs/models.md §3.2);
//! - `comm`: inside a collective once everyone had arrived (the transfer);
//! - `update`: after the rank's last collective returned until the step ended (optimizer
//!   update and whatever follows the last collective).
//!
//! Each entry into a collective is a *ready* mark: the moment the rank's data was ready.
//! Arrival times are wall clocks of the ranks' hosts, so across hosts they are only as good
//! as the clock error the report states.

use std::collections::BTreeMap;

use crate::{attribution::Attribution, timeline::Collective};

/// What a rank was doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Compute,
    Wait,
    Comm,
    Update,
}

impl Phase {
    pub const ALL: [Phase; 4] = [Phase::Compute, Phase::Wait, Phase::Comm, Phase::Update];
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Compute => "compute",
            Phase::Wait => "wait",
            Phase::Comm => "comm",
            Phase::Update => "update",
        }
    }
    /// Legend text.
    pub fn label(self) -> &'static str {
        match self {
            Phase::Compute => "compute",
            Phase::Wait => "waiting for the others",
            Phase::Comm => "communication",
            Phase::Update => "update (after the last collective)",
        }
    }
}

/// One interval of a rank's row, in seconds from the step's begin.
#[derive(Clone, Debug, PartialEq)]
pub struct Segment {
    pub phase: Phase,
    pub start: f64,
    pub end: f64,
    /// Index into the step's collectives for `wait`/`comm`.
    pub collective: Option<usize>,
}

/// A rank's row.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// `None` when the probes could not tell the rank.
    pub rank: Option<u32>,
    pub host: String,
    pub segments: Vec<Segment>,
    /// When the rank entered each collective (its data was ready), seconds from begin, with
    /// the collective's index.
    pub ready: Vec<(f64, usize)>,
}

/// The step's rows, by rank (unknown ranks last). Empty without collectives.
pub fn rows(a: &Attribution, colls: &[Collective]) -> Vec<Row> {
    let (t0, t1) = (a.begin, a.end.max(a.begin));
    let rel = |t: f64| t.clamp(t0, t1) - t0;
    // (rank, host, pid) → [(enter, exit, last arrival, collective index)]
    type Calls = Vec<(f64, f64, f64, usize)>;
    let mut per: BTreeMap<(u32, String, u32), Calls> = BTreeMap::new();
    for (i, c) in colls.iter().enumerate() {
        let last = c.last_arrival();
        for ar in &c.arrivals {
            // Unknown ranks are told apart by host and pid; known ranks by number alone.
            let key = if ar.rank == u32::MAX { (u32::MAX, ar.host.clone(), ar.pid) } else { (ar.rank, String::new(), 0) };
            per.entry(key).or_default().push((ar.enter, ar.exit.max(ar.enter), last, i));
        }
    }
    let host_of = |rank: u32| colls.iter().flat_map(|c| &c.arrivals).find(|x| x.rank == rank).map(|x| x.host.clone()).unwrap_or_default();
    per.into_iter()
        .map(|((rank, host, _), mut calls)| {
            calls.sort_by(|x, y| x.0.total_cmp(&y.0));
            let mut segs = Vec::new();
            // Wall times near 1.7e9 s carry ~0.2 µs of rounding: no slivers below 1 µs.
            let mut push = |phase, start: f64, end: f64, collective| {
                if end > start + 1e-6 {
                    segs.push(Segment { phase, start, end, collective });
                }
            };
            let mut cursor = 0.0;
            let mut ready = Vec::new();
            for &(enter, exit, last, i) in &calls {
                let (e, x, l) = (rel(enter), rel(exit), rel(last));
                ready.push((e, i));
                push(Phase::Compute, cursor, e, None);
                let from = e.max(cursor);
                push(Phase::Wait, from, l.min(x), Some(i));
                push(Phase::Comm, l.max(from), x, Some(i));
                cursor = cursor.max(x);
            }
            push(Phase::Update, cursor, t1 - t0, None);
            let (rank, host) = if rank == u32::MAX { (None, host) } else { (Some(rank), host_of(rank)) };
            Row { rank, host, segments: segs, ready }
        })
        .collect()
}

/// Seconds per phase of a row.
pub fn totals(r: &Row) -> [f64; 4] {
    let mut t = [0.0; 4];
    for s in &r.segments {
        let i = Phase::ALL.iter().position(|p| *p == s.phase).unwrap_or(0);
        t[i] += s.end - s.start;
    }
    t
}

/// Axis ticks for `span` seconds: a 1/2/5 × 10^k step giving at most 9 ticks, from 0.
pub fn ticks(span: f64) -> Vec<f64> {
    if !(span.is_finite() && span > 0.0) {
        return vec![0.0];
    }
    let raw = span / 6.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| span / s <= 8.0).unwrap_or(10.0 * mag);
    (0..).map(|k| k as f64 * step).take_while(|t| *t <= span * (1.0 + 1e-9)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::Arrival;

    fn coll(begin: f64, enters: &[(u32, f64)], exit: f64) -> Collective {
        Collective {
            comm: "c".into(),
            seq: 0,
            op: "all_reduce".into(),
            library: "mpi".into(),
            bytes: Some(1 << 20),
            nranks: Some(enters.len() as u32),
            arrivals: enters
                .iter()
                .map(|&(rank, e)| Arrival {
                    rank,
                    host: format!("h{}", rank / 2),
                    pid: 100 + rank,
                    enter: begin + e,
                    exit: begin + exit,
                    aborted: false,
                    clock: Default::default(),
                })
                .collect(),
        }
    }

    #[test]
    fn rows_split_compute_wait_comm_update() {
        let a = crate::report::fixtures::attribution(); // 200 ms from `begin`
        let b = a.begin;
        // Rank 1 arrives 30 ms after rank 0; everyone leaves at 150 ms; a second small one.
        let cs = vec![coll(b, &[(0, 0.100), (1, 0.130)], 0.150), coll(b, &[(0, 0.160), (1, 0.160)], 0.170)];
        let r = rows(&a, &cs);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].rank, r[0].host.as_str()), (Some(0), "h0"));
        let phases = |row: &Row| row.segments.iter().map(|s| (s.phase, (s.start * 1e3).round(), (s.end * 1e3).round())).collect::<Vec<_>>();
        assert_eq!(
            phases(&r[0]),
            vec![
                (Phase::Compute, 0.0, 100.0),
                (Phase::Wait, 100.0, 130.0),
                (Phase::Comm, 130.0, 150.0),
                (Phase::Compute, 150.0, 160.0),
                (Phase::Comm, 160.0, 170.0),
                (Phase::Update, 170.0, 200.0)
            ]
        );
        assert_eq!(phases(&r[1])[..2], [(Phase::Compute, 0.0, 130.0), (Phase::Comm, 130.0, 150.0)], "the late rank never waits");
        assert_eq!(r[1].ready.iter().map(|x| (x.0 * 1e3).round()).collect::<Vec<_>>(), vec![130.0, 160.0]);
        let t = totals(&r[0]);
        assert!((t.iter().sum::<f64>() - 0.2).abs() < 1e-6, "a row covers the step: {t:?}");
        assert!((t[1] - 0.030).abs() < 1e-6);
        assert!(rows(&a, &[]).is_empty());
    }

    #[test]
    fn arrivals_outside_the_step_are_clamped_and_unknown_ranks_kept_apart() {
        let a = crate::report::fixtures::attribution();
        let mut c = coll(a.begin, &[(0, -0.05), (1, 0.01)], 0.5);
        c.arrivals.push(Arrival { rank: u32::MAX, host: "x".into(), pid: 7, enter: a.begin, exit: a.begin + 0.1, aborted: false, clock: Default::default() });
        c.arrivals.push(Arrival { rank: u32::MAX, host: "x".into(), pid: 8, enter: a.begin, exit: a.begin + 0.1, aborted: false, clock: Default::default() });
        let r = rows(&a, &[c]);
        assert_eq!(r.len(), 4);
        assert!(r[2].rank.is_none() && r[3].rank.is_none());
        for row in &r {
            assert!(row.segments.iter().all(|s| s.start >= 0.0 && s.end <= a.end - a.begin && s.end > s.start), "{row:?}");
        }
    }

    #[test]
    fn ticks_are_round() {
        let t = ticks(0.2);
        assert_eq!(t.len(), 5, "{t:?}");
        assert!(t.iter().zip([0.0, 0.05, 0.1, 0.15, 0.2]).all(|(a, b)| (a - b).abs() < 1e-12), "{t:?}");
        let t = ticks(0.0734);
        assert!(t.len() >= 4 && t.len() <= 9, "{t:?}");
        assert_eq!(ticks(0.0), vec![0.0]);
    }
}
