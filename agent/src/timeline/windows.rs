//! Per-NIC counter samples kept over time, and their deltas over a window. Counters are
//! sampled every 10 ms – 1 s while collectives last µs – ms, so a window's delta is
//! interpolated linearly between the samples that bracket it.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::activity::Activity;

/// Cumulative counters of one NIC at one time (gauges marked).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct NicSample {
    /// Wall-clock seconds.
    pub time: f64,
    pub tx_bytes: f64,
    pub rx_bytes: f64,
    /// PFC/global pause time received (we were paused), seconds.
    pub pause_seconds: f64,
    pub pause_frames: f64,
    pub ecn_marked: f64,
    pub cnp_sent: f64,
    pub cnp_handled: f64,
    /// IB `port_xmit_wait` ticks.
    pub xmit_wait_ticks: f64,
    /// Transport retransmission events (RDMA) or TCP retransmitted segments.
    pub retransmits: f64,
    pub drops: f64,
    /// Gauge: qdisc backlog bytes at the sample.
    pub backlog_bytes: f64,
    /// The NIC's TCP connections (sources/tcp).
    #[serde(default)]
    pub tcp: TcpSample,
    /// Wire bytes the traced processes' own TCP connections sent through this NIC (payload
    /// plus each segment's headers), cumulative, per pid, sorted by pid (sources/tcp). `None`
    /// when not measured (no `sock_diag` dump covered the NIC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own_tx: Option<Vec<(u32, f64)>>,
    /// Transmitted bytes no socket shows (RDMA), cumulative: whose they are is not known.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub opaque_tx_bytes: f64,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

/// The TCP connections whose local address is on a NIC (`sources/tcp`, from `tcp_info`):
/// cumulative seconds and bytes, and gauges (marked). In a [`NicWindow`] the cumulative
/// fields are the window's deltas and the gauges the mean of the samples that cover it (0
/// when none knew).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct TcpSample {
    pub bytes_acked: f64,
    /// Connection-seconds with data to send (including the two limited states).
    pub busy_seconds: f64,
    /// Part of the busy time stalled by the peers' receive windows.
    pub rwnd_limited_seconds: f64,
    /// Part of the busy time stalled by the local send buffers.
    pub sndbuf_limited_seconds: f64,
    /// ∫ bytes in flight dt.
    pub in_flight_byte_seconds: f64,
    /// Gauge: mean smoothed RTT of the connections carrying data.
    pub rtt_seconds: f64,
    /// Gauge: their mean smallest RTT (the path without queueing).
    pub min_rtt_seconds: f64,
    /// Gauge: mean send MSS.
    pub mss_bytes: f64,
    /// Gauge: sum of the send buffers.
    pub sndbuf_bytes: f64,
    /// Gauge: sum of the congestion windows in bytes.
    pub cwnd_bytes: f64,
}

/// A NIC's identity and nominal rate.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct NicInfo {
    pub name: String,
    /// Host the NIC belongs to (set by the agent; peers' NICs keep theirs).
    #[serde(default)]
    pub host: Option<String>,
    pub rail: Option<u32>,
    pub rate_bytes_per_second: Option<f64>,
}

/// The name under which the traced processes' bytes to peers on their own host are kept
/// (`sources/tcp`: loopback connections, and connections to this host's own addresses, which
/// the kernel routes over `lo`). Not a NIC: attribution never makes it a rail
/// (docs/models.md §1.14).
pub const SAME_HOST_LINK: &str = "lo";

impl NicInfo {
    /// Whether this is the same-host link ([`SAME_HOST_LINK`], or `host/lo` where cluster
    /// `diagnose` names the NICs of several hosts), not a NIC.
    pub fn is_same_host_link(&self) -> bool {
        self.name.rsplit('/').next() == Some(SAME_HOST_LINK)
    }
}

