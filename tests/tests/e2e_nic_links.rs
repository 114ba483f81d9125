//! Two 2-rank jobs between the same two servers, in phase, each on its own shaped rail: job A
//! on rail0, job B on rail1 (10 Mbit/s each, so neither slows the other). Every agent sees
//! both rails busy and rail1's queue during job A's transfers; only rail0 carries job A. The
//! agent links each process to the NICs of its TCP connections (sock_diag inodes matched with
//! `/proc/<pid>/fd`), so job A's steps get no congestion and no rail imbalance from job B's
//! bytes, and say which NIC carried them.

use std::{
    collections::BTreeMap,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;
use stepwise_tests::{
    scenarios::{agent_config, cause_seconds, rail_addr, rail_dev, start_job, summarize, RankSpec, Servers, Shape},
    workloads,
};

const STEPS: u64 = 7;
const BYTES: u64 = 128 * 1024;

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// A 2-rank job, rank r on server r, on rail `rail`.
fn job(s: &Servers, dir: &std::path::Path, name: &str, rail: usize) -> stepwise_tests::scenarios::Job {
    let ranks: Vec<RankSpec> = (0..2u32)
        .map(|r| RankSpec {
            ns: s.ns(r as usize).to_string(),
            rank: r,
            env: vec![("NCCL_ABI_IFACE_ADDR".into(), rail_addr(r as usize, rail).to_string())],
            args: Vec::new(),
        })
        .collect();
    let args: Vec<String> = ["--steps", &STEPS.to_string(), "--bytes", &BYTES.to_string(), "--compute-us", "300000"].iter().map(|x| x.to_string()).collect();
    start_job(name, dir, &ranks, &args).expect("job starts")
}

/// Agent `k`'s steps whose all-reduce was job `pid`'s (a period step ends at its exit).
fn steps_of(s: &Servers, k: usize, pid: u32, t0: f64) -> Vec<Value> {
    let calls = s.get_json(&s.agents[k].addr, "/api/v1/collectives?limit=100000").expect("calls");
    let exits: Vec<f64> =
        calls["calls"].as_array().expect("calls").iter().filter(|c| c["pid"].as_u64() == Some(pid as u64)).filter_map(|c| c["exit"].as_f64()).collect();
    s.steps(k)
        .expect("steps")
        .into_iter()
        .filter(|st| st["begin"].as_f64().is_some_and(|b| b >= t0))
        .filter(|st| st["end"].as_f64().is_some_and(|e| exits.iter().any(|x| (x - e).abs() < 1e-6)))
        .collect()
}

#[test]
fn another_jobs_traffic_on_a_rail_this_job_never_uses_is_not_its_congestion() {
    workloads::build().expect("workloads build");
    let dir = tempfile::Builder::new().prefix("stepwise-links-").tempdir().expect("tmp");
    let dir = dir.path();
    let mut s = Servers::new(2, 9000, Some(Shape::mbit(10, 16, 1024))).expect("servers (needs root)");
    let rate = s.shape.as_ref().expect("shape").agent_rate();
    let rates: BTreeMap<String, String> = (0..2).map(|i| (rail_dev(i), rate.clone())).collect();
    for k in 0..2 {
        let cfg = agent_config(s.ns(k), dir, k, None, &rates, false);
        s.start_agent(k, dir, &cfg).expect("agent starts");
    }
    let t0 = now();
    let tx0: Vec<Vec<f64>> = (0..2).map(|k| s.rail_tx(k).expect("tx")).collect();
    let (a, b) = (job(&s, dir, "a", 0), job(&s, dir, "b", 1));
    let pids = a.pids();
    a.wait(Duration::from_secs(90)).expect("job a");
    b.wait(Duration::from_secs(90)).expect("job b");
    // Job B really loaded rail1 while job A ran (its bytes, both servers).
    for (k, before) in tx0.iter().enumerate() {
        let tx = s.rail_tx(k).expect("tx");
        let b_bytes = tx[1] - before[1];
        assert!(b_bytes > (STEPS * BYTES) as f64, "server {k}: rail1 carried {b_bytes} B");
    }
    std::thread::sleep(Duration::from_millis(3500));
    for k in 0..2 {
        let steps = steps_of(&s, k, pids[&(k as u32)], t0);
        assert!(steps.len() as u64 >= STEPS - 2, "server {k}: {} steps of job A\n{}", steps.len(), summarize(&steps));
        for st in &steps {
            let secs = st["seconds"].as_f64().expect("seconds");
            for kind in ["congestion", "rail_imbalance"] {
                let c = cause_seconds(st, kind);
                assert!(
                    c <= 0.05 * secs,
                    "server {k} step {}: {kind} {:.1} ms of {:.1} ms from a rail job A never used\n{}",
                    st["step"],
                    c * 1e3,
                    secs * 1e3,
                    summarize(&steps)
                );
            }
            let notes: Vec<&str> = st["notes"].as_array().expect("notes").iter().filter_map(|n| n.as_str()).collect();
            let linked = notes.iter().find(|n| n.starts_with("NICs of this step's ranks")).unwrap_or_else(|| panic!("server {k}: no NIC link note: {notes:?}"));
            assert!(linked.contains("/rail0 (tcp ") && !linked.contains("rail1"), "server {k}: {linked}");
        }
    }
}
