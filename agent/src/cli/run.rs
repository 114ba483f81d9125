//! `agent run`: the daemon. Samples every counter source each interval on a blocking thread
//! (sysfs reads and ioctls block), serves `/metrics` and the read-only API, and shuts down
//! cleanly on SIGINT/SIGTERM.
//!
//! SIGHUP reloads the config file (flags and `STEPWISE_*` variables still override it, as at
//! start): a file that does not load or validate is logged and counted
//! (`stepwise_config_reload_errors_total`) and the running configuration stays. A valid one
//! applies `log`, `[hang]` and `[steps]` (slow-step threshold, grace, history, NIC rates, attribution
//! parameters) at once; every other key — log_format, listen, sysfs_root, interval, include/exclude,
//! rails, `[sources]`, `[collectives]`, `[store]`, `[otlp]`, `[steps] marker_socket` — needs a
//! restart, and the log names the changed ones.

use std::{
    path::PathBuf,
    process::ExitCode,
    sync::atomic::Ordering,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use clap::Args;
use prometheus_client::{metrics::counter::Counter, registry::Registry};
use tracing::{error, info, warn};

mod detail;
mod logging;

use crate::{
    config::{parse_duration, Config, Overrides},
    engine::Engine,
    export::{
        api,
        metrics::{AgentMetrics, SourceLabel},
    },
    sources::{
        self,
        collectives::{Collectives, CollectivesError},
        Errors, Selector, SourceContext,
    },
    topology,
};

#[derive(Debug, Args)]
#[command(after_help = "Exit status: 0 after SIGINT or SIGTERM (a clean shutdown) and for --print-default-config; \
1 the daemon cannot start (listen address in use or not allowed, missing capabilities for the collective probes, \
invalid [steps]) — the log and stderr say why; 2 usage error or a config that does not load or validate. \
A marker socket or history store that cannot be opened is logged and the agent runs without it.")]
pub struct RunArgs {
    /// Config file (TOML). A missing file at the default path means built-in defaults.
    #[arg(long, env = "STEPWISE_CONFIG")]
    pub config: Option<PathBuf>,
    /// HTTP listen address [default: 0.0.0.0:9477].
    #[arg(long, env = "STEPWISE_LISTEN")]
    pub listen: Option<std::net::SocketAddr>,
    /// Root of sysfs; every sysfs read goes through it [default: /sys].
    #[arg(long, env = "STEPWISE_SYSFS_ROOT")]
    pub sysfs_root: Option<PathBuf>,
    /// Counter sampling interval, e.g. 1s, 250ms [default: 1s; at least 10ms].
    #[arg(long, env = "STEPWISE_INTERVAL", value_parser = parse_duration)]
    pub interval: Option<Duration>,
    /// Log filter (RUST_LOG syntax) [default: info].
    #[arg(long, env = "STEPWISE_LOG")]
    pub log: Option<String>,
    /// Log line format: text (coloured only on a terminal) or json (one object per line)
    /// [default: text].
    #[arg(long, env = "STEPWISE_LOG_FORMAT", value_enum)]
    pub log_format: Option<crate::config::LogFormat>,
    /// Unix socket for step markers [default: /run/stepwise/markers.sock].
    #[arg(long, env = "STEPWISE_MARKER_SOCKET")]
    pub marker_socket: Option<PathBuf>,
    /// Unix socket for the NCCL profiler plugin's records (the variable the plugin reads too)
    /// [default: /run/stepwise/profiler.sock].
    #[arg(long, env = "STEPWISE_PROFILER_SOCKET")]
    pub profiler_socket: Option<PathBuf>,
    /// History store file [default: /var/lib/stepwise/agent.db].
    #[arg(long, env = "STEPWISE_DB")]
    pub db: Option<PathBuf>,
    /// Print the default configuration (every value documented in config.rs) and exit.
    #[arg(long)]
    pub print_default_config: bool,
}

impl RunArgs {
    pub fn overrides(&self) -> Overrides {
        Overrides {
            listen: self.listen,
            sysfs_root: self.sysfs_root.clone(),
            interval: self.interval,
            log: self.log.clone(),
            log_format: self.log_format,
            db: self.db.clone(),
            marker_socket: self.marker_socket.clone(),
            profiler_socket: self.profiler_socket.clone(),
        }
    }
}

pub fn main(args: RunArgs) -> ExitCode {
    if args.print_default_config {
        return super::print_stdout(Config::default_toml(), ExitCode::SUCCESS);
    }
    let cfg = match Config::load(args.config.as_deref(), &args.overrides()) {
        Ok(c) => c,
        Err(e) => {
            // A JSON log asked for by flag or variable gets the refusal as JSON too.
            if args.log_format == Some(crate::config::LogFormat::Json) {
                logging::init("info", crate::config::LogFormat::Json);
            }
            let _ = fail(&e.to_string());
            return ExitCode::from(super::EXIT_USAGE);
        }
    };
    logging::init(&cfg.log, cfg.log_format);
    if let Err(msg) = crate::testclock::check() {
        let _ = fail(&msg);
        return ExitCode::from(super::EXIT_USAGE);
    }
    if crate::testclock::offset_seconds() != 0.0 {
        tracing::warn!("{} is set: this agent's clock reads {} s off (for tests only)", crate::testclock::VAR, crate::testclock::offset_seconds());
    }
    limit_malloc_arenas();
    if let Err(msg) = probe_privileges(&cfg) {
        return fail(&msg);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the runtime: {e}")),
    };
    let reload = Reload { path: args.config.clone(), overrides: args.overrides() };
    let result = rt.block_on(run(cfg, reload));
    // Blocking threads that missed the stop (a sweep stuck in a read) do not hold the exit.
    rt.shutdown_timeout(Duration::from_secs(5));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&format!("{e:#}")),
    }
}

