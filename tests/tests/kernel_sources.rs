//! Real-kernel tests of the ethtool, netdev and qdisc sources: network namespaces joined by
//! veth pairs (198.18.0.0/15 only), UDP traffic between them, a TBF qdisc driven into drops,
//! and a veth deleted and re-created while it is sampled. Needs root and iproute2/ethtool;
//! a missing tool fails the test with its name.

use std::{
    net::{Ipv4Addr, UdpSocket},
    path::Path,
    sync::atomic::{AtomicBool, AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use prometheus_client::registry::Registry;
use stepwise::sources::{
    ethtool::{ioctl::EthtoolSocket, EthtoolSource},
    kind,
    netdev::{NetdevSnapshot, NetdevSource},
    qdisc::{QdiscSnapshot, QdiscSource},
    Errors, Selector, Source, SourceContext,
};
use stepwise_tests::netns::{sysfs_stat, Netns, Veth};

const PORT: u16 = 5201;
/// UDP payload + UDP (8) + IPv4 (20) + Ethernet (14) headers: what veth counts per datagram.
const WIRE_OVERHEAD: u64 = 42;

fn ctx(sysfs: &Path) -> SourceContext {
    SourceContext {
        sysfs_root: sysfs.to_path_buf(),
        selector: Selector::new(&[], &[], false).expect("selector"),
        errors: Errors::default(),
        interval: Duration::from_millis(100),
        rails: Default::default(),
        owners: Default::default(),
    }
}

/// Two namespaces joined by `swa0` (in a) ↔ `swb0` (in b).
fn two_hosts() -> (Netns, Netns, Veth) {
    let a = Netns::new().expect("create namespace a");
    let b = Netns::new().expect("create namespace b");
    let v = Veth::new(&a, "swa0", &b, "swb0").expect("create veth pair");
    (a, b, v)
}

fn netdev(src: &NetdevSource, name: &str) -> NetdevSnapshot {
    src.snapshot().into_iter().find(|s| s.netdev == name).unwrap_or_else(|| panic!("{name} not in netdev snapshot: {:?}", src.snapshot()))
}

fn udp_in(ns: &Netns, addr: Ipv4Addr, port: u16) -> UdpSocket {
    ns.run(|_| UdpSocket::bind((addr, port))).unwrap_or_else(|e| panic!("bind {addr}:{port} in {}: {e}", ns.name()))
}

fn encode(reg: &Registry) -> String {
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, reg).expect("encode metrics");
    s
}

#[test]
fn netdev_bytes_match_udp_traffic_between_namespaces() {
    let (a, b, v) = two_hosts();
    let rx = udp_in(&b, v.b_addr, PORT);
    rx.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
    let tx = udp_in(&a, Ipv4Addr::UNSPECIFIED, 0);
    // Resolve ARP first so the measured window holds only our datagrams.
    tx.send_to(b"warm-up", (v.b_addr, PORT)).expect("send warm-up");
    let mut buf = [0u8; 2048];
    rx.recv(&mut buf).expect("warm-up datagram must arrive through the veth");

    let (mut reg_a, mut reg_b) = (Registry::default(), Registry::default());
    let mut na = NetdevSource::new(ctx(a.sysfs()), &mut reg_a);
    let mut nb = NetdevSource::new(ctx(b.sysfs()), &mut reg_b);
    // Operstate follows carrier through the kernel's linkwatch work, up to a second late.
    let deadline = Instant::now() + Duration::from_secs(5);
    let (before_a, before_b) = loop {
        a.run(|_| na.sweep()).expect("sweep a");
        b.run(|_| nb.sweep()).expect("sweep b");
        let (sa, sb) = (netdev(&na, "swa0"), netdev(&nb, "swb0"));
        if sa.up && sb.up {
            break (sa, sb);
        }
        assert!(Instant::now() < deadline, "both ends must come up: {sa:?} {sb:?}");
        std::thread::sleep(Duration::from_millis(50));
    };

    const N: u64 = 200;
    const SIZE: usize = 1000;
    let payload = vec![0x5au8; SIZE];
    let mut received = 0;
    for _ in 0..N {
        tx.send_to(&payload, (v.b_addr, PORT)).expect("send");
        // One at a time: nothing is lost to socket buffers, so all N cross the veth.
        if rx.recv(&mut buf).expect("datagram must arrive") == SIZE {
            received += 1;
        }
    }
    assert_eq!(received, N);
    a.run(|_| na.sweep()).expect("sweep a");
    b.run(|_| nb.sweep()).expect("sweep b");
    let (after_a, after_b) = (netdev(&na, "swa0"), netdev(&nb, "swb0"));

    let wire = N * (SIZE as u64 + WIRE_OVERHEAD);
    let slack = 16 * 1024; // ARP refreshes at most
    let tx_delta = after_a.transmit_bytes - before_a.transmit_bytes;
    let rx_delta = after_b.receive_bytes - before_b.receive_bytes;
    eprintln!("sent {N} × {SIZE} B = {wire} B on the wire; netdev tx Δ {tx_delta} B (swa0), rx Δ {rx_delta} B (swb0)");
    assert!((wire..=wire + slack).contains(&tx_delta), "swa0 transmit_bytes delta {tx_delta}, expected {wire}..{}", wire + slack);
    assert!((wire..=wire + slack).contains(&rx_delta), "swb0 receive_bytes delta {rx_delta}, expected {wire}..{}", wire + slack);
    let tx_pkts = after_a.transmit_packets - before_a.transmit_packets;
    assert!((N..=N + 8).contains(&tx_pkts), "swa0 transmit_packets delta {tx_pkts}");
    assert_eq!(after_a.transmit_drops + after_b.receive_drops, 0);

    // First reading = the kernel's value, so the accumulated counter equals the kernel's
    // own counter (read just after, so it may only be ahead).
    let kernel_tx = a.run(|sys| sysfs_stat(sys, "swa0", "tx_bytes")).expect("sysfs tx_bytes");
    assert!(kernel_tx >= after_a.transmit_bytes && kernel_tx - after_a.transmit_bytes <= slack, "kernel {kernel_tx} vs ours {}", after_a.transmit_bytes);
    let text = encode(&reg_a);
    assert!(text.contains(&format!("stepwise_netdev_transmit_bytes_total{{netdev=\"swa0\"}} {}", after_a.transmit_bytes)), "{text}");
    assert!(text.contains("stepwise_netdev_up{netdev=\"swa0\"} 1"), "{text}");
    assert!(!text.contains("netdev=\"lo\""), "lo is not a NIC: {text}");
}

/// `ethtool -S DEV` → (name, value) in order.
fn parse_ethtool_s(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .skip_while(|l| !l.starts_with("NIC statistics:"))
        .skip(1)
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(':')?;
            Some((name.trim().to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

#[test]
fn ethtool_ioctl_on_veth_matches_ethtool_dash_s() {
    let (a, b, _v) = two_hosts();
    a.ip(&["link", "add", "swbr0", "type", "bridge"]).expect("add bridge");
    let ours = a.run(|_| EthtoolSocket::new().and_then(|s| s.driver_stats("swa0"))).expect("SIOCETHTOOL on swa0");
    let theirs = parse_ethtool_s(&a.exec("ethtool", &["-S", "swa0"]).expect("ethtool -S swa0"));
    eprintln!("veth driver stats via ioctl: {} names, e.g. {:?}", ours.len(), ours.iter().take(3).collect::<Vec<_>>());
    assert!(!theirs.is_empty(), "ethtool -S printed no statistics");
    assert_eq!(ours, theirs, "ioctl and ethtool -S disagree");
    let peer = ours.iter().find(|(n, _)| n == "peer_ifindex").map(|(_, v)| *v).expect("veth reports peer_ifindex");
    let swb0 = b.run(|sys| std::fs::read_to_string(sys.join("class/net/swb0/ifindex"))).expect("swb0 ifindex");
    assert_eq!(peer.to_string(), swb0.trim(), "peer_ifindex is swb0's ifindex");
    assert!(ours.iter().any(|(n, _)| n.starts_with("rx_queue_0_")), "{ours:?}");
    let driver = a.run(|_| EthtoolSocket::new().and_then(|s| s.driver_info("swa0"))).expect("GDRVINFO");
    assert_eq!(driver.0, "veth");

    let mut reg = Registry::default();
    let c = ctx(a.sysfs());
    let mut src = EthtoolSource::new(c.clone(), &mut reg);
    for _ in 0..3 {
        let r = a.run(|_| src.sweep()).expect("ethtool sweep");
        assert_eq!((r.devices, r.values), (1, ours.len()), "swa0 read, swbr0 skipped: {r:?}");
    }
    let status = src.status();
    let devs = status["netdevs"].as_array().expect("netdevs");
    let swa0 = devs.iter().find(|d| d["netdev"] == "swa0").expect("swa0 in status");
    assert_eq!(swa0["driver"], "veth");
    assert_eq!(swa0["statistics"], ours.len());
    assert_eq!(swa0["per_queue_not_exported"], ours.len() - 1, "all but peer_ifindex are per-queue");
    let br = devs.iter().find(|d| d["netdev"] == "swbr0").expect("swbr0 in status");
    assert_eq!(br["note"], "driver bridge has no driver statistics", "{status}");
    assert_eq!(c.errors.get("ethtool", kind::NOT_AVAILABLE), 1, "reported once, not every sweep");
    assert_eq!(c.errors.get("ethtool", kind::IOCTL), 0);
    let snap = src.snapshot();
    assert!(snap.iter().any(|s| s.netdev == "swa0" && s.driver == "veth" && s.fields.is_empty()), "veth has no typed fields: {snap:?}");
    let text = encode(&reg);
    assert!(!text.contains("rx_queue_0") && !text.contains("peer_ifindex"), "per-queue and non-counter names are not exported: {text}");

    // A sysfs tree whose netdev is not in the agent's namespace (a fixture, another netns):
    // said once in status and errors, not every sweep.
    let fake = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(fake.path().join("class/net/ghost0")).expect("mkdir");
    let c2 = ctx(fake.path());
    let mut ghost = EthtoolSource::new(c2.clone(), &mut Registry::default());
    for _ in 0..3 {
        let r = a.run(|_| ghost.sweep()).expect("sweep");
        assert_eq!((r.devices, r.skipped), (0, 1));
    }
    assert_eq!(c2.errors.get("ethtool", kind::NOT_AVAILABLE), 1);
    assert_eq!(c2.errors.get("ethtool", kind::IOCTL), 0);
    let st = ghost.status();
    assert_eq!(st["netdevs"][0]["note"], "ghost0 is not in the agent's network namespace (ENODEV)", "{st}");
}

fn tbf(snaps: &[QdiscSnapshot]) -> Option<&QdiscSnapshot> {
    snaps.iter().find(|q| q.netdev == "swa0" && q.kind == "tbf" && q.parent == "root")
}

#[test]
fn tbf_qdisc_backlog_and_drops_under_a_udp_burst() {
    let (a, _b, v) = two_hosts();
    a.tbf("swa0", "1mbit", "5kb", "20kb").expect("add tbf");
    let tx = udp_in(&a, Ipv4Addr::UNSPECIFIED, 0);
    tx.send_to(b"warm-up", (v.b_addr, PORT)).expect("warm-up");
    std::thread::sleep(Duration::from_millis(100));
    tx.set_nonblocking(true).expect("nonblocking");

    let mut reg = Registry::default();
    let c = ctx(a.sysfs());
    let mut q = QdiscSource::new(c.clone(), &mut reg);
    a.run(|_| q.sweep()).expect("qdisc sweep");
    let before = tbf(&q.snapshot()).cloned().expect("tbf root qdisc on swa0 seen");

    const N: usize = 400;
    let payload = vec![0u8; 1200];
    let mut accepted = 0;
    for _ in 0..N {
        // Drops at the qdisc are not errors to a UDP sender; a full send buffer may be.
        if tx.send_to(&payload, (v.b_addr, PORT)).is_ok() {
            accepted += 1;
        }
    }
    let mut max_backlog = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        a.run(|_| q.sweep()).expect("qdisc sweep");
        let s = tbf(&q.snapshot()).cloned().expect("tbf");
        max_backlog = max_backlog.max((s.backlog_bytes, s.backlog_packets));
        if s.backlog_packets == 0 || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let after = tbf(&q.snapshot()).cloned().expect("tbf");
    let (drops, overlimits) = (after.drops - before.drops, after.overlimits - before.overlimits);
    eprintln!(
        "{accepted}/{N} datagrams accepted by the socket; tbf drops Δ {drops}, overlimits Δ {overlimits}, max backlog seen {} B / {} pkts, sent Δ {} B",
        max_backlog.0,
        max_backlog.1,
        after.bytes - before.bytes
    );
    assert!(drops > 0, "a 480 kB burst into a 20 kB TBF must drop: {after:?}");
    assert!(max_backlog.0 > 0 || overlimits > 0, "backlog or overlimits must show: {after:?}");
    assert!(after.bytes - before.bytes < 120_000, "1 Mbit/s for at most 3 s + burst cannot send {} B", after.bytes - before.bytes);

    // The kernel's own view (tc -s -j) agrees with the accumulated counters, since the first
    // reading was the initial value.
    let json = a.tc(&["-s", "-j", "qdisc", "show", "dev", "swa0"]).expect("tc -s -j qdisc show");
    let list: serde_json::Value = serde_json::from_str(&json).expect("tc json");
    let k = list.as_array().and_then(|l| l.iter().find(|q| q["kind"] == "tbf")).expect("tbf in tc output");
    assert_eq!(k["drops"].as_u64(), Some(after.drops), "tc drops vs ours: {k}");
    assert_eq!(k["overlimits"].as_u64(), Some(after.overlimits), "tc overlimits vs ours: {k}");
    assert_eq!(k["bytes"].as_u64(), Some(after.bytes), "tc bytes vs ours: {k}");
    assert_eq!(format!("{}:", k["handle"].as_str().unwrap_or("?").trim_end_matches(':')), after.handle);
    let text = encode(&reg);
    assert!(
        text.contains(&format!("stepwise_qdisc_drops_total{{netdev=\"swa0\",kind=\"tbf\",handle=\"{}\",parent=\"root\"}} {}", after.handle, after.drops)),
        "{text}"
    );
    assert!(text.contains("stepwise_qdisc_backlog_bytes{"), "{text}");
    assert_eq!(c.errors.get("qdisc", kind::NETLINK) + c.errors.get("qdisc", kind::PARSE), 0);
}

#[test]
fn veth_deleted_and_recreated_while_sampled_never_goes_backwards() {
    let (a, b, v) = two_hosts();
    let tx = udp_in(&a, Ipv4Addr::UNSPECIFIED, 0);
    let c = ctx(a.sysfs());
    let mut reg = Registry::default();
    let mut nd = NetdevSource::new(c.clone(), &mut reg);
    let mut et = EthtoolSource::new(c.clone(), &mut reg);
    let mut qd = QdiscSource::new(c.clone(), &mut reg);
    let sweeps = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    // Set when the sampler ends for any reason, so a failed assertion in it surfaces as
    // itself (through join) instead of as a stall here.
    let sampler_done = AtomicBool::new(false);
    struct Done<'a>(&'a AtomicBool);
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    const ROUNDS: usize = 3;

    let wait_sweeps = |n: usize| {
        let target = sweeps.load(Ordering::SeqCst) + n;
        let deadline = Instant::now() + Duration::from_secs(20);
        while sweeps.load(Ordering::SeqCst) < target && !sampler_done.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "sampler stalled");
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    let send = |n: usize| {
        for _ in 0..n {
            let _ = tx.send_to(&[1u8; 500], (v.b_addr, PORT));
        }
    };

    let last_sent = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let _done = Done(&sampler_done);
            a.run(|_| {
                let mut prev_nd: Option<NetdevSnapshot> = None;
                let mut prev_q: Vec<QdiscSnapshot> = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    nd.sweep().expect("netdev sweep never fails on re-creation");
                    et.sweep().expect("ethtool sweep never fails on re-creation");
                    qd.sweep().expect("qdisc sweep never fails on re-creation");
                    if let Some(cur) = nd.snapshot().into_iter().find(|s| s.netdev == "swa0") {
                        if let Some(p) = &prev_nd {
                            for (name, was, now) in [
                                ("tx bytes", p.transmit_bytes, cur.transmit_bytes),
                                ("rx bytes", p.receive_bytes, cur.receive_bytes),
                                ("tx packets", p.transmit_packets, cur.transmit_packets),
                                ("rx packets", p.receive_packets, cur.receive_packets),
                            ] {
                                assert!(now >= was, "netdev {name} went backwards: {was} → {now}");
                            }
                        }
                        prev_nd = Some(cur);
                    }
                    let qs = qd.snapshot();
                    for p in &prev_q {
                        if let Some(q) = qs.iter().find(|q| (&q.netdev, &q.kind, &q.handle, &q.parent) == (&p.netdev, &p.kind, &p.handle, &p.parent)) {
                            assert!(q.bytes >= p.bytes && q.packets >= p.packets && q.drops >= p.drops, "qdisc went backwards: {p:?} → {q:?}");
                        }
                    }
                    prev_q = qs;
                    sweeps.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        });
        wait_sweeps(2);
        for round in 0..ROUNDS {
            send(50);
            wait_sweeps(2);
            v.delete(&a).expect("delete veth");
            if round % 2 == 0 {
                // Seen gone for a while…
                wait_sweeps(2);
            } // …or replaced between two sweeps (the new ifindex tells).
            v.create(&a, &b).expect("re-create veth");
            a.tbf("swa0", "100mbit", "64kb", "1mb").expect("tbf on the new veth");
            wait_sweeps(2);
        }
        send(100);
        wait_sweeps(3);
        stop.store(true, Ordering::SeqCst);
        sampler.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        100 * (500 + WIRE_OVERHEAD)
    });

    let now = netdev(&nd, "swa0");
    let ifindex = a.run(|sys| std::fs::read_to_string(sys.join("class/net/swa0/ifindex"))).expect("ifindex");
    assert_eq!(now.ifindex.to_string(), ifindex.trim(), "tracks the newest interface");
    assert!(now.transmit_bytes >= last_sent, "at least the last incarnation's traffic: {now:?}");
    let vanished = c.errors.get("netdev", kind::VANISHED);
    eprintln!(
        "{} sweeps; errors: netdev vanished {vanished}, ethtool vanished {} ioctl {}, qdisc vanished {}; swa0 tx {} B over {ROUNDS} re-creations",
        sweeps.load(Ordering::SeqCst),
        c.errors.get("ethtool", kind::VANISHED),
        c.errors.get("ethtool", kind::IOCTL),
        c.errors.get("qdisc", kind::VANISHED),
        now.transmit_bytes
    );
    assert_eq!(vanished, ROUNDS as u64, "each deletion counted once, seen gone or replaced");
    assert!(c.errors.get("ethtool", kind::VANISHED) >= 1);
    assert!(c.errors.get("qdisc", kind::VANISHED) >= ROUNDS as u64, "each TBF and veth noqueue replaced");
    assert_eq!(c.errors.get("netdev", kind::COUNTER_RESET), 0, "re-creation is not miscounted as a reset");
}

/// `[sources] qdisc_per_queue`: a veth with 8 TX queues under an `mq` root has 9 qdiscs (the
/// root and one per queue); by default only the root is exported, with the opt-in all 9.
#[test]
fn only_root_qdiscs_are_exported_unless_per_queue_is_on() {
    let a = Netns::new().expect("create namespace a");
    let b = Netns::new().expect("create namespace b");
    stepwise_tests::netns::run_tool(
        "ip",
        &["link", "add", "swq0", "numtxqueues", "8", "netns", a.name(), "type", "veth", "peer", "name", "swq1", "numtxqueues", "8", "netns", b.name()],
    )
    .expect("veth with 8 TX queues");
    a.ip(&["link", "set", "swq0", "up"]).expect("up");
    a.tc(&["qdisc", "add", "dev", "swq0", "root", "handle", "1:", "mq"]).expect("mq root");
    let json = a.tc(&["-j", "qdisc", "show", "dev", "swq0"]).expect("tc qdisc show");
    let kernel: Vec<serde_json::Value> = serde_json::from_str(&json).expect("tc json");
    assert_eq!(kernel.len(), 9, "mq and 8 per-queue qdiscs in the kernel: {json}");

    let on_swq0 = |per_queue: bool| {
        let mut reg = Registry::default();
        let mut q = QdiscSource::new(ctx(a.sysfs()), &mut reg).with_per_queue(per_queue);
        a.run(|_| q.sweep()).expect("qdisc sweep");
        let snaps: Vec<QdiscSnapshot> = q.snapshot().into_iter().filter(|s| s.netdev == "swq0").collect();
        let series = encode(&reg).lines().filter(|l| l.starts_with("stepwise_qdisc_") && l.contains("netdev=\"swq0\"")).count();
        (snaps, series)
    };
    let (root, root_series) = on_swq0(false);
    assert_eq!(root.len(), 1, "default: the root only: {root:?}");
    assert_eq!((root[0].kind.as_str(), root[0].parent.as_str()), ("mq", "root"));
    assert_eq!(root_series, 7, "7 series of the one root qdisc");
    let (all, all_series) = on_swq0(true);
    assert_eq!(all.len(), 9, "qdisc_per_queue: every qdisc: {all:?}");
    assert_eq!(all.iter().filter(|s| s.parent != "root").count(), 8);
    assert_eq!(all_series, 63);
}
