//! Cluster joining on constructed peers' answers: two hosts of 4 ranks, rank 5 (on node-b)
//! 30 ms late in every step, one 64 MiB allreduce and one small allreduce per step, two
//! 100 Gb/s NICs per host.

use super::*;
use crate::{attribution::CauseKind, timeline::Phase};

const T0: f64 = 1_764_500_000.0;
const STEPS: u64 = 6;

fn call(seq: u64, rank: u32, host: &str, enter: f64, exit: f64, bytes: u64) -> CallView {
    CallView {
        comm: Some("00000000c0ffee01".into()),
        comm_global: true,
        seq: Some(seq),
        op: "all_reduce".into(),
        library: "nccl".into(),
        bytes: Some(bytes),
        rank: Some(rank),
        nranks: Some(8),
        host: host.into(),
        pid: 1000 + rank,
        enter,
        exit,
        aborted: false,
        clock: Default::default(),
    }
}

fn peer(host: &str, ranks: std::ops::Range<u32>, markers: bool) -> PeerData {
    let mut p = PeerData { peer: format!("{host}:9477"), host: host.into(), clock_error_seconds: 0.001, clock_synchronized: true, ..Default::default() };
    for k in 0..STEPS {
        let t = T0 + k as f64 * 0.5;
        for r in ranks.clone() {
            let late = if r == 5 { 0.030 } else { 0.0 };
            p.calls.push(call(2 * k, r, host, t + 0.100 + late, t + 0.150, 64 << 20));
            p.calls.push(call(2 * k + 1, r, host, t + 0.160, t + 0.161, 4096));
            if markers {
                p.markers.push(Marker { rank: r, step: k + 1, phase: Phase::Begin, time: Some(t), host: None });
                p.markers.push(Marker { rank: r, step: k + 1, phase: Phase::End, time: Some(t + 0.180), host: None });
            }
        }
    }
    for nic in ["eth0", "eth1"] {
        let info = NicInfo { name: nic.into(), host: None, rail: None, rate_bytes_per_second: Some(12.5e9) };
        let mut tx = 0.0;
        let samples = (0..(STEPS as usize * 50 + 10))
            .map(|i| {
                let t = T0 + i as f64 * 0.01;
                // 100 MB per 10 ms while the big allreduce transfers (t+0.13 … t+0.15).
                let phase = ((t - T0) % 0.5 * 1000.0).round() as i64;
                if phase == 140 || phase == 150 {
                    tx += 100e6;
                }
                NicSample { time: t, tx_bytes: tx, rx_bytes: tx, ..Default::default() }
            })
            .collect();
        p.nics.push((info, samples));
    }
    p
}

fn sel(step: Option<u64>, slowest: Option<usize>) -> Selection {
    Selection { step, slowest, since: None, since_label: None }
}

#[test]
fn joins_two_hosts_and_names_the_late_rank() {
    let peers = [peer("node-a", 0..4, true), peer("node-b", 4..8, true)];
    let an = analyze(&peers, &sel(None, Some(2)), &Params::default()).expect("steps");
    assert_eq!(an.steps.len(), 2);
    // The hosts' clocks agree with every collective (causality bounds them to ± 1 ms: the
    // small all-reduce's last arrival is 1 ms before every exit), tighter than NTP's 2 ms.
    let b = &an.clocks.hosts[0];
    assert!(!b.applied && b.offset_seconds == 0.0, "{b:?}");
    assert!(an.clock_error_seconds.is_some_and(|e| (e - 0.001).abs() < 1e-6), "{:?}", an.clock_error_seconds);
    for s in &an.steps {
        let a = &s.attribution;
        assert!(!a.incomplete, "all 8 ranks seen: {:?}", a.notes);
        assert!((a.seconds - 0.180).abs() < 1e-6, "{}", a.seconds);
        let skew = a.cause(CauseKind::ReadinessSkew);
        assert!((skew - 0.030).abs() < 1e-6, "skew {skew}: {:?}", a.causes);
        assert_eq!(a.top_problem(1e-3).and_then(|c| c.rank), Some(5));
        assert!((a.causes.iter().map(|c| c.seconds).sum::<f64>() - a.seconds).abs() < 1e-9, "parts sum to the step");
        assert!((s.skew.clock_free_seconds.unwrap_or(0.0) - 0.030).abs() < 1e-6, "{:?}", s.skew);
        assert_eq!(s.skew.clock_free_late_rank, Some(5));
        let names: Vec<&str> = s.nics.iter().map(|n| n.nic.as_str()).collect();
        assert_eq!(names, vec!["node-a/eth0", "node-a/eth1", "node-b/eth0", "node-b/eth1"]);
        assert!(s.nics.iter().all(|n| (n.tx_bytes - 200e6).abs() < 1e4), "{:?}", s.nics);
        let r5 = a.ranks.iter().find(|r| r.rank == 5).expect("rank 5");
        assert_eq!(r5.host, "node-b");
    }
}

