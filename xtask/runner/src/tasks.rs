//! The xtask tasks.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use stepwise_tests::harness::{self, Agent, Proc};

mod ecosystem;
mod plugin_bench;
mod shutdown_bench;

pub fn root() -> PathBuf {
    let up = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    up.canonicalize().unwrap_or(up)
}

pub fn sh(cmd: &mut Command) -> Result<()> {
    eprintln!("+ {cmd:?}");
    let st = cmd.status().with_context(|| format!("cannot run {cmd:?}"))?;
    if !st.success() {
        bail!("{cmd:?} failed: {st}");
    }
    Ok(())
}

/// The ecosystem tier's pinned helm (installed into the cache if it is not there).
pub(crate) fn ecosystem_helm() -> Result<PathBuf> {
    ecosystem::helm()
}

/// `cargo xtask chart-readme`: regenerates deploy/helm/stepwise/README.md from values.yaml.
pub fn chart_readme(_args: &[String]) -> Result<()> {
    ecosystem::chart_readme()
}

pub(crate) fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

fn build_agent(release: bool) -> Result<PathBuf> {
    let mut c = cargo();
    c.args(["build", "-p", "agent", "--bin", "agent"]);
    if release {
        c.arg("--release");
    }
    sh(&mut c)?;
    Ok(root().join("target").join(if release { "release" } else { "debug" }).join("agent"))
}

/// Test tiers. With no argument every tier runs, in this order.
pub fn test(args: &[String]) -> Result<()> {
    let all = ["lint", "fresh-build", "unit", "aarch64", "integration", "ecosystem", "fuzz", "soak"];
    let tiers: Vec<&str> = if args.is_empty() { all.to_vec() } else { args.iter().map(String::as_str).collect() };
    for t in &tiers {
        if !all.contains(t) {
            bail!("unknown test tier {t:?} (tiers: {})", all.join(", "));
        }
    }
    let started = Instant::now();
    for t in tiers {
        eprintln!("\n=== tier {t} ({}) ===", disk_free());
        match t {
            // Lints of every crate, including the eBPF program crate's host build.
            "lint" => {
                sh(cargo().args(["fmt", "--all", "--check"]))?;
                sh(cargo().args(["fmt", "--check", "--manifest-path", "fuzz/Cargo.toml"]))?;
                sh(cargo().args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]))?
            }
            // The eBPF object is never silently a stub: built into an empty target directory
            // without bpf-linker, then with it (issue 12).
            "fresh-build" => crate::fresh::check()?,
            // Unit tests: no root, no network (agent lib + bin + model CLI tests, and the NCCL
            // profiler plugin's own tests: its dlopen test loads the cdylib `cargo test` does
            // not emit, so it is built first).
            "unit" => {
                sh(cargo().args(["build", "-p", "nccl-profiler"]))?;
                sh(cargo().args(["test", "-p", "agent", "-p", "agent-common", "-p", "agent-ebpf-object", "-p", "nccl-profiler"]))?
            }
            // The agent cross-built for aarch64 (Grace) and its unit tests under qemu-user.
            "aarch64" => crate::cross::check()?,
            // Privileged tiers: real kernel (netns/veth/tc), real Prometheus, fixtures. Against
            // the release agent, as users run it: the accuracy scenarios use the shipped
            // defaults, whose fast lane reads as often as a 1 % CPU budget allows — about
            // 2.7× less often in a debug build (the soak tier builds the release agent anyway).
            "integration" => {
                let bin = build_agent(true)?;
                // helm renders the chart for tests/tests/operator_labels.rs.
                let tools = ecosystem::test_env()?;
                sh(cargo().args(["test", "-p", "stepwise-tests", "-p", "xtask-runner"]).env("STEPWISE_AGENT_BIN", bin).envs(tools))?;
            }
            // Dashboards, deployment and least privilege, checked by the real tools (issue 6).
            // $STEPWISE_AGENT_BIN: an agent already built (a quicker run while editing deploy/).
            "ecosystem" => {
                let agent = match std::env::var_os("STEPWISE_AGENT_BIN") {
                    Some(p) => PathBuf::from(p),
                    None => build_agent(true)?,
                };
                ecosystem::run(&agent, !(args.is_empty() || args.iter().any(|a| a == "integration")))?
            }
            // Every parser of outside input under libFuzzer + ASan for a few seconds each (issue 7).
            "fuzz" => crate::fuzz::brief()?,
            // The agent under jobs, storms and counter faults for 10 minutes
            // ($STEPWISE_SOAK_MINUTES overrides), every bound asserted (issue 7).
            "soak" => crate::soak::soak(&[])?,
            _ => unreachable!(),
        }
    }
    eprintln!("\nall tiers passed in {:.0?} ({})", started.elapsed(), disk_free());
    Ok(())
}

