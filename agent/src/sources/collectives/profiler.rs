//! The receiver of the NCCL profiler plugin (`nccl-profiler/`, docs/profiler-plugin.md): one
//! Unix datagram socket (`[collectives] profiler_socket`), bound at start; a thread reads the
//! plugin's datagrams (format: `nccl_profiler::wire`) and keeps each record as a call in the
//! history, keyed by the communicator hash and NCCL's sequence number.
//!
//! A process that sent records with GPU times has its NCCL collectives timed by its GPU: the
//! uprobe calls of its collectives are left out of the join (they stay in the history for
//! the API's identity and progress views) and the plugin's calls stand in, with `enter` = GPU
//! start and `exit` = GPU end on the host clock (`timing: "gpu"`).

use crate::export::reference::RegisterSampled as _;
use std::{
    collections::{BTreeMap, VecDeque},
    os::{
        fd::AsRawFd,
        unix::{fs::PermissionsExt, net::UnixDatagram},
    },
    path::{Path, PathBuf},
    sync::atomic::AtomicU64,
    time::Duration,
};

use nccl_profiler::wire::{self, Header, Record};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use tracing::{debug, info, warn};

use super::{
    admission,
    decode::{fnv1a, Call, CommId},
    history::{CallRecord, ClockMap},
    targets::Family as Lib,
    SharedHistory,
};
use crate::{
    sources::sockpath::Peer,
    timeline::join::{Clocking, ProxyWait, Timing},
};

/// A process is "active" while its plugin sent within this many seconds.
pub const ACTIVE_SECONDS: f64 = 30.0;
/// Plugin processes remembered at most (the oldest is forgotten first).
const MAX_PROCS: usize = 1024;

/// What is known of one process's plugin.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct PluginProc {
    pub pid: u32,
    pub nccl_version: u32,
    /// The event mask the plugin asked NCCL for (2 = Coll only: no GPU timing).
    pub event_mask: u32,
    pub records: u64,
    pub dropped_ring_full: u64,
    pub dropped_unsent: u64,
    /// Wall time of the first record with GPU times, less a millisecond: this process's
    /// uprobe-timed collectives entered after it are replaced by the plugin's.
    pub gpu_since: Option<f64>,
    pub last_seen: f64,
    /// The latest record's GPU-offset error bound, seconds.
    pub offset_error_seconds: Option<f64>,
    /// Its CUDA device's PCI address (sysfs spelling), when the plugin found one.
    pub gpu: Option<String>,
}

impl PluginProc {
    pub fn gpu_timing(&self) -> bool {
        self.gpu_since.is_some() && self.event_mask as u64 & nccl_profiler::events::EV_KERNEL_CH != 0
    }
}

/// The plugin's calls and processes (part of the history).
#[derive(Debug, Default)]
pub struct PluginStore {
    calls: VecDeque<CallRecord>,
    pub procs: BTreeMap<u32, PluginProc>,
    /// Who may add records, and how fast ([`super::admission`]).
    admission: super::admission::RecordAdmission,
}

/// The history-wide identity of a plugin collective: one CommId per (communicator, function),
/// because NCCL numbers each function's collectives separately (`comm->seqNumber[func]`).
pub fn comm_of(comm_hash: u64, func: u8) -> CommId {
    CommId(fnv1a(&[b"nccl-profiler", &comm_hash.to_le_bytes(), &[func]]))
}

/// The op name of a function code, shared (no allocation per record).
fn op_name(func: u8) -> std::sync::Arc<str> {
    static NAMES: std::sync::OnceLock<Vec<std::sync::Arc<str>>> = std::sync::OnceLock::new();
    let names = NAMES.get_or_init(|| (0..=wire::FUNC_OPS.len() as u8).map(|f| wire::name_of(&wire::FUNC_OPS, f).into()).collect());
    names.get(func as usize).or_else(|| names.first()).cloned().unwrap_or_else(|| "unknown".into())
}

