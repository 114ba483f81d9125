//! TCP per interface, for collectives that run over TCP (gloo, NCCL's socket transport, MPI's
//! tcp btl):
//! - retransmissions from the `tcp:tcp_retransmit_skb` tracepoint, the congestion signal.
//!   The kernel counts per source address;
//! - in-flight bytes, smoothed RTT, congestion window, send buffer and the time each
//!   connection was limited by the receive window or the send buffer, from a `sock_diag`
//!   dump of the established connections (`diag.rs`, `inflight.rs`) every sweep — unless
//!   that would exceed `[sources] tcp_cpu_budget` ([`Budget`]): a dump that cost c seconds of
//!   the agent's CPU is followed by the next no sooner than c / budget later. The in-flight
//!   integrals then hold each dump's values for longer; the cumulative `tcp_info` counters
//!   (bytes acknowledged, busy and limited time) lose nothing.
//!
//! - the traced processes' own transmitted bytes per interface, from the same dump
//!   (`own.rs`): what of a NIC's bytes is the job's, the rest is other traffic; their
//!   connections to peers on this host under `lo`, the same-host link (docs/models.md §1.14).
//!
//! Addresses map to interfaces through `getifaddrs(3)` in the agent's network namespace;
//! both parts see the connections of that namespace only.

pub(crate) mod diag;
mod ifaces;
pub mod inflight;
pub mod own;

pub use diag::{SockDiag, TcpConn};
pub use ifaces::{egress_of, interface_addresses, interfaces, IfAddr};

use crate::export::reference::RegisterSampled as _;
use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

use super::{kind, Source, SourceContext, SourceError, SweepReport};
use crate::{ebpf::TcpRetransmits, timeline::windows::SAME_HOST_LINK};

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NetdevLabel {
    netdev: String,
}

pub struct TcpSource {
    ctx: SourceContext,
    probe: Option<TcpRetransmits>,
    load_error: Option<String>,
    /// Last total per address (the kernel map only grows).
    last: BTreeMap<IpAddr, u64>,
    /// Accumulated per interface.
    totals: BTreeMap<String, u64>,
    metric: Family<NetdevLabel, Counter>,
    diag: Result<SockDiag, String>,
    inflight: inflight::InFlightTracker,
    /// The traced processes' connections alone (its metrics are not registered).
    own_inflight: inflight::InFlightTracker,
    own: own::OwnTraffic,
    /// Per interface (by egress), the smallest `tcpi_min_rtt` of any connection that carried
    /// data, at the last dump.
    path_min_rtt: BTreeMap<String, f64>,
    own_metric: Family<NetdevLabel, Counter<f64, std::sync::atomic::AtomicU64>>,
    started: std::time::Instant,
    budget: Budget,
    /// The traced processes' connections at the last dump, with the link each uses (the NIC
    /// it leaves by, or the same-host link): the fast lane asks for these again one by one
    /// ([`SockDiag::query`]).
    own_conns: Vec<(TcpConn, String)>,
    /// A fast-lane dump found the traced processes' connections anew (the lane rescopes).
    found_links: bool,
    /// CPU seconds of those dumps (charged to the dumps' budget, not the lane's).
    found_cpu: f64,
    /// Sockets the kernel freed, with their last `tcp_info` (`Err`: not available here).
    destroys: Result<diag::DestroyEvents, String>,
}

/// How long a read waits for the destroy event of a traced connection it no longer finds.
pub const DESTROY_WAIT: std::time::Duration = std::time::Duration::from_millis(5);

/// The CPU budget of the `sock_diag` dump (see the module docs).
#[derive(Clone, Debug)]
pub struct Budget {
    /// Fraction of one core the dump may use on average (`[sources] tcp_cpu_budget`).
    pub share: f64,
    /// When the next dump is due (seconds since the source started).
    next: f64,
    /// Dumps skipped to stay within the budget.
    pub skipped: u64,
}

impl Budget {
    pub fn new(share: f64) -> Budget {
        Budget { share, next: 0.0, skipped: 0 }
    }

    /// Whether a dump would be due at `now` (not counted as a skip).
    pub fn is_due(&self, now: f64) -> bool {
        now >= self.next
    }

    /// Whether a dump is due at `now`.
    pub fn due(&mut self, now: f64) -> bool {
        let due = now >= self.next;
        self.skipped += u64::from(!due);
        due
    }

    /// A dump at `now` cost `cpu` seconds: the next one waits `cpu / share`.
    pub fn spent(&mut self, now: f64, cpu: f64) {
        self.next = now + if self.share > 0.0 { cpu / self.share } else { 0.0 };
    }
}

