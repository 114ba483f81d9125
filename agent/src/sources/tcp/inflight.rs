//! In-flight bytes, round trip and limit states of the TCP connections, per interface, from
//! the `sock_diag` dump (docs/models.md §2, Little's law per connection: throughput =
//! in-flight bytes / smoothed RTT). The kernel's `tcp_info` chrono counters give exactly how
//! long each connection had data to send and how long of that it was stalled by the peer's
//! receive window or the local send buffer; the rest of the busy time the congestion window
//! (or the path) set the pace.
//!
//! Per sweep, per interface (the one owning the connection's local address):
//! cumulative bytes acknowledged, segments delivered, busy / rwnd-limited / sndbuf-limited
//! seconds, and the integrals over time of the in-flight bytes and of in-flight ÷ RTT (each sweep's
//! value held for the interval since the previous sweep); gauges of the connections' in-flight bytes, RTT, MSS,
//! congestion window and send buffer.

use crate::export::reference::RegisterSampled as _;
use std::collections::{BTreeMap, HashMap};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use super::diag::TcpConn;

/// One interface's accumulated view.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IfaceTcp {
    pub connections: usize,
    pub bytes_acked: f64,
    pub delivered: f64,
    pub busy_seconds: f64,
    pub rwnd_limited_seconds: f64,
    pub sndbuf_limited_seconds: f64,
    /// ∫ in-flight bytes dt.
    pub in_flight_byte_seconds: f64,
    /// ∫ Σ in-flight / srtt dt: the bytes Little's law says were delivered.
    pub little_bytes: f64,
    /// Gauges at the last sweep.
    pub in_flight_bytes: f64,
    /// Σ in-flight / srtt at the last sweep (bytes/s).
    pub little_rate: f64,
    pub in_flight_segments: f64,
    /// Mean smoothed RTT of the connections that carried data since the previous sweep (of
    /// every connection that ever carried data when none did); 0 when unknown.
    pub rtt_seconds: f64,
    /// Smallest `tcpi_min_rtt` of the same connections: the path's round trip without
    /// queueing (a connection first used behind a standing queue never saw less than the
    /// queue, so a mean would take the queue for the path).
    pub min_rtt_seconds: f64,
    pub mss_bytes: f64,
    pub cwnd_bytes: f64,
    pub sndbuf_bytes: f64,
}

#[derive(Clone, Copy, Default)]
struct Last {
    acked: u64,
    delivered: u32,
    busy: f64,
    rwnd: f64,
    sndbuf: f64,
    seen: u64,
}

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Netdev {
    netdev: String,
}

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Limit {
    netdev: String,
    limit: &'static str,
}

/// Round-trip buckets: 20 µs … 2 s.
const RTT_BUCKETS: [f64; 14] = [20e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 20e-3, 50e-3, 100e-3, 500e-3, 2.0];

#[derive(Clone)]
struct Metrics {
    in_flight_bytes: Family<Netdev, Gauge<f64, std::sync::atomic::AtomicU64>>,
    in_flight_segments: Family<Netdev, Gauge<f64, std::sync::atomic::AtomicU64>>,
    mss: Family<Netdev, Gauge<f64, std::sync::atomic::AtomicU64>>,
    cwnd: Family<Netdev, Gauge<f64, std::sync::atomic::AtomicU64>>,
    sndbuf: Family<Netdev, Gauge<f64, std::sync::atomic::AtomicU64>>,
    conns: Family<Netdev, Gauge>,
    rtt: Family<Netdev, Histogram>,
    acked: Family<Netdev, Counter<f64, std::sync::atomic::AtomicU64>>,
    delivered: Family<Netdev, Counter<f64, std::sync::atomic::AtomicU64>>,
    busy: Family<Netdev, Counter<f64, std::sync::atomic::AtomicU64>>,
    limited: Family<Limit, Counter<f64, std::sync::atomic::AtomicU64>>,
    in_flight_integral: Family<Netdev, Counter<f64, std::sync::atomic::AtomicU64>>,
    little: Family<Netdev, Counter<f64, std::sync::atomic::AtomicU64>>,
}

