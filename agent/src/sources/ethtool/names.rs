//! Driver statistic names (`ethtool -S`) → typed fields.
//!
//! Pure functions: the ioctl hands us a string table once per driver configuration and these
//! decide, per name, whether it is a field attribution uses (mlx5 PFC, ECN, discards…;
//! docs/platform-facts.md §2), a per-queue counter (unbounded: one per channel, never exported), or
//! a generic counter exported under its own name.

use serde::Serialize;

/// `ETH_GSTRING_LEN`: each name in a `ETHTOOL_GSTRINGS` answer is NUL-padded to this size.
pub const ETH_GSTRING_LEN: usize = 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Rx,
    Tx,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Rx => "rx",
            Direction::Tx => "tx",
        }
    }
}

/// A PFC priority (0..=7) or link-level global pause.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Priority {
    Prio(u8),
    Global,
}

const PRIO_LABELS: [&str; 8] = ["0", "1", "2", "3", "4", "5", "6", "7"];

impl Priority {
    /// Label value: `"0"`..`"7"` or `"global"`.
    pub fn label(self) -> &'static str {
        match self {
            Priority::Prio(p) => PRIO_LABELS.get(p as usize).copied().unwrap_or("global"),
            Priority::Global => "global",
        }
    }
}

/// Label value of a bare priority number.
pub fn prio_label(p: u8) -> &'static str {
    Priority::Prio(p).label()
}

/// Why the NIC dropped packets (`reason` label of `stepwise_nic_discards_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum DiscardReason {
    /// `rx_prio{p}_buf_discard`: no per-host buffer.
    BufDiscard,
    /// `rx_prio{p}_cong_discard`: per-host congestion.
    CongDiscard,
    /// `rx_prio{p}_discards`: no receive buffer on that priority.
    PrioDiscards,
    /// `rx_discards_phy`: no buffer at the port.
    DiscardsPhyRx,
    /// `tx_discards_phy`: dropped on transmit.
    DiscardsPhyTx,
    /// `rx_out_of_buffer`: the RQ had no software buffer posted.
    OutOfBuffer,
}

impl DiscardReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DiscardReason::BufDiscard => "buf_discard",
            DiscardReason::CongDiscard => "cong_discard",
            DiscardReason::PrioDiscards => "prio_discards",
            DiscardReason::DiscardsPhyRx => "discards_phy_rx",
            DiscardReason::DiscardsPhyTx => "discards_phy_tx",
            DiscardReason::OutOfBuffer => "out_of_buffer",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum StormLevel {
    /// The device sent pauses for a long time.
    Warning,
    /// …so long that pause transmission was disabled.
    Error,
}

impl StormLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            StormLevel::Warning => "warning",
            StormLevel::Error => "error",
        }
    }
}

/// A driver statistic attribution uses. Units are the driver's: counts, bytes, or µs for
/// [`Field::PauseDuration`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Field {
    /// `{rx,tx}_prio{p}_pause`, `{rx,tx}_global_pause`: pause frames.
    PauseFrames { direction: Direction, priority: Priority },
    /// `…_pause_duration`: time paused, in **microseconds**.
    PauseDuration { direction: Direction, priority: Priority },
    /// `rx_prio{p}_pause_transition`, `rx_global_pause_transition`: Xoff→Xon transitions.
    PauseTransitions { priority: Priority },
    /// `{rx,tx}_prio{p}_bytes`.
    PriorityBytes { direction: Direction, priority: u8 },
    /// `{rx,tx}_prio{p}_packets`.
    PriorityPackets { direction: Direction, priority: u8 },
    /// `rx_prio{p}_marked`: ECN-marked packets received.
    EcnMarked { priority: u8 },
    /// Drops, by reason (per priority where the driver splits them).
    Discards { reason: DiscardReason, priority: Option<u8> },
    /// `tx_pause_storm_{warning,error}_events`.
    PauseStorm { level: StormLevel },
    /// `{rx,tx}_vport_rdma_unicast_bytes`: RoCE traffic, which the netdev byte counters miss.
    RdmaVportBytes { direction: Direction },
    /// `{rx,tx}_vport_rdma_unicast_packets`.
    RdmaVportPackets { direction: Direction },
    /// `{rx,tx}_pause_ctrl_phy`: link-level MAC control (pause) frames, all priorities.
    PauseCtrlFrames { direction: Direction },
}

