//! `agent diagnose --peers` at cluster scale: 128 agents × 8 ranks (one world communicator
//! of 1 024 ranks), 1 000 steps of 50 ms, 8 rails per host sampled every second. The agents
//! are this process serving the agent's own API router over synthetic state on 128 loopback
//! ports (`stepwise::export::{synthetic, replay}`); `diagnose` is the real binary.
//!
//! Injected: rank 3 late by 12 ms in step 120, rank 1000 by 20 ms in step 401, rank 517 by
//! 40 ms in step 733 (the slowest), rank 64 by 8 ms in step 950; elsewhere ≤ 20 µs jitter.

use std::{
    net::TcpListener,
    sync::{Mutex, OnceLock},
    time::Instant,
};

use serde_json::Value;
use stepwise::{
    export::{
        replay::{run_measured, Agents, Measured},
        synthetic::Job,
    },
    timeline::{join::CallView, Arrival},
};
use stepwise_tests::harness::{agent_bin, http_get};

/// Peak RSS `diagnose` may reach over `calls` calls from `peers` peers whose compact
/// `/api/v1/collectives` answer is `body` bytes each. What it holds at once: every call of the
/// range as the join's view (`CallView` and its four strings — comm, op, library, host — of at
/// most 24 bytes each, one 32-byte allocation apiece), every joined arrival (`Arrival` and its
/// host string) and, at worst, every peer's body at once; 25 % on top for allocator slack and
/// 64 MiB for the binary, its 128 fetch threads and the report. A second copy of the calls, or
/// the verbose format's bodies (~2.8 MB a peer), breaks it; so does fetching all 1 000 steps
/// for `--step`.
fn rss_bound_kib(calls: usize, peers: usize, body: usize) -> u64 {
    let view = std::mem::size_of::<CallView>() + 4 * 32;
    let arrival = std::mem::size_of::<Arrival>() + 32;
    let bytes = (calls * (view + arrival)) as f64 * 1.25 + (peers * body) as f64 + 64.0 * 1048576.0;
    (bytes / 1024.0) as u64
}

/// `diagnose` runs one at a time: measurements and per-peer timeouts unshared on 2 cores.
static SERIAL: Mutex<()> = Mutex::new(());

struct Cluster {
    job: Job,
    agents: Agents,
    /// Bytes of one peer's compact `/api/v1/collectives` answer.
    body: usize,
}

/// One cluster for every test of this file (building it takes a few seconds in debug).
fn cluster() -> &'static Cluster {
    static C: OnceLock<Cluster> = OnceLock::new();
    C.get_or_init(|| {
        let t = Instant::now();
        let job = Job::cluster_1024(stepwise::engine::wall_now() - 1.0);
        let schedule = job.schedule();
        let states = (0..job.hosts).map(|h| job.host_state(h, &schedule)).collect();
        let agents = Agents::serve(states, 2).expect("serve 128 agents");
        eprintln!("{} agents × {} ranks × {} steps ready in {:.1} s", job.hosts, job.ranks_per_host, job.steps, t.elapsed().as_secs_f64());
        let page = http_get(&agents.addrs[0].to_string(), "/api/v1/collectives?limit=100000&format=compact").expect("a peer's calls");
        assert_eq!(page.status, 200, "{}", page.body);
        Cluster { job, agents, body: page.body.len() }
    })
}

fn diagnose(peers: &[String], args: &[&str]) -> Measured {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let peers = peers.join(",");
    let mut all = vec!["diagnose", "--peers", &peers];
    if !args.contains(&"--timeout") {
        all.extend(["--timeout", "30s"]);
    }
    all.extend(args);
    let m = run_measured(&agent_bin(), &all).expect("run diagnose");
    eprintln!("diagnose {args:?}: {} in {:.2} s, peak RSS {} MiB", m.status, m.seconds, m.max_rss_kib / 1024);
    m
}