impl Metrics {
    fn register(r: &mut Registry) -> Metrics {
        let m = Metrics {
            in_flight_bytes: Default::default(),
            in_flight_segments: Default::default(),
            mss: Default::default(),
            cwnd: Default::default(),
            sndbuf: Default::default(),
            conns: Default::default(),
            rtt: Family::new_with_constructor(|| Histogram::new(RTT_BUCKETS)),
            acked: Default::default(),
            delivered: Default::default(),
            busy: Default::default(),
            limited: Default::default(),
            in_flight_integral: Default::default(),
            little: Default::default(),
        };
        r.register_sampled(
            "stepwise_tcp_in_flight_bytes",
            "Bytes sent and not yet acknowledged on the interface's established TCP connections (N·m), at the last sweep",
            m.in_flight_bytes.clone(),
        );
        r.register_sampled("stepwise_tcp_in_flight_segments", "Segments in flight (N), at the last sweep", m.in_flight_segments.clone());
        r.register_sampled("stepwise_tcp_mss_bytes", "Mean send MSS of the connections carrying data (m, bytes per request)", m.mss.clone());
        r.register_sampled("stepwise_tcp_cwnd_bytes", "Sum of the connections' congestion windows × MSS", m.cwnd.clone());
        r.register_sampled("stepwise_tcp_sndbuf_bytes", "Sum of the connections' send buffer sizes", m.sndbuf.clone());
        r.register_sampled("stepwise_tcp_connections", "Established TCP connections whose local address is on the interface", m.conns.clone());
        r.register_sampled(
            "stepwise_tcp_rtt_seconds",
            "Smoothed RTT (T, request occupancy) of each connection that carried data, observed once per sweep",
            m.rtt.clone(),
        );
        r.register_sampled("stepwise_tcp_acked_bytes", "Bytes acknowledged by the peers", m.acked.clone());
        r.register_sampled("stepwise_tcp_delivered_segments", "Segments delivered (completions)", m.delivered.clone());
        r.register_sampled("stepwise_tcp_busy_seconds", "Connection-seconds with data to send (tcpi_busy_time, includes the limited states)", m.busy.clone());
        r.register_sampled(
            "stepwise_tcp_limited_seconds",
            "Connection-seconds of the busy time stalled by a limit: rwnd (the peer's receive window) or sndbuf (the local send buffer)",
            m.limited.clone(),
        );
        r.register_sampled(
            "stepwise_tcp_in_flight_byte_seconds",
            "Integral of the bytes in flight over time (rate() = mean bytes in flight)",
            m.in_flight_integral.clone(),
        );
        r.register_sampled(
            "stepwise_tcp_in_flight_per_rtt_bytes",
            "Integral of Σ in-flight bytes / smoothed RTT over time: the bytes Little's law says were sent (rate() = N·m/T throughput; was stepwise_tcp_little_bytes_total)",
            m.little.clone(),
        );
        m
    }
}

/// One interface's connections in one dump.
#[derive(Default)]
struct Acc {
    conns: usize,
    inflight: f64,
    segs: f64,
    cwnd: f64,
    sndbuf: f64,
    active_rtt: (f64, usize),
    any_rtt: (f64, usize),
    active_min: Option<f64>,
    any_min: Option<f64>,
    mss: (f64, usize),
    little: f64,
}

fn mean((s, n): (f64, usize)) -> f64 {
    if n > 0 {
        s / n as f64
    } else {
        0.0
    }
}

/// Keeps the smallest positive value.
fn low(m: &mut Option<f64>, v: f64) {
    if v > 0.0 {
        *m = Some(m.map_or(v, |m| m.min(v)));
    }
}

fn push((s, n): &mut (f64, usize), v: f64) {
    *s += v;
    *n += 1;
}

impl Acc {
    /// Adds one connection; `moved`: it carried data since the previous sweep.
    fn add(&mut self, c: &TcpConn, moved: bool) {
        let inflight = c.in_flight_bytes();
        self.conns += 1;
        self.inflight += inflight;
        self.segs += c.unacked as f64;
        self.cwnd += c.snd_cwnd as f64 * c.snd_mss as f64;
        self.sndbuf += c.sndbuf as f64;
        if c.srtt <= 0.0 {
            return;
        }
        self.little += inflight / c.srtt;
        if c.bytes_acked > 1 {
            push(&mut self.any_rtt, c.srtt);
            low(&mut self.any_min, c.min_rtt);
        }
        if moved {
            push(&mut self.active_rtt, c.srtt);
            low(&mut self.active_min, c.min_rtt);
            push(&mut self.mss, c.snd_mss as f64);
        }
    }
}

/// Accumulates the dumps into per-interface totals and exports them.
pub struct InFlightTracker {
    last: HashMap<u64, Last>,
    sweeps: u64,
    last_time: Option<f64>,
    pub ifaces: BTreeMap<String, IfaceTcp>,
    metrics: Metrics,
}

/// Connections are forgotten after this many sweeps without being seen.
const FORGET_AFTER: u64 = 2;

