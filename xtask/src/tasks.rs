//! The xtask tasks.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use stepwise_tests::harness::{self, Agent, Proc};

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
}

pub fn sh(cmd: &mut Command) -> Result<()> {
    eprintln!("+ {cmd:?}");
    let st = cmd.status().with_context(|| format!("cannot run {cmd:?}"))?;
    if !st.success() {
        bail!("{cmd:?} failed: {st}");
    }
    Ok(())
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

/// Installs what the project needs (apt packages, nightly rust-src, bpf-linker) and mounts
/// tracefs/bpffs. Idempotent: a second run takes about a second.
pub fn setup() -> Result<()> {
    sh(Command::new("bash").arg(root().join("xtask/setup.sh")))
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
    let all = ["lint", "unit", "integration"];
    let tiers: Vec<&str> = if args.is_empty() { all.to_vec() } else { args.iter().map(String::as_str).collect() };
    for t in &tiers {
        if !all.contains(t) {
            bail!("unknown test tier {t:?} (tiers: {})", all.join(", "));
        }
    }
    setup()?;
    let started = Instant::now();
    for t in tiers {
        eprintln!("\n=== tier {t} ===");
        match t {
            // Lints of every crate, including the eBPF program crate's host build.
            "lint" => sh(cargo().args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]))?,
            // Unit tests: no root, no network (agent lib + bin + model CLI tests).
            "unit" => sh(cargo().args(["test", "-p", "agent", "-p", "agent-common"]))?,
            // Privileged tiers: real kernel (netns/veth/tc), real Prometheus, fixtures.
            "integration" => {
                let bin = build_agent(false)?;
                sh(cargo().args(["test", "-p", "stepwise-tests", "-p", "xtask"]).env("STEPWISE_AGENT_BIN", bin))?;
            }
            _ => unreachable!(),
        }
    }
    eprintln!("\nall tiers passed in {:.0?}", started.elapsed());
    Ok(())
}

/// Until the attribution issue lands: the agent on an evolving 8-NIC fixture, one scrape.
pub fn demo(_args: &[String]) -> Result<()> {
    setup()?;
    let bin = build_agent(false)?;
    let dir = tempdir("demo")?;
    let sys = dir.join("sys");
    eprintln!("\n=== writing an 8-NIC ConnectX-7 fixture host and playing traffic with PFC pauses ===");
    let player = {
        let sys = sys.clone();
        std::thread::spawn(move || {
            stepwise_tests::scenario::run_cli(&["pfc-storm".into(), "--root".into(), sys.display().to_string(), "--duration".into(), "8s".into(), "--tick".into(), "100ms".into()])
        })
    };
    harness::wait_for(Duration::from_secs(10), "fixture tree", || sys.join("class/infiniband").exists().then_some(()))?;
    std::env::set_var("STEPWISE_AGENT_BIN", &bin);
    let cfg = dir.join("agent.toml");
    std::fs::write(&cfg, "interval = \"250ms\"\n[sources]\nethtool = false\nnetdev = false\nqdisc = false\n")?;
    let agent = Agent::start(&dir, &["--config", cfg.to_str().unwrap_or_default(), "--sysfs-root", sys.to_str().unwrap_or_default()])?;
    std::thread::sleep(Duration::from_secs(4));
    let metrics = agent.metrics()?;
    let _ = player.join();
    println!("\n=== agent check ===");
    let _ = Command::new(&bin).args(["check", "--sysfs-root", sys.to_str().unwrap_or_default()]).status();
    println!("\n=== /api/v1/topology (first NIC) ===");
    let topo: serde_json::Value = serde_json::from_str(&agent.get("/api/v1/topology")?.body)?;
    println!("{}", serde_json::to_string_pretty(&topo["nics"][0])?);
    println!("\n=== /metrics (NIC bytes, waits, congestion) ===");
    for l in metrics.lines().filter(|l| {
        !l.starts_with('#')
            && (l.starts_with("stepwise_nic_transmit_bytes_total") || l.starts_with("stepwise_nic_transmit_wait") || l.starts_with("stepwise_nic_cnp") || l.starts_with("stepwise_nic_ecn") || l.starts_with("stepwise_errors_total") || l.starts_with("stepwise_source_up"))
    }) {
        println!("{l}");
    }
    println!("\n(the full attribution demo — a real multi-rank job with an injected straggler and `agent diagnose` — arrives with the attribution issue)");
    Ok(())
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
        _ => bail!("usage: cargo xtask bench <counters|models>"),
    }
}

/// CPU per sweep of a 16-NIC mlx5 fixture: the agent versus node_exporter's infiniband
/// collector, measured in the same run on the same tree.
fn bench_counters() -> Result<()> {
    setup()?;
    let bin = build_agent(true)?;
    std::env::set_var("STEPWISE_AGENT_BIN", &bin);
    let dir = tempdir("bench-counters")?;
    let sys = dir.join("sys");
    stepwise_tests::scenario::run_cli(&["dgx16".into(), "--root".into(), sys.display().to_string(), "--duration".into(), "0s".into()])?;
    let ports = std::fs::read_dir(sys.join("class/infiniband"))?.count();

    // Agent: sampling only (no scrapes) at a 20 ms interval for 10 s.
    let cfg = dir.join("agent.toml");
    std::fs::write(&cfg, "interval = \"20ms\"\n[sources]\nethtool = false\nnetdev = false\nqdisc = false\n")?;
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

    println!("bench counters: 16-NIC mlx5 fixture ({ports} RDMA devices, ports + hw_counters)");
    println!("  agent sweep (sampling only)          {:>9.1} µs CPU/sweep over {} sweeps", agent_sweep * 1e6, sweeps1 - sweeps0);
    println!("  agent scrape of /metrics             {:>9.1} µs CPU/scrape ({n_scrapes} scrapes, {:.0?} wall)", agent_scrape * 1e6, agent_scrape_wall);
    println!("  node_exporter infiniband collector   {:>9.1} µs CPU/scrape ({n_scrapes} scrapes, {:.0?} wall, {ne_series} node_infiniband_ samples)", ne_sweep * 1e6, ne_wall);
    println!("  ratio node_exporter / agent sweep            {:>6.1}x  (target >= 5x)", ne_sweep / agent_sweep.max(1e-9));
    println!("  ratio node_exporter / agent sweep+scrape     {:>6.1}x", ne_sweep / (agent_sweep + agent_scrape).max(1e-9));
    println!("  agent peak RSS (VmHWM)               {:>9.1} MiB (target <= 64 MiB)", rss as f64 / 1024.0);
    Ok(())
}
