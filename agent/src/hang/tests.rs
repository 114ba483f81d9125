use std::time::Duration;

use super::*;
use crate::timeline::open::{CommProgress, DoneCall};

fn cfg() -> HangConfig {
    HangConfig { floor: Duration::from_secs(2), k: 5.0, ..Default::default() }
}

fn rank(r: u32, host: &str, open: Option<(u64, f64)>, done: Option<u64>) -> RankProgress {
    RankProgress {
        rank: Some(r),
        pid: 100 + r,
        host: host.into(),
        open: open.map(|(seq, since)| OpenCall { seq, op: "all_reduce".into(), bytes: None, tid: 100 + r, since }),
        last_done: done.map(|seq| DoneCall { seq, op: "all_reduce".into(), bytes: None, exit: 50.0 + seq as f64 }),
        ..Default::default()
    }
}

fn view(host: &str, as_of: f64, median: f64, ranks: Vec<RankProgress>) -> HostProgress {
    HostProgress {
        host: host.into(),
        as_of,
        comms: vec![CommProgress {
            comm: "00000000000000aa".into(),
            global: true,
            library: "mpi".into(),
            nranks: Some(4),
            median_seconds: Some(median),
            samples: 10,
            ranks,
        }],
    }
}

#[test]
fn a_rank_that_never_arrived_is_named_once_past_the_threshold() {
    let ranks = |t| {
        vec![rank(0, "a", Some((7, 100.0)), Some(6)), rank(1, "a", Some((7, 100.2)), Some(6)), rank(2, "a", None, Some(6)), rank(3, "a", Some((7, t)), Some(6))]
    };
    // 1.5 s inside: under the 2 s floor.
    let h = evaluate(&[view("a", 101.5, 0.01, ranks(100.1))], &cfg(), false);
    assert_eq!(h.len(), 1);
    assert!(!h[0].suspected && h[0].missing.len() == 1);
    let h = evaluate(&[view("a", 102.5, 0.01, ranks(100.1))], &cfg(), false);
    let h = &h[0];
    assert!(h.suspected, "{h:?}");
    assert_eq!((h.seq, h.inside.len(), h.threshold_seconds), (7, 3, 2.0));
    assert!((h.open_seconds - 2.5).abs() < 1e-9);
    let m = &h.missing[0];
    assert_eq!((m.rank, m.why, m.last_done_seq, m.host.as_deref()), (Some(2), Why::NotArrived, Some(6), Some("a")));
}

#[test]
fn a_stopped_rank_inside_the_call_is_not_progressing() {
    let mut ranks: Vec<RankProgress> = (0..4).map(|r| rank(r, "a", Some((7, 100.0 + r as f64 * 0.1)), Some(6))).collect();
    let state = |s: &str| Some(ProcState { state: s.into(), ..Default::default() });
    for r in &mut ranks {
        r.state = state("S (sleeping)");
    }
    ranks[2].state = state("T (stopped)");
    let h = evaluate(&[view("a", 103.0, 0.01, ranks.clone())], &cfg(), false);
    let h = &h[0];
    assert!(h.suspected, "{h:?}");
    assert_eq!(h.inside.iter().filter_map(|i| i.rank).collect::<Vec<_>>(), [0, 1, 3]);
    let m = &h.missing[0];
    assert_eq!((m.rank, m.why, m.state.as_ref().map(|s| s.state.as_str())), (Some(2), Why::NotProgressing, Some("T (stopped)")));
    // Before the threshold it is listed but not suspected; running again, it is inside.
    assert!(!evaluate(&[view("a", 101.0, 0.01, ranks.clone())], &cfg(), false)[0].suspected);
    ranks[2].state = state("R (running)");
    assert!(!evaluate(&[view("a", 103.0, 0.01, ranks)], &cfg(), false)[0].suspected);
}

#[test]
fn a_slow_call_every_rank_is_inside_is_not_a_hang() {
    let all_in = (0..4).map(|r| rank(r, "a", Some((7, 100.0 + r as f64 * 0.1)), Some(6))).collect();
    let h = evaluate(&[view("a", 200.0, 0.01, all_in)], &cfg(), false);
    assert!(h[0].missing.is_empty() && !h[0].suspected && h[0].desync.is_none(), "{:?}", h[0]);
}

