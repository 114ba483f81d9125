//! Netdev statistics through rtnetlink (`RTM_GETLINK` dump, `IFLA_STATS64`, else the 32-bit
//! `IFLA_STATS`), plus the sysfs helpers the ethtool and qdisc sources share.
//!
//! Counters are accumulated from deltas ([`super::counter`]): the exported values never go
//! backwards, also when an interface is deleted and re-created under the same name (the new
//! ifindex tells; its counters restart from zero and are added as a reset).

mod fast;
pub mod rtnl;
mod sysfs;

use crate::export::reference::RegisterSampled as _;
use std::{collections::BTreeMap, time::Instant};

use netlink_packet_route::{
    link::{LinkAttribute, LinkFlags, LinkMessage, State},
    RouteNetlinkMessage,
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use self::rtnl::{Rtnl, RtnlError};
pub use self::sysfs::{list_netdevs, pci_address, read_ifindex};
use super::{
    counter::{rate_bound, Delta, Guarded, Semantics, MAX_LINK_BYTES_PER_SECOND},
    kind, Source, SourceContext, SourceError, SweepReport,
};

const SOURCE: &str = "netdev";
/// Netdev names tracked at once. Beyond it the longest-gone name is forgotten; with none
/// gone, new names are counted as `cardinality` errors and not exported.
pub const MAX_NETDEVS: usize = 1024;
/// `kind` of `stepwise_errors_total` for netdevs dropped by the cap.
pub const KIND_CARDINALITY: &str = "cardinality";

/// The counters read per netdev, in this order in [`LinkReading::values`].
pub const COUNTERS: [&str; 8] =
    ["receive_bytes", "transmit_bytes", "receive_packets", "transmit_packets", "receive_drops", "transmit_drops", "receive_errors", "transmit_errors"];
const HELP: [&str; 8] = [
    "Bytes received (IFLA_STATS64 rx_bytes)",
    "Bytes transmitted (IFLA_STATS64 tx_bytes)",
    "Packets received (IFLA_STATS64 rx_packets)",
    "Packets transmitted (IFLA_STATS64 tx_packets)",
    "Received packets dropped (IFLA_STATS64 rx_dropped)",
    "Transmitted packets dropped (IFLA_STATS64 tx_dropped)",
    "Receive errors (IFLA_STATS64 rx_errors)",
    "Transmit errors (IFLA_STATS64 tx_errors)",
];

/// One link of a dump.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkReading {
    pub ifindex: u32,
    pub name: String,
    pub up: bool,
    /// Raw counters in [`COUNTERS`] order and how they behave; `None` without any stats attribute.
    pub values: Option<([u64; 8], Semantics)>,
}

/// Extracts what we use from a `RTM_NEWLINK` message. `None` without a name.
pub fn parse_link(msg: &LinkMessage) -> Option<LinkReading> {
    let mut name = None;
    let mut oper = None;
    let (mut s64, mut s32) = (None, None);
    for a in &msg.attributes {
        match a {
            LinkAttribute::IfName(n) => name = Some(n.clone()),
            LinkAttribute::OperState(s) => oper = Some(*s),
            LinkAttribute::Stats64(s) => s64 = Some([s.rx_bytes, s.tx_bytes, s.rx_packets, s.tx_packets, s.rx_dropped, s.tx_dropped, s.rx_errors, s.tx_errors]),
            LinkAttribute::Stats(s) => {
                s32 = Some([s.rx_bytes, s.tx_bytes, s.rx_packets, s.tx_packets, s.rx_dropped, s.tx_dropped, s.rx_errors, s.tx_errors].map(u64::from))
            }
            _ => {}
        }
    }
    let flags = msg.header.flags;
    // operstate is authoritative (RFC 2863); drivers that never set it report "unknown",
    // and then the administrative and carrier flags decide.
    let up = match oper {
        Some(State::Up) => true,
        Some(State::Unknown) | None => flags.contains(LinkFlags::Up) && flags.contains(LinkFlags::Running),
        Some(_) => false,
    };
    let values = s64.map(|v| (v, Semantics::Monotonic)).or(s32.map(|v| (v, Semantics::Wrapping { bits: 32 })));
    Some(LinkReading { ifindex: msg.header.index, name: name?, up, values })
}