impl InFlightTracker {
    pub fn new(registry: &mut Registry) -> InFlightTracker {
        InFlightTracker { last: HashMap::new(), sweeps: 0, last_time: None, ifaces: BTreeMap::new(), metrics: Metrics::register(registry) }
    }

    /// One dump at `now` (seconds, any monotonic clock); `iface_of` maps a local address to
    /// its interface, `None` for connections to leave out.
    pub fn update(&mut self, now: f64, conns: &[TcpConn], iface_of: impl Fn(&TcpConn) -> Option<String>) {
        self.update_with(now, conns, iface_of, false);
    }

    /// [`InFlightTracker::update`] with some connections only (the fast lane's): a connection
    /// left out is not forgotten, an interface none of them uses keeps its figures (its
    /// in-flight bytes held over the time since), and the metrics wait for the next dump.
    pub fn update_some(&mut self, now: f64, conns: &[TcpConn], iface_of: impl Fn(&TcpConn) -> Option<String>) {
        self.update_with(now, conns, iface_of, true);
    }

    fn update_with(&mut self, now: f64, conns: &[TcpConn], iface_of: impl Fn(&TcpConn) -> Option<String>, partial: bool) {
        if !partial {
            self.sweeps += 1;
        }
        let dt = self.last_time.map(|t| (now - t).max(0.0)).unwrap_or(0.0);
        self.last_time = Some(now);
        let mut acc: BTreeMap<String, Acc> = BTreeMap::new();
        for c in conns {
            let Some(dev) = iface_of(c) else { continue };
            let prev = self.last.insert(
                c.cookie,
                Last { acked: c.bytes_acked, delivered: c.delivered, busy: c.busy, rwnd: c.rwnd_limited, sndbuf: c.sndbuf_limited, seen: self.sweeps },
            );
            let e = self.ifaces.entry(dev.clone()).or_default();
            // A connection first seen contributes from its next sweep (its totals so far
            // belong to before the agent looked).
            let moved = match prev {
                Some(p) => {
                    e.bytes_acked += c.bytes_acked.saturating_sub(p.acked) as f64;
                    e.delivered += c.delivered.wrapping_sub(p.delivered) as f64;
                    e.busy_seconds += (c.busy - p.busy).max(0.0);
                    e.rwnd_limited_seconds += (c.rwnd_limited - p.rwnd).max(0.0);
                    e.sndbuf_limited_seconds += (c.sndbuf_limited - p.sndbuf).max(0.0);
                    c.bytes_acked > p.acked || c.unacked > 0
                }
                None => c.unacked > 0,
            };
            acc.entry(dev.clone()).or_default().add(c, moved);
            if moved && c.srtt > 0.0 {
                self.metrics.rtt.get_or_create(&Netdev { netdev: dev }).observe(c.srtt);
            }
        }
        let sweeps = self.sweeps;
        if !partial {
            self.last.retain(|_, l| sweeps - l.seen <= FORGET_AFTER);
        }
        for (dev, e) in self.ifaces.iter_mut() {
            let Some(a) = acc.remove(dev).or_else(|| (!partial).then(Acc::default)) else {
                e.in_flight_byte_seconds += e.in_flight_bytes * dt;
                e.little_bytes += e.little_rate * dt;
                continue;
            };
            e.connections = a.conns;
            e.in_flight_bytes = a.inflight;
            e.in_flight_byte_seconds += a.inflight * dt;
            e.little_bytes += a.little * dt;
            e.in_flight_segments = a.segs;
            e.cwnd_bytes = a.cwnd;
            e.sndbuf_bytes = a.sndbuf;
            // RTT of the connections that moved data; of those that ever did when none moved.
            e.rtt_seconds = if a.active_rtt.1 > 0 { mean(a.active_rtt) } else { mean(a.any_rtt) };
            e.min_rtt_seconds = a.active_min.or(a.any_min).unwrap_or(0.0);
            if a.mss.1 > 0 {
                e.mss_bytes = mean(a.mss);
            }
            e.little_rate = a.little;
        }
        if !partial {
            self.export();
        }
    }

