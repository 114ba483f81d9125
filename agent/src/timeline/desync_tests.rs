use super::*;
use crate::timeline::{
    join::{tests::call, Timing},
    open::{CommProgress, RankProgress},
};

/// Rank `r`'s completed call `seq` of a 4-rank job (`op`, `bytes`), timed to completion.
fn done(seq: u64, r: u32, op: &str, bytes: Option<u64>) -> CallView {
    let t = 10.0 + 0.1 * seq as f64;
    let mut c = call("w", seq, r, "a", t + 0.001 * f64::from(r), t + 0.05);
    c.op = op.into();
    c.bytes = bytes;
    c.clock.timing = Timing::HostCompletion;
    c
}

fn healthy(steps: u64) -> Vec<CallView> {
    (0..steps).flat_map(|k| (0..4).map(move |r| done(k, r, "all_reduce", Some(8000)))).collect()
}

fn find_in(calls: &[CallView], open: &[HostProgress]) -> Vec<Desync> {
    let refs: Vec<&CallView> = calls.iter().collect();
    find(&refs, open)
}

fn open_view(ranks: &[(u32, u64, &str)]) -> HostProgress {
    let ranks = ranks
        .iter()
        .map(|&(r, seq, op)| RankProgress {
            rank: Some(r),
            pid: 100 + r,
            host: "a".into(),
            open: Some(OpenCall { seq, op: op.into(), bytes: Some(8000), tid: 1, since: 20.0 + f64::from(r) }),
            ..Default::default()
        })
        .collect();
    let comm = CommProgress { comm: "w".into(), global: true, library: "mpi".into(), nranks: Some(4), ranks, ..Default::default() };
    HostProgress { host: "a".into(), as_of: 30.0, comms: vec![comm] }
}

#[test]
fn agreeing_ranks_are_no_desync() {
    assert!(find_in(&healthy(8), &[]).is_empty());
    // Bytes unknown on one rank (gloo, MPI's derived types) match its operation.
    let mut calls = healthy(4);
    calls[5].bytes = None;
    assert!(find_in(&calls, &[]).is_empty());
}

#[test]
fn ranks_open_in_different_operations_are_a_desync_at_that_number() {
    let d = find_in(&healthy(5), &[open_view(&[(0, 5, "all_reduce"), (1, 5, "all_reduce"), (2, 5, "broadcast"), (3, 5, "all_reduce")])]);
    assert_eq!(d.len(), 1, "{d:?}");
    let d = &d[0];
    assert_eq!((d.comm.as_str(), d.seq, d.odd_ranks.clone(), d.diverging), ("w", 5, vec![2], 1));
    assert_eq!(d.groups[0], Group { op: "all_reduce".into(), bytes: Some(8000), ranks: vec![0, 1, 3] });
    assert_eq!(d.groups[1].ranks, vec![2]);
    assert!(d.calls.iter().all(|c| c.state == CallState::Open));
    assert_eq!(d.since, 20.0);
    assert_eq!(d.summary(), "#5: ranks 0, 1, 3 called all_reduce (8000 B), rank 2 called broadcast (8000 B)");
}

#[test]
fn a_different_count_is_a_desync_and_the_first_number_is_reported() {
    let mut calls = healthy(8);
    for c in calls.iter_mut().filter(|c| c.rank == Some(1) && (c.seq == Some(3) || c.seq == Some(6))) {
        c.bytes = Some(4000);
    }
    let d = find_in(&calls, &[]);
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].seq, d[0].odd_ranks.clone(), d[0].diverging, d[0].shift), (3, vec![1], 2, None));
    assert_eq!(d[0].groups[1], Group { op: "all_reduce".into(), bytes: Some(4000), ranks: vec![1] });
}

/// Each step: all_reduce (8000 B), all_gather (64 B), broadcast (64 B); rank 2 skips
/// step 1's all_reduce (#3): its own numbers from 3 on are the others' one later. With a
/// period of 2 collectives the direction is ambiguous, and a job hung at the divergence
/// shows no later calls: no shift is claimed then.
fn pattern(period: u64, s: u64) -> (&'static str, u64) {
    [("all_reduce", 8000), ("all_gather", 64), ("broadcast", 64)][(s % period) as usize]
}

