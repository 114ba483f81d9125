use std::time::{Duration, Instant};

use netlink_packet_core::DefaultNla;
use netlink_packet_route::tc::{TcHeader, TcStats, TcStatsBasic, TcStatsQueue};
use prometheus_client::registry::Registry;

use super::*;
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

fn tbf_message(bytes: u64, packets: u32, q: (u32, u32, u32, u32, u32), pkt64: Option<u64>) -> TcMessage {
    let header = TcHeader { index: 7, handle: TcHandle { major: 0x8001, minor: 0 }, parent: TcHandle::ROOT, ..Default::default() };
    let mut basic = TcStatsBasic::default();
    basic.bytes = bytes;
    basic.packets = packets;
    let mut queue = TcStatsQueue::default();
    (queue.qlen, queue.backlog, queue.drops, queue.requeues, queue.overlimits) = q;
    let mut stats2 = vec![TcStats2::Basic(basic), TcStats2::Queue(queue)];
    if let Some(p) = pkt64 {
        stats2.push(TcStats2::Other(DefaultNla::new(TCA_STATS_PKT64, p.to_ne_bytes().to_vec())));
    }
    TcMessage::from_parts(header, vec![TcAttribute::Kind("tbf".into()), TcAttribute::Stats2(stats2)])
}

fn reading(bytes: u64, drops: u32, overlimits: u32) -> QdiscReading {
    QdiscReading {
        ifindex: 7,
        kind: "tbf".into(),
        handle: "8001:".into(),
        parent: "root".into(),
        bytes,
        packets: bytes / 100,
        drops,
        overlimits,
        requeues: 0,
        backlog_bytes: 3000,
        backlog_packets: 2,
    }
}

#[test]
fn handles_are_spelled_like_tc() {
    assert_eq!(tc_handle(TcHandle::ROOT), "root");
    assert_eq!(tc_handle(TcHandle { major: 0x8001, minor: 0 }), "8001:");
    assert_eq!(tc_handle(TcHandle { major: 1, minor: 0x10 }), "1:10");
    assert_eq!(tc_handle(TcHandle { major: 0xffff, minor: 0xfff1 }), "ingress");
    assert_eq!(tc_handle(TcHandle::UNSPEC), "0:");
}

#[test]
fn stats2_basic_queue_and_pkt64() {
    let r = parse_qdisc(&tbf_message(123_456, 99, (2, 3000, 17, 1, 40), None)).expect("reading");
    assert_eq!(
        r,
        QdiscReading {
            ifindex: 7,
            kind: "tbf".into(),
            handle: "8001:".into(),
            parent: "root".into(),
            bytes: 123_456,
            packets: 99,
            drops: 17,
            overlimits: 40,
            requeues: 1,
            backlog_bytes: 3000,
            backlog_packets: 2
        }
    );
    // Past 2^32 packets the kernel adds TCA_STATS_PKT64 and truncates the u32.
    let r = parse_qdisc(&tbf_message(1, 5, (0, 0, 0, 0, 0), Some((1 << 32) + 5))).expect("reading");
    assert_eq!(r.packets, (1 << 32) + 5);
}

#[test]
fn compat_tca_stats_is_the_fallback() {
    let mut s = TcStats::default();
    (s.bytes, s.packets, s.drops, s.overlimits, s.qlen, s.backlog) = (10, 2, 1, 4, 1, 1500);
    let msg = TcMessage::from_parts(TcHeader::default(), vec![TcAttribute::Kind("pfifo".into()), TcAttribute::Stats(s)]);
    let r = parse_qdisc(&msg).expect("reading");
    assert_eq!((r.bytes, r.packets, r.drops, r.overlimits, r.requeues, r.backlog_bytes, r.backlog_packets), (10, 2, 1, 4, 0, 1500, 1));
    let none = TcMessage::from_parts(TcHeader::default(), vec![TcAttribute::Kind("noqueue".into())]);
    assert_eq!(parse_qdisc(&none), None);
}

#[test]
fn drops_wrap_at_32_bits_and_replacement_is_a_reset() {
    let c = ctx();
    let mut src = QdiscSource::new(c.clone(), &mut Registry::default());
    let t = Instant::now();
    assert!(src.apply("veth0", reading(1000, u32::MAX - 1, 5), t));
    assert!(src.apply("veth0", reading(2000, 3, 6), t));
    let s = &src.snapshot()[0];
    assert_eq!((s.bytes, s.drops, s.overlimits, s.backlog_bytes), (2000, u32::MAX as u64 + 4, 6, 3000));
    assert_eq!(c.errors.get(SOURCE, kind::COUNTER_RESET), 0);
    // Replaced under the same handle: bytes went down, so every field restarts.
    assert!(src.apply("veth0", reading(50, 1, 0), t));
    let s = &src.snapshot()[0];
    assert_eq!((s.bytes, s.drops, s.overlimits), (2050, u32::MAX as u64 + 5, 6));
    assert_eq!(c.errors.get(SOURCE, kind::COUNTER_RESET), 1);
    // A 32-bit "wrap" of more than 2^31 in one interval is not believed.
    assert!(src.apply("veth0", reading(60, 1 << 30, 0), t));
    assert!(src.apply("veth0", reading(70, 2, 0), t));
    assert_eq!(src.snapshot()[0].drops, u32::MAX as u64 + 5 + (1 << 30) - 1 + 2);
    assert_eq!(c.errors.get(SOURCE, kind::COUNTER_RESET), 2);
}

#[test]
fn bytes_jumping_beyond_any_link_are_a_glitch_and_counting_goes_on() {
    let c = ctx();
    let mut src = QdiscSource::new(c.clone(), &mut Registry::default());
    let t = Instant::now();
    let at = |s| t + std::time::Duration::from_secs(s);
    assert!(src.apply("veth0", reading(1000, 0, 0), t));
    assert!(src.apply("veth0", reading(u64::MAX - 10, 0, 0), at(1)));
    assert_eq!(src.snapshot()[0].bytes, 1000, "nothing added");
    assert!(src.apply("veth0", reading(2000, 0, 0), at(2)));
    assert_eq!(src.snapshot()[0].bytes, 2000, "on from the last good reading, no reset");
    assert_eq!((c.errors.get(SOURCE, kind::COUNTER_GLITCH), c.errors.get(SOURCE, kind::COUNTER_RESET)), (1, 0));
    // A jump the next reading continues from is followed from there.
    let far = 1u64 << 60;
    assert!(src.apply("veth0", reading(far, 0, 0), at(3)));
    assert!(src.apply("veth0", reading(far + 500, 0, 0), at(4)));
    assert_eq!(src.snapshot()[0].bytes, 2500);
    assert_eq!(c.errors.get(SOURCE, kind::COUNTER_GLITCH), 2);
}

#[test]
fn cap_is_enforced_and_counted() {
    let c = ctx();
    let mut src = QdiscSource::new(c.clone(), &mut Registry::default());
    let t = Instant::now();
    for i in 0..MAX_QDISCS {
        assert!(src.apply(&format!("v{i}"), reading(1, 0, 0), t));
    }
    assert!(!src.apply("one-too-many", reading(1, 0, 0), t));
    assert_eq!(c.errors.get(SOURCE, KIND_CARDINALITY), 1);
    assert_eq!(src.snapshot().len(), MAX_QDISCS);
}