    fn export(&self) {
        let m = &self.metrics;
        for (dev, e) in &self.ifaces {
            let l = Netdev { netdev: dev.clone() };
            m.in_flight_bytes.get_or_create(&l).set(e.in_flight_bytes);
            m.in_flight_segments.get_or_create(&l).set(e.in_flight_segments);
            m.mss.get_or_create(&l).set(e.mss_bytes);
            m.cwnd.get_or_create(&l).set(e.cwnd_bytes);
            m.sndbuf.get_or_create(&l).set(e.sndbuf_bytes);
            m.conns.get_or_create(&l).set(e.connections as i64);
            // Counters follow the totals (which only grow).
            let bump = |c: &Counter<f64, std::sync::atomic::AtomicU64>, total: f64| {
                let d = total - c.get();
                if d > 0.0 {
                    c.inc_by(d);
                }
            };
            bump(&m.acked.get_or_create(&l), e.bytes_acked);
            bump(&m.delivered.get_or_create(&l), e.delivered);
            bump(&m.busy.get_or_create(&l), e.busy_seconds);
            bump(&m.limited.get_or_create(&Limit { netdev: dev.clone(), limit: "rwnd" }), e.rwnd_limited_seconds);
            bump(&m.limited.get_or_create(&Limit { netdev: dev.clone(), limit: "sndbuf" }), e.sndbuf_limited_seconds);
            bump(&m.in_flight_integral.get_or_create(&l), e.in_flight_byte_seconds);
            bump(&m.little.get_or_create(&l), e.little_bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(cookie: u64, acked: u64, unacked: u32, srtt: f64, busy: f64, sndbuf_limited: f64) -> TcpConn {
        TcpConn {
            cookie,
            bytes_acked: acked,
            unacked,
            snd_mss: 1000,
            srtt,
            min_rtt: srtt / 2.0,
            busy,
            sndbuf_limited,
            snd_cwnd: 10,
            sndbuf: 4096,
            ..Default::default()
        }
    }

    #[test]
    fn deltas_accumulate_per_interface_from_the_second_sight_and_little_integrates_in_flight_over_rtt() {
        let mut r = Registry::default();
        let mut t = InFlightTracker::new(&mut r);
        let dev = |c: &TcpConn| Some(if c.cookie < 10 { "eth0" } else { "eth1" }.to_string());
        // First sight: nothing accumulated (history before the agent looked).
        t.update(0.0, &[conn(1, 5_000_000, 20, 0.02, 3.0, 1.0), conn(11, 100, 0, 0.001, 0.0, 0.0)], dev);
        assert_eq!(t.ifaces["eth0"].bytes_acked, 0.0);
        assert_eq!(t.ifaces["eth0"].in_flight_bytes, 20_000.0);
        // 0.1 s later: 100 kB more acked, 0.1 s busy of which 0.08 s sndbuf-limited.
        t.update(0.1, &[conn(1, 5_100_000, 10, 0.02, 3.1, 1.08), conn(11, 100, 0, 0.001, 0.0, 0.0)], dev);
        let e = &t.ifaces["eth0"];
        assert_eq!(e.bytes_acked, 100_000.0);
        assert!((e.busy_seconds - 0.1).abs() < 1e-9 && (e.sndbuf_limited_seconds - 0.08).abs() < 1e-9, "{e:?}");
        // Little: 10 000 B in flight / 20 ms = 500 kB/s over the 0.1 s since the last sweep =
        // 50 kB; the in-flight integral 10 000 B × 0.1 s.
        assert!((e.little_bytes - 50_000.0).abs() < 1e-6, "{e:?}");
        assert!((e.in_flight_byte_seconds - 1_000.0).abs() < 1e-6, "{e:?}");
        assert!((e.rtt_seconds - 0.02).abs() < 1e-12 && (e.min_rtt_seconds - 0.01).abs() < 1e-12 && e.mss_bytes == 1000.0);
        // The idle connection of eth1 moved nothing: its RTT is that of a connection that
        // once carried data.
        assert!((t.ifaces["eth1"].rtt_seconds - 0.001).abs() < 1e-12);
        // A connection gone: gauges drop to 0, totals stay.
        t.update(0.2, &[], dev);
        let e = &t.ifaces["eth0"];
        assert_eq!((e.connections, e.in_flight_bytes, e.rtt_seconds), (0, 0.0, 0.0));
        assert_eq!(e.bytes_acked, 100_000.0);
        // A new connection reusing nothing: its history is not counted.
        t.update(0.3, &[conn(2, 9_000_000, 0, 0.02, 9.0, 0.0)], dev);
        assert_eq!(t.ifaces["eth0"].bytes_acked, 100_000.0);
        // Exported under the name that says what it is (issue 33; was
        // stepwise_tcp_little_bytes_total): the 50 kB Little's law says were sent.
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).expect("encode");
        let v: Option<f64> = text
            .lines()
            .find(|l| l.starts_with("stepwise_tcp_in_flight_per_rtt_bytes_total{netdev=\"eth0\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok());
        assert_eq!(v, Some(50_000.0), "{text}");
        assert!(!text.lines().any(|l| l.starts_with("stepwise_tcp_little")), "{text}");
    }
}
