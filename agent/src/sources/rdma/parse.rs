//! Parsers for the RDMA sysfs files (docs/platform-facts.md §1, drivers/infiniband/core/sysfs.c).
//!
//! Every parser trims whitespace: real files end in `\n`, but some fixtures (and some
//! drivers) omit it, and one known `link_layer` file has two lines. Nothing here panics on
//! any input; a value that cannot be used is an error the caller counts.

#[cfg(test)]
use std::path::Path;

use super::super::kind;
#[cfg(test)]
use super::files::{Budget, CounterDir};

/// Why a counter value could not be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueError {
    /// `N/A (no PMA)`: the kernel's PMA query failed (sysfs.c `show_pma_counter`).
    NotAvailable,
    /// Empty file, or not an unsigned decimal integer.
    Garbage,
}

impl ValueError {
    /// The `stepwise_errors_total` kind for this error.
    pub fn kind(self) -> &'static str {
        match self {
            ValueError::NotAvailable => kind::NOT_AVAILABLE,
            ValueError::Garbage => kind::PARSE,
        }
    }
}

/// Parses one counter file's content: an unsigned decimal integer, surrounding whitespace
/// allowed, trailing newline optional.
pub fn parse_counter(s: &str) -> Result<u64, ValueError> {
    let t = s.trim();
    if t.starts_with("N/A") {
        return Err(ValueError::NotAvailable);
    }
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ValueError::Garbage);
    }
    t.parse::<u64>().map_err(|_| ValueError::Garbage)
}

/// [`parse_counter`] on a file's raw bytes (invalid UTF-8 is replaced, as a text read does).
pub fn parse_counter_bytes(b: &[u8]) -> Result<u64, ValueError> {
    match std::str::from_utf8(b) {
        Ok(s) => parse_counter(s),
        Err(_) => parse_counter(&String::from_utf8_lossy(b)),
    }
}

/// A port's logical state, from `state` (`"%d: %s"`, e.g. `4: ACTIVE`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortState {
    pub code: u32,
    pub name: String,
}

impl PortState {
    /// ACTIVE (4) is the only state in which the port passes data.
    pub fn is_active(&self) -> bool {
        self.code == 4 || self.name == "ACTIVE"
    }
}

pub fn parse_state(s: &str) -> Option<PortState> {
    let (code, name) = s.trim().split_once(':')?;
    let code = code.trim().parse().ok()?;
    let name = name.trim();
    if name.is_empty() {
        return None;
    }
    Some(PortState { code, name: name.to_string() })
}

/// `link_layer`: `InfiniBand` | `Ethernet` | `Unknown`. The first non-empty line (a real
/// fixture has a second line).
pub fn parse_link_layer(s: &str) -> Option<String> {
    s.lines().map(str::trim).find(|l| !l.is_empty()).map(str::to_string)
}

/// Why one file of a counter directory could not be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadFailure {
    /// `read()` failed (EIO on a restricted function, EISDIR, a dangling link, EACCES…).
    Io,
    Value(ValueError),
    /// Not read this sweep: a metric-only counter between its paced reads (not a failure).
    NotDue,
}

impl ReadFailure {
    pub fn kind(&self) -> &'static str {
        match self {
            ReadFailure::Io | ReadFailure::NotDue => kind::READ,
            ReadFailure::Value(v) => v.kind(),
        }
    }
}

/// One entry of a counter directory.
#[cfg(test)]
#[derive(Debug)]
pub struct Reading {
    pub name: String,
    pub value: Result<u64, ReadFailure>,
}

