//! Live hang detection against real jobs (issue 15): the agent's `[hang]` rule over its open
//! calls, `/api/v1/open`, the metrics and `agent diagnose --hang`.
//!
//! - a 4-rank OpenMPI job whose rank 2 stops itself (SIGSTOP) just before a collective:
//!   suspected within 2 × the threshold, rank 2 named with state `T (stopped)` and its last
//!   completed sequence number; after SIGCONT the suspicion clears and the step is readiness
//!   skew on rank 2;
//! - a rank SIGSTOPped *inside* a collective (all ranks are inside; one cannot progress):
//!   named `not_progressing`, state `T (stopped)`; cleared after SIGCONT;
//! - a rank SIGKILLed inside a collective (mpirun `--enable-recovery` keeps the others
//!   waiting): reported exited by signal 9, inside that call;
//! - two network-namespace hosts with one agent each (the NCCL-ABI library): `diagnose
//!   --peers A,B --hang` names the stopped rank on the right host;
//! - a job whose step time varies 3× (ranks up to 1 s apart) is never suspected.
//!
//! Each test has its own namespaces, agent and ports (parallel-safe); every wait polls with
//! a deadline. Detection latencies are printed (`--nocapture` shows them).

mod support;

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use serde_json::Value;
use stepwise_tests::{
    harness::{sample, wait_for, Agent, Proc},
    netns::Netns,
    scenarios::{self, rail_addr, RankSpec, Servers},
    workloads,
};
use support::hang::{inside_ranks, latency, line_fields, missing, now, open_of, pid_of, rank_of, signal, suspected_with, wait_line, HANG};

struct Setup {
    dir: tempfile::TempDir,
    ns: Netns,
    agent: Agent,
}

fn setup(name: &str) -> Setup {
    let dir = tempfile::Builder::new().prefix(&format!("stepwise-hang-{name}-")).tempdir().expect("tmp");
    let ns = Netns::new().expect("netns (needs root and iproute2)");
    let sock = dir.path().join("markers.sock");
    let cfg = dir.path().join("agent.toml");
    let mut text = support::straggler::config(&ns, &sock, "");
    text.push_str(HANG);
    std::fs::write(&cfg, text).expect("config");
    let agent = Agent::start(dir.path(), &["--config", cfg.to_str().expect("utf8")]).expect("agent starts");
    workloads::build().expect("workloads build");
    Setup { dir, ns, agent }
}

fn spawn_mpi(s: &Setup, name: &str, mpirun: &[&str], args: &[&str]) -> Proc {
    let mut cmd = workloads::mpi_steps_with(s.ns.name(), 4, mpirun, args);
    Proc::spawn(name, &mut cmd, s.dir.path().join(format!("{name}.log"))).expect("mpirun starts")
}

