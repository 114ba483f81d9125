//! The source's bookkeeping on mlx5-shaped tables, without the ioctl (the ioctl itself is
//! exercised on a real veth in `tests/tests/kernel_sources.rs`).

use std::time::{Duration, Instant};

use prometheus_client::{encoding::text::encode, registry::Registry};

use super::{
    names::{split_gstrings, Direction, DiscardReason, Field, Priority, ETH_GSTRING_LEN},
    *,
};
use crate::sources::{Errors, Selector};

fn ctx() -> SourceContext {
    SourceContext {
        sysfs_root: "/nonexistent".into(),
        selector: Selector::new(&[], &[], false).expect("selector"),
        errors: Errors::default(),
        interval: Duration::from_secs(1),
        rails: Default::default(),
        owners: Default::default(),
    }
}

/// Names as the ioctl hands them over: NUL-padded, one with mlx5's trailing space.
fn table(names: &[&str]) -> Vec<String> {
    let mut raw = Vec::new();
    for n in names {
        let mut b = [0u8; ETH_GSTRING_LEN];
        b[..n.len()].copy_from_slice(n.as_bytes());
        raw.extend_from_slice(&b);
    }
    split_gstrings(&raw, names.len())
}

const MLX5: &[&str] = &[
    "rx_packets",
    "rx_prio3_pause",
    "rx_prio3_pause_duration",
    "tx_prio3_pause",
    "rx_prio3_pause_transition",
    "rx_prio3_marked",
    "rx_prio2_buf_discard",
    "rx_prio3_buf_discard",
    "rx_discards_phy",
    "tx_pause_storm_warning_events ",
    "rx_vport_rdma_unicast_bytes",
    "tx_prio3_bytes",
    "rx_global_pause_duration",
    "ch0_events",
    "rx0_bytes",
];

fn text(reg: &Registry) -> String {
    let mut s = String::new();
    encode(&mut s, reg).expect("encode");
    s
}

fn field(src: &EthtoolSource, f: Field) -> Option<u64> {
    src.snapshot().into_iter().next()?.fields.into_iter().find(|(g, _)| *g == f).map(|(_, v)| v)
}

#[test]
fn mlx5_readings_become_typed_metrics_and_snapshot() {
    let c = ctx();
    let mut reg = Registry::default();
    let mut src = EthtoolSource::new(c.clone(), &mut reg);
    src.install_table("eth2", table(MLX5), "mlx5_core".into());
    let t = Instant::now();
    //                rx_pk pause dur(µs)   txp trans mark buf2 buf3 phy storm vport   txb3  gdur ch0 rx0
    assert!(src.ingest("eth2", &[1000, 100, 2_000_000, 7, 50, 30, 4, 6, 9, 1, 4096, 800, 10, 3, 5], t));
    assert!(src.ingest("eth2", &[1100, 150, 2_500_000, 7, 60, 31, 5, 8, 9, 1, 8192, 900, 10, 9, 9], t));
    let m = text(&reg);
    for line in [
        "stepwise_nic_pfc_pause_frames_total{netdev=\"eth2\",direction=\"rx\",priority=\"3\"} 150",
        "stepwise_nic_pfc_pause_frames_total{netdev=\"eth2\",direction=\"tx\",priority=\"3\"} 7",
        "stepwise_nic_pfc_pause_seconds_total{netdev=\"eth2\",direction=\"rx\",priority=\"3\"} 2.5",
        "stepwise_nic_pfc_pause_seconds_total{netdev=\"eth2\",direction=\"rx\",priority=\"global\"} 0.00001",
        "stepwise_nic_pfc_pause_transitions_total{netdev=\"eth2\",priority=\"3\"} 60",
        "stepwise_nic_prio_ecn_marked_packets_total{netdev=\"eth2\",priority=\"3\"} 31",
        "stepwise_nic_discards_total{netdev=\"eth2\",reason=\"buf_discard\"} 13",
        "stepwise_nic_discards_total{netdev=\"eth2\",reason=\"discards_phy_rx\"} 9",
        "stepwise_nic_pause_storm_events_total{netdev=\"eth2\",level=\"warning\"} 1",
        "stepwise_nic_rdma_vport_bytes_total{netdev=\"eth2\",direction=\"rx\"} 8192",
        "stepwise_nic_priority_bytes_total{netdev=\"eth2\",direction=\"tx\",priority=\"3\"} 900",
        "stepwise_ethtool_stat_packets_total{netdev=\"eth2\",stat=\"rx_packets\"} 1100",
    ] {
        assert!(m.contains(line), "missing {line:?} in\n{m}");
    }
    assert!(!m.contains("ch0_events") && !m.contains("rx0_bytes"), "per-queue names are not exported:\n{m}");
    assert_eq!(field(&src, Field::PauseDuration { direction: Direction::Rx, priority: Priority::Prio(3) }), Some(2_500_000), "snapshot keeps µs");
    assert_eq!(field(&src, Field::Discards { reason: DiscardReason::BufDiscard, priority: Some(2) }), Some(5));
    assert_eq!(c.errors.get(SOURCE, kind::COUNTER_RESET), 0);
}