/// Cumulative counters of one netdev at one sweep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetdevSnapshot {
    pub netdev: String,
    pub ifindex: u32,
    pub up: bool,
    pub at: Instant,
    pub receive_bytes: u64,
    pub transmit_bytes: u64,
    pub receive_packets: u64,
    pub transmit_packets: u64,
    pub receive_drops: u64,
    pub transmit_drops: u64,
    pub receive_errors: u64,
    pub transmit_errors: u64,
}

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NetdevLabels {
    pub netdev: String,
}

struct Dev {
    ifindex: u32,
    present: bool,
    up: bool,
    prev: Option<([u64; 8], Semantics)>,
    /// Per counter: a glitched reading waiting to be confirmed (see [`Guarded`]).
    suspect: [Option<u64>; 8],
    /// The stored readings come from a netdev since deleted and re-created.
    recreated: bool,
    acc: [u64; 8],
    last: Option<Instant>,
    seen: Instant,
    counters: [Counter; 8],
    up_gauge: Gauge,
}

impl Dev {
    /// Adds the deltas to `cur`, read at `at`; returns (a counter was reset, one glitched). A
    /// glitched reading (beyond any link's rate since the last) adds nothing and is not kept.
    fn add(&mut self, cur: [u64; 8], sem: Semantics, at: Instant) -> (bool, bool) {
        let recreated = std::mem::take(&mut self.recreated);
        let max =
            self.last.and_then(|l| rate_bound(Some(MAX_LINK_BYTES_PER_SECOND), u64::try_from(at.saturating_duration_since(l).as_nanos()).unwrap_or(u64::MAX)));
        let (mut reset, mut glitch, mut kept) = (false, false, cur);
        for i in 0..8 {
            let d = match self.prev {
                None => Delta::Normal(cur[i]),
                Some(_) if recreated => Delta::Reset(cur[i]),
                // A switch between 64- and 32-bit statistics: the old value is not comparable.
                Some((_, psem)) if psem != sem => Delta::Reset(cur[i]),
                Some((p, _)) => {
                    let mut g = Guarded::resume(p[i], self.suspect[i]);
                    let d = g.next(sem, cur[i], max);
                    (kept[i], self.suspect[i]) = (g.prev(), g.suspect());
                    glitch |= d.is_none();
                    d.unwrap_or(Delta::Normal(0))
                }
            };
            reset |= matches!(d, Delta::Reset(_)) && !recreated;
            self.acc[i] = self.acc[i].saturating_add(d.value());
            self.counters[i].inc_by(d.value());
        }
        self.prev = Some((kept, sem));
        (reset, glitch)
    }
}

pub struct NetdevSource {
    ctx: SourceContext,
    families: [Family<NetdevLabels, Counter>; 8],
    up: Family<NetdevLabels, Gauge>,
    rtnl: Option<Rtnl>,
    devs: BTreeMap<String, Dev>,
    last_error: Option<String>,
    /// The fast lane's open statistics files per netdev (`Err` where sysfs cannot serve it).
    fast: BTreeMap<String, Result<fast::StatFiles, u32>>,
    /// Each netdev's link rate (sysfs `speed`), read at the full sweeps.
    rates: BTreeMap<String, Option<f64>>,
}

impl NetdevSource {
    pub fn new(ctx: SourceContext, registry: &mut Registry) -> Self {
        let families: [Family<NetdevLabels, Counter>; 8] = Default::default();
        for ((name, help), f) in COUNTERS.iter().zip(HELP).zip(&families) {
            registry.register_sampled(format!("stepwise_netdev_{name}"), help, f.clone());
        }
        let up = Family::<NetdevLabels, Gauge>::default();
        registry.register_sampled("stepwise_netdev_up", "1 when the netdev's operational state is up", up.clone());
        NetdevSource { ctx, families, up, rtnl: None, devs: BTreeMap::new(), last_error: None, fast: BTreeMap::new(), rates: BTreeMap::new() }
    }

    /// Cumulative values of every netdev read at least once (present or gone).
    pub fn snapshot(&self) -> Vec<NetdevSnapshot> {
        self.devs
            .iter()
            .filter_map(|(name, d)| {
                let [receive_bytes, transmit_bytes, receive_packets, transmit_packets, receive_drops, transmit_drops, receive_errors, transmit_errors] = d.acc;
                Some(NetdevSnapshot {
                    netdev: name.clone(),
                    ifindex: d.ifindex,
                    up: d.present && d.up,
                    at: d.last?,
                    receive_bytes,
                    transmit_bytes,
                    receive_packets,
                    transmit_packets,
                    receive_drops,
                    transmit_drops,
                    receive_errors,
                    transmit_errors,
                })
            })
            .collect()
    }

