//! Real PyTorch for the gloo tests: a virtual environment with `torch` from PyPI under
//! `~/.cache/stepwise/torch`, made on first use and kept between runs.
//!
//! The PyPI wheel brings its CUDA libraries (the `nvidia-*` wheels, which `import torch`
//! loads even without a GPU): about 2.8 GB downloaded and 5.4 GB installed. gloo lives in
//! `torch/lib/libtorch_cpu.so`, which the agent probes like any other process's library.
//!
//! Test processes run in parallel (one per test binary, threads inside each): an exclusive
//! `flock` on `~/.cache/stepwise/torch.lock` lets one of them install while the others wait,
//! and the environment is built under `torch.partial` and renamed only once `torch` imports
//! with gloo, so a half-finished install (killed, out of disk) is never taken for a good one.

use std::{
    fs::File,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context, Result};

use crate::harness::{free_port, workspace_root, Proc};

/// The PyTorch release the tests were written against (gloo's symbols in
/// docs/platform-facts.md §4 were read from it).
pub const TORCH: &str = "torch==2.15.0";

/// `~/.cache/stepwise`.
fn cache_dir() -> PathBuf {
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/root"));
    home.join(".cache/stepwise")
}

/// The virtual environment's Python, with `torch` importable and gloo available; installs it
/// on first use (needs PyPI). Once per test process.
pub fn python() -> Result<PathBuf> {
    static PY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PY.get_or_init(|| python_in(&cache_dir()).map_err(|e| format!("{e:#}"))).clone().map_err(|e| anyhow!(e))
}

/// The gloo training-step workload (`tests/workloads/gloo/steps.py`).
pub fn steps_script() -> PathBuf {
    workspace_root().join("tests/workloads/gloo/steps.py")
}

/// The multi-group gloo workload (`tests/workloads/gloo/groups.py`).
pub fn groups_script() -> PathBuf {
    workspace_root().join("tests/workloads/gloo/groups.py")
}

/// `torch/lib` of the environment (holds `libtorch_cpu.so`, gloo's library): give it to the
/// agent as `[collectives] library_dirs` and it is probed before the job starts, so even the
/// first all_reduce is seen.
pub fn lib_dir() -> Result<PathBuf> {
    let py = python()?;
    let lib = py.parent().and_then(Path::parent).map(|v| v.join("lib")).ok_or_else(|| anyhow!("no venv above {}", py.display()))?;
    let found = std::fs::read_dir(&lib)?.flatten().map(|e| e.path().join("site-packages/torch/lib")).find(|p| p.join("libtorch_cpu.so").is_file());
    found.ok_or_else(|| anyhow!("no site-packages/torch/lib/libtorch_cpu.so under {}", lib.display()))
}

/// A job of `steps.py` ranks, one process each, killed on drop.
pub struct GlooJob {
    /// (rank, process): stdout and stderr in `<dir>/<name>-<rank>.log`.
    pub ranks: Vec<(u32, Proc)>,
}

impl GlooJob {
    /// Starts `n` ranks inside network namespace `ns` with the environment torchrun gives
    /// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and gloo on
    /// the namespace's loopback. `ip netns exec` and `env` exec: each process is the rank.
    pub fn start(ns: &str, dir: &Path, name: &str, n: u32, args: &[&str]) -> Result<GlooJob> {
        let ranks: Vec<(String, u32, Vec<String>)> = (0..n).map(|r| (ns.to_string(), r, vec!["GLOO_SOCKET_IFNAME=lo".to_string()])).collect();
        GlooJob::start_across(dir, name, "127.0.0.1", &ranks, args)
    }

    /// Starts one rank per `(namespace, rank, extra VAR=value environment)`, the rendezvous
    /// at `master` (rank 0's address): a job across namespace "servers", each rank's gloo
    /// pinned to its server's interface by `GLOO_SOCKET_IFNAME` in its environment.
    pub fn start_across(dir: &Path, name: &str, master: &str, ranks: &[(String, u32, Vec<String>)], args: &[&str]) -> Result<GlooJob> {
        GlooJob::start_script(&steps_script(), dir, name, master, ranks, args)
    }

