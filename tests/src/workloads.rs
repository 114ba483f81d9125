//! The C test workloads (tests/workloads): building them and running them the way the
//! end-to-end scenarios need.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::OnceLock,
};

use anyhow::{bail, Context, Result};

use crate::harness::workspace_root;

/// Builds tests/workloads once per test process (idempotent and fast when up to date).
pub fn build() -> Result<PathBuf> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = workspace_root().join("tests/workloads");
            let out = Command::new("bash").arg(dir.join("build.sh")).output().map_err(|e| format!("cannot run build.sh: {e}"))?;
            if !out.status.success() {
                return Err(format!("tests/workloads/build.sh failed:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)));
            }
            Ok(dir.join("build"))
        })
        .clone()
        .map_err(|e| anyhow::anyhow!(e))
}

/// `n` copies of the NCCL-ABI library (`libnccl.so.2` from [`build`]), each in its own
/// directory under `dir`: distinct files, so an agent preloading the directories attaches
/// each one. Returns the directories.
pub fn nccl_library_copies(dir: &Path, n: usize) -> Result<Vec<PathBuf>> {
    let lib = build()?.join("libnccl.so.2");
    (0..n)
        .map(|i| {
            let d = dir.join(format!("nccl-copy-{i}"));
            std::fs::create_dir_all(&d)?;
            std::fs::copy(&lib, d.join("libnccl.so.2")).with_context(|| format!("copy {} into {}", lib.display(), d.display()))?;
            Ok(d)
        })
        .collect()
}

/// Stepwise's NCCL profiler plugin under the name jobs load
/// (`tests/workloads/build/libnccl-profiler-stepwise.so`): `cargo build -p nccl-profiler`
/// (debug, once per test process), then a copy of `libnccl_profiler.so` (cargo cannot emit the
/// hyphenated name).
pub fn profiler_plugin() -> Result<PathBuf> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let root = workspace_root();
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let out = Command::new(cargo).current_dir(&root).args(["build", "-p", "nccl-profiler"]).output().map_err(|e| format!("cannot run cargo: {e}"))?;
            if !out.status.success() {
                return Err(format!("cargo build -p nccl-profiler failed:\n{}", String::from_utf8_lossy(&out.stderr)));
            }
            let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
            let built = target.join("debug/libnccl_profiler.so");
            let dir = build().map_err(|e| e.to_string())?;
            let dst = dir.join("libnccl-profiler-stepwise.so");
            let tmp = dir.join(format!("libnccl-profiler-stepwise.so.tmp{}", std::process::id()));
            std::fs::copy(&built, &tmp).map_err(|e| format!("cannot copy {}: {e}", built.display()))?;
            std::fs::rename(&tmp, &dst).map_err(|e| format!("cannot install {}: {e}", dst.display()))?;
            Ok(dst)
        })
        .clone()
        .map_err(|e| anyhow::anyhow!(e))
}

/// Runs a command, failing with its output when it exits non-zero.
pub fn run_ok(cmd: &mut Command) -> Result<Output> {
    let out = cmd.output().with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed ({}):\n{}{}", out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
    Ok(out)
}

/// `mpirun` for 4 ranks of `mpi_steps` inside network namespace `ns`, with compute as sleep so
/// ranks on two cores keep their timing, and OpenMPI yielding instead of spinning when idle.
pub fn mpi_steps(ns: &str, np: u32, args: &[&str]) -> Command {
    mpi_steps_with(ns, np, &[], args)
}

/// [`mpi_steps`] with extra `mpirun` options (e.g. `--enable-recovery`: the job outlives a
/// killed rank).
pub fn mpi_steps_with(ns: &str, np: u32, mpirun: &[&str], args: &[&str]) -> Command {
    let bin = workspace_root().join("tests/workloads/build/mpi_steps");
    let mut c = Command::new("ip");
    c.args([
        "netns",
        "exec",
        ns,
        "env",
        "STEPS_COMPUTE=sleep",
        "mpirun",
        "--oversubscribe",
        "--allow-run-as-root",
        "--mca",
        "mpi_yield_when_idle",
        "1",
        "-x",
        "STEPS_COMPUTE",
    ])
    .args(mpirun)
    .arg("-np")
    .arg(np.to_string())
    .arg(bin)
    .args(args);
    c
}

