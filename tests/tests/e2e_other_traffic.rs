//! Another program's traffic on a job's NIC (issue 31): two namespace servers joined by four
//! 10 Mbit/s TBF rails, the NCCL-ABI workload as real NCCL runs — calls only enqueue, the
//! profiler plugin times them — and an unrelated bulk TCP flow (a Python sender the agent
//! does not trace) between the servers on one rail for a few seconds.
//!
//! - hierarchical job (balanced over the 4 rails), the flow on rail 1: the steps inside the
//!   flow are `congestion` on server 0 (whose rail 1 carried the flow) — the median step
//!   within 15 % of its extra time over the clean steps, every step within 25 % — naming rail
//!   1 and the flow's bytes as measured other traffic; rail imbalance stays under 10 % of every step (the job's own bytes are
//!   balanced: the old rule blamed the job's rails for the flow's bytes);
//!   Its clean steps are at most 10 % `unexplained`: the local reduce-scatter and all-gather
//!   are `intra_host`, carrying the ranks' bytes to each other (at least half of server 0's
//!   `lo` per step in the median step, never more);
//! - flat ring (all of a server's cross-host bytes on rail 0), the flow on rail 2 the job does
//!   not use: rail imbalance is the job's own (rail 0 at the TBF rate against the same bytes
//!   over 4 rails, from `ip -s link`), congestion stays under 10 % of the step.
//!
//! The hierarchical job's agents run at the shipped defaults (1 s sweeps, the fast lane at
//! 10 ms within 1 % of a core, the TCP dumps within 2 %). The flat ring's still sample every
//! 10 ms (`scenarios::agent_config_10ms`): at the defaults its last step came out with no rail
//! imbalance in 1 of 2 runs — its connections closed before the next read, the job's own
//! bytes on rail 2 were not measured at it, and the flow's bytes there then stood for the
//! job's.

use std::{
    collections::BTreeMap,
    path::Path,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;
use stepwise_tests::{
    flows::{self, allreduce_s, bulk_flow, flow_span, steps_of},
    scenarios::{agent_config, agent_config_10ms, cause, cause_seconds, median, rail_dev, start_job, summarize, top_problem, within, Servers, Shape},
};

const MBIT: u32 = 10;
const COMPUTE_US: u64 = 50_000;

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_secs_f64()
}

/// Both servers' agents, at the shipped defaults or (`defaults` false) sampling every 10 ms.
fn servers(dir: &Path, defaults: bool) -> Servers {
    let mut s = Servers::new(4, 9000, Some(Shape::mbit(MBIT, 16, 1024))).expect("servers (root, iproute2)");
    let rate = s.shape.as_ref().expect("shaped").agent_rate();
    let rates: BTreeMap<String, String> = (0..s.rails).map(|i| (rail_dev(i), rate.clone())).collect();
    for k in 0..2 {
        let config = if defaults { agent_config } else { agent_config_10ms };
        let cfg = config(s.ns(k), dir, k, Some(&dir.join(format!("markers-{k}.sock"))), &rates, false);
        s.start_agent(k, dir, &cfg).expect("agent starts");
    }
    s
}

/// The 8-rank job with `algo`, asynchronous with the profiler plugin, started (not waited).
fn start(s: &Servers, dir: &Path, algo: &str, name: &str, bytes: u64, steps: u64) -> stepwise_tests::scenarios::Job {
    start_job(name, dir, &flows::eight_ranks(s, dir, algo), &flows::job_args(steps, bytes, COMPUTE_US)).expect("job starts")
}

