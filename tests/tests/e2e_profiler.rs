//! The NCCL profiler plugin end to end (issue 14): a 4-rank `nccl_steps` job on the
//! asynchronous NCCL-ABI library (calls only enqueue; the library loads profiler plugins by
//! NCCL's contract and hands them a simulated GPU timer), in a network namespace, watched by
//! an agent that selects the namespace and listens on its own profiler socket.
//!
//! - rank 2's GPU work is 30 ms longer while every CPU enqueues on time: with the plugin the
//!   readiness skew is the 30 ms, charged to rank 2, and the steps say `timing: gpu`;
//! - rank 2's CPU is 20 ms late but its GPU is still busy with 40 ms of earlier work: with the
//!   plugin no readiness skew is charged to it;
//! - the all-reduce captured once into a CUDA graph and replayed every step (no host call):
//!   timed from the replay's profiler events, and the steps say graph replay;
//! - the first job without the plugin: the steps say host-only timing (`host_enqueue`, a
//!   note with the host enqueue skew) and name no straggler.
//!
//! Needs root (network namespaces) and eBPF (the uprobes that give the identity of the
//! processes without the plugin). The knobs (`--gpu-*`) must exist: a library without them
//! fails the test (nccl_steps exits 2), it is not skipped.

use std::{
    path::PathBuf,
    process::Command,
    sync::Mutex,
    time::{Duration, Instant},
};

mod support;

use stepwise_tests::{
    harness::{sample, wait_for, Agent, Proc},
    netns::Netns,
    workloads,
};

/// The jobs are timed: one at a time on the 2-core machine.
static SERIAL: Mutex<()> = Mutex::new(());

const STEPS: usize = 14;
const GPU_DELAY_MS: f64 = 30.0;

struct Setup {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    ns: Netns,
    agent: Agent,
    profiler_sock: PathBuf,
    marker_sock: PathBuf,
}

/// The directory, namespace and sockets of a test, before its agent.
struct Bare {
    tmp: tempfile::TempDir,
    dir: PathBuf,
    ns: Netns,
    profiler_sock: PathBuf,
    marker_sock: PathBuf,
}

fn bare() -> Bare {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().to_path_buf();
    let ns = Netns::new().expect("network namespace (needs root)");
    let (profiler_sock, marker_sock) = (dir.join("profiler.sock"), dir.join("markers.sock"));
    Bare { tmp, dir, ns, profiler_sock, marker_sock }
}

fn setup() -> Setup {
    with_agent(bare())
}

fn with_agent(b: Bare) -> Setup {
    with_agent_config(b, "")
}

/// An agent whose configuration ends with `extra` (TOML sections).
fn with_agent_config(b: Bare, extra: &str) -> Setup {
    with_agent_toml(b, "", extra)
}

/// An agent whose configuration starts with `top` (top-level keys) and ends with `extra`.
fn with_agent_toml(b: Bare, top: &str, extra: &str) -> Setup {
    let Bare { tmp, dir, ns, profiler_sock, marker_sock } = b;
    let lib = workloads::build().expect("workloads build");
    let cfg = dir.join("agent.toml");
    std::fs::write(
        &cfg,
        format!(
            "{top}interval = \"100ms\"\n[sources]\nrdma = false\nethtool = false\n[collectives]\nlibrary_dirs = [\"{}\"]\nprofiler_socket = \"{}\"\n\
             [collectives.select]\nnetns = \"/run/netns/{}\"\n[steps]\nmarker_socket = \"{}\"\ngrace = \"2s\"\n{extra}",
            lib.display(),
            profiler_sock.display(),
            ns.name(),
            marker_sock.display()
        ),
    )
    .expect("config");
    let agent = Agent::start(&dir, &["--config", cfg.to_str().expect("utf8")]).expect("agent");
    agent.require_ebpf().expect("eBPF");
    Setup { _dir: tmp, dir, ns, agent, profiler_sock, marker_sock }
}

