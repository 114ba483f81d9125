//! `cargo xtask bench shutdown [AGENT]`: SIGTERM to exit of the release agent (or `AGENT`)
//! with the probes of twenty libraries attached (copies of the NCCL-ABI test library,
//! preloaded from `library_dirs`), against the same agent with collective probes off,
//! rounds alternating. Target: under 2 s with the probes (a Kubernetes pod is killed at its
//! grace period; closing each probe link alone took 37 s here).

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use stepwise_tests::{
    harness::{wait_for, Agent},
    scenarios::median,
    workloads,
};

use super::tempdir;

const LIBRARIES: usize = 20;
const ROUNDS: usize = 3;
const TARGET_SECONDS: f64 = 2.0;

/// Starts an agent with `config`, waits until `ready` says its set-up is done, then times
/// SIGTERM to exit (seconds).
fn time_shutdown(dir: &Path, config: &str, ready: impl Fn(&Agent) -> bool) -> Result<f64> {
    let cfg = dir.join("agent.toml");
    std::fs::write(&cfg, config)?;
    let mut agent = Agent::start(dir, &["--config", cfg.to_str().context("utf8 path")?])?;
    wait_for(Duration::from_secs(120), "agent set up", || ready(&agent).then_some(()))?;
    // Settled: no attachment or first sweep still under way.
    std::thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    let code = agent.proc.terminate(Duration::from_secs(120));
    let took = t0.elapsed().as_secs_f64();
    if code != Some(0) {
        bail!("agent exited {code:?} after SIGTERM:\n{}", agent.proc.log_text());
    }
    Ok(took)
}

pub fn run(agent: Option<PathBuf>) -> Result<()> {
    if let Some(a) = agent {
        // SAFETY: set before any thread of this program reads the environment.
        unsafe { std::env::set_var("STEPWISE_AGENT_BIN", a) };
    }
    let dir = tempdir("bench-shutdown")?;
    let libs = workloads::nccl_library_copies(&dir, LIBRARIES)?;
    let dirs = libs.iter().map(|d| format!("{:?}", d.display().to_string())).collect::<Vec<_>>().join(", ");
    let common = "interval = \"1s\"\n[sources]\nrdma = false\nethtool = false\n";
    let probes_on = format!("{common}[collectives]\nlibrary_dirs = [{dirs}]\n");
    let probes_off = format!("{common}[collectives]\nenabled = false\n");
    let all_attached = |a: &Agent| {
        let log = a.proc.log_text();
        libs.iter().all(|d| log.contains(&format!("attached library={}/libnccl.so.2", d.display())))
    };
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        off.push(time_shutdown(&dir, &probes_off, |_| true)?);
        on.push(time_shutdown(&dir, &probes_on, all_attached)?);
        println!("round {round}: probes off {:.3} s, {LIBRARIES} libraries attached {:.3} s", off[round], on[round]);
    }
    let (m_on, m_off) = (median(on), median(off));
    println!(
        "shutdown (SIGTERM to exit, median of {ROUNDS}): {LIBRARIES} libraries attached {m_on:.3} s, probes off {m_off:.3} s (+{:.3} s for the probes); target < {TARGET_SECONDS} s",
        m_on - m_off
    );
    let _ = std::fs::remove_dir_all(&dir);
    if m_on >= TARGET_SECONDS {
        bail!("shutdown with {LIBRARIES} libraries attached took {m_on:.3} s (target < {TARGET_SECONDS} s)");
    }
    Ok(())
}