/// One scenario at a time: they time jobs on a 2-core machine (cargo runs a binary's tests in parallel).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn a_bulk_flow_on_a_rail_of_a_hierarchical_job_is_congestion_not_rail_imbalance() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let s = servers(dir.path(), true);
    let steps_n = 30;
    let lo0 = s.link_bytes(0, "lo").expect("lo").0;
    let t0 = now();
    let job = start(&s, dir.path(), "hierarchical", "hier", 1 << 20, steps_n);
    // After the first steps (the connections' slow start is over), 4 s of flow; the job
    // goes on for seconds after it.
    let (_rx, mut tx) = bulk_flow(&s, dir.path(), 1, 1.5, 4.0);
    let out = job.wait(Duration::from_secs(90)).expect("job");
    let t1 = now();
    // Server 0's ranks' bytes to each other per step (its `lo` carries nothing else).
    let lo = (s.link_bytes(0, "lo").expect("lo").0 - lo0) / steps_n as f64;
    let (f0, f1) = flow_span(&mut tx);
    let steps = steps_of(&s, t0, t1, steps_n as usize);
    let ar = allreduce_s(&out, 4);
    // Inside: the step's span within the flow; clean: ended before it, or began 1.5 s after
    // it (the rail's 1 MiB queue drained), from step 2 on: step 0 is the connections' slow
    // start, and the bytes a rank sends before the agent has read its sockets (up to a
    // rescan after the process is found, docs/architecture.md) are not yet its own.
    let span = |st: &Value| (st["begin"].as_f64().expect("begin"), st["end"].as_f64().expect("end"));
    let inside: Vec<&Value> = steps.values().filter(|st| span(st).0 >= f0 + 0.05 && span(st).1 <= f1).collect();
    let clean: Vec<&Value> = steps.iter().filter(|(id, st)| **id > 1 && (span(st).1 < f0 || span(st).0 > f1 + 1.5)).map(|(_, st)| st).collect();
    eprintln!(
        "flow {:.2}–{:.2} s after the job began; inside:\n{}\nclean:\n{}",
        f0 - t0,
        f1 - t0,
        summarize(&inside.iter().map(|v| (*v).clone()).collect::<Vec<_>>()),
        summarize(&clean.iter().map(|v| (*v).clone()).collect::<Vec<_>>())
    );
    assert!(inside.len() >= 3 && clean.len() >= 6, "{} steps inside the flow, {} clean", inside.len(), clean.len());

    let base = median(clean.iter().filter_map(|st| ar.get(&st["step"].as_u64()?).copied()).collect());
    for st in &inside {
        let id = st["step"].as_u64().expect("id");
        let extra = ar[&id] - base;
        let got = cause_seconds(st, "congestion");
        let secs = st["seconds"].as_f64().expect("seconds");
        assert_eq!(top_problem(st).0, "congestion", "step {id}:\n{}", summarize(std::slice::from_ref(st)));
        // Each step within 25 % (one step's extra time is its own all-reduce against the
        // clean steps' median); the median step within issue 31's 15 %, below.
        assert!(within(got, extra, 0.25), "step {id}: congestion {:.1} ms vs the step's extra time over the clean steps {:.1} ms", got * 1e3, extra * 1e3);
        assert!(
            cause_seconds(st, "rail_imbalance") < 0.10 * secs,
            "step {id}: rail imbalance {:.1} ms of {:.1} ms",
            cause_seconds(st, "rail_imbalance") * 1e3,
            secs * 1e3
        );
        let ev = &cause(st, "congestion")["evidence"];
        assert_eq!(ev["nic"], "rail1", "step {id}: {ev}");
        assert_eq!(ev["other_traffic_measured"], true, "step {id}: {ev}");
        assert!(ev["other_traffic_bytes"].as_f64().is_some_and(|b| b > 0.5 * extra * 1.25e6), "step {id}: the flow's bytes: {ev}");
    }
    let mut local = Vec::new();
    for st in &clean {
        let secs = st["seconds"].as_f64().expect("seconds");
        // The local reduce-scatter and all-gather are `intra_host`, with the ranks' bytes
        // between each other (issue 31: 25–50 % of such steps were `unexplained`). Not on a
        // step whose connections still retransmit the flow's losses: a retransmission
        // timeout is a stall no cause models.
        let retransmits = cause(st, "congestion")["evidence"]["retransmits"].as_f64().unwrap_or(0.0);
        assert!(
            retransmits > 0.0 || cause_seconds(st, "unexplained") <= 0.10 * secs,
            "clean step {}: {}\n{}",
            st["step"],
            summarize(std::slice::from_ref(st)),
            cause(st, "congestion")["evidence"]
        );
        let b = cause(st, "intra_host")["evidence"]["same_host_bytes"].as_f64().expect("same-host bytes");
        assert!(b <= 1.10 * lo, "clean step {}: {b:.0} B between ranks of server 0, more than its lo's {lo:.0} B per step", st["step"]);
        local.push(b);
        assert!(cause_seconds(st, "congestion") < 0.075 * secs, "clean step {}: {}", st["step"], summarize(std::slice::from_ref(st)));
        assert!(cause_seconds(st, "rail_imbalance") < 0.10 * secs, "clean step {}: {}", st["step"], summarize(std::slice::from_ref(st)));
    }
    let med = median(local);
    eprintln!("other traffic/hierarchical: median same-host bytes of a clean step {:.2} MB vs server 0's lo {:.2} MB per step", med / 1e6, lo / 1e6);
    // Not all of them: a local phase here is a 1–2 ms burst between two 10 ms samples, and a
    // transfer window that starts between them gets the interpolated share of it.
    assert!(med >= 0.5 * lo, "median same-host bytes {med:.0} vs lo's {lo:.0} per step");
    let (got, extra) = (
        median(inside.iter().map(|st| cause_seconds(st, "congestion")).collect()),
        median(inside.iter().filter_map(|st| ar.get(&st["step"].as_u64()?).map(|a| a - base)).collect()),
    );
    eprintln!(
        "other traffic/hierarchical: median congestion inside the flow {:.1} ms vs extra {:.1} ms; median rail imbalance {:.1} ms",
        got * 1e3,
        extra * 1e3,
        median(inside.iter().map(|st| cause_seconds(st, "rail_imbalance")).collect()) * 1e3
    );
    assert!(within(got, extra, 0.15), "median step inside the flow: congestion {:.1} ms vs extra {:.1} ms", got * 1e3, extra * 1e3);
}