/// Runs the 4 ranks in the namespace (asynchronous library: no CUDA_LAUNCH_BLOCKING), with
/// the plugin when `plugin`; returns every rank's output.
fn run_job(s: &Setup, plugin: bool, args: &[&str]) -> Vec<String> {
    let b = (s.dir.as_path(), s.ns.name(), s.profiler_sock.as_path(), s.marker_sock.as_path());
    wait_job(spawn_job(b, plugin, STEPS, args))
}

/// Starts the ranks: (directory, namespace, profiler socket, marker socket).
fn spawn_job(b: (&std::path::Path, &str, &std::path::Path, &std::path::Path), plugin: bool, steps: usize, args: &[&str]) -> Vec<Proc> {
    spawn_job_env(b, plugin, steps, args, &[])
}

/// [`spawn_job`] with extra `KEY=value` environment entries for every rank (`{rank}` in a
/// value becomes the rank).
fn spawn_job_env(b: (&std::path::Path, &str, &std::path::Path, &std::path::Path), plugin: bool, steps: usize, args: &[&str], env: &[&str]) -> Vec<Proc> {
    let (dir, ns, profiler_sock, marker_sock) = b;
    let bin = workloads::build().expect("build").join("nccl_steps");
    let id = dir.join("job.id");
    let _ = std::fs::remove_file(&id);
    let mut procs: Vec<Proc> = Vec::new();
    for r in 0..4u32 {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, "env", "-u", "CUDA_LAUNCH_BLOCKING", "STEPS_COMPUTE=sleep"]).args(env.iter().map(|e| e.replace("{rank}", &r.to_string())));
        c.arg(format!("STEPWISE_PROFILER_SOCKET={}", profiler_sock.display()));
        if plugin {
            c.arg(format!("NCCL_PROFILER_PLUGIN={}", workloads::profiler_plugin().expect("plugin").display()));
        } else {
            c.arg("NCCL_PROFILER_PLUGIN=none");
        }
        c.arg(&bin).args(["--rank", &r.to_string(), "--nranks", "4", "--id-file"]).arg(&id);
        c.args(["--steps", &steps.to_string(), "--bytes", "65536", "--marker-socket"]).arg(marker_sock).args(args);
        procs.push(Proc::spawn(&format!("r{r}"), &mut c, dir.join(format!("r{r}.log"))).expect("spawn rank"));
    }
    procs
}

