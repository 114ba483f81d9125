//! `cargo xtask bench plugin`: first the callbacks' cost per collective
//! (`nccl-profiler/examples/bench_plugin.rs`, with the chained test plugin of the NCCL-ABI
//! library for the chaining figures), then the step-time overhead of the profiler plugin on
//! the asynchronous NCCL-ABI workload (`nccl_steps`, calls return at enqueue, a simulated
//! stream per communicator), without `NCCL_PROFILER_PLUGIN`, with it, and with a plugin
//! chained behind it (`STEPWISE_PROFILER_CHAIN`), rounds alternating so that drift on this
//! machine falls on every arm alike.
//!
//! The plugin reports to a receiver socket drained by a thread of this program in both arms,
//! so the records really leave the process (a plugin with no receiver only counts them as
//! unsent, which would be cheaper than in a job with an agent).

use std::{
    os::unix::net::UnixDatagram,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc,
    },
    time::Duration,
};

use anyhow::{bail, Context, Result};
use stepwise_tests::scenarios::median;

use super::{cargo, root, sh, tempdir};

const RANKS: u32 = 2;
const ROUNDS: usize = 5;
const STEPS: &str = "300";

/// The release plugin under the name jobs load (cargo cannot emit the hyphenated name).
fn release_plugin(dir: &Path) -> Result<PathBuf> {
    sh(cargo().args(["build", "--release", "-p", "nccl-profiler"]))?;
    let dst = dir.join("libnccl-profiler-stepwise.so");
    std::fs::copy(root().join("target/release/libnccl_profiler.so"), &dst).context("copy the plugin")?;
    Ok(dst)
}

/// The callback benchmark, with the release cdylib and the chained test plugin (`CHAINTEST_MASK`
/// unset in the job arm: Coll | KernelCh, as Inspector asks).
pub fn callbacks() -> Result<()> {
    sh(cargo().args(["build", "--release", "-p", "nccl-profiler"]))?;
    let chained = stepwise_tests::workloads::build()?.join("libnccl-profiler-chaintest.so");
    let cdylib = root().join("target/release/libnccl_profiler.so");
    sh(cargo().args(["run", "--release", "-p", "nccl-profiler", "--example", "bench_plugin", "--", "--chain"]).arg(&chained).arg("--cdylib").arg(&cdylib))
}

/// Binds the receiver and drains it on a thread; the count of datagrams it received.
fn receiver(sock: &Path) -> Result<Arc<AtomicU64>> {
    let rx = UnixDatagram::bind(sock).with_context(|| format!("bind {}", sock.display()))?;
    let got = Arc::new(AtomicU64::new(0));
    let g = got.clone();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        loop {
            if rx.recv(&mut buf).is_ok() {
                g.fetch_add(1, Relaxed);
            }
        }
    });
    Ok(got)
}

/// One run of the job: the mean over ranks of each rank's median step time (µs).
fn run_job(bin: &Path, dir: &Path, sock: &Path, plugin: Option<&Path>, chain: Option<&Path>) -> Result<f64> {
    let id = dir.join("job.id");
    let _ = std::fs::remove_file(&id);
    let mut kids = Vec::new();
    for r in 0..RANKS {
        let mut c = Command::new(bin);
        c.env_remove("CUDA_LAUNCH_BLOCKING").env("STEPS_COMPUTE", "sleep").env("STEPWISE_PROFILER_SOCKET", sock);
        c.env("NCCL_PROFILER_PLUGIN", plugin.map_or_else(|| "none".into(), |p| p.as_os_str().to_owned()));
        c.env_remove("CHAINTEST_MASK").env_remove("CHAINTEST_OUT").env_remove("STEPWISE_PROFILER_CHAIN");
        if let Some(ch) = chain {
            c.env("STEPWISE_PROFILER_CHAIN", ch);
        }
        c.args(["--rank", &r.to_string(), "--nranks", &RANKS.to_string(), "--id-file"]).arg(&id);
        c.args(["--steps", STEPS, "--bytes", "262144", "--compute-us", "3000", "--gpu-compute-ms", "2"]);
        kids.push(c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().context("start nccl_steps")?);
    }
    let mut medians = Vec::new();
    for k in kids {
        let out = k.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!("nccl_steps failed ({}):\n{text}{}", out.status, String::from_utf8_lossy(&out.stderr));
        }
        let median = text
            .lines()
            .filter(|l| l.starts_with("summary "))
            .flat_map(|l| l.split_whitespace())
            .find_map(|t| t.strip_prefix("step_us_median=").and_then(|v| v.parse::<f64>().ok()))
            .context("no step_us_median in nccl_steps' summary")?;
        medians.push(median);
    }
    Ok(medians.iter().sum::<f64>() / medians.len() as f64)
}

/// Alternating rounds without and with the plugin; prints both, the overhead and the
/// run-to-run spread of the rounds without it.
pub fn step_overhead() -> Result<()> {
    let dir = tempdir("bench-plugin-steps")?;
    let bin = stepwise_tests::workloads::build()?.join("nccl_steps");
    let plugin = release_plugin(&dir)?;
    let chained = stepwise_tests::workloads::build()?.join("libnccl-profiler-chaintest.so");
    let sock = dir.join("profiler.sock");
    let got = receiver(&sock)?;
    let (mut off, mut on, mut both) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        off.push(run_job(&bin, &dir, &sock, None, None)?);
        on.push(run_job(&bin, &dir, &sock, Some(&plugin), None)?);
        both.push(run_job(&bin, &dir, &sock, Some(&plugin), Some(&chained))?);
    }
    std::thread::sleep(Duration::from_millis(200));
    let received = got.load(Relaxed);
    if received == 0 {
        bail!("the plugin sent nothing to {}: it did not load, the overhead would be meaningless", sock.display());
    }
    let spread = |v: &[f64]| (v.iter().copied().fold(f64::MIN, f64::max) - v.iter().copied().fold(f64::MAX, f64::min)) / median(v.to_vec());
    let (m_off, m_on, m_both) = (median(off.clone()), median(on.clone()), median(both.clone()));
    let fmt = |v: &[f64]| v.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(" ");
    println!(
        "step time of the asynchronous NCCL-ABI job ({RANKS} ranks × {STEPS} steps, 256 KiB all-reduce, 2 ms GPU + 3 ms host compute), median µs per round:"
    );
    println!("  without the plugin: {}  (median {m_off:.0}, spread {:.2} %)", fmt(&off), spread(&off) * 100.0);
    println!("  with the plugin:    {}  (median {m_on:.0}, spread {:.2} %)", fmt(&on), spread(&on) * 100.0);
    println!("  with a chained one: {}  (median {m_both:.0}, spread {:.2} %)", fmt(&both), spread(&both) * 100.0);
    let overhead = m_on / m_off - 1.0;
    let verdict = if overhead.abs() <= spread(&off) { "within" } else { "outside" };
    println!("  step-time overhead {:+.2} % ({verdict} the run-to-run spread without it); {received} datagrams received", overhead * 100.0);
    println!("  chaining adds {:+.2} % to the step time with the plugin (the chained test plugin's own work included)", (m_both / m_on - 1.0) * 100.0);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
