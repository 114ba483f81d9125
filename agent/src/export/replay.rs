//! Many agents' APIs in one process: each [`AppState`] is served by the real [`router`] and
//! [`serve`] loop (the same handlers, bounds and serialisation as `agent run`) on its own
//! loopback port. With [`super::synthetic`] states this stands in for a cluster's agents
//! when testing or benchmarking `agent diagnose --peers` (tests/tests/cluster_scale.rs,
//! `cargo xtask bench cluster`).

use std::net::SocketAddr;

use super::api::{router, serve, AppState};

/// Agents being served; dropping it stops them (connections in progress get up to 5 s).
pub struct Agents {
    /// Each state's address, in the order given.
    pub addrs: Vec<SocketAddr>,
    stop: tokio::sync::watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Agents {
    /// Serves every state on `127.0.0.1:<free port>` from one runtime of `workers` threads
    /// (list pages are built on its blocking pool, as in the agent).
    pub fn serve(states: Vec<AppState>, workers: usize) -> std::io::Result<Agents> {
        let mut listeners = Vec::with_capacity(states.len());
        for _ in &states {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.set_nonblocking(true)?;
            listeners.push(l);
        }
        let addrs = listeners.iter().map(|l| l.local_addr()).collect::<std::io::Result<Vec<_>>>()?;
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(workers.max(1)).enable_all().build()?;
        let (stop, rx) = tokio::sync::watch::channel(false);
        // Listeners are converted inside the runtime (tokio needs its reactor for that).
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<std::io::Result<()>>();
        let thread = std::thread::Builder::new().name("replay-agents".into()).spawn(move || {
            rt.block_on(async move {
                let mut tasks = tokio::task::JoinSet::new();
                for (l, state) in listeners.into_iter().zip(states) {
                    match tokio::net::TcpListener::from_std(l) {
                        Ok(l) => {
                            tasks.spawn(serve(l, router(state), rx.clone()));
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    }
                }
                let _ = ready_tx.send(Ok(()));
                while tasks.join_next().await.is_some() {}
            })
        })?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Agents { addrs, stop, thread: Some(thread) }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(std::io::Error::other("the serving thread ended before listening")),
        }
    }
}

impl Drop for Agents {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A finished child process: its exit status, wall time and peak resident set.
#[derive(Debug)]
pub struct Measured {
    pub status: std::process::ExitStatus,
    pub seconds: f64,
    /// The child's own peak RSS, KiB (`ru_maxrss` of its `wait4`, as GNU time reports it).
    pub max_rss_kib: u64,
    pub stdout: String,
    pub stderr: String,
}

/// GNU time, which reports a child's `ru_maxrss` (Debian/Ubuntu package `time`).
pub const GNU_TIME: &str = "/usr/bin/time";

/// Runs `program args…` to completion under [`GNU_TIME`] (stdout and stderr through
/// temporary files, so a large output never blocks it) for its peak RSS.
///
/// Not `wait4` here: a child spawned from a large process (this one may hold 128 agents'
/// history) inherits that process's RSS high-water mark at `exec`, so its `ru_maxrss` is
/// never below ours. GNU time is small, and its own child starts from its small image.
pub fn run_measured(program: &std::path::Path, args: &[&str]) -> std::io::Result<Measured> {
    if !std::path::Path::new(GNU_TIME).exists() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{GNU_TIME} not found: install GNU time (apt package `time`; cargo xtask setup does)"),
        ));
    }
    let dir = tempfile_dir()?;
    let (out_p, err_p, rss_p) = (dir.join("stdout"), dir.join("stderr"), dir.join("maxrss"));
    let t = std::time::Instant::now();
    let status = std::process::Command::new(GNU_TIME)
        .args(["-f", "%M", "-o"])
        .arg(&rss_p)
        .arg(program)
        .args(args)
        .stdout(std::fs::File::create(&out_p)?)
        .stderr(std::fs::File::create(&err_p)?)
        .status()?;
    let seconds = t.elapsed().as_secs_f64();
    let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
    let (stdout, stderr, rss) = (read(&out_p), read(&err_p), read(&rss_p));
    let _ = std::fs::remove_dir_all(&dir);
    // The last line: GNU time writes "Command exited with non-zero status N" before it.
    let max_rss_kib = rss.lines().last().and_then(|l| l.trim().parse::<u64>().ok());
    let max_rss_kib = max_rss_kib.ok_or_else(|| std::io::Error::other(format!("{GNU_TIME} wrote no peak RSS: {rss:?}")))?;
    Ok(Measured { status, seconds, max_rss_kib, stdout, stderr })
}

/// A fresh private directory under the temporary directory.
fn tempfile_dir() -> std::io::Result<std::path::PathBuf> {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("stepwise-measured-{}-{n}", std::process::id()));
    std::fs::create_dir(&d)?;
    Ok(d)
}