/// Waits for every rank; returns their outputs.
fn wait_job(mut procs: Vec<Proc>) -> Vec<String> {
    let end = Instant::now() + Duration::from_secs(120);
    procs
        .iter_mut()
        .enumerate()
        .map(|(r, p)| loop {
            match p.child.try_wait().expect("wait") {
                Some(st) => {
                    let text = p.log_text();
                    assert!(st.success(), "rank {r} failed ({st}) — does the library have the --gpu-* knobs?\n{text}");
                    break text;
                }
                None if Instant::now() > end => panic!("rank {r} still running:\n{}", p.log_text()),
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        })
        .collect()
}

/// The attributed steps, once every step of the job (but the first, whose begin may precede
/// the probes' view of the job) is in.
fn steps(a: &Agent) -> Vec<serde_json::Value> {
    wait_for(Duration::from_secs(30), "steps attributed", || {
        let v: serde_json::Value = serde_json::from_str(&a.get("/api/v1/steps?limit=100").ok()?.body).ok()?;
        let s = v["steps"].as_array()?.clone();
        (s.len() >= STEPS - 1).then_some(s)
    })
    .expect("steps")
}

fn cause<'a>(step: &'a serde_json::Value, kind: &str) -> &'a serde_json::Value {
    step["causes"].as_array().and_then(|c| c.iter().find(|c| c["kind"] == kind)).expect("cause")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Steady-state steps: the first two warm the job up (connections, the plugin's offset window).
fn steady(steps: &[serde_json::Value]) -> Vec<&serde_json::Value> {
    steps.iter().filter(|s| s["step"].as_u64().is_some_and(|k| k >= 2)).collect()
}

fn summary(steps: &[&serde_json::Value]) -> String {
    steps
        .iter()
        .map(|s| {
            let c = cause(s, "readiness_skew");
            format!("step {} {}: skew {:.1} ms rank {} | ", s["step"], s["timing"], c["seconds"].as_f64().unwrap_or(0.0) * 1e3, c["rank"])
        })
        .collect()
}

#[test]
fn a_late_gpu_is_readiness_skew_from_gpu_time_and_named() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let s = setup();
    // GPU: 10 ms of compute (rank 2: 40 ms); CPU: 1 ms, then the all-reduce is enqueued on
    // time by every rank. Rank 2's GPU reaches the collective 30 ms after the others'.
    run_job(&s, true, &["--compute-us", "1000", "--gpu-compute-ms", "10", "--gpu-delay-rank", "2", "--gpu-delay-ms", "30"]);
    let all = steps(&s.agent);
    let st = steady(&all);
    let text = summary(&st);
    assert!(st.iter().all(|s| s["timing"] == "gpu"), "every step timed by the GPU: {text}");
    let skews: Vec<f64> = st.iter().map(|s| cause(s, "readiness_skew")["seconds"].as_f64().unwrap_or(0.0) * 1e3).collect();
    let m = median(skews);
    assert!((m - GPU_DELAY_MS).abs() <= 0.15 * GPU_DELAY_MS, "median readiness skew {m:.1} ms vs {GPU_DELAY_MS} ms: {text}");
    assert!(st.iter().all(|s| cause(s, "readiness_skew")["rank"] == 2), "rank 2 named in every step: {text}");
    // The plugin is active in all four processes, and the proxy waits are in the evidence.
    let status = s.agent.status().expect("status");
    let p = &status["collectives_detail"]["profiler"];
    assert_eq!(p["active_gpu"], 4, "{p}");
    let m = s.agent.metrics().expect("metrics");
    assert_eq!(sample(&m, "stepwise_profiler_plugin_processes", &[("timing", "gpu")]), Some(4.0), "{m}");
    let records = sample(&m, "stepwise_profiler_records_total", &[]).unwrap_or(0.0);
    assert!(records >= (4 * STEPS) as f64, "{records} records: {m}");
    assert_eq!(sample(&m, "stepwise_profiler_plugin_drops_total", &[("reason", "ring_full")]), Some(0.0));
    assert!(st.iter().any(|s| cause(s, "in_flight_limit")["evidence"]["nccl_proxy_wait_seconds"].is_object()), "proxy waits shown");
}

#[test]
fn a_late_cpu_whose_gpu_is_busy_anyway_is_not_charged() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let s = setup();
    // GPU: 40 ms of compute on every rank; CPU: 1 ms, rank 2 20 ms longer. Rank 2 enqueues
    // 20 ms late, but every GPU is busy for 40 ms: all reach the collective together.
    run_job(&s, true, &["--compute-us", "1000", "--gpu-compute-ms", "40", "--delay-rank", "2", "--delay-us", "20000"]);
    let all = steps(&s.agent);
    let st = steady(&all);
    let text = summary(&st);
    assert!(st.iter().all(|s| s["timing"] == "gpu"), "{text}");
    let skews: Vec<f64> = st.iter().map(|s| cause(s, "readiness_skew")["seconds"].as_f64().unwrap_or(0.0) * 1e3).collect();
    // Rank 2's CPU delay is 20 ms; its GPU was never the one the others waited for.
    assert!(median(skews) < 2.0, "readiness skew charged although every GPU was busy: {text}");
    let late2: Vec<f64> =
        st.iter().filter_map(|s| s["ranks"].as_array()?.iter().find(|r| r["rank"] == 2).and_then(|r| r["late_seconds"].as_f64())).map(|x| x * 1e3).collect();
    let held: Vec<String> =
        st.iter().map(|s| format!("step {} colls {} ranks {}", s["step"], s["collectives"], s["ranks"].as_array().map_or(0, Vec::len))).collect();
    assert_eq!(late2.len(), st.len(), "rank 2 in every step: {held:?}");
    assert!(median(late2) < 2.0, "rank 2's lateness from GPU time: {text}");
}

