//! RDMA counters cannot exist on this machine, so the scenario writer plays them: a fixture
//! host with 8 ConnectX-7 ports (mlx5 sysfs layout) carries background RoCE traffic, and for
//! a stretch of the run port mlx5_3 is paused 90 % of the time (port_xmit_wait climbs, CNPs
//! and ECN marks appear) — while a real 4-rank OpenMPI job runs its steps under the agent.
//! The job's ranks all run on this host: OpenMPI moves their bytes through shared memory,
//! never over those NICs. So however busy and stalled the NICs are, the truthful answer is no
//! network cause at all — the storm is somebody else's. (This test used to expect
//! congestion equal to 0.9 × the shared-memory transfer time: the injection, read back.)

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use stepwise::timeline::join::CallView;
use stepwise_tests::{
    harness::Agent,
    netns::Netns,
    scenario::{Scenario, WAIT_TICKS_PER_SECOND},
    workloads,
};

const PAUSED: f64 = 0.9;

#[derive(Clone, Copy)]
struct Seen {
    visible_from: f64,
    until: f64,
    max_lag: f64,
}

fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs_f64()
}

#[test]
fn a_single_host_job_gets_no_network_cause_from_busy_stalled_nics_it_never_uses() {
    workloads::build().expect("workloads");
    let dir = tempfile::Builder::new().prefix("stepwise-rdma-").tempdir_in(stepwise_tests::scenario::memory_dir()).expect("tmp");
    let sys = dir.path().join("sys");
    let mut sc = Scenario::new(&sys).host_dgx(8);
    sc.write().expect("write fixture");
    let ns = Netns::new().expect("netns");
    let cfg = dir.path().join("agent.toml");
    std::fs::write(
        &cfg,
        format!(
            "interval = \"20ms\"\n[sources]\nethtool = false\nnetdev = false\nqdisc = false\ntcp = false\n[collectives.select]\nnetns = \"/run/netns/{}\"\n",
            ns.name()
        ),
    )
    .expect("config");
    let sock = dir.path().join("m.sock");
    let agent = Agent::start(
        dir.path(),
        &["--config", cfg.to_str().expect("utf8"), "--sysfs-root", sys.to_str().expect("utf8"), "--marker-socket", sock.to_str().expect("utf8")],
    )
    .expect("agent");

    // The writer: 5 % line-rate background traffic on every port; during the storm, mlx5_3
    // is paused 90 % of the time and the fabric marks ECN.
    let storm = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    // What the writer made visible: (time the first storm tick was on disk, end of the last
    // storm tick's simulated time, largest write latency in seconds).
    let seen: Arc<Mutex<Seen>> = Arc::new(Mutex::new(Seen { visible_from: f64::INFINITY, until: 0.0, max_lag: 0.0 }));
    let writer = {
        let (storm, stop, seen) = (storm.clone(), stop.clone(), seen.clone());
        std::thread::spawn(move || {
            // The writer plays the NIC hardware, whose counters move with no delay: it runs
            // ahead of the job and the agent for the CPU (nice -10; best effort) so a
            // 2-core machine under load does not turn into counters arriving late.
            // SAFETY: setpriority on this thread's own id changes nothing else.
            unsafe {
                let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
                libc::setpriority(libc::PRIO_PROCESS, tid, -10);
            }
            // Simulated time follows the wall clock: each step covers the real time since the
            // last one, however long writing the tree took.
            let mut last = std::time::Instant::now();
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(5));
                let dt = last.elapsed();
                last = std::time::Instant::now();
                let tick_end = now();
                let on = storm.load(Ordering::Relaxed);
                sc.step(dt, |n| {
                    let r = n.line_rate();
                    n.tx_rate(0.05 * r).rx_rate(0.05 * r);
                    if on && n.index == 3 {
                        let ticks = (PAUSED * WAIT_TICKS_PER_SECOND * n.dt().as_secs_f64()) as u64;
                        n.pfc_pause(ticks).ecn(200).cnp_handled(180);
                    }
                })
                .expect("scenario step");
                let written = now();
                let mut g = seen.lock().expect("lock");
                g.max_lag = g.max_lag.max(written - tick_end);
                if on {
                    g.visible_from = g.visible_from.min(written);
                    g.until = tick_end;
                }
            }
        })
    };
    let storm_thread = {
        let storm = storm.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(1000));
            storm.store(true, Ordering::Relaxed);
            // Long enough that a few steps fall entirely inside even when a loaded machine
            // stretches them.
            std::thread::sleep(Duration::from_millis(3000));
            storm.store(false, Ordering::Relaxed);
        })
    };
    // The job confines its RDMA traffic to mlx5_0 the way UCX users do: the agent links its
    // ranks to that port's NIC (and, a single-host job, still charges it nothing).
    let mut job =
        workloads::mpi_steps(ns.name(), 4, &["--steps", "36", "--bytes", "67108864", "--compute-us", "40000", "--marker-socket", sock.to_str().expect("utf8")]);
    job.env("UCX_NET_DEVICES", "mlx5_0:1");
    let out = workloads::run_ok(&mut job).expect("mpi job");
    assert!(String::from_utf8_lossy(&out.stdout).contains("summary"));
    storm_thread.join().expect("storm");
    std::thread::sleep(Duration::from_millis(2500));
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("writer");
    // The storm as the agent could see it: from its first tick on disk to the end of the
    // simulated time of its last tick.
    let Seen { visible_from: b0, until: b1, max_lag } = *seen.lock().expect("lock");

    let calls: serde_json::Value = serde_json::from_str(&agent.get("/api/v1/collectives?limit=100000").expect("collectives").body).expect("json");
    let views: Vec<CallView> = serde_json::from_value(calls["calls"].clone()).expect("views");
    let ranks: std::collections::BTreeSet<u64> = views.iter().filter(|c| c.op == "all_reduce").map(|c| c.pid as u64).collect();
    let links = calls["links"].as_array().cloned().unwrap_or_default();
    let port0 = sc_nic_name(&sys, 0);
    for pid in &ranks {
        let l = links.iter().find(|l| l["pid"] == *pid).unwrap_or_else(|| panic!("rank pid {pid} not linked: {links:?}"));
        assert_eq!(l["complete"], true, "UCX_NET_DEVICES names the RDMA ports it may use: {l}");
        assert_eq!(l["nics"], serde_json::json!([port0]), "only mlx5_0's NIC: {l}");
        let how = l["how"][port0.as_str()].as_str().unwrap_or("");
        assert!(how.contains("UCX_NET_DEVICES=mlx5_0:1"), "{l}");
    }
    assert_eq!(ranks.len(), 4, "{ranks:?}");
    let joined = stepwise::timeline::join_calls(views.iter().filter(|c| c.op == "all_reduce"));
    let body: serde_json::Value = serde_json::from_str(&agent.get("/api/v1/steps?limit=1000").expect("steps").body).expect("json");
    let steps = body["steps"].as_array().expect("steps");
    assert!(steps.len() >= 20, "steps attributed: {}", steps.len());
    // The agent saw the storm: mlx5_3's transmit-wait counter climbed while the job ran.
    let wins: serde_json::Value =
        serde_json::from_str(&agent.get(&format!("/api/v1/windows?since={b0}&until={b1}")).expect("windows").body).expect("windows json");
    let stalled = sc_nic_name(&sys, 3);
    let wait = wins["nics"].as_array().expect("nics").iter().find(|n| n["nic"]["name"] == stalled.as_str()).map_or(0.0, |n| {
        let s = n["samples"].as_array().cloned().unwrap_or_default();
        let at = |i: usize| s.get(i).and_then(|x| x["xmit_wait_ticks"].as_f64()).unwrap_or(0.0);
        at(s.len().saturating_sub(1)) - at(0)
    });
    assert!(wait > 0.0, "the agent never read the storm on {stalled}: {}", summarize(&wins.to_string()));
    let mut inside = 0;
    for s in steps {
        let (begin, end) = (s["begin"].as_f64().expect("b"), s["end"].as_f64().expect("e"));
        let cs: Vec<_> = joined.iter().filter(|c| c.first_arrival() >= begin - 1e-6 && c.first_arrival() < end).collect();
        if cs.is_empty() {
            continue;
        }
        let step_seconds = s["seconds"].as_f64().expect("seconds");
        if cs.iter().any(|c| c.last_exit() > b0 && c.last_arrival() < b1) {
            inside += 1;
        }
        for kind in ["congestion", "rail_imbalance", "in_flight_limit"] {
            let c = s["causes"].as_array().and_then(|v| v.iter().find(|c| c["kind"] == kind)).cloned().expect("cause");
            let secs = c["seconds"].as_f64().expect("s");
            assert!(
                secs <= 0.05 * step_seconds,
                "step {}: {kind} {:.2} ms of a {:.2} ms step from NICs the job never used (largest fixture write latency {:.1} ms)\n{:#}",
                s["step"],
                secs * 1e3,
                step_seconds * 1e3,
                max_lag * 1e3,
                s["causes"]
            );
        }
        let notes = s["notes"].to_string();
        assert!(notes.contains("moved no bytes over a NIC"), "step {}: the note should say no NIC carried the job: {notes}", s["step"]);
    }
    eprintln!(
        "steps overlapping the storm {inside} of {}; transmit wait on {stalled}: {wait:.0} ticks; largest fixture write latency {:.1} ms",
        steps.len(),
        max_lag * 1e3
    );
    assert!(inside >= 2, "only {inside} steps overlapped the storm: the test did not test anything");
}

/// The netdev name the fixture gives RDMA device index `i` (what the agent names the NIC).
fn sc_nic_name(sys: &std::path::Path, i: usize) -> String {
    let dev = sys.join(format!("class/infiniband/mlx5_{i}/ports/1/gid_attrs/ndevs/0"));
    std::fs::read_to_string(&dev).map(|s| s.trim().to_string()).unwrap_or_else(|e| panic!("{}: {e}", dev.display()))
}

fn summarize(body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    let mut out = String::new();
    for n in v["nics"].as_array().cloned().unwrap_or_default() {
        let s = n["samples"].as_array().cloned().unwrap_or_default();
        let f = |i: usize, k: &str| s.get(i).map(|x| x[k].as_f64().unwrap_or(-1.0)).unwrap_or(-1.0);
        let l = s.len().saturating_sub(1);
        out += &format!(
            "\n{} n={} t={:.3}..{:.3} tx {:.0}..{:.0} wait {:.0}..{:.0}",
            n["nic"]["name"],
            s.len(),
            f(0, "time"),
            f(l, "time"),
            f(0, "tx_bytes"),
            f(l, "tx_bytes"),
            f(0, "xmit_wait_ticks"),
            f(l, "xmit_wait_ticks")
        );
    }
    out
}
