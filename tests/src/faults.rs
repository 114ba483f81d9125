//! Helpers for the fault-injection tests (tests/tests/faults.rs) and the soak
//! (`cargo xtask soak`): an agent started from a config text (optionally inside a network
//! namespace), its health (`/healthz`, alive, still sweeping), its process figures (RSS, CPU,
//! open descriptors), markers sent as a training script sends them, and the event-storm
//! program that floods the probe ring.

use std::{
    os::unix::net::UnixDatagram,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context, Result};

use crate::{
    harness::{agent_bin, free_port, http_get, samples, wait_for, HttpResponse, Proc},
    workloads,
};

/// An agent started by [`FaultAgent::start`]: its own config file, history store and marker
/// socket under the test's directory; optionally inside a network namespace (then every
/// request is made from a thread in that namespace).
pub struct FaultAgent {
    pub proc: Proc,
    pub addr: String,
    pub netns: Option<String>,
    pub config: PathBuf,
    pub db: PathBuf,
    pub sock: PathBuf,
}

/// Where and how to start an agent.
#[derive(Clone, Debug, Default)]
pub struct AgentSpec {
    /// Config text (TOML) without `[store] path` and `[steps] marker_socket`, which are set
    /// from `db` and `sock` through flags.
    pub config: String,
    /// Run inside this network namespace (`ip netns exec`).
    pub netns: Option<String>,
    /// Extra `agent run` arguments.
    pub args: Vec<String>,
    /// `STEPWISE_LOG` (the log filter overrides the file); `None` leaves the file's.
    pub log_env: Option<String>,
    /// Listen port (default: a free one).
    pub port: Option<u16>,
    /// Name of the log file and config (several agents in one directory).
    pub tag: String,
    /// RLIMIT_NOFILE (soft and hard) the agent starts under; `None` inherits this process's.
    pub nofile: Option<u64>,
}

impl FaultAgent {
    /// Starts the agent and waits (30 s) until `/readyz` answers 200.
    pub fn start(dir: &Path, spec: &AgentSpec) -> Result<FaultAgent> {
        let tag = if spec.tag.is_empty() { "agent" } else { spec.tag.as_str() };
        let config = dir.join(format!("{tag}.toml"));
        std::fs::write(&config, &spec.config).with_context(|| format!("write {}", config.display()))?;
        Self::start_with(dir, spec, config, dir.join("agent.db"), dir.join("markers.sock"))
    }