/// Issue 34: the all-reduce is captured once into a CUDA graph (the library's stand-in) and
/// each step replays it, with no NCCL call on the host. Rank 2's GPU compute (queued before
/// each replay) is 30 ms longer: the replayed collectives are timed from the replay's
/// profiler events (readiness skew 30 ms, rank 2), and every step says graph replay and
/// what it cannot time.
#[test]
fn graph_replayed_all_reduces_are_timed_from_the_replay_events() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let s = setup();
    let out = run_job(&s, true, &["--graph", "--compute-us", "1000", "--gpu-compute-ms", "10", "--gpu-delay-rank", "2", "--gpu-delay-ms", "30"]);
    assert!(out.iter().all(|o| o.contains("captured rank=") && o.contains("errors=0")), "{out:?}");
    let all = steps(&s.agent);
    let st = steady(&all);
    let text = summary(&st);
    assert!(st.iter().all(|s| s["timing"] == "gpu" && s["collectives"] == 1), "one GPU-timed collective per step: {text}");
    let skews: Vec<f64> = st.iter().map(|s| cause(s, "readiness_skew")["seconds"].as_f64().unwrap_or(0.0) * 1e3).collect();
    let m = median(skews);
    assert!((m - GPU_DELAY_MS).abs() <= 0.15 * GPU_DELAY_MS, "median readiness skew {m:.1} ms vs {GPU_DELAY_MS} ms: {text}");
    assert!(st.iter().all(|s| cause(s, "readiness_skew")["rank"] == 2), "rank 2 named in every step: {text}");
    for s in &st {
        let g = &s["graph_replay"];
        assert_eq!((g["arrivals"].as_u64(), g["of"].as_u64()), (Some(4), Some(4)), "every arrival from a replay: {s}");
        let not_timed = g["not_timed"].as_array().expect("not_timed");
        assert!(not_timed.iter().any(|n| n.as_str().is_some_and(|n| n.contains("no host-side arrival"))), "{g}");
        let notes = s["notes"].as_array().expect("notes");
        assert!(notes.iter().any(|n| n.as_str().is_some_and(|n| n.starts_with("graph replay: 4 of 4"))), "{notes:?}");
    }
    // The host probes saw each rank's all-reduce once: at capture.
    let r = s.agent.get("/api/v1/collectives?limit=100000").expect("collectives");
    let v: serde_json::Value = serde_json::from_str(&r.body).expect("collectives JSON");
    let host: Vec<&serde_json::Value> = v["calls"].as_array().expect("calls").iter().filter(|c| c["op"] == "all_reduce" && c["timing"] != "gpu").collect();
    assert!(host.len() <= 4, "{} host all-reduce calls for 4 captures: {host:?}", host.len());
    let out = Command::new(stepwise_tests::harness::agent_bin()).args(["diagnose", "--agent", &s.agent.addr]).output().expect("diagnose");
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(t.contains("graph replay: 4 of 4 arrivals (CUDA graph); not timed: host call"), "{t}");
}

