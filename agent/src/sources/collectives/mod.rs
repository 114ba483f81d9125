//! Collective probes: every collective call of the traced processes on this host, from eBPF
//! uprobes on NCCL, MPI, gloo and user-defined symbols, without touching the processes.
//!
//! Flow: [`procs::scan`] finds processes mapping a target library → symbols are resolved in
//! the file ([`elf`]) and each distinct file offset is attached once (NCCL's weak `ncclX` and
//! strong `pncclX` share an address) → the RingBuf is drained → [`decode::CallDecoder`] pairs
//! entry/exit per thread and assigns `(CommId, seq)` → [`history::History`] and metrics.

pub mod admission;
mod attach;
pub mod comm_id;
pub mod decode;
mod drain;
pub mod elf;
pub mod exits;
pub mod gaps;
pub mod gpu_id;
pub mod history;
pub mod k8s;
pub mod links;
mod metrics;
mod net_metrics;
pub mod procs;
pub mod profiler;
pub mod progress;
mod sampled;
pub mod targets;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use agent_common::ProbeEvent;
use prometheus_client::registry::Registry;
use tracing::{debug, info, warn};

use self::{
    decode::{CallDecoder, DecodeError, Decoded, ProcInfo},
    elf::SymbolTable,
    history::{ClockMap, History},
    metrics::CollectiveMetrics,
    procs::FileKey,
    targets::{Family, Target, OMPI_COMM_NULL, OMPI_COMM_WORLD, OMPI_DATATYPES},
};
use crate::{
    config::collectives::{CollectivesConfig, UserProbe},
    ebpf::{AttachedLink, Probes},
};

/// The kernel's hostname.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_else(|_| "localhost".into())
}

/// Shared read access for the API and the timeline.
pub type SharedHistory = Arc<Mutex<History>>;

struct Attachment {
    target: usize,
    path: PathBuf,
    links: Vec<AttachedLink>,
    /// Sampled probes: (file offset, cookie, symbol) attached only in windows.
    sampled: Vec<(u64, u64, String)>,
    sampled_links: Vec<AttachedLink>,
    users: HashSet<u32>,
    symbols: SymbolTable,
    /// Attached at start-up from a library directory: kept while the file exists.
    pinned: bool,
    /// Probe ids registered for this file (forgotten when it is detached).
    probe_ids: Vec<u32>,
    /// Probes attached (entry and return, or the session program).
    attached_probes: usize,
}

/// The running probe service (owned by one blocking thread).
pub struct Collectives {
    cfg: CollectivesConfig,
    targets: Vec<Target>,
    globs: Vec<glob::Pattern>,
    selector: procs::Selector,
    probes: Probes,
    decoder: CallDecoder,
    attached: HashMap<FileKey, Attachment>,
    procs: HashMap<u32, ProcInfo>,
    rejected: HashSet<u32>,
    /// Pids whose first event was handled after the process had exited: neither selection
    /// nor process facts can be read, so their events are lost (recorded in the history).
    gone: HashSet<u32>,
    /// Traced processes found exited (CLOCK_MONOTONIC ns when found): kept until the
    /// consumer's watermark passes that time, so their last events — still in the ring when a
    /// starved agent rescans — are decoded, not lost, and their open calls are not taken for
    /// aborted ones.
    exiting: HashMap<u32, u64>,
    /// Pidfds of the traced processes, for how they exited (see [`exits`]).
    exits: exits::ExitWatch,
    /// How each process in `exiting` ended (read when it was found exited).
    exit_status: HashMap<u32, (Option<i32>, Option<i32>)>,
    /// The consumer's watermark (CLOCK_MONOTONIC ns) last published.
    drained_ns: u64,
    exe_cache: HashMap<FileKey, SymbolTable>,
    history: SharedHistory,
    metrics: CollectiveMetrics,
    net_metrics: net_metrics::NetMetrics,
    /// The sampled windows' schedule, and which requests were posted inside one.
    windows: sampled::Windows,
    next_probe_id: u32,
    last_drops: u64,
    self_pid: u32,
    /// Kernel-side drops so far, shared with the engine (steps get "incomplete data").
    drops_total: Arc<std::sync::atomic::AtomicU64>,
    /// Set once the start-up preload has attached the libraries found on disk: `/readyz`
    /// waits for it, so a job started right after readiness is seen from its first call.
    ready: Arc<std::sync::atomic::AtomicBool>,
    /// [`Collectives::status`] after every rescan, for `/api/v1/status`.
    status_shared: Arc<Mutex<serde_json::Value>>,
    /// Refreshes which NICs each traced process uses ([`links`]).
    linker: links::Linker,
    owners: crate::sources::tcp::own::Owners,
    /// The thread emptying the RingBuf while this one decodes and attaches (see [`drain`]);
    /// `None` before [`Collectives::run`] (tests feed [`Collectives::handle`] directly).
    drainer: Option<drain::Drainer>,
}

