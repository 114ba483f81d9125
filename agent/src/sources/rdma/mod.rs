//! RDMA sysfs source: `<sysfs_root>/class/infiniband/<dev>/ports/<p>/{counters,counters_ext,
//! hw_counters,state,rate,link_layer}` (platform-facts.md §1).
//!
//! Each counter file keeps its last raw reading and a cumulative value in the metric's unit.
//! The first reading of a counter becomes its initial cumulative value (×scale), as
//! node_exporter does: a Prometheus counter that starts at the device's absolute count is
//! what dashboards expect, and `rate()` ignores the starting value anyway. Later readings add
//! the delta given by the counter's semantics ([`crate::sources::counter`]; widths in
//! [`spec`]). So exported counters never go backwards, whatever the hardware does.

mod metrics;
mod parse;
mod spec;
#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::{Path, PathBuf},
    time::Duration,
};

use prometheus_client::registry::Registry;
use serde::Serialize;
use tracing::{debug, warn};

use super::{counter::Delta, kind, Source, SourceContext, SourceError, SweepReport};
use metrics::{set_counter, CounterLabels, Metrics, PortLabels};
use parse::{read_counter_dir, read_text, Reading};
use spec::{Group, Target, Typed};

const SOURCE: &str = "rdma";
/// `stepwise_errors_total` kind for generic counter names dropped by the label cap.
pub const KIND_CARDINALITY: &str = "cardinality";
/// Most distinct counter names exported as the `counter` label (mlx5 has about 60).
pub const MAX_COUNTER_NAMES: usize = 256;

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

#[derive(Clone, Copy, Debug)]
struct CounterState {
    prev: u64,
    /// Cumulative value in the metric's unit.
    total: u64,
    target: Target,
}

#[derive(Debug, Default)]
struct PortState {
    labels: Option<PortLabels>,
    netdev: Option<String>,
    rail: u32,
    present: bool,
    /// Data/packet PMA counters are 64-bit (Ext or NOIETF table); sticky once seen.
    ext: bool,
    counters: BTreeMap<(Group, String), CounterState>,
    totals: BTreeMap<Typed, u64>,
    /// Read hw_counters every this many sweeps (see [`hw_every`]).
    hw_every: u32,
    hw_countdown: u32,
    lifespan_ms: Option<u64>,
    up: bool,
    state: Option<String>,
    link_layer: Option<String>,
    rate: Option<f64>,
    /// Files read / skipped per group in the last sweep that read the group.
    groups: BTreeMap<&'static str, (usize, usize)>,
    read_monotonic_ns: u64,
    read_unix_ns: u64,
}

#[derive(Debug, Default)]
struct DeviceState {
    present: bool,
    pci: Option<String>,
    /// `selected`, `excluded` or `probe_safe_disabled`.
    mode: &'static str,
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
    ports: BTreeMap<(String, u32), PortState>,
    devices: BTreeMap<String, DeviceState>,
    topo_devices: Vec<String>,
    topo: HashMap<(String, u32), TopoEntry>,
    counter_names: BTreeSet<String>,
    buf: String,
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
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    (mono, unix)
}

fn sorted_names(dir: &Path) -> Option<Vec<String>> {
    let rd = std::fs::read_dir(dir).ok()?;
    let mut v: Vec<String> = rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    Some(v)
}

impl RdmaSource {
    pub fn new(ctx: SourceContext, registry: &mut Registry) -> Self {
        let metrics = Metrics::register(registry);
        RdmaSource {
            ctx,
            metrics,
            ports: BTreeMap::new(),
            devices: BTreeMap::new(),
            topo_devices: Vec::new(),
            topo: HashMap::new(),
            counter_names: BTreeSet::new(),
            buf: String::with_capacity(64),
        }
    }