#[test]
fn without_the_plugin_enqueue_times_name_no_straggler() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let s = setup();
    // Rank 2's CPU is 30 ms late (its enqueue), and the async calls return at once.
    run_job(&s, false, &["--compute-us", "1000", "--gpu-compute-ms", "10", "--delay-rank", "2", "--delay-us", "30000"]);
    let all = steps(&s.agent);
    let st = steady(&all);
    let text = summary(&st);
    assert!(st.iter().all(|s| s["timing"] == "host_enqueue"), "{text}");
    for s in &st {
        let c = cause(s, "readiness_skew");
        assert_eq!(c["seconds"].as_f64(), Some(0.0), "no skew from enqueue times: {text}");
        assert!(c["rank"].is_null(), "no straggler named: {text}");
        let enq = c["evidence"]["host_enqueue_skew_seconds"].as_f64().expect("host enqueue skew figure");
        assert!(enq > 0.02, "the CPU-side figure is there ({enq} s)");
        let notes = s["notes"].as_array().expect("notes");
        assert!(notes.iter().any(|n| n.as_str().is_some_and(|n| n.contains("host-only timing"))), "{notes:?}");
    }
    // agent diagnose says the same (text and JSON).
    let out = Command::new(stepwise_tests::harness::agent_bin()).args(["diagnose", "--agent", &s.agent.addr, "--json"]).output().expect("diagnose");
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("diagnose JSON: {e}: {}", String::from_utf8_lossy(&out.stdout)));
    let jsteps = j["steps"].as_array().expect("steps");
    assert!(!jsteps.is_empty() && jsteps.iter().all(|s| s["timing"] == "host_enqueue"), "{j}");
    // Nor a clock-free estimate from the time inside the calls (the enqueue): seen on a real
    // GPU, where it named rank 1 for 0.1 ms of enqueue time.
    assert!(jsteps.iter().all(|s| s["skew"]["clock_free_seconds"].is_null() && s["skew"]["clock_free_late_rank"].is_null()), "{j}");
    let out = Command::new(stepwise_tests::harness::agent_bin()).args(["diagnose", "--agent", &s.agent.addr]).output().expect("diagnose");
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(t.contains("timing: host_enqueue") && t.contains("host-only timing"), "{t}");
    assert!(t.contains("clock-free n/a (timed at the host enqueue)") && !t.contains("late rank"), "{t}");
    let status = s.agent.status().expect("status");
    assert_eq!(status["collectives_detail"]["profiler"]["active_gpu"], 0);
    // One probe hit per asynchronous call: once the agent has seen a rank, the session
    // program records each all-reduce's entry as the whole call (its return only said the
    // work was enqueued) and the kernel skips the return; the calls a rank made before that
    // keep their return. So per rank: paired calls first, then only calls left alone.
    let r = s.agent.get("/api/v1/collectives?limit=100000").expect("collectives");
    let v: serde_json::Value = serde_json::from_str(&r.body).expect("collectives JSON");
    let mut ar: Vec<&serde_json::Value> = v["calls"].as_array().expect("calls").iter().filter(|c| c["op"] == "all_reduce").collect();
    ar.sort_by_key(|c| c["enter_ns"].as_u64());
    assert!(ar.len() >= 4 * STEPS, "{} all-reduces", ar.len());
    let alone = |c: &serde_json::Value| c["enter_ns"] == c["exit_ns"] && c["ret"].is_null();
    let mut pids: Vec<u64> = ar.iter().filter_map(|c| c["pid"].as_u64()).collect();
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(pids.len(), 4, "four ranks' all-reduces");
    for pid in pids {
        let mine: Vec<bool> = ar.iter().filter(|c| c["pid"].as_u64() == Some(pid)).map(|c| alone(c)).collect();
        let first = mine.iter().position(|a| *a).unwrap_or(mine.len());
        assert!(mine[first..].iter().all(|a| *a), "rank pid {pid}: a paired call after a call left alone: {mine:?}");
        assert!(first * 10 <= mine.len(), "rank pid {pid}: {first} of {} all-reduces paired", mine.len());
    }
    // The hang report says what it cannot see.
    let out = Command::new(stepwise_tests::harness::agent_bin()).args(["diagnose", "--hang", "--agent", &s.agent.addr]).output().expect("diagnose --hang");
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(t.contains("4 rank(s) call NCCL asynchronously without the profiler plugin"), "{t}");
}