/// One plugin record as a call of `pid` on `host`.
pub fn call_of(r: &Record, pid: u32, host: &std::sync::Arc<str>, clock: &ClockMap) -> CallRecord {
    let enqueue = r.enqueue_ns as f64 * 1e-9;
    let gpu = r.gpu_start_host_ns().zip(r.gpu_end_host_ns());
    let (enter, exit, timing) = match gpu {
        Some((s, e)) => (s as f64 * 1e-9, e.max(s) as f64 * 1e-9, Timing::Gpu),
        None => (enqueue, enqueue, Timing::HostEnqueue),
    };
    let w = r.proxy_wait_ns.map(|n| n as f64 * 1e-9);
    let any = w.iter().any(|v| *v > 0.0) || r.requests.iter().any(|n| *n > 0);
    let proxy_wait = any.then(|| {
        Box::new(ProxyWait {
            send_gpu_wait: w[0],
            send_peer_wait: w[1],
            send_wait: w[2],
            recv_wait: w[3],
            recv_flush_wait: w[4],
            recv_gpu_wait: w[5],
            send_requests: r.requests[0] as f64,
            send_bytes: r.request_bytes[0] as f64,
            recv_requests: r.requests[1] as f64,
            recv_bytes: r.request_bytes[1] as f64,
        })
    });
    let mono = |t: f64| ((t * 1e9) as i128 - clock.offset_ns).max(0) as u64;
    let call = Call {
        pid,
        tid: 0,
        library: Lib::Nccl,
        op: op_name(r.func),
        bytes: (r.bytes > 0).then_some(r.bytes),
        comm: Some(comm_of(r.comm_hash, r.func)),
        comm_global: true,
        rank: u32::try_from(r.rank).ok(),
        nranks: u32::try_from(r.nranks).ok(),
        seq: Some(r.seq),
        enter_ns: mono(enter),
        exit_ns: mono(exit),
        ret: None,
        aborted: false,
        grouped: false,
    };
    let clock = Clocking {
        timing,
        host_enqueue: (timing == Timing::Gpu).then_some(enqueue),
        gpu_offset_error: (timing == Timing::Gpu).then_some(r.offset_error_ns as f64 * 1e-9),
        proxy_wait,
        graph_replay: r.flags & wire::FLAG_GRAPH != 0,
    };
    CallRecord { call, host: host.clone(), enter, exit, duration: exit - enter, clock }
}

impl PluginStore {
    /// Adds one datagram's records (at wall time `now`); returns the new drop counts (ring
    /// full, not delivered) the plugin reported since its last datagram.
    pub fn push(&mut self, h: &Header, recs: &[Record], host: &std::sync::Arc<str>, clock: &ClockMap, cap: usize, now: f64) -> (u64, u64) {
        if !self.procs.contains_key(&h.pid) && self.procs.len() >= MAX_PROCS {
            if let Some(old) = self.procs.values().min_by(|a, b| a.last_seen.total_cmp(&b.last_seen)).map(|p| p.pid) {
                self.procs.remove(&old);
            }
        }
        let p = self.procs.entry(h.pid).or_insert_with(|| PluginProc { pid: h.pid, ..Default::default() });
        let new_drops = (h.dropped_full.saturating_sub(p.dropped_ring_full), h.dropped_unsent.saturating_sub(p.dropped_unsent));
        p.nccl_version = h.nccl_version;
        p.event_mask = h.event_mask;
        if let Some(g) = h.gpu() {
            p.gpu = Some(g);
        }
        p.dropped_ring_full = p.dropped_ring_full.max(h.dropped_full);
        p.dropped_unsent = p.dropped_unsent.max(h.dropped_unsent);
        p.records += recs.len() as u64;
        p.last_seen = now;
        for r in recs.iter().filter(|r| r.flags & wire::FLAG_STARTED == 0) {
            let c = call_of(r, h.pid, host, clock);
            if c.clock.timing == Timing::Gpu {
                p.offset_error_seconds = c.clock.gpu_offset_error;
                let since = c.clock.host_enqueue.unwrap_or(c.enter) - 1e-3;
                p.gpu_since = Some(p.gpu_since.map_or(since, |t| t.min(since)));
            }
            if self.calls.len() >= cap {
                self.calls.pop_front();
            }
            self.calls.push_back(c);
        }
        new_drops
    }