    /// [`FaultAgent::start`] with the config file, store and socket given (a restart).
    pub fn start_with(dir: &Path, spec: &AgentSpec, config: PathBuf, db: PathBuf, sock: PathBuf) -> Result<FaultAgent> {
        let tag = if spec.tag.is_empty() { "agent" } else { spec.tag.as_str() };
        let port = spec.port.unwrap_or_else(free_port);
        let addr = format!("127.0.0.1:{port}");
        let mut cmd = match &spec.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(agent_bin());
                c
            }
            None => Command::new(agent_bin()),
        };
        cmd.args(["run", "--listen", &addr, "--config"]).arg(&config).arg("--db").arg(&db).arg("--marker-socket").arg(&sock).args(&spec.args);
        cmd.env_remove("STEPWISE_LOG");
        // Agents on one host may not share the profiler plugin's socket.
        cmd.env("STEPWISE_PROFILER_SOCKET", Self::profiler_socket(dir, spec));
        if let Some(l) = &spec.log_env {
            cmd.env("STEPWISE_LOG", l);
        }
        if let Some(n) = spec.nofile {
            use std::os::unix::process::CommandExt;
            let lim = libc::rlimit { rlim_cur: n, rlim_max: n };
            // SAFETY: setrlimit is async-signal-safe; `lim` is a copy owned by the closure.
            unsafe {
                cmd.pre_exec(move || if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) });
            }
        }
        let n = std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0);
        let proc = Proc::spawn(tag, &mut cmd, dir.join(format!("{tag}-{n}.log")))?;
        let mut a = FaultAgent { proc, addr, netns: spec.netns.clone(), config, db, sock };
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            if !a.proc.alive() {
                bail!("agent exited early:\n{}", a.proc.log_text());
            }
            if a.get("/readyz").is_ok_and(|r| r.status == 200) {
                return Ok(a);
            }
            if Instant::now() > end {
                bail!("agent not ready after 30 s:\n{}", a.proc.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The profiler plugin's socket of an agent started from `spec` in `dir`.
    pub fn profiler_socket(dir: &Path, spec: &AgentSpec) -> PathBuf {
        dir.join(format!("{}-profiler.sock", if spec.tag.is_empty() { "agent" } else { spec.tag.as_str() }))
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// GET from the agent's namespace.
    pub fn get(&self, path: &str) -> Result<HttpResponse> {
        match &self.netns {
            Some(ns) => in_netns(ns, || http_get(&self.addr, path))?,
            None => http_get(&self.addr, path),
        }
    }

    /// GET returning JSON (status 200 required).
    pub fn json(&self, path: &str) -> Result<serde_json::Value> {
        let r = self.get(path)?;
        if r.status != 200 {
            bail!("GET {path}: HTTP {}: {}", r.status, r.body);
        }
        serde_json::from_str(&r.body).with_context(|| format!("GET {path}: not JSON: {}", r.body))
    }

    pub fn metrics(&self) -> Result<String> {
        Ok(self.get("/metrics")?.body)
    }

    /// Sum of every sample of `name` whose labels contain all of `labels` (0 when none).
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        metric_sum(&self.metrics().unwrap_or_default(), name, labels)
    }

    /// `sweeps` of `/api/v1/status`.
    pub fn sweeps(&self) -> Result<u64> {
        self.json("/api/v1/status")?["sweeps"].as_u64().ok_or_else(|| anyhow!("no sweeps in /api/v1/status"))
    }

    /// `/api/v1/steps` (at most 100 000).
    pub fn steps(&self) -> Result<Vec<serde_json::Value>> {
        Ok(self.json("/api/v1/steps?limit=100000")?["steps"].as_array().cloned().unwrap_or_default())
    }

    /// `/api/v1/collectives` calls (at most 100 000).
    pub fn calls(&self) -> Result<Vec<serde_json::Value>> {
        Ok(self.json("/api/v1/collectives?limit=100000")?["calls"].as_array().cloned().unwrap_or_default())
    }

    /// Healthy: alive, `/healthz` 200, no panic in the log, and still sampling (`sweeps`
    /// grows by at least 2 within 10 s).
    pub fn assert_healthy(&mut self, when: &str) {
        assert!(self.proc.alive(), "{when}: the agent died:\n{}", self.proc.log_text());
        let h = self.get("/healthz").unwrap_or_else(|e| panic!("{when}: /healthz: {e:#}\n{}", self.proc.log_text()));
        assert_eq!(h.status, 200, "{when}: /healthz");
        let log = self.proc.log_text();
        assert!(!log.contains("panicked"), "{when}: the agent panicked:\n{log}");
        let s0 = self.sweeps().unwrap_or_else(|e| panic!("{when}: status: {e:#}"));
        wait_for(Duration::from_secs(10), "sweeps to grow", || self.sweeps().ok().filter(|s| *s >= s0 + 2))
            .unwrap_or_else(|e| panic!("{when}: not sampling any more: {e:#}"));
    }

    /// Sends SIGHUP (config reload).
    pub fn hup(&self) {
        signal(self.pid(), libc::SIGHUP);
    }

    /// Figures of the agent process now.
    pub fn stats(&self) -> ProcStats {
        ProcStats::of(self.pid())
    }
}

/// Sum of the samples of `name` whose labels contain every `k="v"` of `labels`.
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples(text, name).into_iter().filter(|(l, _)| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))).map(|(_, v)| v).sum()
}

/// Runs `f` on a thread that entered network namespace `ns` (network only).
pub fn in_netns<R: Send, F: FnOnce() -> R + Send>(ns: &str, f: F) -> Result<R> {
    use std::os::fd::AsRawFd;
    let path = Path::new("/run/netns").join(ns);
    std::thread::scope(|s| {
        s.spawn(|| {
            let fd = std::fs::File::open(&path).with_context(|| format!("open {}", path.display()))?;
            // SAFETY: setns(2) on an open namespace descriptor; only this thread moves.
            if unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) } < 0 {
                return Err(std::io::Error::last_os_error()).with_context(|| format!("setns into {ns}"));
            }
            Ok(f())
        })
        .join()
        .map_err(|_| anyhow!("thread in netns {ns} panicked"))?
    })
}

