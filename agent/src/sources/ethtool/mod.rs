//! ethtool driver statistics (`ethtool -S`) through the `SIOCETHTOOL` ioctl: mlx5 PFC pause
//! frames and durations, per-priority traffic, ECN marks, discards, pause storms and vport
//! RDMA traffic as typed metrics; other names generically (docs/platform-facts.md §2).
//!
//! Netdevs are enumerated from `<sysfs_root>/class/net`; the ioctl acts in the agent's own
//! network namespace, so that sysfs must belong to the same namespace (an agent started with
//! `ip netns exec` gets both).

pub mod ioctl;
mod metrics;
pub mod names;
pub mod pfc;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::Instant,
};

use prometheus_client::registry::Registry;

use self::{
    ioctl::{EthtoolSocket, StatsCount},
    metrics::{Metrics, Sink},
    names::{parse_table, Class, Field},
};
use super::{
    counter::{rate_bound, Delta, Guarded, Semantics, MAX_LINK_BYTES_PER_SECOND},
    kind,
    netdev::{list_netdevs, pci_address, read_ifindex},
    Source, SourceContext, SourceError, SweepReport,
};

const SOURCE: &str = "ethtool";
/// `kind` of `stepwise_errors_total` for names dropped by the cardinality cap.
pub const KIND_CARDINALITY: &str = "cardinality";
/// Distinct generic statistic names exported (all netdevs together); later ones are counted
/// as `cardinality` errors and not exported.
pub const MAX_GENERIC_STATS: usize = 512;

/// Cumulative typed statistics of one netdev at one sweep, for consumers that diff windows.
#[derive(Clone, Debug)]
pub struct EthtoolSnapshot {
    pub netdev: String,
    pub driver: String,
    /// When the values were read.
    pub at: Instant,
    /// Accumulated value per typed field (driver units: counts, bytes, µs for durations),
    /// following the counter delta rules, so they never decrease. Sorted by field.
    pub fields: Vec<(Field, u64)>,
}

/// One statistic of a string table.
struct Stat {
    name: String,
    class: Class,
    sink: Sink,
    prev: Option<u64>,
    /// A glitched reading waiting to be confirmed (see [`Guarded`]); reset with the table.
    suspect: Option<u64>,
    /// Sum of deltas since the agent first saw it (first reading included).
    acc: u64,
}

#[derive(Default)]
struct Dev {
    ifindex: Option<u64>,
    driver: String,
    present: bool,
    /// The driver has no statistics (reported once, re-checked when the netdev is re-created).
    no_stats: bool,
    stats: Vec<Stat>,
    /// The previous readings come from a netdev that has since been re-created.
    recreated: bool,
    /// Listed in sysfs but unknown to the ioctl (ENODEV): sysfs of another network
    /// namespace, or a fixture tree. Counted once, until it is readable again.
    missing: bool,
    last: Option<Instant>,
}

pub struct EthtoolSource {
    ctx: SourceContext,
    metrics: Metrics,
    sock: Option<EthtoolSocket>,
    devs: BTreeMap<String, Dev>,
    generic_names: HashSet<String>,
    last_error: Option<String>,
    /// `[sources] pfc_priorities` (see [`pfc::pfc_counted`]).
    pfc_priorities: Option<Vec<u8>>,
}

impl EthtoolSource {
    /// The PFC priorities whose pause counts as congestion (`None`: those carrying traffic).
    pub fn with_pfc_priorities(mut self, p: Option<Vec<u8>>) -> Self {
        self.pfc_priorities = p;
        self
    }

    pub fn new(ctx: SourceContext, registry: &mut Registry) -> Self {
        EthtoolSource {
            ctx,
            metrics: Metrics::register(registry),
            sock: None,
            devs: BTreeMap::new(),
            generic_names: HashSet::new(),
            last_error: None,
            pfc_priorities: None,
        }
    }

    /// Typed cumulative values of every netdev read at least once.
    pub fn snapshot(&self) -> Vec<EthtoolSnapshot> {
        self.devs
            .iter()
            .filter_map(|(name, d)| {
                let at = d.last?;
                let mut fields: BTreeMap<Field, u64> = BTreeMap::new();
                for s in &d.stats {
                    if let Class::Typed(f) = s.class {
                        *fields.entry(f).or_default() += s.acc;
                    }
                }
                Some(EthtoolSnapshot { netdev: name.clone(), driver: d.driver.clone(), at, fields: fields.into_iter().collect() })
            })
            .collect()
    }

    /// Reads the string table again (`ETHTOOL_GSTRINGS`) and installs it.
    fn reload_table(&mut self, sock: &EthtoolSocket, netdev: &str, n: usize) -> std::io::Result<()> {
        let names = sock.stat_names(netdev, n)?;
        let driver = sock.driver_info(netdev).map(|(d, _)| d).unwrap_or_default();
        self.install_table(netdev, names, driver);
        Ok(())
    }

