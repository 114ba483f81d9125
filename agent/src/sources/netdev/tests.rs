use std::time::{Duration, Instant};

use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage, State, Stats, Stats64};
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

fn link(index: u32, name: &str, attrs: Vec<LinkAttribute>) -> LinkMessage {
    let mut m = LinkMessage::default();
    m.header.index = index;
    m.attributes.push(LinkAttribute::IfName(name.into()));
    m.attributes.extend(attrs);
    m
}

fn reading(ifindex: u32, name: &str, v: [u64; 8], sem: Semantics) -> LinkReading {
    LinkReading { ifindex, name: name.into(), up: true, values: Some((v, sem)) }
}

#[test]
fn stats64_is_preferred_and_stats32_wraps() {
    let mut s64 = Stats64::default();
    s64.rx_bytes = 5_000_000_000;
    s64.tx_bytes = 7;
    s64.rx_dropped = 3;
    s64.tx_errors = 2;
    let mut s32 = Stats::default();
    s32.rx_bytes = 1;
    let r = parse_link(&link(4, "eth0", vec![LinkAttribute::Stats(s32), LinkAttribute::Stats64(s64), LinkAttribute::OperState(State::Up)])).expect("reading");
    assert_eq!(r.values, Some(([5_000_000_000, 7, 0, 0, 3, 0, 0, 2], Semantics::Monotonic)));
    assert!(r.up);
    let r = parse_link(&link(4, "eth0", vec![LinkAttribute::Stats(s32)])).expect("reading");
    assert_eq!(r.values, Some(([1, 0, 0, 0, 0, 0, 0, 0], Semantics::Wrapping { bits: 32 })));
    assert_eq!(parse_link(&link(4, "eth0", vec![])).expect("reading").values, None);
    assert_eq!(parse_link(&LinkMessage::default()), None, "a link without a name is not a reading");
}

#[test]
fn up_follows_operstate_then_flags() {
    let down = parse_link(&link(2, "a", vec![LinkAttribute::OperState(State::LowerLayerDown)])).expect("reading");
    assert!(!down.up);
    let mut m = link(2, "a", vec![LinkAttribute::OperState(State::Unknown)]);
    m.header.flags = LinkFlags::Up | LinkFlags::Running;
    assert!(parse_link(&m).expect("reading").up);
    m.header.flags = LinkFlags::Up;
    assert!(!parse_link(&m).expect("reading").up);
}

#[test]
fn recreated_interface_never_makes_counters_go_backwards() {
    let c = ctx();
    let mut src = NetdevSource::new(c.clone(), &mut Registry::default());
    let mut rep = SweepReport::default();
    let t = Instant::now();
    src.apply(reading(5, "veth0", [1000, 2000, 10, 20, 0, 0, 0, 0], Semantics::Monotonic), t, &mut rep);
    src.apply(reading(5, "veth0", [1500, 2600, 15, 26, 1, 0, 0, 0], Semantics::Monotonic), t, &mut rep);
    let s = &src.snapshot()[0];
    assert_eq!((s.receive_bytes, s.transmit_bytes, s.receive_drops), (1500, 2600, 1), "first reading is the initial value");
    // Deleted and re-created: new ifindex, counters from zero.
    src.apply(reading(9, "veth0", [100, 50, 1, 1, 0, 0, 0, 0], Semantics::Monotonic), t, &mut rep);
    let s = &src.snapshot()[0];
    assert_eq!((s.receive_bytes, s.transmit_bytes, s.ifindex), (1600, 2650, 9));
    assert_eq!(c.errors.get(SOURCE, kind::VANISHED), 1);
    assert_eq!(c.errors.get(SOURCE, kind::COUNTER_RESET), 0);
    // A decrease on the same ifindex is a counter reset.
    src.apply(reading(9, "veth0", [10, 60, 1, 1, 0, 0, 0, 0], Semantics::Monotonic), t, &mut rep);
    let s = &src.snapshot()[0];
    assert_eq!((s.receive_bytes, s.transmit_bytes), (1610, 2660));
    assert_eq!(c.errors.get(SOURCE, kind::COUNTER_RESET), 1);
    assert_eq!(src.families[0].get_or_create(&NetdevLabels { netdev: "veth0".into() }).get(), 1610);
}