/// Deltas of one NIC over a window.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct NicWindow {
    pub nic: NicInfo,
    pub tx_bytes: f64,
    pub rx_bytes: f64,
    pub pause_seconds: f64,
    pub pause_frames: f64,
    pub ecn_marked: f64,
    pub cnp_sent: f64,
    pub cnp_handled: f64,
    pub xmit_wait_ticks: f64,
    pub retransmits: f64,
    pub drops: f64,
    /// Largest backlog seen by a sample inside the window.
    pub max_backlog_bytes: f64,
    /// TCP deltas and gauges, when the NIC's connections measured any in the window (`None`
    /// for RDMA and idle NICs: attribution reads every window of every collective, and an
    /// inline 80 bytes made each window half again as large). Not kept by the history store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<Box<TcpSample>>,
    /// Per traced pid, the wire bytes its TCP connections sent through the NIC in the window
    /// (sorted by pid); `None` when not measured at both ends of the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own_tx: Option<Vec<(u32, f64)>>,
    /// Transmitted bytes in the window that no socket shows (RDMA).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub opaque_tx_bytes: f64,
}

/// The TCP figures of a window without any.
static NO_TCP: TcpSample = TcpSample {
    bytes_acked: 0.0,
    busy_seconds: 0.0,
    rwnd_limited_seconds: 0.0,
    sndbuf_limited_seconds: 0.0,
    in_flight_byte_seconds: 0.0,
    rtt_seconds: 0.0,
    min_rtt_seconds: 0.0,
    mss_bytes: 0.0,
    sndbuf_bytes: 0.0,
    cwnd_bytes: 0.0,
};

impl NicWindow {
    /// The window's TCP figures (zeros when its NIC measured none).
    pub fn tcp(&self) -> &TcpSample {
        self.tcp.as_deref().unwrap_or(&NO_TCP)
    }

    /// The bytes the processes `pids` sent through this NIC in the window, when that was
    /// measured: the traced processes' TCP bytes were read at both ends of the window, every
    /// one of `pids` was known from its start, and no byte went by a path sockets do not show
    /// (RDMA); else `None`.
    pub fn own_tx_of(&self, pids: &[u32]) -> Option<f64> {
        let own = self.own_tx.as_ref().filter(|_| self.opaque_tx_bytes <= 0.0)?;
        pids.iter().map(|p| own.iter().find(|e| e.0 == *p).map(|e| e.1)).sum()
    }
}

/// The value at `t` of a series of (time, cumulative value) points sorted by time: between
/// the points around it, in proportion to the job's active time there (`act`; to time when
/// none was active), clamped to the first and last.
fn interpolate(points: &[(f64, f64)], t: f64, act: &Activity) -> f64 {
    let k = points.partition_point(|p| p.0 <= t);
    match (k.checked_sub(1).and_then(|k| points.get(k)), points.get(k)) {
        (Some(a), Some(b)) if b.0 > a.0 => a.1 + (b.1 - a.1) * act.share(a.0, b.0, t).unwrap_or((t - a.0) / (b.0 - a.0)),
        (Some(a), _) => a.1,
        (None, Some(b)) => b.1,
        (None, None) => 0.0,
    }
}

/// Makes room in a full series: its older half kept at half the resolution, so that
/// samples read faster (the fast lane's, while a job communicates) shorten how far back the
/// log reaches no more than they must, and the recent half keeps every sample.
fn thin(q: &mut VecDeque<NicSample>) {
    let half = q.len() / 2;
    let mut k = 0usize;
    q.retain(|_| {
        let keep = k >= half || k.is_multiple_of(2);
        k += 1;
        keep
    });
}

/// Bounded time series of samples per NIC.
#[derive(Debug, Default)]
pub struct CounterLog {
    cap: usize,
    nics: BTreeMap<String, (NicInfo, VecDeque<NicSample>)>,
}

