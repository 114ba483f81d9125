//! What each RDMA counter file means: its width/limit behaviour, its unit scale and which
//! metric it feeds. Widths come from docs/platform-facts.md §1 (sysfs.c `PORT_PMA_ATTR`,
//! mlx5 counters.c).

use crate::sources::counter::Semantics;

/// The directory a counter was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Group {
    /// `ports/<p>/counters/` (IBA PMA PortCounters[/Ext]).
    Pma,
    /// `ports/<p>/counters_ext/` (pre-4.5 kernels: legacy `*_64` names).
    PmaLegacyExt,
    /// `ports/<p>/hw_counters/` (driver-specific; mlx5 Q, cong and PPCNT counters).
    Hw,
}

/// Counters with a typed metric (the ones attribution uses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Typed {
    TransmitBytes,
    ReceiveBytes,
    TransmitPackets,
    ReceivePackets,
    TransmitWaitTicks,
    TransmitDiscards,
    ReceiveErrors,
    EcnMarkedPackets,
    CnpSent,
    CnpHandled,
    CnpIgnored,
    OutOfSequencePackets,
    OutOfBufferDrops,
    /// `stepwise_nic_retransmit_events_total{reason}`; the reason is the hw_counters name.
    Retransmit(&'static str),
}

impl Typed {
    /// Number of distinct typed counters (13 plus one per retransmission reason).
    pub const COUNT: usize = 13 + RETRANSMIT_REASONS.len();

    /// Dense index in `0..COUNT`, for per-port arrays.
    pub fn index(self) -> usize {
        match self {
            Typed::TransmitBytes => 0,
            Typed::ReceiveBytes => 1,
            Typed::TransmitPackets => 2,
            Typed::ReceivePackets => 3,
            Typed::TransmitWaitTicks => 4,
            Typed::TransmitDiscards => 5,
            Typed::ReceiveErrors => 6,
            Typed::EcnMarkedPackets => 7,
            Typed::CnpSent => 8,
            Typed::CnpHandled => 9,
            Typed::CnpIgnored => 10,
            Typed::OutOfSequencePackets => 11,
            Typed::OutOfBufferDrops => 12,
            // Every reason comes from RETRANSMIT_REASONS (see `spec`).
            Typed::Retransmit(r) => 13 + RETRANSMIT_REASONS.iter().position(|x| *x == r).unwrap_or(0),
        }
    }

    /// The inverse of [`Typed::index`].
    pub fn from_index(i: usize) -> Option<Typed> {
        Some(match i {
            0 => Typed::TransmitBytes,
            1 => Typed::ReceiveBytes,
            2 => Typed::TransmitPackets,
            3 => Typed::ReceivePackets,
            4 => Typed::TransmitWaitTicks,
            5 => Typed::TransmitDiscards,
            6 => Typed::ReceiveErrors,
            7 => Typed::EcnMarkedPackets,
            8 => Typed::CnpSent,
            9 => Typed::CnpHandled,
            10 => Typed::CnpIgnored,
            11 => Typed::OutOfSequencePackets,
            12 => Typed::OutOfBufferDrops,
            _ => Typed::Retransmit(RETRANSMIT_REASONS.get(i - 13)?),
        })
    }
}

/// Where a counter's accumulated value is exported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Typed(Typed),
    /// `stepwise_rdma_port_stat{,_packets,_bytes}_total{counter}`: any other `counters/` entry
    /// (the family by the unit its name says, `sources::by_unit`).
    PortGeneric,
    /// `stepwise_rdma_hw_stat{,_packets,_bytes}_total{counter}`: any other `hw_counters/` entry.
    HwGeneric,
}

impl Target {
    /// Bytes and packets cannot advance faster than the link carries bytes (a packet is at
    /// least one byte); other counters (wait ticks, events) get only the width check.
    pub fn is_line_rate_bound(self) -> bool {
        matches!(self, Target::Typed(Typed::TransmitBytes | Typed::ReceiveBytes | Typed::TransmitPackets | Typed::ReceivePackets))
    }
}

/// How to turn one counter file into a cumulative value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spec {
    pub semantics: Semantics,
    /// Multiplier from the file's unit to the metric's unit (4 for `port_*_data`: 4-byte words).
    pub scale: u64,
    pub target: Target,
}

/// Reasons of `stepwise_nic_retransmit_events_total`: each is a sender-side retransmission
/// cause on mlx5 (retransmission and roce_accl groups). Receiver-side symptoms
/// (`duplicate_request`) and "retries exceeded" errors stay in the generic family so a single
/// retransmission is not counted twice.
pub const RETRANSMIT_REASONS: [&str; 5] = ["local_ack_timeout_err", "roce_adp_retrans", "packet_seq_err", "rnr_nak_retry_err", "implied_nak_seq_err"];

