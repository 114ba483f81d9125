//! TCP in flight and measured latency, end to end: two namespace "servers" joined by a
//! userspace delay line (`tests/tools/delayline.py`: 10 ms each way, 200 Mbit/s, two TUN
//! devices; this kernel has no netem), the NCCL-ABI workload's 2-rank all-reduce over real
//! TCP between them, one agent per server inside its namespace (its `tcp` source dumps that
//! namespace's connections with sock_diag every 10 ms).
//!
//! One job with default socket buffers, then one with `SO_SNDBUF` 16 KiB
//! (`NCCL_ABI_SNDBUF`), on the same line:
//! - healthy (default buffers): the per-round latency of ideal communication is the measured
//!   round trip (the connections' smallest RTT, ≈ 21 ms), so the long-RTT job is explained —
//!   ideal communication is the largest network cause, `unexplained` small, no in-flight cause;
//! - Little's law on real TCP: over the job, the exported ∫ in-flight bytes / smoothed RTT
//!   (`stepwise_tcp_in_flight_per_rtt_bytes_total`) agrees with the bytes the NIC counter saw (±20 %);
//! - clamped: `in_flight_limit` carries the excess the workload itself measured (its
//!   all-reduce clamped − unclamped, ±15 %) and names the send buffer as the binding limit;
//! - real PyTorch gloo over the same line: explained the same way, Little's law holding on its
//!   connections.