    /// The GPU of each process whose plugin reported one.
    pub fn gpus(&self) -> BTreeMap<u32, String> {
        self.procs.values().filter_map(|p| Some((p.pid, p.gpu.clone()?))).collect()
    }

    /// Whether the uprobe call `c` is replaced by this process's plugin calls: it returned
    /// after the plugin's first GPU-timed collective was enqueued. The Coll event starts
    /// inside the call, so the call that enqueued that collective is still running then, and
    /// the calls before it have returned. (Its entry can be milliseconds before the enqueue:
    /// a first collective that starts the stream's worker, or a rank preempted in between on
    /// a loaded host; comparing the entry left such a call as a second, host-timed arrival.)
    pub fn replaces(&self, c: &CallRecord) -> bool {
        c.call.library == Lib::Nccl && c.call.seq.is_some() && self.procs.get(&c.call.pid).and_then(|p| p.gpu_since).is_some_and(|t| c.exit >= t)
    }

    /// Plugin calls that entered at or after `since`, at most `limit`.
    pub fn calls_since(&self, since: f64, limit: usize) -> impl Iterator<Item = &CallRecord> {
        self.calls.iter().filter(move |c| c.enter >= since).take(limit)
    }

    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    /// Processes whose plugin sent within [`ACTIVE_SECONDS`] of `now`: (with GPU timing, without).
    pub fn active(&self, now: f64) -> (usize, usize) {
        let live = self.procs.values().filter(|p| now - p.last_seen <= ACTIVE_SECONDS);
        live.fold((0, 0), |(g, h), p| if p.gpu_timing() { (g + 1, h) } else { (g, h + 1) })
    }

    /// For `/api/v1/status`: each known process (at most 256, most recent first).
    pub fn status(&self, now: f64) -> serde_json::Value {
        let mut v: Vec<&PluginProc> = self.procs.values().collect();
        v.sort_by(|a, b| b.last_seen.total_cmp(&a.last_seen));
        let procs: Vec<serde_json::Value> = v
            .iter()
            .take(256)
            .map(|p| {
                let mut j = serde_json::to_value(p).unwrap_or_default();
                if let Some(o) = j.as_object_mut() {
                    o.insert("active".into(), (now - p.last_seen <= ACTIVE_SECONDS).into());
                    o.insert("gpu_timing".into(), p.gpu_timing().into());
                    if p.gpu_since.is_none() && p.event_mask as u64 & nccl_profiler::events::EV_KERNEL_CH == 0 {
                        o.insert("note".into(), "KernelCh events off (NCCL 2.31.x default, or STEPWISE_PROFILER_EVENTS): host enqueue times only".into());
                    }
                }
                j
            })
            .collect();
        let (gpu, host) = self.active(now);
        serde_json::json!({"active_gpu": gpu, "active_host_only": host, "processes": procs})
    }
}

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}
#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TimingLabel {
    timing: &'static str,
}

/// The receiver's metrics (no per-process labels: counts only).
#[derive(Clone)]
pub struct ProfilerMetrics {
    records: Counter,
    refused: Counter,
    dropped: Family<ReasonLabel, Counter>,
    plugin_drops: Family<ReasonLabel, Counter>,
    processes: Family<TimingLabel, Gauge>,
    offset_error: Gauge<f64, AtomicU64>,
    proxy: super::net_metrics::ProxyMetrics,
}