/// Free space on the file system of target/, for the log of each tier (CI has run out of disk).
fn disk_free() -> String {
    let target = root().join("target");
    let _ = std::fs::create_dir_all(&target);
    // SAFETY: statvfs is plain old data; all zeroes is a valid value, overwritten below.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let path = std::ffi::CString::new(target.as_os_str().as_encoded_bytes()).unwrap_or_default();
    // SAFETY: a NUL-terminated path and a valid out-pointer.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return "free disk unknown".into();
    }
    let (free, used) = (st.f_bavail as f64 * st.f_frsize as f64, dir_size(&target));
    format!("{:.1} GB free on the disk of target/, target/ holds {:.1} GB", free / 1e9, used / 1e9)
}

fn dir_size(p: &Path) -> f64 {
    let Ok(rd) = std::fs::read_dir(p) else { return 0.0 };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_size(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0.0, |m| m.len() as f64),
            _ => 0.0,
        })
        .sum()
}

/// The main job: a real 4-rank OpenMPI job with one rank 30 ms late every 5th step, watched by
/// the agent (eBPF uprobes on libmpi), then `agent diagnose --slowest 3` from its history.
pub fn demo(_args: &[String]) -> Result<()> {
    let bin = build_agent(false)?;
    std::env::set_var("STEPWISE_AGENT_BIN", &bin);
    eprintln!("\n=== building the test workloads (OpenMPI steps, NCCL-ABI library) ===");
    stepwise_tests::workloads::build()?;
    let dir = tempdir("demo")?;
    let ns = stepwise_tests::netns::Netns::new().context("creating a network namespace for the job (needs root)")?;
    let db = dir.join("agent.db");
    let sock = dir.join("markers.sock");
    let cfg = dir.join("agent.toml");
    std::fs::write(
        &cfg,
        format!("interval = \"100ms\"\n[sources]\nrdma = false\nethtool = false\n[collectives.select]\nnetns = \"/run/netns/{}\"\n", ns.name()),
    )?;
    eprintln!("=== starting the agent (log: {}) ===", dir.display());
    let agent = Agent::start(&dir, &["--config", path_str(&cfg)?, "--db", path_str(&db)?, "--marker-socket", path_str(&sock)?])?;
    eprintln!("=== running 4 MPI ranks x 15 steps: 20 ms compute + MPI_Allreduce of 1 MiB; rank 2 computes 30 ms longer every 5th step ===");
    let out = stepwise_tests::workloads::run_ok(&mut stepwise_tests::workloads::mpi_steps(
        ns.name(),
        4,
        &[
            "--steps",
            "15",
            "--bytes",
            "1048576",
            "--compute-us",
            "20000",
            "--delay-rank",
            "2",
            "--delay-us",
            "30000",
            "--delay-every",
            "5",
            "--marker-socket",
            path_str(&sock)?,
        ],
    ))?;
    let summary = String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.contains("summary")).count();
    eprintln!("    job finished: {summary} ranks reported");
    // The agent must have seen the job's MPI calls; otherwise diagnose could only say "no steps".
    let calls = agent.get("/api/v1/collectives?limit=10")?;
    let seen = serde_json::from_str::<serde_json::Value>(&calls.body).ok().and_then(|v| v["calls"].as_array().map(Vec::len)).unwrap_or(0);
    if seen == 0 {
        bail!(
            "the agent recorded no MPI calls of the job (HTTP {}: {}): its uprobes on libmpi did not attach. See its log: {}\n{}",
            calls.status,
            calls.body.trim(),
            dir.display(),
            agent.proc.log_text()
        );
    }
    // Until the last step has been attributed (grace period) and written to the history.
    harness::wait_for(Duration::from_secs(15), "the job's 15 steps in the agent's history", || {
        let out = Command::new(&bin).args(["diagnose", "--json", "--slowest", "100", "--db", path_str(&db).ok()?]).output().ok()?;
        let steps = serde_json::from_slice::<serde_json::Value>(&out.stdout).ok()?;
        (steps["steps"].as_array().map_or(0, Vec::len) >= 15).then_some(())
    })
    .with_context(|| format!("agent log:\n{}", agent.proc.log_text()))?;
    println!("\n$ agent diagnose --slowest 3 --db {}\n", db.display());
    let st = Command::new(&bin).args(["diagnose", "--slowest", "3", "--db", path_str(&db)?]).status()?;
    drop(agent);
    if !st.success() {
        bail!("agent diagnose failed: {st}");
    }
    Ok(())
}