/// Refuses to start the collective probes without the capabilities they need, naming the one
/// that is missing: CAP_BPF (load the programs), CAP_PERFMON (attach the uprobes and the
/// tracepoint), and CAP_SYS_ADMIN where the kernel keeps the uprobe PMU to it — Linux 6.16
/// and the stable kernels with the CVE-2025-38466 fix (5.10.240, 5.15.189, 6.1.146, 6.6.99,
/// 6.12.39, 6.15.7) — which only attaching a probe tells, so the self-test probe is attached
/// once. CAP_SYS_ADMIN implies the other two (capabilities(7)). Without CAP_SYS_PTRACE the
/// agent still starts: it then sees only processes of its own uid that hold no capability it
/// lacks (`/proc/<pid>/maps`, `environ`, `root`, `ns/net` are ptrace-checked).
fn probe_privileges(cfg: &Config) -> Result<(), String> {
    use super::check::{effective_caps, has_cap, CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, CAP_SYS_PTRACE};
    if !cfg.collectives.enabled {
        return Ok(());
    }
    let Some(mask) = effective_caps() else { return Ok(()) };
    let admin = has_cap(mask, CAP_SYS_ADMIN);
    let fix = "grant it (setcap, systemd AmbientCapabilities, the DaemonSet securityContext) or set [collectives] enabled = false";
    let need = [
        (CAP_BPF, "CAP_BPF", "needed to load the eBPF programs"),
        (CAP_PERFMON, "CAP_PERFMON", "needed to attach uprobes to the collective libraries and read their events"),
    ];
    if let Some((_, name, why)) = need.iter().find(|(c, ..)| !admin && !has_cap(mask, *c)) {
        return Err(format!("missing {name}: {why}; {fix}"));
    }
    if !admin {
        if let Err(e @ crate::ebpf::EbpfError::Attach { .. }) = crate::ebpf::self_test(1) {
            let denied = std::iter::successors(Some(&e as &dyn std::error::Error), |e| e.source())
                .filter_map(|e| e.downcast_ref::<std::io::Error>()?.raw_os_error())
                .any(|c| c == libc::EACCES || c == libc::EPERM);
            if denied {
                return Err(format!("missing CAP_SYS_ADMIN: this kernel lets only CAP_SYS_ADMIN attach uprobes (Linux 6.16+ and stable kernels with the CVE-2025-38466 fix), CAP_BPF and CAP_PERFMON are not enough; {fix}"));
            }
        }
    }
    if !has_cap(mask, CAP_SYS_PTRACE) {
        warn!("no CAP_SYS_PTRACE: collective probes see only processes of this uid that hold no capability the agent lacks");
    }
    Ok(())
}

/// glibc gives each thread that allocates its own malloc arena (up to 8 × cores) and keeps
/// freed memory in it: the runtime workers, the sampler and the probe thread then hold several
/// times the live heap (measured in the soak: 77 MiB anonymous after 1000 steps, 46 MiB with
/// one arena). Two arenas, and free pages handed back every 10 s ([`trim_heap`]), keep the
/// resident size near the live data.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tunables; called before other threads start.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Returns free heap pages to the kernel (glibc keeps them otherwise).
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A start-up failure: an error log line (where the log is installed), and in text format
/// also the plain `agent: …` line (a JSON log stays JSON lines only).
fn fail(msg: &str) -> ExitCode {
    error!("{msg}");
    if !logging::is_json() {
        eprintln!("agent: {msg}");
    }
    ExitCode::FAILURE
}