#[test]
fn sigstopped_rank_is_named_stopped_then_its_step_is_readiness_skew() {
    let s = setup("stop");
    let sock = s.dir.path().join("markers.sock");
    let args = ["--steps", "12", "--compute-us", "20000", "--stop-rank", "2", "--stop-step", "5", "--marker-socket", sock.to_str().expect("utf8")];
    let mut job = spawn_mpi(&s, "stop", &[], &args);
    let pid = pid_of(&wait_line(&mut job, "stopping rank=2 step=5", Duration::from_secs(120)));
    let t_stop = now();
    let (h, seen) = wait_for(Duration::from_secs(60), "hang suspected with rank 2 missing", || suspected_with(&open_of(&s.agent), 2).map(|h| (h, now())))
        .unwrap_or_else(|e| panic!("{e}: {}", open_of(&s.agent)));
    let threshold = h["threshold_seconds"].as_f64().expect("threshold");
    let lat = latency(&h, seen);
    println!("stop: suspected {lat:.2} s after the others entered all_reduce #5 ({:.2} s after the stop), threshold {threshold:.2} s", seen - t_stop);
    assert!(lat <= 2.0 * threshold, "suspected after {lat:.2} s, more than 2 × the {threshold:.2} s threshold");
    assert_eq!((h["seq"].as_u64(), h["op"].as_str()), (Some(5), Some("all_reduce")), "{h}");
    assert_eq!(inside_ranks(&h), vec![0, 1, 3], "{h}");
    let m = missing(&h, 2);
    assert_eq!(m["why"], "not_arrived", "{m}");
    assert_eq!(m["pid"].as_u64(), Some(pid as u64));
    assert_eq!(m["state"]["state"], "T (stopped)", "{m}");
    // Steps 0..4 completed: its last collective is #4 (the job's only collective per step).
    let done = job.log_text().lines().filter(|l| l.starts_with("step rank=2 ")).count() as u64;
    assert_eq!(m["last_done_seq"].as_u64(), Some(done - 1), "{m}");
    let comm = h["comm"].as_str().expect("comm").to_string();
    let metrics = s.agent.metrics().expect("metrics");
    let labels = [("comm", comm.as_str()), ("library", "mpi")];
    assert_eq!(sample(&metrics, "stepwise_hang_suspected", &labels), Some(1.0));
    assert_eq!(sample(&metrics, "stepwise_hang_missing_ranks", &labels), Some(1.0));
    assert!(sample(&metrics, "stepwise_collective_open_seconds", &labels).unwrap_or(0.0) > threshold);
    let out =
        std::process::Command::new(stepwise_tests::harness::agent_bin()).args(["diagnose", "--hang", "--agent", &s.agent.addr]).output().expect("diagnose");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(4), "diagnose --hang exits 4 on a suspected hang: {text}");
    let row = text.lines().find(|l| l.contains(&pid.to_string())).unwrap_or_else(|| panic!("rank 2's row: {text}"));
    assert!(row.contains("T (stopped)") && row.contains("#4") && row.trim_start().starts_with('2'), "{text}");

    signal(pid, "CONT");
    let t_cont = now();
    wait_for(Duration::from_secs(30), "suspicion cleared", || {
        let v = open_of(&s.agent);
        (!v["hangs"].as_array().is_some_and(|a| a.iter().any(|x| x["comm"] == comm.as_str() && x["suspected"] == true))).then_some(())
    })
    .expect("cleared");
    let cleared = now() - t_cont;
    println!("stop: cleared {cleared:.2} s after SIGCONT (clear_after 2 s)");
    assert!(cleared >= 1.5, "the suspicion is held for clear_after (2 s) after the call returned, cleared after {cleared:.2} s");
    let st = wait_for(Duration::from_secs(120), "job exit", || job.child.try_wait().ok().flatten()).expect("job ends");
    assert!(st.success(), "{}", job.log_text());
    let step5 = wait_for(Duration::from_secs(60), "step 5 attributed", || {
        let v: Value = serde_json::from_str(&s.agent.get("/api/v1/steps?step=5").ok()?.body).ok()?;
        v["steps"].as_array()?.first().cloned()
    })
    .expect("step 5");
    let skew = scenarios::cause(&step5, "readiness_skew");
    let stopped = t_cont - (seen - lat);
    assert_eq!(scenarios::top_problem(&step5).0, "readiness_skew", "{step5}");
    assert_eq!(skew["rank"], 2, "{skew}");
    assert!(skew["seconds"].as_f64().unwrap_or(0.0) >= 0.8 * stopped, "readiness skew {} s for a {stopped:.1} s stop", skew["seconds"]);
    // nccl-tests' bandwidths (docs/models.md §7): a 4-rank all_reduce's bus factor is 2·3/4.
    let ev = &scenarios::cause(&step5, "ideal_comm")["evidence"];
    let (alg, bus) = (ev["algbw_bytes_per_second"].as_f64().expect("algbw"), ev["busbw_bytes_per_second"].as_f64().expect("busbw"));
    println!("step 5: algbw {:.1} MB/s, busbw {:.1} MB/s", alg / 1e6, bus / 1e6);
    assert!(alg > 0.0 && (bus - 1.5 * alg).abs() < 1e-6 * bus, "{ev}");
    let m = s.agent.metrics().expect("metrics");
    let (last, last_alg) =
        (sample(&m, "stepwise_step_bus_bandwidth_bytes_per_second", &[]), sample(&m, "stepwise_step_algorithm_bandwidth_bytes_per_second", &[]));
    assert!(last.zip(last_alg).is_some_and(|(b, a)| a > 0.0 && (b - 1.5 * a).abs() < 1e-6 * b), "{last:?} vs {last_alg:?}");
}