/// CPU seconds of the calling thread (user + system: the kernel builds the dump in our
/// `recvmsg`).
pub fn thread_cpu() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// The NIC a connection's traffic leaves by: the interface of its local address — unless that
/// is loopback, or its peer is an address of this host too (a rank talking to a store or a
/// rank on its own host at the NIC's address: the kernel routes it over `lo`, and it never
/// reaches the NIC). Such a connection, with its microsecond round trip, would otherwise
/// count as the NIC's traffic (seen: PyTorch's TCPStore client on rank 0 made a gloo job's
/// in-flight bytes / RTT 4.7 × what the NIC sent).
pub fn nic_of<'a>(c: &diag::TcpConn, addrs: &'a BTreeMap<IpAddr, String>) -> Option<&'a String> {
    if c.remote.is_some_and(|r| addrs.contains_key(&r)) {
        return None;
    }
    c.local.and_then(|ip| addrs.get(&ip)).filter(|d| d.as_str() != "lo")
}

/// Whether a connection stays on this host: loopback, or a peer at one of this host's
/// addresses (the kernel routes it over `lo`).
pub fn same_host(c: &diag::TcpConn, addrs: &BTreeMap<IpAddr, String>) -> bool {
    c.local.is_some_and(|l| l.is_loopback()) || c.remote.is_some_and(|r| r.is_loopback() || addrs.contains_key(&r))
}

impl TcpSource {
    /// With the dump's CPU budget, a fraction of one core (`[sources] tcp_cpu_budget`).
    pub fn with_cpu_budget(mut self, share: f64) -> Self {
        self.budget = Budget::new(share);
        self
    }

    pub fn new(ctx: SourceContext, registry: &mut Registry) -> Self {
        let metric = Family::<NetdevLabel, Counter>::default();
        registry.register_sampled("stepwise_tcp_retransmits", "TCP segments retransmitted, by the interface owning the source address", metric.clone());
        let (probe, load_error) = match TcpRetransmits::load() {
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(e.to_string())),
        };
        let diag = SockDiag::open().map_err(|e| e.to_string());
        let inflight = inflight::InFlightTracker::new(registry);
        let own_metric = Family::default();
        registry.register_sampled(
            "stepwise_tcp_traced_transmit_bytes",
            "Wire bytes (payload and headers) the traced collective processes' own TCP connections sent, by the interface owning the source address",
            Clone::clone(&own_metric),
        );
        TcpSource {
            own_inflight: inflight::InFlightTracker::new(&mut Registry::default()),
            path_min_rtt: BTreeMap::new(),
            own: own::OwnTraffic::new(ctx.owners.clone()),
            own_metric,
            ctx,
            probe,
            load_error,
            last: BTreeMap::new(),
            totals: BTreeMap::new(),
            metric,
            diag,
            inflight,
            started: std::time::Instant::now(),
            budget: Budget::new(crate::config::DEFAULT_TCP_CPU_BUDGET),
            own_conns: Vec::new(),
            found_links: false,
            found_cpu: 0.0,
            destroys: diag::DestroyEvents::open().map_err(|e| e.to_string()),
        }
    }

    /// One `sock_diag` dump into the per-interface in-flight view when the budget allows; the
    /// number of connections (0 when skipped).
    fn sweep_inflight(&mut self, ifs: &[IfAddr], addrs: &BTreeMap<IpAddr, String>) -> Result<usize, String> {
        self.take_destroyed(false);
        let d = self.diag.as_mut().map_err(|e| e.clone())?;
        let start = self.started.elapsed().as_secs_f64();
        if !self.budget.due(start) {
            return Ok(0);
        }
        let cpu0 = thread_cpu();
        let dumped = d.dump().map_err(|e| e.to_string());
        self.budget.spent(start, thread_cpu() - cpu0);
        let (conns, bad) = dumped?;
        if self.own.missing(&conns, None) {
            self.take_destroyed(true);
        }
        for _ in 0..bad {
            self.ctx.errors.inc("tcp", kind::PARSE);
        }
        let sel = &self.ctx.selector;
        let now = self.started.elapsed().as_secs_f64();
        let iface = |c: &TcpConn| nic_of(c, addrs).filter(|d| sel.selects(d, None)).cloned();
        self.inflight.update(now, &conns, iface);
        // Own bytes by the interface their packets leave by (the peer's connected subnet),
        // which a rank bound to another rail's address does not change.
        // A connection to a peer on this host never reaches a NIC: its bytes are the job's
        // same-host link (`lo`), where the local phases of a hierarchical collective run.
        let ifaces = addrs.values().filter(|d| sel.selects(d, None)).cloned().chain([SAME_HOST_LINK.to_string()]);
        let egress = |c: &TcpConn| egress_of(c, ifs, addrs).filter(|d| sel.selects(d, None)).map(str::to_string);
        let own_link = |c: &TcpConn| egress(c).or_else(|| same_host(c, addrs).then(|| SAME_HOST_LINK.to_string()));
        self.own.update(&conns, ifaces, own_link);
        // The same figures of the traced processes' connections alone, by the interface
        // their packets leave by, for attribution: a bulk flow's RTT (its queue) is not the
        // job's round latency, nor is a connection bound to one rail's address the traffic
        // of that rail when it reaches a peer on another.
        let own: Vec<TcpConn> = conns.iter().filter(|c| self.own.is_own(c)).cloned().collect();
        self.own_inflight.update(now, &own, egress);
        // The fast lane reads them again by the link they use: a NIC, or the same-host link
        // (whose local phases need the fast lane's resolution as much as a NIC's).
        self.own_conns = own.into_iter().filter_map(|c| own_link(&c).map(|e| (c, e))).collect();
        // The path's round trip without queueing is the smallest any connection through the
        // interface saw, whoever holds it: a connection first used behind a standing queue
        // (its own job's, or a bulk flow's) never saw less than that queue.
        self.path_min_rtt.clear();
        for c in conns.iter().filter(|c| c.min_rtt > 0.0 && c.bytes_acked > 1) {
            if let Some(dev) = egress(c) {
                let m = self.path_min_rtt.entry(dev).or_insert(c.min_rtt);
                *m = m.min(c.min_rtt);
            }
        }
        // The budget covers the whole dump's work, the owners' lookup included.
        self.budget.spent(start, thread_cpu() - cpu0);
        for (dev, per_pid) in &self.own.per_iface {
            let c = self.own_metric.get_or_create(&NetdevLabel { netdev: dev.clone() });
            let d = per_pid.values().sum::<f64>() - c.get();
            if d > 0.0 {
                c.inc_by(d);
            }
        }
        Ok(conns.len())
    }
}