/// Where the configuration came from, to load it again on SIGHUP.
struct Reload {
    path: Option<PathBuf>,
    overrides: Overrides,
}

/// Top-level config keys (and `steps.marker_socket`) that differ: what a reload cannot apply.
fn restart_keys(old: &Config, new: &Config) -> Vec<String> {
    let (a, b) = (serde_json::to_value(old).unwrap_or_default(), serde_json::to_value(new).unwrap_or_default());
    let mut keys: Vec<String> = match (a.as_object(), b.as_object()) {
        (Some(a), Some(b)) => {
            a.iter().filter(|(k, v)| !matches!(k.as_str(), "log" | "steps" | "hang") && b.get(k.as_str()) != Some(*v)).map(|(k, _)| k.clone()).collect()
        }
        _ => Vec::new(),
    };
    if old.steps.marker_socket != new.steps.marker_socket {
        keys.push("steps.marker_socket".into());
    }
    if keys.is_empty() && (Config { log: new.log.clone(), steps: new.steps.clone(), hang: new.hang.clone(), ..old.clone() }) != *new {
        keys.push("(a setting not shown, e.g. a secret)".into());
    }
    keys
}

/// Reloads the config file on every SIGHUP (see the module docs).
async fn reload_on_sighup(reload: Reload, mut running: Config, engine: Arc<Mutex<Engine>>, reloads: Counter, errors: Counter) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            warn!("cannot handle SIGHUP (config reload disabled): {e}");
            return;
        }
    };
    while hup.recv().await.is_some() {
        let new = match Config::load(reload.path.as_deref(), &reload.overrides) {
            Ok(c) => c,
            Err(e) => {
                errors.inc();
                error!("config reload failed, the running configuration stays: {e}");
                continue;
            }
        };
        let applied = match engine.lock() {
            Ok(mut e) => e.set_steps_config(new.steps.clone()).map(|()| e.set_hang_config(new.hang.clone())),
            Err(p) => p.into_inner().set_steps_config(new.steps.clone()),
        };
        if let Err(e) = applied {
            errors.inc();
            error!("config reload failed, the running configuration stays: invalid [steps]: {e}");
            continue;
        }
        if new.log != running.log {
            if let Err(e) = logging::set_filter(&new.log) {
                warn!("cannot apply the new log filter: {e}");
            }
        }
        reloads.inc();
        let restart = restart_keys(&running, &new);
        if restart.is_empty() {
            info!("configuration reloaded (log, [steps] and [hang] applied)");
        } else {
            warn!("configuration reloaded (log, [steps] and [hang] applied); changed keys that need a restart: {}", restart.join(", "));
        }
        let marker_socket = running.steps.marker_socket.clone();
        running.log = new.log;
        running.steps = new.steps;
        running.hang = new.hang;
        running.steps.marker_socket = marker_socket;
    }
}

/// Tells every background task and thread to stop when dropped: on shutdown, and on any
/// early return of [`run`] after they started, so a failed start never waits on them.
struct StopOnDrop(tokio::sync::watch::Sender<bool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        let _ = self.0.send(true);
    }
}