#[test]
fn without_markers_steps_come_from_the_period() {
    let peers = [peer("node-a", 0..4, false), peer("node-b", 4..8, false)];
    let an = analyze(&peers, &sel(None, Some(1)), &Params::default()).expect("period steps");
    assert!(an.notes.iter().any(|n| n.contains("period")), "{:?}", an.notes);
    let a = &an.steps[0].attribution;
    assert!((a.cause(CauseKind::ReadinessSkew) - 0.030).abs() < 1e-6, "{:?}", a.causes);
}

#[test]
fn a_missing_host_makes_steps_incomplete_and_selection_errors_say_why() {
    let peers = [peer("node-a", 0..4, true)];
    let an = analyze(&peers, &sel(Some(3), None), &Params::default()).expect("step 3");
    assert_eq!(an.steps.len(), 1);
    assert!(an.steps[0].attribution.incomplete, "ranks 4-7 were not seen");
    let e = analyze(&peers, &sel(Some(99), None), &Params::default()).expect_err("no step 99");
    assert!(e.contains("step 99 is not among the 6"), "{e}");
    let mut late = sel(None, Some(1));
    late.since = Some(T0 + 100.0);
    late.since_label = Some("10m".into());
    let e = analyze(&peers, &late, &Params::default()).expect_err("empty range");
    assert!(e.contains("time range empty") && e.contains("10m"), "{e}");
    let e = analyze(&[PeerData::default()], &sel(None, None), &Params::default()).expect_err("no calls");
    assert!(e.contains("no collective calls"), "{e}");
    let mut one = peer("node-a", 0..4, false);
    one.calls.truncate(3);
    let e = analyze(&[one], &sel(None, None), &Params::default()).expect_err("no steps");
    assert!(e.contains("no step markers and no periodic collectives"), "{e}");
}

#[test]
fn a_host_whose_clock_reads_40_ms_ahead_is_moved_back_and_the_straggler_stays_right() {
    let mut b = peer("node-b", 4..8, true);
    for c in &mut b.calls {
        c.enter += 0.040;
        c.exit += 0.040;
    }
    for m in &mut b.markers {
        m.time = m.time.map(|t| t + 0.040);
    }
    for (_, samples) in &mut b.nics {
        for s in samples {
            s.time += 0.040;
        }
    }
    let peers = [peer("node-a", 0..4, true), b];
    let an = analyze(&peers, &sel(None, None), &Params::default()).expect("steps");
    let h = &an.clocks.hosts[0];
    assert!(h.applied && (h.offset_seconds - 0.040).abs() <= h.error_seconds && h.error_seconds <= 0.001 + 1e-9, "{h:?}");
    assert!(an.notes.iter().any(|n| n.contains("node-b read 40.0 ms ahead of node-a")), "{:?}", an.notes);
    assert_eq!(an.steps.len(), STEPS as usize);
    for s in &an.steps {
        let a = &s.attribution;
        assert!((a.seconds - 0.180).abs() < 1e-6, "{}", a.seconds);
        assert!((a.cause(CauseKind::ReadinessSkew) - 0.030).abs() < 1e-6, "{:?}", a.causes);
        assert_eq!(a.top_problem(1e-3).and_then(|c| c.rank), Some(5));
    }
}