    /// [`GlooJob::start_across`] of another workload script (e.g. [`groups_script`]).
    pub fn start_script(script: &Path, dir: &Path, name: &str, master: &str, ranks: &[(String, u32, Vec<String>)], args: &[&str]) -> Result<GlooJob> {
        let py = python()?;
        let port = free_port().to_string();
        let n = ranks.len();
        let mut out = Vec::new();
        for (ns, r, env) in ranks {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "env"])
                .arg(format!("RANK={r}"))
                .arg(format!("LOCAL_RANK={r}"))
                .arg(format!("WORLD_SIZE={n}"))
                .arg(format!("LOCAL_WORLD_SIZE={n}"))
                .arg(format!("MASTER_ADDR={master}"))
                .args([&format!("MASTER_PORT={port}"), "OMP_NUM_THREADS=1"])
                .args(env)
                .arg(&py)
                .args(["-W", "ignore::UserWarning"])
                .arg(script)
                .args(args);
            out.push((*r, Proc::spawn(&format!("{name} rank {r}"), &mut c, dir.join(format!("{name}-{r}.log")))?));
        }
        Ok(GlooJob { ranks: out })
    }

    /// Every rank's output so far, rank by rank.
    pub fn output(&self) -> String {
        self.ranks.iter().map(|(_, p)| p.log_text()).collect()
    }

    /// Waits up to `t` for every rank to exit 0; returns [`GlooJob::output`].
    pub fn wait(&mut self, t: Duration) -> Result<String> {
        let end = Instant::now() + t;
        for (r, p) in &mut self.ranks {
            loop {
                if let Some(st) = p.child.try_wait()? {
                    if !st.success() {
                        bail!("gloo rank {r} failed ({st}):\n{}", p.log_text());
                    }
                    break;
                }
                if Instant::now() > end {
                    bail!("gloo job still running after {t:?}; rank {r}:\n{}", p.log_text());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(self.output())
    }
}

fn usable(py: &Path) -> bool {
    py.is_file()
        && Command::new(py)
            .args(["-c", "import torch.distributed as d, sys; sys.exit(0 if d.is_gloo_available() else 1)"])
            .output()
            .is_ok_and(|o| o.status.success())
}

/// [`python`] with the cache directory given: `<cache>/torch`, built if missing.
pub fn python_in(cache: &Path) -> Result<PathBuf> {
    let venv = cache.join("torch");
    let py = venv.join("bin/python");
    std::fs::create_dir_all(cache).with_context(|| format!("create {}", cache.display()))?;
    let lock = File::create(cache.join("torch.lock")).context("torch.lock")?;
    // SAFETY: flock(2) on a descriptor we own; released when `lock` is closed.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        bail!("flock {}: {}", cache.join("torch.lock").display(), std::io::Error::last_os_error());
    }
    if usable(&py) {
        return Ok(py);
    }
    if venv.exists() {
        // Renamed into place only after it worked: something broke it since (a Python
        // upgrade). Start again.
        std::fs::remove_dir_all(&venv).with_context(|| format!("remove broken {}", venv.display()))?;
    }
    let t0 = Instant::now();
    install(cache, &venv)?;
    eprintln!("installed {TORCH} into {} in {:.0} s", venv.display(), t0.elapsed().as_secs_f64());
    Ok(py)
}

fn install(cache: &Path, venv: &Path) -> Result<()> {
    let partial = cache.join("torch.partial");
    if partial.exists() {
        std::fs::remove_dir_all(&partial).with_context(|| format!("remove {}", partial.display()))?;
    }
    let run = |cmd: &mut Command, what: &str| -> Result<()> {
        let out = cmd.output().with_context(|| format!("cannot run {cmd:?}"))?;
        if !out.status.success() {
            bail!("{what} failed ({}): {cmd:?}\n{}{}", out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    };
    run(Command::new("python3").args(["-m", "venv"]).arg(&partial), "python3 -m venv (Debian: apt-get install python3-venv)")?;
    let ppy = partial.join("bin/python");
    run(
        Command::new(&ppy).args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-cache-dir", TORCH]),
        &format!("pip install {TORCH} from PyPI (about 2.8 GB; needs network access to pypi.org and 6 GB of disk under {})", cache.display()),
    )?;
    if !usable(&ppy) {
        bail!("{TORCH} installed into {} but `import torch.distributed` with gloo fails", partial.display());
    }
    std::fs::rename(&partial, venv).with_context(|| format!("rename {} to {}", partial.display(), venv.display()))?;
    Ok(())
}
