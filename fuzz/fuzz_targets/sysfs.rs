//! RDMA sysfs files: a counter file's name and two successive contents (`counters/`,
//! `hw_counters/`), plus `state`, `link_layer` and `rate` contents. Whatever a driver (or a
//! restricted function, or a fixture) writes there, the parsers return a value or an error,
//! and the counter arithmetic never overflows.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use stepwise::{
    fuzzing::{parse_counter, parse_counter_bytes, parse_link_layer, parse_state, spec, Group, ValueError},
    sources::{counter::Semantics, rdma::hw_every},
    topology::parse_ib_rate,
};

fuzz_target!(|data: &[u8]| {
    // The counter reader parses a file's raw bytes; the text path must agree with it.
    for raw in data.split(|b| *b == 0).take(3) {
        assert_eq!(parse_counter_bytes(raw), parse_counter(&String::from_utf8_lossy(raw)));
    }
    // Other files are read as text, converted lossily.
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(4, '\0');
    let name = parts.next().unwrap_or("");
    let first = parts.next().unwrap_or("");
    let second = parts.next().unwrap_or("");
    let rest = parts.next().unwrap_or("");

    for (i, group) in [Group::Pma, Group::PmaLegacyExt, Group::Hw].into_iter().enumerate() {
        let sp = spec(group, name, i % 2 == 0);
        let (a, b) = (parse_counter(first), parse_counter(second));
        if let Ok(v) = a {
            assert_eq!(first.trim().parse::<u64>(), Ok(v), "a counter is an unsigned decimal, nothing more");
        }
        if let Err(e) = a {
            assert!(matches!(e, ValueError::NotAvailable | ValueError::Garbage));
            let _ = e.kind();
        }
        if let (Ok(prev), Ok(cur)) = (a, b) {
            // As the source accumulates: saturating, never wrapping.
            let d = sp.semantics.delta(prev, cur);
            let _ = prev.saturating_mul(sp.scale).saturating_add(d.value().saturating_mul(sp.scale));
        }
    }
    // Any declared width, including impossible ones, gives a delta no larger than the jump.
    if let (Ok(prev), Ok(cur)) = (parse_counter(first), parse_counter(second)) {
        let bits = (prev % 80) as u8;
        for s in [Semantics::Wrapping { bits }, Semantics::Saturating { bits }, Semantics::Monotonic] {
            let v = s.delta(prev, cur).value();
            if cur >= prev && !matches!(s, Semantics::Saturating { .. }) {
                assert_eq!(v, cur - prev);
            }
        }
        let _ = hw_every(Duration::from_nanos(cur), prev);
    }

    if let Some(st) = parse_state(rest) {
        assert!(!st.name.is_empty());
        let _ = st.is_active();
    }
    if let Some(l) = parse_link_layer(rest) {
        assert!(!l.is_empty() && l.trim() == l);
    }
    if let Some(r) = parse_ib_rate(rest) {
        assert!(r.is_finite() && r >= 0.0, "rate {r} from {rest:?}");
    }
});
