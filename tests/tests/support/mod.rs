//! Shared by the deployment-facing tests (`capabilities`, `dashboards`): starting the agent
//! behind a command prefix (`setpriv …`, `ip netns exec …`, an `LD_PRELOAD`), and the
//! straggler scenario of `e2e_straggler.rs` with the same assertions, so a reduced-privilege
//! agent is held to exactly what the root one is.

#![allow(dead_code)] // each test binary uses its own part

pub mod hang;
pub mod straggler;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use stepwise_tests::harness::{agent_bin, free_port, http_get, wait_for, Agent, Proc};

/// How to start one agent.
#[derive(Default)]
pub struct Launch<'a> {
    /// Command and arguments put before the agent binary (empty: run it directly).
    pub prefix: Vec<String>,
    /// Extra environment.
    pub env: Vec<(&'a str, String)>,
    /// Address to listen on (default: a free 127.0.0.1 port).
    pub listen: Option<String>,
    /// Address the readiness probe and the test use (default: `listen`).
    pub reach: Option<String>,
}

/// The process outcome of an agent that was expected to refuse to start.
pub struct Refusal {
    pub code: Option<i32>,
    pub stderr: String,
}

fn command(l: &Launch, listen: &str, args: &[&str]) -> Command {
    let mut cmd = match l.prefix.split_first() {
        Some((p, rest)) => {
            let mut c = Command::new(p);
            c.args(rest).arg(agent_bin());
            c
        }
        None => Command::new(agent_bin()),
    };
    cmd.args(["run", "--listen", listen]).args(args).env("STEPWISE_LOG", "info");
    // Agents on one host may not share the profiler plugin's socket.
    if !args.contains(&"--profiler-socket") {
        cmd.env("STEPWISE_PROFILER_SOCKET", std::env::temp_dir().join(format!("stepwise-profiler-{}.sock", listen.replace([':', '.'], "_"))));
    }
    for (k, v) in &l.env {
        cmd.env(k, v);
    }
    cmd
}

/// Starts `agent run ARGS` as `l` says and waits until `/readyz` answers 200 (20 s).
pub fn start(dir: &Path, l: &Launch, args: &[&str]) -> Agent {
    let listen = l.listen.clone().unwrap_or_else(|| format!("127.0.0.1:{}", free_port()));
    let reach = l.reach.clone().unwrap_or_else(|| listen.clone());
    let log = dir.join(format!("agent-{}.log", reach.replace([':', '.'], "_")));
    let proc = Proc::spawn("agent", &mut command(l, &listen, args), log).expect("spawn agent");
    let mut a = Agent { proc, addr: reach.clone() };
    let ready = wait_for(Duration::from_secs(20), "agent /readyz", || {
        if !a.proc.alive() {
            return Some(Err(a.proc.log_text()));
        }
        http_get(&reach, "/readyz").ok().filter(|r| r.status == 200).map(|_| Ok(()))
    });
    match ready {
        Ok(Ok(())) => {
            a.require_ebpf().unwrap_or_else(|e| panic!("{e}"));
            a
        }
        Ok(Err(log)) => panic!("agent exited early:\n{log}"),
        Err(e) => panic!("{e}:\n{}", a.proc.log_text()),
    }
}

/// Runs `agent run ARGS` as `l` says, expecting it to exit by itself within 20 s.
pub fn refused(dir: &Path, l: &Launch, args: &[&str]) -> Refusal {
    let listen = format!("127.0.0.1:{}", free_port());
    let log = dir.join(format!("refused-{}.log", listen.replace([':', '.'], "_")));
    let mut cmd = command(l, &listen, args);
    // Never the system paths, should it start after all.
    cmd.env("STEPWISE_DB", dir.join("refused.db")).env("STEPWISE_MARKER_SOCKET", dir.join("refused.sock"));
    let mut p = Proc::spawn("agent", &mut cmd, log).expect("spawn agent");
    let st = wait_for(Duration::from_secs(20), "agent to exit", || p.child.try_wait().ok().flatten());
    match st {
        Ok(st) => Refusal { code: st.code(), stderr: p.log_text() },
        Err(_) => panic!("the agent did not refuse to start; it is still running:\n{}", p.log_text()),
    }
}

/// `CapEff` of a process, from /proc/<pid>/status.
pub fn cap_eff(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = s.lines().find(|l| l.starts_with("CapEff:")).expect("CapEff line");
    u64::from_str_radix(line.trim_start_matches("CapEff:").trim(), 16).expect("hex mask")
}

/// Linux capability numbers (include/uapi/linux/capability.h) of the names the deployment uses.
pub fn cap_number(name: &str) -> u32 {
    match name.trim_start_matches("CAP_") {
        "DAC_OVERRIDE" => 1,
        "DAC_READ_SEARCH" => 2,
        "NET_ADMIN" => 12,
        "SYS_PTRACE" => 19,
        "SYS_ADMIN" => 21,
        "PERFMON" => 38,
        "BPF" => 39,
        other => panic!("capability {other} not in the test's table"),
    }
}

/// `setpriv` arguments that keep uid 0 but leave exactly `caps` (names as in a Kubernetes
/// securityContext: `BPF`, `SYS_PTRACE`) in every set: bounding, inheritable, ambient, and so
/// permitted and effective after exec.
pub fn setpriv_prefix(caps: &[String]) -> Vec<String> {
    let list: String = std::iter::once("-all".to_string()).chain(caps.iter().map(|c| format!("+{}", c.to_ascii_lowercase()))).collect::<Vec<_>>().join(",");
    vec!["setpriv".into(), format!("--inh-caps={list}"), format!("--ambient-caps={list}"), format!("--bounding-set={list}"), "--".into()]
}

/// The `capabilities.add` list of the container in deploy/kubernetes/daemonset.yaml, read
/// from the file users apply (list items only; comments skipped).
pub fn daemonset_caps() -> Vec<String> {
    let path: PathBuf = stepwise_tests::harness::workspace_root().join("deploy/kubernetes/daemonset.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines = text.lines().skip_while(|l| l.trim() != "add:").skip(1);
    let mut caps = Vec::new();
    for l in lines.by_ref() {
        let t = l.trim();
        if t.starts_with('#') || t.is_empty() {
            continue;
        }
        match t.strip_prefix("- ") {
            Some(c) => caps.push(c.trim_matches('"').to_string()),
            None => break,
        }
    }
    assert!(!caps.is_empty(), "no capabilities.add list found in {}", path.display());
    caps
}
