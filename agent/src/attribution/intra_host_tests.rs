//! Same-host links (docs/models.md §1.14): a hierarchical collective's local phases measured
//! from the counter samples of the same-host link and the NICs.

use std::collections::BTreeMap;

use super::*;
use crate::timeline::{join::Arrival, windows::NicInfo, Activity, Collective, CounterLog, NicSample, Step, StepSource};

/// 4 ranks, 2 per host (pid = rank), all arriving at 0 and leaving at `t1`.
fn job(hosts: [&str; 2], t1: f64) -> Collective {
    Collective {
        comm: "c".into(),
        seq: 0,
        op: "all_reduce".into(),
        library: "nccl".into(),
        bytes: Some(4_000_000),
        nranks: Some(4),
        arrivals: (0..4u32)
            .map(|rank| Arrival { rank, host: hosts[rank as usize / 2].into(), pid: rank, enter: 0.0, exit: t1, aborted: false, clock: Default::default() })
            .collect(),
    }
}

/// Host a's counters every 0.1 s over [0, 1.2]: the job's ranks 0 and 1 send over `lo` at
/// 10 MB/s in [0, 0.25) and [0.75, 1.0), over rail0 (1 MB/s) in [0.25, 0.75); `lo_measured`:
/// whether the tcp source read the same-host link.
fn log(lo_measured: bool) -> CounterLog {
    log_named(lo_measured, "")
}

/// [`log`] with the NICs named `{prefix}lo` and `{prefix}rail0`.
fn log_named(lo_measured: bool, prefix: &str) -> CounterLog {
    let mut log = CounterLog::new(64);
    let lo_rate = |k: u32| if k < 25 || (75..100).contains(&k) { 10e6 } else { 0.0 };
    let nic_rate = |k: u32| if (25..75).contains(&k) { 1e6 } else { 0.0 };
    let (mut lo, mut nic) = (0.0, 0.0);
    for k in 0..=120u32 {
        let t = f64::from(k) * 0.01;
        if k % 10 == 0 {
            let host = Some("a".to_string());
            let lo_info = NicInfo { name: format!("{prefix}lo"), host: host.clone(), ..Default::default() };
            let own_lo = lo_measured.then(|| vec![(0, lo / 2.0), (1, lo / 2.0)]);
            log.push(lo_info, NicSample { time: t, own_tx: own_lo, ..Default::default() });
            let rail = NicInfo { name: format!("{prefix}rail0"), host, rail: Some(0), rate_bytes_per_second: Some(1e6) };
            log.push(rail, NicSample { time: t, tx_bytes: nic, own_tx: Some(vec![(0, nic / 2.0), (1, nic / 2.0)]), ..Default::default() });
        }
        lo += lo_rate(k) * 0.01;
        nic += nic_rate(k) * 0.01;
    }
    log
}

#[test]
fn the_local_phases_are_the_local_only_slices_and_half_of_those_at_a_phase_edge() {
    let c = job(["a", "b"], 1.0);
    let m = measure_same_host(&c, &log(true), &Activity::default(), |w| w).expect("measured");
    // 5 MB over lo: 2.5 MB in each local phase; 4 slices local only, 0.2–0.3 and 0.7–0.8 hold
    // a phase edge (half each): 0.5 s, the phases' own length.
    assert!((m.bytes - 5e6).abs() < 1.0, "{m:?}");
    assert!((m.seconds - 0.5).abs() < 1e-6, "{m:?}");
    assert_eq!(m.slices, 10);
    assert!(m.idle_seconds.abs() < 1e-9, "{m:?}");
    // Cluster `diagnose` names the NICs of several hosts `host/netdev`: the same.
    assert_eq!(measure_same_host(&c, &log_named(true, "a/"), &Activity::default(), |w| w), Some(m));
    // The transfer ending 0.2 s after the job's bytes did (its ranks waited): idle, not local.
    let m = measure_same_host(&job(["a", "b"], 1.2), &log(true), &Activity::default(), |w| w).expect("measured");
    assert!((m.seconds - 0.5).abs() < 1e-6 && (m.idle_seconds - 0.2).abs() < 1e-6, "{m:?}");
    // Without the same-host link measured: nothing to say (the step notes it).
    assert_eq!(measure_same_host(&c, &log(false), &Activity::default(), |w| w), None);
    // All ranks on one host: its whole transfer is local, there is no phase to tell apart.
    assert_eq!(measure_same_host(&job(["a", "a"], 1.0), &log(true), &Activity::default(), |w| w), None);
}