/// What to do with one statistic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Typed(Field),
    /// One per queue/channel: unbounded label values, never exported.
    PerQueue,
    /// A driver value that is not a counter (e.g. veth's `peer_ifindex`): not exported.
    NotCounter,
    /// Exported as `stepwise_ethtool_stat{,_packets,_bytes}_total{stat=name}` by the unit the name
    /// says (`sources::by_unit`), within the cardinality cap.
    Generic,
}

/// Splits an `ETHTOOL_GSTRINGS` data area into `n` trimmed names. Names are NUL-padded to
/// 32 bytes; one mlx5 version had a trailing space (`"tx_pause_storm_warning_events "`),
/// so whitespace is trimmed too. Non-UTF-8 bytes are replaced rather than dropped, so
/// indices stay aligned with `ETHTOOL_GSTATS` values.
pub fn split_gstrings(data: &[u8], n: usize) -> Vec<String> {
    data.chunks(ETH_GSTRING_LEN)
        .take(n)
        .map(|raw| {
            let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
            String::from_utf8_lossy(&raw[..end]).trim().to_string()
        })
        .collect()
}

/// Classifies every name of a string table (names already trimmed).
pub fn parse_table<S: AsRef<str>>(names: &[S]) -> Vec<Class> {
    names.iter().map(|n| classify(n.as_ref().trim())).collect()
}

/// Classifies one (trimmed) statistic name.
pub fn classify(name: &str) -> Class {
    if let Some(f) = typed(name) {
        return Class::Typed(f);
    }
    if is_per_queue(name) {
        return Class::PerQueue;
    }
    if NOT_COUNTERS.contains(&name) {
        return Class::NotCounter;
    }
    Class::Generic
}

/// Driver values that are identifiers or settings, not event counts.
const NOT_COUNTERS: &[&str] = &["peer_ifindex"];

fn typed(name: &str) -> Option<Field> {
    use Direction::{Rx, Tx};
    use DiscardReason as R;
    let simple = match name {
        "rx_discards_phy" => Some(Field::Discards { reason: R::DiscardsPhyRx, priority: None }),
        "tx_discards_phy" => Some(Field::Discards { reason: R::DiscardsPhyTx, priority: None }),
        "rx_out_of_buffer" => Some(Field::Discards { reason: R::OutOfBuffer, priority: None }),
        "tx_pause_storm_warning_events" => Some(Field::PauseStorm { level: StormLevel::Warning }),
        "tx_pause_storm_error_events" => Some(Field::PauseStorm { level: StormLevel::Error }),
        "rx_vport_rdma_unicast_bytes" => Some(Field::RdmaVportBytes { direction: Rx }),
        "tx_vport_rdma_unicast_bytes" => Some(Field::RdmaVportBytes { direction: Tx }),
        "rx_vport_rdma_unicast_packets" => Some(Field::RdmaVportPackets { direction: Rx }),
        "tx_vport_rdma_unicast_packets" => Some(Field::RdmaVportPackets { direction: Tx }),
        "rx_pause_ctrl_phy" => Some(Field::PauseCtrlFrames { direction: Rx }),
        "tx_pause_ctrl_phy" => Some(Field::PauseCtrlFrames { direction: Tx }),
        _ => None,
    };
    if simple.is_some() {
        return simple;
    }
    // `{rx,tx}_{prio<p>,global}_<rest>`
    let (direction, rest) = if let Some(r) = name.strip_prefix("rx_") {
        (Rx, r)
    } else if let Some(r) = name.strip_prefix("tx_") {
        (Tx, r)
    } else {
        return None;
    };
    let (priority, rest) = if let Some(r) = rest.strip_prefix("global_") {
        (Priority::Global, r)
    } else {
        let r = rest.strip_prefix("prio")?;
        let (digit, r) = r.split_at_checked(1)?;
        let p = digit.parse::<u8>().ok().filter(|p| *p < 8)?;
        (Priority::Prio(p), r.strip_prefix('_')?)
    };
    let prio_only = match priority {
        Priority::Prio(p) => Some(p),
        Priority::Global => None,
    };
    Some(match (direction, rest) {
        (_, "pause") => Field::PauseFrames { direction, priority },
        (_, "pause_duration") => Field::PauseDuration { direction, priority },
        (Rx, "pause_transition") => Field::PauseTransitions { priority },
        (_, "bytes") => Field::PriorityBytes { direction, priority: prio_only? },
        (_, "packets") => Field::PriorityPackets { direction, priority: prio_only? },
        (Rx, "marked") => Field::EcnMarked { priority: prio_only? },
        (Rx, "buf_discard") => Field::Discards { reason: R::BufDiscard, priority: Some(prio_only?) },
        (Rx, "cong_discard") => Field::Discards { reason: R::CongDiscard, priority: Some(prio_only?) },
        (Rx, "discards") => Field::Discards { reason: R::PrioDiscards, priority: Some(prio_only?) },
        _ => return None,
    })
}