/// `mpirun` of `mpi_groups` across network-namespace servers, `per_node` ranks on each of
/// `servers` (namespace, its address on the link between them), launched from the first:
/// OpenMPI's ssh launcher with an agent script (written into `dir`) that runs the remote
/// daemon in the server's namespace instead of over ssh, and OpenMPI's out-of-band and
/// MPI traffic on `dev`, that link. The namespaces share one hostname, which OpenMPI would
/// take for one node and pair with shared memory: TCP between every pair (`btl self,tcp`).
pub fn mpi_groups_across(servers: &[(&str, std::net::Ipv4Addr)], dev: &str, per_node: u32, dir: &std::path::Path, args: &[&str]) -> Result<Command> {
    let agent = dir.join("netns-rsh");
    let mut script =
        String::from("#!/bin/sh\n# netns-rsh HOST CMD...: CMD inside HOST's namespace (mpirun's plm_rsh_agent)\nhost=$1; shift\ncase \"$host\" in\n");
    for (ns, addr) in servers {
        script.push_str(&format!("{addr}) ns={ns};;\n"));
    }
    script.push_str("*) echo \"netns-rsh: unknown host $host\" >&2; exit 1;;\nesac\nexec ip netns exec \"$ns\" sh -c \"$*\"\n");
    std::fs::write(&agent, script)?;
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let hosts: Vec<String> = servers.iter().map(|(_, a)| format!("{a}:{per_node}")).collect();
    let mut c = Command::new("ip");
    c.args(["netns", "exec", servers[0].0, "mpirun", "--oversubscribe", "--allow-run-as-root", "--mca", "plm_rsh_agent"])
        .arg(&agent)
        .args(["--mca", "oob_tcp_if_include", dev, "--mca", "btl_tcp_if_include", dev, "--mca", "btl", "self,tcp", "--mca", "mpi_yield_when_idle", "1"])
        .args(["--host", &hosts.join(","), "-np", &(per_node as usize * servers.len()).to_string()])
        .arg(workspace_root().join("tests/workloads/build/mpi_groups"))
        .args(["--per-node", &per_node.to_string()])
        .args(args);
    Ok(c)
}

/// CLOCK_MONOTONIC now in µs: the clock of the workloads' `arrive_us` and `--start-at-us`
/// (one clock for every network namespace of the host).
pub fn monotonic_us() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

/// One `step rank=… step=… … arrive_us=…` line of `mpi_steps`/`nccl_steps`.
#[derive(Clone, Debug, PartialEq)]
pub struct StepLine {
    pub rank: u32,
    pub step: u64,
    pub compute_us: f64,
    pub allreduce_us: f64,
    /// CLOCK_MONOTONIC µs when the rank entered the collective (the workload's own clock).
    pub arrive_us: f64,
    /// `nccl_steps` only: CLOCK_MONOTONIC µs at which the all-reduce's simulated kernel began
    /// on the stream (the GPU-side arrival an asynchronous call's profiler plugin reports).
    pub kernel_us: Option<f64>,
    pub delayed: bool,
}

/// Parses the per-step lines of a workload's stdout.
pub fn parse_steps(stdout: &str) -> Vec<StepLine> {
    stdout
        .lines()
        .filter(|l| l.starts_with("step "))
        .filter_map(|l| {
            let kv: std::collections::HashMap<&str, &str> = l.split_whitespace().filter_map(|t| t.split_once('=')).collect();
            Some(StepLine {
                rank: kv.get("rank")?.parse().ok()?,
                step: kv.get("step")?.parse().ok()?,
                compute_us: kv.get("compute_us")?.parse().ok()?,
                allreduce_us: kv.get("allreduce_us")?.parse().ok()?,
                arrive_us: kv.get("arrive_us")?.parse().ok()?,
                kernel_us: kv.get("kernel_us").and_then(|v| v.parse().ok()),
                delayed: kv.get("delayed")? == &"1",
            })
        })
        .collect()
}

/// Ground truth readiness skew per step from the workload's own clock: last − first arrival.
pub fn true_skew_seconds(lines: &[StepLine]) -> std::collections::BTreeMap<u64, (f64, u32)> {
    skew_by(lines, |l| l.arrive_us)
}

/// Ground truth readiness skew of GPU-timed steps: last − first begin of the all-reduce's
/// (simulated) kernel, which is when each rank's GPU reached the collective. An asynchronous
/// call returns at once; its kernel begins after the stream's earlier work, so this differs
/// from the call times (`arrive_us`) by whatever the stream did. Panics on a line without
/// `kernel_us` (a workload that does not report it).
pub fn true_kernel_skew_seconds(lines: &[StepLine]) -> std::collections::BTreeMap<u64, (f64, u32)> {
    skew_by(lines, |l| l.kernel_us.unwrap_or_else(|| panic!("rank {} step {}: no kernel_us", l.rank, l.step)))
}

fn skew_by(lines: &[StepLine], at: impl Fn(&StepLine) -> f64) -> std::collections::BTreeMap<u64, (f64, u32)> {
    let mut per: std::collections::BTreeMap<u64, Vec<(f64, u32)>> = std::collections::BTreeMap::new();
    for l in lines {
        per.entry(l.step).or_default().push((at(l), l.rank));
    }
    per.into_iter()
        .map(|(k, v)| {
            let first = v.iter().map(|x| x.0).fold(f64::INFINITY, f64::min);
            let last = v.iter().copied().max_by(|a, b| a.0.total_cmp(&b.0)).unwrap_or((first, 0));
            (k, ((last.0 - first) * 1e-6, last.1))
        })
        .collect()
}
