//! `ETHTOOL_GSTRINGS` answers: a driver's string table (NUL-padded 32-byte names, any bytes)
//! and the count it claims. Splitting never misaligns names and values, and every name gets
//! a class whose labels are bounded.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stepwise::sources::ethtool::names::{classify, parse_table, split_gstrings, Class, Field, Priority, ETH_GSTRING_LEN};

fn priority_ok(p: Priority) -> bool {
    match p {
        Priority::Prio(n) => n < 8 && p.label() == n.to_string(),
        Priority::Global => p.label() == "global",
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((head, table)) = data.split_first_chunk::<2>() else { return };
    // The claimed count may disagree with the data (a driver changing its table between the
    // two ioctls): at most one name per 32 bytes comes back, in order.
    let n = usize::from(u16::from_le_bytes(*head));
    let names = split_gstrings(table, n);
    assert_eq!(names.len(), n.min(table.len().div_ceil(ETH_GSTRING_LEN)));
    for (name, raw) in names.iter().zip(table.chunks(ETH_GSTRING_LEN)) {
        assert!(!name.contains('\0') && name.trim() == name, "{name:?} from {raw:?}");
    }
    let classes = parse_table(&names);
    assert_eq!(classes.len(), names.len(), "one class per name keeps values aligned");
    for (name, class) in names.iter().zip(&classes) {
        assert_eq!(*class, classify(name));
        if let Class::Typed(f) = class {
            let ok = match *f {
                Field::PauseFrames { priority, .. } | Field::PauseDuration { priority, .. } | Field::PauseTransitions { priority } => priority_ok(priority),
                Field::PriorityBytes { priority, .. } | Field::PriorityPackets { priority, .. } | Field::EcnMarked { priority } => priority < 8,
                Field::Discards { priority, .. } => priority.is_none_or(|p| p < 8),
                _ => true,
            };
            assert!(ok, "{name:?} → {f:?}");
        }
    }
});
