//! The engine without its inputs: markers alone make steps.

use std::{collections::BTreeSet, time::Duration};

use prometheus_client::registry::Registry;

use super::*;
use crate::{
    attribution::CauseKind,
    timeline::{NicWindow, Phase},
};

/// A 0.5 s step of one collective with `ranks`.
fn one_step(ranks: Vec<crate::attribution::RankTime>) -> Attribution {
    Attribution {
        step: 1,
        begin: 0.0,
        end: 0.5,
        seconds: 0.5,
        causes: Vec::new(),
        ranks,
        collectives: 1,
        incomplete: false,
        notes: Vec::new(),
        timing: String::new(),
        desyncs: Vec::new(),
        graph_replay: None,
    }
}

#[test]
fn markers_make_steps_without_collective_probes() {
    let mut registry = Registry::default();
    let mut e = Engine::new(StepsConfig::default(), "h".into(), &mut registry).expect("engine");
    let t0 = wall_now() - 30.0;
    for step in 0..4u64 {
        for (phase, dt) in [(Phase::Begin, 0.0), (Phase::End, 0.5)] {
            e.add_marker(Marker { rank: 0, step, phase, time: Some(t0 + step as f64 + dt), host: None });
        }
    }
    // `[collectives] enabled = false`: no call history is ever set.
    e.tick(wall_now(), 0);
    let ids: Vec<u64> = e.steps().iter().map(|a| a.step).collect();
    assert_eq!(ids, [0, 1, 2, 3], "every marked step is attributed");
}

/// The text exposition of a fresh engine's registry.
fn exposition(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).expect("encode");
    out
}

#[test]
fn every_cause_is_exported_at_zero_before_the_first_step() {
    let mut registry = Registry::default();
    let _e = Engine::new(StepsConfig::default(), "h".into(), &mut registry).expect("engine");
    let text = exposition(&registry);
    for c in CauseKind::ALL {
        let line = format!("stepwise_step_attributed_seconds_total{{cause=\"{}\"}} 0.0", c.as_str());
        assert!(text.lines().any(|l| l == line), "{line} missing from a fresh engine's metrics:\n{text}");
    }
}

#[test]
fn step_buckets_reach_past_two_minutes_with_exact_le_labels() {
    let mut registry = Registry::default();
    let _e = Engine::new(StepsConfig::default(), "h".into(), &mut registry).expect("engine");
    let text = exposition(&registry);
    let les: Vec<&str> =
        text.lines().filter(|l| l.starts_with("stepwise_step_duration_seconds_bucket{")).filter_map(|l| l.split("le=\"").nth(1)?.split('"').next()).collect();
    assert_eq!(les.len(), STEP_BUCKETS.len() + 1, "{text}");
    assert_eq!(les.last(), Some(&"+Inf"));
    for (le, want) in les.iter().zip(STEP_BUCKETS) {
        // Each label is the shortest decimal of its bound: no float noise.
        assert!(le.len() <= 6, "le=\"{le}\" is not an exact decimal");
        assert_eq!(le.parse::<f64>().expect("le"), want);
    }
    let finite: Vec<f64> = les.iter().filter_map(|l| l.parse().ok()).collect();
    assert!(finite.windows(2).all(|w| w[0] < w[1]), "increasing: {finite:?}");
    assert!(finite.iter().any(|&b| b >= 120.0) && finite.contains(&120.0), "a 2-minute step lands in a finite bucket: {finite:?}");
}

#[test]
fn rail_ratios_are_not_exported_before_the_first_step() {
    let mut registry = Registry::default();
    let _e = Engine::new(StepsConfig::default(), "h".into(), &mut registry).expect("engine");
    let text = exposition(&registry);
    let samples: Vec<&str> = text.lines().filter(|l| l.contains("stepwise_rail_")).collect();
    assert!(samples.is_empty(), "rail series before any step: {samples:?}");
    // Once a step set them: one unlabelled imbalance series and a ratio per rail.
    let mut registry = Registry::default();
    let mut m = StepMetrics::register(&mut registry, "h".into(), Duration::ZERO);
    let nic = |rail: u32, tx: f64| NicWindow {
        nic: NicInfo { name: format!("rail{rail}"), host: Some("h".into()), rail: Some(rail), rate_bytes_per_second: Some(1e9) },
        tx_bytes: tx,
        ..Default::default()
    };
    let a = one_step(Vec::new());
    // 3 MB on rail 0, 1 MB on rail 1: the busiest rail carries 1.5 × the mean, 75 %.
    let windows = vec![vec![nic(0, 3e6), nic(1, 1e6)]];
    m.step(&FinishedStep { job: "j", attribution: &a, collectives: &[], windows: &windows, step_windows: &[] });
    let text = exposition(&registry);
    assert!(text.lines().any(|l| l == "stepwise_rail_imbalance_ratio 1.5"), "{text}");
    assert!(text.lines().any(|l| l == "stepwise_rail_bytes_ratio{rail=\"0\"} 0.75"), "{text}");
    assert!(!text.contains("stepwise_rail_bytes_share"), "the old name is gone");
}

