//! Same-host links (issue 31 item 2): a hierarchical all-reduce moves most of its bytes
//! between the ranks of one host — its local reduce-scatter and all-gather — and only a
//! shard per rank over the rails. Two namespace servers joined by four 200 Mbit/s TBF rails,
//! the NCCL-ABI workload's hierarchical algorithm (8 ranks, 4 per server, asynchronous with
//! the profiler plugin); its local peers reach each other at their own server's rail
//! addresses, which the kernel routes over `lo`. The agents run at the shipped defaults: the
//! same-host link's figures come from the fast lane's reads of the job's loopback connections.
//! (Measured on this 2-core VM, nine runs, the release agent: median step 0.0–1.2 %
//! unexplained, worst step 10.4 %; the debug agent, whose reads cost about 2.7× more of the
//! lane's 1 % CPU budget: median 3–7 %, worst 17 %, one run of six with a step at 39 %.)
//!
//! - the server's `lo` carries the bytes the algorithm moves between its ranks (2 · (L−1)/L ·
//!   M per rank: reduce-scatter and all-gather; within 10 %);
//! - the clean steps are at most 10 % `unexplained` in the median step, 20 % in every step
//!   (this server cannot see the other's local phase, which the cross-host phase waits for
//!   when CPU contention slows it): the local phases are `intra_host`, with
//!   the job's own loopback bytes as evidence, the median step at least half of `lo`'s bytes per
//!   step, none above it.

use std::{collections::BTreeMap, path::Path, time::Duration};

use serde_json::Value;
use stepwise_tests::{
    flows,
    scenarios::{agent_config, cause, cause_seconds, median, rail_dev, start_job, summarize, within, Servers, Shape},
};

const MBIT: u32 = 200;
const COMPUTE_US: u64 = 50_000;
const LOCAL: u64 = 4;

fn servers(dir: &Path) -> Servers {
    let mut s = Servers::new(4, 9000, Some(Shape::mbit(MBIT, 64, 2048))).expect("servers (root, iproute2)");
    let rate = s.shape.as_ref().expect("shaped").agent_rate();
    let rates: BTreeMap<String, String> = (0..s.rails).map(|i| (rail_dev(i), rate.clone())).collect();
    for k in 0..2 {
        let cfg = agent_config(s.ns(k), dir, k, Some(&dir.join(format!("markers-{k}.sock"))), &rates, false);
        s.start_agent(k, dir, &cfg).expect("agent starts");
    }
    s
}

/// The 8-rank hierarchical job, asynchronous with the profiler plugin, run to its end.
fn run_job(s: &Servers, dir: &Path, bytes: u64, steps: u64) -> stepwise_tests::scenarios::JobOutput {
    let ranks = flows::eight_ranks(s, dir, "hierarchical");
    start_job("hier", dir, &ranks, &flows::job_args(steps, bytes, COMPUTE_US)).expect("job starts").wait(Duration::from_secs(120)).expect("job")
}

/// Server `k`'s attributed steps of the job, by step id.
fn steps_of(s: &Servers, k: usize, n: usize) -> BTreeMap<u64, Value> {
    stepwise_tests::harness::wait_for(Duration::from_secs(15), "the job's steps attributed", || {
        let v: BTreeMap<u64, Value> = s.steps(k).ok()?.into_iter().filter_map(|x| Some((x["step"].as_u64()?, x))).collect();
        (v.len() >= n).then_some(v)
    })
    .unwrap_or_else(|e| panic!("{e}: {}", s.agents[k].proc.log_text()))
}

