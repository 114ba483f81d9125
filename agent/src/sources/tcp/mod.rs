//! TCP per interface, for collectives that run over TCP (gloo, NCCL's socket transport, MPI's
//! tcp btl):
//! - retransmissions from the `tcp:tcp_retransmit_skb` tracepoint, the congestion signal.
//!   The kernel counts per source address;
//! - in-flight bytes, smoothed RTT, congestion window, send buffer and the time each
//!   connection was limited by the receive window or the send buffer, from a `sock_diag`
//!   dump of the established connections every sweep (`diag.rs`, `inflight.rs`).
//!
//! Addresses map to interfaces through `getifaddrs(3)` in the agent's network namespace;
//! both parts see the connections of that namespace only.

pub(crate) mod diag;
pub mod inflight;

pub use diag::{SockDiag, TcpConn};

use std::{collections::BTreeMap, net::IpAddr};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

use super::{kind, Source, SourceContext, SourceError, SweepReport};
use crate::ebpf::TcpRetransmits;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
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
    started: std::time::Instant,
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

/// Interface name per local address (`getifaddrs(3)`).
pub fn interface_addresses() -> BTreeMap<IpAddr, String> {
    let mut out = BTreeMap::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs allocates a list we free below; we only read it in between.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list returned by getifaddrs.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() && !ifa.ifa_name.is_null() {
            // SAFETY: ifa_name is a NUL-terminated string owned by the list.
            let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
            // SAFETY: sa_family tells which sockaddr type ifa_addr points to.
            let fam = unsafe { (*ifa.ifa_addr).sa_family } as i32;
            if fam == libc::AF_INET {
                // SAFETY: AF_INET → sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                out.insert(IpAddr::V4(std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))), name);
            } else if fam == libc::AF_INET6 {
                // SAFETY: AF_INET6 → sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                out.insert(IpAddr::V6(std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr)), name);
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: the list came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

impl TcpSource {
    pub fn new(ctx: SourceContext, registry: &mut Registry) -> Self {
        let metric = Family::<NetdevLabel, Counter>::default();
        registry.register("stepwise_tcp_retransmits", "TCP segments retransmitted, by the interface owning the source address", metric.clone());
        let (probe, load_error) = match TcpRetransmits::load() {
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(e.to_string())),
        };
        let diag = SockDiag::open().map_err(|e| e.to_string());
        let inflight = inflight::InFlightTracker::new(registry);
        TcpSource { ctx, probe, load_error, last: BTreeMap::new(), totals: BTreeMap::new(), metric, diag, inflight, started: std::time::Instant::now() }
    }

    /// One `sock_diag` dump into the per-interface in-flight view; the number of connections.
    fn sweep_inflight(&mut self, addrs: &BTreeMap<IpAddr, String>) -> Result<usize, String> {
        let d = self.diag.as_mut().map_err(|e| e.clone())?;
        let (conns, bad) = d.dump().map_err(|e| e.to_string())?;
        for _ in 0..bad {
            self.ctx.errors.inc("tcp", kind::PARSE);
        }
        let sel = &self.ctx.selector;
        let now = self.started.elapsed().as_secs_f64();
        self.inflight.update(now, &conns, |c| nic_of(c, addrs).filter(|d| sel.selects(d, None)).cloned());
        Ok(conns.len())
    }
}

impl Source for TcpSource {
    fn nic_samples(&self) -> Vec<super::nic::NicPart> {
        let mut out: BTreeMap<&str, crate::timeline::NicSample> = BTreeMap::new();
        for (n, v) in &self.totals {
            out.entry(n).or_default().retransmits = *v as f64;
        }
        for (n, e) in &self.inflight.ifaces {
            out.entry(n).or_default().tcp = crate::timeline::windows::TcpSample {
                bytes_acked: e.bytes_acked,
                busy_seconds: e.busy_seconds,
                rwnd_limited_seconds: e.rwnd_limited_seconds,
                sndbuf_limited_seconds: e.sndbuf_limited_seconds,
                in_flight_byte_seconds: e.in_flight_byte_seconds,
                rtt_seconds: e.rtt_seconds,
                min_rtt_seconds: e.min_rtt_seconds,
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
        let addrs = interface_addresses();
        let mut report = SweepReport::default();
        let diag = self.sweep_inflight(&addrs);
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
            "sock_diag": self.diag.as_ref().err(), "in_flight": inflight})
    }
}