#[test]
fn sigkilled_rank_inside_a_collective_is_reported_exited_while_the_others_wait() {
    let s = setup("kill");
    let args = ["--steps", "12", "--compute-us", "20000", "--stop-rank", "3", "--stop-step", "5"];
    let mut job = spawn_mpi(&s, "kill", &["--enable-recovery"], &args);
    let stopped = pid_of(&wait_line(&mut job, "stopping rank=3 step=5", Duration::from_secs(120)));
    let text = job.log_text();
    let pids: Vec<u32> = (0..4).map(|r| pid_of(&line_fields(&text, &format!("init rank={r} ")).expect("init line"))).collect();
    // Rank 1 inside all_reduce #5 before it is killed.
    wait_for(Duration::from_secs(30), "rank 1 inside #5", || {
        let v = open_of(&s.agent);
        v["comms"]
            .as_array()?
            .iter()
            .flat_map(|c| c["ranks"].as_array().cloned().unwrap_or_default())
            .find(|r| rank_of(r) == Some(1) && r["open"]["seq"] == 5)
            .map(|_| ())
    })
    .expect("rank 1 inside");
    signal(pids[1], "KILL");
    let t_kill = now();
    let found = wait_for(Duration::from_secs(60), "rank 1 reported exited", || {
        let h = suspected_with(&open_of(&s.agent), 1)?;
        (missing(&h, 1)["why"] == "exited").then(|| (h, now()))
    });
    let (h, seen) = found.unwrap_or_else(|e| panic!("{e}: {}", open_of(&s.agent)));
    println!("kill: rank 1 reported exited {:.2} s after SIGKILL; suspected {:.2} s after the first entry", seen - t_kill, latency(&h, seen));
    let m = missing(&h, 1);
    assert_eq!(m["exited"]["signal"].as_i64(), Some(9), "{m}");
    assert_eq!(m["aborted"]["seq"].as_u64(), Some(5), "killed inside all_reduce #5: {m}");
    assert_eq!(inside_ranks(&h), vec![0, 2], "the others wait: {h}");
    assert_eq!(missing(&h, 3)["state"]["state"], "T (stopped)");
    for r in [0, 2] {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", pids[r])).unwrap_or_default();
        assert!(!stat.is_empty() && !stat.contains(") Z "), "rank {r} still alive and waiting");
    }
    let out = std::process::Command::new(stepwise_tests::harness::agent_bin())
        .args(["diagnose", "--hang", "--json", "--agent", &s.agent.addr])
        .output()
        .expect("diagnose");
    let rep: Value = serde_json::from_slice(&out.stdout).expect("diagnose --json");
    assert_eq!(rep["suspected"], 1, "{rep}");
    // The ranks outlive mpirun with --enable-recovery: each is ended by its pid.
    for p in [pids[0], pids[2], stopped] {
        signal(p, "KILL");
    }
}