/// Sends signal `sig` to `pid`.
pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) has no memory preconditions.
    unsafe { libc::kill(pid as i32, sig) };
}

/// A process's resident memory, CPU time and open descriptors.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcStats {
    pub rss_kib: u64,
    /// Of the RSS: heap and other anonymous memory (the rest is mapped files, mostly code).
    pub anon_kib: u64,
    pub hwm_kib: u64,
    pub cpu_seconds: f64,
    pub fds: usize,
}

impl ProcStats {
    pub fn of(pid: u32) -> ProcStats {
        ProcStats {
            rss_kib: crate::harness::status_kib(pid, "VmRSS").unwrap_or(0),
            anon_kib: crate::harness::status_kib(pid, "RssAnon").unwrap_or(0),
            hwm_kib: crate::harness::status_kib(pid, "VmHWM").unwrap_or(0),
            cpu_seconds: crate::harness::cpu_seconds(pid).unwrap_or(0.0),
            fds: std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0),
        }
    }
}

/// Sends step markers as a training script does: one JSON datagram per marker to the agent's
/// Unix socket (the agent stamps the time on receipt).
pub struct Marks {
    sock: UnixDatagram,
    path: PathBuf,
}

impl Marks {
    pub fn new(path: &Path) -> Result<Marks> {
        Ok(Marks { sock: UnixDatagram::unbound()?, path: path.to_path_buf() })
    }
    pub fn send(&self, rank: u32, step: u64, phase: &str) {
        let m = format!(r#"{{"rank":{rank},"step":{step},"phase":"{phase}"}}"#);
        let _ = self.sock.send_to(m.as_bytes(), &self.path);
    }
    /// One step of `ranks` ranks lasting `d` (begin, sleep, end).
    pub fn step(&self, ranks: u32, step: u64, d: Duration) {
        for r in 0..ranks {
            self.send(r, step, "begin");
        }
        std::thread::sleep(d);
        for r in 0..ranks {
            self.send(r, step, "end");
        }
    }
}

/// The event-storm program: `storm THREADS SECONDS [BURST PAUSE_US]` calls
/// `ncclGroupStart(); ncclGroupEnd();` (two probed NCCL-ABI entry points that do nothing
/// when the group is empty) in a loop on each thread — in bursts of BURST pairs separated by
/// PAUSE_US µs when given — and prints `pairs=N cpu_ns=C wall_ns=W` (C: CPU time of the
/// calling threads, so a probe's cost shows however the threads were scheduled).
pub const STORM_C: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
int ncclGroupStart(void);
int ncclGroupEnd(void);
static double seconds; static long burst, pause_us;
static long long now_ns(clockid_t c) { struct timespec t; clock_gettime(c, &t); return t.tv_sec * 1000000000LL + t.tv_nsec; }
struct res { long long pairs, cpu_ns; };
static void *run(void *arg) {
  struct res *r = arg;
  long long end = now_ns(CLOCK_MONOTONIC) + (long long)(seconds * 1e9), c0 = now_ns(CLOCK_THREAD_CPUTIME_ID), n = 0;
  while (now_ns(CLOCK_MONOTONIC) < end) {
    long k = burst > 0 ? burst : 1000;
    for (long i = 0; i < k; i++) { if (ncclGroupStart() != 0 || ncclGroupEnd() != 0) { fprintf(stderr, "group call failed\n"); exit(1); } }
    n += k;
    if (burst > 0 && pause_us > 0) usleep(pause_us);
  }
  r->pairs = n; r->cpu_ns = now_ns(CLOCK_THREAD_CPUTIME_ID) - c0;
  return NULL;
}
int main(int argc, char **argv) {
  if (argc < 3) { fprintf(stderr, "usage: storm THREADS SECONDS [BURST PAUSE_US]\n"); return 2; }
  int n = atoi(argv[1]); seconds = atof(argv[2]);
  burst = argc > 3 ? atol(argv[3]) : 0; pause_us = argc > 4 ? atol(argv[4]) : 0;
  pthread_t t[64]; struct res r[64] = {{0}};
  if (n < 1 || n > 64) return 2;
  long long w0 = now_ns(CLOCK_MONOTONIC);
  for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, run, &r[i]);
  long long pairs = 0, cpu = 0;
  for (int i = 0; i < n; i++) { pthread_join(t[i], NULL); pairs += r[i].pairs; cpu += r[i].cpu_ns; }
  printf("pairs=%lld cpu_ns=%lld wall_ns=%lld\n", pairs, cpu, now_ns(CLOCK_MONOTONIC) - w0);
  return 0;
}
"#;