#[derive(Debug, thiserror::Error)]
pub enum CollectivesError {
    #[error(transparent)]
    Ebpf(#[from] crate::ebpf::EbpfError),
    #[error("invalid collectives.select: {0}")]
    Select(std::io::Error),
    #[error("invalid library glob {0:?}")]
    Glob(String),
}

/// Registers the families [`Collectives::new`] registers, without loading the probes: for the
/// metrics reference ([`crate::export::reference`]).
pub fn register_metrics(registry: &mut Registry) {
    let _ = (CollectiveMetrics::register(registry), net_metrics::NetMetrics::register(registry));
}

impl Collectives {
    pub fn new(cfg: CollectivesConfig, registry: &mut Registry) -> Result<Collectives, CollectivesError> {
        let mut targets: Vec<Target> = Vec::new();
        for f in &cfg.libraries {
            targets.push(match f {
                Family::Nccl => targets::nccl(),
                Family::Mpi => targets::mpi(),
                Family::Gloo => targets::gloo(),
                Family::User => continue,
            });
        }
        targets.extend(cfg.user.iter().map(UserProbe::target));
        let globs =
            targets.iter().map(|t| glob::Pattern::new(&t.library).map_err(|_| CollectivesError::Glob(t.library.clone()))).collect::<Result<Vec<_>, _>>()?;
        let selector = cfg.select.resolve().map_err(CollectivesError::Select)?;
        let probes = Probes::load()?;
        let host = cfg.host.clone().unwrap_or_else(hostname);
        let mut hist = History::new(host, cfg.history);
        hist.proc_root = cfg.proc_root.clone();
        hist.pod_logs = cfg.pod_logs.clone();
        let history = Arc::new(Mutex::new(hist));
        Ok(Collectives {
            targets,
            globs,
            selector,
            probes,
            decoder: CallDecoder::default(),
            attached: HashMap::new(),
            procs: HashMap::new(),
            rejected: HashSet::new(),
            gone: HashSet::new(),
            exiting: HashMap::new(),
            exits: Default::default(),
            exit_status: HashMap::new(),
            drained_ns: 0,
            exe_cache: HashMap::new(),
            history,
            metrics: CollectiveMetrics::register(registry),
            net_metrics: net_metrics::NetMetrics::register(registry),
            windows: sampled::Windows::new(),
            next_probe_id: 1,
            last_drops: 0,
            self_pid: std::process::id(),
            drops_total: Arc::default(),
            ready: Arc::default(),
            status_shared: Arc::new(Mutex::new(serde_json::json!({}))),
            linker: Default::default(),
            owners: Default::default(),
            drainer: None,
            cfg,
        })
    }

    pub fn history(&self) -> SharedHistory {
        self.history.clone()
    }

    /// The host's RDMA ports (from the topology under the agent's sysfs root), which a
    /// process's `NCCL_IB_HCA` / `UCX_NET_DEVICES` link it to.
    pub fn set_rdma_ports(&mut self, ports: Vec<links::RdmaPort>) {
        self.linker.set_rdma_ports(ports);
    }