#[test]
fn a_rank_stopped_inside_a_collective_is_named_not_progressing() {
    let s = setup("inside");
    // Rank 1 arrives 1.5 s late at step 5 (under the 2 s floor): rank 2 waits inside
    // all_reduce #5 long enough to be stopped there, and then every rank is inside.
    let args = ["--steps", "10", "--compute-us", "20000", "--delay-rank", "1", "--delay-us", "1500000", "--delay-every", "6"];
    let mut job = spawn_mpi(&s, "inside", &[], &args);
    let text = wait_line(&mut job, "init rank=3 ", Duration::from_secs(120));
    drop(text);
    let pid2 = pid_of(&line_fields(&job.log_text(), "init rank=2 ").expect("init line"));
    let inside5 = |v: &Value, rank: u64| {
        v["comms"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["ranks"].as_array().cloned().unwrap_or_default())
            .any(|r| rank_of(&r) == Some(rank) && r["open"]["seq"] == 5)
    };
    wait_for(Duration::from_secs(60), "rank 2 inside #5 before rank 1", || {
        let v = open_of(&s.agent);
        (inside5(&v, 2) && !inside5(&v, 1)).then_some(())
    })
    .expect("rank 2 inside");
    signal(pid2, "STOP");
    let t_stop = now();
    let found = wait_for(Duration::from_secs(60), "rank 2 suspected, not progressing", || {
        let h = suspected_with(&open_of(&s.agent), 2)?;
        (missing(&h, 2)["why"] == "not_progressing" && h["missing"].as_array().map(Vec::len) == Some(1)).then(|| (h, now()))
    });
    let (h, seen) = found.unwrap_or_else(|e| panic!("{e}: {}", open_of(&s.agent)));
    let threshold = h["threshold_seconds"].as_f64().expect("threshold");
    let lat = latency(&h, seen);
    println!("inside: suspected {lat:.2} s after the first entry into all_reduce #5 ({:.2} s after the stop), threshold {threshold:.2} s: {h}", seen - t_stop);
    assert!(lat <= 2.0 * threshold, "suspected after {lat:.2} s, more than 2 × the {threshold:.2} s threshold");
    assert_eq!((h["seq"].as_u64(), h["op"].as_str()), (Some(5), Some("all_reduce")), "{h}");
    let m = missing(&h, 2);
    assert_eq!((m["pid"].as_u64(), m["state"]["state"].as_str()), (Some(pid2 as u64), Some("T (stopped)")), "{m}");
    assert_eq!(m["last_done_seq"].as_u64(), Some(4), "{m}");
    assert!(!inside_ranks(&h).contains(&2), "a stopped rank is not counted as inside: {h}");
    signal(pid2, "CONT");
    let st = wait_for(Duration::from_secs(120), "job exit", || job.child.try_wait().ok().flatten()).expect("job ends");
    assert!(st.success(), "{}", job.log_text());
    wait_for(Duration::from_secs(30), "suspicion cleared", || {
        let v = open_of(&s.agent);
        (!v["hangs"].as_array().is_some_and(|a| a.iter().any(|x| x["suspected"] == true))).then_some(())
    })
    .expect("cleared");
}

#[test]
fn two_hosts_diagnose_names_the_stopped_rank_on_its_host() {
    workloads::build().expect("workloads build");
    let dir = tempfile::Builder::new().prefix("stepwise-hang-2h-").tempdir().expect("tmp");
    let mut s = Servers::new(1, 1500, None).expect("two servers (needs root)");
    let mut peers = Vec::new();
    for k in 0..2 {
        let mut cfg = scenarios::agent_config(s.ns(k), dir.path(), k, None, &BTreeMap::new(), false);
        cfg.push_str(HANG);
        let i = s.start_agent(k, dir.path(), &cfg).expect("agent");
        peers.push(s.agents[i].addr.clone());
    }
    let ranks: Vec<RankSpec> = (0..4u32)
        .map(|r| {
            let server = (r / 2) as usize;
            let env = vec![("NCCL_ABI_IFACE_ADDR".to_string(), rail_addr(server, 0).to_string())];
            RankSpec { ns: s.ns(server).to_string(), rank: r, env, args: Vec::new() }
        })
        .collect();
    let args: Vec<String> =
        ["--steps", "12", "--bytes", "65536", "--compute-us", "20000", "--stop-rank", "2", "--stop-step", "5"].iter().map(|a| a.to_string()).collect();
    let mut job = scenarios::start_job("hang2h", dir.path(), &ranks, &args).expect("job");
    let pid = pid_of(&wait_line(&mut job.ranks[2].1, "stopping rank=2 step=5", Duration::from_secs(120)));
    let list = peers.join(",");
    let (rep, seen) = wait_for(Duration::from_secs(60), "diagnose --peers --hang suspects", || {
        let (code, out, _) = scenarios::diagnose(&s, &["--peers", &list, "--hang", "--json"]).ok()?;
        (code == 4).then(|| (serde_json::from_str::<Value>(&out).expect("json"), now()))
    })
    .expect("suspected across hosts");
    let h = &rep["hangs"][0];
    println!("two hosts: diagnose --peers suspected {:.2} s after the first entry, threshold {:.2} s", latency(h, seen), h["threshold_seconds"]);
    assert_eq!(rep["hosts"].as_array().map(Vec::len), Some(2), "{rep}");
    assert_eq!(inside_ranks(h), vec![0, 1, 3], "{h}");
    let m = missing(h, 2);
    assert_eq!((m["host"].as_str(), m["why"].as_str()), (Some("server1"), Some("not_arrived")), "{m}");
    assert_eq!(m["last_done_seq"].as_u64(), Some(4), "{m}");
    assert_eq!(m["state"]["state"], "T (stopped)", "{m}");
    // Alone, server 0's agent sees ranks 2 and 3 nowhere: listed, not counted.
    let (code, out, _) = scenarios::diagnose(&s, &["--agent", &peers[0], "--hang", "--json"]).expect("diagnose");
    let alone: Value = serde_json::from_str(&out).expect("json");
    assert!(alone["hangs"][0]["missing"].as_array().is_some_and(|m| m.iter().all(|x| x["why"] == "not_seen")), "{alone}");
    assert_eq!((code, &alone["hangs"][0]["suspected"]), (0, &Value::Bool(false)), "{alone}");
    signal(pid, "CONT");
    job.wait(Duration::from_secs(120)).expect("job completes after SIGCONT");
}