    /// Installs a string table for `netdev`, moving each name's state (previous reading,
    /// accumulator) over, and resolving where each name's deltas go.
    fn install_table(&mut self, netdev: &str, names: Vec<String>, driver: String) {
        let classes = parse_table(&names);
        let dev = self.devs.entry(netdev.to_string()).or_default();
        let mut old: HashMap<String, (Option<u64>, u64)> = dev.stats.drain(..).map(|s| (s.name, (s.prev, s.acc))).collect();
        let mut overflow = 0;
        let mut stats = Vec::with_capacity(names.len());
        for (name, class) in names.into_iter().zip(classes) {
            let mut generic_ok = false;
            if class == Class::Generic {
                if self.generic_names.contains(&name) {
                    generic_ok = true;
                } else if self.generic_names.len() < MAX_GENERIC_STATS {
                    self.generic_names.insert(name.clone());
                    generic_ok = true;
                } else {
                    overflow += 1;
                }
            }
            let sink = self.metrics.sink(netdev, &name, class, generic_ok);
            let (prev, acc) = old.remove(&name).unwrap_or((None, 0));
            stats.push(Stat { name, class, sink, prev, suspect: None, acc });
        }
        dev.stats = stats;
        dev.driver = driver;
        for _ in 0..overflow {
            self.ctx.errors.inc(SOURCE, KIND_CARDINALITY);
        }
        if overflow > 0 {
            tracing::warn!(netdev, overflow, "ethtool: more than {MAX_GENERIC_STATS} distinct driver statistic names; the rest are not exported");
        }
    }

    /// Adds one reading (values in table order). False when it does not fit the table.
    fn ingest(&mut self, netdev: &str, values: &[u64], at: Instant) -> bool {
        let Some(dev) = self.devs.get_mut(netdev) else { return false };
        if values.len() != dev.stats.len() {
            return false;
        }
        let recreated = std::mem::take(&mut dev.recreated);
        // No statistic (bytes, packets or events) advances faster than any link carries bytes.
        let max =
            dev.last.and_then(|l| rate_bound(Some(MAX_LINK_BYTES_PER_SECOND), u64::try_from(at.saturating_duration_since(l).as_nanos()).unwrap_or(u64::MAX)));
        let (mut reset, mut glitch) = (false, false);
        for (s, cur) in dev.stats.iter_mut().zip(values) {
            let d = match s.prev {
                // First reading: the counter's value so far is its initial value.
                None => Some(Delta::Normal(*cur)),
                // A re-created netdev counts from zero again.
                Some(_) if recreated => Some(Delta::Reset(*cur)),
                Some(p) => {
                    let mut g = Guarded::resume(p, s.suspect);
                    let d = g.next(Semantics::Monotonic, *cur, max);
                    s.suspect = g.suspect();
                    d
                }
            };
            let Some(d) = d else {
                glitch = true;
                continue;
            };
            reset |= matches!(d, Delta::Reset(_)) && !recreated;
            s.prev = Some(*cur);
            s.acc = s.acc.saturating_add(d.value());
            s.sink.add(d.value());
        }
        dev.last = Some(at);
        if reset {
            self.ctx.errors.inc(SOURCE, kind::COUNTER_RESET);
        }
        if glitch {
            self.ctx.errors.inc(SOURCE, kind::COUNTER_GLITCH);
        }
        true
    }

    /// One netdev: count, (re)load the table when it changed, read values, add deltas.
    /// Returns the number of values read, or `None` when the netdev was skipped.
    fn sweep_one(&mut self, sock: &EthtoolSocket, netdev: &str, at: Instant) -> Result<Option<usize>, std::io::Error> {
        let n = match sock.stats_count(netdev)? {
            StatsCount::Count(n) => n,
            StatsCount::NoStats => {
                let driver = sock.driver_info(netdev).map(|(d, _)| d).unwrap_or_else(|_| "unknown".into());
                tracing::info!(netdev, driver, "driver {driver} has no driver statistics; ethtool source skips {netdev}");
                self.ctx.errors.inc(SOURCE, kind::NOT_AVAILABLE);
                let dev = self.devs.entry(netdev.to_string()).or_default();
                dev.no_stats = true;
                dev.driver = driver;
                return Ok(None);
            }
        };
        // The count changes when channels are reconfigured, and a re-created netdev may be
        // another driver: the table is re-read then. A values answer of another length
        // means it changed between two calls: count again and retry once.
        let mut n = n;
        let mut force = self.devs.get(netdev).is_some_and(|d| d.recreated);
        for _attempt in 0..2 {
            if force || self.devs.get(netdev).is_none_or(|d| d.stats.len() != n) {
                self.reload_table(sock, netdev, n)?;
            }
            let values = sock.stat_values(netdev, n)?;
            if self.ingest(netdev, &values, at) {
                return Ok(Some(values.len()));
            }
            n = match sock.stats_count(netdev)? {
                StatsCount::Count(n) => n,
                StatsCount::NoStats => return Ok(None),
            };
            force = true;
        }
        Err(std::io::Error::other(format!("{netdev}: statistics count kept changing during the read")))
    }
}

