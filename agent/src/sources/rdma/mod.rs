//! RDMA sysfs source: `<sysfs_root>/class/infiniband/<dev>/ports/<p>/{counters,counters_ext,
//! hw_counters,state,rate,link_layer}` (docs/platform-facts.md §1).
//!
//! Each counter file keeps its last raw reading and a cumulative value in the metric's unit.
//! The first reading of a counter becomes its initial cumulative value (×scale), as
//! node_exporter does: a Prometheus counter that starts at the device's absolute count is
//! what dashboards expect, and `rate()` ignores the starting value anyway. Later readings add
//! the delta given by the counter's semantics ([`crate::sources::counter`]; widths in
//! [`spec`]). So exported counters never go backwards, whatever the hardware does.
//!
//! Files stay open between sweeps and are re-read with `pread` ([`files`]); each port keeps
//! its labels, series handles and per-file counter slots ([`port`]), so a steady-state sweep
//! is one syscall per counter and no label hashing.

mod files;
mod gather;
mod metrics;
pub(crate) mod parse;
mod port;
pub(crate) mod spec;
#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::PathBuf,
    time::Duration,
};

use prometheus_client::registry::Registry;
use serde::Serialize;
use tracing::{debug, warn};

use super::{kind, Source, SourceContext, SourceError, SweepReport};
use files::{sorted_names, Budget, Check, Dir, GROUP_DIRS};
use metrics::Metrics;
use port::{Io, PortState, Scratch};
use spec::{Group, Typed};

const SOURCE: &str = "rdma";
/// `stepwise_errors_total` kind for generic counter names dropped by the label cap.
pub const KIND_CARDINALITY: &str = "cardinality";
/// Most distinct counter names exported as the `counter` label (mlx5 has about 60).
pub const MAX_COUNTER_NAMES: usize = 256;
/// Directories are re-listed at least this often (see [`files`]).
const RELIST_PERIOD: Duration = Duration::from_secs(30);
/// Counters that only feed metrics (the generic `stepwise_rdma_{port,hw}_stat_total`
/// families, and `hw_counters/lifespan`) are read at least this often, not every sweep of a
/// faster interval: attribution never reads them and Prometheus scrapes far more slowly. The
/// counters attribution uses, and `state`, are read every sweep (see [`port`]).
pub const METRICS_PERIOD: Duration = Duration::from_secs(1);

/// Plain-data snapshot of one port's cumulative counters, for consumers that diff them over
/// step windows (attribution). Values are in base units and never decrease.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PortCounters {
    pub device: String,
    pub port: u32,
    pub netdev: Option<String>,
    pub rail: u32,
    /// The port was seen in the last sweep of its device (false once it vanished).
    pub present: bool,
    /// State is ACTIVE.
    pub up: bool,
    pub rate_bytes_per_second: Option<f64>,
    pub transmit_bytes: u64,
    pub receive_bytes: u64,
    pub transmit_packets: u64,
    pub receive_packets: u64,
    pub transmit_wait_ticks: u64,
    pub ecn_marked_packets: u64,
    pub cnp_sent: u64,
    pub cnp_handled: u64,
    /// Sum of `stepwise_nic_retransmit_events_total` over its reasons.
    pub retransmits: u64,
    /// CLOCK_MONOTONIC ns (the clock of `bpf_ktime_get_ns`) when the port was last read.
    pub read_monotonic_ns: u64,
    /// Wall-clock ns since the Unix epoch when the port was last read.
    pub read_unix_ns: u64,
}

/// `class/infiniband`, open: listed every sweep on sysfs (a removed device must vanish in
/// the sweep that no longer lists it), listed only when its stamp changed elsewhere.
#[derive(Debug, Default)]
struct ClassDir {
    dir: Option<Dir>,
    names: Vec<String>,
}

impl ClassDir {
    /// Brings `names` (sorted) up to date; false if the directory cannot be listed.
    fn refresh(&mut self, path: &std::path::Path, budget: &Budget) -> bool {
        if let Some(dir) = &mut self.dir {
            match dir.check() {
                Check::Same if !dir.sysfs => return true,
                Check::Gone => self.dir = None,
                _ => {}
            }
        }
        if self.dir.is_none() {
            self.dir = Dir::open_path(path, budget).ok();
        }
        match self.dir.as_ref().map(Dir::names) {
            Some(Ok(names)) => self.names = names,
            _ => {
                self.dir = None;
                return false;
            }
        }
        true
    }
}

