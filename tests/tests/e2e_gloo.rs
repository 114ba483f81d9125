//! Real PyTorch gloo (`torch.distributed`, CPU) under the real agent: 4 ranks of
//! `tests/workloads/gloo/steps.py` in a network namespace, identity from the environment
//! torchrun sets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), gloo probed inside the job's
//! `libtorch_cpu.so`. PyTorch comes from PyPI into `~/.cache/stepwise/torch` on first use
//! (`stepwise_tests::torch`; about 2.8 GB, once).
//!
//! - straggler: rank 2 computes 30 ms longer every 5th step; each such step's readiness
//!   skew is attributed within 15 % of the skew the ranks measured on their own clock, to
//!   rank 2, and every rank's calls carry their rank;
//! - hang (issue 15): rank 2 sleeps forever before step 5's all_reduce; `/api/v1/open` and
//!   `agent diagnose --hang` name it (not arrived, sleeping, last call #4) within 2 × the
//!   threshold of the `[hang]` rule `e2e_hang.rs` runs with;
//! - rank 1 SIGSTOPs itself before step 4's all_reduce: named `T (stopped)`; after SIGCONT
//!   the job completes and step 4 is readiness skew on rank 1, about as long as the stop.
//!
//! Each test has its own namespace, agent and ports; every wait polls with a deadline.
//! `--nocapture` shows the measured skews and the detection latency.

mod support;

use std::{collections::BTreeMap, time::Duration};

use serde_json::Value;
use stepwise_tests::{
    harness::{agent_bin, sample, wait_for, Agent},
    netns::Netns,
    scenarios,
    torch::{self, GlooJob},
    workloads,
};
use support::hang::{inside_ranks, latency, missing, now, open_of, pid_of, signal, suspected_with, wait_line, HANG};

const LATE_MS: f64 = 30.0;
const STEPS: u64 = 15;
/// Importing torch in four processes on a loaded 2-core machine takes a while.
const JOB_TIMEOUT: Duration = Duration::from_secs(300);

struct Setup {
    dir: tempfile::TempDir,
    ns: Netns,
    agent: Agent,
    sock: std::path::PathBuf,
}

/// An agent watching the namespace, with torch's `lib` preloaded (probed before the job
/// starts, so every rank's first all_reduce is seen) and the hang rule of `e2e_hang.rs`.
fn setup(name: &str) -> Setup {
    let lib = torch::lib_dir().expect("PyTorch (pip install torch into ~/.cache/stepwise/torch)");
    let dir = tempfile::Builder::new().prefix(&format!("stepwise-gloo-{name}-")).tempdir().expect("tmp");
    let ns = Netns::new().expect("netns (needs root and iproute2)");
    let sock = dir.path().join("markers.sock");
    let cfg = dir.path().join("agent.toml");
    let text = format!(
        "interval = \"100ms\"\n[sources]\nrdma = false\nethtool = false\n[collectives]\nlibrary_dirs = [\"{}\"]\n[collectives.select]\nnetns = \"/run/netns/{}\"\n[steps]\nmarker_socket = \"{}\"\n{HANG}",
        lib.display(),
        ns.name(),
        sock.display()
    );
    std::fs::write(&cfg, text).expect("config");
    let agent = Agent::start(dir.path(), &["--config", cfg.to_str().expect("utf8")]).expect("agent starts");
    let probed = |st: &Value| {
        st["collectives_detail"]["libraries"].as_array().is_some_and(|l| {
            l.iter().any(|x| x["family"] == "gloo" && x["path"].as_str().is_some_and(|p| p.ends_with("libtorch_cpu.so")) && x["probes"].as_u64() > Some(0))
        })
    };
    wait_for(Duration::from_secs(30), "libtorch_cpu.so probed", || agent.status().ok().filter(probed)).expect("gloo probed at start");
    Setup { dir, ns, agent, sock }
}

fn start_job(s: &Setup, name: &str, args: &[&str]) -> GlooJob {
    let sock = s.sock.to_str().expect("utf8");
    let mut all = vec!["--marker-socket", sock];
    all.extend_from_slice(args);
    GlooJob::start(s.ns.name(), s.dir.path(), name, 4, &all).expect("gloo ranks start")
}

fn gloo_all_reduces(a: &Agent) -> Vec<Value> {
    let v: Value = serde_json::from_str(&a.get("/api/v1/collectives?limit=10000").expect("collectives").body).expect("json");
    v["calls"].as_array().cloned().unwrap_or_default().into_iter().filter(|c| c["library"] == "gloo" && c["op"] == "all_reduce").collect()
}

