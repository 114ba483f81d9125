//! The committed fixtures are exactly what the scenario writer produces, and the agent's RDMA
//! source reads each of them with the expected ports, values and errors (no root needed).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use stepwise::sources::{rdma::RdmaSource, Errors, Selector, Source, SourceContext};
use stepwise_tests::scenario::{self, snapshot, FIXTURES};

fn committed(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name).join("sys")
}

fn source(root: &Path) -> (RdmaSource, Errors) {
    // An unregistered error family: counts are read back with `Errors::get`.
    let errors = Errors::default();
    let ctx = SourceContext {
        sysfs_root: root.to_path_buf(),
        selector: Selector::new(&[], &[], true).expect("selector"),
        errors: errors.clone(),
        interval: Duration::from_secs(1),
        rails: Default::default(),
        owners: Default::default(),
    };
    (RdmaSource::standalone(ctx), errors)
}

const KINDS: [&str; 8] = ["read", "parse", "not_available", "vanished", "probe_safe_skip", "counter_reset", "cardinality", "netlink"];

/// Every non-zero `stepwise_errors_total{source="rdma"}` kind.
fn error_counts(e: &Errors) -> Vec<(&'static str, u64)> {
    KINDS.iter().map(|k| (*k, e.get("rdma", k))).filter(|(_, v)| *v > 0).collect()
}

#[test]
fn committed_fixtures_match_the_writer() {
    for name in FIXTURES {
        let dir = tempfile::tempdir().expect("tempdir");
        let fresh = dir.path().join("sys");
        scenario::write_fixture(name, &fresh).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let want = snapshot(&fresh).expect("snapshot fresh");
        let have = snapshot(&committed(name)).unwrap_or_else(|e| panic!("fixture {name} missing ({e}); run `cargo xtask scenario write-fixtures`"));
        let diff: Vec<&String> = want.keys().chain(have.keys()).filter(|k| want.get(*k) != have.get(*k)).take(10).collect();
        assert!(diff.is_empty(), "tests/fixtures/{name}/sys drifted from the writer (run `cargo xtask scenario write-fixtures`): {diff:?}");
        assert_eq!(want.len(), have.len(), "{name}");
    }
}

#[test]
fn dgx8_has_eight_ports_with_rails_netdevs_and_values() {
    let root = committed("dgx8");
    let (mut src, errors) = source(&root);
    let r = src.sweep().expect("sweep");
    assert_eq!((r.devices, r.skipped), (8, 0));
    assert_eq!(error_counts(&errors), vec![]);
    let ports = src.ports();
    assert_eq!(ports.len(), 8);
    for (i, p) in ports.iter().enumerate() {
        assert_eq!(p.device, format!("mlx5_{i}"));
        assert_eq!(p.rail, i as u32, "rails follow PCI order");
        assert!(p.up && p.present);
        assert_eq!(p.rate_bytes_per_second, Some(50e9));
        let words: u64 = std::fs::read_to_string(root.join(format!("class/infiniband/{}/ports/1/counters/port_xmit_data", p.device)))
            .expect("read")
            .trim()
            .parse()
            .expect("number");
        assert_eq!(p.transmit_bytes, words * 4);
        assert!(p.netdev.as_deref().is_some_and(|n| n.starts_with("enp")), "{p:?}");
        assert!(p.cnp_sent > 0 && p.ecn_marked_packets > 0 && p.retransmits > 0, "{p:?}");
    }
    // Every NIC's nearest GPU is the one under its own PCIe switch; NUMA split 4/4.
    let topo = stepwise::topology::discover(&root, &Default::default());
    assert_eq!(topo.gpus.len(), 8);
    for n in &topo.nics {
        let (nic_bus, gpu) = (n.pci.as_deref().expect("pci"), n.gpu.as_deref().expect("gpu"));
        let bus = |a: &str| u32::from_str_radix(&a[5..7], 16).expect("bus");
        assert_eq!(bus(gpu) + 1, bus(nic_bus), "{n:?}");
    }
    assert_eq!(topo.nics.iter().filter(|n| n.numa_node == Some(1)).count(), 4);
}