/// Issue 15: rank 2's GPU stops before step 5's all-reduce (10 minutes of simulated GPU work)
/// while every host call has returned — the collectives are asynchronous, so no call is open
/// on any host. The other GPUs are inside the all-reduce waiting for it: the plugin's
/// progress records show the hang, and rank 2 is named as not arrived with its last
/// completed collective.
#[test]
fn a_gpu_that_stops_is_a_hang_seen_from_the_gpu_side() {
    use support::hang::{inside_ranks, latency, missing, now, open_of, suspected_with, HANG};
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let s = with_agent_config(bare(), HANG);
    let b = (s.dir.as_path(), s.ns.name(), s.profiler_sock.as_path(), s.marker_sock.as_path());
    let args = ["--compute-us", "20000", "--gpu-compute-ms", "5", "--gpu-delay-rank", "2", "--gpu-delay-ms", "600000", "--gpu-delay-every", "6"];
    // The library's own no-progress timeout (10 s) would fail the waiting ranks first.
    let procs = spawn_job_env(b, true, 12, &args, &["NCCL_ABI_TIMEOUT_MS=600000"]);
    let (h, seen) = wait_for(Duration::from_secs(60), "GPU-side hang suspected", || suspected_with(&open_of(&s.agent), 2).map(|h| (h, now())))
        .unwrap_or_else(|e| panic!("{e}\n{}", serde_json::to_string_pretty(&open_of(&s.agent)).unwrap_or_default()));
    let lat = latency(&h, seen);
    let threshold = h["threshold_seconds"].as_f64().expect("threshold");
    println!("GPU-side hang: suspected {lat:.2} s after the first GPU entered all-reduce #{} (threshold {threshold:.1} s): {h}", h["seq"]);
    assert_eq!((h["op"].as_str(), h["seq"].as_u64()), (Some("all_reduce"), Some(5)), "{h}");
    assert_eq!(inside_ranks(&h), [0, 1, 3], "the other GPUs are inside: {h}");
    let m = missing(&h, 2);
    assert_eq!((m["why"].as_str(), m["last_done_seq"].as_u64()), (Some("not_arrived"), Some(4)), "{m}");
    assert!(lat <= 2.0 * threshold, "detected {lat:.2} s after entry, threshold {threshold:.1} s");
    // Every host call of the job returned: the only communicator with anything open is the
    // GPU side's (the uprobes' view of the same communicator has no open call).
    let view = open_of(&s.agent);
    let hangs = view["hangs"].as_array().expect("hangs");
    assert_eq!(hangs.len(), 1, "only the GPU side shows an open collective: {view}");
    drop(procs);
}

/// A crashed agent never disturbs the job: the agent is SIGKILLed while 4 ranks with the
/// plugin run, and started again a second later. Every rank completes every step, no step
/// stalls (a plugin that blocked NCCL's thread on a dead socket would hold a step for its
/// send timeout), the records the plugin could not deliver are counted, and the new agent
/// gets GPU-timed steps again.
#[test]
fn a_killed_agent_never_disturbs_the_job() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Setup { _dir, dir, ns, agent, profiler_sock, marker_sock } = setup();
    let b = (dir.as_path(), ns.name(), profiler_sock.as_path(), marker_sock.as_path());
    let steps = 600;
    let procs = spawn_job(b, true, steps, &["--compute-us", "1000", "--gpu-compute-ms", "10"]);
    std::thread::sleep(Duration::from_millis(1000));
    let mut agent = agent;
    let _ = agent.proc.child.kill();
    let _ = agent.proc.child.wait();
    let killed = Instant::now();
    std::thread::sleep(Duration::from_millis(1000));
    let cfg = dir.join("agent.toml");
    let again = Agent::start(&dir, &["--config", cfg.to_str().expect("utf8")]).expect("agent restarts on the same sockets");
    let restarted = killed.elapsed();
    let outs = wait_job(procs);
    for (r, text) in outs.iter().enumerate() {
        let lines = workloads::parse_steps(text);
        assert_eq!(lines.len(), steps, "rank {r} ran every step:\n{text}");
        let worst = lines.iter().map(|l| l.compute_us + l.allreduce_us).fold(0.0, f64::max);
        println!("killed agent: rank {r} longest step {:.1} ms (agent back after {:.2} s)", worst / 1e3, restarted.as_secs_f64());
        assert!(worst < 200_000.0, "rank {r}: a step took {:.1} ms while the agent was gone (steps take ~11 ms)", worst / 1e3);
    }
    let procs = wait_for(Duration::from_secs(10), "the restarted agent hears every plugin", || {
        let p = again.status().ok()?["collectives_detail"]["profiler"]["processes"].clone();
        (p.as_array()?.len() == 4).then_some(p)
    })
    .unwrap_or_else(|e| panic!("{e}: {}", again.status().map(|s| s["collectives_detail"]["profiler"].to_string()).unwrap_or_default()));
    let unsent: u64 = procs.as_array().expect("processes").iter().filter_map(|p| p["dropped_unsent"].as_u64()).sum();
    assert!(unsent > 0, "records produced while no agent listened are counted as unsent: {procs}");
    let gpu = wait_for(Duration::from_secs(30), "GPU-timed steps after the restart", || {
        let v: serde_json::Value = serde_json::from_str(&again.get("/api/v1/steps?limit=500").ok()?.body).ok()?;
        let n = v["steps"].as_array()?.iter().filter(|s| s["timing"] == "gpu").count();
        (n >= 10).then_some(n)
    })
    .expect("steps");
    println!("killed agent: {unsent} records counted unsent; {gpu} GPU-timed steps attributed by the restarted agent");
}

