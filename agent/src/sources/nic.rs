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

/// Share of a NIC's per-priority bytes above which a priority counts as carrying its traffic.
pub const PFC_TRAFFIC_SHARE: f64 = 0.05;

/// The PFC priorities of one NIC whose pause counts as congestion: `configured` when set
/// (`[sources] pfc_priorities`), else every priority that carried at least
/// [`PFC_TRAFFIC_SHARE`] of the NIC's per-priority bytes (`{rx,tx}_prio{p}_bytes`, since the
/// agent started) — a pause on a priority that carries none of the NIC's traffic (another
/// traffic class, say storage on its own priority) delays nothing that runs here. A NIC whose
/// driver reports no per-priority bytes counts every priority (`None`).
pub fn pfc_counted(fields: &[(super::ethtool::names::Field, u64)], configured: Option<&[u8]>) -> Option<[bool; 8]> {
    use super::ethtool::names::Field;
    if let Some(list) = configured {
        let mut on = [false; 8];
        list.iter().filter(|p| **p < 8).for_each(|p| on[*p as usize] = true);
        return Some(on);
    }
    let mut bytes = [0u64; 8];
    for (f, v) in fields {
        if let Field::PriorityBytes { priority, .. } = f {
            if let Some(b) = bytes.get_mut(*priority as usize) {
                *b = b.saturating_add(*v);
            }
        }
    }
    let total: u64 = bytes.iter().sum();
    (total > 0).then(|| bytes.map(|b| b as f64 >= PFC_TRAFFIC_SHARE * total as f64))
}

/// Pause frames and time *received* (the link partner paused us) on the priorities that count
/// ([`pfc_counted`]) and link-level (global) pause, ECN marks, discards.
pub fn from_ethtool(snaps: Vec<super::ethtool::EthtoolSnapshot>, pfc_priorities: Option<&[u8]>) -> Vec<NicPart> {
    use super::ethtool::names::{Direction, Field, Priority};
    snaps
        .into_iter()
        .map(|s| {
            let counted = pfc_counted(&s.fields, pfc_priorities);
            let counts = |p: &Priority| match p {
                Priority::Global => true,
                Priority::Prio(x) => counted.is_none_or(|on| on.get(*x as usize).copied().unwrap_or(false)),
            };
            let mut n = NicSample::default();
            for (f, v) in &s.fields {
                match f {
                    Field::PauseFrames { direction: Direction::Rx, priority } if counts(priority) => n.pause_frames += *v as f64,
                    Field::PauseDuration { direction: Direction::Rx, priority } if counts(priority) => n.pause_seconds += *v as f64 * 1e-6,
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

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::sources::ethtool::{
        names::{Direction, Field, Priority},
        EthtoolSnapshot,
    };

    /// A RoCE NIC: the job on priority 3, storage on priority 5; 2 ms of pause received on
    /// priority 3, 400 ms on priority 5, 1 ms of link-level pause.
    fn nic(prio_bytes: bool) -> EthtoolSnapshot {
        let mut fields = vec![
            (Field::PauseDuration { direction: Direction::Rx, priority: Priority::Prio(3) }, 2_000),
            (Field::PauseDuration { direction: Direction::Rx, priority: Priority::Prio(5) }, 400_000),
            (Field::PauseDuration { direction: Direction::Rx, priority: Priority::Global }, 1_000),
            (Field::PauseDuration { direction: Direction::Tx, priority: Priority::Prio(3) }, 9_000_000),
            (Field::PauseFrames { direction: Direction::Rx, priority: Priority::Prio(3) }, 20),
            (Field::PauseFrames { direction: Direction::Rx, priority: Priority::Prio(5) }, 4000),
        ];
        if prio_bytes {
            fields.extend([
                (Field::PriorityBytes { direction: Direction::Tx, priority: 3 }, 90 << 30),
                (Field::PriorityBytes { direction: Direction::Rx, priority: 3 }, 90 << 30),
                (Field::PriorityBytes { direction: Direction::Tx, priority: 0 }, 1 << 20),
                (Field::PriorityBytes { direction: Direction::Tx, priority: 5 }, 5 << 30),
            ]);
        }
        EthtoolSnapshot { netdev: "eth2".into(), driver: "mlx5_core".into(), at: Instant::now(), fields }
    }

    fn pause(s: EthtoolSnapshot, configured: Option<&[u8]>) -> (f64, f64) {
        let (_, n) = from_ethtool(vec![s], configured).remove(0);
        (n.pause_seconds, n.pause_frames)
    }

    #[test]
    fn pause_counts_only_on_the_priorities_that_carry_the_traffic() {
        // Per-priority bytes say priority 3 carries the traffic (180 GiB; priority 5 has
        // 5 GiB, 2.7 %; priority 0 1 MiB): its pause and link-level pause count, never the
        // storage priority's, and never pause we sent (tx).
        let (secs, frames) = pause(nic(true), None);
        assert!((secs - 0.003).abs() < 1e-12 && frames == 20.0, "{secs} {frames}");
        // Configured: exactly those priorities (plus link-level pause).
        let (secs, frames) = pause(nic(true), Some(&[5]));
        assert!((secs - 0.401).abs() < 1e-12 && frames == 4000.0, "{secs} {frames}");
        // No per-priority bytes from the driver: every priority counts.
        let (secs, frames) = pause(nic(false), None);
        assert!((secs - 0.403).abs() < 1e-12 && frames == 4020.0, "{secs} {frames}");
        assert_eq!(pfc_counted(&nic(false).fields, None), None);
        let on = pfc_counted(&nic(true).fields, None).expect("per-priority bytes");
        assert_eq!(on.iter().enumerate().filter(|(_, b)| **b).map(|(p, _)| p).collect::<Vec<_>>(), [3]);
    }
}