/// A device's `ports/` directory, open, with its numeric entries (sorted by name).
#[derive(Debug, Default)]
struct PortsDir {
    /// `None`: not open (first sweep, or it could not be opened): listed by path every sweep.
    dir: Option<Dir>,
    ports: Vec<(String, u32)>,
    relist_in: u32,
}

impl PortsDir {
    /// Brings the listing up to date: re-listed when the directory changed, or every
    /// [`RELIST_PERIOD`] (see [`files`]).
    fn refresh(&mut self, path: &std::path::Path, relist_every: u32, budget: &Budget) {
        let due = self.relist_in == 0;
        self.relist_in = if due { relist_every.saturating_sub(1) } else { self.relist_in - 1 };
        if let Some(dir) = &mut self.dir {
            match dir.check() {
                Check::Same if !due => return,
                Check::Gone => self.dir = None,
                _ if !dir.sysfs && !dir.is_at(path) => self.dir = None,
                _ => {}
            }
        }
        // Opened (its stamp taken) before listing, so a change after the listing shows.
        if self.dir.is_none() {
            self.dir = Dir::open_path(path, budget).ok();
        }
        let names = match &self.dir {
            Some(d) => d.names().ok(),
            None => sorted_names(path),
        };
        self.ports = names.map(port_entries).unwrap_or_default();
        // Past the descriptor budget the directory is listed by path at each sweep instead.
        if budget.over() {
            self.dir = None;
        }
    }
}

#[derive(Debug, Default)]
struct DeviceState {
    present: bool,
    pci: Option<String>,
    /// `selected`, `excluded` or `probe_safe_disabled`.
    mode: &'static str,
    /// `rdma/<dev>`: the probe-safe key.
    key: String,
    /// `<sysfs>/class/infiniband/<dev>/ports`.
    ports_path: PathBuf,
    /// Topology generation `pci` was taken from.
    topo_gen: Option<u64>,
    ports: BTreeMap<u32, PortState>,
    listing: PortsDir,
}

impl DeviceState {
    /// Closes every file of the device (it vanished or is no longer read).
    fn close(&mut self) {
        self.listing = PortsDir::default();
        self.ports.values_mut().for_each(|p| p.files = None);
    }
}

#[derive(Clone, Debug, Default)]
struct TopoEntry {
    netdev: Option<String>,
    rail: u32,
    pci: Option<String>,
}

/// The RDMA sysfs source.
pub struct RdmaSource {
    ctx: SourceContext,
    metrics: Metrics,
    devices: BTreeMap<String, DeviceState>,
    topo_devices: Vec<String>,
    topo: HashMap<(String, u32), TopoEntry>,
    /// Bumped by every rediscovery: ports recompute their labels.
    topo_gen: u64,
    counter_names: BTreeSet<String>,
    budget: Budget,
    relist_every: u32,
    /// Sweeps between reads of the metric-only counters (see [`METRICS_PERIOD`]).
    metrics_every: u32,
    sweeps: u64,
    scratch: Scratch,
    /// `<sysfs>/class/infiniband`.
    class_path: PathBuf,
    class: ClassDir,
}

/// How many sweeps apart hw_counters must be read so that two reads never fall in the same
/// driver cache window. mlx5 caches hw_counters for `lifespan` ms: a read inside the window
/// returns the previous values, so sampling faster would export a zero delta followed by a
/// double one (a fake burst) and cost firmware commands for nothing.
pub fn hw_every(interval: Duration, lifespan_ms: u64) -> u32 {
    let interval_ns = interval.as_nanos().max(1);
    let lifespan_ns = u128::from(lifespan_ms) * 1_000_000;
    if interval_ns >= lifespan_ns {
        return 1;
    }
    u32::try_from(lifespan_ns.div_ceil(interval_ns)).unwrap_or(u32::MAX).max(1)
}

fn now_ns() -> (u64, u64) {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let mono = if rc == 0 { (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64) } else { 0 };
    let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)).unwrap_or(0);
    (mono, unix)
}

/// Numeric entries of a `ports/` directory, sorted by name as listed.
fn port_entries(names: Vec<String>) -> Vec<(String, u32)> {
    names.into_iter().filter_map(|n| n.parse::<u32>().ok().map(|p| (n, p))).collect()
}

