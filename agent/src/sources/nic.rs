//! Each counter source's snapshot as the common per-NIC sample the timeline keeps
//! (`timeline::NicSample`). Sources fill only the fields they know; the engine adds up the
//! fields of every source per NIC name (RoCE traffic bypasses the netdev counters, so RDMA
//! bytes and netdev bytes of one port are disjoint and add).

use crate::timeline::{windows::NicInfo, NicSample};

/// Fields of one NIC from one source (time is stamped by the caller).
pub type NicPart = (NicInfo, NicSample);

fn info(name: String, rail: Option<u32>, rate: Option<f64>) -> NicInfo {
    NicInfo { name, host: None, rail, rate_bytes_per_second: rate }
}

pub fn from_rdma(ports: Vec<super::rdma::PortCounters>) -> Vec<NicPart> {
    ports
        .into_iter()
        .filter(|p| p.present)
        .map(|p| {
            let name = p.netdev.clone().unwrap_or_else(|| format!("{}/{}", p.device, p.port));
            (
                info(name, Some(p.rail), p.rate_bytes_per_second),
                NicSample {
                    tx_bytes: p.transmit_bytes as f64,
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

pub fn from_netdev(devs: Vec<super::netdev::NetdevSnapshot>, rate_of: impl Fn(&str) -> Option<f64>) -> Vec<NicPart> {
    devs.into_iter()
        .filter(|d| d.netdev != "lo")
        .map(|d| {
            let rate = rate_of(&d.netdev);
            (
                info(d.netdev.clone(), None, rate),
                NicSample {
                    tx_bytes: d.transmit_bytes as f64,
                    rx_bytes: d.receive_bytes as f64,
                    drops: (d.transmit_drops + d.receive_drops) as f64,
                    ..Default::default()
                },
            )
        })
        .collect()
}

/// Root qdiscs (and their children) per netdev: drops add up, backlog is the largest.
pub fn from_qdisc(qs: Vec<super::qdisc::QdiscSnapshot>) -> Vec<NicPart> {
    let mut per: std::collections::BTreeMap<String, NicSample> = std::collections::BTreeMap::new();
    for q in qs.into_iter().filter(|q| q.present) {
        let e = per.entry(q.netdev.clone()).or_default();
        e.drops += q.drops as f64;
        e.backlog_bytes = e.backlog_bytes.max(q.backlog_bytes as f64);
    }
    per.into_iter().map(|(n, s)| (info(n, None, None), s)).collect()
}

/// PFC/global pause frames and time *received* (the link partner paused us), ECN marks.
pub fn from_ethtool(snaps: Vec<super::ethtool::EthtoolSnapshot>) -> Vec<NicPart> {
    use super::ethtool::names::{Direction, Field};
    snaps
        .into_iter()
        .map(|s| {
            let mut n = NicSample::default();
            for (f, v) in &s.fields {
                match f {
                    Field::PauseFrames { direction: Direction::Rx, .. } => n.pause_frames += *v as f64,
                    Field::PauseDuration { direction: Direction::Rx, .. } => n.pause_seconds += *v as f64 * 1e-6,
                    Field::EcnMarked { .. } => n.ecn_marked += *v as f64,
                    Field::Discards { .. } => n.drops += *v as f64,
                    _ => {}
                }
            }
            (info(s.netdev, None, None), n)
        })
        .collect()
}

/// Adds `b`'s fields into `a` (same NIC, different sources).
pub fn merge(a: &mut NicSample, b: &NicSample) {
    a.tx_bytes += b.tx_bytes;
    a.rx_bytes += b.rx_bytes;
    a.pause_seconds += b.pause_seconds;
    a.pause_frames += b.pause_frames;
    a.ecn_marked += b.ecn_marked;
    a.cnp_sent += b.cnp_sent;
    a.cnp_handled += b.cnp_handled;
    a.xmit_wait_ticks += b.xmit_wait_ticks;
    a.retransmits += b.retransmits;
    a.drops += b.drops;
    a.backlog_bytes = a.backlog_bytes.max(b.backlog_bytes);
    // One source (tcp) fills these; added like the counters, gauges kept where set.
    let (t, u) = (&mut a.tcp, &b.tcp);
    t.bytes_acked += u.bytes_acked;
    t.busy_seconds += u.busy_seconds;
    t.rwnd_limited_seconds += u.rwnd_limited_seconds;
    t.sndbuf_limited_seconds += u.sndbuf_limited_seconds;
    t.in_flight_byte_seconds += u.in_flight_byte_seconds;
    t.rtt_seconds = t.rtt_seconds.max(u.rtt_seconds);
    t.min_rtt_seconds = t.min_rtt_seconds.max(u.min_rtt_seconds);
    t.mss_bytes = t.mss_bytes.max(u.mss_bytes);
    t.sndbuf_bytes += u.sndbuf_bytes;
    t.cwnd_bytes += u.cwnd_bytes;
}