/// Reads every file of a counter directory. `None` if the directory does not exist or cannot
/// be listed (an optional group); entries whose read fails are returned as failures, so a
/// restricted function shows up as a directory full of failures rather than as nothing.
#[cfg(test)]
pub fn read_counter_dir(dir: &Path, buf: &mut Vec<u8>) -> Option<Vec<Reading>> {
    // One-shot: every descriptor is closed when `d` drops.
    let budget = Budget::with_limit(0);
    let mut d = CounterDir::open_path(dir, &budget).ok()?;
    let CounterDir { dir, files } = &mut d;
    Some(
        files
            .iter_mut()
            .map(|f| {
                let value = match f.read(dir, buf, &budget) {
                    Ok(()) => parse_counter_bytes(buf).map_err(ReadFailure::Value),
                    Err(_) => Err(ReadFailure::Io),
                };
                Reading { name: f.name.clone(), value }
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_values_trim_and_accept_no_trailing_newline() {
        assert_eq!(parse_counter("2880761508848\n"), Ok(2_880_761_508_848));
        assert_eq!(parse_counter("131"), Ok(131));
        assert_eq!(parse_counter("  7 \n\n"), Ok(7));
        assert_eq!(parse_counter("18446744073709551615"), Ok(u64::MAX));
    }

    #[test]
    fn counter_values_reject_na_empty_and_garbage() {
        assert_eq!(parse_counter("N/A (no PMA)\n"), Err(ValueError::NotAvailable));
        assert_eq!(parse_counter(""), Err(ValueError::Garbage));
        assert_eq!(parse_counter("\n"), Err(ValueError::Garbage));
        assert_eq!(parse_counter("12abc"), Err(ValueError::Garbage));
        assert_eq!(parse_counter("-5"), Err(ValueError::Garbage));
        assert_eq!(parse_counter("+5"), Err(ValueError::Garbage));
        assert_eq!(parse_counter("0x10"), Err(ValueError::Garbage));
        assert_eq!(parse_counter("18446744073709551616"), Err(ValueError::Garbage), "u64 overflow");
        assert_eq!(parse_counter("\u{fffd}\u{0}"), Err(ValueError::Garbage));
        assert_eq!(parse_counter_bytes(b"42\n"), Ok(42));
        assert_eq!(parse_counter_bytes(b"\x0b42\r\n"), Ok(42), "the same whitespace as str::trim");
        assert_eq!(parse_counter_bytes(b"\xff1"), Err(ValueError::Garbage));
        assert_eq!(ValueError::NotAvailable.kind(), "not_available");
        assert_eq!(ValueError::Garbage.kind(), "parse");
    }

    #[test]
    fn state_parses_code_and_name() {
        let s = parse_state("4: ACTIVE\n").expect("state");
        assert_eq!(s, PortState { code: 4, name: "ACTIVE".into() });
        assert!(s.is_active());
        let d = parse_state("1: DOWN").expect("state");
        assert!(!d.is_active());
        assert!(!parse_state("5: ACTIVE_DEFER").expect("state").is_active());
        assert_eq!(parse_state("ACTIVE"), None);
        assert_eq!(parse_state("x: ACTIVE"), None);
        assert_eq!(parse_state("4:"), None);
        assert_eq!(parse_state(""), None);
    }

    #[test]
    fn link_layer_takes_the_first_non_empty_line() {
        assert_eq!(parse_link_layer("Ethernet\n").as_deref(), Some("Ethernet"));
        assert_eq!(parse_link_layer("\nInfiniBand\nEthernet\n").as_deref(), Some("InfiniBand"));
        assert_eq!(parse_link_layer("InfiniBand").as_deref(), Some("InfiniBand"));
        assert_eq!(parse_link_layer("  \n \n"), None);
    }

    #[test]
    fn counter_dir_reports_each_failure_and_missing_dir_is_none() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        std::fs::write(d.join("ok"), "5\n").expect("write");
        std::fs::write(d.join("nonl"), "6").expect("write");
        std::fs::write(d.join("na"), "N/A (no PMA)\n").expect("write");
        std::fs::write(d.join("empty"), "").expect("write");
        std::fs::create_dir(d.join("eio")).expect("mkdir");
        std::os::unix::fs::symlink(d.join("nowhere"), d.join("dangling")).expect("symlink");
        let mut buf = Vec::new();
        let r = read_counter_dir(d, &mut buf).expect("dir");
        let get = |n: &str| r.iter().find(|x| x.name == n).map(|x| &x.value).expect(n);
        assert!(matches!(get("ok"), Ok(5)));
        assert!(matches!(get("nonl"), Ok(6)));
        assert!(matches!(get("na"), Err(ReadFailure::Value(ValueError::NotAvailable))));
        assert!(matches!(get("empty"), Err(ReadFailure::Value(ValueError::Garbage))));
        assert!(matches!(get("eio"), Err(ReadFailure::Io)), "a directory cannot be read (EISDIR)");
        assert!(matches!(get("dangling"), Err(ReadFailure::Io)), "a dangling link cannot be read");
        assert_eq!(get("eio").as_ref().err().map(|e| e.kind()), Some("read"));
        assert!(read_counter_dir(&d.join("absent"), &mut buf).is_none());
    }
}