/// One scenario at a time: it times a job on a 2-core machine.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_hierarchical_jobs_local_phases_are_intra_host_not_unexplained() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let s = servers(dir.path());
    let (bytes, steps_n) = (8u64 << 20, 16u64);
    let lo0: Vec<f64> = (0..2).map(|k| s.link_bytes(k, "lo").expect("lo").0).collect();
    let out = run_job(&s, dir.path(), bytes, steps_n);
    assert!(out.lines.len() as u64 >= 8 * steps_n, "every rank finished");
    for (k, before) in lo0.iter().enumerate() {
        // The job's bytes between its ranks on this server per step, from the kernel's own
        // counter of `lo` (nothing else in the namespace uses it: the agent's API and the
        // markers are elsewhere); the algorithm's 2 · (L−1)/L · M per rank is the check.
        let lo = (s.link_bytes(k, "lo").expect("lo").0 - before) / steps_n as f64;
        let algo = (LOCAL * 2 * (LOCAL - 1) * bytes / LOCAL) as f64;
        assert!(within(lo, algo, 0.10), "server {k}: lo carried {lo:.0} B per step, the algorithm moves {algo:.0} B");
        let steps = steps_of(&s, k, steps_n as usize);
        // From step 2 on: step 0 is the connections' slow start and the bytes a rank sends
        // before the agent has read its sockets are not yet known as its own. Not the last
        // step: the ranks exit after it, and what a connection sent after the last dump
        // before it closed is not seen (docs/architecture.md "Same-host links").
        let clean: Vec<Value> = steps.iter().filter(|(id, _)| **id > 1 && **id + 1 < steps_n).map(|(_, v)| v.clone()).collect();
        eprintln!("server {k}, hierarchical {} MiB, lo {:.1} MB per step:\n{}", bytes >> 20, lo / 1e6, summarize(&clean));
        let (mut seen, mut shares) = (Vec::new(), Vec::new());
        for st in &clean {
            let id = st["step"].as_u64().expect("id");
            let secs = st["seconds"].as_f64().expect("seconds");
            let ev = &cause(st, "intra_host")["evidence"];
            eprintln!("  step {id}: {ev}");
            // Each step within 20 %, the median step within issue 31's 10 %, below: this
            // server's counters do not see the other server's local phase, which the
            // cross-host phase waits for when CPU contention slows it (load 7.5: single steps
            // at 11 %; load 13: up to 18 %).
            let un = cause_seconds(st, "unexplained");
            assert!(
                un <= 0.20 * secs,
                "server {k} step {id}: unexplained {:.1} ms of {:.1} ms:\n{}",
                un * 1e3,
                secs * 1e3,
                summarize(std::slice::from_ref(st))
            );
            shares.push(un / secs);
            assert!(cause_seconds(st, "intra_host") > 0.10 * secs, "server {k} step {id}: the local phases:\n{}", summarize(std::slice::from_ref(st)));
            assert_eq!(ev["link"], "lo", "step {id}: {ev}");
            let b = ev["same_host_bytes"].as_f64().expect("same-host bytes");
            // The transfer window starts at the last arrival: a server's local reduce-scatter
            // may begin before a rank of the other server arrives, so a step sees at most
            // the algorithm's bytes.
            assert!(b <= 1.10 * lo, "server {k} step {id}: {b:.0} B on lo in the transfer, more than the link's {lo:.0} B per step");
            seen.push(b);
        }
        let worst = shares.iter().copied().fold(0.0, f64::max);
        let un = median(shares);
        eprintln!("server {k}: median step {:.1} % unexplained, worst {:.1} %", un * 100.0, worst * 100.0);
        assert!(un <= 0.10, "server {k}: the median step is {:.1} % unexplained", un * 100.0);
        let med = median(seen);
        eprintln!("server {k}: median same-host bytes in a step's transfer {:.1} MB vs lo's {:.1} MB per step", med / 1e6, lo / 1e6);
        // The local phases that ran before the transfer's window (before the other server's
        // last rank arrived) are outside it, so at least half of lo's bytes fall inside, not
        // all: 46 of 50.5 MB in the first runs (load 4-13), 37.6 of 50.5 MB in a CI rehearsal
        // on an idle machine.
        assert!(med >= 0.5 * lo, "server {k}: median same-host bytes {med:.0} vs lo's {lo:.0} per step");
    }
}