#[test]
fn samples_too_far_apart_to_tell_the_phases_apart_count_half_of_the_slice() {
    // The same job with one sample at 0 and one at 1.2 s: the only slice carried both links.
    let full = log(true);
    let mut coarse = CounterLog::new(8);
    for w in full.window(0.0, 0.0) {
        coarse.push(w.nic.clone(), NicSample { time: 0.0, own_tx: Some(vec![(0, 0.0), (1, 0.0)]), ..Default::default() });
    }
    let at_end = full.window(0.0, 1.2);
    for w in at_end {
        let own = w.own_tx.clone().expect("own");
        coarse.push(w.nic.clone(), NicSample { time: 1.2, tx_bytes: w.tx_bytes, own_tx: Some(own), ..Default::default() });
    }
    let m = measure_same_host(&job(["a", "b"], 1.0), &coarse, &Activity::default(), |w| w).expect("measured");
    assert_eq!(m.slices, 1);
    assert!((m.seconds - 0.5).abs() < 1e-6, "{m:?}");
}

fn attribute_with(same_host: Option<SameHost>) -> Attribution {
    let c = job(["a", "b"], 1.0);
    let s = Step { id: 1, begin: 0.0, end: 1.0, source: StepSource::Markers, ranks: BTreeMap::new() };
    // Host a's rail carried 0.5 MB of the ranks' own at 1 MB/s: 0.5 s of ideal.
    let rail = NicWindow {
        nic: NicInfo { name: "rail0".into(), host: Some("a".into()), rail: Some(0), rate_bytes_per_second: Some(1e6) },
        tx_bytes: 0.5e6,
        own_tx: Some(vec![(0, 0.25e6), (1, 0.25e6)]),
        ..Default::default()
    };
    let cs = [&c];
    let same = [same_host];
    let p = Params { alpha: 0.0, ..Params::default() };
    attribute(&StepData { step: &s, collectives: &cs, windows: &[vec![rail]], net: &[], same_host: &same, dropped_events: false }, &p)
}

#[test]
fn the_local_phases_are_intra_host_not_unexplained_with_their_bytes_as_evidence() {
    let m = SameHost { bytes: 5e6, seconds: 0.5, slices: 10, idle_seconds: 0.0 };
    let m2 = m.clone();
    let a = attribute_with(Some(m));
    assert!((a.cause(CauseKind::IdealComm) - 0.5).abs() < 1e-3, "{:?}", a.causes);
    assert!((a.cause(CauseKind::IntraHost) - 0.5).abs() < 1e-3, "{:?}", a.causes);
    assert!(a.cause(CauseKind::Unexplained).abs() < 1e-3, "{:?}", a.causes);
    let sum: f64 = a.causes.iter().map(|c| c.seconds).sum();
    assert!((sum - 1.0).abs() < 1e-12);
    let c = a.causes.iter().find(|c| c.kind == CauseKind::IntraHost).expect("intra_host");
    assert_eq!(c.evidence["same_host_bytes"], 5e6);
    assert_eq!(c.evidence["link"], "lo");
    assert!(c.fix.contains("5.0 MB") && c.fix.contains("10.0 MB/s"), "{}", c.fix);
    assert!(!CauseKind::IntraHost.is_problem(), "a hierarchical collective needs its local phases");
    // More measured than the transfer leaves: bounded, the parts still sum to the step.
    let a = attribute_with(Some(SameHost { seconds: 0.8, ..m2 }));
    assert!((a.cause(CauseKind::IntraHost) - 0.5).abs() < 1e-3, "{:?}", a.causes);
    // Not measured: the local phases stay unexplained, and the step says why.
    let a = attribute_with(None);
    assert!((a.cause(CauseKind::Unexplained) - 0.5).abs() < 1e-3, "{:?}", a.causes);
    assert_eq!(a.cause(CauseKind::IntraHost), 0.0);
    assert!(a.notes.iter().any(|n| n.contains("moved no bytes the agent sees between them")), "{:?}", a.notes);
}