    /// Where to publish the traced processes, for the tcp source to count their own bytes.
    pub fn set_owners(&mut self, owners: crate::sources::tcp::own::Owners) {
        self.owners = owners;
    }

    /// Kernel-side event drops so far.
    pub fn drops_handle(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.drops_total.clone()
    }

    /// True once start-up probing is done.
    pub fn ready_handle(&self) -> Arc<std::sync::atomic::AtomicBool> {
        self.ready.clone()
    }

    /// Attached libraries and traced processes, refreshed after every rescan.
    pub fn status_handle(&self) -> Arc<Mutex<serde_json::Value>> {
        self.status_shared.clone()
    }

    /// Probes target libraries found in `library_dirs` before any process maps them.
    pub fn preload(&mut self) {
        use std::os::unix::fs::MetadataExt;
        for dir in self.cfg.library_dirs.clone() {
            let Ok(rd) = std::fs::read_dir(&dir) else { continue };
            let mut entries: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
            entries.sort();
            for path in entries {
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("").to_string();
                let Some(ti) = self.globs.iter().position(|g| g.matches(&name)) else { continue };
                // Symlinks (libmpi.so → libmpi.so.40.30.4) resolve to the same inode: once.
                let Ok(md) = std::fs::metadata(&path) else { continue };
                if !md.is_file() {
                    continue;
                }
                let key = FileKey { dev: md.dev(), inode: md.ino() };
                if self.attached.contains_key(&key) {
                    continue;
                }
                self.attach_library(ti, &path, key);
                if let Some(a) = self.attached.get_mut(&key) {
                    a.pinned = true;
                }
            }
        }
    }

    /// Runs until `stop` returns true: drains events continuously, rescans periodically.
    pub fn run(mut self, stop: impl Fn() -> bool) {
        // The ring drains on its own thread from the start: the preload and every later
        // attachment may block this thread for seconds.
        self.drainer = match self.probes.take_ring().map(drain::Drainer::start) {
            Some(Ok(d)) => Some(d),
            Some(Err((e, reader))) => {
                warn!("cannot start the RingBuf drain thread ({e}); draining between attachments");
                self.probes.restore_ring(reader);
                None
            }
            None => None,
        };
        self.preload();
        // The first rescan attaches libraries already mapped by running processes.
        self.rescan();
        self.ready.store(true, std::sync::atomic::Ordering::Release);
        let mut last_scan = Instant::now();
        let mut buf: Vec<ProbeEvent> = Vec::with_capacity(4096);
        while !stop() {
            if last_scan.elapsed() >= self.cfg.rescan {
                // Decode what is queued first: a process the rescan finds gone must not lose
                // its last events (they would no longer pass the /proc-based selection).
                self.drain_now();
                self.rescan();
                last_scan = Instant::now();
                let st = self.status();
                if let Ok(mut g) = self.status_shared.lock() {
                    *g = st;
                }
            }
            self.sample_windows();
            let drained = self.next_batch(&mut buf, Duration::from_millis(20));
            self.handle(&buf);
            self.drained_to(drained);
        }
        self.close_window();
        self.detach_all();
        self.drainer = None;
    }

    /// The next events: from the drain thread (waiting up to `wait` for some), or read here;
    /// returns the consumer's watermark (see [`drain::Drainer::take`]), 0 when unknown.
    fn next_batch(&mut self, buf: &mut Vec<ProbeEvent>, wait: Duration) -> u64 {
        buf.clear();
        if let Some(d) = &self.drainer {
            return d.take(buf, wait);
        }
        if let Some(fd) = self.probes.ring_fd() {
            let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd; a timeout bounds the wait so stop() is honoured.
            unsafe { libc::poll(&mut pfd, 1, wait.as_millis().min(1000) as i32) };
        } else {
            std::thread::sleep(wait);
        }
        let started = mono_ns();
        match self.probes.drain(buf) {
            Ok(_) => started,
            Err(e) => {
                warn!("draining probe events: {e}");
                0
            }
        }
    }

