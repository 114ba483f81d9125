//! The RDMA source's Prometheus metrics: typed label sets, registered once.
//!
//! Counter series are driven to the source's own cumulative value ([`set_counter`]), not
//! incremented by raw deltas, so a series never goes backwards when the hardware wraps,
//! resets or the port vanishes, and a series whose labels change (netdev renamed, rail
//! override) restarts from the port's full cumulative value instead of from zero.

use crate::export::reference::RegisterSampled as _;
use crate::sources::by_unit::ByUnit;
use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};

use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet},
    metrics::{
        counter::Counter,
        family::{Family, MetricConstructor},
        gauge::Gauge,
        MetricType, TypedMetric,
    },
    registry::Registry,
};

use super::spec::Typed;

/// `{device,port,netdev,rail}`: one NIC port.
#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PortLabels {
    pub device: String,
    pub port: String,
    pub netdev: String,
    pub rail: String,
}

/// `{device,port,netdev,rail,reason}`.
#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RetransmitLabels {
    pub device: String,
    pub port: String,
    pub netdev: String,
    pub rail: String,
    pub reason: String,
}

/// `{device,port,counter}`: generic counters; `counter` is a file name, capped in number.
#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CounterLabels {
    pub device: String,
    pub port: String,
    pub counter: String,
}

pub type FloatGauge = Gauge<f64, AtomicU64>;

/// Default length of a `port_xmit_wait` tick (`[steps.params] xmit_wait_tick_seconds`).
pub const DEFAULT_TICK_SECONDS: f64 = 4e-9;

/// `port_xmit_wait` exported in seconds (a base unit): the port's cumulative tick count,
/// driven like every counter ([`set_counter`]), times the tick length, computed at each
/// scrape. The tick length is shared by every series of the family.
#[derive(Clone, Debug)]
pub struct TickSeconds {
    pub ticks: Counter,
    tick: Arc<AtomicU64>,
}

