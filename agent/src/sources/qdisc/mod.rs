//! Qdisc statistics through rtnetlink (`RTM_GETQDISC` dump): backlog (gauges), drops,
//! overlimits, requeues, bytes and packets per qdisc, from `TCA_STATS2` (else `TCA_STATS`).
//!
//! Widths follow the kernel: bytes are u64; packets are u32 in `gnet_stats_basic` but the
//! kernel adds `TCA_STATS_PKT64` as soon as they pass 2^32, so the value read is exact;
//! drops, overlimits and requeues are u32 in `gnet_stats_queue` and wrap.

use crate::export::reference::RegisterSampled as _;
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::Instant,
};

use netlink_packet_core::Nla;
use netlink_packet_route::{
    link::LinkMessage,
    tc::{TcAttribute, TcHandle, TcMessage, TcStats2},
    RouteNetlinkMessage,
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::{
    counter::{rate_bound, Delta, Semantics, MAX_LINK_BYTES_PER_SECOND},
    kind,
    netdev::{parse_link, pci_address, rtnl::Rtnl},
    Source, SourceContext, SourceError, SweepReport,
};

const SOURCE: &str = "qdisc";
/// Qdiscs tracked at once; beyond it the longest-gone one is forgotten, and with none gone
/// new ones are counted as `cardinality` errors and not exported.
pub const MAX_QDISCS: usize = 1024;
pub const KIND_CARDINALITY: &str = "cardinality";
const TCA_STATS_PKT64: u16 = 8;
/// A 32-bit "wrap" larger than this between two sweeps (2^31 drops in one interval) is not
/// believable: it is a qdisc replaced under the same handle, so it is taken as a reset.
const MAX_BELIEVABLE_WRAP: u64 = 1 << 31;

/// Raw statistics of one qdisc from a dump.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QdiscReading {
    pub ifindex: u32,
    pub kind: String,
    pub handle: String,
    pub parent: String,
    pub bytes: u64,
    pub packets: u64,
    pub drops: u32,
    pub overlimits: u32,
    pub requeues: u32,
    pub backlog_bytes: u32,
    pub backlog_packets: u32,
}

/// `tc`'s spelling of a handle: `8001:`, `1:10`, `root`, `ingress`.
pub fn tc_handle(h: TcHandle) -> String {
    match (h.major, h.minor) {
        (0xffff, 0xffff) => "root".into(),
        (0xffff, 0xfff1) => "ingress".into(),
        (major, 0) => format!("{major:x}:"),
        (major, minor) => format!("{major:x}:{minor:x}"),
    }
}

/// What we use from a `RTM_NEWQDISC` message; `None` without kind or any statistics.
pub fn parse_qdisc(msg: &TcMessage) -> Option<QdiscReading> {
    let mut kind = None;
    let (mut basic, mut queue, mut pkt64, mut compat) = (None, None, None, None);
    for a in &msg.attributes {
        match a {
            TcAttribute::Kind(k) => kind = Some(k.clone()),
            TcAttribute::Stats2(v) => {
                for s in v {
                    match s {
                        TcStats2::Basic(b) => basic = Some(*b),
                        TcStats2::Queue(q) => queue = Some(*q),
                        TcStats2::Other(nla) if nla.kind() == TCA_STATS_PKT64 && nla.value_len() == 8 => {
                            let mut b = [0u8; 8];
                            nla.emit_value(&mut b);
                            pkt64 = Some(u64::from_ne_bytes(b));
                        }
                        _ => {}
                    }
                }
            }
            TcAttribute::Stats(s) => compat = Some(*s),
            _ => {}
        }
    }
    let h = &msg.header;
    let mut r = QdiscReading {
        ifindex: h.index as u32,
        kind: kind?,
        handle: tc_handle(h.handle),
        parent: tc_handle(h.parent),
        bytes: 0,
        packets: 0,
        drops: 0,
        overlimits: 0,
        requeues: 0,
        backlog_bytes: 0,
        backlog_packets: 0,
    };
    match (basic, queue, compat) {
        (Some(b), Some(q), _) => {
            r.bytes = b.bytes;
            r.packets = pkt64.unwrap_or(u64::from(b.packets));
            (r.drops, r.overlimits, r.requeues, r.backlog_bytes, r.backlog_packets) = (q.drops, q.overlimits, q.requeues, q.backlog, q.qlen);
        }
        // The pre-2.6.x compat structure: no requeues.
        (_, _, Some(s)) => {
            r.bytes = s.bytes;
            r.packets = u64::from(s.packets);
            (r.drops, r.overlimits, r.backlog_bytes, r.backlog_packets) = (s.drops, s.overlimits, s.backlog, s.qlen);
        }
        _ => return None,
    }
    Some(r)
}