    /// Makes room for a new name; false when the cap is reached with every name present.
    fn admit(&mut self, name: &str) -> bool {
        if self.devs.contains_key(name) || self.devs.len() < MAX_NETDEVS {
            return true;
        }
        let gone = self.devs.iter().filter(|(_, d)| !d.present).min_by_key(|(_, d)| d.seen).map(|(n, _)| n.clone());
        match gone {
            Some(n) => {
                let labels = NetdevLabels { netdev: n.clone() };
                for f in &self.families {
                    f.remove(&labels);
                }
                self.up.remove(&labels);
                self.devs.remove(&n);
                true
            }
            None => false,
        }
    }

    fn apply(&mut self, r: LinkReading, at: Instant, report: &mut SweepReport) {
        let key = format!("{SOURCE}/{}", r.name);
        let Some((cur, sem)) = r.values else {
            report.skipped += 1;
            self.ctx.errors.inc(SOURCE, kind::NOT_AVAILABLE);
            if self.ctx.selector.record(&key, false) {
                self.ctx.errors.inc(SOURCE, kind::PROBE_SAFE_SKIP);
            }
            return;
        };
        if !self.admit(&r.name) {
            self.ctx.errors.inc(SOURCE, KIND_CARDINALITY);
            report.skipped += 1;
            return;
        }
        let labels = NetdevLabels { netdev: r.name.clone() };
        let dev = self.devs.entry(r.name.clone()).or_insert_with(|| Dev {
            ifindex: r.ifindex,
            present: true,
            up: r.up,
            prev: None,
            suspect: [None; 8],
            recreated: false,
            acc: [0; 8],
            last: None,
            seen: at,
            counters: std::array::from_fn(|i| self.families[i].get_or_create_owned(&labels)),
            up_gauge: self.up.get_or_create_owned(&labels),
        });
        if dev.ifindex != r.ifindex {
            // Same name, another interface: the old one vanished (counted here unless a
            // sweep already saw it gone), and the new one counts from zero.
            if dev.present {
                self.ctx.errors.inc(SOURCE, kind::VANISHED);
            }
            dev.recreated = true;
            dev.ifindex = r.ifindex;
        }
        let (reset, glitch) = dev.add(cur, sem, at);
        if reset {
            self.ctx.errors.inc(SOURCE, kind::COUNTER_RESET);
        }
        if glitch {
            self.ctx.errors.inc(SOURCE, kind::COUNTER_GLITCH);
        }
        dev.present = true;
        dev.up = r.up;
        dev.up_gauge.set(i64::from(r.up));
        dev.last = Some(at);
        dev.seen = at;
        report.devices += 1;
        report.values += 8;
        self.ctx.selector.record(&key, true);
    }
}

impl NetdevSource {
    /// The fast-lane reading of `name` (present, 64-bit statistics), through its sysfs files
    /// opened for the ifindex the dumps gave it; `None` where sysfs cannot serve it.
    fn fast_reading(&mut self, name: &str) -> Option<LinkReading> {
        let d = self.devs.get(name).filter(|d| d.present)?;
        let Some((prev, Semantics::Monotonic)) = d.prev else { return None };
        let (ifindex, up) = (d.ifindex, d.up);
        let stale = self.fast.get(name).is_none_or(|f| match f {
            Ok(f) => f.ifindex != ifindex,
            Err(i) => *i != ifindex,
        });
        if stale {
            let opened = fast::StatFiles::open(&self.ctx.sysfs_root, name, ifindex).map_err(|_| ifindex);
            self.fast.insert(name.to_string(), opened);
        }
        let files = self.fast.get(name)?.as_ref().ok()?;
        match files.read(&prev) {
            Ok(v) => Some(LinkReading { ifindex, name: name.to_string(), up, values: Some((v, Semantics::Monotonic)) }),
            Err(_) => {
                // Gone or garbled: the next dump decides; opened again after it.
                self.fast.remove(name);
                self.ctx.errors.inc(SOURCE, kind::READ);
                None
            }
        }
    }
}

