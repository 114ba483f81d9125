//! An agent that comes in while the job runs — a DaemonSet rolling update restarting one
//! node's agent, a node whose agent started late. Real PyTorch gloo, 4 ranks on two namespace
//! "servers" (two each, gloo over the rail between them), rank 3 (server 1) 30 ms late every
//! 4th step. Server 0's agent watches from the start; server 1's agent is started only once
//! the job has run `LATE_START_STEP` steps, so it numbers the world communicator's calls from
//! where it came in, while server 0's agent numbers them from the first. `agent diagnose
//! --peers` must still join each all-reduce with its own partners: every step after server 1's
//! agent came in has all 4 ranks, rank 3 is named on exactly the late steps with the job's
//! own skew (±15 %), and elsewhere only the job's jitter shows (paired on the raw numbers,
//! every step would pair different all-reduces: skews of whole steps, or none at all).

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use serde_json::Value;
use stepwise_tests::{
    scenarios::{self, agent_config, cause, cause_seconds, diagnose, mgmt_addr, rail_addr, rail_dev, Servers},
    torch, workloads,
};

const STEPS: u64 = 60;
const LATE_MS: f64 = 30.0;
const EVERY: u64 = 4;
const LATE_START_STEP: u64 = 10;

/// The highest step rank 0 has printed so far.
fn progress(job: &torch::GlooJob) -> Option<u64> {
    workloads::parse_steps(&job.ranks[0].1.log_text()).iter().map(|l| l.step).max()
}

#[test]
fn an_agent_started_mid_job_joins_under_the_other_agents_numbers() {
    let lib = torch::lib_dir().expect("PyTorch (pip install torch into ~/.cache/stepwise/torch)");
    scenarios::require_tools(&["ip", "env", "python3"]).expect("tools");
    workloads::build().expect("workloads build");
    let tmp = tempfile::Builder::new().prefix("stepwise-late-agent-").tempdir().expect("tmp");
    let dir = tmp.path();
    let mut s = Servers::new(1, 1500, None).expect("servers (needs root)");
    let socks: Vec<PathBuf> = (0..2).map(|k| dir.join(format!("markers-{k}.sock"))).collect();
    let cfg = |s: &Servers, k: usize| {
        agent_config(s.ns(k), dir, k, Some(&socks[k]), &BTreeMap::new(), false).replacen(
            "library_dirs = [",
            &format!("library_dirs = [\"{}\", ", lib.display()),
            1,
        )
    };
    let c0 = cfg(&s, 0);
    s.start_agent(0, dir, &c0).expect("server 0's agent starts");

    let ranks: Vec<(String, u32, Vec<String>)> = (0..4u32)
        .map(|r| {
            let k = (r / 2) as usize;
            (s.ns(k).to_string(), r, vec![format!("GLOO_SOCKET_IFNAME={}", rail_dev(0)), format!("STEPS_MARKER_SOCKET={}", socks[k].display())])
        })
        .collect();
    let args = [
        "--steps",
        &STEPS.to_string(),
        "--bytes",
        "262144",
        "--compute-ms",
        "80",
        "--late-rank",
        "3",
        "--late-ms",
        &LATE_MS.to_string(),
        "--late-every",
        &EVERY.to_string(),
    ];
    let master = rail_addr(0, 0).to_string();
    let mut job = torch::GlooJob::start_across(dir, "gloo", &master, &ranks, &args).expect("gloo job starts");

    // Server 1's agent comes in mid-job.
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while progress(&job).is_none_or(|k| k < LATE_START_STEP) {
        assert!(std::time::Instant::now() < deadline, "the job did not reach step {LATE_START_STEP}:\n{}", job.output());
        std::thread::sleep(Duration::from_millis(20));
    }
    let c1 = cfg(&s, 1);
    s.start_agent(1, dir, &c1).expect("server 1's agent starts");
    let came_in = progress(&job).expect("progress");
    eprintln!("server 1's agent ready at step {came_in} of {STEPS}");
    assert!(came_in + 20 < STEPS, "server 1's agent came in at step {came_in}: too late to leave steps to check");

    let out = job.wait(Duration::from_secs(300)).expect("gloo job");
    let truth = workloads::true_skew_seconds(&workloads::parse_steps(&out));
    std::thread::sleep(Duration::from_millis(3500));

    let list = format!("{}:9477,{}:9478", mgmt_addr(0), mgmt_addr(1));
    let (code, stdout, stderr) = diagnose(&s, &["--peers", &list, "--since", "5m", "--json"]).expect("diagnose runs");
    assert_eq!(code, 0, "diagnose: {stderr}\n{stdout}");
    let rep: Value = serde_json::from_str(&stdout).expect("json");
    eprintln!("clocks: {}", rep["clocks"]);
    let steps: BTreeMap<u64, &Value> = rep["steps"].as_array().expect("steps").iter().filter_map(|st| Some((st["step"].as_u64()?, st))).collect();
    // Steps after server 1's agent came in (one step of margin: it attached during one).
    let checked: Vec<u64> = (came_in + 2..STEPS).collect();
    let mut late_seen = 0;
    for id in &checked {
        let st = steps.get(id).unwrap_or_else(|| panic!("step {id} missing from diagnose: {:?}", steps.keys().collect::<Vec<_>>()));
        let ranks = st["ranks"].as_array().map_or(0, Vec::len);
        assert_eq!(ranks, 4, "step {id}: the all-reduce joined with all four ranks: {st}");
        let (want, late) = truth[id];
        let got = cause_seconds(st, "readiness_skew");
        if (id + 1) % EVERY == 0 {
            assert_eq!(late, 3, "step {id}: the injection as planned");
            assert!((got - want).abs() <= 0.15 * want, "step {id}: readiness skew {:.1} ms vs the job's {:.1} ms: {st}", got * 1e3, want * 1e3);
            assert_eq!(cause(st, "readiness_skew")["rank"], 3, "step {id}: {st}");
            late_seen += 1;
        } else {
            assert!(
                (got - want).abs() <= (0.15 * want).max(0.010),
                "step {id}: readiness skew {:.1} ms on a step without delay (the job's {:.1} ms): {st}",
                got * 1e3,
                want * 1e3
            );
        }
    }
    eprintln!("{} steps checked after server 1's agent came in, {late_seen} late", checked.len());
    assert!(late_seen >= 5);
    // Server 1's agent counted from mid-job, its ranks from different collectives: once
    // aligned, no rank disagrees with another (no false desync, issue 34).
    for k in 0..2 {
        let open = s.get_json(&format!("{}:{}", mgmt_addr(k), 9477 + k), "/api/v1/open").expect("/api/v1/open");
        assert_eq!(open["desyncs"], serde_json::json!([]), "server {k}'s agent: {open}");
    }
}