#[test]
fn thirty_two_bit_stats_wrap_once() {
    let c = ctx();
    let mut src = NetdevSource::new(c.clone(), &mut Registry::default());
    let mut rep = SweepReport::default();
    let t = Instant::now();
    let w = Semantics::Wrapping { bits: 32 };
    src.apply(reading(3, "old0", [u32::MAX as u64 - 9, 0, 0, 0, 0, 0, 0, 0], w), t, &mut rep);
    src.apply(reading(3, "old0", [5, 0, 0, 0, 0, 0, 0, 0], w), t, &mut rep);
    assert_eq!(src.snapshot()[0].receive_bytes, u32::MAX as u64 + 6);
    assert_eq!(c.errors.get(SOURCE, kind::COUNTER_RESET), 0);
}

#[test]
fn a_jump_beyond_any_link_is_a_glitch_and_the_series_goes_on() {
    let c = ctx();
    let mut src = NetdevSource::new(c.clone(), &mut Registry::default());
    let mut rep = SweepReport::default();
    let t = Instant::now();
    let m = Semantics::Monotonic;
    src.apply(reading(5, "eth0", [1000, 2000, 0, 0, 0, 0, 0, 0], m), t, &mut rep);
    let at = |ms| t + std::time::Duration::from_millis(ms);
    src.apply(reading(5, "eth0", [1000, u64::MAX - 10, 0, 0, 0, 0, 0, 0], m), at(1000), &mut rep);
    assert_eq!(src.snapshot()[0].transmit_bytes, 2000, "nothing added");
    assert_eq!(c.errors.get(SOURCE, kind::COUNTER_GLITCH), 1);
    src.apply(reading(5, "eth0", [1500, 2500, 0, 0, 0, 0, 0, 0], m), at(2000), &mut rep);
    let s = &src.snapshot()[0];
    assert_eq!((s.receive_bytes, s.transmit_bytes), (1500, 2500), "on from the last good reading");
    assert_eq!(c.errors.get(SOURCE, kind::COUNTER_RESET), 0);
    assert_eq!(src.families[1].get_or_create(&NetdevLabels { netdev: "eth0".into() }).get(), 2500);
}

#[test]
fn link_without_stats_is_counted_not_exported() {
    let c = ctx();
    let mut src = NetdevSource::new(c.clone(), &mut Registry::default());
    let mut rep = SweepReport::default();
    src.apply(LinkReading { ifindex: 1, name: "x".into(), up: false, values: None }, Instant::now(), &mut rep);
    assert_eq!(rep.skipped, 1);
    assert!(src.snapshot().is_empty());
    assert_eq!(c.errors.get(SOURCE, kind::NOT_AVAILABLE), 1);
}

#[test]
fn cap_forgets_the_longest_gone_name_first() {
    let c = ctx();
    let mut src = NetdevSource::new(c.clone(), &mut Registry::default());
    let mut rep = SweepReport::default();
    let t0 = Instant::now();
    for i in 0..MAX_NETDEVS {
        src.apply(reading(i as u32 + 2, &format!("v{i}"), [1; 8], Semantics::Monotonic), t0, &mut rep);
    }
    // All present: a new name is refused and counted.
    src.apply(reading(5000, "new", [1; 8], Semantics::Monotonic), t0, &mut rep);
    assert_eq!(c.errors.get(SOURCE, KIND_CARDINALITY), 1);
    // One gone: it makes room.
    if let Some(d) = src.devs.get_mut("v7") {
        d.present = false;
    }
    src.apply(reading(5000, "new", [1; 8], Semantics::Monotonic), t0, &mut rep);
    assert!(src.devs.contains_key("new") && !src.devs.contains_key("v7"));
    assert_eq!(src.devs.len(), MAX_NETDEVS);
}