impl RdmaSource {
    pub fn new(ctx: SourceContext, registry: &mut Registry) -> Self {
        let metrics = Metrics::register(registry);
        let class_path = ctx.sysfs_root.join("class/infiniband");
        let every = |period: Duration| u32::try_from(period.as_nanos().div_ceil(ctx.interval.as_nanos().max(1))).unwrap_or(u32::MAX).max(1);
        let (relist_every, metrics_every) = (every(RELIST_PERIOD), every(METRICS_PERIOD));
        RdmaSource {
            ctx,
            metrics,
            devices: BTreeMap::new(),
            topo_devices: Vec::new(),
            topo: HashMap::new(),
            topo_gen: 0,
            counter_names: BTreeSet::new(),
            budget: Budget::from_rlimit(),
            relist_every,
            metrics_every,
            sweeps: 0,
            scratch: Scratch::default(),
            class_path,
            class: ClassDir::default(),
        }
    }

    /// The `port_xmit_wait` tick length in seconds (`[steps.params] xmit_wait_tick_seconds`):
    /// `stepwise_nic_transmit_wait_seconds_total` is ticks times it.
    pub fn with_xmit_wait_tick_seconds(self, seconds: f64) -> Self {
        self.metrics.tick_length.set(seconds);
        self
    }

    /// A source registering into a private registry, for tools and tests outside the daemon
    /// (its metrics are not exported; read them through [`RdmaSource::ports`]).
    pub fn standalone(ctx: SourceContext) -> Self {
        RdmaSource::new(ctx, &mut Registry::default())
    }

    /// Cumulative value of one `hw_counters/<name>` file of a port (after wrap/reset handling).
    pub fn hw_counter_total(&self, device: &str, port: u32, name: &str) -> Option<u64> {
        let p = self.devices.get(device)?.ports.get(&port)?;
        p.counters.iter().find(|c| c.group == Group::Hw && c.name == name).map(|c| c.total)
    }

    /// Cumulative counters of every port seen so far (vanished ones included, `present` false).
    pub fn ports(&self) -> Vec<PortCounters> {
        self.devices
            .iter()
            .flat_map(|(device, d)| d.ports.iter().map(move |(port, p)| (device, port, p)))
            .map(|(device, port, p)| PortCounters {
                device: device.clone(),
                port: *port,
                netdev: p.netdev.clone(),
                rail: p.rail,
                present: p.present,
                up: p.up,
                rate_bytes_per_second: p.rate,
                transmit_bytes: p.total(Typed::TransmitBytes),
                receive_bytes: p.total(Typed::ReceiveBytes),
                transmit_packets: p.total(Typed::TransmitPackets),
                receive_packets: p.total(Typed::ReceivePackets),
                transmit_wait_ticks: p.total(Typed::TransmitWaitTicks),
                ecn_marked_packets: p.total(Typed::EcnMarkedPackets),
                cnp_sent: p.total(Typed::CnpSent),
                cnp_handled: p.total(Typed::CnpHandled),
                retransmits: p.retransmits(),
                read_monotonic_ns: p.read_monotonic_ns,
                read_unix_ns: p.read_unix_ns,
            })
            .collect()
    }

    /// Descriptors the source holds open (for tests and status).
    pub fn open_files(&self) -> usize {
        self.budget.held()
    }

    fn err(&self, kind: &'static str) {
        self.ctx.errors.inc(SOURCE, kind);
    }

    fn rediscover(&mut self, names: &[String]) {
        let topo = crate::topology::discover(&self.ctx.sysfs_root, &self.ctx.rails);
        self.topo = topo
            .nics
            .into_iter()
            .filter_map(|n| {
                let key = (n.ib_device?, n.port?);
                Some((key, TopoEntry { netdev: n.netdev, rail: n.rail, pci: n.pci }))
            })
            .collect();
        self.topo_devices = names.to_vec();
        self.topo_gen += 1;
        debug!(ports = self.topo.len(), "rdma: topology rediscovered");
    }

    fn vanish_device(&mut self, dev: &str) {
        let Some(d) = self.devices.get_mut(dev) else { return };
        if !d.present {
            return;
        }
        d.present = false;
        d.close();
        if d.mode != "selected" {
            return;
        }
        warn!(device = dev, "rdma: device vanished; its counters keep their last values");
        for p in d.ports.values_mut() {
            p.vanish(&self.metrics);
        }
        self.err(kind::VANISHED);
    }