    /// Drains and handles everything the ring holds now.
    fn drain_now(&mut self) {
        let mut buf: Vec<ProbeEvent> = Vec::new();
        let drained = if let Some(d) = &self.drainer {
            d.flush(&mut buf, Duration::from_millis(200))
        } else {
            let started = mono_ns();
            match self.probes.drain(&mut buf) {
                Ok(_) => started,
                Err(e) => {
                    warn!("draining probe events: {e}");
                    0
                }
            }
        };
        self.handle(&buf);
        self.drained_to(drained);
    }

    /// Processes that exited: once every event up to when the exit was seen is decoded, calls
    /// still open were aborted (killed inside a collective) and the process is forgotten.
    fn reap_exited(&mut self) {
        let now = mono_ns();
        for pid in self.procs.keys().copied().filter(|p| !procs::alive(&self.cfg.proc_root, *p)) {
            if let std::collections::hash_map::Entry::Vacant(e) = self.exiting.entry(pid) {
                e.insert(now);
                self.exit_status.insert(pid, self.exits.status(&self.cfg.proc_root, pid));
            }
        }
        // A watermark that stopped (no drain thread) holds nothing for more than 30 s.
        let ready: Vec<(u32, u64)> =
            self.exiting.iter().filter(|(_, t)| **t <= self.drained_ns || now.saturating_sub(**t) > 30_000_000_000).map(|(p, t)| (*p, *t)).collect();
        if ready.is_empty() {
            return;
        }
        let mut hist = match self.history.lock() {
            Ok(h) => h,
            Err(p) => p.into_inner(),
        };
        for (pid, seen) in ready {
            self.exiting.remove(&pid);
            for c in self.decoder.process_exited(pid, seen) {
                self.metrics.observe(&c);
                hist.push_call(c);
            }
            hist.process_exited(pid, seen, self.exit_status.remove(&pid).unwrap_or((None, None)));
            self.exits.forget(pid);
            if let Some(p) = self.procs.remove(&pid) {
                self.metrics.forget_rank_info(&p);
            }
            self.probes.forget_process(pid);
        }
    }

    /// Publishes the consumer's watermark (events before `mono_ns` are in the history).
    fn drained_to(&mut self, mono_ns: u64) {
        self.drained_ns = self.drained_ns.max(mono_ns);
        let mut hist = match self.history.lock() {
            Ok(h) => h,
            Err(p) => p.into_inner(),
        };
        hist.drained_to(mono_ns);
    }

    /// Processes a batch of events (also used by tests and benchmarks).
    pub fn handle(&mut self, events: &[ProbeEvent]) {
        if events.is_empty() {
            return;
        }
        // Events of a probe already detached (its link still being torn down): not received
        // events of the traced process, whose calls the file's current probes see.
        let mut retired = 0u64;
        let mut admitted = false;
        for ev in events {
            if !self.procs.contains_key(&ev.pid) {
                admitted |= self.admit(ev.pid);
            }
        }
        if admitted {
            // A new rank's first call: the tcp source finds its connections now (its fast
            // lane dumps on the change), not at the next rescan.
            self.owners.publish(&self.cfg.proc_root, self.procs.keys().copied());
        }
        let history = self.history.clone();
        let mut hist = match history.lock() {
            Ok(h) => h,
            Err(p) => p.into_inner(),
        };
        hist.clock = ClockMap::now();
        self.metrics.clock_error.set(hist.clock.error_seconds);
        for ev in events {
            let Some(proc) = self.procs.get_mut(&ev.pid) else {
                if self.gone.contains(&ev.pid) {
                    let t = hist.clock.wall(ev.ts_ns);
                    hist.push_lost(t);
                    self.metrics.decode_error("process_gone");
                }
                continue;
            };
            match self.decoder.feed(ev, proc) {
                Ok(Decoded::Call(c)) => {
                    proc.called = true;
                    self.metrics.observe(&c);
                    hist.push_call_timed(c, procs::launch_blocking(&proc.env));
                }
                Ok(Decoded::CallWithError(c, e)) => {
                    proc.called = true;
                    self.metrics.decode_error(e.kind());
                    self.metrics.observe(&c);
                    hist.push_call_timed(c, procs::launch_blocking(&proc.env));
                }
                // Posted after its window closed, or its completion first seen after the
                // window's drain: not sampled.
                Ok(Decoded::Net(n)) if !self.windows.sampled(n.posted_ns, n.completed_ns) => {
                    self.metrics.net_requests_unsampled.inc();
                }
                Ok(Decoded::Net(n)) => {
                    self.metrics.net_requests.inc();
                    self.net_metrics.observe(&n, net_metrics::nic_label(&hist.links, n.pid));
                    hist.push_net(n);
                }
                Ok(Decoded::Nothing) => {}
                Err(DecodeError::UnknownProbe) if ev.probe_id < self.next_probe_id => {
                    retired += 1;
                    self.metrics.decode_error("detached_probe");
                }
                Err(e) => self.metrics.decode_error(e.kind()),
            }
        }
        hist.set_open(self.decoder.open_calls());
        self.metrics.events.inc_by(events.len() as u64 - retired);
        let drops = self.probes.drops();
        if drops > self.last_drops {
            self.metrics.drops.inc_by(drops - self.last_drops);
            self.last_drops = drops;
            self.drops_total.store(drops, std::sync::atomic::Ordering::Relaxed);
        }
        self.metrics.comms.set(self.decoder.tracked_comms() as i64);
    }