impl TcpSource {
    /// The fast lane's read: the traced processes' connections known at the last dump that
    /// leave by one of `nics`, each asked for by itself (a hash lookup, where a dump walks
    /// every socket of the host), into their own bytes and in-flight figures.
    /// The traced connections the kernel freed since the last read: their bytes up to their
    /// end (see [`diag::DestroyEvents`]). With `wait`, a traced connection is missing from the
    /// read just taken: its event is waited for (up to [`DESTROY_WAIT`]).
    fn take_destroyed(&mut self, wait: bool) {
        let Ok(ev) = self.destroys.as_mut() else { return };
        let got = if wait { ev.wait(DESTROY_WAIT) } else { ev.drain() };
        match got {
            Ok(gone) => {
                self.own.destroyed(&gone);
            }
            Err(_) => self.ctx.errors.inc("tcp", kind::NETLINK),
        }
    }

    fn fast_own(&mut self, nics: &std::collections::BTreeSet<String>) -> bool {
        self.take_destroyed(false);
        let Ok(d) = self.diag.as_mut() else { return false };
        let asked: Vec<&TcpConn> = self.own_conns.iter().filter(|(_, e)| nics.contains(e)).map(|(c, _)| c).collect();
        if asked.is_empty() {
            return false;
        }
        let conns = match d.query(&asked) {
            Ok(c) => c,
            Err(_) => {
                self.ctx.errors.inc("tcp", kind::NETLINK);
                return false;
            }
        };
        let cookies: Vec<u64> = asked.iter().map(|c| c.cookie).collect();
        if self.own.missing(&conns, Some(&cookies)) {
            self.take_destroyed(true);
        }
        let egress: HashMap<u64, &String> = self.own_conns.iter().map(|(c, e)| (c.cookie, e)).collect();
        let link = |c: &TcpConn| egress.get(&c.cookie).map(|e| e.to_string());
        // In-flight figures are the NICs' (as at the dumps); own bytes every link's.
        let nic = |c: &TcpConn| link(c).filter(|e| e != SAME_HOST_LINK);
        let now = self.started.elapsed().as_secs_f64();
        self.own.update_some(&cookies, &conns, link);
        self.own_inflight.update_some(now, &conns, nic);
        true
    }
}