fn lerp(a: &NicSample, b: &NicSample, t: f64, f: impl Fn(&NicSample) -> f64) -> f64 {
    if b.time <= a.time {
        return f(b);
    }
    let x = ((t - a.time) / (b.time - a.time)).clamp(0.0, 1.0);
    f(a) + (f(b) - f(a)) * x
}

impl CounterLog {
    pub fn new(cap: usize) -> CounterLog {
        CounterLog { cap: cap.max(4), nics: BTreeMap::new() }
    }

    pub fn push(&mut self, info: NicInfo, s: NicSample) {
        let e = self.nics.entry(info.name.clone()).or_insert_with(|| (info.clone(), VecDeque::new()));
        e.0 = info;
        if e.1.back().is_some_and(|l| l.time >= s.time) {
            return; // out of order or duplicate
        }
        if e.1.len() >= self.cap {
            thin(&mut e.1);
        }
        e.1.push_back(s);
    }

    pub fn nic_names(&self) -> Vec<String> {
        self.nics.keys().cloned().collect()
    }

    /// Value of a cumulative field at time t (interpolated; clamped to the first/last sample).
    fn at(samples: &VecDeque<NicSample>, t: f64, f: &dyn Fn(&NicSample) -> f64) -> Option<f64> {
        let first = samples.front()?;
        if t <= first.time {
            return Some(f(first));
        }
        let i = samples.partition_point(|s| s.time <= t);
        if i >= samples.len() {
            return samples.back().map(f);
        }
        Some(lerp(&samples[i - 1], &samples[i], t, f))
    }

    /// Mean of a gauge's non-zero values in the samples covering [t0, t1] (those inside it
    /// and the first one after it, whose value stands for the interval before it); 0 when
    /// none.
    fn gauge(samples: &VecDeque<NicSample>, t0: f64, t1: f64, f: &dyn Fn(&NicSample) -> f64) -> f64 {
        let i = samples.partition_point(|s| s.time < t0);
        let j = samples.partition_point(|s| s.time <= t1);
        let (mut sum, mut n) = (0.0, 0usize);
        for s in samples.range(i..(j + 1).min(samples.len())) {
            let v = f(s);
            if v > 0.0 {
                sum += v;
                n += 1;
            }
        }
        if n > 0 {
            sum / n as f64
        } else {
            0.0
        }
    }

    /// Whether a NIC that `pick` selects has samples.
    pub fn has(&self, pick: impl Fn(&NicInfo) -> bool) -> bool {
        self.nics.values().any(|(i, s)| pick(i) && !s.is_empty())
    }

    /// The times of the samples strictly inside (t0, t1) of the NICs `pick` selects, in
    /// order, without repeats.
    pub fn sample_times(&self, pick: impl Fn(&NicInfo) -> bool, t0: f64, t1: f64) -> Vec<f64> {
        let mut v: Vec<f64> = self.nics.values().filter(|(i, _)| pick(i)).flat_map(|(_, s)| s.iter().map(|x| x.time).filter(|t| *t > t0 && *t < t1)).collect();
        v.sort_by(f64::total_cmp);
        v.dedup();
        v
    }

    /// Deltas of every NIC over [t0, t1]. NICs without samples covering the window give zeros.
    pub fn window(&self, t0: f64, t1: f64) -> Vec<NicWindow> {
        self.window_in(t0, t1, &Activity::default())
    }