    /// An event from a pid not yet scanned: a process that started after the last rescan
    /// (its first calls — communicator creation — must not be lost) or an unselected one.
    fn admit(&mut self, pid: u32) -> bool {
        if self.rejected.contains(&pid) || self.gone.contains(&pid) {
            return false;
        }
        if pid == self.self_pid || !self.selector.selects(&self.cfg.proc_root, pid) {
            // A process that exited before this thread got to its first event (a starved
            // agent) cannot be told apart from an unselected one: its events are lost, and
            // the steps they fall in are incomplete.
            if pid != self.self_pid && !procs::alive(&self.cfg.proc_root, pid) {
                self.gone.insert(pid);
            } else {
                self.rejected.insert(pid);
            }
            return false;
        }
        let found = procs::libs_of(&self.cfg.proc_root, pid, &self.globs);
        let libs: Vec<(usize, u64, SymbolTable)> =
            found.iter().filter_map(|(ti, _, key, base)| self.attached.get(key).map(|a| (*ti, *base, a.symbols.clone()))).collect();
        let info = self.proc_info(pid, &libs);
        self.track(pid, info);
        self.exits.watch(pid);
        true
    }

    fn proc_info(&mut self, pid: u32, libs: &[(usize, u64, SymbolTable)]) -> ProcInfo {
        let dir = self.cfg.proc_root.join(pid.to_string());
        let raw = super::fsread::read(&dir.join("environ")).unwrap_or_default();
        let pod = k8s::pod_of(&self.cfg.proc_root, pid, &self.cfg.pod_logs);
        let host = self.history.lock().map(|h| h.host.to_string()).unwrap_or_default();
        let mut info = ProcInfo { env: procs::parse_environ(&raw), pod, host, ..Default::default() };
        for (ti, base, syms) in libs {
            if self.targets[*ti].family != Family::Mpi {
                continue;
            }
            ompi_objects(&mut info, syms, base.wrapping_sub(syms.first_load_vaddr));
            // A PIE executable that names MPI_COMM_WORLD or MPI_DOUBLE gets *copy
            // relocations*: the objects live in the executable and the library uses those
            // copies, so the executable's definitions win.
            if let Some((exe_base, exe_syms)) = self.exe_symbols(pid) {
                ompi_objects(&mut info, &exe_syms, exe_base.wrapping_sub(exe_syms.first_load_vaddr));
            }
        }
        debug!(pid, ompi_world = ?info.ompi_world, types = info.ompi_types.len(), env = info.env.len(), pod = ?info.pod, "process facts");
        self.metrics.set_rank_info(&info);
        info
    }