#[test]
fn clocks_known_worse_than_the_skew_fall_back_to_the_clock_free_estimate() {
    // Only the 64 MiB all-reduce: every bound on node-b's clock is as wide as its transfer
    // (± 35 ms), wider than rank 5's 30 ms. Node-b reads 40 ms ahead.
    let strip = |mut p: PeerData| {
        p.calls.retain(|c| c.bytes == Some(64 << 20));
        p
    };
    let mut b = strip(peer("node-b", 4..8, true));
    for c in &mut b.calls {
        c.enter += 0.040;
        c.exit += 0.040;
    }
    for m in &mut b.markers {
        m.time = m.time.map(|t| t + 0.040);
    }
    let peers = [strip(peer("node-a", 0..4, true)), b];
    let an = analyze(&peers, &sel(None, None), &Params::default()).expect("steps");
    assert!(an.clocks.hosts[0].error_seconds >= 0.030, "{:?}", an.clocks);
    assert_eq!(an.steps.len(), STEPS as usize);
    for s in &an.steps {
        let a = &s.attribution;
        let skew = a.causes.iter().find(|c| c.kind == CauseKind::ReadinessSkew).expect("skew");
        assert_eq!(skew.evidence["estimate"].as_str(), Some("clock_free"), "{:?}", a.causes);
        assert!((skew.seconds - 0.030).abs() < 1e-6, "the clock-free 30 ms: {:?}", a.causes);
        assert_eq!(skew.rank, Some(5));
        assert!((a.causes.iter().map(|c| c.seconds).sum::<f64>() - a.seconds).abs() < 1e-9, "parts sum to the step");
        assert!(a.notes.iter().any(|n| n.contains("readiness skew is the clock-free estimate")), "{:?}", a.notes);
    }
}

#[test]
fn a_clock_free_estimate_outside_what_the_clocks_allow_is_not_used() {
    // No rank late (rank 5's 30 ms taken out); rank 2 leaves the big all-reduce 30 ms before
    // the others (its part of the algorithm ended early). The small all-reduce bounds the
    // clocks to ± 1 ms, no better than the wall-clock skew of 0, so the clock-free estimate is
    // considered: 30 ms of spread in time inside, which causality rules out (0 ± 2 ms).
    let peer_of = |host: &str, ranks: std::ops::Range<u32>| {
        let mut p = peer(host, ranks, true);
        for c in p.calls.iter_mut().filter(|c| c.bytes == Some(64 << 20)) {
            match c.rank {
                Some(5) => c.enter -= 0.030,
                Some(2) => c.exit -= 0.030,
                _ => {}
            }
        }
        p
    };
    let peers = [peer_of("node-a", 0..4), peer_of("node-b", 4..8)];
    let an = analyze(&peers, &sel(None, None), &Params::default()).expect("steps");
    assert!(an.clocks.hosts[0].error_seconds <= 0.001 + 1e-9, "{:?}", an.clocks);
    assert_eq!(an.steps.len(), STEPS as usize);
    for s in &an.steps {
        let a = &s.attribution;
        assert!((s.skew.clock_free_seconds.unwrap_or(0.0) - 0.030).abs() < 1e-6, "the estimate itself: {:?}", s.skew);
        let skew = a.causes.iter().find(|c| c.kind == CauseKind::ReadinessSkew).expect("skew");
        assert!(skew.seconds < 1e-6 && !skew.evidence.contains_key("estimate"), "the wall-clock 0 stays: {:?}", skew);
        assert!(a.notes.iter().any(|n| n.contains("lies outside what the clocks allow")), "{:?}", a.notes);
    }
}

#[test]
fn the_clock_free_estimate_leaves_out_calls_timed_at_the_host_enqueue() {
    use crate::timeline::{join::Timing, Arrival, Collective};
    // Rank 1 spent 5 ms less inside the call: a late arrival when the call waits for the
    // peers, only a faster enqueue when it returns once the work is queued (real NCCL without
    // the profiler plugin).
    let arrival = |rank: u32, inside: f64, timing: Timing| {
        let mut a = Arrival { rank, host: "h".into(), pid: rank, enter: 1.0, exit: 1.0 + inside, aborted: false, clock: Default::default() };
        a.clock.timing = timing;
        a
    };
    let coll = |timing: Timing| Collective {
        comm: "c".into(),
        seq: 1,
        op: "all_reduce".into(),
        library: "nccl".into(),
        bytes: Some(1024),
        nranks: Some(2),
        arrivals: vec![arrival(0, 0.006, timing), arrival(1, 0.001, timing)],
    };
    let waited = coll(Timing::HostCompletion);
    let (free, late) = super::clock_free(&[&waited]);
    assert!(free.is_some_and(|f| (f - 0.005).abs() < 1e-9) && late == Some(1), "{free:?} {late:?}");
    let enqueued = coll(Timing::HostEnqueue);
    assert_eq!(super::clock_free(&[&enqueued]), (None, None));
}