/// Every rank's all_reduces seen once, with the rank, size and communicator the environment
/// and gloo give.
fn check_calls(a: &Agent) {
    let calls = wait_for(Duration::from_secs(30), "every gloo all_reduce", || Some(gloo_all_reduces(a)).filter(|c| c.len() as u64 >= 4 * STEPS))
        .unwrap_or_else(|e| panic!("{e}: {} seen", gloo_all_reduces(a).len()));
    assert_eq!(calls.len() as u64, 4 * STEPS, "each rank's all_reduce seen once");
    let mut per_rank: BTreeMap<Option<u64>, u64> = BTreeMap::new();
    for c in &calls {
        *per_rank.entry(c["rank"].as_u64()).or_default() += 1;
        assert_eq!((c["nranks"].as_u64(), &c["comm_global"]), (Some(4), &Value::Bool(true)), "{c}");
    }
    let want: BTreeMap<Option<u64>, u64> = (0..4).map(|r| (Some(r), STEPS)).collect();
    assert_eq!(per_rank, want, "calls per rank (None: no rank)");
}

fn attributed_steps(a: &Agent, ids: &[u64]) -> BTreeMap<u64, Value> {
    wait_for(Duration::from_secs(60), "late steps attributed", || {
        let v: Value = serde_json::from_str(&a.get("/api/v1/steps?limit=100").ok()?.body).ok()?;
        let got: BTreeMap<u64, Value> = v["steps"].as_array()?.iter().filter_map(|s| Some((s["step"].as_u64()?, s.clone()))).collect();
        ids.iter().all(|k| got.contains_key(k)).then_some(got)
    })
    .expect("steps attributed")
}

#[test]
fn gloo_straggler_is_readiness_skew_on_the_late_rank() {
    let s = setup("straggler");
    let steps = STEPS.to_string();
    let args = ["--steps", &steps, "--bytes", "1048576", "--compute-ms", "20", "--late-rank", "2", "--late-ms", "30", "--late-every", "5"];
    let out = start_job(&s, "straggler", &args).wait(JOB_TIMEOUT).expect("gloo job");
    let lines = workloads::parse_steps(&out);
    assert_eq!(lines.len() as u64, 4 * STEPS, "{out}");
    assert_eq!(out.lines().filter(|l| l.starts_with("summary tool=gloo_steps") && l.ends_with(" bad=0")).count(), 4, "sums right: {out}");
    let truth = workloads::true_skew_seconds(&lines);
    check_calls(&s.agent);
    let late: Vec<u64> = (0..STEPS).filter(|k| (k + 1) % 5 == 0).collect();
    let steps = attributed_steps(&s.agent, &late);
    for k in &late {
        let (want, last) = truth[k];
        assert!(last == 2 && (want * 1e3 - LATE_MS).abs() < 0.5 * LATE_MS, "step {k}: injection did not happen as planned: {want} s, rank {last}");
        let step = &steps[k];
        let skew = scenarios::cause(step, "readiness_skew");
        let got = skew["seconds"].as_f64().unwrap_or(0.0);
        println!(
            "gloo step {k}: readiness_skew {:.1} ms attributed to rank {}, ranks' own clock {:.1} ms, injected {LATE_MS} ms",
            got * 1e3,
            skew["rank"],
            want * 1e3
        );
        assert!((got - want).abs() <= 0.15 * want, "step {k}: readiness skew {:.1} ms vs the ranks' own {:.1} ms: {step}", got * 1e3, want * 1e3);
        assert_eq!(skew["rank"], 2, "step {k}: late rank: {skew}");
        assert_eq!(scenarios::top_problem(step).0, "readiness_skew", "step {k}: {step}");
    }
    let m = s.agent.metrics().expect("metrics");
    assert!(sample(&m, "stepwise_rank_late_seconds_total", &[("rank", "2")]).unwrap_or(0.0) > 0.075, "rank 2's lateness in the metric");
}

