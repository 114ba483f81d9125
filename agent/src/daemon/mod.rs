//! The daemon (`agent run`): its runtime, apart from the command line (`cli/run.rs` parses
//! flags, loads the config, checks privileges and calls [`run`]).
//!
//! - [`run`]: binds the API port and the profiler socket, starts the counter sources, the
//!   engine and its step sinks (store, metrics, OTLP), the collective probes, the marker
//!   socket ([`markers`]), the sampler thread ([`sampler`]), SIGHUP reloads ([`reload`]) and the
//!   HTTP API; shuts down cleanly on SIGINT/SIGTERM.
//! - [`logging`]: the daemon's log (text, coloured only on a terminal, or JSON lines).

pub mod detail;
pub mod fast;
pub mod logging;
mod markers;
pub mod reload;
mod sampler;

use crate::export::reference::RegisterSampled as _;
use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use prometheus_client::{metrics::counter::Counter, registry::Registry};
use tracing::{info, warn};

use reload::reload_on_sighup;
pub use reload::Reload;

use crate::{
    config::Config,
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

/// Returns free heap pages to the kernel (glibc keeps them otherwise).
pub(crate) fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions.
    unsafe {
        libc::malloc_trim(0);
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

/// The daemon until SIGINT/SIGTERM: binds the API port, the profiler socket and the marker socket first (a start
/// that cannot have them fails at once), starts the sources, the engine and its sinks, the
/// collective probes, the marker socket, the sampler thread, SIGHUP reloads and the API.
pub async fn run(cfg: Config, reload: Reload) -> anyhow::Result<()> {
    // SIGTERM/SIGINT handled from the first moment: a stop asked for during start-up (a pod
    // deleted while it starts) is a clean shutdown once started, never the default kill.
    let shutdown = ShutdownSignal::install();
    // Hundreds of devices' counter files, sockets and eBPF objects: the soft descriptor limit
    // (often 1 024) is raised to the hard one before anything is opened.
    match sources::nofile::raise_soft() {
        Ok(Some((from, to))) => info!(from, to, "raised the soft RLIMIT_NOFILE to the hard limit"),
        Ok(None) => {}
        Err(e) => warn!("cannot raise RLIMIT_NOFILE: {e}"),
    }
    let hup = reload::sighup();
    // First, before any task or thread starts: a port in use fails the start at once.
    let listener = tokio::net::TcpListener::bind(cfg.listen).await.map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", cfg.listen))?;
    let profiler_rx = crate::sources::collectives::profiler::bind_configured(&cfg.collectives).map_err(|e| anyhow::anyhow!("profiler socket: {e}"))?;
    let marker_sock = markers::bind(&cfg.steps.marker_socket).map_err(|e| anyhow::anyhow!("marker socket: {e}"))?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop = StopOnDrop(stop_tx);
    let mut registry = Registry::default();
    let (reloads, reload_errors) = reload_counters(&mut registry);
    let errors = Errors::register(&mut registry);
    let agent_metrics = AgentMetrics::register(&mut registry, crate::ebpf::embedded());
    let store_health = crate::store::Health::register(&mut registry);
    let nic_info = topology::info::NicInfo::register(&mut registry);
    let watchdog = crate::export::watchdog::Watchdog::register(&mut registry, &agent_metrics, crate::export::watchdog::Watchdog::deadline_for(cfg.interval));
    let selector = Selector::new(&cfg.include, &cfg.exclude, cfg.probe_safe)?;
    let ctx =
        SourceContext { sysfs_root: cfg.sysfs_root.clone(), selector, errors, interval: cfg.interval, rails: cfg.rails.clone(), owners: Default::default() };
    let srcs = sources::build_sources(&cfg, &ctx, &mut registry);
    let mut coll = cfg.collectives.enabled.then(|| Collectives::new(cfg.collectives.clone(), &mut registry));
    let _profiler_thread =
        crate::sources::collectives::profiler::start_configured(profiler_rx, coll.as_ref().and_then(|c| c.as_ref().ok()).map(|c| c.history()), &mut registry);
    let (engine, store_queue) = engine(&cfg, &mut registry)?;
    let history = coll.as_ref().and_then(|c| c.as_ref().ok()).map(|c| c.history());
    let fast = cfg.sources.fast_period(cfg.interval).map(|p| fast::FastLane::new(p, cfg.sources.fast_cpu_budget, history, &mut registry));
    let mut state = api::AppState::new(registry);
    state.watchdog = Some(watchdog.clone());
    state.set_engine(engine.clone());
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
    let markers_task = marker_sock.map(|s| markers::start(&cfg.steps.marker_socket, s, engine.clone()));

    let topo = discover_topology(&cfg, &state, &nic_info);
    if let Some(Ok(c)) = coll.as_mut() {
        c.set_rdma_ports(crate::sources::collectives::links::RdmaPort::of(&topo));
        c.set_owners(ctx.owners.clone());
    }
    let (probes_thread, probes_status) = start_collectives(coll, &state, &agent_metrics, stop_rx.clone());
    let _ras = crate::sources::ras::start(&cfg.collectives, stop_rx.clone());
    info!(addr = %listener.local_addr()?, "serving /metrics and /api/v1");

    let store = crate::store::health::open(cfg.store.enabled, &cfg.store.path, &store_health);
    let store_cfg = cfg.store.clone();
    let reload_task = hup.map(|hup| tokio::spawn(reload_on_sighup(hup, reload, cfg.clone(), engine.clone(), reloads, reload_errors)));
    let sampler = sampler::Sampler {
        srcs,
        engine: engine.clone(),
        state: state.clone(),
        agent_metrics: agent_metrics.clone(),
        watchdog,
        store,
        store_cfg,
        store_health: store_health.clone(),
        store_queue,
        probes_status,
        interval: cfg.interval,
        drops,
        fast,
    };
    let sampler_stop = stop_rx.clone();
    let sampler = tokio::task::spawn_blocking(move || sampler.run(sampler_stop));

    let app = api::router(state.clone());
    let server = tokio::spawn(api::serve(listener, app, stop_rx.clone()));

    shutdown.recv().await;
    info!("shutting down");
    if let Some(t) = reload_task {
        t.abort();
    }
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

/// `stepwise_config_reloads_total` and `stepwise_config_reload_errors_total`.
pub fn reload_counters(registry: &mut Registry) -> (Counter, Counter) {
    let (reloads, reload_errors) = (Counter::default(), Counter::default());
    registry.register_sampled("stepwise_config_reloads", "Config reloads (SIGHUP) applied", reloads.clone());
    registry.register_sampled("stepwise_config_reload_errors", "Config reloads (SIGHUP) refused: the file did not load or validate", reload_errors.clone());
    (reloads, reload_errors)
}

/// The engine with its `[steps]` and `[hang]`, and the history store's sink (steps queue under
/// the engine lock; the sampler thread writes them).
fn engine(cfg: &Config, registry: &mut Registry) -> anyhow::Result<(Arc<Mutex<Engine>>, crate::engine::StoreQueue)> {
    let host = cfg.collectives.host.clone().unwrap_or_else(crate::sources::collectives::hostname);
    let mut engine = Engine::new(cfg.steps.clone(), host, registry).map_err(|e| anyhow::anyhow!("invalid [steps] config: {e}"))?;
    engine.set_hang_config(cfg.hang.clone());
    let store_queue = crate::engine::StoreQueue::default();
    if cfg.store.enabled {
        engine.add_step_sink(Box::new(store_queue.clone()));
    }
    Ok((Arc::new(Mutex::new(engine)), store_queue))
}

/// NIC ↔ PCI ↔ NUMA ↔ GPU ↔ rail, read once at start: into `/api/v1/topology` and
/// `stepwise_nic_info`.
fn discover_topology(cfg: &Config, state: &api::AppState, nic_info: &topology::info::NicInfo) -> topology::Topology {
    let topo = topology::discover(&cfg.sysfs_root, &cfg.rails);
    if let Ok(mut t) = state.topology.write() {
        *t = serde_json::to_value(&topo).unwrap_or_default();
    }
    nic_info.update(&topo);
    info!(nics = topo.nics.len(), gpus = topo.gpus.len(), "topology discovered");
    topo
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

/// A handler for `kind`, registered now: from here on the signal is kept for the stream's
/// reader instead of taking its default action. `None` (logged, with `what` it costs) if the
/// handler cannot be installed.
pub(crate) fn handler(kind: tokio::signal::unix::SignalKind, name: &str, what: &str) -> Option<tokio::signal::unix::Signal> {
    tokio::signal::unix::signal(kind).map_err(|e| warn!("cannot handle {name} ({what}): {e}")).ok()
}

/// SIGTERM and SIGINT, registered when made: a signal that arrives before `recv` is awaited is
/// kept, not delivered to the default handler (which would kill the agent mid-start).
struct ShutdownSignal {
    term: Option<tokio::signal::unix::Signal>,
    int: Option<tokio::signal::unix::Signal>,
}

impl ShutdownSignal {
    fn install() -> Self {
        use tokio::signal::unix::SignalKind;
        let what = "it stops the agent without a clean shutdown";
        ShutdownSignal { term: handler(SignalKind::terminate(), "SIGTERM", what), int: handler(SignalKind::interrupt(), "SIGINT", what) }
    }

    /// Until either signal has arrived (at once if one came before).
    async fn recv(mut self) {
        tokio::select! {
            _ = arrival(&mut self.term) => {}
            _ = arrival(&mut self.int) => {}
        }
    }
}

/// The next arrival of a signal; never, without a handler.
async fn arrival(signal: &mut Option<tokio::signal::unix::Signal>) {
    match signal {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}