async fn run(cfg: Config, reload: Reload) -> anyhow::Result<()> {
    // First, before any task or thread starts: a port in use fails the start at once.
    let listener = tokio::net::TcpListener::bind(cfg.listen).await.map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", cfg.listen))?;
    let profiler_rx = crate::sources::collectives::profiler::bind_configured(&cfg.collectives).map_err(|e| anyhow::anyhow!("profiler socket: {e}"))?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop = StopOnDrop(stop_tx);
    let mut registry = Registry::default();
    let (reloads, reload_errors) = (Counter::default(), Counter::default());
    registry.register("stepwise_config_reloads", "Config reloads (SIGHUP) applied", reloads.clone());
    registry.register("stepwise_config_reload_errors", "Config reloads (SIGHUP) refused: the file did not load or validate", reload_errors.clone());
    let errors = Errors::register(&mut registry);
    let agent_metrics = AgentMetrics::register(&mut registry, crate::ebpf::embedded());
    let store_health = crate::store::Health::register(&mut registry);
    let nic_info = topology::info::NicInfo::register(&mut registry);
    let watchdog = crate::export::watchdog::Watchdog::register(&mut registry, &agent_metrics, crate::export::watchdog::Watchdog::deadline_for(cfg.interval));
    let selector = Selector::new(&cfg.include, &cfg.exclude, cfg.probe_safe)?;
    let ctx = SourceContext { sysfs_root: cfg.sysfs_root.clone(), selector, errors, interval: cfg.interval, rails: cfg.rails.clone() };
    let mut srcs = sources::build_sources(&cfg, &ctx, &mut registry);
    let coll = cfg.collectives.enabled.then(|| Collectives::new(cfg.collectives.clone(), &mut registry));
    let _profiler_thread =
        crate::sources::collectives::profiler::start_configured(profiler_rx, coll.as_ref().and_then(|c| c.as_ref().ok()).map(|c| c.history()), &mut registry);
    let host = cfg.collectives.host.clone().unwrap_or_else(crate::sources::collectives::hostname);
    let mut engine = Engine::new(cfg.steps.clone(), host, &mut registry).map_err(|e| anyhow::anyhow!("invalid [steps] config: {e}"))?;
    engine.set_hang_config(cfg.hang.clone());
    // The history store's sink: steps queue under the engine lock, the sampler thread writes.
    let store_queue = crate::engine::StoreQueue::default();
    if cfg.store.enabled {
        engine.add_step_sink(Box::new(store_queue.clone()));
    }
    let engine = Arc::new(Mutex::new(engine));
    let mut state = api::AppState::new(registry);
    state.watchdog = Some(watchdog.clone());
    state.engine = Some(engine.clone());
    if let Some(Ok(c)) = &coll {
        state.probes_ready = Some(c.ready_handle());
        state.probes_detail = Some(c.status_handle());
    }
    state.markers_token = cfg.api.markers_token().cloned();
    // Before the state is shared: the exporter registers its counters in the registry.
    let _otlp = crate::export::otlp::start(&cfg, &mut state, &engine);
    let drops = coll.as_ref().and_then(|c| c.as_ref().ok()).map(|c| c.drops_handle()).unwrap_or_default();
    if let Some(Ok(c)) = &coll {
        if let Ok(mut e) = engine.lock() {
            e.set_calls(c.history());
        }
    }
    let markers_task = start_marker_socket(&cfg.steps.marker_socket, engine.clone());

    let topo = topology::discover(&cfg.sysfs_root, &cfg.rails);
    if let Ok(mut t) = state.topology.write() {
        *t = serde_json::to_value(&topo).unwrap_or_default();
    }
    nic_info.update(&topo);
    info!(nics = topo.nics.len(), gpus = topo.gpus.len(), "topology discovered");

    let (probes_thread, probes_status) = start_collectives(coll, &state, &agent_metrics, stop_rx.clone());
    info!(addr = %listener.local_addr()?, "serving /metrics and /api/v1");

    let mut store = crate::store::health::open(cfg.store.enabled, &cfg.store.path, &store_health);
    let store_cfg = cfg.store.clone();
    let reload_task = tokio::spawn(reload_on_sighup(reload, cfg.clone(), engine.clone(), reloads, reload_errors));
    let sampler = {
        let state = state.clone();
        let engine = engine.clone();
        let agent_metrics = agent_metrics.clone();
        let store_health = store_health.clone();
        let probes_status = probes_status.clone();
        let interval = cfg.interval;
        let mut stop_rx = stop_rx.clone();
        tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let mut next = Instant::now();
            let mut sweeps: u64 = 0;
            let mut last_retention: Option<Instant> = None;
            let mut last_trim = Instant::now();
            let mut last_tick: Option<Instant> = None;
            let detail_every = detail::every(interval);
            loop {
                let fresh_detail = sweeps.is_multiple_of(detail_every);
                let mut reports = serde_json::Map::new();
                let round_start = crate::engine::wall_now();
                for s in srcs.iter_mut() {
                    let t0 = Instant::now();
                    watchdog.begin(s.name());
                    let r = s.sweep();
                    watchdog.end();
                    let label = SourceLabel { source: s.name() };
                    agent_metrics.sweep_seconds.get_or_create(&label).observe(t0.elapsed().as_secs_f64());
                    let up = match &r {
                        Ok(_) => 1,
                        Err(e) => {
                            if sweeps == 0 {
                                warn!(source = s.name(), "{e}");
                            }
                            0
                        }
                    };
                    agent_metrics.source_up.get_or_create(&label).set(up);
                    // Built by moving values in: `json!` would deep-copy the detail (and again
                    // below), which cost more than a 16-NIC sweep's own parsing.
                    let report: serde_json::Map<String, serde_json::Value> = [
                        ("up", (up == 1).into()),
                        ("last_sweep", r.as_ref().ok().and_then(|x| serde_json::to_value(x).ok()).unwrap_or_default()),
                        ("error", r.as_ref().err().map_or(serde_json::Value::Null, |e| e.to_string().into())),
                        ("detail", if fresh_detail { s.status() } else { serde_json::Value::Null }),
                    ]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect();
                    reports.insert(s.name().to_string(), report.into());
                }
                sweeps += 1;
                // Per-NIC samples for step windows, then attribute the steps that ended.
                let parts: Vec<_> = srcs.iter().flat_map(|s| s.nic_samples()).collect();
                if let Ok(mut e) = engine.lock() {
                    let now = crate::engine::wall_now();
                    // Counters were read during the round: stamped at its middle, so a round
                    // stretched by a busy CPU shifts them by half as much.
                    e.push_samples(round_start + (now - round_start) / 2.0, parts);
                    // Attribution looks at the last minute of calls: at most ten times a second
                    // however fast the counters are sampled (steps wait a grace period of a
                    // second anyway).
                    if last_tick.is_none_or(|t| t.elapsed() >= Duration::from_millis(100)) {
                        e.tick(now, drops.load(Ordering::Relaxed));
                        last_tick = Some(Instant::now());
                    }
                }
                let pending = store_queue.take();
                // The store is written outside the engine lock: a slow disk never blocks the API.
                if let Some(st) = store.as_mut() {
                    for p in &pending {
                        match st.put_step(&p.job, &p.attribution, &p.collectives, &p.windows) {
                            Ok(_) => store_health.ok(),
                            Err(e) => {
                                warn!("history store: {e}");
                                store_health.failed(&e);
                            }
                        }
                    }
                    // Periodically (age and size), and as soon as the file passes max_bytes (at
                    // most once a second); down to 90 % so the next pass is not at once.
                    let over_budget = !pending.is_empty()
                        && last_retention.is_some_and(|t| t.elapsed() >= Duration::from_secs(1))
                        && st.size_bytes().is_ok_and(|b| b > store_cfg.max_bytes);
                    if over_budget || last_retention.is_none_or(|t| t.elapsed() >= store_cfg.retention_interval) {
                        last_retention = Some(Instant::now());
                        if let Err(e) = st.retention(store_cfg.max_age, store_cfg.max_bytes - store_cfg.max_bytes / 10) {
                            warn!("history store retention: {e}");
                            store_health.failed(&e);
                        }
                    }
                }
                if last_trim.elapsed() >= Duration::from_secs(10) {
                    last_trim = Instant::now();
                    trim_heap();
                }
                let mut status = serde_json::json!({
                    "version": env!("CARGO_PKG_VERSION"),
                    "uptime_seconds": started.elapsed().as_secs_f64(),
                    "interval_seconds": interval.as_secs_f64(),
                    "sweeps": sweeps,
                    "ebpf_embedded": crate::ebpf::embedded(),
                    "collectives": probes_status,
                    "store": store_health.json(),
                });
                status["sources"] = reports.into();
                if let Ok(mut st) = state.status.write() {
                    if !fresh_detail {
                        detail::carry(&mut st, &mut status);
                    }
                    // Swapped in; the previous status is dropped after the lock is released.
                    status = std::mem::replace(&mut *st, status);
                }
                drop(status);
                state.ready.store(true, Ordering::Relaxed);
                next += interval;
                let now = Instant::now();
                if next < now {
                    next = now; // fell behind: do not burst to catch up
                }
                // Sleep in short slices so shutdown is prompt.
                while Instant::now() < next {
                    if *stop_rx.borrow_and_update() {
                        return;
                    }
                    std::thread::sleep((next - Instant::now()).min(Duration::from_millis(50)));
                }
            }
        })
    };

    let app = api::router(state.clone());
    let server = tokio::spawn(api::serve(listener, app, stop_rx.clone()));

    shutdown_signal().await;
    info!("shutting down");
    reload_task.abort();
    drop(stop);
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), sampler).await;
    if let Some(t) = probes_thread {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
    if let Some(t) = markers_task {
        t.abort();
    }
    Ok(())
}

