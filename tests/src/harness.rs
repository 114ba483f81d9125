//! Processes for integration tests and benchmarks: the agent binary, a real Prometheus
//! server, and a minimal HTTP GET for loopback endpoints. Every process is killed on drop.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context, Result};

/// Workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The agent binary: `$STEPWISE_AGENT_BIN`, else `target/{release,debug}/agent` (the newer).
/// `cargo xtask test` builds it before the tests run.
pub fn agent_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("STEPWISE_AGENT_BIN") {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace_root().join("target"));
    let cands = [target.join("debug/agent"), target.join("release/agent")];
    let newest = cands.iter().filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p.clone()))).max_by_key(|(t, _)| *t).map(|(_, p)| p);
    newest.unwrap_or_else(|| panic!("agent binary not found in {}: run `cargo build -p agent` (cargo xtask test does)", target.display()))
}

/// How many bpf links of each type process `pid` holds, from its descriptors' fdinfo
/// (`link_type:` — `uprobe_multi`, `uretprobe_multi`, `perf`, …).
pub fn bpf_link_types(pid: u32) -> std::collections::BTreeMap<String, usize> {
    let mut types = std::collections::BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else { return types };
    for e in dir.flatten() {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        if let Some(t) = text.lines().find_map(|l| l.strip_prefix("link_type:")) {
            *types.entry(t.trim().to_string()).or_insert(0) += 1;
        }
    }
    types
}

/// A free TCP port on 127.0.0.1 (bound then released; good enough for tests).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("bind 127.0.0.1:0")
}

/// Response of [`http_get`].
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

/// Sends one HTTP/1.1 request to a loopback address and reads the whole response.
pub fn http_request(addr: &str, method: &str, path: &str, body: Option<&str>) -> Result<HttpResponse> {
    http_request_with(addr, method, path, &[], body)
}

/// [`http_request`] with extra header lines (`("Authorization", "Bearer …")`).
pub fn http_request_with(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: Option<&str>) -> Result<HttpResponse> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("connect {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let body = body.unwrap_or("");
    let extra: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\n\r\n",
        body.len()
    )?;
    // A server may answer before reading the body (a refused or oversized request) and close:
    // the rest of the body then meets a closed connection, as it would for any HTTP client,
    // and the answer already sent is still read below.
    match s.write_all(body.as_bytes()) {
        Err(e) if matches!(e.kind(), std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset) => {}
        r => r?,
    }
    let mut raw = Vec::new();
    if let Err(e) = s.read_to_end(&mut raw) {
        // A reset after the answer arrived (the server closed with our body unread).
        if raw.is_empty() || e.kind() != std::io::ErrorKind::ConnectionReset {
            return Err(e.into());
        }
    }
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = raw.split_once("\r\n\r\n").ok_or_else(|| anyhow!("malformed HTTP response: {raw:?}"))?;
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| anyhow!("no status in {head:?}"))?;
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(rest) } else { rest.to_string() };
    Ok(HttpResponse { status, headers: head.to_string(), body })
}