/// Cumulative counters (never decreasing) and the last backlog of one qdisc.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QdiscSnapshot {
    pub netdev: String,
    pub kind: String,
    pub handle: String,
    pub parent: String,
    pub present: bool,
    pub at: Instant,
    pub backlog_bytes: u64,
    pub backlog_packets: u64,
    pub bytes: u64,
    pub packets: u64,
    pub drops: u64,
    pub overlimits: u64,
    pub requeues: u64,
}

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct QdiscLabels {
    pub netdev: String,
    pub kind: String,
    pub handle: String,
    pub parent: String,
}

/// Counter order in state arrays.
const BYTES: usize = 0;
const PACKETS: usize = 1;
const DROPS: usize = 2;
const OVERLIMITS: usize = 3;
const REQUEUES: usize = 4;
const SEMANTICS: [Semantics; 5] =
    [Semantics::Monotonic, Semantics::Monotonic, Semantics::Wrapping { bits: 32 }, Semantics::Wrapping { bits: 32 }, Semantics::Wrapping { bits: 32 }];

struct Qdisc {
    ifindex: u32,
    present: bool,
    prev: Option<[u64; 5]>,
    /// A glitched reading waiting to be confirmed by the next one (see [`Qdisc::glitched`]).
    suspect: Option<[u64; 5]>,
    acc: [u64; 5],
    backlog: (u64, u64),
    at: Instant,
    counters: [Counter; 5],
    gauges: [Gauge; 2],
}

impl Qdisc {
    /// Whether `cur` moved more bytes since the last good reading than any link could carry
    /// (a glitch: not added, not kept, remembered as a suspect). A reading that continues from
    /// the suspect confirms it: counting goes on from there.
    fn glitched(&mut self, cur: [u64; 5], at: Instant) -> bool {
        let Some(p) = self.prev else { return false };
        let max = rate_bound(Some(MAX_LINK_BYTES_PER_SECOND), u64::try_from(at.saturating_duration_since(self.at).as_nanos()).unwrap_or(u64::MAX));
        let far = |from: [u64; 5]| max.is_some_and(|m| cur[BYTES].saturating_sub(from[BYTES]) > m);
        if far(p) {
            match self.suspect {
                Some(s) if cur[BYTES] >= s[BYTES] && !far(s) => self.prev = Some(s),
                _ => {
                    self.suspect = Some(cur);
                    return true;
                }
            }
        }
        self.suspect = None;
        false
    }
}

#[derive(Clone, Default)]
struct Families {
    counters: [Family<QdiscLabels, Counter>; 5],
    backlog_bytes: Family<QdiscLabels, Gauge>,
    backlog_packets: Family<QdiscLabels, Gauge>,
}

pub struct QdiscSource {
    ctx: SourceContext,
    fam: Families,
    rtnl: Option<Rtnl>,
    qdiscs: BTreeMap<QdiscLabels, Qdisc>,
    last_error: Option<String>,
    /// `[sources] qdisc_per_queue`: also the non-root qdiscs.
    per_queue: bool,
}