    /// A source registering into a private registry, for tools and tests outside the daemon
    /// (its metrics are not exported; read them through [`RdmaSource::ports`]).
    pub fn standalone(ctx: SourceContext) -> Self {
        RdmaSource::new(ctx, &mut Registry::default())
    }

    /// Cumulative value of one `hw_counters/<name>` file of a port (after wrap/reset handling).
    pub fn hw_counter_total(&self, device: &str, port: u32, name: &str) -> Option<u64> {
        self.ports.get(&(device.to_string(), port))?.counters.get(&(Group::Hw, name.to_string())).map(|c| c.total)
    }

    /// Cumulative counters of every port seen so far (vanished ones included, `present` false).
    pub fn ports(&self) -> Vec<PortCounters> {
        self.ports
            .iter()
            .map(|((device, port), p)| {
                let t = |k: Typed| p.totals.get(&k).copied().unwrap_or(0);
                PortCounters {
                    device: device.clone(),
                    port: *port,
                    netdev: p.netdev.clone(),
                    rail: p.rail,
                    present: p.present,
                    up: p.up,
                    rate_bytes_per_second: p.rate,
                    transmit_bytes: t(Typed::TransmitBytes),
                    receive_bytes: t(Typed::ReceiveBytes),
                    transmit_packets: t(Typed::TransmitPackets),
                    receive_packets: t(Typed::ReceivePackets),
                    transmit_wait_ticks: t(Typed::TransmitWaitTicks),
                    ecn_marked_packets: t(Typed::EcnMarkedPackets),
                    cnp_sent: t(Typed::CnpSent),
                    cnp_handled: t(Typed::CnpHandled),
                    retransmits: p
                        .totals
                        .iter()
                        .filter(|(k, _)| matches!(k, Typed::Retransmit(_)))
                        .fold(0u64, |a, (_, v)| a.saturating_add(*v)),
                    read_monotonic_ns: p.read_monotonic_ns,
                    read_unix_ns: p.read_unix_ns,
                }
            })
            .collect()
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
        debug!(ports = self.topo.len(), "rdma: topology rediscovered");
    }

    fn vanish_port(&mut self, key: &(String, u32)) {
        if let Some(p) = self.ports.get_mut(key) {
            if p.present {
                p.present = false;
                p.up = false;
                if let Some(l) = &p.labels {
                    self.metrics.port_up.get_or_create(l).set(0);
                }
            }
        }
    }

    fn vanish_device(&mut self, dev: &str) {
        let Some(d) = self.devices.get_mut(dev) else { return };
        if !d.present {
            return;
        }
        d.present = false;
        if d.mode != "selected" {
            return;
        }
        warn!(device = dev, "rdma: device vanished; its counters keep their last values");
        self.err(kind::VANISHED);
        let keys: Vec<(String, u32)> = self.ports.keys().filter(|(d, _)| d == dev).cloned().collect();
        for k in keys {
            self.vanish_port(&k);
        }
    }

