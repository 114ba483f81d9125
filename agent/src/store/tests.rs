//! Store semantics in memory: round trip, idempotent writes, queries, validation on read.

use std::collections::BTreeMap;

use super::*;
use crate::{
    attribution::{attribute, Attribution, CauseKind, Params, StepData},
    timeline::{windows::NicInfo, Arrival, Collective, NicWindow, Step, StepSource},
};

/// A real-shaped step: `ncoll` allreduces over `nranks` ranks on two hosts, the last rank
/// `late` seconds late on the first collective, 4 NICs, attributed by the real engine.
/// Collective sequence numbers are `step * 1000 + i` so steps never share a collective.
pub(super) fn sample(step: u64, begin: f64, late: f64, nranks: u32, ncoll: usize) -> (Attribution, Vec<Collective>, Vec<NicWindow>) {
    let mut colls = Vec::new();
    let mut t = begin + 0.020;
    for i in 0..ncoll {
        let extra = if i == 0 { late } else { 0.0 };
        let arrivals = (0..nranks)
            .map(|r| {
                let enter = if r + 1 == nranks { t + extra } else { t };
                Arrival { rank: r, host: format!("host{}", r % 2), pid: 1000 + r, enter, exit: t + extra + 0.002, aborted: false, clock: Default::default() }
            })
            .collect();
        colls.push(Collective {
            comm: "comm-a".into(),
            seq: step * 1000 + i as u64,
            op: "all_reduce".into(),
            library: "nccl".into(),
            bytes: Some(64 << 20),
            nranks: Some(nranks),
            arrivals,
        });
        t += extra + 0.003;
    }
    let end = t + 0.005;
    let windows: Vec<NicWindow> = (0..4)
        .map(|n| NicWindow {
            nic: NicInfo { name: format!("mlx5_{n}"), host: Some("host0".into()), rail: Some(n), rate_bytes_per_second: Some(50e9) },
            tx_bytes: 16e6 * (n + 1) as f64,
            rx_bytes: 16e6,
            pause_seconds: 1e-4 * n as f64,
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
    let s = Step { id: step, begin, end, source: StepSource::Markers, ranks: BTreeMap::new() };
    let refs: Vec<&Collective> = colls.iter().collect();
    let per_coll: Vec<Vec<NicWindow>> = colls.iter().map(|_| windows.clone()).collect();
    let att = attribute(&StepData { step: &s, collectives: &refs, windows: &per_coll, net: &[], same_host: &[], dropped_events: false }, &Params::default());
    (att, colls, windows)
}

/// Equal, but for numbers that only live in the attribution JSON (ranks, evidence), which
/// serde_json's default parser may read one ULP off. The step's times and the causes'
/// seconds and shares have their own columns and must be exact.
pub(super) fn assert_same(got: &[Attribution], want: &[Attribution]) {
    assert_eq!(got.len(), want.len(), "step count");
    for (g, w) in got.iter().zip(want) {
        assert_eq!((g.step, g.begin.to_bits(), g.end.to_bits(), g.seconds.to_bits()), (w.step, w.begin.to_bits(), w.end.to_bits(), w.seconds.to_bits()));
        let exact = |a: &Attribution| a.causes.iter().map(|c| (c.kind, c.seconds.to_bits(), c.share.to_bits(), c.rank, c.fix.clone())).collect::<Vec<_>>();
        assert_eq!(exact(g), exact(w), "causes of step {}", w.step);
        let (gj, wj) = (serde_json::to_value(g).expect("json"), serde_json::to_value(w).expect("json"));
        assert!(json_close(&gj, &wj), "step {}:\n{gj}\n{wj}", w.step);
    }
}

fn json_close(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value::*;
    match (a, b) {
        (Number(x), Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => x == y || (x - y).abs() <= 1e-12 * x.abs().max(y.abs()),
            _ => x == y,
        },
        (Array(x), Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_close(x, y)),
        (Object(x), Object(y)) => x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| json_close(v, w))),
        _ => a == b,
    }
}

fn put(st: &mut Store, job: &str, step: u64, begin: f64, late: f64) -> Attribution {
    let (a, c, w) = sample(step, begin, late, 4, 3);
    st.put_step(job, &a, &c, &w).expect("put_step");
    a
}

fn rows(st: &Store, table: &str) -> i64 {
    st.conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0)).expect("count rows")
}

