//! What the transport measured about a transfer: the path's round trip (the per-round
//! latency term of ideal communication, docs/models.md §1.3) and, for TCP, the in-flight
//! bound N·m/T with the limit that held N down (§2.2), from the `tcp_info` deltas of the
//! NICs' windows (`timeline::windows::TcpSample`).

use std::collections::BTreeMap;

use super::NetSample;
use crate::timeline::{Collective, NicWindow};

/// Synchronous rounds of a collective on its communicator (§1.3–§1.4: a ring AllReduce is
/// 2(p−1) rounds, AllGather and ReduceScatter p−1); one when the op or p is unknown.
pub fn rounds(c: &Collective) -> f64 {
    let p = c.nranks.unwrap_or(0).max(c.arrivals.len() as u32) as f64;
    if p < 2.0 {
        return 1.0;
    }
    match c.op.as_str() {
        "all_reduce" => 2.0 * (p - 1.0),
        "all_gather" | "reduce_scatter" | "all_to_all" => p - 1.0,
        _ => 1.0,
    }
}

fn mean_positive(v: impl Iterator<Item = f64>) -> Option<f64> {
    let (s, n) = v.filter(|r| *r > 0.0).fold((0.0, 0usize), |(s, n), r| (s + r, n + 1));
    (n > 0).then(|| s / n as f64)
}

/// Half the smallest RTT (`tcpi_min_rtt`, the path without the queue a transfer builds
/// — that queueing is its serialisation, already in `V/B`) of the TCP connections on the
/// windows' NICs that carried data during the transfer, half the smoothed RTT where the kernel
/// gave no minimum; `None` when no NIC measured one (RDMA, or no TCP connection moved).
pub fn one_way_latency(wins: &[&NicWindow]) -> Option<f64> {
    mean_positive(wins.iter().map(|w| w.tcp()).map(|t| if t.min_rtt_seconds > 0.0 { t.min_rtt_seconds } else { t.rtt_seconds })).map(|r| r / 2.0)
}

/// Mean smoothed RTT (T of Little's law: the time a byte stays in flight, queue included).
fn smoothed_rtt(wins: &[&NicWindow]) -> Option<f64> {
    mean_positive(wins.iter().map(|w| w.tcp().rtt_seconds))
}

/// The per-round latency of a transfer: the path's measured round trip where known, else
/// the configured α (`[steps.params] alpha`), never below α. A round is over for a rank when
/// its receive has arrived (one way) *and* its send has completed, and a reliable transport
/// completes a send when the peer acknowledged it (an RDMA RC work completion, the NCCL-ABI
/// transport's chunk acknowledgement): the round trip. (A transport that completes a send
/// as soon as the socket took it — gloo's pairs — spends one way per round; the model then
/// puts the other half in ideal communication and `unexplained` shows it as negative.)
///
/// The round trip is the TCP connections' (see [`one_way_latency`]) or, without them, the
/// sampled NCCL/IB requests' ([`request_round_trip`]).
pub fn round_latency(wins: &[&NicWindow], req: &Requests<'_>, alpha: f64) -> (f64, bool) {
    match one_way_latency(wins).map(|l| 2.0 * l).or_else(|| request_round_trip(req)) {
        Some(l) if l > alpha => (l, true),
        _ => (alpha, false),
    }
}

/// The sampled transport requests of a transfer [t0, t1] on a path of `rate`.
pub struct Requests<'a> {
    pub net: &'a [NetSample],
    pub t0: f64,
    pub t1: f64,
    pub rate: f64,
}

/// The NCCL/IB request round trip: the shortest post → completion of the sampled send
/// requests overlapping the transfer, less their own serialisation at the path's rate (an RC
/// send completes when the peer's acknowledgement is back). At least four requests, as for
/// the in-flight evidence.
pub fn request_round_trip(r: &Requests<'_>) -> Option<f64> {
    let reqs = r.net.iter().filter(|q| q.send && q.completed > r.t0 && q.posted < r.t1);
    let (n, min) = reqs.fold((0usize, f64::INFINITY), |(n, m), q| (n + 1, m.min(q.completed - q.posted - q.bytes / r.rate.max(1.0))));
    (n >= 4 && min.is_finite() && min > 0.0).then_some(min)
}