/// Every rank inside #7, but rank 2 in a broadcast: the others can never finish. A desync,
/// suspected past the threshold; a count that differs (rank 1 returned from #7 with half the
/// bytes, the others still inside) is one too.
#[test]
fn ranks_inside_different_calls_at_one_number_are_a_desync_hang() {
    let mut ranks: Vec<RankProgress> = (0..4).map(|r| rank(r, "a", Some((7, 100.0 + r as f64 * 0.1)), Some(6))).collect();
    ranks[2].open.as_mut().expect("open").op = "broadcast".into();
    assert!(!evaluate(&[view("a", 101.0, 0.01, ranks.clone())], &cfg(), false)[0].suspected, "under the threshold");
    let h = &evaluate(&[view("a", 103.0, 0.01, ranks)], &cfg(), false)[0];
    assert!(h.suspected && h.missing.is_empty(), "{h:?}");
    let d = h.desync.as_ref().expect("desync");
    assert_eq!((d.seq, d.odd_ranks.clone(), d.groups[1].op.as_str()), (7, vec![2], "broadcast"));

    let mut ranks: Vec<RankProgress> = (0..4).map(|r| rank(r, "a", Some((7, 100.0)), Some(6))).collect();
    for r in &mut ranks {
        r.open.as_mut().expect("open").bytes = Some(4096);
    }
    ranks[1].open = None;
    ranks[1].last_done = Some(DoneCall { seq: 7, op: "all_reduce".into(), bytes: Some(2048), exit: 100.1 });
    let h = &evaluate(&[view("a", 103.0, 0.01, ranks)], &cfg(), false)[0];
    assert!(h.suspected, "{h:?}");
    let d = h.desync.as_ref().expect("desync");
    assert_eq!((d.odd_ranks.clone(), d.groups[1].bytes), (vec![1], Some(2048)));

    // A rank whose own numbers run one ahead (mid-job attach): inside #8 (the others' #7),
    // its last completed #7 an earlier broadcast. Not a desync.
    let mut ranks: Vec<RankProgress> = (0..4).map(|r| rank(r, "a", Some((7, 100.0)), Some(6))).collect();
    ranks[2].open = Some(OpenCall { seq: 8, op: "all_reduce".into(), bytes: None, tid: 1, since: 100.0 });
    ranks[2].last_done = Some(DoneCall { seq: 7, op: "broadcast".into(), bytes: None, exit: 99.0 });
    let h = &evaluate(&[view("a", 103.0, 0.01, ranks)], &cfg(), false)[0];
    assert!(h.desync.is_none() && !h.suspected, "{h:?}");
}

#[test]
fn k_times_the_median_raises_the_threshold_above_the_floor() {
    let ranks = vec![rank(0, "a", Some((7, 100.0)), Some(6)), rank(1, "a", None, Some(6))];
    // median 1 s → threshold 5 s: 4 s inside is slow, not suspect.
    let h = evaluate(&[view("a", 104.0, 1.0, ranks.clone())], &cfg(), false);
    assert!(!h[0].suspected && h[0].threshold_seconds == 5.0);
    assert!(evaluate(&[view("a", 105.5, 1.0, ranks)], &cfg(), false)[0].suspected);
}

#[test]
fn an_exited_rank_is_evidence_and_says_how_it_ended() {
    let mut dead = rank(1, "a", None, Some(6));
    dead.aborted = Some(OpenCall { seq: 7, op: "all_reduce".into(), bytes: None, tid: 101, since: 100.0 });
    dead.exited = Some(Exit { at: 100.5, signal: Some(9), code: None });
    let v = view(
        "a",
        103.0,
        0.01,
        vec![rank(0, "a", Some((7, 100.0)), Some(6)), dead, rank(2, "a", Some((7, 100.0)), Some(6)), rank(3, "a", Some((7, 100.0)), Some(6))],
    );
    let h = &evaluate(&[v], &cfg(), false)[0];
    assert!(h.suspected);
    let m = &h.missing[0];
    assert_eq!((m.rank, m.why), (Some(1), Why::Exited));
    assert_eq!(m.exited.as_ref().map(Exit::how).as_deref(), Some("signal 9 (SIGKILL)"));
    assert_eq!(m.aborted.as_ref().map(|a| a.seq), Some(7));
}

#[test]
fn ranks_on_other_hosts_count_only_when_every_host_answered() {
    // Host a sees ranks 0, 1 inside; ranks 2, 3 live on host b.
    let a = view("a", 110.0, 0.01, vec![rank(0, "a", Some((7, 100.0)), Some(6)), rank(1, "a", Some((7, 100.0)), Some(6))]);
    let alone = &evaluate(std::slice::from_ref(&a), &cfg(), false)[0];
    assert!(!alone.suspected, "host a alone cannot tell whether b's ranks are inside");
    assert_eq!(alone.missing.iter().filter(|m| m.why == Why::NotSeen).count(), 2);
    assert!(evaluate(std::slice::from_ref(&a), &cfg(), true)[0].suspected, "cluster view: ranks 2, 3 seen nowhere");
    // b answers: rank 3 inside, rank 2 still before the call, on host b.
    let b = view("b", 110.2, 0.01, vec![rank(2, "b", None, Some(6)), rank(3, "b", Some((7, 100.1)), Some(6))]);
    let joined = &evaluate(&[a, b], &cfg(), true)[0];
    assert!(joined.suspected);
    assert_eq!(joined.inside.len(), 3);
    assert_eq!(joined.missing.len(), 1);
    assert_eq!((joined.missing[0].rank, joined.missing[0].host.as_deref(), joined.missing[0].why), (Some(2), Some("b"), Why::NotArrived));
}

