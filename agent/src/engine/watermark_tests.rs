//! The engine on recorded inputs: a step is attributed only once its probe events and counter
//! samples are in (the consumer's watermark), or closed incomplete at `max_wait`.

use std::sync::{Arc, Mutex};

use prometheus_client::registry::Registry;

use super::*;
use crate::attribution::CauseKind;
use crate::{
    sources::collectives::{
        decode::{Call, CommId},
        history::{ClockMap, History},
        targets::Family,
    },
    timeline::markers::Phase,
};

/// A history whose wall clock is the monotonic clock (offset 0): ns = wall seconds × 1e9.
fn history() -> SharedHistory {
    let mut h = History::new("h".into(), 1024);
    h.clock = ClockMap { offset_ns: 0, error_seconds: 0.0, synchronized: true };
    Arc::new(Mutex::new(h))
}

fn all_reduce(rank: u32, seq: u64, enter: f64, exit: f64) -> Call {
    Call {
        pid: 100 + rank,
        tid: 100 + rank,
        library: Family::Mpi,
        op: "all_reduce".into(),
        bytes: Some(1 << 20),
        comm: Some(CommId(0xc0ffee)),
        comm_global: true,
        rank: Some(rank),
        nranks: Some(2),
        seq: Some(seq),
        enter_ns: (enter * 1e9) as u64,
        exit_ns: (exit * 1e9) as u64,
        ret: Some(0),
        aborted: false,
        grouped: false,
    }
}

fn marker(rank: u32, step: u64, phase: Phase, time: f64) -> Marker {
    Marker { rank, step, phase, time: Some(time), host: None }
}

/// Step `id` of a 2-rank job from `t` to `t + 0.5` s, its all-reduce at 0.2–0.4 s (rank 1
/// 50 ms late), markers and calls recorded.
fn record_step(e: &mut Engine, h: &SharedHistory, id: u64, t: f64) {
    for rank in 0..2 {
        e.add_marker(marker(rank, id, Phase::Begin, t));
        e.add_marker(marker(rank, id, Phase::End, t + 0.5));
    }
    let mut g = h.lock().expect("history");
    g.push_call(all_reduce(0, id, t + 0.2, t + 0.4));
    g.push_call(all_reduce(1, id, t + 0.25, t + 0.4));
}

fn engine(h: &SharedHistory) -> Engine {
    let mut e = Engine::new(StepsConfig::default(), "h".into(), &mut Registry::default()).expect("engine");
    e.set_calls(h.clone());
    e
}

#[test]
fn a_step_waits_for_the_probe_consumer_to_drain_past_its_end() {
    let h = history();
    let mut e = engine(&h);
    record_step(&mut e, &h, 1, 100.0);
    // Past the 1 s grace, but the consumer has drained only up to 100.3 s: under load the
    // step's calls may still be in the ring, so it is not attributed yet.
    h.lock().expect("history").drained_until = 100.3;
    e.tick(102.0, 0);
    assert_eq!(e.steps().len(), 0, "attributed before its events were in");
    h.lock().expect("history").drained_until = 101.9;
    e.tick(102.1, 0);
    let steps: Vec<Attribution> = e.steps();
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].collectives, 1, "{:?}", steps[0]);
    assert!(!steps[0].incomplete, "{:?}", steps[0].notes);
    assert!((steps[0].cause(CauseKind::ReadinessSkew) - 0.05).abs() < 1e-6, "{:?}", steps[0].causes);
}

#[test]
fn a_step_closed_at_max_wait_is_incomplete_and_says_why() {
    let h = history();
    let mut e = engine(&h);
    h.lock().expect("history").drained_until = 99.0;
    record_step(&mut e, &h, 1, 100.0);
    e.tick(110.0, 0);
    assert_eq!(e.steps().len(), 0, "closed before max_wait (10 s)");
    e.tick(110.6, 0);
    let a = e.steps().into_iter().next().expect("closed at max_wait");
    assert!(a.incomplete, "a step closed early must not look complete");
    assert!(a.notes.iter().any(|n| n.contains("max_wait") && n.contains("behind")), "{:?}", a.notes);
}

#[test]
fn a_step_waits_for_a_counter_sweep_after_its_end() {
    assert_eq!(missing_data(10.0, 11.0, 11.0), None);
    assert!(missing_data(10.0, 11.0, 9.9).is_some_and(|m| m.contains("counter sweep")));
    assert!(missing_data(10.0, 9.0, 11.0).is_some_and(|m| m.contains("1.0 s behind")));
    assert!(missing_data(10.0, 0.0, 11.0).is_some_and(|m| m.contains("first events")));
}

#[test]
fn a_step_holding_lost_events_of_an_exited_process_is_incomplete() {
    let h = history();
    let mut e = engine(&h);
    record_step(&mut e, &h, 1, 100.0);
    record_step(&mut e, &h, 2, 101.0);
    {
        let mut g = h.lock().expect("history");
        g.drained_until = 105.0;
        // Events at 101.2 s of a process that had exited before it could be inspected.
        g.push_lost(101.2);
        g.push_lost(101.3);
    }
    e.tick(103.0, 0);
    let steps: Vec<Attribution> = e.steps();
    assert_eq!(steps.len(), 2);
    let (one, two) = (steps.iter().find(|a| a.step == 1).expect("step 1"), steps.iter().find(|a| a.step == 2).expect("step 2"));
    assert!(!one.incomplete, "{:?}", one.notes);
    assert!(two.incomplete && two.notes.iter().any(|n| n.contains("exited before")), "{:?}", two.notes);
}

#[test]
fn a_step_waits_until_later_drops_can_no_longer_be_dated_into_it() {
    // A 200 ms grace: without the drop margin the step ending at 101.5 s would be attributed
    // complete at 101.8 s, and the drops the tick at 102.2 s sees — dated back a second, to
    // 101.2 s — would fall into it after the fact (cluster `diagnose` reads those spans).
    let h = history();
    let cfg = StepsConfig { grace: std::time::Duration::from_millis(200), ..StepsConfig::default() };
    let mut e = Engine::new(cfg, "h".into(), &mut Registry::default()).expect("engine");
    e.set_calls(h.clone());
    record_step(&mut e, &h, 1, 100.0);
    record_step(&mut e, &h, 2, 101.0);
    h.lock().expect("history").drained_until = 110.0;
    e.tick(101.8, 0);
    let ids: Vec<u64> = e.steps().iter().map(|a| a.step).collect();
    assert_eq!(ids, vec![1], "step 2 ended 0.3 s ago: past the grace, not past the drop margin");
    e.tick(102.2, 5);
    e.tick(102.6, 5);
    let steps = e.steps();
    let two = steps.iter().find(|a| a.step == 2).expect("step 2 once the margin passed");
    assert!(two.incomplete && two.notes.iter().any(|n| n.contains("were dropped")), "{:?}", two.notes);
    let one = steps.iter().find(|a| a.step == 1).expect("step 1");
    assert!(!one.incomplete, "{:?}", one.notes);
    assert_eq!(h.lock().expect("history").drops.since(0.0), vec![(101.2, 102.2)], "the span the page serves");
}
