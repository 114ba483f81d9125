//! Sweeps over small mlx5-shaped trees in a tempdir (the full fixtures and the scenario
//! writer live in the tests crate).

use std::{path::Path, time::Duration};

use prometheus_client::registry::Registry;

use super::*;
use crate::sources::{Errors, Selector, Source, SourceContext};

struct Host {
    dir: tempfile::TempDir,
}

impl Host {
    fn new() -> Self {
        Host { dir: tempfile::tempdir().expect("tempdir") }
    }
    fn root(&self) -> &Path {
        self.dir.path()
    }
    fn port(&self, dev: &str) -> std::path::PathBuf {
        self.root().join("class/infiniband").join(dev).join("ports/1")
    }
    /// An mlx5 RoCE port with the Ext PMA table and a few hw_counters.
    fn add_nic(&self, dev: &str, netdev: &str) {
        let p = self.port(dev);
        for d in ["counters", "hw_counters", "gid_attrs/ndevs"] {
            std::fs::create_dir_all(p.join(d)).expect("mkdir");
        }
        self.put(dev, "state", "4: ACTIVE\n");
        self.put(dev, "rate", "400 Gb/sec (4X NDR)\n");
        self.put(dev, "link_layer", "Ethernet\n");
        self.put(dev, "gid_attrs/ndevs/0", &format!("{netdev}\n"));
        for (f, v) in [
            ("port_xmit_data", 100),
            ("port_rcv_data", 50),
            ("port_xmit_packets", 10),
            ("port_rcv_packets", 5),
            ("port_xmit_wait", 0),
            ("unicast_xmit_packets", 10),
        ] {
            self.put(dev, &format!("counters/{f}"), &format!("{v}\n"));
        }
        for (f, v) in [("lifespan", 10), ("out_of_buffer", 0), ("np_cnp_sent", 0), ("local_ack_timeout_err", 0), ("rx_read_requests", 7)] {
            self.put(dev, &format!("hw_counters/{f}"), &format!("{v}\n"));
        }
    }
    fn put(&self, dev: &str, rel: &str, content: &str) {
        let p = self.port(dev).join(rel);
        if p.is_dir() {
            std::fs::remove_dir(&p).expect("rmdir");
        }
        std::fs::write(p, content).expect("write");
    }
    fn source_with(&self, interval: Duration, selector: Selector) -> (RdmaSource, Errors, Registry) {
        let mut reg = Registry::default();
        let errors = Errors::register(&mut reg);
        let ctx = SourceContext {
            sysfs_root: self.root().to_path_buf(),
            selector,
            errors: errors.clone(),
            interval,
            rails: Default::default(),
            owners: Default::default(),
        };
        (RdmaSource::new(ctx, &mut reg), errors, reg)
    }
    fn source(&self) -> (RdmaSource, Errors, Registry) {
        self.source_with(Duration::from_secs(1), Selector::new(&[], &[], true).expect("selector"))
    }
}

fn port<'a>(v: &'a [PortCounters], dev: &str) -> &'a PortCounters {
    v.iter().find(|p| p.device == dev).unwrap_or_else(|| panic!("no port for {dev} in {v:?}"))
}

fn hw(src: &RdmaSource, dev: &str, name: &str) -> u64 {
    src.hw_counter_total(dev, 1, name).unwrap_or_else(|| panic!("no hw counter {name}"))
}

fn text(reg: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, reg).expect("encode");
    out
}