fn diagnose_hang(a: &Agent, json: bool) -> (Option<i32>, String) {
    let mut c = std::process::Command::new(agent_bin());
    c.args(["diagnose", "--hang", "--agent", &a.addr]);
    if json {
        c.arg("--json");
    }
    let out = c.output().expect("agent diagnose");
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Waits for the suspicion naming `rank` (the others inside all_reduce #`seq`), prints and
/// checks its latency (within 2 × the threshold): the hang and the time it was seen.
fn wait_suspected(a: &Agent, rank: u64, seq: u64, how: &str) -> (Value, f64) {
    let t_stop = now();
    let (h, seen) = wait_for(Duration::from_secs(60), "hang suspected", || suspected_with(&open_of(a), rank).map(|h| (h, now())))
        .unwrap_or_else(|e| panic!("{e}: {}", open_of(a)));
    let threshold = h["threshold_seconds"].as_f64().expect("threshold");
    let lat = latency(&h, seen);
    println!(
        "gloo {how}: suspected {lat:.2} s after the others entered all_reduce #{seq} ({:.2} s after rank {rank} stopped), threshold {threshold:.2} s",
        seen - t_stop
    );
    assert!(lat <= 2.0 * threshold, "suspected after {lat:.2} s, more than 2 × the {threshold:.2} s threshold");
    assert_eq!((h["seq"].as_u64(), h["op"].as_str(), h["library"].as_str()), (Some(seq), Some("all_reduce"), Some("gloo")), "{h}");
    let others: Vec<u64> = (0..4).filter(|r| *r != rank).collect();
    assert_eq!(inside_ranks(&h), others, "{h}");
    (h, seen)
}

#[test]
fn gloo_rank_sleeping_before_all_reduce_is_named_hung() {
    let s = setup("hang");
    let mut job = start_job(&s, "hang", &["--steps", "12", "--bytes", "65536", "--compute-ms", "20", "--stop-rank", "2", "--stop-step", "5"]);
    let stopping = wait_line(&mut job.ranks[2].1, "stopping rank=2 step=5", JOB_TIMEOUT);
    let pid = pid_of(&stopping);
    assert_eq!(pid, job.ranks[2].1.pid(), "the rank is the process started (ip netns exec and env exec)");
    let (h, _) = wait_suspected(&s.agent, 2, 5, "sleep");
    let m = missing(&h, 2);
    println!("gloo hang: rank 2 as reported: {m}");
    assert_eq!((m["why"].as_str(), m["pid"].as_u64(), m["last_done_seq"].as_u64()), (Some("not_arrived"), Some(pid as u64), Some(4)), "{m}");
    assert_eq!((&m["state"]["state"], &m["state"]["in_probed_call"]), (&Value::from("S (sleeping)"), &Value::Bool(false)), "{m}");
    // What it is doing: its main thread sleeps in the kernel (time.sleep), not in gloo.
    let main = m["state"]["threads"].as_array().and_then(|t| t.iter().find(|t| t["tid"].as_u64() == Some(pid as u64)).cloned()).expect("main thread");
    assert!(main["wchan"].as_str().is_some_and(|w| w.contains("nanosleep")), "{main}");
    let comm = h["comm"].as_str().expect("comm");
    let metrics = s.agent.metrics().expect("metrics");
    let labels = [("comm", comm), ("library", "gloo")];
    assert_eq!(sample(&metrics, "stepwise_hang_suspected", &labels), Some(1.0), "{metrics}");
    assert_eq!(sample(&metrics, "stepwise_hang_missing_ranks", &labels), Some(1.0));

    let (code, text) = diagnose_hang(&s.agent, false);
    assert_eq!(code, Some(4), "diagnose --hang exits 4 on a suspected hang: {text}");
    let row = text.lines().find(|l| l.contains(&pid.to_string())).unwrap_or_else(|| panic!("rank 2's row: {text}"));
    assert!(row.trim_start().starts_with('2') && row.contains("S (sleeping)") && row.contains("#4"), "{text}");
    let (_, json) = diagnose_hang(&s.agent, true);
    let rep: Value = serde_json::from_str(&json).expect("diagnose --hang --json");
    assert_eq!(rep["suspected"], 1, "{rep}");
    // The sleeping rank never returns: the job ends when the test drops it (SIGKILL per rank).
}

#[test]
fn gloo_sigstopped_rank_is_named_stopped_then_its_step_is_readiness_skew() {
    let s = setup("sigstop");
    let args = ["--steps", "10", "--bytes", "65536", "--compute-ms", "20", "--stop-rank", "1", "--stop-step", "4", "--stop-mode", "sigstop"];
    let mut job = start_job(&s, "sigstop", &args);
    let pid = pid_of(&wait_line(&mut job.ranks[1].1, "stopping rank=1 step=4", JOB_TIMEOUT));
    let (h, seen) = wait_suspected(&s.agent, 1, 4, "sigstop");
    let m = missing(&h, 1);
    assert_eq!((m["why"].as_str(), m["pid"].as_u64(), m["last_done_seq"].as_u64()), (Some("not_arrived"), Some(pid as u64), Some(3)), "{m}");
    assert_eq!(m["state"]["state"], "T (stopped)", "{m}");
    signal(pid, "CONT");
    let stopped = now() - (seen - latency(&h, seen));
    let out = job.wait(JOB_TIMEOUT).expect("the job completes after SIGCONT");
    assert_eq!(workloads::parse_steps(&out).len(), 40, "{out}");
    let step = attributed_steps(&s.agent, &[4]).remove(&4).expect("step 4");
    let skew = scenarios::cause(&step, "readiness_skew");
    let got = skew["seconds"].as_f64().unwrap_or(0.0);
    println!("gloo sigstop: step 4 readiness_skew {got:.2} s on rank {} for a {stopped:.2} s stop", skew["rank"]);
    assert_eq!((scenarios::top_problem(&step).0.as_str(), &skew["rank"]), ("readiness_skew", &Value::from(1)), "{step}");
    assert!(got >= 0.8 * stopped, "readiness skew {got:.2} s for a {stopped:.2} s stop");
}