impl ProfilerMetrics {
    pub fn register(r: &mut Registry) -> ProfilerMetrics {
        let m = ProfilerMetrics {
            records: Counter::default(),
            refused: Counter::default(),
            dropped: Family::default(),
            plugin_drops: Family::default(),
            processes: Family::default(),
            offset_error: Gauge::default(),
            proxy: super::net_metrics::ProxyMetrics::register(r),
        };
        r.register_sampled("stepwise_profiler_records", "Collective records received from the NCCL profiler plugin", m.records.clone());
        r.register_sampled("stepwise_profiler_datagrams_refused", "Profiler plugin datagrams refused (bad magic, version or sizes)", m.refused.clone());
        r.register_sampled(
            "stepwise_profiler_records_dropped",
            "Profiler plugin records refused by the agent: the header's pid is not the sender's (no_credentials, pid_unmapped, pid_mismatch), the sender is not a selected process (not_selected) or admission control (too_many_processes, process_rate, new_communicators)",
            m.dropped.clone(),
        );
        r.register_sampled(
            "stepwise_profiler_plugin_drops",
            "Records the profiler plugins dropped: ring_full (the job outran the sender) or unsent (no agent listened, or its queue stayed full)",
            m.plugin_drops.clone(),
        );
        r.register_sampled(
            "stepwise_profiler_plugin_processes",
            "Processes whose NCCL profiler plugin sent in the last 30 s, by timing (gpu: KernelCh events on; host_enqueue: off)",
            m.processes.clone(),
        );
        r.register_sampled(
            "stepwise_profiler_gpu_offset_error_seconds",
            "Largest GPU-timer-to-host-clock error bound of the active plugin processes",
            m.offset_error.clone(),
        );
        for reason in ["ring_full", "unsent"] {
            let _ = m.plugin_drops.get_or_create(&ReasonLabel { reason });
        }
        for timing in ["gpu", "host_enqueue"] {
            m.processes.get_or_create(&TimingLabel { timing }).set(0);
        }
        m
    }

    fn update(&self, store: &PluginStore, now: f64) {
        let (gpu, host) = store.active(now);
        self.processes.get_or_create(&TimingLabel { timing: "gpu" }).set(gpu as i64);
        self.processes.get_or_create(&TimingLabel { timing: "host_enqueue" }).set(host as i64);
        let err = store.procs.values().filter(|p| now - p.last_seen <= ACTIVE_SECONDS).filter_map(|p| p.offset_error_seconds).fold(0.0, f64::max);
        self.offset_error.set(err);
    }
}

/// The bound socket, before its thread starts.
pub struct Receiver {
    sock: UnixDatagram,
    path: PathBuf,
    /// Which senders are the job's (every process unless [`Receiver::select`] said).
    selection: Option<admission::SenderSelection>,
}

impl Receiver {
    /// Binds `path` (mode 0660, like the marker socket): a stale socket file is replaced; a
    /// socket another live agent listens on is an error, as is any other failure.
    pub fn bind(path: &Path) -> Result<Receiver, String> {
        crate::sources::sockpath::claim(path)?;
        let sock = UnixDatagram::bind(path).map_err(|e| format!("cannot bind {}: {e}", path.display()))?;
        // The kernel names each datagram's sender: a record's pid is checked against it.
        crate::sources::sockpath::set_flag(sock.as_raw_fd(), libc::SO_PASSCRED).map_err(|e| format!("{}: SO_PASSCRED: {e}", path.display()))?;
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660));
        sock.set_read_timeout(Some(Duration::from_millis(500))).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Receiver { sock, path: path.to_path_buf(), selection: None })
    }

    /// Keeps only records from processes `selection` selects (`[collectives] select`).
    pub fn select(mut self, selection: admission::SenderSelection) -> Receiver {
        self.selection = Some(selection);
        self
    }

    /// Reads datagrams on a thread of its own for the life of the agent.
    pub fn start(self, history: SharedHistory, metrics: ProfilerMetrics) -> std::io::Result<std::thread::JoinHandle<()>> {
        info!(path = %self.path.display(), "listening for NCCL profiler plugin records");
        std::thread::Builder::new().name("profiler-rx".into()).spawn(move || self.run(&history, &metrics))
    }

    fn run(mut self, history: &SharedHistory, m: &ProfilerMetrics) {
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = match crate::sources::sockpath::recv(self.sock.as_raw_fd(), &mut buf, 0) {
                Ok(got) => Some(got),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted) => None,
                Err(e) => {
                    warn!(path = %self.path.display(), "profiler socket: {e}");
                    std::thread::sleep(Duration::from_millis(200));
                    None
                }
            };
            let now = crate::engine::wall_now();
            let mut h = match history.lock() {
                Ok(h) => h,
                Err(p) => p.into_inner(),
            };
            if let Some(got) = n {
                let sel = &mut self.selection;
                handle_datagram(&mut h, &buf[..got.len], got.peer, |pid| sel.as_mut().is_none_or(|s| s.selects(pid, now)), m, now);
            }
            m.update(&h.plugin, now);
        }
    }
}