impl TypedMetric for TickSeconds {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for TickSeconds {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, _, f64>(&(self.ticks.get() as f64 * f64::from_bits(self.tick.load(Ordering::Relaxed))), None)
    }
    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// Makes the [`TickSeconds`] of a family, all sharing its tick length.
#[derive(Clone, Debug)]
pub struct TickLength(Arc<AtomicU64>);

impl Default for TickLength {
    fn default() -> Self {
        TickLength(Arc::new(AtomicU64::new(DEFAULT_TICK_SECONDS.to_bits())))
    }
}

impl TickLength {
    pub fn set(&self, seconds: f64) {
        self.0.store(seconds.to_bits(), Ordering::Relaxed);
    }
}

impl MetricConstructor<TickSeconds> for TickLength {
    fn new_metric(&self) -> TickSeconds {
        TickSeconds { ticks: Counter::default(), tick: self.0.clone() }
    }
}

/// Every family the RDMA source exports.
#[derive(Clone)]
pub struct Metrics {
    pub transmit_bytes: Family<PortLabels, Counter>,
    pub receive_bytes: Family<PortLabels, Counter>,
    pub transmit_packets: Family<PortLabels, Counter>,
    pub receive_packets: Family<PortLabels, Counter>,
    /// `stepwise_nic_transmit_wait_seconds_total`: ticks times [`TickLength`].
    pub transmit_wait: Family<PortLabels, TickSeconds, TickLength>,
    pub tick_length: TickLength,
    pub transmit_discards: Family<PortLabels, Counter>,
    pub receive_errors: Family<PortLabels, Counter>,
    pub ecn_marked_packets: Family<PortLabels, Counter>,
    pub cnp_sent: Family<PortLabels, Counter>,
    pub cnp_handled: Family<PortLabels, Counter>,
    pub cnp_ignored: Family<PortLabels, Counter>,
    pub out_of_sequence_packets: Family<PortLabels, Counter>,
    pub out_of_buffer_drops: Family<PortLabels, Counter>,
    pub retransmit_events: Family<RetransmitLabels, Counter>,
    pub hw_counter: ByUnit<CounterLabels>,
    pub port_counter: ByUnit<CounterLabels>,
    pub port_up: Family<PortLabels, Gauge>,
    pub link_rate: Family<PortLabels, FloatGauge>,
}

impl Metrics {
    /// Registers every family (prometheus-client appends `_total` to counters).
    pub fn register(registry: &mut Registry) -> Self {
        let tick_length = TickLength::default();
        let m = Metrics {
            transmit_bytes: Family::default(),
            receive_bytes: Family::default(),
            transmit_packets: Family::default(),
            receive_packets: Family::default(),
            transmit_wait: Family::new_with_constructor(tick_length.clone()),
            tick_length,
            transmit_discards: Family::default(),
            receive_errors: Family::default(),
            ecn_marked_packets: Family::default(),
            cnp_sent: Family::default(),
            cnp_handled: Family::default(),
            cnp_ignored: Family::default(),
            out_of_sequence_packets: Family::default(),
            out_of_buffer_drops: Family::default(),
            retransmit_events: Family::default(),
            hw_counter: ByUnit::default(),
            port_counter: ByUnit::default(),
            port_up: Family::default(),
            link_rate: Family::default(),
        };
        registry.register_sampled(
            "stepwise_nic_transmit_wait_seconds",
            "Time with data pending but not sent: PMA port_xmit_wait ticks x [steps.params] xmit_wait_tick_seconds (default 4 ns)",
            m.transmit_wait.clone(),
        );
        let counters: [(&str, &str, &Family<PortLabels, Counter>); 12] = [
            ("stepwise_nic_transmit_bytes", "RDMA bytes transmitted (PMA port_xmit_data x4)", &m.transmit_bytes),
            ("stepwise_nic_receive_bytes", "RDMA bytes received (PMA port_rcv_data x4)", &m.receive_bytes),
            ("stepwise_nic_transmit_packets", "Packets transmitted (PMA port_xmit_packets)", &m.transmit_packets),
            ("stepwise_nic_receive_packets", "Packets received (PMA port_rcv_packets)", &m.receive_packets),
            ("stepwise_nic_transmit_discards", "Outbound packets discarded (PMA port_xmit_discards)", &m.transmit_discards),
            ("stepwise_nic_receive_errors", "Received packets with errors (PMA port_rcv_errors)", &m.receive_errors),
            ("stepwise_nic_ecn_marked_packets", "CE-marked RoCEv2 packets received (np_ecn_marked_roce_packets)", &m.ecn_marked_packets),
            ("stepwise_nic_cnp_sent", "Congestion notification packets sent (np_cnp_sent)", &m.cnp_sent),
            ("stepwise_nic_cnp_handled", "CNPs received and handled by rate throttling (rp_cnp_handled)", &m.cnp_handled),
            ("stepwise_nic_cnp_ignored", "CNPs received and ignored (rp_cnp_ignored)", &m.cnp_ignored),
            ("stepwise_nic_out_of_sequence_packets", "Out-of-sequence packets received (out_of_sequence)", &m.out_of_sequence_packets),
            ("stepwise_nic_out_of_buffer_drops", "Packets dropped for lack of a posted receive WQE (out_of_buffer)", &m.out_of_buffer_drops),
        ];
        for (name, help, fam) in counters {
            registry.register_sampled(name, help, fam.clone());
        }
        registry.register_sampled(
            "stepwise_nic_retransmit_events",
            "Sender-side RDMA retransmission events by cause (mlx5 hw_counters)",
            m.retransmit_events.clone(),
        );
        m.hw_counter.register(registry, "stepwise_rdma_hw_stat", "Every other RDMA hw_counters entry, by file name (at most 256 names)");
        m.port_counter.register(
            registry,
            "stepwise_rdma_port_stat",
            "Every other RDMA PMA counters entry (symbol_error, link_downed, unicast_*...), by file name",
        );
        registry.register_sampled("stepwise_nic_port_up", "1 if the RDMA port state is ACTIVE, else 0", m.port_up.clone());
        registry.register_sampled("stepwise_nic_link_rate_bytes_per_second", "RDMA port link rate (from the rate file, Gb/s x 125000000)", m.link_rate.clone());
        m
    }