/// Listens for step markers on a Unix datagram socket (mode 0660, so only the socket's group
/// — the training job's — can send). A failure to bind is logged; markers can still be
/// POSTed to the API.
fn start_marker_socket(path: &std::path::Path, engine: Arc<Mutex<Engine>>) -> Option<tokio::task::JoinHandle<()>> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let _ = std::fs::remove_file(path);
    let sock = match tokio::net::UnixDatagram::bind(path) {
        Ok(s) => s,
        Err(e) => {
            warn!(path = %path.display(), "cannot bind the marker socket: {e}; markers can still be POSTed to /api/v1/markers");
            return None;
        }
    };
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660));
    // The kernel stamps each datagram when the training process sends it: a marker's time
    // does not depend on when this task gets the CPU or the engine lock (an attribution
    // tick holds it for milliseconds), which would move step boundaries.
    let stamped = enable_send_timestamps(&sock);
    if let Err(e) = &stamped {
        warn!("marker socket: no kernel timestamps ({e}); markers are stamped on receipt");
    }
    info!(path = %path.display(), "listening for step markers");
    Some(tokio::spawn(async move {
        let mut buf = vec![0u8; crate::timeline::markers::MAX_MARKER_BYTES + 1];
        loop {
            let (n, sent) = if stamped.is_ok() {
                if sock.readable().await.is_err() {
                    continue;
                }
                match sock.try_io(tokio::io::Interest::READABLE, || recv_stamped(&sock, &mut buf)) {
                    Ok(r) => r,
                    Err(_) => continue, // WouldBlock: readiness was spurious
                }
            } else {
                let Ok(n) = sock.recv(&mut buf).await else { continue };
                (n, None)
            };
            let now = sent.unwrap_or_else(crate::engine::wall_now);
            let mut e = match engine.lock() {
                Ok(e) => e,
                Err(p) => p.into_inner(),
            };
            match crate::timeline::Marker::parse(&buf[..n], now) {
                Ok(m) => e.add_marker(m),
                Err(err) => {
                    e.marker_error();
                    tracing::debug!("marker refused: {err}");
                }
            }
        }
    }))
}