    /// Reads one port; returns (values read, values skipped).
    fn sweep_port(&mut self, dev: &str, port: u32, dir: &Path) -> (usize, usize) {
        let key = (dev.to_string(), port);
        let topo = self.topo.get(&key).cloned().unwrap_or_default();
        let interval = self.ctx.interval;
        let mut buf = std::mem::take(&mut self.buf);
        let mut st = self.ports.remove(&key).unwrap_or_else(|| PortState { hw_every: 1, ..PortState::default() });
        st.present = true;
        // A known port keeps its rail: rediscovery after another NIC vanished renumbers the
        // remaining ones by position, but the rail is a physical fact of this port.
        if st.labels.is_none() {
            st.rail = topo.rail;
        }
        if topo.netdev.is_some() {
            st.netdev = topo.netdev;
        }
        let labels = PortLabels {
            device: dev.to_string(),
            port: port.to_string(),
            netdev: st.netdev.clone().unwrap_or_default(),
            rail: st.rail.to_string(),
        };
        if st.labels.as_ref().is_some_and(|old| *old != labels) {
            self.forget_series(&st);
        }
        st.labels = Some(labels.clone());

        // state, rate, link_layer: attributes of every IB port (core sysfs.c).
        let mut skipped = 0;
        let mut text = |name: &str, buf: &mut String| {
            let t = read_text(&dir.join(name), buf);
            if t.is_none() {
                self.ctx.errors.inc(SOURCE, kind::READ);
                skipped += 1;
            }
            t
        };
        let state = text("state", &mut buf);
        let rate = text("rate", &mut buf);
        let link_layer = text("link_layer", &mut buf);
        match state.as_deref().map(parse::parse_state) {
            Some(Some(s)) => {
                st.up = s.is_active();
                st.state = Some(s.name);
                self.metrics.port_up.get_or_create(&labels).set(i64::from(st.up));
            }
            Some(None) => {
                self.err(kind::PARSE);
                skipped += 1;
            }
            None => {}
        }
        match rate.as_deref().map(crate::topology::parse_ib_rate) {
            Some(Some(r)) => {
                st.rate = Some(r);
                self.metrics.link_rate.get_or_create(&labels).set(r);
            }
            Some(None) => {
                self.err(kind::PARSE);
                skipped += 1;
            }
            None => {}
        }
        st.link_layer = link_layer.as_deref().and_then(parse::parse_link_layer);

        let pma = read_counter_dir(&dir.join("counters"), &mut buf);
        let legacy = read_counter_dir(&dir.join("counters_ext"), &mut buf);
        let hw = if st.hw_countdown == 0 {
            let r = read_counter_dir(&dir.join("hw_counters"), &mut buf);
            if let Some(ms) = r.as_ref().and_then(|v| v.iter().find(|x| x.name == "lifespan")).and_then(|x| x.value.as_ref().ok()) {
                st.lifespan_ms = Some(*ms);
                st.hw_every = hw_every(interval, *ms);
            }
            st.hw_countdown = st.hw_every.saturating_sub(1);
            r
        } else {
            st.hw_countdown -= 1;
            None
        };
        self.buf = buf;

        if let Some(v) = &pma {
            st.ext |= v.iter().any(|r| {
                spec::is_ext_only(&r.name)
                    || (spec::is_pma_data_or_packets(&r.name) && r.value.as_ref().is_ok_and(|x| *x > u64::from(u32::MAX)))
            });
        }
        let mut read = 0;
        for (group, label, readings) in [(Group::Pma, "counters", pma), (Group::PmaLegacyExt, "counters_ext", legacy), (Group::Hw, "hw_counters", hw)] {
            let Some(readings) = readings else { continue };
            let (r, s) = self.apply(&mut st, group, readings);
            st.groups.insert(label, (r, s));
            read += r;
            skipped += s;
        }
        (st.read_monotonic_ns, st.read_unix_ns) = now_ns();
        self.export(&mut st, &labels);
        self.ports.insert(key, st);
        (read, skipped)
    }

    /// Folds one directory's readings into the port's counters; returns (read, skipped).
    fn apply(&mut self, st: &mut PortState, group: Group, readings: Vec<Reading>) -> (usize, usize) {
        let (mut read, mut skipped) = (0, 0);
        for Reading { name, value } in readings {
            if group == Group::Hw && spec::is_hw_control_file(&name) {
                continue;
            }
            let v = match value {
                Ok(v) => v,
                Err(e) => {
                    self.err(e.kind());
                    skipped += 1;
                    continue;
                }
            };
            let sp = spec::spec(group, &name, st.ext);
            if !matches!(sp.target, Target::Typed(_)) && !self.counter_names.contains(&name) {
                if self.counter_names.len() >= MAX_COUNTER_NAMES {
                    self.err(KIND_CARDINALITY);
                    skipped += 1;
                    continue;
                }
                self.counter_names.insert(name.clone());
            }
            read += 1;
            match st.counters.get_mut(&(group, name.clone())) {
                None => {
                    let total = v.saturating_mul(sp.scale);
                    st.counters.insert((group, name), CounterState { prev: v, total, target: sp.target });
                }
                Some(c) => {
                    let d = sp.semantics.delta(c.prev, v);
                    match d {
                        Delta::Reset(_) => self.err(kind::COUNTER_RESET),
                        // Entering saturation: the true count is lost from here until a reset.
                        Delta::Saturated(x) if x > 0 => self.err(kind::COUNTER_RESET),
                        _ => {}
                    }
                    c.total = c.total.saturating_add(d.value().saturating_mul(sp.scale));
                    c.prev = v;
                }
            }
        }
        (read, skipped)
    }