    /// [`Self::window`], with the job's own bytes on a NIC interpolated over its active time
    /// `act` (`timeline::activity`) rather than over time: they went out while its collectives
    /// were in flight. A NIC's other bytes (its counter less the job's own) stay spread over
    /// time, and so do the same-host link's: a collective's local phases are bursts at its
    /// edges, not spread over its transfer, and an interval holding one step's last burst and
    /// the next step's first would give both to whichever step had more active time in it
    /// (measured: 7.4–7.6 MB of a hierarchical step's local bytes against 6.3 MB per step on
    /// `lo`).
    pub fn window_in(&self, t0: f64, t1: f64, act: &Activity) -> Vec<NicWindow> {
        let by_time = Activity::default();
        self.nics
            .values()
            .map(|(info, s)| {
                let act = if info.is_same_host_link() { &by_time } else { act };
                let d = |f: &dyn Fn(&NicSample) -> f64| match (Self::at(s, t0, f), Self::at(s, t1, f)) {
                    (Some(a), Some(b)) => (b - a).max(0.0),
                    _ => 0.0,
                };
                // Samples inside the window, plus the first one after it (it covers the end).
                let max_backlog = s.iter().filter(|x| x.time >= t0).take_while(|x| x.time <= t1 + 1.0).map(|x| x.backlog_bytes).fold(0.0, f64::max);
                let tcp = TcpSample {
                    bytes_acked: d(&|x| x.tcp.bytes_acked),
                    busy_seconds: d(&|x| x.tcp.busy_seconds),
                    rwnd_limited_seconds: d(&|x| x.tcp.rwnd_limited_seconds),
                    sndbuf_limited_seconds: d(&|x| x.tcp.sndbuf_limited_seconds),
                    in_flight_byte_seconds: d(&|x| x.tcp.in_flight_byte_seconds),
                    rtt_seconds: Self::gauge(s, t0, t1, &|x| x.tcp.rtt_seconds),
                    min_rtt_seconds: Self::gauge(s, t0, t1, &|x| x.tcp.min_rtt_seconds),
                    mss_bytes: Self::gauge(s, t0, t1, &|x| x.tcp.mss_bytes),
                    sndbuf_bytes: Self::gauge(s, t0, t1, &|x| x.tcp.sndbuf_bytes),
                    cwnd_bytes: Self::gauge(s, t0, t1, &|x| x.tcp.cwnd_bytes),
                };
                let own_tx = Self::own_window(s, t0, t1, act);
                let opaque = d(&|x| x.opaque_tx_bytes);
                // The counter's bytes: its linear delta, with the job's own part moved to when
                // the job was active.
                let sum = |o: &Option<Vec<(u32, f64)>>| o.iter().flatten().map(|e| e.1).sum::<f64>();
                let moved = if opaque > 0.0 || own_tx.is_none() || act.is_empty() { 0.0 } else { sum(&own_tx) - sum(&Self::own_window(s, t0, t1, &by_time)) };
                NicWindow {
                    own_tx,
                    opaque_tx_bytes: opaque,
                    nic: info.clone(),
                    tx_bytes: (d(&|x| x.tx_bytes) + moved).max(0.0),
                    rx_bytes: d(&|x| x.rx_bytes),
                    pause_seconds: d(&|x| x.pause_seconds),
                    pause_frames: d(&|x| x.pause_frames),
                    ecn_marked: d(&|x| x.ecn_marked),
                    cnp_sent: d(&|x| x.cnp_sent),
                    cnp_handled: d(&|x| x.cnp_handled),
                    xmit_wait_ticks: d(&|x| x.xmit_wait_ticks),
                    retransmits: d(&|x| x.retransmits),
                    drops: d(&|x| x.drops),
                    max_backlog_bytes: max_backlog,
                    tcp: (tcp != NO_TCP).then(|| Box::new(tcp)),
                }
            })
            .collect()
    }

