//! A loaded host: the agent gets 20 ms of CPU per second (a cgroup's CFS quota, every thread
//! of it), so its probe consumer drains the ring seconds late — later than the grace after
//! which steps used to be attributed (200 ms here, so that the starvation always exceeds it),
//! with their collectives still in the ring ("collectives: 0", 100 % compute, `incomplete:
//! false`). A step must now wait for the consumer's watermark (`max_wait` is raised to 90 s so
//! that the upper bound does not cut in while the agent is capped), and events of a rank the
//! starved agent could not inspect before it exited are counted as lost: every marked step of
//! the straggler job either holds its all-reduce, or is marked incomplete with the reason;
//! never silently empty.

mod support;

use std::{path::PathBuf, time::Duration};

use stepwise_tests::{
    harness::{self, wait_for, Agent},
    netns::Netns,
    workloads,
};
use support::straggler;

/// Caps a process's CPU with a cgroup-v1 `cpu` controller group (or a v2 group), moving it
/// back to the root group and removing the group when dropped.
struct CpuCap {
    dir: PathBuf,
    root: PathBuf,
    pid: u32,
}

impl CpuCap {
    fn new(pid: u32, quota_us: u64, period_us: u64) -> CpuCap {
        let v1 = PathBuf::from("/sys/fs/cgroup/cpu");
        let (root, v2) = if v1.join("cpu.cfs_quota_us").exists() { (v1, false) } else { (PathBuf::from("/sys/fs/cgroup"), true) };
        assert!(root.join("cgroup.procs").exists(), "no cgroup cpu controller at {} (the test needs root and cgroup v1 `cpu` or v2)", root.display());
        let dir = root.join(format!("stepwise-starved-{}", std::process::id()));
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        if v2 {
            std::fs::write(dir.join("cpu.max"), format!("{quota_us} {period_us}")).expect("cpu.max");
        } else {
            std::fs::write(dir.join("cpu.cfs_period_us"), period_us.to_string()).expect("cfs_period_us");
            std::fs::write(dir.join("cpu.cfs_quota_us"), quota_us.to_string()).expect("cfs_quota_us");
        }
        std::fs::write(dir.join("cgroup.procs"), pid.to_string()).expect("move the agent into the group");
        CpuCap { dir, root, pid }
    }

    /// CPU time the group's processes were refused (throttled), in seconds.
    fn throttled_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(self.dir.join("cpu.stat")).unwrap_or_default();
        stat.lines()
            .find_map(|l| match l.split_once(' ') {
                Some(("throttled_time", ns)) => ns.trim().parse::<f64>().ok().map(|n| n * 1e-9),
                Some(("throttled_usec", us)) => us.trim().parse::<f64>().ok().map(|u| u * 1e-6),
                _ => None,
            })
            .unwrap_or(0.0)
    }
}

impl Drop for CpuCap {
    fn drop(&mut self) {
        let _ = std::fs::write(self.root.join("cgroup.procs"), self.pid.to_string());
        let _ = std::fs::remove_dir(&self.dir);
    }
}

const STEPS: usize = 60;
const QLEN: &str = "/proc/sys/net/unix/max_dgram_qlen";

/// The straggler job (rank 2 30 ms late every 5th step) with 60 ms of compute per step: its
/// processes live for seconds, as training ranks do, so the starved agent still reads their
/// `/proc` entries while they run. Returns the job's own skew per step.
fn run_job(ns: &str, sock: &std::path::Path) -> std::collections::BTreeMap<u64, (f64, u32)> {
    workloads::build().expect("workloads build");
    let args = ["--steps", &STEPS.to_string(), "--bytes", "1048576", "--compute-us", "60000", "--delay-rank", "2", "--delay-us", "30000", "--delay-every", "5"];
    let mut cmd = workloads::mpi_steps(ns, 4, &args);
    cmd.args(["--marker-socket", sock.to_str().expect("utf8")]);
    let out = workloads::run_ok(&mut cmd).expect("mpi job");
    let truth = workloads::true_skew_seconds(&workloads::parse_steps(&String::from_utf8_lossy(&out.stdout)));
    assert_eq!(truth.len(), STEPS, "{}", String::from_utf8_lossy(&out.stdout));
    truth
}