#[test]
fn an_agent_started_after_init_joins_the_ranks_by_the_communicator_hash() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let b = bare();
    // The job first: its communicator is created, and the plugin's first records find no
    // agent (dropped and counted). The uprobes never see ncclCommInitRank.
    let args = ["--compute-us", "1000", "--gpu-compute-ms", "10", "--gpu-delay-rank", "2", "--gpu-delay-ms", "30"];
    let procs = spawn_job((b.dir.as_path(), b.ns.name(), b.profiler_sock.as_path(), b.marker_sock.as_path()), true, 120, &args);
    std::thread::sleep(Duration::from_millis(1500));
    let s = with_agent(b);
    wait_job(procs);
    let all = wait_for(Duration::from_secs(30), "GPU-timed steps", || {
        let v: serde_json::Value = serde_json::from_str(&s.agent.get("/api/v1/steps?limit=200").ok()?.body).ok()?;
        let st: Vec<serde_json::Value> = v["steps"].as_array()?.iter().filter(|s| s["timing"] == "gpu").cloned().collect();
        (st.len() >= 20).then_some(st)
    })
    .expect("steps after the agent started");
    let text = summary(&all.iter().collect::<Vec<_>>());
    let skews: Vec<f64> = all.iter().map(|s| cause(s, "readiness_skew")["seconds"].as_f64().unwrap_or(0.0) * 1e3).collect();
    let m = median(skews);
    assert!((m - GPU_DELAY_MS).abs() <= 0.15 * GPU_DELAY_MS, "median readiness skew {m:.1} ms: {text}");
    let named = all.iter().filter(|s| cause(s, "readiness_skew")["rank"] == 2).count();
    assert!(named * 10 >= all.len() * 9, "rank 2 named in {named} of {} steps: {text}", all.len());
    let procs = s.agent.status().expect("status")["collectives_detail"]["profiler"]["processes"].clone();
    let procs = procs.as_array().expect("processes");
    assert_eq!(procs.len(), 4, "{procs:?}");
    assert!(procs.iter().any(|p| p["dropped_unsent"].as_u64().unwrap_or(0) > 0), "records sent before the agent were counted: {procs:?}");
}

/// The dgx8 fixture's GPUs in the driver's order (upper-case hex, as drivers write it) and,
/// per GPU, the netdev of the ConnectX port under the same PCI switch (the fixture's tree:
/// GPU at bus x2, HCA at bus x3).
const DGX8_GPUS: [(&str, &str); 8] = [
    ("0000:12:00.0", "enp19s0np0"),
    ("0000:32:00.0", "enp51s0np0"),
    ("0000:52:00.0", "enp83s0np0"),
    ("0000:72:00.0", "enp115s0np0"),
    ("0000:92:00.0", "enp147s0np0"),
    ("0000:B2:00.0", "enp179s0np0"),
    ("0000:D2:00.0", "enp211s0np0"),
    ("0000:F2:00.0", "enp243s0np0"),
];