    /// The main executable's MPI data symbols and load base, cached per executable file.
    fn exe_symbols(&mut self, pid: u32) -> Option<(u64, SymbolTable)> {
        use std::os::unix::fs::MetadataExt;
        let dir = self.cfg.proc_root.join(pid.to_string());
        let exe = dir.join("exe");
        let md = std::fs::metadata(&exe).ok()?;
        let key = FileKey { dev: md.dev(), inode: md.ino() };
        let maps = super::fsread::read_to_string(&dir.join("maps")).ok()?;
        let base = procs::parse_maps(&maps).into_iter().find(|m| m.inode == key.inode && m.offset == 0)?.start;
        if !self.exe_cache.contains_key(&key) {
            let mut wanted: Vec<&str> = OMPI_DATATYPES.iter().map(|(n, _)| *n).collect();
            wanted.extend([OMPI_COMM_WORLD, OMPI_COMM_NULL]);
            let t = SymbolTable::read(&exe, &wanted).unwrap_or_default();
            if self.exe_cache.len() > 256 {
                self.exe_cache.clear();
            }
            self.exe_cache.insert(key, t);
        }
        self.exe_cache.get(&key).map(|t| (base, t.clone()))
    }

    fn rescan(&mut self) {
        let found = procs::scan(&self.cfg.proc_root, &self.globs, &self.selector, self.self_pid);
        let mut users: HashMap<FileKey, HashSet<u32>> = HashMap::new();
        for f in &found {
            for (ti, path, key, _) in &f.libs {
                users.entry(*key).or_default().insert(f.pid);
                if !self.attached.contains_key(key) {
                    self.attach_library(*ti, path, *key);
                }
            }
            let needs_info = !self.procs.contains_key(&f.pid)
                || self.procs.get(&f.pid).is_some_and(|p| p.ompi_world.is_none() && f.libs.iter().any(|(t, ..)| self.targets[*t].family == Family::Mpi));
            if needs_info {
                let libs: Vec<(usize, u64, SymbolTable)> =
                    f.libs.iter().filter_map(|(ti, _, key, base)| self.attached.get(key).map(|a| (*ti, *base, a.symbols.clone()))).collect();
                let info = self.proc_info(f.pid, &libs);
                self.track(f.pid, info);
                self.exits.watch(f.pid);
            }
        }
        self.reap_exited();
        let proc_root = self.cfg.proc_root.clone();
        let dead: Vec<u32> = self.rejected.iter().copied().filter(|p| !procs::alive(&proc_root, *p)).collect();
        for pid in dead {
            self.rejected.remove(&pid);
            self.probes.forget_process(pid);
        }
        for pid in std::mem::take(&mut self.gone) {
            self.probes.forget_process(pid);
        }
        self.repreload_replaced();
        // Detach libraries no process maps any more.
        let stale: Vec<FileKey> = self.attached.iter().filter(|(k, a)| !users.contains_key(k) && !a.pinned).map(|(k, _)| *k).collect();
        if !stale.is_empty() {
            // The file's last events first: its probe ids are forgotten below, and links are
            // torn down in the background (seconds), while a new attachment of the same file
            // may already fire.
            self.drain_now();
        }
        for k in stale {
            if let Some(a) = self.attached.remove(&k) {
                info!(library = %a.path.display(), "last user exited; detaching");
                for id in &a.probe_ids {
                    self.decoder.unregister(*id);
                }
                for l in a.links.into_iter().chain(a.sampled_links) {
                    self.probes.detach(l);
                }
            }
        }
        for (k, u) in users {
            if let Some(a) = self.attached.get_mut(&k) {
                a.users = u;
            }
        }
        self.metrics.processes.set(self.procs.len() as i64);
        let mut per_lib: BTreeMap<&'static str, i64> = BTreeMap::new();
        for a in self.attached.values() {
            *per_lib.entry(self.targets[a.target].family.as_str()).or_default() += a.attached_probes as i64;
        }
        for f in ["nccl", "mpi", "gloo", "user"] {
            self.metrics.set_attached(f, per_lib.get(f).copied().unwrap_or(0));
        }
        self.owners.publish(&self.cfg.proc_root, self.procs.keys().copied());
        let (host, gpus) = self.history.lock().map(|h| (h.host.to_string(), h.plugin.gpus())).unwrap_or_default();
        let says = self.procs.iter().map(|(p, i)| (links::Says { pid: *p, env: &i.env, gpu: gpus.get(p).map(String::as_str) }, i.called));
        if let Some(l) = self.linker.refresh(&host, &self.cfg.proc_root, says) {
            self.metrics.label_nics(self.procs.iter_mut(), &l, &gpus, &self.cfg.proc_root);
            if let Ok(mut h) = self.history.lock() {
                h.links = l;
            }
        }
        // Who each process is, for the per-rank series' labels (its GPU as its plugin said).
        let identities =
            self.procs.iter().map(|(p, i)| (*p, crate::labels::RankIdentity { gpu: gpus.get(p).cloned().unwrap_or_default(), ..i.identity() })).collect();
        if let Ok(mut h) = self.history.lock() {
            h.identities = identities;
        }
    }