#[test]
fn a_rank_past_the_call_has_arrived_and_local_communicators_stay_apart() {
    // Rank 1 completed seq 7 already (a broadcast root): not missing.
    let v = view("a", 110.0, 0.01, vec![rank(0, "a", Some((7, 100.0)), Some(6)), rank(1, "a", None, Some(7))]);
    let mut v2 = v.clone();
    v2.comms[0].nranks = Some(2);
    assert!(evaluate(&[v2], &cfg(), true)[0].missing.is_empty());
    // The same host-local id on two hosts is two communicators.
    let mut a = view("a", 110.0, 0.01, vec![rank(0, "a", Some((7, 100.0)), Some(6))]);
    let mut b = view("b", 110.0, 0.01, vec![rank(0, "b", Some((7, 100.0)), Some(6))]);
    for x in [&mut a, &mut b] {
        x.comms[0].global = false;
        x.comms[0].nranks = None;
    }
    assert_eq!(evaluate(&[a, b], &cfg(), true).len(), 2);
}

#[test]
fn the_detector_holds_a_suspicion_and_exports_it() {
    let mut reg = prometheus_client::registry::Registry::default();
    let mut c = cfg();
    c.clear_after = Duration::from_secs(3);
    let mut d = detector::Detector::new(c, &mut reg);
    let stuck = view("a", 103.0, 0.01, vec![rank(0, "a", Some((7, 100.0)), Some(6)), rank(1, "a", None, Some(6))]);
    d.update(&stuck, 103.0);
    assert!(d.hangs()[0].suspected);
    let text = |reg: &prometheus_client::registry::Registry| {
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, reg).expect("encode");
        s
    };
    let m = text(&reg);
    assert!(m.contains("stepwise_hang_suspected{comm=\"00000000000000aa\",library=\"mpi\"} 1"), "{m}");
    assert!(m.contains("stepwise_hang_missing_ranks{comm=\"00000000000000aa\",library=\"mpi\"} 1"), "{m}");
    assert!(m.contains("stepwise_hang_suspicions_total 1"), "{m}");
    // The call completed: nothing open. Held for clear_after, then cleared.
    let done = view("a", 104.0, 0.01, vec![rank(0, "a", None, Some(7)), rank(1, "a", None, Some(7))]);
    d.update(&done, 104.0);
    d.update(&done, 106.0);
    let held = &d.hangs()[0];
    assert!(held.suspected && !held.rule && held.open_seconds == 0.0, "held for clear_after: {held:?}");
    assert_eq!(held.missing[0].rank, Some(1), "the held verdict still names the missing rank");
    assert!(text(&reg).contains("stepwise_hang_suspected{comm=\"00000000000000aa\",library=\"mpi\"} 1"), "held: the series reads 1");
    d.update(&done, 107.5);
    assert!(d.hangs().is_empty(), "cleared after clear_after");
    assert!(text(&reg).contains("stepwise_hang_suspected{comm=\"00000000000000aa\",library=\"mpi\"} 0"), "cleared: the series reads 0");
    let m = text(&reg);
    assert!(m.contains("stepwise_collective_open_seconds{comm=\"00000000000000aa\",library=\"mpi\"} 0"), "{m}");
    assert!(m.contains("stepwise_hang_suspicions_total 1"));
    // The job ended: its communicator's series go.
    let mut gone = done.clone();
    for r in &mut gone.comms[0].ranks {
        r.exited = Some(Exit { at: 108.0, signal: None, code: Some(0) });
    }
    d.update(&gone, 108.0);
    assert!(text(&reg).contains("stepwise_collective_open_seconds{comm=\"00000000000000aa\",library=\"mpi\"} 0"), "kept at 0 for a while");
    d.update(&gone, 108.0 + detector::LINGER_SECONDS);
    let m = text(&reg);
    assert!(!m.contains("comm=\"00000000000000aa\""), "{m}");
    assert!(m.contains("stepwise_hang_suspicions_total 1"));
}
