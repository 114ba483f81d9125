//! Prometheus families of the ethtool source, and where each statistic's deltas go.

use crate::export::reference::RegisterSampled as _;
use crate::sources::by_unit::ByUnit;
use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

use super::names::{prio_label, Class, Field};

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirPrioLabels {
    pub netdev: String,
    pub direction: &'static str,
    pub priority: &'static str,
}

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PrioLabels {
    pub netdev: String,
    pub priority: &'static str,
}

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirLabels {
    pub netdev: String,
    pub direction: &'static str,
}

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub netdev: String,
    pub reason: &'static str,
}

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LevelLabels {
    pub netdev: String,
    pub level: &'static str,
}

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatLabels {
    pub netdev: String,
    pub stat: String,
}

type Seconds = Counter<f64, AtomicU64>;

/// Where one statistic's deltas are added. Resolved once per string table, so a sweep is
/// only atomic adds. Several names may share a sink (per-priority discards of one reason).
#[derive(Clone, Debug, Default)]
pub enum Sink {
    #[default]
    None,
    Count(Counter),
    /// A duration counted by the driver in µs, exported in seconds.
    Micros(Seconds),
}

impl Sink {
    pub fn add(&self, delta: u64) {
        match self {
            Sink::None => {}
            Sink::Count(c) => {
                c.inc_by(delta);
            }
            Sink::Micros(c) => {
                c.inc_by(delta as f64 / 1e6);
            }
        }
    }
}

#[derive(Clone, Default)]
pub struct Metrics {
    pause_frames: Family<DirPrioLabels, Counter>,
    pause_seconds: Family<DirPrioLabels, Seconds>,
    pause_transitions: Family<PrioLabels, Counter>,
    priority_bytes: Family<DirPrioLabels, Counter>,
    priority_packets: Family<DirPrioLabels, Counter>,
    ecn_marked: Family<PrioLabels, Counter>,
    discards: Family<ReasonLabels, Counter>,
    pause_storm: Family<LevelLabels, Counter>,
    vport_bytes: Family<DirLabels, Counter>,
    vport_packets: Family<DirLabels, Counter>,
    pause_ctrl: Family<DirLabels, Counter>,
    generic: ByUnit<StatLabels>,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Metrics::default();
        registry.register_sampled(
            "stepwise_nic_pfc_pause_frames",
            "PFC/global pause frames (ethtool -S rx/tx_prio<p>_pause, rx/tx_global_pause)",
            m.pause_frames.clone(),
        );
        registry.register_sampled(
            "stepwise_nic_pfc_pause_seconds",
            "Time paused by PFC/global pause (ethtool -S *_pause_duration, µs in the driver)",
            m.pause_seconds.clone(),
        );
        registry.register_sampled(
            "stepwise_nic_pfc_pause_transitions",
            "Pause Xoff→Xon transitions (ethtool -S rx_prio<p>_pause_transition)",
            m.pause_transitions.clone(),
        );
        registry.register_sampled("stepwise_nic_priority_bytes", "Bytes per PFC priority (ethtool -S rx/tx_prio<p>_bytes)", m.priority_bytes.clone());
        registry.register_sampled("stepwise_nic_priority_packets", "Packets per PFC priority (ethtool -S rx/tx_prio<p>_packets)", m.priority_packets.clone());
        // `stepwise_nic_ecn_marked_packets_total` belongs to the RDMA source (np_ecn_marked_roce_packets).
        registry.register_sampled(
            "stepwise_nic_prio_ecn_marked_packets",
            "ECN-marked packets received per priority (ethtool -S rx_prio<p>_marked)",
            m.ecn_marked.clone(),
        );
        registry.register_sampled(
            "stepwise_nic_discards",
            "Packets the NIC dropped, by reason (ethtool -S buf/cong discards, *_discards_phy, rx_out_of_buffer)",
            m.discards.clone(),
        );
        registry.register_sampled("stepwise_nic_pause_storm_events", "Pause storm events (ethtool -S tx_pause_storm_<level>_events)", m.pause_storm.clone());
        registry.register_sampled(
            "stepwise_nic_rdma_vport_bytes",
            "RoCE bytes through the vport (ethtool -S rx/tx_vport_rdma_unicast_bytes)",
            m.vport_bytes.clone(),
        );
        registry.register_sampled(
            "stepwise_nic_rdma_vport_packets",
            "RoCE packets through the vport (ethtool -S rx/tx_vport_rdma_unicast_packets)",
            m.vport_packets.clone(),
        );
        registry.register_sampled(
            "stepwise_nic_pause_ctrl_frames",
            "Link-level MAC control (pause) frames, all priorities (ethtool -S rx/tx_pause_ctrl_phy)",
            m.pause_ctrl.clone(),
        );
        m.generic.register(registry, "stepwise_ethtool_stat", "Other driver statistics by name (ethtool -S), per-queue names excluded");
        m
    }

    /// The sink for one statistic of `netdev`. `generic_ok` says whether a generic name is
    /// within the cardinality cap.
    pub fn sink(&self, netdev: &str, name: &str, class: Class, generic_ok: bool) -> Sink {
        let nd = || netdev.to_string();
        let dp = |direction: &'static str, priority: &'static str| DirPrioLabels { netdev: nd(), direction, priority };
        let dir = |direction: &'static str| DirLabels { netdev: nd(), direction };
        match class {
            Class::PerQueue | Class::NotCounter => Sink::None,
            Class::Generic if generic_ok => Sink::Count(self.generic.family(name).get_or_create_owned(&StatLabels { netdev: nd(), stat: name.to_string() })),
            Class::Generic => Sink::None,
            Class::Typed(f) => match f {
                Field::PauseFrames { direction, priority } => Sink::Count(self.pause_frames.get_or_create_owned(&dp(direction.as_str(), priority.label()))),
                Field::PauseDuration { direction, priority } => Sink::Micros(self.pause_seconds.get_or_create_owned(&dp(direction.as_str(), priority.label()))),
                Field::PauseTransitions { priority } => {
                    Sink::Count(self.pause_transitions.get_or_create_owned(&PrioLabels { netdev: nd(), priority: priority.label() }))
                }
                Field::PriorityBytes { direction, priority } => {
                    Sink::Count(self.priority_bytes.get_or_create_owned(&dp(direction.as_str(), prio_label(priority))))
                }
                Field::PriorityPackets { direction, priority } => {
                    Sink::Count(self.priority_packets.get_or_create_owned(&dp(direction.as_str(), prio_label(priority))))
                }
                Field::EcnMarked { priority } => Sink::Count(self.ecn_marked.get_or_create_owned(&PrioLabels { netdev: nd(), priority: prio_label(priority) })),
                Field::Discards { reason, .. } => Sink::Count(self.discards.get_or_create_owned(&ReasonLabels { netdev: nd(), reason: reason.as_str() })),
                Field::PauseStorm { level } => Sink::Count(self.pause_storm.get_or_create_owned(&LevelLabels { netdev: nd(), level: level.as_str() })),
                Field::RdmaVportBytes { direction } => Sink::Count(self.vport_bytes.get_or_create_owned(&dir(direction.as_str()))),
                Field::RdmaVportPackets { direction } => Sink::Count(self.vport_packets.get_or_create_owned(&dir(direction.as_str()))),
                Field::PauseCtrlFrames { direction } => Sink::Count(self.pause_ctrl.get_or_create_owned(&dir(direction.as_str()))),
            },
        }
    }
}