/// The configured receiver, bound (None when `[collectives]` is off or `profiler_socket` is
/// empty); installs the plugin first when `profiler_plugin_install` says where (a failure
/// there is logged: the receiver works for plugins installed otherwise).
pub fn bind_configured(cfg: &crate::config::CollectivesConfig) -> Result<Option<Receiver>, String> {
    if !cfg.enabled || cfg.profiler_socket.as_os_str().is_empty() {
        return Ok(None);
    }
    if !cfg.profiler_plugin_install.as_os_str().is_empty() {
        match bundled_plugin().and_then(|src| install_plugin(&src, &cfg.profiler_plugin_install).map(|_| src)) {
            Ok(src) => info!(from = %src.display(), to = %cfg.profiler_plugin_install.display(), "installed the NCCL profiler plugin"),
            Err(e) => warn!(to = %cfg.profiler_plugin_install.display(), "cannot install the NCCL profiler plugin: {e}"),
        }
    }
    let rx = Receiver::bind(&cfg.profiler_socket)?;
    // A selection that does not resolve fails the collective probes' start (logged there):
    // then no records are kept anyway.
    Ok(Some(match cfg.select.resolve() {
        Ok(sel) => rx.select(admission::SenderSelection::new(sel, cfg.proc_root.clone())),
        Err(_) => rx,
    }))
}

/// `agent check`: where the plugin's records go and whether the plugin to install is there;
/// (ok, detail). Reads only: binds nothing, copies nothing.
pub fn check(cfg: &crate::config::CollectivesConfig) -> (bool, String) {
    if !cfg.enabled || cfg.profiler_socket.as_os_str().is_empty() {
        return (true, "off ([collectives] profiler_socket is empty or the probes are off): NCCL collectives are timed at enqueue".into());
    }
    let sock = &cfg.profiler_socket;
    let listening = crate::sources::sockpath::listening(sock);
    let mut detail = format!("socket {} ({})", sock.display(), if listening { "an agent listens" } else { "not bound now: the agent binds it at start" });
    if cfg.profiler_plugin_install.as_os_str().is_empty() {
        detail.push_str("; profiler_plugin_install unset (jobs load a plugin installed otherwise)");
        return (true, detail);
    }
    match bundled_plugin() {
        Ok(p) if p.is_file() => {
            detail.push_str(&format!("; installs {} to {}", p.display(), cfg.profiler_plugin_install.display()));
            (true, detail)
        }
        Ok(p) => {
            detail.push_str(&format!("; {} is missing: nothing to install to {}", p.display(), cfg.profiler_plugin_install.display()));
            (false, detail)
        }
        Err(e) => (false, format!("{detail}; {e}")),
    }
}

/// The plugin shipped with the agent: `<prefix>/lib/stepwise/libnccl-profiler-stepwise.so`
/// for an agent at `<prefix>/bin/agent`.
pub fn bundled_plugin() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("the agent's own path: {e}"))?;
    let prefix = exe.parent().and_then(Path::parent).ok_or_else(|| format!("{} has no prefix directory", exe.display()))?;
    Ok(prefix.join("lib/stepwise").join(PLUGIN_FILE))
}

/// The plugin's file name, as jobs load it.
pub const PLUGIN_FILE: &str = "libnccl-profiler-stepwise.so";

