//! Live desync detection against real jobs (issue 34): ranks whose calls at one sequence
//! number disagree. Each job does two collectives per step — the all_reduce and a 64-byte
//! broadcast from rank 0 — so step k's all_reduce is #2k; at step 5 (#10) rank 2's call
//! disagrees:
//!
//! - `op`: it calls a broadcast in place of the all_reduce (the job hangs: every rank inside);
//! - `count`: its all_reduce has half the count (OpenMPI: `MPI_ERR_TRUNCATE` on rank 2, the
//!   others stay inside);
//! - `skip`: it skips the all_reduce, so its broadcast meets the others' all_reduce.
//!
//! The agent must report the desync at #10 naming rank 2 and what each rank called, within
//! the hang threshold of the first entry at #10; the hang verdict must say a desync is the
//! cause, `stepwise_collective_desyncs_total` count it once, and `agent diagnose --hang`
//! print it. OpenMPI (all three) and PyTorch gloo (`op` and `skip`: gloo's byte counts are
//! not decoded, so a different count is not comparable there).

mod support;

use std::time::Duration;

use serde_json::Value;
use stepwise_tests::{
    harness::{agent_bin, sample, wait_for, Agent, Proc},
    netns::Netns,
    torch::{self, GlooJob},
    workloads,
};
use support::hang::{line_fields, now, open_of, pid_of, signal, wait_line, HANG};

/// The desync's sequence number: step 5's all_reduce, two collectives per step.
const SEQ: u64 = 10;
const BYTES: u64 = 4096;

struct Setup {
    dir: tempfile::TempDir,
    ns: Netns,
    agent: Agent,
}

fn setup(name: &str, extra: &str) -> Setup {
    let dir = tempfile::Builder::new().prefix(&format!("stepwise-desync-{name}-")).tempdir().expect("tmp");
    let ns = Netns::new().expect("netns (needs root and iproute2)");
    let cfg = dir.path().join("agent.toml");
    let mut text = support::straggler::config(&ns, &dir.path().join("markers.sock"), "");
    text.push_str(extra);
    text.push_str(HANG);
    std::fs::write(&cfg, text).expect("config");
    let agent = Agent::start(dir.path(), &["--config", cfg.to_str().expect("utf8")]).expect("agent starts");
    Setup { dir, ns, agent }
}

/// Waits for the agent's desync and the hang verdict that names it; checks both against
/// what rank 2 called (`op`, `bytes`) and the others' all_reduce of [`BYTES`]. Returns the
/// desync's detection latency (seconds from the first entry at #10).
fn check_found(a: &Agent, library: &str, op: &str, bytes: Option<u64>) -> f64 {
    let found = wait_for(Duration::from_secs(30), "desync reported", || {
        let v = open_of(a);
        let d = v["desyncs"].as_array()?.first()?.clone();
        Some((d, now()))
    });
    let (d, seen) = found.unwrap_or_else(|e| panic!("{e}: {}", open_of(a)));
    let since = d["since"].as_f64().expect("since");
    let lat = seen - since;
    let (h, hang_seen) = wait_for(Duration::from_secs(30), "hang with the desync as its cause", || {
        let v = open_of(a);
        v["hangs"].as_array()?.iter().find(|h| h["suspected"] == true && h["desync"].is_object()).cloned().map(|h| (h, now()))
    })
    .unwrap_or_else(|e| panic!("{e}: {}", open_of(a)));
    let threshold = h["threshold_seconds"].as_f64().expect("threshold");
    println!(
        "{library} {op}: desync at #{} seen {lat:.2} s after the first entry; hang suspected with the desync {:.2} s after it (threshold {threshold:.2} s): {}",
        d["seq"],
        hang_seen - since,
        d["groups"]
    );
    assert!(lat <= threshold, "desync found {lat:.2} s after the first entry, later than the {threshold:.2} s hang threshold");
    assert_eq!((d["seq"].as_u64(), d["library"].as_str()), (Some(SEQ), Some(library)), "{d}");
    assert_eq!(d["odd_ranks"], serde_json::json!([2]), "{d}");
    // Hung at the divergence: no later call shows which way rank 2 is shifted.
    assert!(d["shift"].is_null(), "{d}");
    let g = d["groups"].as_array().expect("groups");
    let want_bytes = |b: Option<u64>| if library == "gloo" { Value::Null } else { b.into() };
    assert_eq!((&g[0]["op"], &g[0]["bytes"], &g[0]["ranks"]), (&Value::from("all_reduce"), &want_bytes(Some(BYTES)), &serde_json::json!([0, 1, 3])), "{d}");
    assert_eq!((&g[1]["op"], &g[1]["bytes"], &g[1]["ranks"]), (&Value::from(op), &want_bytes(bytes), &serde_json::json!([2])), "{d}");
    assert_eq!((h["seq"].as_u64(), h["desync"]["odd_ranks"].clone()), (Some(SEQ), serde_json::json!([2])), "{h}");
    let m = a.metrics().expect("metrics");
    assert_eq!(sample(&m, "stepwise_collective_desyncs_total", &[("library", library)]), Some(1.0), "counted once");
    let out = std::process::Command::new(agent_bin()).args(["diagnose", "--hang", "--agent", &a.addr]).output().expect("diagnose");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(4), "diagnose --hang exits 4 on a suspected hang: {text}");
    println!("{text}");
    assert!(text.contains("SUSPECTED HUNG by a desync") && text.contains(&format!("rank 2 called {op}")), "{text}");
    lat
}