fn json(m: &Measured) -> Value {
    serde_json::from_str(&m.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", m.stdout.chars().take(2000).collect::<String>(), m.stderr))
}

/// The step's readiness skew: (seconds, late rank, clock-free seconds, clock-free late rank).
fn skew_of(step: &Value) -> (f64, Option<u64>, f64, Option<u64>) {
    let c = step["causes"].as_array().and_then(|c| c.iter().find(|c| c["kind"] == "readiness_skew")).cloned().unwrap_or_default();
    let s = &step["skew"];
    (
        c["seconds"].as_f64().unwrap_or(0.0),
        c["evidence"]["late_rank"].as_u64(),
        s["clock_free_seconds"].as_f64().unwrap_or(0.0),
        s["clock_free_late_rank"].as_u64(),
    )
}

fn assert_straggler(step: &Value, id: u64, rank: u32, late: f64) {
    assert_eq!(step["step"].as_u64(), Some(id), "{}", step["step"]);
    let (secs, who, free, free_who) = skew_of(step);
    assert_eq!(who, Some(rank as u64), "late rank of step {id}");
    assert_eq!(free_who, Some(rank as u64), "clock-free late rank of step {id}");
    for (what, x) in [("readiness skew", secs), ("clock-free skew", free)] {
        assert!((x - late).abs() <= 0.15 * late, "step {id}: {what} {x:.6} s, injected {late} s (±15 %)");
    }
}

fn peers(c: &Cluster) -> Vec<String> {
    c.agents.addrs.iter().map(|a| a.to_string()).collect()
}

#[test]
fn one_step_across_128_hosts_names_its_straggler() {
    let c = cluster();
    let s = *c.job.straggler(401).expect("straggler of step 401");
    let m = diagnose(&peers(c), &["--step", "401", "--json"]);
    assert!(m.status.success(), "{}\n{}", m.status, m.stderr);
    let v = json(&m);
    assert_eq!(v["peers"]["answered"].as_array().map(Vec::len), Some(128), "{}", v["peers"]);
    let steps = v["steps"].as_array().cloned().unwrap_or_default();
    assert_eq!(steps.len(), 1);
    assert_straggler(&steps[0], 401, s.rank, s.late);
    assert_eq!(steps[0]["ranks"].as_array().map(Vec::len), Some(1024), "every rank of the world communicator");
    let notes = v["notes"].to_string();
    assert!(notes.contains("step 401 located in"), "only the stretch around the step was fetched: {notes}");
    // That stretch: 4 steps before, 2 after and 1 s of slack on each side, 47 steps of 50 ms.
    assert_rss(c, &m, 47);
}

/// Peak RSS of `m` against [`rss_bound_kib`] for `steps` steps' calls of every rank.
fn assert_rss(c: &Cluster, m: &Measured, steps: u64) {
    let calls = (c.job.ranks() as u64 * steps) as usize;
    let body = c.body * steps as usize / (c.job.steps as usize + 1);
    let bound = rss_bound_kib(calls, c.job.hosts, body);
    eprintln!("peak RSS {} MiB, bound {} MiB ({calls} calls, {} B of JSON a peer)", m.max_rss_kib / 1024, bound / 1024, c.body);
    assert!(m.max_rss_kib <= bound, "peak RSS {} MiB > {} MiB", m.max_rss_kib / 1024, bound / 1024);
}

#[test]
fn the_slowest_of_1000_steps_is_the_injected_one_in_bounded_memory() {
    let c = cluster();
    let s = *c.job.slowest().expect("a straggler");
    let m = diagnose(&peers(c), &["--slowest", "1", "--json"]);
    assert!(m.status.success(), "{}\n{}", m.status, m.stderr);
    let v = json(&m);
    let notes = v["notes"].to_string();
    assert!(notes.contains("period") && notes.contains(&stepwise::export::synthetic::WORLD.to_string()), "steps from the world communicator's period: {notes}");
    let steps = v["steps"].as_array().cloned().unwrap_or_default();
    assert_eq!(steps.len(), 1);
    assert_straggler(&steps[0], s.step, s.rank, s.late);
    let want = c.job.compute + s.late + c.job.transfer;
    let got = steps[0]["seconds"].as_f64().unwrap_or(0.0);
    assert!((got - want).abs() < 1e-3, "step {} took {got} s, built as {want} s", s.step);
    assert_rss(c, &m, c.job.steps + 1);
}

/// A port nothing listens on: bound, then closed.
fn closed_port() -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = l.local_addr().expect("addr").to_string();
    drop(l);
    a
}

#[test]
fn thirteen_of_128_peers_down_still_answer_and_are_named() {
    let c = cluster();
    let s = *c.job.slowest().expect("a straggler");
    // Accepts connections into its backlog and never answers.
    let hang = TcpListener::bind("127.0.0.1:0").expect("bind");
    let hang_addr = hang.local_addr().expect("addr").to_string();
    let straggler_host = (s.rank / c.job.ranks_per_host) as usize;
    let mut all = peers(c);
    let mut down: Vec<String> = Vec::new();
    for h in (3..c.job.hosts).step_by(10).filter(|h| *h != straggler_host).take(12) {
        all[h] = closed_port();
        down.push(all[h].clone());
    }
    all[1] = hang_addr.clone();
    down.push(hang_addr.clone());
    assert_eq!(down.len(), 13);
    for (fmt, args) in [("json", &["--step", "733", "--json", "--timeout", "3s"][..]), ("text", &["--step", "733", "--timeout", "3s"][..])] {
        let m = diagnose(&all, args);
        assert_eq!(m.status.code(), Some(0), "cli.md: exit 0 when a report is printed, also from the peers that answered ({fmt}): {}", m.stderr);
        assert!(m.seconds < 10.0, "the hanging peer costs one timeout (3 s), not more: {:.1} s", m.seconds);
        if fmt == "json" {
            let v = json(&m);
            let failed: Vec<String> = v["peers"]["failed"].as_array().into_iter().flatten().filter_map(|f| f["peer"].as_str().map(String::from)).collect();
            let mut want = down.clone();
            want.sort();
            let mut got = failed.clone();
            got.sort();
            assert_eq!(got, want, "every down peer named, no other");
            let hung = v["peers"]["failed"].as_array().into_iter().flatten().find(|f| f["peer"] == hang_addr.as_str()).cloned().unwrap_or_default();
            assert!(hung["error"].as_str().is_some_and(|e| e.contains("timed out")), "{hung}");
            assert_eq!(v["peers"]["answered"].as_array().map(Vec::len), Some(115));
            let step = &v["steps"][0];
            let (secs, who, _, _) = skew_of(step);
            assert_eq!(who, Some(s.rank as u64), "the straggler's host answered");
            assert!((secs - s.late).abs() <= 0.15 * s.late, "readiness skew {secs} s, injected {} s", s.late);
        } else {
            assert!(m.stdout.contains("115/128 peers answered"), "{}", m.stdout);
            for d in &down {
                assert!(m.stdout.contains(d.as_str()), "down peer {d} named in the text report:\n{}", m.stdout);
            }
        }
    }
    drop(hang);
}