    /// Per pid, the delta of its own transmitted bytes over [t0, t1], interpolated like the
    /// counters, for the pids the sample at or before t0 lists (whose sockets the agent had
    /// read by then; a pid listed only later sent bytes before it was known, which the window
    /// cannot tell). A pid absent from a later sample is no longer traced and keeps its last
    /// total. `None` unless the samples on both sides of the window measured them.
    fn own_window(samples: &VecDeque<NicSample>, t0: f64, t1: f64, act: &Activity) -> Option<Vec<(u32, f64)>> {
        let i = samples.partition_point(|s| s.time <= t0).checked_sub(1)?;
        let j = samples.partition_point(|s| s.time < t1).min(samples.len() - 1);
        if samples[i].own_tx.is_none() || samples[j].own_tx.is_none() {
            return None;
        }
        let range: Vec<&NicSample> = samples.range(i..=j).collect();
        let pids: Vec<u32> = samples[i].own_tx.iter().flatten().map(|(p, _)| *p).collect();
        let mut out = Vec::new();
        for pid in pids {
            let mut last = 0.0;
            let points: Vec<(f64, f64)> = range
                .iter()
                .map(|s| {
                    if let Some(v) = s.own_tx.as_ref().and_then(|v| v.binary_search_by_key(&pid, |e| e.0).ok().map(|k| v[k].1)) {
                        last = v;
                    }
                    (s.time, last)
                })
                .collect();
            out.push((pid, (interpolate(&points, t1, act) - interpolate(&points, t0, act)).max(0.0)));
        }
        Some(out)
    }

    /// How well the samples resolve a transfer over [t0, t1], on the NIC (of `nics`; every
    /// NIC when empty) where it is worst: the span of the samples that bracket it — from the
    /// last at or before t0 to the first at or after t1 — and the part of the transfer not
    /// between two samples inside it (its edges, interpolated over the slices that straddle
    /// them; all of it when fewer than two samples fall inside). `None` when no NIC has
    /// samples on both sides.
    pub fn bracket(&self, t0: f64, t1: f64, nics: &[&str]) -> Option<(f64, f64)> {
        self.nics
            .iter()
            .filter(|(n, _)| nics.is_empty() || nics.contains(&n.as_str()))
            .filter_map(|(_, (_, s))| {
                let before = s.iter().rev().find(|x| x.time <= t0)?;
                let after = s.iter().find(|x| x.time >= t1)?;
                let inside: Vec<f64> = s.iter().map(|x| x.time).filter(|t| *t > t0 && *t < t1).collect();
                let edges = match (inside.first(), inside.last()) {
                    (Some(a), Some(b)) if b > a => (a - t0) + (t1 - b),
                    _ => t1 - t0,
                };
                Some((after.time - before.time, edges))
            })
            .reduce(|a, b| (a.0.max(b.0), a.1.max(b.1)))
    }

    /// One NIC's samples from `t0` to `t1`, the first `limit` of them; `None` for a NIC never sampled.
    pub fn nic_samples(&self, name: &str, t0: f64, t1: f64, limit: usize) -> Option<(NicInfo, Vec<NicSample>)> {
        let (i, s) = self.nics.get(name)?;
        Some((i.clone(), s.iter().filter(|x| x.time >= t0 && x.time <= t1).take(limit).cloned().collect()))
    }