/// mlx5 Q counters (basic, out_of_seq, retransmission, enhanced error, roce_accl): the driver
/// reads them as 32-bit (`be32_to_cpu` in counters.c), so they roll over at 2^32.
const MLX5_Q_COUNTERS: [&str; 26] = [
    "rx_write_requests",
    "rx_read_requests",
    "rx_atomic_requests",
    "rx_dct_connect",
    "out_of_buffer",
    "out_of_sequence",
    "duplicate_request",
    "rnr_nak_retry_err",
    "packet_seq_err",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "resp_local_length_error",
    "resp_cqe_error",
    "req_cqe_error",
    "req_remote_invalid_request",
    "req_remote_access_errors",
    "resp_remote_access_errors",
    "resp_cqe_flush_error",
    "req_cqe_flush_error",
    "req_transport_retries_exceeded",
    "req_rnr_retries_exceeded",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
];

/// Files in `hw_counters/` that are not counters.
pub fn is_hw_control_file(name: &str) -> bool {
    name == "lifespan"
}

/// PMA data/packet counters whose width depends on the counter table (32-bit, or 64-bit with
/// PortCountersExt / NOIETF).
pub fn is_pma_data_or_packets(name: &str) -> bool {
    matches!(name, "port_xmit_data" | "port_rcv_data" | "port_xmit_packets" | "port_rcv_packets")
}

/// Files that only exist in the Ext table (sysfs.c `pma_group_ext`).
pub fn is_ext_only(name: &str) -> bool {
    name.starts_with("unicast_") || name.starts_with("multicast_")
}

/// Width of a fixed-width PMA PortCounters field (the 32-bit table).
fn pma_bits(name: &str) -> Option<u8> {
    Some(match name {
        "symbol_error" | "port_rcv_errors" | "port_rcv_remote_physical_errors" | "port_rcv_switch_relay_errors" | "port_xmit_discards" | "VL15_dropped" => 16,
        "link_error_recovery" | "link_downed" | "port_xmit_constraint_errors" | "port_rcv_constraint_errors" => 8,
        "local_link_integrity_errors" | "excessive_buffer_overrun_errors" => 4,
        "port_xmit_wait" => 32,
        "port_xmit_data" | "port_rcv_data" | "port_xmit_packets" | "port_rcv_packets" => 32,
        _ => return None,
    })
}

fn typed_pma(name: &str) -> Option<(Typed, u64)> {
    Some(match name {
        // "octets divided by 4" (IBA; mlx5 mad.c `>> 2`): ×4 gives bytes, as procfs does.
        "port_xmit_data" => (Typed::TransmitBytes, 4),
        "port_rcv_data" => (Typed::ReceiveBytes, 4),
        "port_xmit_packets" => (Typed::TransmitPackets, 1),
        "port_rcv_packets" => (Typed::ReceivePackets, 1),
        "port_xmit_wait" => (Typed::TransmitWaitTicks, 1),
        "port_xmit_discards" => (Typed::TransmitDiscards, 1),
        "port_rcv_errors" => (Typed::ReceiveErrors, 1),
        _ => return None,
    })
}