/// One job at a time: detection is timed against the hang threshold on a 2-core machine.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn mpi_desync(mode: &str, op: &str, bytes: Option<u64>) {
    let _serial = serial();
    let s = setup(&format!("mpi-{mode}"), "");
    workloads::build().expect("workloads build");
    let bytes_arg = BYTES.to_string();
    let args = ["--steps", "12", "--compute-us", "20000", "--bytes", &bytes_arg, "--desync-rank", "2", "--desync-step", "5", "--desync-mode", mode];
    let mut cmd = workloads::mpi_steps_with(s.ns.name(), 4, &[], &args);
    let mut job = Proc::spawn(mode, &mut cmd, s.dir.path().join(format!("{mode}.log"))).expect("mpirun starts");
    wait_line(&mut job, "desync rank=2 step=5", Duration::from_secs(120));
    check_found(&s.agent, "mpi", op, bytes);
    // The ranks outlive a killed mpirun for a while (their alarm ends them): each by its pid.
    let text = job.log_text();
    let pids: Vec<u32> = (0..4).filter_map(|r| line_fields(&text, &format!("init rank={r} "))).map(|f| pid_of(&f)).collect();
    drop(job);
    for p in pids {
        if std::path::Path::new(&format!("/proc/{p}")).exists() {
            signal(p, "KILL");
        }
    }
}

#[test]
fn mpi_rank_calling_another_op_is_a_desync() {
    mpi_desync("op", "broadcast", Some(BYTES));
}

#[test]
fn mpi_rank_calling_another_count_is_a_desync() {
    mpi_desync("count", "all_reduce", Some(BYTES / 2));
}

#[test]
fn mpi_rank_skipping_a_collective_is_a_desync() {
    mpi_desync("skip", "broadcast", Some(64));
}

fn gloo_desync(mode: &str, op: &str) {
    let _serial = serial();
    let lib = torch::lib_dir().expect("PyTorch (pip install torch into ~/.cache/stepwise/torch)");
    let s = setup(&format!("gloo-{mode}"), &format!("[collectives]\nlibrary_dirs = [\"{}\"]\n", lib.display()));
    let probed = |st: &Value| {
        st["collectives_detail"]["libraries"].as_array().is_some_and(|l| l.iter().any(|x| x["family"] == "gloo" && x["probes"].as_u64() > Some(0)))
    };
    wait_for(Duration::from_secs(30), "libtorch_cpu.so probed", || s.agent.status().ok().filter(probed)).expect("gloo probed at start");
    let bytes_arg = BYTES.to_string();
    let args = ["--steps", "12", "--compute-ms", "20", "--bytes", &bytes_arg, "--desync-rank", "2", "--desync-step", "5", "--desync-mode", mode];
    let mut job = GlooJob::start(s.ns.name(), s.dir.path(), mode, 4, &args).expect("gloo ranks start");
    wait_line(&mut job.ranks[2].1, "desync rank=2 step=5", Duration::from_secs(300));
    check_found(&s.agent, "gloo", op, None);
    // The job ends when the test drops it (SIGKILL per rank).
}

#[test]
fn gloo_rank_calling_another_op_is_a_desync() {
    gloo_desync("op", "broadcast");
}

#[test]
fn gloo_rank_skipping_a_collective_is_a_desync() {
    gloo_desync("skip", "broadcast");
}