#[test]
fn a_flat_rings_own_imbalance_stays_rail_imbalance_beside_a_flow_on_a_rail_it_does_not_use() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let s = servers(dir.path(), false);
    let steps_n = 10;
    let bytes = 256 * 1024;
    // The flow first (sending before the job starts), then the job.
    let (_rx, mut tx) = bulk_flow(&s, dir.path(), 2, 0.0, 60.0);
    stepwise_tests::harness::wait_for(Duration::from_secs(30), "the bulk flow sending", || tx.log_text().contains("start").then_some(())).expect("flow");
    let before = s.rail_tx(0).expect("tx");
    let t0 = now();
    let job = start(&s, dir.path(), "ring", "flat", bytes, steps_n);
    let out = job.wait(Duration::from_secs(90)).expect("job");
    let t1 = now();
    let after = s.rail_tx(0).expect("tx");
    let _ = tx.terminate(Duration::from_secs(1));
    let steps = steps_of(&s, t0, t1, steps_n as usize);
    // The job's own bytes per step on rail 0 (the flow is on rail 2; rails 1 and 3 idle):
    // the busiest rail at the TBF rate, against the same bytes balanced over the 4 rails.
    let rate = f64::from(MBIT) * 1e6 / 8.0;
    let rail0 = (after[0] - before[0]) / steps_n as f64;
    let excess = rail0 / rate - rail0 / 4.0 / rate;
    assert!(after[2] - before[2] > 2.0 * rail0, "the flow ran on rail 2: {before:?} → {after:?}");
    let measured: Vec<&Value> = steps.iter().filter(|(id, _)| **id > 1).map(|(_, v)| v).collect();
    eprintln!("flat ring beside a flow on rail 2 (excess {:.1} ms):\n{}", excess * 1e3, summarize(&measured.iter().map(|v| (*v).clone()).collect::<Vec<_>>()));
    for st in &measured {
        let id = st["step"].as_u64().expect("id");
        let secs = st["seconds"].as_f64().expect("seconds");
        let got = cause_seconds(st, "rail_imbalance");
        assert!(within(got, excess, 0.15), "step {id}: rail imbalance {:.1} ms vs the job's own {:.1} ms: {st}", got * 1e3, excess * 1e3);
        assert!(cause_seconds(st, "congestion") < 0.10 * secs, "step {id}: {}", summarize(std::slice::from_ref(st)));
        let ev = &cause(st, "rail_imbalance")["evidence"];
        assert_eq!(ev["busiest_nic"], "rail0", "step {id}: {ev}");
        let rail2 = ev["nics"].as_array().and_then(|n| n.iter().find(|x| x["nic"] == "rail2")).map(|x| x["tx_bytes"].as_f64().unwrap_or(f64::NAN));
        assert!(rail2.is_some_and(|b| b < 0.05 * rail0), "step {id}: rail 2's bytes are not the job's: {ev}");
    }
    assert!(out.lines.len() as u64 >= 8 * steps_n, "every rank finished");
}