fn skipped(period: u64, upto: u64) -> Vec<CallView> {
    let mut calls = Vec::new();
    for s in 0..upto {
        let (op, bytes) = pattern(period, s);
        for r in [0u32, 1, 3] {
            calls.push(done(s, r, op, Some(bytes)));
        }
        let (op, bytes) = pattern(period, if s >= 3 { s + 1 } else { s });
        calls.push(done(s, 2, op, Some(bytes)));
    }
    calls
}

#[test]
fn a_skipped_collective_shifts_the_rank_and_is_reported_at_the_first_divergence() {
    let d = find_in(&skipped(3, 12), &[]);
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].seq, d[0].odd_ranks.clone(), d[0].shift), (3, vec![2], Some(1)));
    assert_eq!(d[0].diverging, 9, "every number from #3 disagrees");
    assert!(d[0].summary().contains("rank 2 runs one collective ahead (skipped one)"), "{}", d[0].summary());
    let d = find_in(&skipped(2, 12), &[]);
    assert_eq!((d[0].seq, d[0].shift), (3, None), "period 2: a skip and an extra call look alike");
    let d = find_in(&skipped(3, 4), &[]);
    assert_eq!((d[0].seq, d[0].shift), (3, None), "nothing after the divergence");
}

/// Probes attached mid-job: rank 2's own numbers run one ahead of the others'. The
/// alignment by overlap makes them the same collective: no desync, also with two
/// operations per step; without the alignment every number would disagree.
#[test]
fn numbers_aligned_after_a_late_attach_give_no_false_desync() {
    let mut calls = Vec::new();
    for s in 0..10u64 {
        let (op, bytes) = if s % 2 == 0 { ("all_reduce", 8000) } else { ("all_gather", 64) };
        for r in 0..4u32 {
            if r == 2 {
                calls.push(done(s, r, op, Some(bytes)));
                calls.last_mut().expect("pushed").seq = Some(s + 1);
            } else {
                calls.push(done(s, r, op, Some(bytes)));
            }
        }
    }
    assert!(find_in(&calls, &[]).is_empty(), "{:?}", find_in(&calls, &[]));
}

#[test]
fn only_the_latest_process_of_a_rank_counts() {
    // A first job (8000 B) and a second with the same communicator id (4000 B), new pids.
    let mut calls = healthy(3);
    for k in 0..3u64 {
        for r in 0..4u32 {
            let mut c = done(k, r, "all_reduce", Some(4000));
            c.pid += 1000;
            (c.enter, c.exit) = (c.enter + 100.0, c.exit + 100.0);
            calls.push(c);
        }
    }
    assert!(find_in(&calls, &[]).is_empty());
}

#[test]
fn user_probes_and_calls_without_a_rank_are_not_compared() {
    let mut calls = healthy(2);
    calls[1].op = "train_step".into();
    calls[1].library = "user".into();
    calls[2].op = "broadcast".into();
    calls[2].rank = None;
    assert!(find_in(&calls, &[]).is_empty());
}

#[test]
fn a_step_gets_the_desyncs_at_its_numbers_and_a_shift_from_before() {
    let mut calls = healthy(8);
    for c in calls.iter_mut().filter(|c| c.rank == Some(1) && c.seq == Some(3)) {
        c.bytes = Some(4000);
    }
    let d = find_in(&calls, &[]);
    let joined = crate::timeline::join_calls(&calls);
    let step = |lo: u64, hi: u64| -> Vec<&crate::timeline::Collective> { joined.iter().filter(|c| (lo..=hi).contains(&c.seq)).collect() };
    assert_eq!(of_step(&d, &step(2, 3)).len(), 1);
    assert!(of_step(&d, &step(4, 5)).is_empty(), "one count apart at #3 only");
    assert!(of_step(&d, &[]).is_empty());
    let mut shifted = d.clone();
    shifted[0].shift = Some(1);
    assert_eq!(of_step(&shifted, &step(4, 5)).len(), 1, "a shifted rank disagrees at every later number");
}