    /// Recomputes the port's typed totals and drives its series to them.
    fn export(&self, st: &mut PortState, labels: &PortLabels) {
        // Pre-4.5 kernels expose 64-bit data/packets only as counters_ext/*_64: prefer them
        // over the 32-bit counters/ copies.
        let legacy: BTreeSet<Typed> = st
            .counters
            .iter()
            .filter(|((g, _), _)| *g == Group::PmaLegacyExt)
            .filter_map(|(_, c)| match c.target {
                Target::Typed(t) => Some(t),
                _ => None,
            })
            .collect();
        let mut totals: BTreeMap<Typed, u64> = BTreeMap::new();
        for ((group, name), c) in &st.counters {
            match c.target {
                Target::Typed(t) if *group == Group::Pma && legacy.contains(&t) => {}
                Target::Typed(t) => {
                    let e = totals.entry(t).or_default();
                    *e = e.saturating_add(c.total);
                }
                Target::HwGeneric | Target::PortGeneric => {
                    let fam = if c.target == Target::HwGeneric { &self.metrics.hw_counter } else { &self.metrics.port_counter };
                    let l = CounterLabels { device: labels.device.clone(), port: labels.port.clone(), counter: name.clone() };
                    set_counter(&fam.get_or_create(&l), c.total);
                }
            }
        }
        for (t, v) in &totals {
            match (t, self.metrics.port_family(*t)) {
                (_, Some(fam)) => set_counter(&fam.get_or_create(labels), *v),
                (Typed::Retransmit(reason), None) => {
                    set_counter(&self.metrics.retransmit_events.get_or_create(&labels.retransmit(reason)), *v)
                }
                _ => {}
            }
        }
        st.totals = totals;
    }

    /// Removes a port's labelled series before it is re-exported under new labels (the new
    /// series start at the port's full cumulative values, so nothing is lost).
    fn forget_series(&self, st: &PortState) {
        let Some(l) = &st.labels else { return };
        for t in st.totals.keys() {
            match (t, self.metrics.port_family(*t)) {
                (_, Some(fam)) => {
                    fam.remove(l);
                }
                (Typed::Retransmit(reason), None) => {
                    self.metrics.retransmit_events.remove(&l.retransmit(reason));
                }
                _ => {}
            }
        }
        self.metrics.port_up.remove(l);
        self.metrics.link_rate.remove(l);
    }

    fn sweep_device(&mut self, dev: &str, dir: &Path, report: &mut SweepReport) {
        let mut any_ok = false;
        let port_names = sorted_names(&dir.join("ports")).unwrap_or_default();
        let mut seen = BTreeSet::new();
        for p in port_names {
            let Ok(port) = p.parse::<u32>() else { continue };
            seen.insert(port);
            let (read, skipped) = self.sweep_port(dev, port, &dir.join("ports").join(&p));
            any_ok |= read > 0;
            report.devices += 1;
            report.values += read;
            report.skipped += skipped;
        }
        let gone: Vec<(String, u32)> =
            self.ports.iter().filter(|((d, p), s)| d == dev && s.present && !seen.contains(p)).map(|(k, _)| k.clone()).collect();
        for k in gone {
            warn!(device = dev, port = k.1, "rdma: port vanished");
            self.err(kind::VANISHED);
            self.vanish_port(&k);
        }
        // Probe-safe bookkeeping: a sweep is "ok" if at least one counter value was usable.
        // `N/A (no PMA)` and EIO both mean the firmware query failed, which is what floods
        // dmesg on restricted functions.
        if self.ctx.selector.record(&format!("{SOURCE}/{dev}"), any_ok) {
            warn!(device = dev, "rdma: every counter read failed twice; probe-safe mode stops reading this device");
            self.err(kind::PROBE_SAFE_SKIP);
            if let Some(d) = self.devices.get_mut(dev) {
                d.mode = "probe_safe_disabled";
            }
        }
    }
}