/// The spec of a counter. `ext` says the port uses a 64-bit data/packets table.
pub fn spec(group: Group, name: &str, ext: bool) -> Spec {
    match group {
        Group::Pma => {
            let semantics = match pma_bits(name) {
                // Ext/NOIETF data and packets are 64-bit: they never saturate in practice,
                // so a decrease is a reset (docs/platform-facts.md §1 "Saturate vs wrap").
                Some(_) if ext && is_pma_data_or_packets(name) => Semantics::Monotonic,
                Some(bits) => Semantics::Saturating { bits },
                None => Semantics::Monotonic,
            };
            match typed_pma(name) {
                Some((t, scale)) => Spec { semantics, scale, target: Target::Typed(t) },
                None => Spec { semantics, scale: 1, target: Target::PortGeneric },
            }
        }
        Group::PmaLegacyExt => {
            let target = name.strip_suffix("_64").and_then(typed_pma);
            match target {
                Some((t, scale)) => Spec { semantics: Semantics::Monotonic, scale, target: Target::Typed(t) },
                None => Spec { semantics: Semantics::Monotonic, scale: 1, target: Target::PortGeneric },
            }
        }
        Group::Hw => {
            // Switchdev representors carry `vport_`-prefixed copies: same width, generic metric.
            let base = name.strip_prefix("vport_").unwrap_or(name);
            let semantics = if MLX5_Q_COUNTERS.contains(&base) {
                Semantics::Wrapping { bits: 32 }
            } else {
                // cong (np_*/rp_*) and PPCNT (rx_icrc_encapsulated) are read as 64-bit; an
                // unknown name (other drivers: bnxt_re, irdma, efa are 64-bit) is treated the
                // same, because treating a 64-bit reset as a 32-bit wrap would invent events.
                Semantics::Monotonic
            };
            let target = if base != name {
                Target::HwGeneric
            } else {
                match name {
                    "np_ecn_marked_roce_packets" => Target::Typed(Typed::EcnMarkedPackets),
                    "np_cnp_sent" => Target::Typed(Typed::CnpSent),
                    "rp_cnp_handled" => Target::Typed(Typed::CnpHandled),
                    "rp_cnp_ignored" => Target::Typed(Typed::CnpIgnored),
                    "out_of_sequence" => Target::Typed(Typed::OutOfSequencePackets),
                    "out_of_buffer" => Target::Typed(Typed::OutOfBufferDrops),
                    _ => match RETRANSMIT_REASONS.iter().find(|r| **r == name) {
                        Some(r) => Target::Typed(Typed::Retransmit(r)),
                        None => Target::HwGeneric,
                    },
                }
            };
            Spec { semantics, scale: 1, target }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pma_widths_follow_the_port_counters_table() {
        assert_eq!(spec(Group::Pma, "port_xmit_discards", false).semantics, Semantics::Saturating { bits: 16 });
        assert_eq!(spec(Group::Pma, "link_downed", true).semantics, Semantics::Saturating { bits: 8 });
        assert_eq!(spec(Group::Pma, "local_link_integrity_errors", true).semantics, Semantics::Saturating { bits: 4 });
        assert_eq!(spec(Group::Pma, "port_xmit_wait", true).semantics, Semantics::Saturating { bits: 32 });
        let data32 = spec(Group::Pma, "port_xmit_data", false);
        assert_eq!(data32, Spec { semantics: Semantics::Saturating { bits: 32 }, scale: 4, target: Target::Typed(Typed::TransmitBytes) });
        assert_eq!(spec(Group::Pma, "port_rcv_data", true).semantics, Semantics::Monotonic);
        assert_eq!(spec(Group::Pma, "unicast_xmit_packets", true).target, Target::PortGeneric);
        assert_eq!(spec(Group::Pma, "unicast_xmit_packets", true).semantics, Semantics::Monotonic);
    }

    #[test]
    fn legacy_ext_names_map_to_the_same_typed_metrics() {
        let s = spec(Group::PmaLegacyExt, "port_rcv_data_64", false);
        assert_eq!(s, Spec { semantics: Semantics::Monotonic, scale: 4, target: Target::Typed(Typed::ReceiveBytes) });
        assert_eq!(spec(Group::PmaLegacyExt, "port_unicast_xmit_packets", false).target, Target::PortGeneric);
    }

    #[test]
    fn typed_indices_are_dense_and_invertible() {
        for i in 0..Typed::COUNT {
            let t = Typed::from_index(i).expect("typed");
            assert_eq!(t.index(), i, "{t:?}");
        }
        assert_eq!(Typed::from_index(Typed::COUNT), None);
    }

    #[test]
    fn hw_counters_widths_and_targets() {
        let q = spec(Group::Hw, "out_of_buffer", false);
        assert_eq!(q.semantics, Semantics::Wrapping { bits: 32 });
        assert_eq!(q.target, Target::Typed(Typed::OutOfBufferDrops));
        assert_eq!(spec(Group::Hw, "np_cnp_sent", false).semantics, Semantics::Monotonic);
        assert_eq!(spec(Group::Hw, "rx_icrc_encapsulated", false).semantics, Semantics::Monotonic);
        assert_eq!(spec(Group::Hw, "rx_icrc_encapsulated", false).target, Target::HwGeneric);
        assert_eq!(spec(Group::Hw, "local_ack_timeout_err", false).target, Target::Typed(Typed::Retransmit("local_ack_timeout_err")));
        assert_eq!(spec(Group::Hw, "duplicate_request", false).target, Target::HwGeneric);
        let vport = spec(Group::Hw, "vport_out_of_buffer", false);
        assert_eq!((vport.semantics, vport.target), (Semantics::Wrapping { bits: 32 }, Target::HwGeneric));
        assert!(is_hw_control_file("lifespan"));
    }
}