#[test]
fn round_trip_keeps_every_field() {
    let mut st = Store::open_in_memory().expect("open");
    let (a, c, w) = sample(7, 1000.0, 0.030, 4, 3);
    assert!(a.cause(CauseKind::ReadinessSkew) > 0.029, "fixture has a straggler: {:?}", a.causes);
    st.put_step_from("job1", Some(StepSource::Markers), &a, &c, &w).expect("put_step");

    assert_same(&st.steps(&StepQuery::default()).expect("steps"), std::slice::from_ref(&a));
    assert_eq!(st.collectives_of("job1", 7).expect("collectives"), c, "collectives with arrivals");
    assert_eq!(st.windows_of("job1", 7).expect("windows"), w, "windows");
    assert_eq!(st.count_steps().expect("count"), 1);
    assert_eq!(rows(&st, "causes"), a.causes.len() as i64);
    assert_eq!(rows(&st, "arrivals"), 12);
    // Causes are queryable by kind without parsing JSON.
    let (secs, rank): (f64, Option<i64>) =
        st.conn.query_row("SELECT seconds, rank FROM causes WHERE kind = 'readiness_skew'", [], |r| Ok((r.get(0)?, r.get(1)?))).expect("skew cause row");
    assert_eq!(secs, a.cause(CauseKind::ReadinessSkew));
    assert_eq!(rank, Some(3), "late rank stored");
    let (skew, late): (f64, i64) =
        st.conn.query_row("SELECT skew, late_rank FROM collectives WHERE seq = 7000", [], |r| Ok((r.get(0)?, r.get(1)?))).expect("collective row");
    assert!((skew - 0.030).abs() < 1e-9 && late == 3, "skew {skew} late {late}");
    let src: String = st.conn.query_row("SELECT source FROM steps", [], |r| r.get(0)).expect("source");
    assert_eq!(src, "markers");
    // Unknown step or job: nothing, not an error.
    assert!(st.collectives_of("job1", 8).expect("collectives").is_empty());
    assert!(st.windows_of("other", 7).expect("windows").is_empty());
    assert_eq!(st.skipped_rows(), 0);
}

#[test]
fn writing_the_same_step_twice_keeps_one_copy() {
    let mut st = Store::open_in_memory().expect("open");
    let (a, c, w) = sample(3, 500.0, 0.010, 4, 3);
    st.put_step("job", &a, &c, &w).expect("first write");
    let counts = |st: &Store| ["steps", "causes", "collectives", "arrivals", "windows"].map(|t| rows(st, t));
    let before = counts(&st);
    st.put_step("job", &a, &c, &w).expect("second write");
    assert_eq!(counts(&st), before, "same rows after a replay");
    assert_same(&st.steps(&StepQuery::default()).expect("steps"), std::slice::from_ref(&a));
    assert_eq!(st.collectives_of("job", 3).expect("colls"), c);
    // A step read back (JSON) and written again keeps its exact key: still one copy.
    let back = st.steps(&StepQuery::default()).expect("steps").remove(0);
    st.put_step("job", &back, &st.collectives_of("job", 3).expect("colls"), &st.windows_of("job", 3).expect("w")).expect("rewrite");
    assert_eq!(counts(&st), before, "same rows after writing back what was read");

    // A re-attribution of the same step (same key) replaces it in place.
    let mut b = a.clone();
    b.notes.push("re-attributed".into());
    b.incomplete = true;
    st.put_step("job", &b, &c, &w[..2]).expect("update");
    assert_same(&st.steps(&StepQuery::default()).expect("steps"), &[b]);
    assert_eq!(st.windows_of("job", 3).expect("windows"), w[..2].to_vec());
    assert_eq!(rows(&st, "steps"), 1);

    // Same step id in another job, or a new begin (ids restart with the job), is another step.
    st.put_step("job2", &a, &[], &[]).expect("other job");
    let (a2, c2, w2) = sample(3, 900.0, 0.0, 4, 3);
    st.put_step("job", &a2, &c2, &w2).expect("restarted job");
    assert_eq!(st.count_steps().expect("count"), 3);
}