#[test]
fn table_change_carries_state_by_name_and_resets_are_counted() {
    let c = ctx();
    let mut src = EthtoolSource::new(c.clone(), &mut Registry::default());
    let t = Instant::now();
    src.install_table("eth2", table(&["rx_prio3_pause", "ch0_events"]), "mlx5_core".into());
    assert!(src.ingest("eth2", &[100, 1], t));
    // Channels added: a longer table in another order. The pause counter continues.
    src.install_table("eth2", table(&["ch0_events", "ch1_events", "rx_prio3_pause"]), "mlx5_core".into());
    assert!(!src.ingest("eth2", &[1, 2], t), "a reading that does not fit the table is refused");
    assert!(src.ingest("eth2", &[2, 1, 130], t));
    let pause = Field::PauseFrames { direction: Direction::Rx, priority: Priority::Prio(3) };
    assert_eq!(field(&src, pause), Some(130));
    // Driver reload: the counter went down, so it counted from zero since.
    assert!(src.ingest("eth2", &[0, 0, 20], t));
    assert_eq!(field(&src, pause), Some(150));
    assert_eq!(c.errors.get(SOURCE, kind::COUNTER_RESET), 1);
    // A re-created netdev: counts from zero, without a reset error.
    if let Some(d) = src.devs.get_mut("eth2") {
        d.recreated = true;
    }
    assert!(src.ingest("eth2", &[0, 0, 25], t));
    assert_eq!(field(&src, pause), Some(175));
    assert_eq!(c.errors.get(SOURCE, kind::COUNTER_RESET), 1);
}

#[test]
fn a_statistic_jumping_to_u64_max_is_a_glitch_and_goes_on_from_the_last_good_value() {
    let c = ctx();
    let mut src = EthtoolSource::new(c.clone(), &mut Registry::default());
    let t = Instant::now();
    let at = |s| t + std::time::Duration::from_secs(s);
    src.install_table("eth2", table(&["rx_prio3_pause"]), "mlx5_core".into());
    let pause = Field::PauseFrames { direction: Direction::Rx, priority: Priority::Prio(3) };
    for (i, (v, want)) in [(100, 100), (u64::MAX - 10, 100), (1000, 1000), (2000, 2000)].into_iter().enumerate() {
        assert!(src.ingest("eth2", &[v], at(i as u64)));
        assert_eq!(field(&src, pause), Some(want), "after {v}");
    }
    assert_eq!(c.errors.get(SOURCE, kind::COUNTER_GLITCH), 1);
    assert_eq!(c.errors.get(SOURCE, kind::COUNTER_RESET), 0);
}

#[test]
fn generic_names_are_capped_and_the_overflow_counted() {
    let c = ctx();
    let mut reg = Registry::default();
    let mut src = EthtoolSource::new(c.clone(), &mut reg);
    let names: Vec<String> = (0..MAX_GENERIC_STATS + 88).map(|i| format!("vendor_counter_{i:04}_x")).collect();
    let n = names.len();
    src.install_table("eth0", names, "foo".into());
    assert!(src.ingest("eth0", &vec![1; n], Instant::now()));
    assert_eq!(c.errors.get(SOURCE, KIND_CARDINALITY), 88);
    let m = text(&reg);
    assert_eq!(m.matches("stepwise_ethtool_stat_total{").count(), MAX_GENERIC_STATS, "names without a unit word count events");
    // The same names on a second netdev reuse the budget; new ones do not fit.
    src.install_table("eth1", vec!["vendor_counter_0000_x".into(), "brand_new".into()], "foo".into());
    assert_eq!(c.errors.get(SOURCE, KIND_CARDINALITY), 89);
    assert_eq!(src.status()["generic_names"], MAX_GENERIC_STATS);
}
