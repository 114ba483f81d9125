//! The ethtool source's per-NIC samples: pause received on the PFC priorities that carry the
//! NIC's traffic and link-level pause, ECN marks, discards (`[sources] pfc_priorities`).

/// Share of a NIC's per-priority bytes above which a priority counts as carrying its traffic.
pub const PFC_TRAFFIC_SHARE: f64 = 0.05;

/// The PFC priorities of one NIC whose pause counts as congestion: `configured` when set
/// (`[sources] pfc_priorities`), else every priority that carried at least
/// [`PFC_TRAFFIC_SHARE`] of the NIC's per-priority bytes (`{rx,tx}_prio{p}_bytes`, since the
/// agent started) — a pause on a priority that carries none of the NIC's traffic (another
/// traffic class, say storage on its own priority) delays nothing that runs here. A NIC whose
/// driver reports no per-priority bytes counts every priority (`None`).
pub fn pfc_counted(fields: &[(super::names::Field, u64)], configured: Option<&[u8]>) -> Option<[bool; 8]> {
    use super::names::Field;
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
pub fn nic_parts(snaps: Vec<super::EthtoolSnapshot>, pfc_priorities: Option<&[u8]>) -> Vec<crate::sources::nic::NicPart> {
    use super::names::{Direction, Field, Priority};
    snaps
        .into_iter()
        .map(|s| {
            let counted = pfc_counted(&s.fields, pfc_priorities);
            let counts = |p: &Priority| match p {
                Priority::Global => true,
                Priority::Prio(x) => counted.is_none_or(|on| on.get(*x as usize).copied().unwrap_or(false)),
            };
            let mut n = crate::timeline::NicSample::default();
            for (f, v) in &s.fields {
                match f {
                    Field::PauseFrames { direction: Direction::Rx, priority } if counts(priority) => n.pause_frames += *v as f64,
                    Field::PauseDuration { direction: Direction::Rx, priority } if counts(priority) => n.pause_seconds += *v as f64 * 1e-6,
                    Field::EcnMarked { .. } => n.ecn_marked += *v as f64,
                    Field::Discards { .. } => n.drops += *v as f64,
                    _ => {}
                }
            }
            (crate::sources::nic::info(s.netdev, None, None), n)
        })
        .collect()
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
        let (_, n) = nic_parts(vec![s], configured).remove(0);
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