#[test]
fn queries_step_since_slowest_limit_and_job() {
    let mut st = Store::open_in_memory().expect("open");
    // Steps 0..10 every second; steps 2, 5 and 8 have 10, 50 and 30 ms stragglers.
    let lateness = [0.0, 0.0, 0.010, 0.0, 0.0, 0.050, 0.0, 0.0, 0.030, 0.0];
    for (i, l) in lateness.iter().enumerate() {
        put(&mut st, "job", i as u64, 100.0 + i as f64, *l);
    }
    put(&mut st, "other", 0, 50.0, 0.5);

    let ids = |q: StepQuery| st.steps(&q).expect("query").iter().map(|a| a.step).collect::<Vec<_>>();
    let job = || StepQuery { job_key: Some("job".into()), ..Default::default() };
    assert_eq!(ids(job()), (0..10).collect::<Vec<_>>(), "by begin");
    assert_eq!(ids(StepQuery { slowest: Some(3), ..job() }), vec![5, 8, 2], "slowest first");
    assert_eq!(ids(StepQuery { slowest: Some(3), ..Default::default() }), vec![0, 5, 8], "all jobs: 'other' step 0 is slowest");
    assert_eq!(ids(StepQuery { since: Some(106.0), ..job() }), vec![6, 7, 8, 9]);
    assert_eq!(ids(StepQuery { since: Some(103.0), slowest: Some(2), ..job() }), vec![5, 8]);
    assert_eq!(ids(StepQuery { step: Some(4), ..job() }), vec![4]);
    assert_eq!(ids(StepQuery { step: Some(0), ..Default::default() }), vec![0, 0], "step 0 of both jobs");
    assert_eq!(ids(StepQuery { limit: Some(3), ..job() }), vec![7, 8, 9], "the latest 3, oldest first");
    assert_eq!(ids(StepQuery { limit: Some(2), slowest: Some(3), ..job() }), vec![5, 8], "limit caps K");
    assert!(ids(StepQuery { step: Some(u64::MAX), ..Default::default() }).is_empty());
    assert_eq!(st.last_step_time("job").expect("last"), st.steps(&job()).expect("q").last().map(|a| a.end));
    assert_eq!(st.last_step_time("nobody").expect("last"), None);
}

#[test]
fn corrupt_rows_are_skipped_and_counted() {
    let mut st = Store::open_in_memory().expect("open");
    for i in 0..3 {
        put(&mut st, "job", i, 10.0 + i as f64, 0.0);
    }
    st.conn.execute("UPDATE steps SET attribution = '{not json' WHERE step_id = 0", []).expect("corrupt json");
    st.conn.execute("UPDATE steps SET step_id = 99 WHERE step_id = 1", []).expect("disagreeing key");
    let got = st.steps(&StepQuery::default()).expect("steps");
    assert_eq!(got.iter().map(|a| a.step).collect::<Vec<_>>(), vec![2]);
    assert_eq!(st.skipped_rows(), 2);

    st.conn.execute("UPDATE arrivals SET rank = -1 WHERE seq = 2000 AND rank = 0", []).expect("negative rank");
    st.conn.execute("UPDATE collectives SET nranks = 1 << 40 WHERE seq = 2001", []).expect("huge nranks");
    let colls = st.collectives_of("job", 2).expect("collectives");
    assert_eq!(colls.iter().map(|c| c.seq).collect::<Vec<_>>(), vec![2000, 2002], "bad collective skipped");
    assert_eq!(colls[0].arrivals.len(), 3, "bad arrival skipped");
    st.conn.execute("UPDATE windows SET rail = -3 WHERE idx = 1", []).expect("negative rail");
    assert_eq!(st.windows_of("job", 2).expect("windows").len(), 3);
    assert_eq!(st.skipped_rows(), 5);
}

#[test]
fn non_finite_or_huge_values_are_refused_not_stored_unreadable() {
    let mut st = Store::open_in_memory().expect("open");
    let (mut a, c, w) = sample(1, 10.0, 0.0, 2, 1);
    a.causes[0].seconds = f64::NAN;
    assert!(matches!(st.put_step("job", &a, &c, &w), Err(StoreError::NotFinite { step: 1, .. })));
    let (mut b, mut c, w) = sample(1, 10.0, 0.0, 2, 1);
    c[0].seq = u64::MAX;
    assert!(matches!(st.put_step("job", &b, &c, &w), Err(StoreError::OutOfRange { field: "collective seq", .. })));
    b.step = u64::MAX;
    assert!(matches!(st.put_step("job", &b, &[], &[]), Err(StoreError::OutOfRange { field: "step", .. })));
    assert_eq!(st.count_steps().expect("count"), 0, "a failed write leaves nothing behind");
    assert_eq!(rows(&st, "collectives"), 0);

    // NaN in a counter window is stored (SQLite keeps it as NULL) and read back as NaN.
    let (a, c, mut w) = sample(2, 20.0, 0.0, 2, 1);
    w[0].pause_seconds = f64::NAN;
    st.put_step("job", &a, &c, &w).expect("NaN counter");
    assert!(st.windows_of("job", 2).expect("windows")[0].pause_seconds.is_nan());
}
