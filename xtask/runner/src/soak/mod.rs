//! `cargo xtask soak [--minutes N] [--debug] [--no-attack]`: the agent (release build unless `--debug`:
//! the memory bound is the shipped binary's) under a continuous real workload for N minutes
//! (default `$STEPWISE_SOAK_MINUTES`, else 10):
//!
//! - back-to-back `nccl_steps` jobs (2 ranks, markers) and every fourth job a 4-rank OpenMPI
//!   `mpi_steps` job, in a network namespace the agent's probes select; the OpenMPI jobs are
//!   slow but progressing — step times from 0.3 to 0.9 s (3×), ranks up to 0.6 s apart — and
//!   the `[hang]` rule of `tests/tests/e2e_hang.rs` (2 s floor, 5 × the median) must never
//!   suspect them (the long false-positive run of issue 15);
//! - an event storm every minute (4 threads calling probed NCCL-ABI entry points for 3 s,
//!   overflowing the probe ring);
//! - the sysfs scenario writer playing 4 RDMA NICs with traffic, a counter reset every 30 s
//!   and a NIC that vanishes and comes back every 50 s;
//! - every minute from 40 s on (unless `--no-attack`), the attacks of `soak/attack.rs` (a
//!   marker flood over 10^6 ranks, 300 idle connections, 10 parallel marker listings) with
//!   `/metrics` scraped throughout, every scrape under a second. RSS counts during the
//!   attacks; the descriptor bounds skip the rows sampled while a round holds its 300
//!   connections. (Until the list pages stopped going through `serde_json::Value` trees, RSS
//!   peaked at 87.4 MiB in them, rising round after round; a 4-minute run now peaks at
//!   47.8 MiB.)
//! - a small history budget (`[store] max_bytes` 2 MiB, `max_age` 2 min, retention every
//!   20 s), so retention runs many times, and an in-memory call history (`[collectives]
//!   history`) of 4 096 calls, which the jobs fill within the first minutes: the second half
//!   of the run then shows whether memory stays flat at the bounds (with the default 65 536
//!   the agent's anonymous memory grew by about the rings' full size, 14 MiB, over 10 minutes
//!   here: the two halves compared rings still filling).
//!
//! Every 10 s it samples the agent's RSS, CPU %, open descriptors (one reading, and the floor
//! of seven over the last 3 s, which the sampled-probe windows do not lift) and SQLite file
//! sizes and prints a row; at the end it asserts the bounds: RSS ≤ 64 MiB and not growing, descriptors
//! stable, the database within its budget, the store intact, the agent healthy and still
//! sampling, jobs attributed and storms counted as drops.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

mod attack;

use anyhow::{bail, Context, Result};
use stepwise_tests::{
    faults::{build_storm, metric_sum, storm_cmd, AgentSpec, FaultAgent, ProcStats},
    harness::Proc,
    netns::Netns,
    scenario::Scenario,
    workloads,
};