impl QdiscSource {
    pub fn new(ctx: SourceContext, registry: &mut Registry) -> Self {
        let fam = Families::default();
        let names = [
            ("stepwise_qdisc_transmit_bytes", "Bytes the qdisc sent (TCA_STATS_BASIC)"),
            ("stepwise_qdisc_transmit_packets", "Packets the qdisc sent (TCA_STATS_BASIC, TCA_STATS_PKT64)"),
            ("stepwise_qdisc_drops", "Packets the qdisc dropped (TCA_STATS_QUEUE drops, u32)"),
            ("stepwise_qdisc_overlimits", "Times the qdisc was over its limit or rate (TCA_STATS_QUEUE overlimits, u32)"),
            ("stepwise_qdisc_requeues", "Packets requeued (TCA_STATS_QUEUE requeues, u32)"),
        ];
        for ((name, help), f) in names.iter().zip(&fam.counters) {
            registry.register_sampled(*name, *help, f.clone());
        }
        registry.register_sampled("stepwise_qdisc_backlog_bytes", "Bytes queued in the qdisc now", fam.backlog_bytes.clone());
        registry.register_sampled("stepwise_qdisc_backlog_packets", "Packets queued in the qdisc now", fam.backlog_packets.clone());
        QdiscSource { ctx, fam, rtnl: None, qdiscs: BTreeMap::new(), last_error: None, per_queue: false }
    }

    /// `[sources] qdisc_per_queue`: export every qdisc, not only each interface's root.
    pub fn with_per_queue(mut self, per_queue: bool) -> Self {
        self.per_queue = per_queue;
        self
    }

    /// Whether a qdisc of this `parent` is exported: the root (`parent root`: the egress qdisc
    /// attached to the device, whose statistics include its children's — `mq` sums its
    /// per-queue qdiscs, a classful parent counts its children's drops and backlog) always,
    /// the others (per-queue children, leaves, `ingress`/`clsact`) only with `per_queue`.
    pub fn exports(&self, parent: &str) -> bool {
        self.per_queue || parent == "root"
    }

    /// Every qdisc read at least once (present or gone).
    pub fn snapshot(&self) -> Vec<QdiscSnapshot> {
        self.qdiscs
            .iter()
            .map(|(l, q)| QdiscSnapshot {
                netdev: l.netdev.clone(),
                kind: l.kind.clone(),
                handle: l.handle.clone(),
                parent: l.parent.clone(),
                present: q.present,
                at: q.at,
                backlog_bytes: q.backlog.0,
                backlog_packets: q.backlog.1,
                bytes: q.acc[BYTES],
                packets: q.acc[PACKETS],
                drops: q.acc[DROPS],
                overlimits: q.acc[OVERLIMITS],
                requeues: q.acc[REQUEUES],
            })
            .collect()
    }

    fn admit(&mut self, labels: &QdiscLabels) -> bool {
        if self.qdiscs.contains_key(labels) || self.qdiscs.len() < MAX_QDISCS {
            return true;
        }
        let gone = self.qdiscs.iter().filter(|(_, q)| !q.present).min_by_key(|(_, q)| q.at).map(|(l, _)| l.clone());
        let Some(l) = gone else { return false };
        for f in &self.fam.counters {
            f.remove(&l);
        }
        self.fam.backlog_bytes.remove(&l);
        self.fam.backlog_packets.remove(&l);
        self.qdiscs.remove(&l);
        true
    }

    fn apply(&mut self, netdev: &str, r: QdiscReading, at: Instant) -> bool {
        let labels = QdiscLabels { netdev: netdev.to_string(), kind: r.kind.clone(), handle: r.handle.clone(), parent: r.parent.clone() };
        if !self.admit(&labels) {
            self.ctx.errors.inc(SOURCE, KIND_CARDINALITY);
            return false;
        }
        let fam = &self.fam;
        let q = self.qdiscs.entry(labels.clone()).or_insert_with(|| Qdisc {
            ifindex: r.ifindex,
            present: true,
            prev: None,
            suspect: None,
            acc: [0; 5],
            backlog: (0, 0),
            at,
            counters: std::array::from_fn(|i| fam.counters[i].get_or_create_owned(&labels)),
            gauges: [fam.backlog_bytes.get_or_create_owned(&labels), fam.backlog_packets.get_or_create_owned(&labels)],
        });
        let cur = [r.bytes, r.packets, u64::from(r.drops), u64::from(r.overlimits), u64::from(r.requeues)];
        // A new interface under the same name, or fewer bytes than before (the qdisc was
        // replaced under the same handle): every counter starts again from zero.
        let recreated = q.ifindex != r.ifindex;
        if !recreated && q.glitched(cur, at) {
            self.ctx.errors.inc(SOURCE, kind::COUNTER_GLITCH);
            q.present = true;
            return true;
        }
        let whole_reset = q.prev.is_some_and(|p| cur[BYTES] < p[BYTES]);
        let mut reset = whole_reset;
        for i in 0..5 {
            let d = match q.prev {
                None => Delta::Normal(cur[i]),
                Some(_) if recreated || whole_reset => Delta::Reset(cur[i]),
                Some(p) => match SEMANTICS[i].delta(p[i], cur[i]) {
                    Delta::Wrapped(w) if w > MAX_BELIEVABLE_WRAP => Delta::Reset(cur[i]),
                    d => d,
                },
            };
            reset |= matches!(d, Delta::Reset(_)) && !recreated;
            q.acc[i] = q.acc[i].saturating_add(d.value());
            q.counters[i].inc_by(d.value());
        }
        if recreated && q.present {
            self.ctx.errors.inc(SOURCE, kind::VANISHED);
        }
        if reset {
            self.ctx.errors.inc(SOURCE, kind::COUNTER_RESET);
        }
        q.ifindex = r.ifindex;
        q.prev = Some(cur);
        q.backlog = (u64::from(r.backlog_bytes), u64::from(r.backlog_packets));
        q.gauges[0].set(i64::from(r.backlog_bytes));
        q.gauges[1].set(i64::from(r.backlog_packets));
        q.present = true;
        q.at = at;
        true
    }