impl Source for NetdevSource {
    fn nic_samples(&self) -> Vec<super::nic::NicPart> {
        nic_parts(self.snapshot(), |n| self.rates.get(n).copied().flatten())
    }
    fn nic_samples_of(&self, nics: &std::collections::BTreeSet<String>) -> Vec<super::nic::NicPart> {
        nic_parts(self.snapshot().into_iter().filter(|d| nics.contains(&d.netdev)).collect(), |n| self.rates.get(n).copied().flatten())
    }
    fn fast_sweep(&mut self, nics: &std::collections::BTreeSet<String>) -> bool {
        let mut report = SweepReport::default();
        let mut any = false;
        for name in nics {
            if let Some(r) = self.fast_reading(name) {
                self.apply(r, Instant::now(), &mut report);
                any = true;
            }
        }
        self.fast.retain(|n, _| nics.contains(n));
        any
    }
    fn name(&self) -> &'static str {
        SOURCE
    }

    fn sweep(&mut self) -> Result<SweepReport, SourceError> {
        let rtnl = match self.rtnl.as_mut() {
            Some(r) => r,
            None => self.rtnl.insert(Rtnl::open().map_err(|e| rtnl_failure(&self.ctx, e))?),
        };
        let dump = match rtnl.dump(RouteNetlinkMessage::GetLink(LinkMessage::default())) {
            Ok(d) => d,
            Err(e) => {
                // A fresh socket next time: nothing half-read can leak into the next dump.
                self.rtnl = None;
                self.last_error = Some(e.to_string());
                return Err(rtnl_failure(&self.ctx, e));
            }
        };
        for _ in 0..dump.undecodable {
            self.ctx.errors.inc(SOURCE, kind::PARSE);
        }
        let at = Instant::now();
        let mut report = SweepReport { skipped: dump.undecodable, ..Default::default() };
        let mut seen = std::collections::HashSet::new();
        for msg in dump.messages {
            let RouteNetlinkMessage::NewLink(link) = msg else { continue };
            let Some(r) = parse_link(&link) else {
                self.ctx.errors.inc(SOURCE, kind::PARSE);
                report.skipped += 1;
                continue;
            };
            if r.name == "lo" {
                continue;
            }
            let pci = pci_address(&self.ctx.sysfs_root, &r.name);
            if !self.ctx.selector.selects(&r.name, pci.as_deref()) {
                continue;
            }
            seen.insert(r.name.clone());
            if self.ctx.selector.disabled(&format!("{SOURCE}/{}", r.name)) {
                report.skipped += 1;
                continue;
            }
            self.apply(r, at, &mut report);
        }
        let root = &self.ctx.sysfs_root;
        self.rates = self.devs.iter().filter(|(_, d)| d.present).map(|(n, _)| (n.clone(), super::nic_rate(root, n))).collect();
        // Interrupted dumps may miss links that still exist: do not call those gone.
        if !dump.interrupted {
            for (name, d) in self.devs.iter_mut() {
                if d.present && !seen.contains(name) {
                    d.present = false;
                    d.up_gauge.set(0);
                    self.ctx.errors.inc(SOURCE, kind::VANISHED);
                }
            }
        }
        Ok(report)
    }

    fn status(&self) -> serde_json::Value {
        let devs: Vec<_> = self.devs.iter().map(|(n, d)| serde_json::json!({"netdev": n, "ifindex": d.ifindex, "present": d.present, "up": d.up, "stats64": d.prev.map(|(_, s)| s == Semantics::Monotonic)})).collect();
        serde_json::json!({ "netdevs": devs, "cap": MAX_NETDEVS, "last_error": self.last_error })
    }
}

/// Counts a failed dump and turns it into the sweep's error.
fn rtnl_failure(ctx: &SourceContext, e: RtnlError) -> SourceError {
    ctx.errors.inc(SOURCE, kind::NETLINK);
    SourceError::Io { source_name: SOURCE, what: "rtnetlink RTM_GETLINK dump".into(), err: std::io::Error::other(e) }
}

/// Every netdev but `lo` as a per-NIC sample, with its link rate.
fn nic_parts(devs: Vec<NetdevSnapshot>, rate_of: impl Fn(&str) -> Option<f64>) -> Vec<super::nic::NicPart> {
    devs.into_iter()
        .filter(|d| d.netdev != "lo")
        .map(|d| {
            let rate = rate_of(&d.netdev);
            (
                super::nic::info(d.netdev.clone(), None, rate),
                crate::timeline::NicSample {
                    tx_bytes: d.transmit_bytes as f64,
                    rx_bytes: d.receive_bytes as f64,
                    drops: (d.transmit_drops + d.receive_drops) as f64,
                    ..Default::default()
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests;