    fn sweep_device(&mut self, dev: &str, report: &mut SweepReport) {
        let sweep_no = self.sweeps;
        let Some(d) = self.devices.get_mut(dev) else { return };
        d.listing.refresh(&d.ports_path, self.relist_every, &self.budget);
        let mut io = Io {
            metrics: &self.metrics,
            errors: &self.ctx.errors,
            names: &mut self.counter_names,
            budget: &self.budget,
            interval: self.ctx.interval,
            relist_every: self.relist_every,
            metrics_every: self.metrics_every,
            scratch: &mut self.scratch,
        };
        let mut any_ok = false;
        let mut relist = false;
        for (name, port) in &d.listing.ports {
            let st = d.ports.entry(*port).or_insert_with(|| PortState::new(d.ports_path.join(name)));
            let topo = if st.labels_stale(self.topo_gen) { self.topo.get(&(dev.to_string(), *port)) } else { None };
            let Some((read, skipped)) = st.sweep(&mut io, dev, *port, topo, self.topo_gen) else {
                // Listed but gone by the time it was read: not seen (vanished if it was
                // known); the directory is listed again next sweep.
                if st.labels.is_none() {
                    d.ports.remove(port);
                }
                relist = true;
                continue;
            };
            st.seen = sweep_no;
            any_ok |= read > 0;
            report.devices += 1;
            report.values += read;
            report.skipped += skipped;
        }
        if relist {
            d.listing.relist_in = 0;
        }
        let mut gone = 0;
        for (port, p) in d.ports.iter_mut().filter(|(_, p)| p.present && p.seen != sweep_no) {
            warn!(device = dev, port = *port, "rdma: port vanished");
            p.vanish(&self.metrics);
            gone += 1;
        }
        for _ in 0..gone {
            self.ctx.errors.inc(SOURCE, kind::VANISHED);
        }
        // Probe-safe bookkeeping: a sweep is "ok" if at least one counter value was usable.
        // `N/A (no PMA)` and EIO both mean the firmware query failed, which is what floods
        // dmesg on restricted functions.
        if self.ctx.selector.record(&d.key, any_ok) {
            warn!(device = dev, "rdma: every counter read failed twice; probe-safe mode stops reading this device");
            self.ctx.errors.inc(SOURCE, kind::PROBE_SAFE_SKIP);
            d.mode = "probe_safe_disabled";
            d.close();
        }
    }
}