/// Resident memory bound (MiB).
const MAX_RSS_MIB: f64 = 64.0;
/// `[collectives] history` of the soak (calls and network requests kept in memory). The jobs
/// make about 1 400 collective calls a minute (~63 two-rank jobs of 100 steps and ~21
/// four-rank OpenMPI jobs of 20 in 10 minutes): 16 384 took the whole run to fill, so the
/// second half's RSS still grew by design (CI, 3 December: first-half peak 49.1 MiB, second
/// 62.2).
const SOAK_HISTORY: usize = 4096;
/// `[steps] counter_samples` of the soak: 1024 sweeps of 100 ms fill within the first two
/// minutes. With the default 4096 the per-NIC counter logs filled for 410 s, most of the run:
/// heaptrack on a 4-minute soak put 5.4 MB still held at exit in `CounterLog::push`, the
/// largest holder, and the 10-minute CI soak's RSS grew 49.1 -> 62.2 MiB between its halves.
const SOAK_COUNTER_SAMPLES: usize = 1024;
/// `[store] max_bytes` of the soak.
const STORE_MAX_BYTES: u64 = 2 << 20;
/// What the database may hold beyond `max_bytes`: retention runs within a second of the file
/// passing it (and deletes down to 90 %), so about a second of steps.
const STORE_SLACK_BYTES: u64 = 256 << 10;
/// The WAL: SQLite checkpoints it at ~1000 pages, retention truncates it.
const WAL_MAX_BYTES: u64 = 6 << 20;
/// Open descriptors: the typical level (median of the rows' floors, [`fd_floor`]) of the last
/// quarter may exceed the second quarter's by this much — a leak grows it, transients do not.
/// It moves with the fixture (a vanished NIC's ~60 counter files are closed); the sampled
/// windows' links and API connections come and go: a single reading may exceed the first
/// half's peak by `FD_TRANSIENT`.
const FD_SLACK: usize = 8;
const FD_TRANSIENT: usize = 24;
/// A row's descriptor floor is the least of `FD_READS` readings spread over `FD_SPAN` at the
/// end of its period. A sampled-probe window (`[collectives] sample_window` 200 ms every
/// `sample_every` 10 s, the defaults) holds 12 more uprobe links for about 1.5 s here: ~0.1 s
/// to attach them, the 200 ms window, then ~0.12 s per link to detach. A single reading every
/// 10 s stays in phase with those windows for minutes: a CI soak (5 December) read 325 for
/// four minutes, then 337 for five, and failed the +8 bound with no descriptor leaked (a
/// monitor reading every 5 s saw the links come and go and the level stay at 327).
const FD_READS: u32 = 7;
const FD_SPAN: Duration = Duration::from_secs(3);
/// Sampling period of the table.
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// RLIMIT_NOFILE (soft and hard) the soak's agent runs under: the common default.
const NOFILE_LIMIT: u64 = 1024;

struct Row {
    t: f64,
    stats: ProcStats,
    /// The descriptors' floor over the last `FD_SPAN` ([`fd_floor`]) and their kinds then
    /// ([`fd_kinds`]), to name what grew.
    fd_floor: usize,
    fd_kinds: BTreeMap<String, usize>,
    cpu_pct: f64,
    db: u64,
    wal: u64,
    sweeps: u64,
    steps: f64,
    jobs: u64,
    drops: f64,
    /// An attack round was under way while this row was sampled.
    attacking: bool,
}

/// The agent's open descriptors counted by what they point at: `socket`, `pipe`, an
/// `anon_inode:` kind (`bpf-link`, `bpf-map`, `[perf_event]`, `[eventpoll]` …) or, for a file,
/// its directory with the run's temporary directory written `$TMP`.
fn fd_kinds(pid: u32, tmp: &Path) -> BTreeMap<String, usize> {
    let mut kinds = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return kinds };
    for e in dir.flatten() {
        let Ok(target) = std::fs::read_link(e.path()) else { continue };
        let t = target.to_string_lossy();
        let kind = match t.split_once(":[") {
            Some((k, _)) if !t.starts_with('/') => k.to_string(),
            _ if t.starts_with('/') => {
                let parent = target.parent().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
                parent.replace(&*tmp.to_string_lossy(), "$TMP")
            }
            _ => t.into_owned(),
        };
        *kinds.entry(kind).or_insert(0) += 1;
    }
    kinds
}

/// The least of `FD_READS` readings of the agent's descriptors over `FD_SPAN` (sleeps that
/// long), with the kinds of that reading.
fn fd_floor(pid: u32, tmp: &Path) -> (usize, BTreeMap<String, usize>) {
    let mut best: Option<(usize, BTreeMap<String, usize>)> = None;
    for i in 0..FD_READS {
        if i > 0 {
            std::thread::sleep(FD_SPAN / (FD_READS - 1));
        }
        let kinds = fd_kinds(pid, tmp);
        let n = kinds.values().sum();
        if best.as_ref().is_none_or(|(b, _)| n < *b) {
            best = Some((n, kinds));
        }
    }
    best.unwrap_or_default()
}