/// Each rank's plugin reports the CUDA device its process drives (the CUDA driver stand-in:
/// the fixture's eight GPUs, rank r on GPU 7 − r); the agent, whose topology is the dgx8
/// fixture's PCI tree, links every rank that names no HCA to the one nearest its GPU — NCCL's
/// own default — says so in the link, and labels the rank's info series with the GPU.
#[test]
fn each_rank_is_linked_to_the_hca_nearest_the_gpu_its_plugin_reports() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/dgx8/sys");
    let s = with_agent_toml(bare(), &format!("sysfs_root = \"{}\"\n", fixture.display()), "");
    // The driver enumerates them in reverse PCI order (as CUDA_DEVICE_ORDER=FASTEST_FIRST
    // may), and rank r sets device r: rank r drives the fixture's GPU 7 − r.
    let list: Vec<&str> = DGX8_GPUS.iter().rev().map(|g| g.0).collect();
    let env = [format!("NCCL_ABI_GPU_PCI={}", list.join(",")), "NCCL_ABI_CUDA_DEVICE={rank}".to_string()];
    let env: Vec<&str> = env.iter().map(String::as_str).collect();
    let b = (s.dir.as_path(), s.ns.name(), s.profiler_sock.as_path(), s.marker_sock.as_path());
    let procs = spawn_job_env(b, true, 400, &["--compute-us", "5000"], &env);
    let want: Vec<(String, String)> = (0..4).map(|r| (DGX8_GPUS[7 - r].0.to_lowercase(), DGX8_GPUS[7 - r].1.to_string())).collect();
    let seen = wait_for(Duration::from_secs(30), "every rank linked by its GPU and labelled", || {
        let page: serde_json::Value = serde_json::from_str(&s.agent.get("/api/v1/collectives?limit=1").ok()?.body).ok()?;
        let links = page["links"].as_array()?.clone();
        let m = s.agent.metrics().ok()?;
        let info = stepwise_tests::harness::samples(&m, "stepwise_rank_info");
        let ok = want.iter().all(|(gpu, nic)| {
            let linked = links.iter().any(|l| l["complete"] == true && l["nics"].as_array().is_some_and(|n| n.iter().any(|x| x == nic.as_str())));
            let labelled = info.iter().any(|(l, v)| *v == 1.0 && l.contains(&format!("gpu=\"{gpu}\"")) && l.contains(&format!("nic=\"{nic}\"")));
            linked && labelled
        });
        ok.then_some((links, info))
    });
    let texts = wait_job(procs);
    let (links, info) = seen.unwrap_or_else(|e| panic!("{e}\nranks: {}", texts.join("\n")));
    // Each rank's link is its own GPU's HCA only, and says how it was found.
    let ours: Vec<&serde_json::Value> =
        links.iter().filter(|l| l["how"].as_object().is_some_and(|h| h.values().any(|v| v.as_str().is_some_and(|v| v.contains("GPU "))))).collect();
    assert_eq!(ours.len(), 4, "four ranks linked by their GPU: {links:?}");
    for l in &ours {
        let nics: Vec<&str> = l["nics"].as_array().expect("nics").iter().filter_map(|n| n.as_str()).collect();
        assert_eq!(nics.len(), 1, "one HCA per GPU on this tree: {l}");
        let (gpu, _) = want.iter().find(|(_, n)| n == nics[0]).unwrap_or_else(|| panic!("a NIC no rank's GPU is near: {l}"));
        let how = l["how"][nics[0]].as_str().expect("how");
        assert!(how.contains(&format!("GPU {gpu}")) && how.contains("nearest HCA"), "{how}");
    }
    let gpus: std::collections::BTreeSet<String> = info.iter().filter_map(|(l, _)| l.split("gpu=\"").nth(1)?.split('"').next().map(String::from)).collect();
    assert_eq!(gpus, want.iter().map(|(g, _)| g.clone()).collect(), "rank_info's GPUs: {info:?}");
    // The per-rank series carry each rank's GPU too (DCGM's pci_bus_id, no join needed).
    let gpu_of = |m: &str, r: usize| {
        stepwise_tests::harness::samples(m, "stepwise_rank_wait_seconds_total")
            .into_iter()
            .find(|(l, _)| l.starts_with(&format!("rank=\"{r}\",")))
            .and_then(|(l, _)| l.split("gpu=\"").nth(1)?.split('"').next().map(String::from))
    };
    let per_rank = wait_for(Duration::from_secs(30), "per-rank series labelled with their GPU", || {
        let m = s.agent.metrics().ok()?;
        let got: Vec<Option<String>> = (0..4).map(|r| gpu_of(&m, r)).collect();
        got.iter().all(|g| g.as_ref().is_some_and(|g| !g.is_empty())).then_some(got)
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}", stepwise_tests::harness::samples(&s.agent.metrics().unwrap_or_default(), "stepwise_rank_wait_seconds_total")));
    for (r, g) in per_rank.iter().enumerate() {
        assert_eq!(g.as_deref(), Some(want[r].0.as_str()), "rank {r} drives GPU {}", want[r].0);
    }
}