/// In-flight evidence of a TCP transfer.
#[derive(Clone, Debug, PartialEq)]
pub struct TcpInFlight {
    /// Mean bytes in flight while the connections had data to send (N·m).
    pub in_flight_bytes: f64,
    /// Payload bytes acknowledged during the transfer.
    pub acked_bytes: f64,
    /// Bytes per segment (m).
    pub mss_bytes: f64,
    /// Smoothed RTT (T).
    pub rtt_seconds: f64,
    /// N·m/T.
    pub bound_bytes_per_second: f64,
    pub path_bytes_per_second: f64,
    /// `sndbuf` or `rwnd` when that limit held the connections more than half their busy
    /// time, else `cwnd` (congestion control or the path set the pace).
    pub limit: &'static str,
    /// Fraction of the busy time stalled by `limit` (for `cwnd`: by neither other limit).
    pub limited_share: f64,
    pub sndbuf_bytes: f64,
    pub cwnd_bytes: f64,
}

/// Share of busy time from which a send-buffer or receive-window stall is the binding limit
/// (a connection the congestion window paces shows none).
const LIMITED: f64 = 0.25;

impl TcpInFlight {
    /// From the NICs' TCP deltas over a transfer of `span` seconds on a path of `rate`.
    pub fn measure(wins: &[&NicWindow], span: f64, rate: f64) -> Option<TcpInFlight> {
        let (mut busy, mut rwnd, mut sndbuf, mut ibs, mut buf, mut cwnd, mut acked) = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
        for t in wins.iter().map(|w| w.tcp()) {
            acked += t.bytes_acked;
            busy += t.busy_seconds;
            rwnd += t.rwnd_limited_seconds;
            sndbuf += t.sndbuf_limited_seconds;
            ibs += t.in_flight_byte_seconds;
            buf += t.sndbuf_bytes;
            cwnd += t.cwnd_bytes;
        }
        let rtt = smoothed_rtt(wins)?;
        let mss = wins.iter().map(|w| w.tcp().mss_bytes).fold(0.0, f64::max);
        if span <= 0.0 || busy <= 0.0 || ibs <= 0.0 || rate <= 0.0 {
            return None;
        }
        // Little per connection while busy: ∫ in flight dt / busy seconds is the mean window
        // of a busy connection; with several busy at once (busy > span) their windows add.
        let n_m = ibs / busy * (busy / span).max(1.0);
        let (limit, share) = if sndbuf.max(rwnd) / busy > LIMITED {
            if sndbuf >= rwnd {
                ("sndbuf", sndbuf / busy)
            } else {
                ("rwnd", rwnd / busy)
            }
        } else {
            ("cwnd", ((busy - sndbuf - rwnd) / busy).clamp(0.0, 1.0))
        };
        Some(TcpInFlight {
            in_flight_bytes: n_m,
            acked_bytes: acked,
            mss_bytes: mss,
            rtt_seconds: rtt,
            bound_bytes_per_second: n_m / rtt,
            path_bytes_per_second: rate,
            limit,
            limited_share: share,
            sndbuf_bytes: buf,
            cwnd_bytes: cwnd,
        })
    }

    /// Whether a window the application or the peer set (send buffer, receive window) held
    /// the transfer below the path's rate: the in-flight cause. A congestion window is the
    /// transport probing the path, not a setting to raise.
    pub fn binding(&self) -> bool {
        self.limit != "cwnd" && self.bound_bytes_per_second < self.path_bytes_per_second
    }