    /// Every NIC's samples in [t0, t1] (for the store and peers).
    pub fn samples(&self, t0: f64, t1: f64) -> Vec<(NicInfo, Vec<NicSample>)> {
        self.nics.values().map(|(i, s)| (i.clone(), s.iter().filter(|x| x.time >= t0 && x.time <= t1).cloned().collect())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(time: f64, tx: f64) -> NicSample {
        NicSample { time, tx_bytes: tx, ..Default::default() }
    }

    #[test]
    fn bracket_is_the_span_of_the_samples_around_a_window() {
        let mut log = CounterLog::new(128);
        for k in 0..4 {
            log.push(NicInfo { name: "eth0".into(), ..Default::default() }, s(k as f64, 0.0));
        }
        assert_eq!(log.bracket(1.25, 1.75, &[]), Some((1.0, 0.5)), "between the samples at 1 and 2");
        assert_eq!(log.bracket(1.0, 2.0, &[]), Some((1.0, 1.0)), "samples on its edges");
        assert_eq!(log.bracket(0.5, 2.5, &[]), Some((3.0, 1.0)), "samples at 1 and 2 inside: only its edges are interpolated");
        assert_eq!(log.bracket(2.5, 3.5, &[]), None, "no sample after it yet");
        // A NIC read every 10 ms from 0.9 s on (the fast lane) beside one read each second:
        // a 250 ms transfer after a quiet second is resolved on the first, not on the second.
        for k in 0..70 {
            log.push(NicInfo { name: "rail0".into(), ..Default::default() }, s(0.9 + f64::from(k) * 0.01, 0.0));
        }
        let (span, edges) = log.bracket(1.25, 1.5, &["rail0"]).expect("rail0 brackets it");
        assert!((0.25..0.27).contains(&span) && edges < 0.021, "{span} {edges}");
        assert_eq!(log.bracket(1.25, 1.5, &["eth0"]), Some((1.0, 0.25)), "eth0 alone: read once a second");
    }

    #[test]
    fn a_full_series_keeps_its_recent_half_and_reaches_back_at_half_the_resolution() {
        let mut log = CounterLog::new(8);
        for k in 0..8 {
            log.push(NicInfo { name: "rail0".into(), ..Default::default() }, s(f64::from(k), f64::from(k)));
        }
        log.push(NicInfo { name: "rail0".into(), ..Default::default() }, s(8.0, 8.0));
        let times: Vec<f64> = log.nics["rail0"].1.iter().map(|x| x.time).collect();
        assert_eq!(times, vec![0.0, 2.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        // Cumulative values between the kept samples are still interpolated right.
        let w = log.window(1.0, 3.0);
        assert_eq!(w[0].tx_bytes, 2.0);
    }

    #[test]
    fn window_delta_interpolates_between_samples() {
        let mut log = CounterLog::new(100);
        let info = NicInfo { name: "eth0".into(), host: None, rail: Some(0), rate_bytes_per_second: Some(1e9) };
        for (t, v) in [(0.0, 0.0), (1.0, 1000.0), (2.0, 3000.0)] {
            log.push(info.clone(), s(t, v));
        }
        let w = log.window(0.5, 1.5);
        assert_eq!(w.len(), 1);
        // 500 at t=0.5 (halfway to 1000), 2000 at t=1.5 (halfway from 1000 to 3000).
        assert!((w[0].tx_bytes - 1500.0).abs() < 1e-9, "{}", w[0].tx_bytes);
        let w = log.window(-5.0, 10.0);
        assert!((w[0].tx_bytes - 3000.0).abs() < 1e-9);
        // Out-of-order samples are ignored; the log is bounded.
        log.push(info.clone(), s(1.5, 99.0));
        let mut small = CounterLog::new(4);
        for i in 0..10 {
            small.push(info.clone(), s(i as f64, i as f64));
        }
        assert_eq!(small.samples(0.0, 100.0)[0].1.len(), 4);
    }

    #[test]
    fn own_bytes_are_interpolated_per_pid_and_unmeasured_unless_both_ends_were() {
        let mut log = CounterLog::new(100);
        let info = NicInfo { name: "eth0".into(), ..Default::default() };
        let own = |v: &[(u32, f64)]| Some(v.to_vec());
        log.push(info.clone(), NicSample { time: 0.0, own_tx: None, ..Default::default() });
        log.push(info.clone(), NicSample { time: 1.0, own_tx: own(&[(7, 1000.0), (9, 0.0)]), ..Default::default() });
        log.push(info.clone(), NicSample { time: 2.0, own_tx: own(&[(7, 3000.0), (9, 500.0), (11, 100.0)]), ..Default::default() });
        log.push(info.clone(), NicSample { time: 3.0, own_tx: own(&[(9, 700.0), (11, 900.0)]), ..Default::default() });
        // [1.5, 2.5]: pid 7 from 2000 to 3000 (then no longer traced: its total stays), pid 9
        // from 250 to 600.
        let w = &log.window(1.5, 2.5)[0];
        let o = w.own_tx.as_ref().expect("measured");
        assert_eq!(o.len(), 2, "{o:?}");
        assert!((o[0].1 - 1000.0).abs() < 1e-9 && o[0].0 == 7, "{o:?}");
        assert!((o[1].1 - 350.0).abs() < 1e-9 && o[1].0 == 9, "{o:?}");
        assert_eq!(w.own_tx_of(&[9]), Some(o[1].1));
        // Pid 11 was not known at the window's start: its bytes there are not measured.
        assert_eq!(w.own_tx_of(&[9, 11]), None);
        assert!(log.window(2.5, 2.9)[0].own_tx_of(&[9, 11]).is_some());
        // The sample before the window did not measure them.
        assert!(log.window(0.5, 1.5)[0].own_tx.is_none());
    }

    #[test]
    fn the_jobs_own_bytes_on_a_nic_go_where_it_was_active_other_bytes_and_the_same_host_links_by_time() {
        let mut log = CounterLog::new(100);
        for name in ["rail0", SAME_HOST_LINK] {
            let info = NicInfo { name: name.into(), ..Default::default() };
            log.push(info.clone(), NicSample { time: 0.0, tx_bytes: 0.0, own_tx: Some(vec![(7, 0.0)]), ..Default::default() });
            log.push(info, NicSample { time: 1.0, tx_bytes: 1500.0, own_tx: Some(vec![(7, 1000.0)]), ..Default::default() });
        }
        // One sample interval: compute to 0.2 s, the job's transfer to 0.6 s, compute again.
        // Its 1000 own bytes went out in [0.2, 0.6]; the other 500 are spread over the second.
        let act = Activity::from_spans(vec![(0.2, 0.6)]);
        let w = log.window_in(0.2, 0.4, &act);
        let (rail, lo) = (w.iter().find(|w| w.nic.name == "rail0").expect("rail0"), w.iter().find(|w| w.nic.name == SAME_HOST_LINK).expect("lo"));
        assert!((rail.own_tx_of(&[7]).expect("own") - 500.0).abs() < 1e-9, "{rail:?}");
        assert!((rail.tx_bytes - 600.0).abs() < 1e-9, "own 500 + other 100: {rail:?}");
        assert!((lo.own_tx_of(&[7]).expect("own") - 200.0).abs() < 1e-9, "by time: {lo:?}");
        assert!((lo.tx_bytes - 300.0).abs() < 1e-9, "{lo:?}");
        // Without activity (or none in the interval) the NIC's too are by time.
        assert!((log.window(0.2, 0.4)[0].tx_bytes - 300.0).abs() < 1e-9);
        let idle = Activity::from_spans(vec![(2.0, 3.0)]);
        assert!((log.window_in(0.2, 0.4, &idle)[0].tx_bytes - 300.0).abs() < 1e-9);
    }

    #[test]
    fn a_tcp_gauge_is_the_mean_of_the_samples_covering_the_window_zero_when_none_knew() {
        let mut log = CounterLog::new(100);
        let info = NicInfo { name: "eth0".into(), ..Default::default() };
        for (t, rtt, acked) in [(0.0, 0.005, 0.0), (1.0, 0.02, 1000.0), (2.0, 0.0, 3000.0), (3.0, 0.04, 3000.0), (4.0, 0.001, 3000.0)] {
            log.push(info.clone(), NicSample { time: t, tcp: TcpSample { rtt_seconds: rtt, bytes_acked: acked, ..Default::default() }, ..Default::default() });
        }
        // [0.5, 2.5]: the samples at 1 and 2 inside, 3 after it; the 0 at 2 (no connection
        // carried data) does not count.
        let w = &log.window(0.5, 2.5)[0];
        assert!((w.tcp().rtt_seconds - 0.03).abs() < 1e-12, "{:?}", w.tcp);
        assert!((w.tcp().bytes_acked - 2500.0).abs() < 1e-9);
        // After the last sample nothing covers the window: unknown, not the last value, and a
        // window of zeros carries none.
        assert!(log.window(5.0, 6.0)[0].tcp.is_none());
    }
}