    /// A library preloaded from `library_dirs` and then replaced on disk (a package upgrade:
    /// a new inode at the same path) is unpinned — its probes go once no process maps the old
    /// file — and the directories are preloaded again, so a job started from now on is seen
    /// from its first call, as before the upgrade.
    fn repreload_replaced(&mut self) {
        use std::os::unix::fs::MetadataExt;
        let same = |p: &Path, k: &FileKey| std::fs::metadata(p).is_ok_and(|m| m.dev() == k.dev && m.ino() == k.inode);
        let mut replaced = false;
        for (k, a) in self.attached.iter_mut() {
            if a.pinned && !same(&a.path, k) {
                info!(library = %a.path.display(), "preloaded library replaced on disk; probing the new file");
                a.pinned = false;
                replaced = true;
            }
        }
        if replaced {
            self.preload();
        }
    }

    /// Keeps a traced process's facts. Its session-probed calls (asynchronous NCCL calls) are
    /// complete at their entry from now on, unless they block (`CUDA_LAUNCH_BLOCKING=1`):
    /// the session program then skips their return. Calls it made before this keep their
    /// return, decoded as before.
    fn track(&mut self, pid: u32, info: ProcInfo) {
        self.probes.set_entry_alone(pid, !procs::launch_blocking(&info.env));
        self.procs.insert(pid, info);
    }

    /// A JSON summary for `/api/v1/status`.
    pub fn status(&self) -> serde_json::Value {
        let profiler = match self.history.lock() {
            Ok(h) => h.plugin.status(crate::engine::wall_now()),
            Err(p) => p.into_inner().plugin.status(crate::engine::wall_now()),
        };
        serde_json::json!({
            "profiler": profiler,
            "libraries": self.attached.values().map(|a| serde_json::json!({
                "path": a.path.display().to_string(),
                "family": self.targets[a.target].family,
                "probes": a.links.len() / 2,
                "processes": a.users.len(),
            })).collect::<Vec<_>>(),
            "processes": self.procs.len(),
        })
    }
}

/// CLOCK_MONOTONIC now, in ns (the clock of `bpf_ktime_get_ns`).
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// OpenMPI's predefined objects that `syms` defines (datatypes, `MPI_COMM_WORLD`,
/// `MPI_COMM_NULL`), at their runtime addresses (`bias` + link-time address); each found
/// replaces what an earlier table gave.
fn ompi_objects(info: &mut ProcInfo, syms: &SymbolTable, bias: u64) {
    for (name, size) in OMPI_DATATYPES {
        if let Some(v) = syms.vaddr(name) {
            info.ompi_types.insert(bias.wrapping_add(v), *size);
        }
    }
    if let Some(v) = syms.vaddr(OMPI_COMM_WORLD) {
        info.ompi_world = Some(bias.wrapping_add(v));
    }
    if let Some(v) = syms.vaddr(OMPI_COMM_NULL) {
        info.ompi_null = Some(bias.wrapping_add(v));
    }
}

#[cfg(test)]
mod tests;