#[test]
fn each_nic_exports_the_rate_attribution_uses() {
    let mut registry = Registry::default();
    let cfg = StepsConfig { nic_rates: [("dl0".to_string(), "200Mbit/s".to_string())].into(), ..Default::default() };
    let mut e = Engine::new(cfg, "h".into(), &mut registry).expect("engine");
    let part = |name: &str, rate: Option<f64>| (NicInfo { name: name.into(), host: None, rail: None, rate_bytes_per_second: rate }, NicSample::default());
    // dl0: a TUN device that reports no speed, its rate from [steps] nic_rates; eth0 its
    // reported 10 Gb/s; veth9 nothing known: no series (0 would read as a dead link).
    e.push_samples(1.0, vec![part("dl0", None), part("eth0", Some(1.25e9)), part("veth9", None)]);
    let text = exposition(&registry);
    assert!(text.lines().any(|l| l == "stepwise_nic_rate_bytes_per_second{netdev=\"dl0\"} 25000000.0"), "{text}");
    assert!(text.lines().any(|l| l == "stepwise_nic_rate_bytes_per_second{netdev=\"eth0\"} 1250000000.0"), "{text}");
    assert!(!text.contains("netdev=\"veth9\""), "{text}");
}

/// A 1 024-rank job on 128 hosts × 8 ranks, rank 777 (host 97) late: each host's agent
/// exports only its own 8 ranks, under their global numbers, so no host exceeds 16 per-rank
/// series, and the dashboards' straggler query (`topk(1, stepwise_rank_late_seconds_total)`
/// over all hosts) names rank 777.
#[test]
fn a_1024_rank_job_keeps_global_ranks_and_bounded_series_on_every_host() {
    let ranks: Vec<crate::attribution::RankTime> = (0..1024u32)
        .map(|r| crate::attribution::RankTime {
            rank: r,
            host: format!("node-{}", r / 8),
            late_seconds: if r == 777 { 0.030 } else { 0.001 * f64::from(r % 3) },
            wait_seconds: 0.01,
            inside_seconds: 0.02,
        })
        .collect();
    let step = one_step(ranks);
    let mut top: (f64, String) = (0.0, String::new());
    for h in 0..128u32 {
        let mut registry = Registry::default();
        let mut m = StepMetrics::register(&mut registry, format!("node-{h}"), Duration::ZERO);
        m.step(&FinishedStep { job: "j", attribution: &step, collectives: &[], windows: &[], step_windows: &[] });
        let text = exposition(&registry);
        let late: Vec<(String, f64)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("stepwise_rank_late_seconds_total{rank=\""))
            .filter_map(|l| Some((l.split_once('"')?.0.to_string(), l.rsplit_once(' ')?.1.parse::<f64>().ok()?)))
            .collect();
        let per_rank = text.lines().filter(|l| l.starts_with("stepwise_rank_")).count();
        assert_eq!(per_rank, 16, "host {h}: 8 ranks x (wait, late)");
        let want: Vec<String> = (h * 8..h * 8 + 8).map(|r| r.to_string()).collect();
        assert_eq!(late.iter().map(|(r, _)| r.clone()).collect::<BTreeSet<_>>(), want.into_iter().collect(), "host {h}: its own global ranks");
        for (r, v) in late {
            if v > top.0 {
                top = (v, r);
            }
        }
    }
    assert_eq!(top.1, "777", "the straggler query names the late rank");
}

/// Per-rank series carry their process's local rank, namespace and pod (from the identities
/// the collective source publishes, joined by the arrival's pid), and a rank whose process
/// changes identity (the next job's pod) gets new series, the old ones removed.
#[test]
fn per_rank_series_carry_the_process_identity_and_follow_it() {
    use crate::{
        labels::RankIdentity,
        timeline::join::{Arrival, Clocking, Collective},
    };
    let mut registry = Registry::default();
    let mut m = StepMetrics::register(&mut registry, "node-a".into(), Duration::ZERO);
    let ranks = vec![crate::attribution::RankTime { rank: 3, host: "node-a".into(), late_seconds: 0.01, wait_seconds: 0.0, inside_seconds: 0.02 }];
    let step = one_step(ranks);
    let arrival = |pid: u32| Arrival { rank: 3, host: "node-a".into(), pid, enter: 0.0, exit: 0.1, aborted: false, clock: Clocking::default() };
    let coll = |pid: u32| Collective {
        comm: "c".into(),
        seq: 0,
        op: "all_reduce".into(),
        library: "nccl".into(),
        bytes: None,
        nranks: Some(1),
        arrivals: vec![arrival(pid)],
    };
    let who = |pod: &str| RankIdentity { local_rank: "3".into(), namespace: "train".into(), pod: pod.into(), gpu: "0000:18:00.0".into() };
    m.set_identities([(100, who("job-a-0")), (200, who("job-b-0"))].into());
    let first = [coll(100)];
    m.step(&FinishedStep { job: "j", attribution: &step, collectives: &first, windows: &[], step_windows: &[] });
    let text = exposition(&registry);
    assert!(
        text.contains(r#"stepwise_rank_late_seconds_total{rank="3",local_rank="3",k8s_namespace_name="train",k8s_pod_name="job-a-0",gpu="0000:18:00.0"} 0.01"#),
        "{text}"
    );
    // The next job's process (another pod) runs rank 3: its series replace job a's.
    let second = [coll(200)];
    m.step(&FinishedStep { job: "j", attribution: &step, collectives: &second, windows: &[], step_windows: &[] });
    let text = exposition(&registry);
    assert!(text.contains(r#"k8s_pod_name="job-b-0",gpu="0000:18:00.0"} 0.01"#), "{text}");
    assert!(!text.contains("job-a-0"), "the old pod's series are gone: {text}");
    // A process not published yet keeps the rank's series as they are (no flicker).
    let third = [coll(300)];
    m.step(&FinishedStep { job: "j", attribution: &step, collectives: &third, windows: &[], step_windows: &[] });
    let text = exposition(&registry);
    assert!(text.contains(r#"k8s_pod_name="job-b-0",gpu="0000:18:00.0"} 0.02"#), "{text}");
    assert_eq!(text.lines().filter(|l| l.starts_with("stepwise_rank_")).count(), 2, "{text}");
}