pub fn http_get(addr: &str, path: &str) -> Result<HttpResponse> {
    http_request(addr, "GET", path, None)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((len, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(len.trim(), 16) else { break };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Polls `f` until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> Result<T> {
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if Instant::now() > end {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A child process killed (and reaped) on drop.
pub struct Proc {
    pub child: Child,
    pub name: String,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(name: &str, cmd: &mut Command, log: PathBuf) -> Result<Proc> {
        let f = std::fs::File::create(&log)?;
        let child = cmd.stdin(Stdio::null()).stdout(f.try_clone()?).stderr(f).spawn().with_context(|| format!("cannot start {name}: {cmd:?}"))?;
        Ok(Proc { child, name: name.into(), log })
    }
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
    /// The process's log so far (for failure messages).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
    /// Whether it is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
    /// Sends SIGTERM and waits up to `t` for a clean exit; returns the exit code.
    pub fn terminate(&mut self, t: Duration) -> Option<i32> {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc_kill(self.child.id() as i32, 15) };
        let end = Instant::now() + t;
        while Instant::now() < end {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running agent on a loopback port.
pub struct Agent {
    pub proc: Proc,
    pub addr: String,
}

impl Agent {
    /// Starts `agent run` with extra args and waits until `/readyz` answers 200.
    pub fn start(dir: &Path, args: &[&str]) -> Result<Agent> {
        Agent::start_env(dir, args, &[])
    }

    /// [`Agent::start`] with extra environment variables.
    pub fn start_env(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Result<Agent> {
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(agent_bin());
        cmd.args(["run", "--listen", &addr]).args(args).env("STEPWISE_LOG", "info").envs(env.iter().copied());
        // Each test agent gets its own history and marker socket unless the test chose them
        // (flags, or the config file which the env defaults do not override).
        let config_sets = |key: &str| {
            args.iter()
                .position(|a| *a == "--config")
                .and_then(|i| args.get(i + 1))
                .and_then(|p| std::fs::read_to_string(p).ok())
                .is_some_and(|t| t.contains(key))
        };
        if !args.contains(&"--db") && !config_sets("[store]") {
            cmd.env("STEPWISE_DB", dir.join(format!("agent-{port}.db")));
        }
        if !args.contains(&"--marker-socket") && !config_sets("marker_socket") {
            cmd.env("STEPWISE_MARKER_SOCKET", dir.join(format!("markers-{port}.sock")));
        }
        // Likewise the profiler plugin's socket (agents on one host may not share it).
        if !args.contains(&"--profiler-socket") && !config_sets("profiler_socket") && !env.iter().any(|(k, _)| *k == "STEPWISE_PROFILER_SOCKET") {
            cmd.env("STEPWISE_PROFILER_SOCKET", dir.join(format!("profiler-{port}.sock")));
        }
        let proc = Proc::spawn("agent", &mut cmd, dir.join(format!("agent-{port}.log")))?;
        let mut a = Agent { proc, addr };
        let addr = a.addr.clone();
        wait_for(Duration::from_secs(20), "agent /readyz", || {
            if !a.proc.alive() {
                return Some(Err(anyhow!("agent exited early:\n{}", a.proc.log_text())));
            }
            match http_get(&addr, "/readyz") {
                Ok(r) if r.status == 200 => Some(Ok(())),
                _ => None,
            }
        })??;
        a.require_ebpf()?;
        Ok(a)
    }
    /// Fails unless this agent carries its eBPF programs. An agent built with
    /// AYA_BUILD_SKIP=1 starts and serves, but can never see a call: every probe test would
    /// then fail later with "no steps" instead of saying why.
    pub fn require_ebpf(&self) -> Result<()> {
        let status = self.status()?;
        if status["ebpf_embedded"] != serde_json::Value::Bool(true) {
            bail!(
                "the agent at {} has no eBPF programs (built with AYA_BUILD_SKIP=1?): rebuild it without the skip (`cargo xtask setup` installs bpf-linker); /api/v1/status: {status}",
                agent_bin().display()
            );
        }
        Ok(())
    }
    pub fn get(&self, path: &str) -> Result<HttpResponse> {
        http_get(&self.addr, path)
    }
    pub fn metrics(&self) -> Result<String> {
        Ok(self.get("/metrics")?.body)
    }
    pub fn status(&self) -> Result<serde_json::Value> {
        Ok(serde_json::from_str(&self.get("/api/v1/status")?.body)?)
    }
}

/// Value of the first sample of `name` whose labels contain all of `labels` (`k="v"` pairs),
/// parsed from Prometheus text.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    // Whole labels only: `rank="2"` must not match inside `local_rank="2"`.
    let has = |l: &str, k: &str, v: &str| l.split(',').any(|kv| kv.trim() == format!("{k}=\"{v}\""));
    samples(text, name).into_iter().find(|(l, _)| labels.iter().all(|(k, v)| has(l, k, v))).map(|(_, v)| v)
}

/// All samples of one metric name: (label text, value).
pub fn samples(text: &str, name: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (labels, value) = if let Some(r) = rest.strip_prefix('{') {
                let (lab, v) = r.split_once('}')?;
                (lab.to_string(), v)
            } else if rest.starts_with(' ') {
                (String::new(), rest)
            } else {
                return None;
            };
            Some((labels, value.split_whitespace().next()?.parse().ok()?))
        })
        .collect()
}

/// A real Prometheus server (Debian `prometheus`) scraping `targets` every 1 s.
pub struct Prometheus {
    pub proc: Proc,
    pub addr: String,
    _dir: PathBuf,
}

impl Prometheus {
    pub fn start(dir: &Path, targets: &[&str]) -> Result<Prometheus> {
        let list = targets.iter().map(|t| format!("'{t}'")).collect::<Vec<_>>().join(", ");
        let scrape = format!("  - job_name: stepwise\n    static_configs:\n      - targets: [{list}]\n        labels:\n          cluster: test\n");
        Prometheus::start_with(dir, &scrape)
    }

    /// Scraping with `scrape_configs` (the YAML list's items, or a JSON array), every 1 s
    /// unless a scrape config says otherwise.
    pub fn start_with(dir: &Path, scrape_configs: &str) -> Result<Prometheus> {
        let bin = which("prometheus").ok_or_else(|| anyhow!("prometheus not installed: run `cargo xtask setup` (apt package prometheus)"))?;
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let pdir = dir.join(format!("prometheus-{port}"));
        std::fs::create_dir_all(&pdir)?;
        let sep = if scrape_configs.trim_start().starts_with('[') { " " } else { "\n" };
        let cfg = format!("global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\nscrape_configs:{sep}{scrape_configs}");
        std::fs::write(pdir.join("prometheus.yml"), cfg)?;
        let mut cmd = Command::new(bin);
        cmd.arg(format!("--config.file={}", pdir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", pdir.join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn");
        let proc = Proc::spawn("prometheus", &mut cmd, pdir.join("prometheus.log"))?;
        let p = Prometheus { proc, addr, _dir: pdir };
        wait_for(Duration::from_secs(30), "prometheus /-/ready", || http_get(&p.addr, "/-/ready").ok().filter(|r| r.status == 200))?;
        Ok(p)
    }

    /// Instant query; returns `data.result`.
    pub fn query(&self, promql: &str) -> Result<Vec<serde_json::Value>> {
        let q: String =
            promql.bytes().map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") }).collect();
        let r = http_get(&self.addr, &format!("/api/v1/query?query={q}"))?;
        let v: serde_json::Value = serde_json::from_str(&r.body).with_context(|| format!("bad JSON from prometheus: {}", r.body))?;
        if v["status"] != "success" {
            bail!("query {promql:?} failed: {}", r.body);
        }
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// Waits until `promql` returns at least `n` series.
    pub fn wait_series(&self, promql: &str, n: usize, t: Duration) -> Result<Vec<serde_json::Value>> {
        wait_for(t, promql, || self.query(promql).ok().filter(|r| r.len() >= n))
    }
}

/// Value of a vector result element.
pub fn value_of(v: &serde_json::Value) -> f64 {
    v["value"][1].as_str().and_then(|s| s.parse().ok()).unwrap_or(f64::NAN)
}

/// Finds an executable on PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|f| f.is_file()))
}

/// CPU time (user + system) of a process in seconds, from /proc/<pid>/stat.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0) // USER_HZ is 100 on Linux
}

/// A `/proc/<pid>/status` field in KiB (e.g. `VmRSS`, `VmHWM`).
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

/// `docs/metrics.md`, the metrics reference.
pub fn metrics_reference() -> String {
    std::fs::read_to_string(workspace_root().join("docs/metrics.md")).expect("docs/metrics.md")
}