    fn dump_failed(&mut self, what: &str, e: super::netdev::rtnl::RtnlError) -> SourceError {
        self.rtnl = None;
        self.last_error = Some(format!("{what}: {e}"));
        self.ctx.errors.inc(SOURCE, kind::NETLINK);
        SourceError::Io { source_name: SOURCE, what: what.into(), err: std::io::Error::other(e) }
    }
}

impl Source for QdiscSource {
    fn nic_samples(&self) -> Vec<super::nic::NicPart> {
        nic_parts(self.snapshot())
    }
    /// The fast lane's read: one qdisc dump (the kernel has no per-device filter for it),
    /// applied to the qdiscs of `nics` the last sweep found — a queue that builds and drains
    /// within a step is seen only by reads that fall inside the step.
    fn fast_sweep(&mut self, nics: &std::collections::BTreeSet<String>) -> bool {
        let known: HashMap<u32, String> =
            self.qdiscs.iter().filter(|(l, q)| q.present && nics.contains(&l.netdev)).map(|(l, q)| (q.ifindex, l.netdev.clone())).collect();
        if known.is_empty() {
            return false;
        }
        let Some(rtnl) = self.rtnl.as_mut() else { return false };
        let qdiscs = match rtnl.dump(RouteNetlinkMessage::GetQueueDiscipline(TcMessage::default())) {
            Ok(d) => d,
            Err(e) => {
                self.dump_failed("rtnetlink RTM_GETQDISC dump", e);
                return false;
            }
        };
        let at = Instant::now();
        let mut read = false;
        for msg in qdiscs.messages {
            let RouteNetlinkMessage::NewQueueDiscipline(tc) = msg else { continue };
            let Some(netdev) = known.get(&(tc.header.index as u32)) else { continue };
            if !self.exports(&tc_handle(tc.header.parent)) {
                continue;
            }
            let Some(r) = parse_qdisc(&tc) else { continue };
            // Only the qdiscs the sweep admitted: a new one waits for the sweep's checks.
            let labels = QdiscLabels { netdev: netdev.clone(), kind: r.kind.clone(), handle: r.handle.clone(), parent: r.parent.clone() };
            if self.qdiscs.contains_key(&labels) {
                read |= self.apply(netdev, r, at);
            }
        }
        read
    }
    fn name(&self) -> &'static str {
        SOURCE
    }

    fn sweep(&mut self) -> Result<SweepReport, SourceError> {
        if self.rtnl.is_none() {
            match Rtnl::open() {
                Ok(r) => self.rtnl = Some(r),
                Err(e) => return Err(self.dump_failed("open rtnetlink", e)),
            }
        }
        let Some(rtnl) = self.rtnl.as_mut() else { return Ok(SweepReport::default()) };
        // Names for the ifindexes qdiscs carry, from the same namespace as the qdiscs.
        let links = match rtnl.dump(RouteNetlinkMessage::GetLink(LinkMessage::default())) {
            Ok(d) => d,
            Err(e) => return Err(self.dump_failed("rtnetlink RTM_GETLINK dump", e)),
        };
        let Some(rtnl) = self.rtnl.as_mut() else { return Ok(SweepReport::default()) };
        let qdiscs = match rtnl.dump(RouteNetlinkMessage::GetQueueDiscipline(TcMessage::default())) {
            Ok(d) => d,
            Err(e) => return Err(self.dump_failed("rtnetlink RTM_GETQDISC dump", e)),
        };
        let names: HashMap<u32, String> = links
            .messages
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => parse_link(l).map(|r| (r.ifindex, r.name)),
                _ => None,
            })
            .collect();
        let at = Instant::now();
        let mut report = SweepReport { skipped: qdiscs.undecodable, ..Default::default() };
        for _ in 0..qdiscs.undecodable {
            self.ctx.errors.inc(SOURCE, kind::PARSE);
        }
        let mut seen = HashSet::new();
        let mut outcome: BTreeMap<String, bool> = BTreeMap::new();
        for msg in qdiscs.messages {
            let RouteNetlinkMessage::NewQueueDiscipline(tc) = msg else { continue };
            let ifindex = tc.header.index as u32;
            // A qdisc on a link the link dump did not list was created in between: next sweep.
            let Some(netdev) = names.get(&ifindex) else { continue };
            if netdev == "lo" {
                continue;
            }
            let pci = pci_address(&self.ctx.sysfs_root, netdev);
            if !self.ctx.selector.selects(netdev, pci.as_deref()) || self.ctx.selector.disabled(&format!("{SOURCE}/{netdev}")) {
                continue;
            }
            if !self.exports(&tc_handle(tc.header.parent)) {
                continue;
            }
            let Some(r) = parse_qdisc(&tc) else {
                self.ctx.errors.inc(SOURCE, kind::NOT_AVAILABLE);
                report.skipped += 1;
                outcome.entry(netdev.clone()).or_insert(false);
                continue;
            };
            seen.insert(QdiscLabels { netdev: netdev.clone(), kind: r.kind.clone(), handle: r.handle.clone(), parent: r.parent.clone() });
            if self.apply(netdev, r, at) {
                report.devices += 1;
                report.values += 7;
                outcome.insert(netdev.clone(), true);
            } else {
                report.skipped += 1;
            }
        }
        for (netdev, ok) in outcome {
            if self.ctx.selector.record(&format!("{SOURCE}/{netdev}"), ok) {
                self.ctx.errors.inc(SOURCE, kind::PROBE_SAFE_SKIP);
            }
        }
        if !qdiscs.interrupted && !links.interrupted {
            for (l, q) in self.qdiscs.iter_mut() {
                if q.present && !seen.contains(l) {
                    q.present = false;
                    q.backlog = (0, 0);
                    q.gauges.iter().for_each(|g| {
                        g.set(0);
                    });
                    self.ctx.errors.inc(SOURCE, kind::VANISHED);
                }
            }
        }
        Ok(report)
    }

    fn status(&self) -> serde_json::Value {
        let qs: Vec<_> = self
            .qdiscs
            .iter()
            .map(|(l, q)| serde_json::json!({"netdev": l.netdev, "kind": l.kind, "handle": l.handle, "parent": l.parent, "present": q.present}))
            .collect();
        serde_json::json!({ "qdiscs": qs, "cap": MAX_QDISCS, "last_error": self.last_error })
    }
}

/// Root qdiscs (and their children) per netdev: drops add up, backlog is the largest.
fn nic_parts(qs: Vec<QdiscSnapshot>) -> Vec<super::nic::NicPart> {
    let mut per: std::collections::BTreeMap<String, crate::timeline::NicSample> = std::collections::BTreeMap::new();
    for q in qs.into_iter().filter(|q| q.present) {
        let e = per.entry(q.netdev.clone()).or_default();
        e.drops += q.drops as f64;
        e.backlog_bytes = e.backlog_bytes.max(q.backlog_bytes as f64);
    }
    per.into_iter().map(|(n, s)| (super::nic::info(n, None, None), s)).collect()
}

#[cfg(test)]
mod tests;