/// Asks the kernel to timestamp datagrams on `sock` (`SO_TIMESTAMPNS`; for a Unix datagram
/// socket the stamp is taken in the sender's `sendmsg`). Hand code: neither tokio nor std
/// exposes socket options or control messages, and this is the only place that needs them.
fn enable_send_timestamps(sock: &tokio::net::UnixDatagram) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: valid fd, option value of the documented type and size.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// One datagram into `buf` with its `SCM_TIMESTAMPNS` send time (wall-clock seconds), if any.
fn recv_stamped(sock: &tokio::net::UnixDatagram, buf: &mut [u8]) -> std::io::Result<(usize, Option<f64>)> {
    use std::os::fd::AsRawFd;
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // Room for one timespec control message (and alignment).
    let mut control = [0u64; 8];
    // SAFETY: a zeroed msghdr is valid; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: valid fd and msghdr; MSG_DONTWAIT because readiness is handled by tokio.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut sent = None;
    // SAFETY: walking the control buffer the kernel filled, with the libc CMSG macros.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                sent = Some(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9).filter(|t| *t > 0.0);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, sent))
}

/// Starts the collective probes on their own blocking thread. A host where eBPF cannot load
/// still gets counters: the failure is logged, shown in `/api/v1/status` and
/// `stepwise_source_up{source="collectives"} 0`, and the agent keeps running.
fn start_collectives(
    coll: Option<Result<Collectives, CollectivesError>>,
    state: &api::AppState,
    up: &AgentMetrics,
    stop: tokio::sync::watch::Receiver<bool>,
) -> (Option<tokio::task::JoinHandle<()>>, serde_json::Value) {
    let label = SourceLabel { source: "collectives" };
    match coll {
        None => (None, serde_json::json!({"enabled": false})),
        Some(Ok(coll)) => {
            if let Ok(mut g) = state.collectives.write() {
                *g = Some(coll.history());
            }
            up.source_up.get_or_create(&label).set(1);
            (Some(tokio::task::spawn_blocking(move || coll.run(|| *stop.borrow()))), serde_json::json!({"enabled": true, "up": true}))
        }
        Some(Err(e)) => {
            warn!("collective probes disabled: {e}");
            up.source_up.get_or_create(&label).set(0);
            (None, serde_json::json!({"enabled": true, "up": false, "error": e.to_string()}))
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