fn path_str(p: &Path) -> Result<&str> {
    p.to_str().ok_or_else(|| anyhow::anyhow!("non-UTF-8 path {}", p.display()))
}

pub fn tempdir(tag: &str) -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("stepwise-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

pub fn bench(args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        Some("counters") => bench_counters(),
        Some("models") => sh(cargo().args(["run", "--release", "-p", "agent", "--example", "bench_models"])),
        Some("attribution") => bench_attribution(),
        Some("tcp") => sh(cargo().args(["run", "--release", "-p", "agent", "--example", "bench_tcp"])),
        Some("fast") => bench_fast(),
        Some("cluster") => bench_cluster(),
        // The NCCL profiler plugin: ns per collective on NCCL's calling and proxy threads
        // against an empty plugin, with and without a chained plugin, and records/s reaching a
        // receiver (docs/profiler-plugin.md). Then the step-time overhead of the asynchronous
        // NCCL-ABI job without it, with it, and with a plugin chained behind it.
        Some("plugin") => plugin_bench::callbacks().and_then(|_| plugin_bench::step_overhead()),
        Some("probes") => {
            build_agent(true).and_then(|_| sh(cargo().args(["run", "--release", "-p", "agent", "--example", "bench_probes", "--"]).args(&args[1..])))
        }
        Some("shutdown") => match args.get(1) {
            Some(a) => shutdown_bench::run(Some(PathBuf::from(a))),
            None => build_agent(true).and_then(|a| shutdown_bench::run(Some(a))),
        },
        _ => bail!("usage: cargo xtask bench <counters|fast|models|attribution|probes|tcp|cluster|plugin|shutdown>"),
    }
}

/// The profiler plugin and the agent (release) beside two ranks of PyTorch's real NCCL on
/// this host's first GPU: `tests/gpu/check.py` (tests/gpu/README.md). Needs root, an NVIDIA
/// GPU and PyTorch with CUDA; CI never runs it.
pub fn gpu_check(args: &[String]) -> Result<()> {
    if harness::which("nvidia-smi").is_none() {
        bail!("gpu-check needs an NVIDIA GPU and its driver (nvidia-smi not found); CI never runs it");
    }
    sh(cargo().args(["build", "--release", "-p", "nccl-profiler"]))?;
    let agent = build_agent(true)?;
    let plugin = root().join("target/release/libnccl_profiler.so");
    // The second plugin of the chained job (tests/gpu/chain.py).
    sh(Command::new("make").args(["-C", "tests/workloads", "build/libnccl-profiler-chaintest.so"]).current_dir(root()))?;
    let chain = root().join("tests/workloads/build/libnccl-profiler-chaintest.so");
    let out = tempdir("gpu-check")?;
    println!("gpu-check: output in {}", out.display());
    let mut c = Command::new("python3");
    c.arg(root().join("tests/gpu/check.py")).arg("--plugin").arg(&plugin).arg("--agent").arg(&agent).arg("--chain").arg(&chain).arg("--out").arg(&out);
    sh(c.args(args))
}

/// `agent diagnose --peers` over 128 agents × 8 ranks × 1 000 steps served on loopback by
/// the example (the agent's own API router over synthetic history): wall time and peak RSS
/// for one step and for the slowest of 1 000 (targets < 1 s and < 10 s).
fn bench_cluster() -> Result<()> {
    let bin = build_agent(true)?;
    sh(cargo().args(["run", "--release", "-p", "agent", "--example", "bench_cluster", "--"]).arg(&bin))
}