impl Source for TcpSource {
    fn fast_sweep(&mut self, nics: &std::collections::BTreeSet<String>) -> bool {
        if self.own.owners_changed() && self.budget.is_due(self.started.elapsed().as_secs_f64()) {
            // A job started (or ended) since the last dump: its connections are found now,
            // not at the next full sweep (a second later, its first steps without figures).
            // It is the dump the next sweep would make, within the dumps' budget and charged
            // to it (a storm of short-lived processes does not turn into a storm of dumps).
            let cpu0 = thread_cpu();
            let ifs = interfaces();
            let addrs: BTreeMap<IpAddr, String> = ifs.iter().map(|a| (a.addr, a.name.clone())).collect();
            let found = self.sweep_inflight(&ifs, &addrs).is_ok_and(|n| n > 0);
            self.found_links |= found;
            self.found_cpu += thread_cpu() - cpu0;
            return found;
        }
        self.fast_own(nics)
    }
    fn fast_found_links(&mut self) -> bool {
        std::mem::take(&mut self.found_links)
    }
    fn fast_cpu_charged_elsewhere(&mut self) -> f64 {
        std::mem::take(&mut self.found_cpu)
    }
    fn nic_samples(&self) -> Vec<super::nic::NicPart> {
        let mut out: BTreeMap<&str, crate::timeline::NicSample> = BTreeMap::new();
        for (n, v) in &self.totals {
            out.entry(n).or_default().retransmits = *v as f64;
        }
        for n in &self.own.measured {
            out.entry(n).or_default().own_tx = self.own.of(n);
        }
        // With traced processes, the NICs' TCP figures are theirs (none where they have no
        // connection); without, every connection's.
        let tcp = if self.own.tracing() { &self.own_inflight } else { &self.inflight };
        for (n, e) in &tcp.ifaces {
            let min_rtt = self.path_min_rtt.get(n).copied().unwrap_or(e.min_rtt_seconds);
            out.entry(n).or_default().tcp = crate::timeline::windows::TcpSample {
                bytes_acked: e.bytes_acked,
                busy_seconds: e.busy_seconds,
                rwnd_limited_seconds: e.rwnd_limited_seconds,
                sndbuf_limited_seconds: e.sndbuf_limited_seconds,
                in_flight_byte_seconds: e.in_flight_byte_seconds,
                rtt_seconds: e.rtt_seconds,
                min_rtt_seconds: min_rtt,
                mss_bytes: e.mss_bytes,
                sndbuf_bytes: e.sndbuf_bytes,
                cwnd_bytes: e.cwnd_bytes,
            };
        }
        out.into_iter().map(|(n, s)| (crate::timeline::NicInfo { name: n.to_string(), ..Default::default() }, s)).collect()
    }
    fn name(&self) -> &'static str {
        "tcp"
    }
    fn sweep(&mut self) -> Result<SweepReport, SourceError> {
        let ifs = interfaces();
        let addrs: BTreeMap<IpAddr, String> = ifs.iter().map(|a| (a.addr, a.name.clone())).collect();
        let mut report = SweepReport::default();
        let diag = self.sweep_inflight(&ifs, &addrs);
        match &diag {
            Ok(n) => report.values += n,
            Err(_) => self.ctx.errors.inc("tcp", kind::NETLINK),
        }
        let Some(p) = &self.probe else {
            if diag.is_ok() {
                report.devices = addrs.len();
                return Ok(report);
            }
            return Err(SourceError::Unavailable { source_name: "tcp", reason: self.load_error.clone().unwrap_or_default() });
        };
        for (ip, total) in p.counts() {
            report.values += 1;
            let prev = self.last.insert(ip, total).unwrap_or(0);
            let delta = total.saturating_sub(prev);
            let Some(dev) = addrs.get(&ip) else { continue };
            if !self.ctx.selector.selects(dev, None) {
                continue;
            }
            if delta > 0 {
                *self.totals.entry(dev.clone()).or_default() += delta;
                self.metric.get_or_create(&NetdevLabel { netdev: dev.clone() }).inc_by(delta);
            }
        }
        if self.last.len() > 4096 {
            self.last.clear();
            self.ctx.errors.inc("tcp", kind::COUNTER_RESET);
        }
        report.devices = addrs.len();
        Ok(report)
    }
    fn status(&self) -> serde_json::Value {
        let inflight: BTreeMap<&str, serde_json::Value> = self
            .inflight
            .ifaces
            .iter()
            .map(|(n, e)| {
                (n.as_str(), serde_json::json!({"connections": e.connections, "in_flight_bytes": e.in_flight_bytes, "rtt_seconds": e.rtt_seconds, "bytes_acked": e.bytes_acked}))
            })
            .collect();
        serde_json::json!({"attached": self.probe.is_some(), "error": self.load_error, "retransmits": self.totals,
            "sock_diag": self.diag.as_ref().err(), "destroy_events": self.destroys.as_ref().err(), "in_flight": inflight,
            "cpu_budget": self.budget.share, "dumps_skipped_for_budget": self.budget.skipped})
    }
}

