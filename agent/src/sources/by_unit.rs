//! Counters exported under their driver's own name (`stepwise_rdma_hw_stat*`,
//! `stepwise_rdma_port_stat*`, `stepwise_ethtool_stat*`): one family per unit, chosen from the
//! name, so that no family mixes bytes, packets and events (a `sum` or `rate` over one family
//! then adds like with like).

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

use crate::export::reference::RegisterSampled as _;

/// What a counter counts, from its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameUnit {
    Bytes,
    Packets,
    Events,
}

/// The unit a driver counter's name says: a word `bytes`/`octets` is bytes, a word
/// `packets`/`pkts`/`frames` packets, anything else events (errors, drops, requests…).
pub fn of_name(name: &str) -> NameUnit {
    let words = || name.split(|c: char| !c.is_ascii_alphanumeric());
    if words().any(|w| matches!(w, "bytes" | "octets")) {
        NameUnit::Bytes
    } else if words().any(|w| matches!(w, "packets" | "pkts" | "frames")) {
        NameUnit::Packets
    } else {
        NameUnit::Events
    }
}

/// `<name>_total` (events), `<name>_packets_total` and `<name>_bytes_total`, labelled `L`.
#[derive(Clone, Debug)]
pub struct ByUnit<L> {
    pub events: Family<L, Counter>,
    pub packets: Family<L, Counter>,
    pub bytes: Family<L, Counter>,
}

impl<L: Clone + std::hash::Hash + Eq> Default for ByUnit<L> {
    fn default() -> Self {
        ByUnit { events: Family::default(), packets: Family::default(), bytes: Family::default() }
    }
}

impl<L: Clone + std::hash::Hash + Eq + Default + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static> ByUnit<L> {
    /// Registers the three families; `what` says what they count ("Every other RDMA hw_counters
    /// entry, by file name").
    pub fn register(&self, r: &mut Registry, name: &str, what: &str) {
        r.register_sampled(name, format!("{what}: those counting events (errors, drops, requests…)"), self.events.clone());
        r.register_sampled(format!("{name}_packets"), format!("{what}: those counting packets (name with packets, pkts or frames)"), self.packets.clone());
        r.register_sampled(format!("{name}_bytes"), format!("{what}: those counting bytes (name with bytes or octets)"), self.bytes.clone());
    }

    /// The family of the counter called `name`.
    pub fn family(&self, name: &str) -> &Family<L, Counter> {
        match of_name(name) {
            NameUnit::Bytes => &self.bytes,
            NameUnit::Packets => &self.packets,
            NameUnit::Events => &self.events,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{of_name, NameUnit::*};

    #[test]
    fn the_unit_is_a_whole_word_of_the_name() {
        for (name, unit) in [
            ("rx_vport_rdma_unicast_bytes", Bytes),
            ("tx_bytes_phy", Bytes),
            ("unicast_xmit_packets", Packets),
            ("rx_pkts_nic", Packets),
            ("rx_pause_ctrl_frames", Packets),
            ("symbol_error", Events),
            ("rx_read_requests", Events),
            ("rx_bytesx", Events),
            ("duplicate_request", Events),
        ] {
            assert_eq!(of_name(name), unit, "{name}");
        }
    }
}