/// Attribution throughput (collective records/s on one core) and `agent diagnose` latency
/// over 1 000 stored steps.
fn bench_attribution() -> Result<()> {
    let dir = tempdir("bench-attribution")?;
    let db = dir.join("history.db");
    sh(cargo().args(["run", "--release", "-p", "agent", "--example", "bench_attribution", "--"]).arg(&db))?;
    let bin = build_agent(true)?;
    for args in [&["--slowest", "3"][..], &["--step", "500"][..], &["--slowest", "1000", "--json"][..]] {
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let t = Instant::now();
            let out = Command::new(&bin).arg("diagnose").args(args).arg("--since").arg("100000d").arg("--db").arg(&db).output()?;
            if !out.status.success() {
                bail!("agent diagnose {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!("bench attribution: diagnose {} over 1000 stored steps: {:.0} ms (best of 3; target < 1000 ms)", args.join(" "), best * 1e3);
    }
    Ok(())
}

/// CPU nanoseconds of the calling thread (`CLOCK_THREAD_CPUTIME_ID`, exact to the call).
fn thread_cpu_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The syscall floor of a counter sweep: this thread's CPU per round of one `pread` at offset
/// 0 of every `ports/*/counters/*` file of the tree (the counters node_exporter reads too),
/// all opened once beforehand — what a sweep costs with no parsing, no metrics, no checks.
/// Back to back (caches hot) and paced like the agent, one round per 20 ms (caches as cold as
/// the agent finds them).
fn pread_floor(sys: &Path) -> Result<(usize, f64, f64)> {
    use std::os::unix::fs::FileExt;
    let mut files = Vec::new();
    for dev in std::fs::read_dir(sys.join("class/infiniband"))? {
        for port in std::fs::read_dir(dev?.path().join("ports"))? {
            for f in std::fs::read_dir(port?.path().join("counters"))? {
                files.push(std::fs::File::open(f?.path())?);
            }
        }
    }
    let mut buf = [0u8; 64];
    let mut round = |pause: Duration| -> Result<u64> {
        std::thread::sleep(pause);
        let c0 = thread_cpu_ns();
        for f in &files {
            f.read_at(&mut buf, 0)?;
        }
        Ok(thread_cpu_ns() - c0)
    };
    let hot: u64 = (0..2000).map(|_| round(Duration::ZERO)).sum::<Result<u64>>()?;
    let paced: u64 = (0..200).map(|_| round(Duration::from_millis(20))).sum::<Result<u64>>()?;
    Ok((files.len(), hot as f64 / 2000e9, paced as f64 / 200e9))
}

/// The 16-NIC mlx5 fixture `dgx16` under `dir` (on tmpfs when available: sysfs is
/// memory-backed, so an ext4 tree would add journal/atime work that no real sweep pays).
fn dgx16(name: &str) -> Result<(PathBuf, PathBuf)> {
    let dir = if Path::new("/dev/shm").is_dir() {
        let d = Path::new("/dev/shm").join(format!("stepwise-bench-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d)?;
        d
    } else {
        tempdir(&format!("bench-{name}"))?
    };
    let sys = dir.join("sys");
    stepwise_tests::scenario::run_cli(&["dgx16".into(), "--root".into(), sys.display().to_string(), "--duration".into(), "0s".into()])?;
    Ok((dir, sys))
}

/// The fast lane's CPU against the full sweep's on the 16-NIC mlx5 fixture (see
/// `agent/examples/bench_fast.rs`).
fn bench_fast() -> Result<()> {
    let (dir, sys) = dgx16("fast")?;
    let r = sh(cargo().args(["run", "--release", "-p", "agent", "--example", "bench_fast", "--"]).arg(&sys));
    let _ = std::fs::remove_dir_all(&dir);
    r
}

/// CPU per sweep of a 16-NIC mlx5 fixture: the agent versus node_exporter's infiniband
/// collector, measured in the same run on the same tree.
fn bench_counters() -> Result<()> {
    let bin = build_agent(true)?;
    std::env::set_var("STEPWISE_AGENT_BIN", &bin);
    let (dir, sys) = dgx16("counters")?;
    let ports = std::fs::read_dir(sys.join("class/infiniband"))?.count();

    // Agent: sampling only (no scrapes) at a 20 ms interval for 10 s.
    let cfg = dir.join("agent.toml");
    // Only the RDMA source, as node_exporter runs only its infiniband collector.
    std::fs::write(&cfg, "interval = \"20ms\"\n[sources]\nethtool = false\nnetdev = false\nqdisc = false\ntcp = false\n[collectives]\nenabled = false\n[store]\nenabled = false\n")?;
    let agent = Agent::start(&dir, &["--config", cfg.to_str().unwrap_or_default(), "--sysfs-root", sys.to_str().unwrap_or_default(), "--log", "warn"])?;
    std::thread::sleep(Duration::from_secs(1));
    let sweeps0 = agent.status()?["sweeps"].as_u64().unwrap_or(0);
    let cpu0 = harness::cpu_seconds(agent.proc.pid()).unwrap_or(0.0);
    std::thread::sleep(Duration::from_secs(10));
    let sweeps1 = agent.status()?["sweeps"].as_u64().unwrap_or(0);
    let cpu1 = harness::cpu_seconds(agent.proc.pid()).unwrap_or(0.0);
    let agent_sweep = (cpu1 - cpu0) / (sweeps1 - sweeps0).max(1) as f64;
    // Agent: sweep + scrape, same cadence as node_exporter below.
    let n_scrapes = 200;
    let cpu2 = harness::cpu_seconds(agent.proc.pid()).unwrap_or(0.0);
    let s2 = agent.status()?["sweeps"].as_u64().unwrap_or(0);
    let t = Instant::now();
    for _ in 0..n_scrapes {
        agent.metrics()?;
    }
    let agent_scrape_wall = t.elapsed();
    let cpu3 = harness::cpu_seconds(agent.proc.pid()).unwrap_or(0.0);
    let s3 = agent.status()?["sweeps"].as_u64().unwrap_or(0);
    // Per scrape: CPU of the scrapes plus the sweeps that ran meanwhile, charged per scrape.
    let agent_scrape = (cpu3 - cpu2 - agent_sweep * (s3 - s2) as f64) / n_scrapes as f64;
    let rss = harness::status_kib(agent.proc.pid(), "VmHWM").unwrap_or(0);
    drop(agent);

    // node_exporter: each scrape is one full sweep of the infiniband collector.
    let ne = harness::which("prometheus-node-exporter").context("prometheus-node-exporter not installed (cargo xtask setup)")?;
    let port = harness::free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut cmd = Command::new(ne);
    cmd.arg(format!("--path.sysfs={}", sys.display()))
        .args(["--collector.disable-defaults", "--collector.infiniband"])
        .arg(format!("--web.listen-address={addr}"));
    let nep = Proc::spawn("node_exporter", &mut cmd, dir.join("node_exporter.log"))?;
    harness::wait_for(Duration::from_secs(10), "node_exporter", || harness::http_get(&addr, "/metrics").ok().filter(|r| r.status == 200))?;
    let probe = harness::http_get(&addr, "/metrics")?.body;
    let ne_series = probe.lines().filter(|l| l.starts_with("node_infiniband_")).count();
    let c0 = harness::cpu_seconds(nep.pid()).unwrap_or(0.0);
    let t = Instant::now();
    for _ in 0..n_scrapes {
        harness::http_get(&addr, "/metrics")?;
    }
    let ne_wall = t.elapsed();
    let c1 = harness::cpu_seconds(nep.pid()).unwrap_or(0.0);
    let ne_sweep = (c1 - c0) / n_scrapes as f64;
    drop(nep);

    let (floor_files, hot, floor) = pread_floor(&sys)?;
    println!("bench counters: 16-NIC mlx5 fixture ({ports} RDMA devices, ports + hw_counters)");
    println!("  agent sweep (sampling only)          {:>9.1} µs CPU/sweep over {} sweeps", agent_sweep * 1e6, sweeps1 - sweeps0);
    println!("  agent scrape of /metrics             {:>9.1} µs CPU/scrape ({n_scrapes} scrapes, {:.0?} wall)", agent_scrape * 1e6, agent_scrape_wall);
    println!(
        "  node_exporter infiniband collector   {:>9.1} µs CPU/scrape ({n_scrapes} scrapes, {:.0?} wall, {ne_series} node_infiniband_ samples)",
        ne_sweep * 1e6,
        ne_wall
    );
    println!(
        "  floor: one pread of each of the {floor_files} port counter files (open), every 20 ms {:>5.1} µs CPU/round (back to back {:.1})",
        floor * 1e6,
        hot * 1e6
    );
    println!("  ratio node_exporter / agent sweep            {:>6.1}x  (target >= 8x, issue 18)", ne_sweep / agent_sweep.max(1e-9));
    println!(
        "  ratio agent sweep / floor                    {:>6.1}x  (node_exporter / floor {:.1}x)",
        agent_sweep / floor.max(1e-9),
        ne_sweep / floor.max(1e-9)
    );
    println!("  ratio node_exporter / agent sweep+scrape     {:>6.1}x", ne_sweep / (agent_sweep + agent_scrape).max(1e-9));
    let _ = std::fs::remove_dir_all(&dir);
    println!("  agent peak RSS (VmHWM)               {:>9.1} MiB (target <= 64 MiB)", rss as f64 / 1024.0);
    Ok(())
}