/// Builds the storm program into `dir` against its own copy of the NCCL-ABI library
/// (`dir/storm-lib/libnccl.so.2`, rpath set): a file no other agent has probes on unless
/// told to preload that directory. Returns (program, library directory).
pub fn build_storm(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let build = workloads::build()?;
    let lib = dir.join("storm-lib");
    std::fs::create_dir_all(&lib)?;
    std::fs::copy(build.join("libnccl.so.2"), lib.join("libnccl.so.2")).context("copy libnccl.so.2")?;
    let src = dir.join("storm.c");
    std::fs::write(&src, STORM_C)?;
    let exe = dir.join("storm");
    let mut c = Command::new("cc");
    c.args(["-O2", "-Wall", "-Werror", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-l:libnccl.so.2");
    workloads::run_ok(&mut c).context("cc storm.c (needs a C compiler)")?;
    Ok((exe, lib))
}

/// What one storm run measured.
#[derive(Clone, Copy, Debug, Default)]
pub struct StormResult {
    pub pairs: u64,
    pub cpu_ns: u64,
    pub wall_ns: u64,
}

impl StormResult {
    /// CPU nanoseconds per `ncclGroupStart` + `ncclGroupEnd` pair.
    pub fn ns_per_pair(&self) -> f64 {
        self.cpu_ns as f64 / self.pairs.max(1) as f64
    }
    pub fn parse(out: &str) -> Result<StormResult> {
        let line = out.lines().find(|l| l.starts_with("pairs=")).ok_or_else(|| anyhow!("no result line in storm output: {out}"))?;
        let kv: std::collections::HashMap<&str, u64> =
            line.split_whitespace().filter_map(|t| t.split_once('=')).filter_map(|(k, v)| Some((k, v.parse().ok()?))).collect();
        let get = |k: &str| kv.get(k).copied().ok_or_else(|| anyhow!("no {k} in {line}"));
        Ok(StormResult { pairs: get("pairs")?, cpu_ns: get("cpu_ns")?, wall_ns: get("wall_ns")? })
    }
}

/// The storm command (`ip netns exec NS storm …` when `ns` is given).
pub fn storm_cmd(exe: &Path, ns: Option<&str>, threads: u32, seconds: f64, burst: Option<(u32, u32)>) -> Command {
    let mut c = match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    c.arg(threads.to_string()).arg(seconds.to_string());
    if let Some((b, p)) = burst {
        c.arg(b.to_string()).arg(p.to_string());
    }
    c
}

/// Runs a storm to completion and parses its result.
pub fn run_storm(exe: &Path, ns: Option<&str>, threads: u32, seconds: f64, burst: Option<(u32, u32)>) -> Result<StormResult> {
    let out = workloads::run_ok(&mut storm_cmd(exe, ns, threads, seconds, burst))?;
    StormResult::parse(&String::from_utf8_lossy(&out.stdout))
}

/// Wall-clock seconds since the epoch.
pub fn wall() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Processes whose executable is `exe`, with their `OMPI_COMM_WORLD_RANK` (MPI ranks).
pub fn mpi_ranks(exe: &Path) -> Vec<(u32, u32)> {
    let Ok(exe) = exe.canonicalize() else { return Vec::new() };
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if std::fs::read_link(format!("/proc/{pid}/exe")).ok().as_deref() != Some(exe.as_path()) {
            continue;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let rank = env
            .split(|b| *b == 0)
            .filter_map(|kv| std::str::from_utf8(kv).ok())
            .find_map(|kv| kv.strip_prefix("OMPI_COMM_WORLD_RANK="))
            .and_then(|r| r.parse().ok());
        if let Some(r) = rank {
            v.push((r, pid));
        }
    }
    v.sort();
    v
}