/// Copies `src` to `dst` through a temporary file and a rename: a job loading the plugin
/// meanwhile sees the old file or the new one, never half of one (and processes that mapped
/// the old one keep it).
pub fn install_plugin(src: &Path, dst: &Path) -> Result<(), String> {
    let tmp = dst.with_extension(format!("so.tmp{}", std::process::id()));
    if let Some(dir) = dst.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    std::fs::copy(src, &tmp).map_err(|e| format!("cannot copy {} to {}: {e}", src.display(), tmp.display()))?;
    let _ = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755));
    std::fs::rename(&tmp, dst).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot rename {} to {}: {e}", tmp.display(), dst.display())
    })
}

/// Starts the receiver's thread on the collectives' history.
pub fn start_configured(rx: Option<Receiver>, history: Option<SharedHistory>, registry: &mut Registry) -> Option<std::thread::JoinHandle<()>> {
    let rx = rx?;
    let Some(history) = history else {
        warn!(path = %rx.path.display(), "the collective probes are not running: profiler plugin records are not kept");
        return None;
    };
    match rx.start(history, ProfilerMetrics::register(registry)) {
        Ok(t) => Some(t),
        Err(e) => {
            warn!("cannot start the profiler receiver thread: {e}");
            None
        }
    }
}

/// Decodes one datagram from `peer` (its credentials) into the history and counts it: the
/// header's pid must be the sender's, the sender one `selected` says is the job's, and each
/// record passes admission control ([`super::admission`]); what is refused is counted by
/// reason.
pub fn handle_datagram(h: &mut super::history::History, b: &[u8], peer: Option<Peer>, selected: impl FnOnce(u32) -> bool, m: &ProfilerMetrics, now: f64) {
    let (mut hd, mut recs) = match wire::decode(b) {
        Ok(d) => d,
        Err(e) => {
            m.refused.inc();
            debug!("profiler datagram refused: {e}");
            return;
        }
    };
    let drop = |why: admission::Refusal, n: usize| {
        m.dropped.get_or_create(&ReasonLabel { reason: why.as_str() }).inc_by(n as u64);
    };
    match admission::sender_pid(hd.pid, peer, admission::nspids) {
        Ok(pid) if selected(pid) => hd.pid = pid,
        Ok(pid) => {
            debug!(pid, "profiler records refused: the sender is not selected");
            return drop(admission::Refusal::NotSelected, recs.len());
        }
        Err(why) => {
            debug!(claimed = hd.pid, ?peer, "profiler records refused: {}", why.as_str());
            return drop(why, recs.len());
        }
    }
    recs.retain(|r| match h.plugin.admission.admit(hd.pid, comm_of(r.comm_hash, r.func).0, now) {
        Ok(()) => true,
        Err(why) => {
            drop(why, 1);
            false
        }
    });
    let (host, clock, cap) = (h.host.clone(), h.clock, h.capacity());
    let (full, unsent) = h.plugin.push(&hd, &recs, &host, &clock, cap, now);
    if !recs.is_empty() {
        h.active_at = h.active_at.max(crate::engine::wall_now());
    }
    m.records.inc_by(recs.len() as u64);
    for r in &recs {
        m.proxy.observe(r);
        gpu_progress(&mut h.progress, r, hd.pid, &host, &clock);
    }
    m.plugin_drops.get_or_create(&ReasonLabel { reason: "ring_full" }).inc_by(full);
    m.plugin_drops.get_or_create(&ReasonLabel { reason: "unsent" }).inc_by(unsent);
}

/// The GPU side of a record's collective, for hang detection: a [`wire::FLAG_STARTED`]
/// record opens it at its GPU start, a completed GPU-timed record closes it.
fn gpu_progress(p: &mut super::progress::Progress, r: &Record, pid: u32, host: &std::sync::Arc<str>, clock: &ClockMap) {
    let c = call_of(r, pid, host, clock);
    if r.flags & wire::FLAG_STARTED != 0 {
        let since = r.gpu_start_host_ns().map_or(c.enter, |t| t as f64 * 1e-9);
        p.gpu_started(&c.call, since);
    } else if c.clock.timing == Timing::Gpu {
        p.observe(&c.call, c.enter, c.exit, c.clock.timing);
    }
}

#[cfg(test)]
#[path = "profiler_tests.rs"]
mod tests;