    pub fn to_evidence(&self) -> BTreeMap<String, serde_json::Value> {
        let m = self.mss_bytes.max(1.0);
        [
            ("transport", serde_json::json!("tcp")),
            ("in_flight_requests", serde_json::json!(self.in_flight_bytes / m)),
            ("in_flight_bytes", serde_json::json!(self.in_flight_bytes)),
            ("request_bytes", serde_json::json!(self.mss_bytes)),
            ("slot_occupancy_seconds", serde_json::json!(self.rtt_seconds)),
            ("window_bound_bytes_per_second", serde_json::json!(self.bound_bytes_per_second)),
            ("path_bytes_per_second", serde_json::json!(self.path_bytes_per_second)),
            ("limit", serde_json::json!(self.limit)),
            ("limited_share", serde_json::json!(self.limited_share)),
            ("requests_needed", serde_json::json!((self.path_bytes_per_second * self.rtt_seconds / m).ceil())),
            ("sndbuf_bytes", serde_json::json!(self.sndbuf_bytes)),
            ("cwnd_bytes", serde_json::json!(self.cwnd_bytes)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::{join::Arrival, windows::TcpSample};

    fn win(rtt: f64, busy: f64, sndbuf_limited: f64, ibs: f64) -> NicWindow {
        NicWindow {
            tx_bytes: 1e6,
            tcp: Some(Box::new(TcpSample {
                rtt_seconds: rtt,
                busy_seconds: busy,
                sndbuf_limited_seconds: sndbuf_limited,
                in_flight_byte_seconds: ibs,
                mss_bytes: 1448.0,
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    #[test]
    fn rounds_follow_the_ring_and_round_latency_is_the_measured_rtt_never_below_alpha() {
        let arr = |rank| Arrival { rank, host: "a".into(), pid: rank, enter: 0.0, exit: 1.0, aborted: false, clock: Default::default() };
        let mut c =
            Collective { comm: "c".into(), seq: 0, op: "all_reduce".into(), library: "nccl".into(), bytes: Some(1), nranks: Some(4), arrivals: vec![arr(0)] };
        assert_eq!(rounds(&c), 6.0);
        c.op = "all_gather".into();
        assert_eq!(rounds(&c), 3.0);
        c.op = "broadcast".into();
        assert_eq!(rounds(&c), 1.0);
        let (a, b) = (win(0.020, 0.0, 0.0, 0.0), win(0.022, 0.0, 0.0, 0.0));
        let none = Requests { net: &[], t0: 0.0, t1: 1.0, rate: 1e9 };
        let (l, measured) = round_latency(&[&a, &b], &none, 1e-6);
        assert!((l - 0.021).abs() < 1e-12 && measured, "{l}");
        // The path's smallest RTT where the kernel gave one: the queue a transfer builds is not
        // latency.
        let mut q = win(0.030, 0.0, 0.0, 0.0);
        q.tcp.as_mut().expect("tcp").min_rtt_seconds = 0.020;
        assert!((round_latency(&[&q], &none, 1e-6).0 - 0.020).abs() < 1e-12);
        // An RDMA window measures nothing: α.
        let r = NicWindow::default();
        assert_eq!(round_latency(&[&r], &none, 1e-6), (1e-6, false));
        // No TCP but sampled NCCL/IB sends: the shortest completion less its serialisation
        // (16 KiB at 1 GB/s = 16.384 µs): 2 ms; three requests are too few.
        let sends: Vec<NetSample> = (0..5)
            .map(|i| NetSample { bytes: 16384.0, posted: 0.1 * i as f64, completed: 0.1 * i as f64 + 0.002_016_384 + 0.001 * i as f64, send: true })
            .collect();
        let ib = Requests { net: &sends, t0: 0.0, t1: 1.0, rate: 1e9 };
        let (l, measured) = round_latency(&[&r], &ib, 1e-6);
        assert!((l - 0.002).abs() < 1e-9 && measured, "{l}");
        assert_eq!(round_latency(&[&r], &Requests { net: &sends[..3], ..ib }, 1e-6), (1e-6, false));
        // A loopback-fast RTT below α: α.
        assert_eq!(round_latency(&[&win(1e-7, 0.0, 0.0, 0.0)], &none, 1e-6), (1e-6, false));
    }

    #[test]
    fn a_send_buffer_stall_is_the_binding_limit_a_congestion_window_is_not() {
        // 0.6 s transfer, busy 0.5 s with 36 kB in flight over a 21 ms RTT: 1.71 MB/s against
        // 25 MB/s; stalled by the send buffer 0.4 of the 0.5 busy seconds.
        let w = win(0.021, 0.5, 0.4, 36_000.0 * 0.5);
        let t = TcpInFlight::measure(&[&w], 0.6, 25e6).expect("measured");
        assert!((t.bound_bytes_per_second - 36_000.0 / 0.021).abs() < 1e-6, "{t:?}");
        assert_eq!(t.limit, "sndbuf");
        assert!(t.binding());
        let ev = t.to_evidence();
        assert_eq!(ev["requests_needed"], serde_json::json!((25e6 * 0.021 / 1448.0f64).ceil()));
        // Two connections busy at once (1 connection-second in 0.5 s): their windows add.
        let w2 = win(0.021, 1.0, 0.8, 36_000.0);
        let t = TcpInFlight::measure(&[&w2], 0.5, 25e6).expect("measured");
        assert!((t.in_flight_bytes - 72_000.0).abs() < 1e-6, "{t:?}");
        // The same bytes in flight with no stall: the congestion window set the pace.
        let w = win(0.021, 0.5, 0.05, 36_000.0 * 0.5);
        let t = TcpInFlight::measure(&[&w], 0.5, 25e6).expect("measured");
        assert_eq!((t.limit, t.binding()), ("cwnd", false));
        // Nothing in flight or no RTT: nothing measured.
        assert!(TcpInFlight::measure(&[&win(0.0, 0.5, 0.4, 100.0)], 0.5, 25e6).is_none());
        assert!(TcpInFlight::measure(&[&win(0.02, 0.5, 0.4, 0.0)], 0.5, 25e6).is_none());
    }

    /// A 2-rank all-reduce seen by one host: rank 0 here, rank 1 elsewhere, one NIC at 25 MB/s
    /// carrying 1 MB; the transfer from 0 to `t`.
    fn attribute_tcp(t: f64, tcp: TcpSample) -> crate::attribution::Attribution {
        use std::collections::BTreeMap;

        use crate::{
            attribution::{attribute, Params, StepData},
            timeline::{windows::NicInfo, Step, StepSource},
        };
        let arr = |rank, host: &str| Arrival { rank, host: host.into(), pid: rank, enter: 0.0, exit: t, aborted: false, clock: Default::default() };
        let c = Collective {
            comm: "c".into(),
            seq: 0,
            op: "all_reduce".into(),
            library: "nccl".into(),
            bytes: Some(1_000_000),
            nranks: Some(2),
            arrivals: vec![arr(0, "a")],
        };
        let w = NicWindow {
            nic: NicInfo { name: "eth0".into(), host: Some("a".into()), rail: None, rate_bytes_per_second: Some(25e6) },
            tx_bytes: 1e6,
            tcp: Some(Box::new(tcp)),
            ..Default::default()
        };
        let s = Step { id: 1, begin: 0.0, end: t, source: StepSource::Markers, ranks: BTreeMap::new() };
        let cs = [&c];
        attribute(&StepData { step: &s, collectives: &cs, windows: &[vec![w]], net: &[], same_host: &[], dropped_events: false }, &Params::default())
    }

    #[test]
    fn attribution_charges_the_measured_round_trip_per_round_and_a_send_buffer_limit_as_in_flight() {
        use crate::attribution::CauseKind;
        // Healthy: 1 MB at 25 MB/s = 40 ms, two rounds of a 20 ms round trip = 40 ms; the
        // transfer took 82 ms. Paced by the congestion window: no in-flight cause.
        let healthy = TcpSample {
            rtt_seconds: 0.025,
            min_rtt_seconds: 0.020,
            busy_seconds: 0.06,
            in_flight_byte_seconds: 0.06 * 500_000.0,
            bytes_acked: 1e6,
            mss_bytes: 1448.0,
            ..Default::default()
        };
        let a = attribute_tcp(0.082, healthy.clone());
        assert!((a.cause(CauseKind::IdealComm) - 0.080).abs() < 1e-9, "{:?}", a.causes);
        assert!((a.cause(CauseKind::Unexplained) - 0.002).abs() < 1e-9, "{:?}", a.causes);
        assert_eq!(a.cause(CauseKind::InFlightLimit), 0.0);
        let ideal = a.causes.iter().find(|c| c.kind == CauseKind::IdealComm).expect("ideal");
        assert_eq!(ideal.evidence["latency_measured"], serde_json::json!(true));
        // Clamped: 50 kB in flight over a 25 ms RTT while busy (2 MB/s), the send buffer held
        // it 60 % of the 0.5 busy seconds: 1 MB needs 0.5 s instead of 0.04 s.
        let clamped = TcpSample { busy_seconds: 0.5, sndbuf_limited_seconds: 0.3, in_flight_byte_seconds: 0.5 * 50_000.0, ..healthy };
        let a = attribute_tcp(0.56, clamped);
        assert!((a.cause(CauseKind::InFlightLimit) - 0.46).abs() < 1e-9, "{:?}", a.causes);
        let inf = a.causes.iter().find(|c| c.kind == CauseKind::InFlightLimit).expect("in flight");
        assert_eq!(inf.evidence["limit"], serde_json::json!("sndbuf"));
        assert!(inf.fix.contains("send buffer") && inf.fix.contains("SO_SNDBUF"), "{}", inf.fix);
        // Without TCP data: one α per round, not measured.
        let a = attribute_tcp(0.082, TcpSample::default());
        let ideal = a.causes.iter().find(|c| c.kind == CauseKind::IdealComm).expect("ideal");
        assert_eq!(ideal.evidence["latency_measured"], serde_json::json!(false));
        assert!((a.cause(CauseKind::IdealComm) - (0.04 + 2.0 * crate::attribution::Params::default().alpha)).abs() < 1e-9, "{:?}", a.causes);
    }
}