impl Source for RdmaSource {
    fn nic_samples(&self) -> Vec<super::nic::NicPart> {
        super::nic::from_rdma(self.ports())
    }
    fn name(&self) -> &'static str {
        SOURCE
    }

    fn sweep(&mut self) -> Result<SweepReport, SourceError> {
        let class: PathBuf = self.ctx.sysfs_root.join("class/infiniband");
        let Some(names) = sorted_names(&class) else {
            let present: Vec<String> = self.devices.iter().filter(|(_, d)| d.present).map(|(n, _)| n.clone()).collect();
            for d in present {
                self.vanish_device(&d);
            }
            return Err(SourceError::Unavailable {
                source_name: SOURCE,
                reason: format!("{} does not exist (no RDMA driver loaded, or wrong --sysfs-root)", class.display()),
            });
        };
        if names != self.topo_devices {
            self.rediscover(&names);
        }
        let gone: Vec<String> = self.devices.iter().filter(|(n, d)| d.present && !names.contains(n)).map(|(n, _)| n.clone()).collect();
        for d in gone {
            self.vanish_device(&d);
        }
        let mut report = SweepReport::default();
        for dev in &names {
            let pci = self.topo.iter().find(|((d, _), _)| d == dev).and_then(|(_, t)| t.pci.clone());
            let d = self.devices.entry(dev.clone()).or_default();
            d.present = true;
            d.pci = pci.clone();
            if !self.ctx.selector.selects(dev, pci.as_deref()) {
                d.mode = "excluded";
                continue;
            }
            if self.ctx.selector.disabled(&format!("{SOURCE}/{dev}")) {
                d.mode = "probe_safe_disabled";
                continue;
            }
            d.mode = "selected";
            self.sweep_device(dev, &class.join(dev), &mut report);
        }
        Ok(report)
    }

    fn status(&self) -> serde_json::Value {
        let devices: Vec<serde_json::Value> = self
            .devices
            .iter()
            .map(|(name, d)| {
                let ports: Vec<serde_json::Value> = self
                    .ports
                    .iter()
                    .filter(|((dev, _), _)| dev == name)
                    .map(|((_, port), p)| {
                        let groups: serde_json::Map<String, serde_json::Value> = p
                            .groups
                            .iter()
                            .map(|(g, (r, s))| (g.to_string(), serde_json::json!({ "read": r, "skipped": s })))
                            .collect();
                        serde_json::json!({
                            "port": port,
                            "present": p.present,
                            "netdev": p.netdev,
                            "rail": p.rail,
                            "state": p.state,
                            "link_layer": p.link_layer,
                            "rate_bytes_per_second": p.rate,
                            "pma_64bit": p.ext,
                            "hw_counters_lifespan_ms": p.lifespan_ms,
                            "hw_counters_every_sweeps": p.hw_every,
                            "groups": groups,
                        })
                    })
                    .collect();
                serde_json::json!({ "device": name, "present": d.present, "pci": d.pci, "mode": d.mode, "ports": ports })
            })
            .collect();
        serde_json::json!({ "devices": devices, "counter_names": self.counter_names.len() })
    }
}