    /// The family of a typed counter other than retransmissions and transmit wait.
    pub fn port_family(&self, t: Typed) -> Option<&Family<PortLabels, Counter>> {
        Some(match t {
            Typed::TransmitBytes => &self.transmit_bytes,
            Typed::ReceiveBytes => &self.receive_bytes,
            Typed::TransmitPackets => &self.transmit_packets,
            Typed::ReceivePackets => &self.receive_packets,
            Typed::TransmitWaitTicks => return None,
            Typed::TransmitDiscards => &self.transmit_discards,
            Typed::ReceiveErrors => &self.receive_errors,
            Typed::EcnMarkedPackets => &self.ecn_marked_packets,
            Typed::CnpSent => &self.cnp_sent,
            Typed::CnpHandled => &self.cnp_handled,
            Typed::CnpIgnored => &self.cnp_ignored,
            Typed::OutOfSequencePackets => &self.out_of_sequence_packets,
            Typed::OutOfBufferDrops => &self.out_of_buffer_drops,
            Typed::Retransmit(_) => return None,
        })
    }
}

/// Raises a counter series to `total` (never lowers it).
pub fn set_counter(c: &Counter, total: u64) {
    let cur = c.get();
    if total > cur {
        c.inc_by(total - cur);
    }
}

impl PortLabels {
    pub fn retransmit(&self, reason: &str) -> RetransmitLabels {
        RetransmitLabels {
            device: self.device.clone(),
            port: self.port.clone(),
            netdev: self.netdev.clone(),
            rail: self.rail.clone(),
            reason: reason.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_counter_never_goes_backwards() {
        let c = Counter::<u64>::default();
        set_counter(&c, 10);
        set_counter(&c, 4);
        assert_eq!(c.get(), 10);
        set_counter(&c, 25);
        assert_eq!(c.get(), 25);
    }

    #[test]
    fn families_are_registered_with_total_suffix() {
        let mut reg = Registry::default();
        let m = Metrics::register(&mut reg);
        let l = PortLabels { device: "mlx5_0".into(), port: "1".into(), netdev: "eth0".into(), rail: "0".into() };
        m.transmit_bytes.get_or_create(&l).inc_by(8);
        m.link_rate.get_or_create(&l).set(50e9);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).expect("encode");
        assert!(out.contains(r#"stepwise_nic_transmit_bytes_total{device="mlx5_0",port="1",netdev="eth0",rail="0"} 8"#), "{out}");
        assert!(out.contains("stepwise_nic_link_rate_bytes_per_second{"), "{out}");
    }

    #[test]
    fn transmit_wait_is_exported_in_seconds_of_the_configured_tick() {
        let mut reg = Registry::default();
        let m = Metrics::register(&mut reg);
        let l = PortLabels { device: "mlx5_0".into(), port: "1".into(), netdev: "eth0".into(), rail: "0".into() };
        let ticks = m.transmit_wait.get_or_create_owned(&l).ticks;
        set_counter(&ticks, 250_000_000);
        let text = |reg: &Registry| {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, reg).expect("encode");
            out
        };
        let series = r#"stepwise_nic_transmit_wait_seconds_total{device="mlx5_0",port="1",netdev="eth0",rail="0"}"#;
        // 250 M ticks of the default 4 ns: 1 s.
        assert!(text(&reg).contains(&format!("{series} 1.0")), "{}", text(&reg));
        m.tick_length.set(8e-9);
        assert!(text(&reg).contains(&format!("{series} 2.0")), "{}", text(&reg));
        assert!(!text(&reg).contains("wait_ticks"), "no tick-unit family: {}", text(&reg));
        assert!(m.port_family(Typed::TransmitWaitTicks).is_none());
    }
}