use std::{
    collections::BTreeMap,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;
use stepwise_tests::{
    harness::{sample, workspace_root, Proc},
    scenarios::{self, agent_config_10ms, cause, cause_seconds, median, start_job, summarize, within, JobOutput, RankSpec, Servers},
    torch, workloads,
};

const DELAY_MS: f64 = 10.0;
const RATE_BPS: f64 = 200e6;
const BYTES: u64 = 1 << 20;
const STEPS: u64 = 7;
const COMPUTE_US: u64 = 50_000;
const ADDR: [&str; 2] = ["198.18.100.1", "198.18.100.2"];
const DEV: [&str; 2] = ["dl0", "dl1"];
/// `SO_SNDBUF` of the clamped job (the kernel doubles it).
const SNDBUF: u32 = 16384;

/// The two tests share the machine's two cores: one delay line at a time, so neither's
/// timing carries the other's load.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// The delay line between the two servers, killed on drop (it removes its TUN devices).
fn delay_line(s: &Servers, dir: &Path) -> Proc {
    let tool = workspace_root().join("tests/tools/delayline.py");
    let mut c = Command::new("nice");
    c.args(["-n", scenarios::JOB_NICE, "python3"]).arg(tool).args([
        s.ns(0),
        s.ns(1),
        ADDR[0],
        ADDR[1],
        "--delay-ms",
        &DELAY_MS.to_string(),
        "--rate",
        &RATE_BPS.to_string(),
    ]);
    c.stdin(Stdio::null());
    let p = Proc::spawn("delayline", &mut c, dir.join("delayline.log")).expect("delay line starts");
    let end = Instant::now() + Duration::from_secs(20);
    while !(0..2).all(|k| s.servers[k].ip(&["-br", "addr", "show", "dev", DEV[k]]).is_ok_and(|o| o.contains(ADDR[k]) && !o.contains("DOWN"))) {
        assert!(Instant::now() < end, "delay line devices not up:\n{}", p.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
    p
}

fn job(s: &Servers, dir: &Path, name: &str, env: &[(&str, String)]) -> JobOutput {
    let ranks: Vec<RankSpec> = (0..2u32)
        .map(|r| {
            let mut e: Vec<(String, String)> = vec![("NCCL_ABI_IFACE_ADDR".into(), ADDR[r as usize].into())];
            e.extend(env.iter().map(|(k, v)| (k.to_string(), v.clone())));
            RankSpec { ns: s.ns(r as usize).to_string(), rank: r, env: e, args: Vec::new() }
        })
        .collect();
    let a: Vec<String> = [("--steps", STEPS.to_string()), ("--bytes", BYTES.to_string()), ("--compute-us", COMPUTE_US.to_string())]
        .iter()
        .flat_map(|(k, v)| [k.to_string(), v.clone()])
        .collect();
    start_job(name, dir, &ranks, &a).expect("job starts").wait(Duration::from_secs(120)).expect("job")
}

/// Steps of agent `k` that began in [t0, t1], polling until there are `n` (at most 30 s).
fn steps_between(s: &Servers, k: usize, t0: f64, t1: f64, n: usize) -> Vec<Value> {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let v: Vec<Value> = s.steps(k).expect("steps").into_iter().filter(|x| x["begin"].as_f64().is_some_and(|b| b >= t0 && b <= t1)).collect();
        if v.len() >= n || Instant::now() > end {
            return v;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn metrics(s: &Servers, k: usize) -> String {
    s.get(&s.agents[k].addr, "/metrics").expect("metrics").body
}

/// (Little's-law bytes, NIC counter tx bytes) of server `k`'s delay-line device.
fn little_and_tx(s: &Servers, k: usize) -> (f64, f64) {
    let m = metrics(s, k);
    let little = sample(&m, "stepwise_tcp_in_flight_per_rtt_bytes_total", &[("netdev", DEV[k])]).unwrap_or(0.0);
    (little, s.link_bytes(k, DEV[k]).expect("link bytes").0)
}

/// Median all-reduce seconds of the job (steps ≥ 1: step 0 also opens the connections).
fn allreduce(o: &JobOutput) -> f64 {
    median(o.lines.iter().filter(|l| l.step >= 1).map(|l| l.allreduce_us * 1e-6).collect())
}

/// A healthy job through the long-RTT line is explained: the per-round latency of ideal
/// communication is the measured round trip, no in-flight cause, every problem cause and
/// `unexplained` below ideal communication, `unexplained` at most 20 % of the step.
fn assert_explained(k: usize, what: &str, steps: &[Value]) {
    eprintln!("{what} server {k}:\n{}", summarize(steps));
    assert!(steps.len() >= STEPS as usize - 2, "{what} server {k}: steps\n{}", summarize(steps));
    scenarios::assert_parts_sum(steps);
    for st in steps {
        let ev = &cause(st, "ideal_comm")["evidence"];
        assert_eq!(ev["latency_measured"], Value::Bool(true), "{what} server {k}: the round latency is the measured one: {ev}");
        let lat = ev["round_latency_seconds"].as_f64().unwrap_or(0.0);
        assert!(
            (1.8 * DELAY_MS * 1e-3..=3.0 * DELAY_MS * 1e-3).contains(&lat),
            "{what} server {k}: round latency ≈ the {} ms round trip: {lat}",
            2.0 * DELAY_MS
        );
        assert_eq!(
            cause_seconds(st, "in_flight_limit"),
            0.0,
            "{what} server {k} step {}: no in-flight cause\n{}",
            st["step"],
            summarize(std::slice::from_ref(st))
        );
    }
    let med = |kind: &str| median(steps.iter().map(|st| cause_seconds(st, kind)).collect());
    let step = median(steps.iter().map(|st| st["seconds"].as_f64().unwrap_or(0.0)).collect());
    eprintln!(
        "{what} server {k}: median step {:.1} ms, ideal_comm {:.1} ms, unexplained {:.1} ms",
        step * 1e3,
        med("ideal_comm") * 1e3,
        med("unexplained") * 1e3
    );
    for kind in ["readiness_skew", "rail_imbalance", "in_flight_limit", "congestion", "unexplained"] {
        assert!(med(kind) < med("ideal_comm"), "{what} server {k}: {kind} {:.1} ms ≥ ideal_comm {:.1} ms", med(kind) * 1e3, med("ideal_comm") * 1e3);
    }
    let tcp = &cause(&steps[steps.len() / 2], "in_flight_limit")["evidence"];
    eprintln!("{what} server {k}: TCP in flight (not a cause): {tcp}");
    assert!(med("unexplained") <= 0.2 * step, "{what} server {k}: unexplained {:.1} ms of a {:.1} ms step", med("unexplained") * 1e3, step * 1e3);
}

/// Agents on both servers of the delay line; `extra_libs` are probed too.
fn start_agents(s: &mut Servers, dir: &Path, extra_libs: &[&Path]) {
    let rate = format!("{}Mbit/s", RATE_BPS / 1e6);
    let rates: BTreeMap<String, String> = DEV.iter().map(|d| (d.to_string(), rate.clone())).collect();
    for k in 0..2 {
        let mut cfg = agent_config_10ms(s.ns(k), dir, k, None, &rates, false);
        for lib in extra_libs {
            cfg = cfg.replacen("library_dirs = [", &format!("library_dirs = [\"{}\", ", lib.display()), 1);
        }
        s.start_agent(k, dir, &cfg).expect("agent");
    }
}

#[test]
fn long_rtt_job_is_explained_little_holds_and_a_clamped_send_buffer_is_the_in_flight_limit() {
    let _g = serial();
    scenarios::require_tools(&["ip", "nice", "env", "python3"]).expect("tools");
    workloads::build().expect("workloads build");
    let dir = tempfile::Builder::new().prefix("stepwise-e2e-tcp-").tempdir().expect("tmp");
    let mut s = Servers::new(0, 1500, None).expect("servers");
    let _line = delay_line(&s, dir.path());
    start_agents(&mut s, dir.path(), &[]);

    let before: Vec<(f64, f64)> = (0..2).map(|k| little_and_tx(&s, k)).collect();
    let t0 = now();
    let healthy = job(&s, dir.path(), "healthy", &[]);
    let t1 = now();
    let after: Vec<(f64, f64)> = (0..2).map(|k| little_and_tx(&s, k)).collect();
    let clamped = job(&s, dir.path(), "clamped", &[("NCCL_ABI_SNDBUF", SNDBUF.to_string())]);
    let t2 = now();
    let excess = allreduce(&clamped) - allreduce(&healthy);
    eprintln!(
        "all-reduce: default buffers {:.1} ms, SO_SNDBUF {SNDBUF} B {:.1} ms (excess {:.1} ms)",
        allreduce(&healthy) * 1e3,
        allreduce(&clamped) * 1e3,
        excess * 1e3
    );
    assert!(excess > 0.05, "the clamped send buffer should slow the all-reduce down: excess {:.1} ms", excess * 1e3);

    for k in 0..2 {
        // Little's law: ∫ in flight / RTT dt against the bytes the NIC sent.
        let (little, tx) = (after[k].0 - before[k].0, after[k].1 - before[k].1);
        eprintln!("server {k}: Little's-law bytes {little:.0} vs NIC tx bytes {tx:.0} ({:+.1} %)", (little / tx - 1.0) * 100.0);
        assert!(tx > STEPS as f64 * BYTES as f64, "server {k}: the NIC carried the job's bytes: {tx}");
        assert!(within(little, tx, 0.20), "server {k}: in-flight bytes / smoothed RTT integrated over the job = {little:.0} B vs the NIC counter's {tx:.0} B");

        // Healthy: measured latency explains the long round trip.
        let steps: Vec<Value> = steps_between(&s, k, t0, t1, STEPS as usize).into_iter().filter(|st| st["step"].as_u64() != Some(0)).collect();
        assert_explained(k, "healthy", &steps);

        // Clamped: the in-flight cause, the send buffer named.
        let steps: Vec<Value> = steps_between(&s, k, t1, t2, STEPS as usize).into_iter().filter(|st| st["step"].as_u64() != Some(0)).collect();
        eprintln!("clamped server {k}:\n{}", summarize(&steps));
        assert!(steps.len() >= STEPS as usize - 2, "clamped server {k}: steps\n{}", summarize(&steps));
        let got = median(steps.iter().map(|st| cause_seconds(st, "in_flight_limit")).collect());
        let ev = &cause(&steps[steps.len() / 2], "in_flight_limit")["evidence"];
        // The truth for these steps: this rank's own all-reduce in each of them, less its
        // healthy median (the steps' durations vary by ±20 ms around the job's median).
        let own = |o: &JobOutput, id: u64| o.rank(k as u32).iter().find(|l| l.step == id).map(|l| l.allreduce_us * 1e-6);
        let healthy_k = median(healthy.rank(k as u32).iter().filter(|l| l.step >= 1).map(|l| l.allreduce_us * 1e-6).collect());
        let truth = median(steps.iter().filter_map(|st| own(&clamped, st["step"].as_u64()?)).map(|a| a - healthy_k).collect());
        eprintln!(
            "clamped server {k}: in_flight_limit {:.1} ms vs this rank's excess in these steps {:.1} ms (job median excess {:.1} ms); evidence {ev}",
            got * 1e3,
            truth * 1e3,
            excess * 1e3
        );
        assert_eq!(ev["limit"], Value::String("sndbuf".into()), "clamped server {k}: the binding limit: {ev}");
        assert!(ev["in_flight_bytes"].as_f64().is_some_and(|b| b > 0.0 && b < 256.0 * 1024.0), "clamped server {k}: N·m is the clamped window: {ev}");
        assert!(
            within(got, truth, 0.15),
            "clamped server {k}: in_flight_limit {:.1} ms vs the rank's own excess {:.1} ms in those steps",
            got * 1e3,
            truth * 1e3
        );
    }
}

/// Real PyTorch gloo across the same line (2 ranks, one per server, `GLOO_SOCKET_IFNAME` the
/// line's device, 1 MiB all-reduce, 50 ms compute): explained as the NCCL-ABI job is — the
/// measured round trip in ideal communication, no in-flight cause, `unexplained` small — and
/// Little's law holds on gloo's own connections (±20 %).
#[test]
fn real_gloo_through_the_long_rtt_line_is_explained_and_little_holds() {
    // Installs PyTorch on first use, before the lock: the other test runs meanwhile.
    let lib = torch::lib_dir().expect("PyTorch (pip install torch into ~/.cache/stepwise/torch)");
    let _g = serial();
    scenarios::require_tools(&["ip", "nice", "env", "python3"]).expect("tools");
    let dir = tempfile::Builder::new().prefix("stepwise-e2e-tcp-gloo-").tempdir().expect("tmp");
    let mut s = Servers::new(0, 1500, None).expect("servers");
    let _line = delay_line(&s, dir.path());
    start_agents(&mut s, dir.path(), &[&lib]);
    let before: Vec<(f64, f64)> = (0..2).map(|k| little_and_tx(&s, k)).collect();
    let t0 = now();
    let ranks: Vec<(String, u32, Vec<String>)> =
        (0..2u32).map(|r| (s.ns(r as usize).to_string(), r, vec![format!("GLOO_SOCKET_IFNAME={}", DEV[r as usize])])).collect();
    let args = ["--steps", &STEPS.to_string(), "--bytes", &BYTES.to_string(), "--compute-ms", &(COMPUTE_US as f64 / 1e3).to_string()];
    let mut job = torch::GlooJob::start_across(dir.path(), "gloo", ADDR[0], &ranks, &args).expect("gloo job starts");
    let out = job.wait(Duration::from_secs(300)).expect("gloo job");
    let t1 = now();
    let lines = workloads::parse_steps(&out);
    let ar = median(lines.iter().filter(|l| l.step >= 1).map(|l| l.allreduce_us * 1e-6).collect());
    eprintln!("gloo all-reduce through the line: {:.1} ms (median, steps >= 1)", ar * 1e3);
    for (k, b) in before.iter().enumerate() {
        let after = little_and_tx(&s, k);
        let (little, tx) = (after.0 - b.0, after.1 - b.1);
        eprintln!("gloo server {k}: Little's-law bytes {little:.0} vs NIC tx bytes {tx:.0} ({:+.1} %)", (little / tx - 1.0) * 100.0);
        assert!(tx > STEPS as f64 * BYTES as f64 / 2.0, "server {k}: the NIC carried the job's bytes: {tx}");
        assert!(
            within(little, tx, 0.20),
            "gloo server {k}: in-flight bytes / smoothed RTT integrated over the job = {little:.0} B vs the NIC counter's {tx:.0} B"
        );
        let steps: Vec<Value> = steps_between(&s, k, t0, t1, STEPS as usize).into_iter().filter(|st| st["step"].as_u64() != Some(0)).collect();
        assert_explained(k, "gloo", &steps);
    }
}