/// Names that carry a queue or channel index: `rx0_packets`, `ch3_events`, `qos_tx1_bytes`,
/// `ptp_cq0_cqe`, veth/virtio `rx_queue_0_xdp_packets`, ena `queue_0_tx_cnt`, sfc/i40e
/// `tx-0.packets`, bnxt `[0]: rx_ucast_packets`. RFC 2819 histogram names
/// (`rx_65_to_127_bytes_phy`) are bounded and are *not* per-queue.
pub fn is_per_queue(name: &str) -> bool {
    const INDEXED: &[&str] = &["rx", "tx", "ch", "rxq", "txq", "sq", "cq", "rq", "xdpsq", "xsksq"];
    if name.starts_with('[') {
        return true;
    }
    let tokens: Vec<&str> = name.split('_').collect();
    let indexed_token = |t: &str| {
        let alpha_end = t.find(|c: char| c.is_ascii_digit()).unwrap_or(t.len());
        let (alpha, digits) = t.split_at(alpha_end);
        !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) && INDEXED.contains(&alpha)
    };
    if tokens.iter().any(|t| indexed_token(t)) {
        return true;
    }
    if tokens.windows(2).any(|w| matches!(w[0], "queue" | "q") && w[1].bytes().all(|b| b.is_ascii_digit()) && !w[1].is_empty()) {
        return true;
    }
    // `rx-0.packets`
    for prefix in ["rx-", "tx-"] {
        if let Some(r) = name.strip_prefix(prefix) {
            let digits = r.bytes().take_while(|b| b.is_ascii_digit()).count();
            if digits > 0 {
                return true;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use Direction::{Rx, Tx};

    /// Names in the order and shape mlx5 (ConnectX-6/7, en_stats.c) reports them, with PFC
    /// enabled on priority 3, one channel, and the trailing-space storm name of one release.
    const MLX5: &[&str] = &[
        "rx_packets",
        "rx_bytes",
        "tx_packets",
        "tx_bytes",
        "rx_out_of_buffer",
        "rx_vport_unicast_packets",
        "rx_vport_rdma_unicast_packets",
        "rx_vport_rdma_unicast_bytes",
        "tx_vport_rdma_unicast_packets",
        "tx_vport_rdma_unicast_bytes",
        "rx_packets_phy",
        "rx_discards_phy",
        "tx_discards_phy",
        "rx_pause_ctrl_phy",
        "tx_pause_ctrl_phy",
        "rx_64_bytes_phy",
        "rx_65_to_127_bytes_phy",
        "rx_buffer_passed_thres_phy",
        "rx_prio0_bytes",
        "rx_prio0_packets",
        "rx_prio0_discards",
        "tx_prio0_bytes",
        "tx_prio0_packets",
        "rx_prio3_bytes",
        "rx_prio3_packets",
        "rx_prio3_discards",
        "tx_prio3_bytes",
        "tx_prio3_packets",
        "rx_prio3_pause",
        "rx_prio3_pause_duration",
        "tx_prio3_pause",
        "tx_prio3_pause_duration",
        "rx_prio3_pause_transition",
        "rx_prio3_buf_discard",
        "rx_prio3_cong_discard",
        "rx_prio3_marked",
        "tx_pause_storm_warning_events ",
        "tx_pause_storm_error_events",
        "module_unplug",
        "outbound_pci_stalled_rd",
        "ch0_events",
        "ch0_poll",
        "rx0_packets",
        "rx0_bytes",
        "rx0_ecn_mark",
        "rx0_xsk_buff_alloc_err",
        "tx0_packets",
        "tx0_xmit_more",
        "qos_tx0_packets",
        "ptp_cq0_cqe",
    ];

    fn gstrings(names: &[&str]) -> Vec<u8> {
        let mut out = Vec::new();
        for n in names {
            let mut raw = [0u8; ETH_GSTRING_LEN];
            raw[..n.len()].copy_from_slice(n.as_bytes());
            out.extend_from_slice(&raw);
        }
        out
    }

    #[test]
    fn gstrings_are_split_and_trimmed_including_the_trailing_space_name() {
        let names = split_gstrings(&gstrings(MLX5), MLX5.len());
        assert_eq!(names.len(), MLX5.len());
        assert_eq!(names[0], "rx_packets");
        assert!(names.contains(&"tx_pause_storm_warning_events".to_string()), "{names:?}");
        assert!(names.iter().all(|n| n.trim() == n && !n.contains('\0')));
        // A short answer never yields more names than the data holds.
        assert_eq!(split_gstrings(&gstrings(&["a", "b"]), 5), vec!["a", "b"]);
    }

    #[test]
    fn mlx5_table_maps_to_typed_fields() {
        let names = split_gstrings(&gstrings(MLX5), MLX5.len());
        let classes = parse_table(&names);
        let typed = |n: &str| classes[names.iter().position(|x| x == n).expect(n)];
        assert_eq!(typed("rx_prio3_pause"), Class::Typed(Field::PauseFrames { direction: Rx, priority: Priority::Prio(3) }));
        assert_eq!(typed("tx_prio3_pause_duration"), Class::Typed(Field::PauseDuration { direction: Tx, priority: Priority::Prio(3) }));
        assert_eq!(typed("rx_prio3_pause_transition"), Class::Typed(Field::PauseTransitions { priority: Priority::Prio(3) }));
        assert_eq!(typed("tx_prio0_bytes"), Class::Typed(Field::PriorityBytes { direction: Tx, priority: 0 }));
        assert_eq!(typed("rx_prio3_packets"), Class::Typed(Field::PriorityPackets { direction: Rx, priority: 3 }));
        assert_eq!(typed("rx_prio3_marked"), Class::Typed(Field::EcnMarked { priority: 3 }));
        assert_eq!(typed("rx_prio3_buf_discard"), Class::Typed(Field::Discards { reason: DiscardReason::BufDiscard, priority: Some(3) }));
        assert_eq!(typed("rx_prio3_cong_discard"), Class::Typed(Field::Discards { reason: DiscardReason::CongDiscard, priority: Some(3) }));
        assert_eq!(typed("rx_prio0_discards"), Class::Typed(Field::Discards { reason: DiscardReason::PrioDiscards, priority: Some(0) }));
        assert_eq!(typed("rx_discards_phy"), Class::Typed(Field::Discards { reason: DiscardReason::DiscardsPhyRx, priority: None }));
        assert_eq!(typed("tx_discards_phy"), Class::Typed(Field::Discards { reason: DiscardReason::DiscardsPhyTx, priority: None }));
        assert_eq!(typed("rx_out_of_buffer"), Class::Typed(Field::Discards { reason: DiscardReason::OutOfBuffer, priority: None }));
        assert_eq!(typed("tx_pause_storm_warning_events"), Class::Typed(Field::PauseStorm { level: StormLevel::Warning }));
        assert_eq!(typed("tx_pause_storm_error_events"), Class::Typed(Field::PauseStorm { level: StormLevel::Error }));
        assert_eq!(typed("rx_vport_rdma_unicast_bytes"), Class::Typed(Field::RdmaVportBytes { direction: Rx }));
        assert_eq!(typed("tx_vport_rdma_unicast_packets"), Class::Typed(Field::RdmaVportPackets { direction: Tx }));
        assert_eq!(typed("tx_pause_ctrl_phy"), Class::Typed(Field::PauseCtrlFrames { direction: Tx }));
        for generic in [
            "rx_packets",
            "tx_bytes",
            "rx_vport_unicast_packets",
            "rx_64_bytes_phy",
            "rx_65_to_127_bytes_phy",
            "rx_buffer_passed_thres_phy",
            "module_unplug",
            "outbound_pci_stalled_rd",
        ] {
            assert_eq!(typed(generic), Class::Generic, "{generic}");
        }
        for q in ["ch0_events", "ch0_poll", "rx0_packets", "rx0_ecn_mark", "rx0_xsk_buff_alloc_err", "tx0_xmit_more", "qos_tx0_packets", "ptp_cq0_cqe"] {
            assert_eq!(typed(q), Class::PerQueue, "{q}");
        }
    }

    #[test]
    fn global_pause_names_are_priority_global() {
        let c = parse_table(&["rx_global_pause", "rx_global_pause_duration", "tx_global_pause", "tx_global_pause_duration", "rx_global_pause_transition"]);
        assert_eq!(c[0], Class::Typed(Field::PauseFrames { direction: Rx, priority: Priority::Global }));
        assert_eq!(c[1], Class::Typed(Field::PauseDuration { direction: Rx, priority: Priority::Global }));
        assert_eq!(c[2], Class::Typed(Field::PauseFrames { direction: Tx, priority: Priority::Global }));
        assert_eq!(c[3], Class::Typed(Field::PauseDuration { direction: Tx, priority: Priority::Global }));
        assert_eq!(c[4], Class::Typed(Field::PauseTransitions { priority: Priority::Global }));
        assert_eq!(Priority::Global.label(), "global");
        assert_eq!(Priority::Prio(7).label(), "7");
    }

    #[test]
    fn malformed_priorities_are_not_typed() {
        // prio8 does not exist; prio10 is not a single digit; global has no bytes counter.
        for n in ["rx_prio8_pause", "rx_prio10_pause", "rx_prio_pause", "rx_global_bytes", "tx_prio3_marked", "rx_prio3_pausex"] {
            assert!(!matches!(classify(n), Class::Typed(_)), "{n}");
        }
    }

    #[test]
    fn veth_names_are_per_queue_except_peer_ifindex() {
        // veth_get_strings(): "peer_ifindex", then rx_queue_%u_%s and tx_queue_%u_%s.
        let veth = ["peer_ifindex", "rx_queue_0_xdp_packets", "rx_queue_0_xdp_bytes", "rx_queue_0_drops", "tx_queue_0_xdp_xmit", "tx_queue_0_xdp_xmit_errors"];
        let c = parse_table(&veth);
        assert_eq!(c[0], Class::NotCounter);
        assert!(c[1..].iter().all(|c| *c == Class::PerQueue), "{c:?}");
    }

    #[test]
    fn other_drivers_per_queue_shapes() {
        for q in ["queue_0_tx_cnt", "tx-0.packets", "rx-12.bytes", "[3]: rx_ucast_packets", "rxq0_packets", "tx_queue_15_bytes"] {
            assert!(is_per_queue(q), "{q}");
        }
        for not_q in ["rx_crc_errors", "tx_timeout", "rx_1519_to_2047_bytes_phy", "rx_prio7_bytes", "link_down_events_phy"] {
            assert!(!is_per_queue(not_q), "{not_q}");
        }
    }
}