#[test]
fn dgx16_has_sixteen_clean_ports() {
    let (mut src, errors) = source(&committed("dgx16"));
    let r = src.sweep().expect("sweep");
    assert_eq!((r.devices, r.skipped), (16, 0));
    // 21 PMA + 31 hw counters per port.
    assert_eq!(r.values, 16 * 52);
    assert_eq!(error_counts(&errors), vec![]);
}

#[test]
fn restricted_function_is_counted_then_left_alone() {
    let (mut src, errors) = source(&committed("restricted"));
    let r = src.sweep().expect("sweep");
    assert_eq!(r.devices, 4);
    // mlx5_3: its 21 PMA and 31 hw counters all fail (lifespan too, but it is not a counter).
    assert_eq!(error_counts(&errors), vec![("read", 52)]);
    src.sweep().expect("sweep");
    assert_eq!(error_counts(&errors), vec![("read", 104), ("probe_safe_skip", 1)]);
    let r = src.sweep().expect("sweep");
    assert_eq!(r.devices, 3, "probe-safe mode stopped reading mlx5_3");
    assert_eq!(error_counts(&errors), vec![("read", 104), ("probe_safe_skip", 1)]);
    assert!(src.ports().iter().filter(|p| p.device != "mlx5_3").all(|p| p.transmit_bytes > 0));
}

#[test]
fn malformed_values_are_counted_and_the_rest_is_read() {
    let root = committed("malformed");
    let (mut src, errors) = source(&root);
    let r = src.sweep().expect("sweep");
    assert_eq!(r.devices, 2);
    // N/A: port_xmit_wait, port_rcv_errors. Parse: empty symbol_error, "-1", "0x1f", "12 34".
    assert_eq!(error_counts(&errors), vec![("parse", 4), ("not_available", 2)]);
    assert_eq!(r.skipped, 6);
    for p in &src.ports() {
        let raw = std::fs::read_to_string(root.join(format!("class/infiniband/{}/ports/1/counters/port_xmit_data", p.device))).expect("read");
        assert!(!raw.ends_with('\n'), "the fixture has no trailing newline here");
        assert_eq!(p.transmit_bytes, raw.trim().parse::<u64>().expect("number") * 4);
    }
    assert_eq!(src.status()["devices"][0]["ports"][0]["link_layer"], "Ethernet", "two-line link_layer");
}

#[test]
fn wrap32_counters_roll_over_and_saturate_as_the_agent_expects() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("sys");
    let mut s = scenario::write_fixture("wrap32", &root).expect("fixture");
    let (mut src, errors) = source(&root);
    let r = src.sweep().expect("sweep");
    assert_eq!((r.devices, r.skipped), (2, 0));
    assert_eq!(error_counts(&errors), vec![]);
    let before = src.ports();
    let mut sent = 0u64;
    for _ in 0..10 {
        s.step(Duration::from_millis(100), |n| {
            n.out_of_buffer(3).tx_bytes(4_000);
        })
        .expect("step");
        sent += 4_000;
        src.sweep().expect("sweep");
    }
    let after = src.ports();
    let tx = |v: &[stepwise::sources::rdma::PortCounters], i: usize| v[i].transmit_bytes;
    // mlx5_1 (Ext table): 64-bit data, every byte counted.
    assert_eq!(tx(&after, 1) - tx(&before, 1), sent);
    // mlx5_0 (32-bit table) started 1000 words below saturation: it stops there.
    assert_eq!(tx(&after, 0) - tx(&before, 0), 4_000);
    assert_eq!(s.nics()[0].pma_value("port_xmit_data"), u64::from(u32::MAX));
    // out_of_buffer started at 2^32-11 and got +30: the writer wrapped it, the agent added 30.
    for (i, dev) in ["mlx5_0", "mlx5_1"].iter().enumerate() {
        assert_eq!(s.nics()[i].hw_value("out_of_buffer"), 19);
        assert_eq!(src.hw_counter_total(dev, 1, "out_of_buffer"), Some(u64::from(u32::MAX) - 10 + 30), "{dev}");
    }
    // A wrap is not a reset: the only reset-kind events are mlx5_0's port_xmit_data and
    // port_xmit_packets (started at 2^32-11, +1 packet a step) entering saturation.
    assert_eq!(s.nics()[0].pma_value("port_xmit_packets"), u64::from(u32::MAX));
    assert_eq!(error_counts(&errors), vec![("counter_reset", 2)]);
}