/// Polls the agent's hang metrics until `job` exits: (max open seconds, ever suspected).
fn watch_until_exit(a: &Agent, job: &mut Proc, t: Duration) -> (f64, bool) {
    let end = Instant::now() + t;
    let (mut max_open, mut ever) = (0.0f64, false);
    while job.alive() {
        assert!(Instant::now() < end, "job still running after {t:?}:\n{}", job.log_text());
        let m = a.metrics().expect("metrics");
        for (labels, v) in stepwise_tests::harness::samples(&m, "stepwise_collective_open_seconds") {
            if labels.contains("mpi") {
                max_open = max_open.max(v);
            }
        }
        ever |= stepwise_tests::harness::samples(&m, "stepwise_hang_suspected").iter().any(|(_, v)| *v > 0.0);
        ever |= sample(&m, "stepwise_hang_suspicions_total", &[]).unwrap_or(0.0) > 0.0;
        std::thread::sleep(Duration::from_millis(200));
    }
    (max_open, ever)
}

/// The short version of the soak's false-positive run (`cargo xtask soak`).
#[test]
fn slow_but_progressing_job_is_never_suspected() {
    let s = setup("fp");
    // 0.5 s compute, one rank per step up to 1 s more: steps vary 3×, the others wait up to
    // 1 s inside each all-reduce.
    let mut job = spawn_mpi(&s, "fp", &[], &["--steps", "30", "--compute-us", "500000", "--vary-us", "1000000", "--bytes", "65536"]);
    let (max_open, ever) = watch_until_exit(&s.agent, &mut job, Duration::from_secs(300));
    let text = job.log_text();
    let steps = workloads::parse_steps(&text);
    let per_step = |k: u64| steps.iter().filter(|l| l.step == k).map(|l| l.compute_us + l.allreduce_us).fold(0.0, f64::max);
    let times: Vec<f64> = (0..30).map(per_step).collect();
    let (lo, hi) = times.iter().fold((f64::INFINITY, 0.0f64), |(a, b), t| (a.min(*t), b.max(*t)));
    println!("false-positive run: 30 steps of {:.2}..{:.2} s ({:.1}×), longest open call {max_open:.2} s, suspected: {ever}", lo * 1e-6, hi * 1e-6, hi / lo);
    assert!(hi / lo >= 2.0, "the job's steps vary: {lo}..{hi} µs");
    assert!(max_open > 0.3, "the detector saw calls open for a while: {max_open} s");
    assert!(!ever, "a slow but progressing job was suspected hung (longest open {max_open:.2} s)");
    let open = open_of(&s.agent);
    assert_eq!(open["desyncs"], serde_json::json!([]), "no rank disagrees in a healthy job: {open}");
}