#[test]
fn a_starved_agent_never_attributes_a_step_without_its_collectives() {
    // A Unix datagram socket queues at most `net.unix.max_dgram_qlen` datagrams, read when its
    // socket is created: the kernel's default of 10 (systemd hosts set 512) drops most markers
    // of a starved agent in the sender. This test is about the probe events, so the marker
    // socket gets the systemd value.
    let qlen = std::fs::read_to_string(QLEN).expect("max_dgram_qlen").trim().parse::<u32>().unwrap_or(0);
    if qlen < 512 {
        std::fs::write(QLEN, "512").expect("raise net.unix.max_dgram_qlen to 512 (root)");
    }
    let dir = tempfile::Builder::new().prefix("stepwise-starved-").tempdir().expect("tmp");
    let ns = Netns::new().expect("netns (needs root and iproute2)");
    let sock = dir.path().join("markers.sock");
    let cfg = dir.path().join("agent.toml");
    std::fs::write(&cfg, straggler::config(&ns, &sock, "").replace("[steps]\n", "[steps]\ngrace = \"200ms\"\nmax_wait = \"90s\"\n")).expect("config");
    let agent = Agent::start(dir.path(), &["--config", cfg.to_str().expect("utf8")]).expect("agent starts");

    // The host becomes loaded mid-job, once the agent has found the job's ranks (training
    // ranks live for hours; a rank the starved agent cannot inspect before it exits is the
    // other, counted loss, tested in the engine's unit tests).
    let job = {
        let (ns, sock) = (ns.name().to_string(), sock.clone());
        std::thread::spawn(move || run_job(&ns, &sock))
    };
    wait_for(Duration::from_secs(30), "the agent to trace the job's 4 ranks", || {
        agent.metrics().ok().and_then(|m| harness::sample(&m, "stepwise_probe_processes", &[])).filter(|n| *n >= 4.0)
    })
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.proc.log_text()));
    let cap = CpuCap::new(agent.proc.pid(), 20_000, 1_000_000);
    let truth = job.join().expect("job thread");
    // Starved for a few seconds after the job too: the grace of its last steps passes while
    // the agent is still capped.
    std::thread::sleep(Duration::from_secs(4));
    let throttled = cap.throttled_seconds();
    drop(cap);
    assert!(throttled > 0.5, "the cap did not starve the agent (throttled {throttled:.2} s)");

    let calls: serde_json::Value = serde_json::from_str(&agent.get("/api/v1/collectives?limit=10000").expect("collectives").body).expect("json");
    let n_calls = calls["calls"].as_array().map_or(0, |c| c.iter().filter(|c| c["op"] == "all_reduce").count());
    eprintln!("starved agent: {n_calls} all-reduce calls recorded of {}", 4 * STEPS);
    let steps = wait_for(Duration::from_secs(120), "every marked step attributed", || {
        let body: serde_json::Value = serde_json::from_str(&agent.get("/api/v1/steps?limit=100").ok()?.body).ok()?;
        let steps = body["steps"].as_array()?.clone();
        (steps.len() >= STEPS).then_some(steps)
    })
    .unwrap_or_else(|e| panic!("{e}: {}\nagent log:\n{}", agent.get("/api/v1/steps?limit=100").map(|r| r.body).unwrap_or_default(), agent.proc.log_text()));
    let (mut with_calls, mut gone, mut late) = (0, 0, 0);
    for s in &steps {
        let id = s["step"].as_u64().expect("step id");
        let n = s["collectives"].as_u64().expect("collectives");
        let incomplete = s["incomplete"].as_bool().expect("incomplete");
        assert!(n >= 1 || incomplete, "step {id} came back with no collective and looks complete: {s}");
        if n == 0 {
            let notes = s["notes"].as_array().map(|n| n.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join("; ")).unwrap_or_default();
            assert!(notes.contains("max_wait") || notes.contains("exited before"), "step {id}: incomplete without saying why: {notes}");
            gone += usize::from(notes.contains("exited before"));
            late += usize::from(notes.contains("max_wait"));
        } else {
            with_calls += 1;
            // A step that holds its collective is attributed as well as on an idle host.
            let truth = truth[&id].0;
            let skew =
                s["causes"].as_array().expect("causes").iter().find(|c| c["kind"] == "readiness_skew").and_then(|c| c["seconds"].as_f64()).unwrap_or(0.0);
            if (id + 1) % 5 == 0 {
                assert!((skew - truth).abs() <= 0.15 * truth, "step {id}: readiness skew {:.1} ms vs the workload's {:.1} ms", skew * 1e3, truth * 1e3);
            }
        }
    }
    eprintln!(
        "starved agent: {with_calls} of {} steps with their collective ({gone} incomplete: events of exited ranks lost, {late} closed at max_wait), throttled {throttled:.1} s",
        steps.len()
    );
    assert!(
        with_calls == steps.len() && gone == 0 && late == 0,
        "only {with_calls} of {} steps kept their collective ({gone} lost events of exited ranks, {late} closed at max_wait): the watermark did not hold them back",
        steps.len()
    );
}