#[test]
fn first_reading_is_the_initial_count_and_data_is_in_words() {
    let h = Host::new();
    h.add_nic("mlx5_0", "eth0");
    let (mut src, errors, reg) = h.source();
    let r = src.sweep().expect("sweep");
    assert_eq!(r.devices, 1);
    assert_eq!(r.skipped, 0);
    let p = src.ports();
    let p0 = port(&p, "mlx5_0");
    assert_eq!((p0.transmit_bytes, p0.receive_bytes, p0.transmit_packets), (400, 200, 10));
    assert_eq!(p0.netdev.as_deref(), Some("eth0"));
    assert!(p0.up && p0.present);
    assert_eq!(p0.rate_bytes_per_second, Some(50e9));
    assert!(p0.read_monotonic_ns > 0 && p0.read_unix_ns > 0);
    h.put("mlx5_0", "counters/port_xmit_data", "350");
    src.sweep().expect("sweep");
    assert_eq!(port(&src.ports(), "mlx5_0").transmit_bytes, 1400, "(350-100) words x4 added");
    let t = text(&reg);
    assert!(t.contains(r#"stepwise_nic_transmit_bytes_total{device="mlx5_0",port="1",netdev="eth0",rail="0"} 1400"#), "{t}");
    assert!(t.contains(r#"stepwise_nic_port_up{device="mlx5_0",port="1",netdev="eth0",rail="0"} 1"#), "{t}");
    assert!(t.contains(r#"stepwise_rdma_hw_stat_total{device="mlx5_0",port="1",counter="rx_read_requests"} 7"#), "{t}");
    assert!(t.contains(r#"stepwise_nic_retransmit_events_total{device="mlx5_0",port="1",netdev="eth0",rail="0",reason="local_ack_timeout_err"} 0"#), "{t}");
    assert!(t.contains(r#"stepwise_rdma_port_stat_packets_total{device="mlx5_0",port="1",counter="unicast_xmit_packets"} 10"#), "{t}");
    assert!(!t.contains(r#"counter="lifespan""#), "lifespan is not a counter: {t}");
    assert_eq!(errors.get("rdma", "counter_reset"), 0);
}

#[test]
fn hw_q_counter_wraps_at_two_to_the_32() {
    let h = Host::new();
    h.add_nic("mlx5_0", "eth0");
    h.put("mlx5_0", "hw_counters/out_of_buffer", &format!("{}\n", u32::MAX - 9));
    let (mut src, errors, _reg) = h.source();
    src.sweep().expect("sweep");
    h.put("mlx5_0", "hw_counters/out_of_buffer", "5\n");
    src.sweep().expect("sweep");
    assert_eq!(hw(&src, "mlx5_0", "out_of_buffer"), u64::from(u32::MAX - 9) + 15);
    assert_eq!(errors.get("rdma", "counter_reset"), 0, "a wrap is not a reset");
}

#[test]
fn cong_counter_decrease_is_a_reset_not_a_wrap() {
    let h = Host::new();
    h.add_nic("mlx5_0", "eth0");
    h.put("mlx5_0", "hw_counters/np_cnp_sent", "1000\n");
    let (mut src, errors, _reg) = h.source();
    src.sweep().expect("sweep");
    h.put("mlx5_0", "hw_counters/np_cnp_sent", "30\n");
    src.sweep().expect("sweep");
    assert_eq!(port(&src.ports(), "mlx5_0").cnp_sent, 1030);
    assert_eq!(errors.get("rdma", "counter_reset"), 1);
}

#[test]
fn pma_32_bit_table_saturates_then_resets() {
    let h = Host::new();
    h.add_nic("mlx5_0", "eth0");
    std::fs::remove_file(h.port("mlx5_0").join("counters/unicast_xmit_packets")).expect("rm");
    let max = u64::from(u32::MAX);
    h.put("mlx5_0", "counters/port_xmit_data", &format!("{}\n", max - 10));
    let (mut src, errors, reg) = h.source();
    src.sweep().expect("sweep");
    h.put("mlx5_0", "counters/port_xmit_data", &format!("{max}\n"));
    src.sweep().expect("sweep");
    assert_eq!(port(&src.ports(), "mlx5_0").transmit_bytes, max * 4);
    assert_eq!(errors.get("rdma", "counter_reset"), 1, "entering saturation is counted once");
    src.sweep().expect("sweep");
    assert_eq!(port(&src.ports(), "mlx5_0").transmit_bytes, max * 4, "stuck: no invented bytes");
    assert_eq!(errors.get("rdma", "counter_reset"), 1);
    h.put("mlx5_0", "counters/port_xmit_data", "3\n");
    src.sweep().expect("sweep");
    assert_eq!(port(&src.ports(), "mlx5_0").transmit_bytes, max * 4 + 12, "after a reset, what was counted since");
    assert_eq!(errors.get("rdma", "counter_reset"), 2);
    // A 16-bit error counter saturates at 65535.
    h.put("mlx5_0", "counters/port_xmit_discards", "65535");
    src.sweep().expect("sweep");
    h.put("mlx5_0", "counters/port_xmit_discards", "65535");
    src.sweep().expect("sweep");
    assert!(text(&reg).contains(r#"stepwise_nic_transmit_discards_total{device="mlx5_0",port="1",netdev="eth0",rail="0"} 65535"#));
}

#[test]
fn ext_table_is_detected_from_unicast_files_or_wide_values() {
    let h = Host::new();
    h.add_nic("mlx5_0", "eth0");
    h.add_nic("mlx5_1", "eth1");
    std::fs::remove_file(h.port("mlx5_1").join("counters/unicast_xmit_packets")).expect("rm");
    // Ext (unicast_* present): 64-bit, a decrease is a reset of the whole value.
    h.put("mlx5_0", "counters/port_rcv_data", "5000000000\n");
    // NOIETF-like: no unicast files, but a value above 2^32-1.
    h.put("mlx5_1", "counters/port_rcv_data", "4294967290\n");
    let (mut src, errors, _reg) = h.source();
    src.sweep().expect("sweep");
    h.put("mlx5_1", "counters/port_rcv_data", "4294967300\n");
    src.sweep().expect("sweep");
    assert_eq!(port(&src.ports(), "mlx5_1").receive_bytes, 4_294_967_300 * 4, "crossing 2^32 is traffic, not saturation");
    assert_eq!(errors.get("rdma", "counter_reset"), 0);
    h.put("mlx5_0", "counters/port_rcv_data", "7\n");
    src.sweep().expect("sweep");
    assert_eq!(port(&src.ports(), "mlx5_0").receive_bytes, (5_000_000_000 + 7) * 4);
    assert_eq!(errors.get("rdma", "counter_reset"), 1);
    assert_eq!(src.status()["devices"][0]["ports"][0]["pma_64bit"], true);
}

#[test]
fn legacy_counters_ext_64_names_are_preferred() {
    let h = Host::new();
    h.add_nic("mlx5_0", "eth0");
    std::fs::create_dir_all(h.port("mlx5_0").join("counters_ext")).expect("mkdir");
    h.put("mlx5_0", "counters_ext/port_xmit_data_64", "9000000000\n");
    h.put("mlx5_0", "counters_ext/port_unicast_xmit_packets", "1\n");
    let (mut src, _errors, reg) = h.source();
    src.sweep().expect("sweep");
    assert_eq!(port(&src.ports(), "mlx5_0").transmit_bytes, 36_000_000_000, "the _64 copy, not the 32-bit one");
    assert!(text(&reg).contains(r#"counter="port_unicast_xmit_packets"} 1"#));
}

#[test]
fn garbage_na_empty_and_unreadable_files_are_counted_never_fatal() {
    let h = Host::new();
    h.add_nic("mlx5_0", "eth0");
    h.put("mlx5_0", "counters/port_xmit_wait", "N/A (no PMA)\n");
    h.put("mlx5_0", "counters/port_rcv_packets", "");
    h.put("mlx5_0", "counters/port_xmit_packets", "12 apples");
    h.put("mlx5_0", "hw_counters/np_cnp_sent", "\u{0}\u{1}");
    std::fs::remove_file(h.port("mlx5_0").join("hw_counters/out_of_buffer")).expect("rm");
    std::fs::create_dir(h.port("mlx5_0").join("hw_counters/out_of_buffer")).expect("mkdir");
    h.put("mlx5_0", "state", "garbage");
    h.put("mlx5_0", "link_layer", "\nEthernet\nInfiniBand\n");
    let (mut src, errors, _reg) = h.source();
    let r = src.sweep().expect("sweep");
    assert_eq!(r.skipped, 6);
    assert_eq!(errors.get("rdma", "not_available"), 1);
    assert_eq!(errors.get("rdma", "parse"), 4, "empty, garbage packets, garbage cnp, garbage state");
    assert_eq!(errors.get("rdma", "read"), 1, "the directory in place of a file");
    let p = src.ports();
    assert_eq!(port(&p, "mlx5_0").transmit_bytes, 400);
    assert_eq!(src.status()["devices"][0]["ports"][0]["link_layer"], "Ethernet");
}

#[test]
fn hw_counters_are_read_no_faster_than_their_lifespan() {
    assert_eq!(hw_every(Duration::from_secs(1), 10), 1);
    assert_eq!(hw_every(Duration::from_millis(10), 10), 1);
    assert_eq!(hw_every(Duration::from_millis(10), 25), 3);
    assert_eq!(hw_every(Duration::from_millis(100), 10_000), 100);
    assert_eq!(hw_every(Duration::from_millis(100), 0), 1);
    let h = Host::new();
    h.add_nic("mlx5_0", "eth0");
    h.put("mlx5_0", "hw_counters/lifespan", "30\n");
    // A counter attribution reads (out_of_buffer), so it is not also paced to once a second.
    h.put("mlx5_0", "hw_counters/out_of_buffer", "7\n");
    let (mut src, _e, _r) = h.source_with(Duration::from_millis(10), Selector::new(&[], &[], true).expect("sel"));
    src.sweep().expect("sweep"); // reads hw (sweep 0)
    let mut seen = Vec::new();
    for i in 1..=6u64 {
        h.put("mlx5_0", "hw_counters/out_of_buffer", &format!("{}\n", 7 + i));
        src.sweep().expect("sweep");
        seen.push(hw(&src, "mlx5_0", "out_of_buffer"));
    }
    assert_eq!(seen, vec![7, 7, 10, 10, 10, 13], "hw_counters read on sweeps 0, 3, 6 only");
    assert_eq!(src.status()["devices"][0]["ports"][0]["hw_counters_every_sweeps"], 3);
}

#[test]
fn vanished_device_keeps_its_series_and_reappearing_is_a_reset() {
    let h = Host::new();
    h.add_nic("mlx5_0", "eth0");
    h.add_nic("mlx5_1", "eth1");
    let (mut src, errors, reg) = h.source();
    src.sweep().expect("sweep");
    let saved = h.root().join("saved");
    std::fs::rename(h.root().join("class/infiniband/mlx5_1"), &saved).expect("mv");
    let r = src.sweep().expect("sweep");
    assert_eq!(r.devices, 1);
    assert_eq!(errors.get("rdma", "vanished"), 1);
    src.sweep().expect("sweep");
    assert_eq!(errors.get("rdma", "vanished"), 1, "counted once");
    let p = src.ports();
    assert!(!port(&p, "mlx5_1").present && !port(&p, "mlx5_1").up);
    assert_eq!(port(&p, "mlx5_1").transmit_bytes, 400);
    let t = text(&reg);
    assert!(t.contains(r#"stepwise_nic_transmit_bytes_total{device="mlx5_1",port="1",netdev="eth1",rail="1"} 400"#), "{t}");
    assert!(t.contains(r#"stepwise_nic_port_up{device="mlx5_1",port="1",netdev="eth1",rail="1"} 0"#), "{t}");
    // It comes back after a driver reload with counters cleared.
    std::fs::rename(&saved, h.root().join("class/infiniband/mlx5_1")).expect("mv back");
    h.put("mlx5_1", "counters/port_xmit_data", "2\n");
    src.sweep().expect("sweep");
    assert_eq!(port(&src.ports(), "mlx5_1").transmit_bytes, 408, "never backwards: 400 + 2 words");
    assert!(port(&src.ports(), "mlx5_1").present);
}

#[test]
fn excluded_devices_are_not_read() {
    let h = Host::new();
    h.add_nic("mlx5_0", "eth0");
    h.add_nic("mlx5_1", "eth1");
    let sel = Selector::new(&[], &["mlx5_1".to_string()], true).expect("sel");
    let (mut src, _e, _r) = h.source_with(Duration::from_secs(1), sel);
    let r = src.sweep().expect("sweep");
    assert_eq!(r.devices, 1);
    assert_eq!(src.ports().len(), 1);
    assert_eq!(src.status()["devices"][1]["mode"], "excluded");
}

#[test]
fn probe_safe_stops_reading_a_restricted_function() {
    let h = Host::new();
    h.add_nic("mlx5_0", "eth0");
    h.add_nic("mlx5_1", "eth1");
    // A restricted function: every counter read fails (here EISDIR; EIO on real hardware).
    for g in ["counters", "hw_counters"] {
        let d = h.port("mlx5_1").join(g);
        for e in std::fs::read_dir(&d).expect("ls").flatten() {
            std::fs::remove_file(e.path()).expect("rm");
            std::fs::create_dir(e.path()).expect("mkdir");
        }
    }
    let (mut src, errors, _r) = h.source();
    src.sweep().expect("sweep");
    let after_one = errors.get("rdma", "read");
    assert!(after_one >= 9, "{after_one}");
    src.sweep().expect("sweep");
    assert_eq!(errors.get("rdma", "probe_safe_skip"), 1);
    let before = errors.get("rdma", "read");
    let r = src.sweep().expect("sweep");
    assert_eq!(errors.get("rdma", "read"), before, "no more reads of the restricted function");
    assert_eq!(r.devices, 1, "the healthy one is still read");
    assert_eq!(errors.get("rdma", "probe_safe_skip"), 1, "counted once");
}

#[test]
fn generic_counter_names_are_capped() {
    let h = Host::new();
    h.add_nic("mlx5_0", "eth0");
    for i in 0..300 {
        h.put("mlx5_0", &format!("hw_counters/x_{i:03}"), "1\n");
    }
    let (mut src, errors, reg) = h.source();
    src.sweep().expect("sweep");
    let t = text(&reg);
    let series = t.lines().filter(|l| l.starts_with("stepwise_rdma_hw_stat") || l.starts_with("stepwise_rdma_port_stat")).count();
    assert_eq!(series, MAX_COUNTER_NAMES);
    // 1 PMA generic (unicast_xmit_packets) + 1 hw generic (rx_read_requests) + 300 new names.
    assert_eq!(errors.get("rdma", KIND_CARDINALITY), 302 - MAX_COUNTER_NAMES as u64);
}

#[test]
fn missing_class_dir_is_absent_not_down_and_not_a_panic() {
    let h = Host::new();
    let (mut src, _e, _r) = h.source();
    let e = src.sweep().expect_err("no class/infiniband");
    assert!(e.to_string().contains("class/infiniband"), "{e}");
    // Absent (the sampler exports source_up 1, devices 0), not a failure.
    assert!(e.is_absent(), "{e:?}");
    // Once a device appears the source sweeps it.
    h.add_nic("mlx5_0", "eth0");
    assert_eq!(src.sweep().expect("sweep").devices, 1);
}

/// Replaces a file the way the scenario writer does: a temp file renamed over it.
fn replace(h: &Host, dev: &str, rel: &str, content: &str) {
    let tmp = h.root().join("tmp-replace");
    std::fs::write(&tmp, content).expect("write tmp");
    std::fs::rename(&tmp, h.port(dev).join(rel)).expect("rename");
}

#[test]
fn a_file_replaced_by_rename_between_sweeps_is_read_anew() {
    let h = Host::new();
    h.add_nic("mlx5_0", "eth0");
    let (mut src, errors, _reg) = h.source();
    src.sweep().expect("sweep");
    let open = src.open_files();
    assert!(open > 10, "files stay open between sweeps: {open}");
    replace(&h, "mlx5_0", "counters/port_xmit_data", "350\n");
    src.sweep().expect("sweep");
    assert_eq!(port(&src.ports(), "mlx5_0").transmit_bytes, 1400, "the new file, not the old inode");
    // Renames in quick succession land in the same timestamp tick of the directory: each must
    // still be seen by the next sweep (a young stamp is not trusted).
    for i in 1..=50u64 {
        replace(&h, "mlx5_0", "counters/port_xmit_data", &format!("{}\n", 350 + i));
        replace(&h, "mlx5_0", "hw_counters/rx_read_requests", &format!("{}\n", 7 + i));
        replace(&h, "mlx5_0", "state", if i % 2 == 0 { "4: ACTIVE\n" } else { "1: DOWN\n" });
        src.sweep().expect("sweep");
        let p = port(&src.ports(), "mlx5_0").clone();
        assert_eq!(p.transmit_bytes, (350 + i) * 4, "sweep {i}");
        assert_eq!(p.up, i % 2 == 0, "sweep {i}");
        assert_eq!(hw(&src, "mlx5_0", "rx_read_requests"), 7 + i, "sweep {i}");
    }
    // A file added to a counter directory is picked up, one removed is no longer read.
    replace(&h, "mlx5_0", "hw_counters/rx_atomic_requests", "3\n");
    std::fs::remove_file(h.port("mlx5_0").join("counters/unicast_xmit_packets")).expect("rm");
    let r = src.sweep().expect("sweep");
    assert_eq!(hw(&src, "mlx5_0", "rx_atomic_requests"), 3);
    assert_eq!(r.skipped, 0);
    assert_eq!(src.status()["devices"][0]["ports"][0]["groups"]["counters"]["read"], 5);
    assert_eq!(errors.get("rdma", "read"), 0);
    assert_eq!(errors.get("rdma", "counter_reset"), 0);
    assert_eq!(src.open_files(), open, "replaced files are reopened, not leaked");
}

#[test]
fn a_removed_device_directory_vanishes_and_its_files_close() {
    let h = Host::new();
    h.add_nic("mlx5_0", "eth0");
    h.add_nic("mlx5_1", "eth1");
    let (mut src, errors, reg) = h.source();
    src.sweep().expect("sweep");
    src.sweep().expect("sweep");
    let open = src.open_files();
    std::fs::remove_dir_all(h.root().join("class/infiniband/mlx5_1")).expect("rm -r");
    let r = src.sweep().expect("sweep");
    assert_eq!(r.devices, 1);
    assert_eq!(errors.get("rdma", "vanished"), 1);
    assert_eq!(errors.get("rdma", "read"), 0, "a vanished device is not a read error");
    let p = src.ports();
    assert!(!port(&p, "mlx5_1").present && !port(&p, "mlx5_1").up);
    assert_eq!(port(&p, "mlx5_1").transmit_bytes, 400, "its counters keep their last values");
    assert!(text(&reg).contains(r#"stepwise_nic_port_up{device="mlx5_1",port="1",netdev="eth1",rail="1"} 0"#));
    assert!(src.open_files() < open, "its descriptors are closed: {} of {open}", src.open_files());
    // Removed and created again between two sweeps (driver reload): the old descriptors point
    // at deleted files; the new files are read and the drop is a reset, never backwards.
    std::fs::remove_dir_all(h.root().join("class/infiniband/mlx5_0")).expect("rm -r");
    h.add_nic("mlx5_0", "eth0");
    h.put("mlx5_0", "counters/port_xmit_data", "2\n");
    let r = src.sweep().expect("sweep");
    assert_eq!(r.devices, 1);
    assert_eq!(port(&src.ports(), "mlx5_0").transmit_bytes, 408, "400 + 2 words");
    assert_eq!(errors.get("rdma", "vanished"), 1, "listed in both sweeps: not vanished");
    assert_eq!(errors.get("rdma", "counter_reset"), 1);
}

#[test]
fn files_over_the_descriptor_budget_are_opened_for_each_read() {
    let h = Host::new();
    h.add_nic("mlx5_0", "eth0");
    h.add_nic("mlx5_1", "eth1");
    let (mut src, errors, _reg) = h.source();
    src.budget = files::Budget::with_limit(6);
    src.sweep().expect("sweep");
    replace(&h, "mlx5_1", "counters/port_xmit_data", "350\n");
    h.put("mlx5_0", "counters/port_rcv_data", "60\n");
    src.sweep().expect("sweep");
    let p = src.ports();
    assert_eq!(port(&p, "mlx5_1").transmit_bytes, 1400);
    assert_eq!(port(&p, "mlx5_0").receive_bytes, 240);
    assert_eq!(errors.get("rdma", "read"), 0);
    // Directories count too: a port (or a device's ports directory) that does not fit is
    // closed after its sweep (500 devices under `ulimit -n 1024` ran out of descriptors).
    assert!(src.open_files() <= 6, "at most the budget, directories included: {}", src.open_files());
}

#[test]
fn a_bogus_data_reading_is_a_glitch_and_the_series_continues() {
    let h = Host::new();
    h.add_nic("mlx5_0", "eth0");
    let (mut src, errors, reg) = h.source();
    src.sweep().expect("sweep");
    // The issue's reading: 2^64 − 11 words, then back to 1000 and 2000.
    for (v, want) in [("18446744073709551605", 400), ("1000", 4000), ("2000", 8000)] {
        h.put("mlx5_0", "counters/port_xmit_data", v);
        src.sweep().expect("sweep");
        assert_eq!(port(&src.ports(), "mlx5_0").transmit_bytes, want, "after {v}");
    }
    assert_eq!(errors.get("rdma", "counter_glitch"), 1);
    assert_eq!(errors.get("rdma", "counter_reset"), 0, "back to 1000 is the series going on, not a reset");
    let t = text(&reg);
    assert!(t.contains(r#"stepwise_nic_transmit_bytes_total{device="mlx5_0",port="1",netdev="eth0",rail="0"} 8000"#), "{t}");
    assert!(t.contains(r#"stepwise_errors_total{source="rdma",kind="counter_glitch"} 1"#), "{t}");
}

#[test]
fn a_32_bit_hw_counter_at_two_to_the_64_is_a_glitch_not_an_increase() {
    let h = Host::new();
    h.add_nic("mlx5_0", "eth0");
    h.put("mlx5_0", "hw_counters/out_of_buffer", "10\n");
    let (mut src, errors, _reg) = h.source();
    src.sweep().expect("sweep");
    h.put("mlx5_0", "hw_counters/out_of_buffer", &format!("{}\n", u64::MAX));
    src.sweep().expect("sweep");
    assert_eq!(hw(&src, "mlx5_0", "out_of_buffer"), 10);
    h.put("mlx5_0", "hw_counters/out_of_buffer", "12\n");
    src.sweep().expect("sweep");
    assert_eq!(hw(&src, "mlx5_0", "out_of_buffer"), 12);
    assert_eq!(errors.get("rdma", "counter_glitch"), 1);
}

#[test]
fn a_fifo_in_place_of_a_counter_is_a_failed_read_and_the_sweep_goes_on() {
    let h = Host::new();
    h.add_nic("mlx5_0", "eth0");
    h.add_nic("mlx5_1", "eth1");
    let fifo = h.port("mlx5_1").join("counters/port_rcv_data");
    std::fs::remove_file(&fifo).expect("rm");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let (mut src, errors, _reg) = h.source();
    // A blocking open would wait here forever for a writer.
    for _ in 0..2 {
        let r = src.sweep().expect("sweep");
        assert_eq!(r.devices, 2);
        assert!(r.skipped >= 1, "{r:?}");
    }
    h.put("mlx5_0", "counters/port_xmit_data", "200");
    src.sweep().expect("sweep");
    assert_eq!(port(&src.ports(), "mlx5_0").transmit_bytes, 800, "the other device is still swept");
    assert_eq!(port(&src.ports(), "mlx5_1").transmit_bytes, 400, "and the rest of this one");
    assert!(errors.get("rdma", "read") >= 3);
}

#[test]
fn metric_only_counters_and_the_rate_are_read_once_a_period_attribution_counters_every_sweep() {
    let h = Host::new();
    h.add_nic("mlx5_0", "eth0");
    // 100 ms: the metric-only files are due every 10 sweeps (METRICS_PERIOD).
    let (mut src, errors, _r) = h.source_with(Duration::from_millis(100), Selector::new(&[], &[], true).expect("sel"));
    src.sweep().expect("sweep 0 reads everything");
    let rate = |s: &RdmaSource| s.status()["devices"][0]["ports"][0]["rate_bytes_per_second"].as_f64();
    let rate0 = rate(&src);
    let (mut generic, mut typed, mut rates) = (Vec::new(), Vec::new(), Vec::new());
    for i in 1..=11u64 {
        h.put("mlx5_0", "hw_counters/rx_read_requests", &format!("{}\n", 7 + i));
        h.put("mlx5_0", "counters/port_xmit_data", &format!("{}\n", 100 + i));
        if i == 2 {
            h.put("mlx5_0", "rate", "200 Gb/sec (4X HDR)\n");
        }
        if i == 4 {
            // A state change makes the rate due at the next sweep.
            h.put("mlx5_0", "state", "1: DOWN\n");
            h.put("mlx5_0", "rate", "100 Gb/sec (4X EDR)\n");
        }
        src.sweep().expect("sweep");
        generic.push(hw(&src, "mlx5_0", "rx_read_requests"));
        typed.push(port(&src.ports(), "mlx5_0").transmit_bytes);
        rates.push(rate(&src).map(|r| r * 8.0 / 1e9));
    }
    assert_eq!(generic, vec![7, 7, 7, 7, 7, 7, 7, 7, 7, 17, 17], "rx_read_requests read on sweeps 0 and 10 only");
    assert_eq!(typed, (1..=11).map(|i| 4 * (100 + i)).collect::<Vec<u64>>(), "port_xmit_data read every sweep");
    assert_eq!(rate0.map(|r| r * 8.0 / 1e9), Some(400.0));
    let g = |x: f64| Some(x);
    assert_eq!(rates, vec![g(400.0), g(400.0), g(400.0), g(400.0), g(100.0), g(100.0), g(100.0), g(100.0), g(100.0), g(100.0), g(100.0)]);
    assert!(!port(&src.ports(), "mlx5_0").up, "state is read every sweep");
    assert_eq!(errors.get("rdma", "read"), 0, "an unread file is not a failed read");
    assert_eq!(errors.get("rdma", "counter_reset"), 0);
}

#[test]
fn the_fast_lane_reads_the_attribution_counters_of_the_named_ports_only() {
    let h = Host::new();
    h.add_nic("mlx5_0", "eth0");
    h.add_nic("mlx5_1", "eth1");
    let (mut src, _e, _r) = h.source();
    src.sweep().expect("sweep");
    for dev in ["mlx5_0", "mlx5_1"] {
        h.put(dev, "counters/port_xmit_data", "350\n");
        h.put(dev, "counters/port_xmit_wait", "9\n");
        h.put(dev, "hw_counters/np_cnp_sent", "5\n");
    }
    let nics: std::collections::BTreeSet<String> = ["eth0".to_string()].into();
    assert!(src.fast_sweep(&nics), "eth0 read");
    let p = src.ports();
    let (a, b) = (port(&p, "mlx5_0"), port(&p, "mlx5_1"));
    assert_eq!((a.transmit_bytes, a.transmit_wait_ticks), (1400, 9), "eth0's data and transmit wait, read by the fast lane");
    assert_eq!(a.cnp_sent, 0, "hw_counters wait for the full sweep (their cache lifetime)");
    assert_eq!((b.transmit_bytes, b.transmit_wait_ticks), (400, 0), "eth1 is not the job's: not read");
    assert!(!src.fast_sweep(&["eth9".to_string()].into()), "no such port: nothing read");
    src.sweep().expect("sweep");
    let p = src.ports();
    assert_eq!((port(&p, "mlx5_0").cnp_sent, port(&p, "mlx5_1").transmit_bytes), (5, 1400));
}