impl Source for EthtoolSource {
    fn nic_samples(&self) -> Vec<super::nic::NicPart> {
        pfc::nic_parts(self.snapshot(), self.pfc_priorities.as_deref())
    }
    fn name(&self) -> &'static str {
        SOURCE
    }

    fn sweep(&mut self) -> Result<SweepReport, SourceError> {
        let sock = match self.sock.take() {
            Some(s) => s,
            None => EthtoolSocket::new().map_err(|err| SourceError::Io {
                source_name: SOURCE,
                what: "cannot open the AF_INET socket for SIOCETHTOOL".into(),
                err,
            })?,
        };
        let result = self.sweep_with(&sock);
        self.sock = Some(sock);
        result
    }

    fn status(&self) -> serde_json::Value {
        let netdevs: Vec<_> = self
            .devs
            .iter()
            .map(|(name, d)| {
                let count = |c: fn(&Class) -> bool| d.stats.iter().filter(|s| c(&s.class)).count();
                serde_json::json!({
                    "netdev": name,
                    "driver": d.driver,
                    "present": d.present,
                    "statistics": d.stats.len(),
                    "typed": count(|c| matches!(c, Class::Typed(_))),
                    "generic": count(|c| matches!(c, Class::Generic)),
                    "per_queue_not_exported": count(|c| matches!(c, Class::PerQueue)),
                    "note": if d.no_stats {
                        Some(format!("driver {} has no driver statistics", d.driver))
                    } else if d.missing {
                        Some(format!("{name} is not in the agent's network namespace (ENODEV)"))
                    } else {
                        None
                    },
                })
            })
            .collect();
        serde_json::json!({
            "netdevs": netdevs,
            "generic_names": self.generic_names.len(),
            "generic_names_cap": MAX_GENERIC_STATS,
            "last_error": self.last_error,
        })
    }
}

impl EthtoolSource {
    fn sweep_with(&mut self, sock: &EthtoolSocket) -> Result<SweepReport, SourceError> {
        let root = self.ctx.sysfs_root.clone();
        let present = list_netdevs(&root).map_err(|err| SourceError::Io {
            source_name: SOURCE,
            what: format!("cannot list {}", root.join("class/net").display()),
            err,
        })?;
        let at = Instant::now();
        let mut report = SweepReport::default();
        let mut seen = HashSet::new();
        for netdev in present {
            let pci = pci_address(&root, &netdev);
            if !self.ctx.selector.selects(&netdev, pci.as_deref()) {
                continue;
            }
            seen.insert(netdev.clone());
            let key = format!("{SOURCE}/{netdev}");
            if self.ctx.selector.disabled(&key) {
                report.skipped += 1;
                continue;
            }
            let ifindex = read_ifindex(&root, &netdev);
            let dev = self.devs.entry(netdev.clone()).or_default();
            if dev.ifindex.is_some() && ifindex.is_some() && dev.ifindex != ifindex {
                // Same name, new interface: its counters start again from zero.
                if dev.present {
                    self.ctx.errors.inc(SOURCE, kind::VANISHED);
                }
                dev.recreated = true;
                dev.no_stats = false;
            }
            dev.ifindex = ifindex.or(dev.ifindex);
            dev.present = true;
            if dev.no_stats {
                continue;
            }
            match self.sweep_one(sock, &netdev, at) {
                Ok(Some(values)) => {
                    report.devices += 1;
                    report.values += values;
                    self.ctx.selector.record(&key, true);
                    if let Some(d) = self.devs.get_mut(&netdev) {
                        d.missing = false;
                    }
                }
                Ok(None) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENODEV) => {
                    report.skipped += 1;
                    let dev = self.devs.entry(netdev.clone()).or_default();
                    if !dev.missing {
                        dev.missing = true;
                        self.ctx.errors.inc(SOURCE, kind::NOT_AVAILABLE);
                        tracing::warn!(
                            netdev,
                            "ethtool: {netdev} is under {}/class/net but not in the agent's network namespace (or just vanished)",
                            root.display()
                        );
                    }
                }
                Err(e) => {
                    report.skipped += 1;
                    self.ctx.errors.inc(SOURCE, kind::IOCTL);
                    tracing::debug!(netdev, error = %e, "ethtool: SIOCETHTOOL failed");
                    self.last_error = Some(format!("{netdev}: {e}"));
                    if self.ctx.selector.record(&key, false) {
                        self.ctx.errors.inc(SOURCE, kind::PROBE_SAFE_SKIP);
                        tracing::warn!(netdev, "ethtool: probe-safe mode stops reading {netdev} after failed reads");
                    }
                }
            }
        }
        for (name, dev) in self.devs.iter_mut() {
            if dev.present && !seen.contains(name) {
                dev.present = false;
                self.ctx.errors.inc(SOURCE, kind::VANISHED);
            }
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests;
