//! Quantities on the command line (`agent model …`, `[steps] nic_rates`): sizes, rates,
//! times, lengths and `x*N` lists. Any text gives a finite, non-negative value (positive for
//! the `_pos` parsers), a bounded list, or a typed error — and every value renders.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stepwise::units::{
    parse_bytes, parse_bytes_list, parse_bytes_pos, parse_metres, parse_rate, parse_rate_list, parse_rate_pos, parse_seconds, parse_seconds_list,
    parse_seconds_pos, sig, MAX_LIST_ITEMS,
};

fn ok(v: f64, positive: bool, s: &str) {
    assert!(v.is_finite() && v >= 0.0 && (!positive || v > 0.0), "{v} from {s:?}");
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(v) = parse_bytes(s) {
        ok(v.0, false, s);
        let _ = (v.to_string(), v.dec().to_string());
    }
    if let Ok(v) = parse_bytes_pos(s) {
        ok(v.0, true, s);
    }
    if let Ok(v) = parse_rate(s) {
        ok(v.0, false, s);
        let _ = v.to_string();
    }
    if let Ok(v) = parse_rate_pos(s) {
        ok(v.0, true, s);
    }
    if let Ok(v) = parse_seconds(s) {
        ok(v.0, false, s);
        let _ = v.to_string();
    }
    if let Ok(v) = parse_seconds_pos(s) {
        ok(v.0, true, s);
    }
    if let Ok(v) = parse_metres(s) {
        ok(v.0, false, s);
        let _ = v.to_string();
    }
    if let Ok(l) = parse_bytes_list(s) {
        assert!(l.0.len() <= MAX_LIST_ITEMS);
        l.0.iter().for_each(|v| ok(v.0, true, s));
    }
    if let Ok(l) = parse_rate_list(s) {
        assert!(l.0.len() <= MAX_LIST_ITEMS);
    }
    if let Ok(l) = parse_seconds_list(s) {
        assert!(l.0.len() <= MAX_LIST_ITEMS);
    }
    if data.len() >= 9 {
        let x = f64::from_le_bytes(data[..8].try_into().expect("8 bytes"));
        let _ = sig(x, usize::from(data[8] % 20));
    }
});