/// The kinds whose median count differs between two sets of rows: `kind: a -> b`.
fn fd_kind_growth(a: &[&Row], b: &[&Row]) -> Vec<String> {
    let median = |rows: &[&Row], k: &str| {
        let mut v: Vec<usize> = rows.iter().map(|r| r.fd_kinds.get(k).copied().unwrap_or(0)).collect();
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    };
    let keys: std::collections::BTreeSet<&String> = a.iter().chain(b).flat_map(|r| r.fd_kinds.keys()).collect();
    keys.into_iter()
        .filter_map(|k| {
            let (x, y) = (median(a, k), median(b, k));
            (x != y).then(|| format!("{k}: {x} -> {y}"))
        })
        .collect()
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

fn wal_of(db: &Path) -> PathBuf {
    let mut s = db.as_os_str().to_owned();
    s.push("-wal");
    PathBuf::from(s)
}

/// Minutes from `--minutes N`, else `$STEPWISE_SOAK_MINUTES`, else `default`.
pub fn minutes(args: &[String], default: f64) -> Result<f64> {
    let from_env = std::env::var("STEPWISE_SOAK_MINUTES").ok();
    let given = args.iter().position(|a| a == "--minutes").map(|i| args.get(i + 1).cloned().context("--minutes needs a value")).transpose()?;
    let m = match given.or(from_env) {
        Some(v) => v.parse::<f64>().with_context(|| format!("minutes {v:?} is not a number"))?,
        None => default,
    };
    if !(m > 0.0 && m.is_finite()) {
        bail!("minutes must be > 0");
    }
    Ok(m)
}

pub fn soak(args: &[String]) -> Result<()> {
    if let Some(a) = args.iter().find(|a| !["--minutes", "--debug", "--no-attack"].contains(&a.as_str()) && a.parse::<f64>().is_err()) {
        bail!("unknown argument {a:?}: usage: cargo xtask soak [--minutes N] [--debug] [--no-attack]");
    }
    let attack = !args.iter().any(|a| a == "--no-attack");
    let minutes = minutes(args, 10.0)?;
    let release = !args.iter().any(|a| a == "--debug");
    let mut build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    build.current_dir(crate::tasks::root()).args(["build", "-p", "agent", "--bin", "agent"]);
    if release {
        build.arg("--release");
    }
    crate::tasks::sh(&mut build)?;
    let bin = crate::tasks::root().join("target").join(if release { "release" } else { "debug" }).join("agent");
    std::env::set_var("STEPWISE_AGENT_BIN", &bin);
    run(minutes, attack)
}

/// The soak itself (the agent binary is `$STEPWISE_AGENT_BIN` or the newest build).
pub fn run(minutes: f64, attack: bool) -> Result<()> {
    let lib = workloads::build()?;
    let tmp = tempfile_dir()?;
    let dir = tmp.path();
    let ns = Netns::new().context("network namespace for the jobs (needs root)")?;
    let (storm, storm_lib) = build_storm(dir)?;

    // The RDMA fixture and its writer.
    let sys = dir.join("sys");
    let sc = Arc::new(Mutex::new(Scenario::new(&sys).host_dgx(4)));
    sc.lock().map_err(|_| anyhow::anyhow!("scenario lock"))?.write()?;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (sc, stop) = (sc.clone(), stop.clone());
        std::thread::spawn(move || -> Result<()> {
            let start = Instant::now();
            let (mut next_reset, mut next_vanish, mut back_at) = (30.0, 50.0, f64::INFINITY);
            let mut k = 0usize;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
                let t = start.elapsed().as_secs_f64();
                let mut s = sc.lock().map_err(|_| anyhow::anyhow!("scenario lock"))?;
                if t >= next_reset {
                    s.nic_mut(k % 4).reset();
                    next_reset += 30.0;
                    k += 1;
                }
                if t >= next_vanish {
                    s.nic_mut(3).vanish();
                    next_vanish += 50.0;
                    back_at = t + 10.0;
                }
                if t >= back_at {
                    s.nic_mut(3).reappear().reset();
                    back_at = f64::INFINITY;
                }
                s.step(Duration::from_millis(50), |n| {
                    let r = n.line_rate();
                    n.tx_rate(0.3 * r).rx_rate(0.3 * r).out_of_buffer(3).ecn(5);
                })?;
            }
            Ok(())
        })
    };

    let db = dir.join("agent.db");
    let config = format!(
        "interval = \"100ms\"\n[sources]\nethtool = false\n[collectives]\nhistory = {SOAK_HISTORY}\nlibrary_dirs = [\"{}\", \"{}\", \"/usr/lib/x86_64-linux-gnu\"]\n[collectives.select]\nnetns = \"/run/netns/{}\"\n[store]\nmax_bytes = {STORE_MAX_BYTES}\nmax_age = \"2m\"\nretention_interval = \"20s\"\n[hang]\nfloor = \"2s\"\nk = 5\nclear_after = \"2s\"\n[steps]\ncounter_samples = {SOAK_COUNTER_SAMPLES}\n",
        lib.display(),
        storm_lib.display(),
        ns.name()
    );
    // Under the common descriptor limit of 1 024 (soft and hard): the agent, its RDMA
    // counter files and the attacks' 300 connections must fit (issue 38).
    let spec = AgentSpec {
        config,
        log_env: Some("warn".into()),
        args: vec!["--sysfs-root".into(), sys.display().to_string()],
        nofile: Some(NOFILE_LIMIT),
        ..Default::default()
    };
    let mut agent = FaultAgent::start(dir, &spec)?;
    let sock = agent.sock.clone();

    // Jobs back to back.
    let jobs = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let jobs_thread = {
        let (stop, jobs, failed, dir, ns_name, lib, sock) =
            (stop.clone(), jobs.clone(), failed.clone(), dir.to_path_buf(), ns.name().to_string(), lib.clone(), sock.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let ok = if n % 4 == 3 { mpi_job(&ns_name, &sock, &stop) } else { nccl_job(&ns_name, &dir, &lib, &sock, n, &stop) };
                n += 1;
                match ok {
                    Ok(true) => jobs.fetch_add(1, Ordering::Relaxed),
                    Ok(false) => 0, // stopped
                    Err(e) => {
                        eprintln!("soak: job {n} failed: {e:#}");
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        })
    };
    // A storm every minute.
    let storms = Arc::new(AtomicU64::new(0));
    let storm_thread = {
        let (stop, storms, ns_name) = (stop.clone(), storms.clone(), ns.name().to_string());
        std::thread::spawn(move || {
            let mut next = Instant::now() + Duration::from_secs(20);
            while !stop.load(Ordering::Relaxed) {
                if Instant::now() >= next {
                    if storm_cmd(&storm, Some(&ns_name), 4, 3.0, None).output().is_ok_and(|o| o.status.success()) {
                        storms.fetch_add(1, Ordering::Relaxed);
                    }
                    next += Duration::from_secs(60);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };

    let target = attack::Target {
        addr: agent.addr.clone(),
        marker_socket: sock.clone(),
        profiler_socket: FaultAgent::profiler_socket(dir, &spec),
        config: agent.config.clone(),
        dir: dir.to_path_buf(),
    };
    let attacker = attack.then(|| attack::spawn(target, stop.clone()));

    // The table.
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(minutes * 60.0);
    let mut rows: Vec<Row> = Vec::new();
    let mut last_cpu = (Instant::now(), agent.stats().cpu_seconds);
    println!("soak: {minutes} min, agent pid {}, store {}, log {}", agent.pid(), db.display(), agent.proc.log.display());
    println!(
        "{:>6} {:>8} {:>8} {:>8} {:>6} {:>5} {:>5} {:>8} {:>8} {:>8} {:>7} {:>5} {:>9}",
        "t_s", "rss_MiB", "anon_MiB", "hwm_MiB", "cpu_%", "fds", "fd_lo", "db_KiB", "wal_KiB", "sweeps", "steps", "jobs", "drops"
    );
    let mut problems: Vec<String> = Vec::new();
    while Instant::now() < end {
        let period = SAMPLE_EVERY.min(end.saturating_duration_since(Instant::now())).max(FD_SPAN);
        std::thread::sleep(period - FD_SPAN);
        let attacking = attack::active();
        let (floor, kinds) = fd_floor(agent.pid(), dir);
        if !agent.proc.alive() {
            problems.push(format!("the agent died:\n{}", agent.proc.log_text()));
            break;
        }
        let stats = agent.stats();
        let now = Instant::now();
        let cpu_pct = 100.0 * (stats.cpu_seconds - last_cpu.1) / now.duration_since(last_cpu.0).as_secs_f64().max(1e-3);
        last_cpu = (now, stats.cpu_seconds);
        let m = agent.metrics().unwrap_or_default();
        let row = Row {
            t: started.elapsed().as_secs_f64(),
            fd_floor: floor,
            fd_kinds: kinds,
            stats,
            cpu_pct,
            db: file_len(&db),
            wal: file_len(&wal_of(&db)),
            sweeps: agent.sweeps().unwrap_or(0),
            steps: metric_sum(&m, "stepwise_steps_total", &[]),
            jobs: jobs.load(Ordering::Relaxed),
            drops: metric_sum(&m, "stepwise_probe_drops_total", &[]),
            attacking: attacking || attack::active(),
        };
        println!(
            "{:>6.0} {:>8.1} {:>8.1} {:>8.1} {:>6.1} {:>5} {:>5} {:>8} {:>8} {:>8} {:>7} {:>5} {:>9}",
            row.t,
            row.stats.rss_kib as f64 / 1024.0,
            row.stats.anon_kib as f64 / 1024.0,
            row.stats.hwm_kib as f64 / 1024.0,
            row.cpu_pct,
            row.stats.fds,
            row.fd_floor,
            row.db / 1024,
            row.wal / 1024,
            row.sweeps,
            row.steps,
            row.jobs,
            row.drops
        );
        rows.push(row);
    }
    stop.store(true, Ordering::Relaxed);
    let _ = jobs_thread.join();
    let _ = storm_thread.join();
    let attacks = attacker.map(|a| a.join().unwrap_or_default());
    match writer.join() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => problems.push(format!("scenario writer: {e:#}")),
        Err(_) => problems.push("scenario writer panicked".into()),
    }

    // The bounds.
    let n = rows.len();
    if n < 3 {
        problems.push(format!("only {n} samples"));
    } else {
        let rss_max = rows.iter().map(|r| r.stats.rss_kib).max().unwrap_or(0) as f64 / 1024.0;
        let hwm = rows.last().map(|r| r.stats.hwm_kib).unwrap_or(0) as f64 / 1024.0;
        if rss_max > MAX_RSS_MIB {
            problems.push(format!("RSS peaked at {rss_max:.1} MiB > {MAX_RSS_MIB} MiB"));
        }
        // Growth: the second half's peak against the first half's (after one sample of warm-up).
        let half = n / 2;
        let first = rows[1..half.max(2)].iter().map(|r| r.stats.rss_kib).max().unwrap_or(0) as f64 / 1024.0;
        let second = rows[half..].iter().map(|r| r.stats.rss_kib).max().unwrap_or(0) as f64 / 1024.0;
        if second > first * 1.15 + 4.0 {
            problems.push(format!("RSS grows: first half peak {first:.1} MiB, second half {second:.1} MiB"));
        }
        // Descriptors: rows sampled during an attack round carry its connections; skip them.
        let fds = |rs: &[Row]| rs.iter().filter(|r| !r.attacking).map(|r| r.stats.fds).collect::<Vec<usize>>();
        let floors = |rs: &[Row]| rs.iter().filter(|r| !r.attacking).map(|r| r.fd_floor).collect::<Vec<usize>>();
        let fd_first = fds(&rows[1..half.max(2)]).into_iter().max().unwrap_or(0);
        let fd_second = fds(&rows[half..]).into_iter().max().unwrap_or(0);
        let fd_min = floors(&rows[1..]).into_iter().min().unwrap_or(0);
        let median = |rs: &[Row]| {
            let mut v = floors(rs);
            v.sort_unstable();
            v.get(v.len() / 2).copied().unwrap_or(0)
        };
        // The baseline is the higher of the first two quarters' medians: a steady leak raises
        // the second over the first, so this is as strict as the second quarter alone, while a
        // dip in it (a 10-minute CI run sat at 348 from 160 to 270 s between 360s, ending at
        // 362) is not taken for growth.
        let (q1, q2, q4) = (median(&rows[1..(n / 4).max(2)]), median(&rows[n / 4..(n / 2).max(n / 4 + 1)]), median(&rows[3 * n / 4..]));
        let base = q1.max(q2);
        fn calm(rs: &[Row]) -> Vec<&Row> {
            rs.iter().filter(|r| !r.attacking).collect()
        }
        let growth = fd_kind_growth(&calm(&rows[n / 4..(n / 2).max(n / 4 + 1)]), &calm(&rows[3 * n / 4..]));
        println!("descriptors by kind, median of the second quarter -> the last: {}", if growth.is_empty() { "unchanged".into() } else { growth.join(", ") });
        if q4 > base + FD_SLACK {
            problems.push(format!(
                "open descriptors grow: median {q1} / {q2} in the first two quarters, {q4} in the last (allowed +{FD_SLACK}); by kind, second quarter -> last: {}",
                growth.join(", ")
            ));
        }
        if fd_second > fd_first + FD_TRANSIENT {
            problems.push(format!("open descriptors peak at {fd_second} in the second half, {fd_first} in the first (allowed +{FD_TRANSIENT})"));
        }
        let db_max = rows.iter().map(|r| r.db).max().unwrap_or(0);
        if db_max > STORE_MAX_BYTES + STORE_SLACK_BYTES {
            problems.push(format!(
                "database file reached {} KiB > max_bytes {} KiB + {} KiB between retentions",
                db_max / 1024,
                STORE_MAX_BYTES / 1024,
                STORE_SLACK_BYTES / 1024
            ));
        }
        let wal_max = rows.iter().map(|r| r.wal).max().unwrap_or(0);
        if wal_max > WAL_MAX_BYTES {
            problems.push(format!("WAL reached {} KiB > {} KiB", wal_max / 1024, WAL_MAX_BYTES / 1024));
        }
        let (t0, t1) = (&rows[0], &rows[n - 1]);
        let nominal = (t1.t - t0.t) / 0.1;
        if ((t1.sweeps - t0.sweeps) as f64) < 0.5 * nominal {
            problems.push(format!("sampling fell behind: {} sweeps in {:.0} s (nominal {nominal:.0})", t1.sweeps - t0.sweeps, t1.t - t0.t));
        }
        let cpu_mean = rows[1..].iter().map(|r| r.cpu_pct).sum::<f64>() / (n - 1) as f64;
        let jobs_done = jobs.load(Ordering::Relaxed);
        let jobs_failed = failed.load(Ordering::Relaxed);
        println!(
            "soak summary: {:.1} min, peak RSS {rss_max:.1} MiB (VmHWM {hwm:.1} MiB, bound {MAX_RSS_MIB}), mean CPU {cpu_mean:.1} %, fds {fd_min}..{fd_second} (median {q1} / {q2} -> {q4}, first half peak {fd_first}), db ≤ {} KiB (max_bytes {} KiB), wal ≤ {} KiB, {jobs_done} jobs ({jobs_failed} failed), {} storms, {} steps attributed, {} probe drops",
            t1.t / 60.0,
            db_max / 1024,
            STORE_MAX_BYTES / 1024,
            wal_max / 1024,
            storms.load(Ordering::Relaxed),
            t1.steps,
            t1.drops
        );
        if jobs_done == 0 || t1.steps <= 0.0 {
            problems.push(format!("no work measured: {jobs_done} jobs, {} steps", t1.steps));
        }
        if jobs_failed > jobs_done / 4 + 1 {
            problems.push(format!("{jobs_failed} of {} jobs failed", jobs_done + jobs_failed));
        }
        if storms.load(Ordering::Relaxed) > 0 && t1.drops <= 0.0 {
            problems.push("storms ran but no probe drop was counted".into());
        }
        let suspicions = metric_sum(&agent.metrics().unwrap_or_default(), "stepwise_hang_suspicions_total", &[]);
        println!("hang: {suspicions} suspicions raised over the run (slow but progressing OpenMPI jobs every fourth job; must be 0)");
        if suspicions > 0.0 {
            problems.push(format!("{suspicions} hang suspicions raised on jobs that were progressing (see the agent log's 'collective suspected hung')"));
        }
        if let Some(a) = &attacks {
            problems.extend(attack_problems(a, &agent.metrics().unwrap_or_default(), t1.t));
        }
    }
    if agent.proc.alive() {
        let healthy = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| agent.assert_healthy("end of the soak")));
        if healthy.is_err() {
            problems.push("the agent is not healthy at the end".into());
        }
        match stepwise::store::Store::open(&db).and_then(|s| Ok((s.integrity_check()?, s.count_steps()?))) {
            Ok((ok, steps)) if ok == ["ok"] => println!("store: integrity ok, {steps} steps kept"),
            Ok((bad, _)) => problems.push(format!("store integrity: {bad:?}")),
            Err(e) => problems.push(format!("store: {e}")),
        }
    }
    let log = agent.proc.log_text();
    if log.contains("panicked") {
        problems.push("the agent logged a panic".into());
    }
    if log.contains("Too many open files") {
        problems.push(format!("the agent ran out of descriptors under a limit of {NOFILE_LIMIT}"));
    }
    drop(agent);
    if !problems.is_empty() {
        bail!("soak failed:\n  {}", problems.join("\n  "));
    }
    println!("soak passed");
    Ok(())
}

/// What the attacks of the run must have left: scrapes under [`attack::MAX_SCRAPE`], none
/// failed, the flood counted as dropped markers; at least one round in a run of 90 s or more.
fn attack_problems(a: &attack::AttackStats, metrics: &str, seconds: f64) -> Vec<String> {
    let dropped = metric_sum(metrics, "stepwise_markers_dropped_total", &[]);
    let records_dropped = metric_sum(metrics, "stepwise_profiler_records_dropped_total", &[]);
    println!(
        "soak attacks: {} rounds, {} markers sent ({dropped} dropped by admission control), {} forged profiler records sent ({records_dropped} dropped), {} idle connections held, {} of 10 x {} listings answered, {} second agents on the live sockets ({} misbehaved), {} scrapes during attacks, worst {:.0?}, {} failed",
        a.rounds,
        a.markers_sent,
        a.profiler_records_sent,
        a.idle_connections,
        a.listings,
        a.rounds,
        a.second_agents,
        a.second_agent_failures.len(),
        a.scrapes,
        a.worst_scrape,
        a.failed_scrapes
    );
    let mut problems = Vec::new();
    if a.rounds == 0 && seconds >= 90.0 {
        problems.push("no attack round ran".to_string());
    }
    if a.worst_scrape > attack::MAX_SCRAPE {
        problems.push(format!("a /metrics scrape took {:.0?} during an attack (bound {:.0?})", a.worst_scrape, attack::MAX_SCRAPE));
    }
    if a.failed_scrapes > 0 {
        problems.push(format!("{} of {} /metrics scrapes failed during attacks", a.failed_scrapes, a.scrapes));
    }
    if a.markers_sent > 10_000 && dropped <= 0.0 {
        problems.push(format!("{} flood markers sent, none refused by admission control", a.markers_sent));
    }
    // A quarter of the records claim the sender's pid and pass the credentials; the sender
    // is not a selected process, so none is kept.
    if a.profiler_records_sent > 10_000 && records_dropped < a.profiler_records_sent as f64 {
        problems.push(format!("{} forged profiler records sent, only {records_dropped} dropped", a.profiler_records_sent));
    }
    problems.extend(a.second_agent_failures.iter().cloned());
    problems
}

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempfile_dir() -> Result<TempDir> {
    let d = stepwise_tests::scenario::memory_dir().join(format!("stepwise-soak-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d)?;
    Ok(TempDir(d))
}

/// One 2-rank `nccl_steps` job of 100 steps; `Ok(false)` when stopped early.
fn nccl_job(ns: &str, dir: &Path, lib: &Path, sock: &Path, n: u64, stop: &AtomicBool) -> Result<bool> {
    let id = dir.join(format!("job{n}.id"));
    let _ = std::fs::remove_file(&id);
    let mut ranks = Vec::new();
    for r in 0..2 {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, "env", "STEPS_COMPUTE=sleep", "NCCL_ABI_IFACE_ADDR=127.0.0.1"]).arg(lib.join("nccl_steps"));
        c.args(["--rank", &r.to_string(), "--nranks", "2", "--id-file"]).arg(&id).arg("--marker-socket").arg(sock);
        c.args(["--steps", "100", "--bytes", "1048576", "--compute-us", "50000"]);
        ranks.push(Proc::spawn(&format!("job{n}-r{r}"), &mut c, dir.join(format!("job-r{r}.log")))?);
    }
    let res = wait_all(&mut ranks, stop);
    let _ = std::fs::remove_file(&id);
    res
}

/// One 4-rank OpenMPI job of 20 steps of 0.3 s compute, one rank per step up to 0.6 s more.
fn mpi_job(ns: &str, sock: &Path, stop: &AtomicBool) -> Result<bool> {
    let sock = sock.to_str().context("utf-8 socket path")?;
    let log = std::env::temp_dir().join(format!("stepwise-soak-mpi-{}.log", std::process::id()));
    let mut p = vec![Proc::spawn(
        "mpirun",
        &mut workloads::mpi_steps(ns, 4, &["--steps", "20", "--bytes", "262144", "--compute-us", "300000", "--vary-us", "600000", "--marker-socket", sock]),
        log.clone(),
    )?];
    let res = wait_all(&mut p, stop);
    drop(p);
    let _ = std::fs::remove_file(&log);
    res
}

fn wait_all(ps: &mut [Proc], stop: &AtomicBool) -> Result<bool> {
    let limit = Instant::now() + Duration::from_secs(120);
    for p in ps.iter_mut() {
        loop {
            if let Some(st) = p.child.try_wait()? {
                if !st.success() {
                    bail!("{} exited with {st}: {}", p.name, p.log_text().lines().rev().take(3).collect::<Vec<_>>().join(" | "));
                }
                break;
            }
            if stop.load(Ordering::Relaxed) {
                return Ok(false);
            }
            if Instant::now() > limit {
                bail!("{} still running after 120 s", p.name);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(true)
}