#[cfg(test)]
mod budget_tests {
    use super::{Budget, Registry, Source, SourceContext, TcpSource, SAME_HOST_LINK};

    #[test]
    fn a_dump_waits_its_cost_over_the_budget() {
        // 1 % of a core: a dump of 0.6 ms of CPU waits 60 ms; at a 10 ms interval, 5 of 6
        // sweeps skip it.
        let mut b = Budget::new(0.01);
        let mut dumps = 0;
        for i in 0..60 {
            let now = f64::from(i) * 0.010;
            if b.due(now) {
                dumps += 1;
                b.spent(now, 0.0006);
            }
        }
        assert_eq!((dumps, b.skipped), (10, 50));
        // A cheap dump at a slow interval is never skipped.
        let mut b = Budget::new(0.01);
        for i in 0..10 {
            assert!(b.due(f64::from(i)));
            b.spent(f64::from(i), 0.0006);
        }
        assert_eq!(b.skipped, 0);
    }

    #[test]
    fn a_new_traced_process_is_dumped_by_the_fast_lane_within_the_dumps_budget() {
        use std::{
            collections::BTreeSet,
            net::{TcpListener, TcpStream},
            path::Path,
        };
        let ctx = SourceContext {
            sysfs_root: "/nonexistent".into(),
            selector: crate::sources::Selector::new(&[], &[], false).expect("selector"),
            errors: crate::sources::Errors::default(),
            interval: std::time::Duration::from_secs(1),
            rails: Default::default(),
            owners: Default::default(),
        };
        let owners = ctx.owners.clone();
        let mut src = TcpSource::new(ctx, &mut Registry::default()).with_cpu_budget(0.02);
        let l = TcpListener::bind("127.0.0.1:0").expect("listen");
        let _a = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let _b = l.accept().expect("accept");
        let lo: BTreeSet<String> = [SAME_HOST_LINK.to_string()].into();
        assert!(!src.fast_sweep(&lo), "nothing traced: nothing to read");
        owners.publish(Path::new("/proc"), [std::process::id()].into_iter());
        assert!(src.fast_sweep(&lo), "a newly traced process: its connections dumped at once");
        assert!(src.fast_found_links() && !src.fast_found_links(), "found once, reset by the call");
        assert!(src.fast_cpu_charged_elsewhere() > 0.0, "the dump is charged to the dumps' budget");
        assert!(src.own_conns.iter().filter(|(_, link)| link == SAME_HOST_LINK).count() >= 2, "both ends, on the same-host link: {:?}", src.own_conns.len());
        // Another change right after: the dumps' budget makes it wait; the connections known
        // are still read one by one meanwhile.
        owners.publish(Path::new("/proc"), [std::process::id(), 1].into_iter());
        assert!(src.fast_sweep(&lo), "the known loopback connections are read");
        assert!(!src.fast_found_links(), "no second dump within the budget");
        assert_eq!(src.fast_cpu_charged_elsewhere(), 0.0);
    }
}

#[cfg(test)]
mod same_host_tests {
    use std::{collections::BTreeMap, net::IpAddr};

    use super::{nic_of, same_host, TcpConn};

    #[test]
    fn a_peer_at_this_hosts_own_address_is_the_same_host_link_not_a_nic() {
        let addrs: BTreeMap<IpAddr, String> =
            [("198.18.0.1", "rail0"), ("198.18.1.1", "rail1"), ("127.0.0.1", "lo")].into_iter().map(|(a, n)| (a.parse().expect("ip"), n.to_string())).collect();
        let conn = |l: &str, r: &str| TcpConn { local: Some(l.parse().expect("ip")), remote: Some(r.parse().expect("ip")), ..Default::default() };
        // Rank 0 at rail 0's address to rank 1 at rail 1's, both on this host: over lo.
        let local = conn("198.18.0.1", "198.18.1.1");
        assert!(same_host(&local, &addrs) && nic_of(&local, &addrs).is_none());
        assert!(same_host(&conn("127.0.0.1", "127.0.0.1"), &addrs));
        // A peer on the other server: its NIC, not the same-host link.
        let remote = conn("198.18.0.1", "198.18.0.2");
        assert!(!same_host(&remote, &addrs));
        assert_eq!(nic_of(&remote, &addrs).map(String::as_str), Some("rail0"));
    }
}