impl Source for RdmaSource {
    fn nic_samples(&self) -> Vec<super::nic::NicPart> {
        nic_parts(self.ports())
    }
    fn fast_sweep(&mut self, nics: &BTreeSet<String>) -> bool {
        let mut io = Io {
            metrics: &self.metrics,
            errors: &self.ctx.errors,
            names: &mut self.counter_names,
            budget: &self.budget,
            interval: self.ctx.interval,
            relist_every: self.relist_every,
            metrics_every: self.metrics_every,
            scratch: &mut self.scratch,
        };
        let mut any = false;
        for (dev, d) in self.devices.iter_mut().filter(|(_, d)| d.present) {
            for (port, p) in d.ports.iter_mut() {
                let name = p.netdev.clone().unwrap_or_else(|| format!("{dev}/{port}"));
                if nics.contains(&name) {
                    any |= p.fast(&mut io, dev, *port);
                }
            }
        }
        any
    }
    fn name(&self) -> &'static str {
        SOURCE
    }

    fn sweep(&mut self) -> Result<SweepReport, SourceError> {
        self.sweeps += 1;
        if !self.class.refresh(&self.class_path, &self.budget) {
            let present: Vec<String> = self.devices.iter().filter(|(_, d)| d.present).map(|(n, _)| n.clone()).collect();
            for d in present {
                self.vanish_device(&d);
            }
            return Err(SourceError::Absent {
                source_name: SOURCE,
                reason: format!("{} does not exist (no RDMA driver loaded, or wrong --sysfs-root)", self.class_path.display()),
            });
        }
        // Taken out for the sweep (devices are looked up by name while `self` changes).
        let names = std::mem::take(&mut self.class.names);
        if names != self.topo_devices {
            self.rediscover(&names);
        }
        let gone: Vec<String> = self.devices.iter().filter(|(n, d)| d.present && !names.contains(n)).map(|(n, _)| n.clone()).collect();
        for d in gone {
            self.vanish_device(&d);
        }
        let mut report = SweepReport::default();
        for dev in &names {
            if !self.devices.contains_key(dev) {
                let d = DeviceState { key: format!("{SOURCE}/{dev}"), ports_path: self.class_path.join(dev).join("ports"), ..DeviceState::default() };
                self.devices.insert(dev.clone(), d);
            }
            let Some(d) = self.devices.get_mut(dev) else { continue };
            if d.topo_gen != Some(self.topo_gen) {
                d.topo_gen = Some(self.topo_gen);
                d.pci = self.topo.iter().find(|((n, _), _)| n == dev).and_then(|(_, t)| t.pci.clone());
            }
            d.present = true;
            if !self.ctx.selector.selects(dev, d.pci.as_deref()) {
                d.mode = "excluded";
                d.close();
                continue;
            }
            if self.ctx.selector.disabled(&d.key) {
                d.mode = "probe_safe_disabled";
                d.close();
                continue;
            }
            d.mode = "selected";
            self.sweep_device(dev, &mut report);
        }
        self.class.names = names;
        Ok(report)
    }

    fn status(&self) -> serde_json::Value {
        use serde_json::Value;
        // Built as values directly: `json!` would serialize every nested value a second time.
        fn obj<const N: usize>(fields: [(&str, Value); N]) -> Value {
            Value::Object(fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
        }
        let opt_str = |s: &Option<String>| s.clone().map_or(Value::Null, Value::String);
        let devices: Vec<Value> = self
            .devices
            .iter()
            .map(|(name, d)| {
                let ports: Vec<Value> = d
                    .ports
                    .iter()
                    .map(|(port, p)| {
                        let groups = GROUP_DIRS
                            .iter()
                            .zip(&p.groups)
                            .filter_map(|(g, rs)| rs.map(|(r, s)| (g.to_string(), obj([("read", r.into()), ("skipped", s.into())]))))
                            .collect();
                        obj([
                            ("port", (*port).into()),
                            ("present", p.present.into()),
                            ("netdev", opt_str(&p.netdev)),
                            ("rail", p.rail.into()),
                            ("state", opt_str(&p.state)),
                            ("link_layer", opt_str(&p.link_layer)),
                            ("rate_bytes_per_second", p.rate.map_or(Value::Null, Value::from)),
                            ("pma_64bit", p.ext.into()),
                            ("hw_counters_lifespan_ms", p.lifespan_ms.map_or(Value::Null, Value::from)),
                            ("hw_counters_every_sweeps", p.hw_every.into()),
                            ("groups", Value::Object(groups)),
                        ])
                    })
                    .collect();
                obj([
                    ("device", name.clone().into()),
                    ("present", d.present.into()),
                    ("pci", opt_str(&d.pci)),
                    ("mode", d.mode.into()),
                    ("ports", Value::Array(ports)),
                ])
            })
            .collect();
        obj([("devices", Value::Array(devices)), ("counter_names", self.counter_names.len().into())])
    }
}

/// The ports' counters as per-NIC samples (named by netdev, else `device/port`).
fn nic_parts(ports: Vec<PortCounters>) -> Vec<super::nic::NicPart> {
    ports
        .into_iter()
        .filter(|p| p.present)
        .map(|p| {
            let name = p.netdev.clone().unwrap_or_else(|| format!("{}/{}", p.device, p.port));
            (
                super::nic::info(name, Some(p.rail), p.rate_bytes_per_second),
                crate::timeline::NicSample {
                    tx_bytes: p.transmit_bytes as f64,
                    // No socket shows RDMA bytes: whose they are is not measured.
                    opaque_tx_bytes: p.transmit_bytes as f64,
                    rx_bytes: p.receive_bytes as f64,
                    ecn_marked: p.ecn_marked_packets as f64,
                    cnp_sent: p.cnp_sent as f64,
                    cnp_handled: p.cnp_handled as f64,
                    xmit_wait_ticks: p.transmit_wait_ticks as f64,
                    retransmits: p.retransmits as f64,
                    ..Default::default()
                },
            )
        })
        .collect()
}
