//! Attribution with the job's own bytes per NIC measured (`sources/tcp/own.rs`): another
//! program's traffic on a rail the job uses is congestion, never the job's rail imbalance.

use std::collections::BTreeMap;

use super::*;
use crate::timeline::{join::Arrival, windows::NicInfo, Collective, NicWindow, Step, StepSource};

/// A hierarchical job's cross-host phase: ranks 0–3 on host a (pid = rank), 4–7 on host b.
fn job(t1: f64) -> Collective {
    Collective {
        comm: "c".into(),
        seq: 0,
        op: "all_reduce".into(),
        library: "gloo".into(),
        bytes: Some(1_000_000),
        nranks: Some(8),
        arrivals: (0..8u32)
            .map(|rank| Arrival {
                rank,
                host: if rank < 4 { "a" } else { "b" }.into(),
                pid: rank,
                enter: 0.0,
                exit: t1,
                aborted: false,
                clock: Default::default(),
            })
            .collect(),
    }
}

/// Host a's rail `i` (1 MB/s) that sent `own` bytes of pid `i` and `other` bytes of others.
fn rail(i: u32, own: f64, other: f64, measured: bool) -> NicWindow {
    NicWindow {
        nic: NicInfo { name: format!("rail{i}"), host: Some("a".into()), rail: Some(i), rate_bytes_per_second: Some(1e6) },
        tx_bytes: own + other,
        max_backlog_bytes: if own + other > 0.0 { 30_000.0 } else { 0.0 },
        // Every rank of host a known (pids 0–3), each with its bytes on this rail.
        own_tx: measured.then(|| (0..4).map(|p| (p, if p == i { own } else { 0.0 })).collect()),
        ..Default::default()
    }
}

fn run(t1: f64, rails: Vec<NicWindow>) -> Attribution {
    let c = job(t1);
    let s = Step { id: 1, begin: 0.0, end: t1, source: StepSource::Markers, ranks: BTreeMap::new() };
    let cs = [&c];
    attribute(&StepData { step: &s, collectives: &cs, windows: &[rails], net: &[], same_host: &[], dropped_events: false }, &Params::default())
}

fn evidence(a: &Attribution, k: CauseKind) -> &BTreeMap<String, serde_json::Value> {
    &a.causes.iter().find(|c| c.kind == k).expect("cause").evidence
}

#[test]
fn another_programs_flow_on_one_rail_is_congestion_not_rail_imbalance() {
    // Each rank of host a sends 1 MB on its own rail; a bulk flow put 2 MB more on rail 1, so
    // the phase took 3 s instead of 1 s.
    let rails = |measured| (0..4).map(|i| rail(i, 1e6, if i == 1 { 2e6 } else { 0.0 }, measured)).collect::<Vec<_>>();
    let a = run(3.0, rails(true));
    assert!((a.cause(CauseKind::Congestion) - 2.0).abs() < 1e-4, "{:?}", a.causes);
    assert!(a.cause(CauseKind::RailImbalance) < 1e-9, "{:?}", a.causes);
    assert!((a.cause(CauseKind::IdealComm) - 1.0).abs() < 0.01, "{:?}", a.causes);
    let ev = evidence(&a, CauseKind::Congestion);
    assert_eq!(ev["nic"], "rail1");
    assert_eq!(ev["other_traffic_bytes"], 2e6);
    assert_eq!(ev["other_traffic_measured"], true);
    let rails_ev = evidence(&a, CauseKind::RailImbalance);
    assert!(rails_ev["busiest_share"].as_f64().is_some_and(|s| (s - 0.25).abs() < 1e-9), "the job's own bytes are balanced: {rails_ev:?}");
    assert!(!a.notes.iter().any(|n| n.contains("not measured")), "{:?}", a.notes);
    // The same counters without own bytes: inferred from the bytes the ring should have
    // sent, which a hierarchical job's phase does not follow — and the step says so.
    let a = run(3.0, rails(false));
    assert!(a.notes.iter().any(|n| n.contains("own bytes were not measured on rail0, rail1, rail2, rail3")), "{:?}", a.notes);
    assert_eq!(evidence(&a, CauseKind::Congestion)["other_traffic_measured"], false);
}

#[test]
fn the_jobs_own_imbalance_stays_rail_imbalance_and_a_flow_on_a_rail_it_did_not_use_is_nothing() {
    // A flat ring: 4 MB of the job on rail 0 (4 s at 1 MB/s); a bulk flow of 2 MB on rail 2,
    // which the job did not use.
    let rails: Vec<NicWindow> = (0..4).map(|i| rail(i, if i == 0 { 4e6 } else { 0.0 }, if i == 2 { 2e6 } else { 0.0 }, true)).collect();
    let a = run(4.0, rails);
    assert!((a.cause(CauseKind::RailImbalance) - 3.0).abs() < 0.01, "{:?}", a.causes);
    assert!(a.cause(CauseKind::Congestion) < 1e-9, "{:?}", a.causes);
    assert_eq!(evidence(&a, CauseKind::RailImbalance)["busiest_nic"], "rail0");
}

#[test]
fn other_bytes_on_a_link_with_idle_time_and_no_queue_delay_nothing() {
    // 1 MB of ours and 0.5 MB of others in a 3 s transfer (the link half idle, no queue):
    // the others used capacity we did not need.
    let mut w = rail(0, 1e6, 0.5e6, true);
    w.max_backlog_bytes = 0.0;
    let mut rails: Vec<NicWindow> = (1..4).map(|i| rail(i, 1e6, 0.0, true)).collect();
    rails.iter_mut().for_each(|r| r.max_backlog_bytes = 0.0);
    rails.insert(0, w);
    let a = run(3.0, rails);
    assert!(a.cause(CauseKind::Congestion) < 1e-9, "{:?}", a.causes);
    // Bounded by what our own bytes leave of the transfer: 2.5 MB of others queued ahead of
    // 1 MB of ours in a 3 s transfer delay it by 2 s, not 2.5 s.
    let rails: Vec<NicWindow> = (0..4).map(|i| rail(i, 1e6, if i == 0 { 2.5e6 } else { 0.0 }, true)).collect();
    let a = run(3.0, rails);
    assert!((a.cause(CauseKind::Congestion) - 2.0).abs() < 1e-4, "{:?}", a.causes);
}

#[test]
fn rdma_bytes_leave_own_bytes_unmeasured() {
    let mut w = rail(0, 1e6, 0.0, true);
    w.opaque_tx_bytes = 1e6;
    assert_eq!(w.own_tx_of(&[0]), None);
    w.opaque_tx_bytes = 0.0;
    assert_eq!(w.own_tx_of(&[0, 3]), Some(1e6));
    assert_eq!(w.own_tx_of(&[3]), Some(0.0));
    assert_eq!(w.own_tx_of(&[0, 5]), None, "pid 5 was not known at the window's start");
}
