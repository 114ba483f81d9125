//! Typed units: bytes, seconds, bytes per second and metres, and the parser for quantities
//! written with their unit (`192MiB`, `50GB/s`, `400Gbit/s`, `0.833µs`, `30m`).
//!
//! docs/models.md "Units": `GB/s` is decimal (1 GB/s = 1e9 B/s) while `KiB/MiB/GiB` are binary
//! (1 MiB = 2^20 B). Both spellings are accepted and kept apart exactly; nothing guesses.
//! Every value is an `f64` in base units (B, s, B/s, m): the models divide volumes into
//! shards (`2(p−1)/p · M`), so fractional bytes are normal and integer types would round.

use std::{
    fmt,
    iter::Sum,
    ops::{Add, AddAssign, Div, Mul, Sub},
};

use serde::Serialize;
use thiserror::Error;

pub const KIB: f64 = 1024.0;
pub const MIB: f64 = 1024.0 * 1024.0;
pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
pub const KB: f64 = 1e3;
pub const MB: f64 = 1e6;
pub const GB: f64 = 1e9;
pub const TB: f64 = 1e12;

macro_rules! quantity {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, PartialOrd, Serialize)]
        #[serde(transparent)]
        pub struct $name(pub f64);

        impl Add for $name {
            type Output = $name;
            fn add(self, o: $name) -> $name {
                $name(self.0 + o.0)
            }
        }
        impl AddAssign for $name {
            fn add_assign(&mut self, o: $name) {
                self.0 += o.0;
            }
        }
        impl Sub for $name {
            type Output = $name;
            fn sub(self, o: $name) -> $name {
                $name(self.0 - o.0)
            }
        }
        impl Mul<f64> for $name {
            type Output = $name;
            fn mul(self, k: f64) -> $name {
                $name(self.0 * k)
            }
        }
        impl Mul<$name> for f64 {
            type Output = $name;
            fn mul(self, q: $name) -> $name {
                $name(self * q.0)
            }
        }
        impl Div<f64> for $name {
            type Output = $name;
            fn div(self, k: f64) -> $name {
                $name(self.0 / k)
            }
        }
        /// A ratio of two quantities of the same kind is a plain number.
        impl Div for $name {
            type Output = f64;
            fn div(self, o: $name) -> f64 {
                self.0 / o.0
            }
        }
        impl Sum for $name {
            fn sum<I: Iterator<Item = $name>>(it: I) -> $name {
                $name(it.map(|q| q.0).sum())
            }
        }
        impl $name {
            /// The larger of two values (NaN-free inputs assumed, as everywhere in the models).
            pub fn max(self, o: $name) -> $name {
                $name(self.0.max(o.0))
            }
            pub fn min(self, o: $name) -> $name {
                $name(self.0.min(o.0))
            }
        }
    };
}

quantity!(
    /// A volume of data in bytes.
    Bytes
);
quantity!(
    /// A duration or a point in time, in seconds.
    Seconds
);
quantity!(
    /// A bandwidth in bytes per second (decimal: 50 GB/s = 5e10).
    BytesPerSecond
);
quantity!(
    /// A length in metres (cable runs, for the PFC hop delay of docs/models.md §4.3).
    Metres
);

impl Bytes {
    pub fn kib(x: f64) -> Bytes {
        Bytes(x * KIB)
    }
    pub fn mib(x: f64) -> Bytes {
        Bytes(x * MIB)
    }
    pub fn gib(x: f64) -> Bytes {
        Bytes(x * GIB)
    }
    pub fn kb(x: f64) -> Bytes {
        Bytes(x * KB)
    }
    pub fn mb(x: f64) -> Bytes {
        Bytes(x * MB)
    }
    pub fn gb(x: f64) -> Bytes {
        Bytes(x * GB)
    }
    pub fn in_mib(self) -> f64 {
        self.0 / MIB
    }
    pub fn in_kib(self) -> f64 {
        self.0 / KIB
    }
    /// Decimal rendering (`250 MB`, `738 KB`) for quantities the chapter quotes decimally.
    pub fn dec(self) -> DecimalBytes {
        DecimalBytes(self)
    }
}

impl Seconds {
    pub fn ns(x: f64) -> Seconds {
        Seconds(x * 1e-9)
    }
    pub fn us(x: f64) -> Seconds {
        Seconds(x * 1e-6)
    }
    pub fn ms(x: f64) -> Seconds {
        Seconds(x * 1e-3)
    }
    pub fn hours(x: f64) -> Seconds {
        Seconds(x * 3600.0)
    }
    pub fn in_ms(self) -> f64 {
        self.0 * 1e3
    }
    pub fn in_us(self) -> f64 {
        self.0 * 1e6
    }
    pub fn in_ns(self) -> f64 {
        self.0 * 1e9
    }
}

impl BytesPerSecond {
    /// Decimal gigabytes per second (docs/models.md: 1 GB/s = 1e9 B/s).
    pub fn gb_s(x: f64) -> BytesPerSecond {
        BytesPerSecond(x * GB)
    }
    /// Gigabits per second (400 Gbit/s = 50 GB/s).
    pub fn gbit_s(x: f64) -> BytesPerSecond {
        BytesPerSecond(x * GB / 8.0)
    }
    pub fn in_gb_s(self) -> f64 {
        self.0 / GB
    }
}

/// Time to move `b` bytes at rate `r`.
impl Div<BytesPerSecond> for Bytes {
    type Output = Seconds;
    fn div(self, r: BytesPerSecond) -> Seconds {
        Seconds(self.0 / r.0)
    }
}
/// Rate achieved moving `b` bytes in `t`.
impl Div<Seconds> for Bytes {
    type Output = BytesPerSecond;
    fn div(self, t: Seconds) -> BytesPerSecond {
        BytesPerSecond(self.0 / t.0)
    }
}
/// Bytes moved at rate `r` during `t` (the bandwidth-delay product).
impl Mul<Seconds> for BytesPerSecond {
    type Output = Bytes;
    fn mul(self, t: Seconds) -> Bytes {
        Bytes(self.0 * t.0)
    }
}
impl Mul<BytesPerSecond> for Seconds {
    type Output = Bytes;
    fn mul(self, r: BytesPerSecond) -> Bytes {
        Bytes(self.0 * r.0)
    }
}
/// Time to cover a distance at rate `per_m` seconds per metre is `Metres * Seconds`.
impl Mul<Seconds> for Metres {
    type Output = Seconds;
    fn mul(self, per_m: Seconds) -> Seconds {
        Seconds(self.0 * per_m.0)
    }
}

// ---------------------------------------------------------------------------------------
// Human rendering: four significant digits, unit chosen by magnitude.

/// `x` with `digits` significant digits, trailing zeros trimmed (`7.575`, `1.3`, `24.16`).
pub fn sig(x: f64, digits: usize) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let mag = x.abs().log10().floor() as i64;
    let decimals = (digits as i64 - 1 - mag).max(0) as usize;
    let s = format!("{x:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

fn scaled(x: f64, steps: &[(f64, &str)]) -> String {
    let a = x.abs();
    if a == 0.0 {
        let u = steps.iter().find(|(k, _)| *k == 1.0).map_or("", |(_, u)| *u);
        return format!("0 {u}");
    }
    for &(k, u) in steps {
        // Pick the unit the value will have after rounding to four digits (999 999.99 B → 1 MB).
        if a >= k * 0.999_95 {
            return format!("{} {u}", sig(x / k, 4));
        }
    }
    let (k, u) = steps[steps.len() - 1];
    format!("{} {u}", sig(x / k, 4))
}

impl fmt::Display for Bytes {
    /// Binary units, as the chapter writes gradients and buffers (`192 MiB`, `512 KiB`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Small whole sizes that are not KiB multiples read better exact (an MTU of 1500 B).
        let a = self.0.abs();
        if a < 10.0 * KIB && a.fract() == 0.0 && a % KIB != 0.0 {
            return write!(f, "{} B", self.0);
        }
        f.write_str(&scaled(self.0, &[(GIB * 1024.0, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB"), (1.0, "B")]))
    }
}

/// Decimal rendering of [`Bytes`], see [`Bytes::dec`].
pub struct DecimalBytes(pub Bytes);
impl fmt::Display for DecimalBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&scaled(self.0 .0, &[(TB, "TB"), (GB, "GB"), (MB, "MB"), (KB, "KB"), (1.0, "B")]))
    }
}

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_infinite() {
            return f.write_str("never");
        }
        f.write_str(&scaled(self.0, &[(3600.0, "h"), (1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")]))
    }
}

impl fmt::Display for BytesPerSecond {
    /// Decimal, as docs/models.md defines bandwidth (`50 GB/s`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&scaled(self.0, &[(TB, "TB/s"), (GB, "GB/s"), (MB, "MB/s"), (KB, "KB/s"), (1.0, "B/s")]))
    }
}

impl fmt::Display for Metres {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} m", sig(self.0, 4))
    }
}

// ---------------------------------------------------------------------------------------
// Parsing.

/// Why a quantity on the command line could not be read.
#[derive(Debug, Error, PartialEq)]
pub enum UnitError {
    #[error("empty {kind}: write a number and a unit, e.g. {example}")]
    Empty { kind: &'static str, example: &'static str },
    #[error("'{input}' does not start with a number; write a {kind} like {example}")]
    BadNumber { input: String, kind: &'static str, example: &'static str },
    #[error("'{input}' has no unit; write a {kind} like {example}")]
    MissingUnit { input: String, kind: &'static str, example: &'static str },
    #[error("'{input}': unknown {kind} unit '{unit}' (known: {known})")]
    UnknownUnit { input: String, kind: &'static str, unit: String, known: &'static str },
    #[error("'{input}': a {kind} cannot be negative")]
    Negative { input: String, kind: &'static str },
    #[error("'{input}': a {kind} must be greater than zero")]
    NotPositive { input: String, kind: &'static str },
    #[error("'{input}': not a finite number")]
    NotFinite { input: String },
    #[error("'{input}': the repeat count after '*' must be a whole number ≥ 1")]
    BadRepeat { input: String },
    #[error("'{input}': a list has at most {max} items")]
    TooMany { input: String, max: usize },
}

#[derive(Clone, Copy)]
struct Kind {
    name: &'static str,
    example: &'static str,
    known: &'static str,
    table: &'static [(&'static str, f64)],
    /// What a number without a unit means, if anything: bytes for a size (`--mtu 1500`, as
    /// people type an MTU or a buffer); a bare bandwidth, time or length is refused as
    /// ambiguous (bit/s or B/s? s or ms?).
    bare: Option<f64>,
}

const BYTE_UNITS: &[(&str, f64)] = &[
    ("B", 1.0),
    ("KB", KB),
    ("kB", KB),
    ("MB", MB),
    ("GB", GB),
    ("TB", TB),
    ("KiB", KIB),
    ("MiB", MIB),
    ("GiB", GIB),
    ("TiB", GIB * 1024.0),
    ("bit", 0.125),
    ("Kbit", KB / 8.0),
    ("Mbit", MB / 8.0),
    ("Gbit", GB / 8.0),
];

const RATE_UNITS: &[(&str, f64)] = &[
    ("B/s", 1.0),
    ("KB/s", KB),
    ("kB/s", KB),
    ("MB/s", MB),
    ("GB/s", GB),
    ("TB/s", TB),
    ("KiB/s", KIB),
    ("MiB/s", MIB),
    ("GiB/s", GIB),
    ("bit/s", 0.125),
    ("Kbit/s", KB / 8.0),
    ("Mbit/s", MB / 8.0),
    ("Gbit/s", GB / 8.0),
    ("Tbit/s", TB / 8.0),
    ("Gb/s", GB / 8.0),
    ("Gbps", GB / 8.0),
];

const TIME_UNITS: &[(&str, f64)] = &[
    ("s", 1.0),
    ("ms", 1e-3),
    ("us", 1e-6),
    ("µs", 1e-6), // U+00B5 MICRO SIGN
    ("μs", 1e-6), // U+03BC GREEK SMALL LETTER MU
    ("ns", 1e-9),
    ("ps", 1e-12),
    ("min", 60.0),
    ("h", 3600.0),
];

const LENGTH_UNITS: &[(&str, f64)] = &[("m", 1.0), ("km", 1e3), ("cm", 1e-2), ("mm", 1e-3)];

const BYTES: Kind = Kind {
    name: "size",
    example: "192MiB or 8KiB",
    known: "B (or none: a bare number is bytes), KB, MB, GB, TB (decimal), KiB, MiB, GiB, TiB (binary), bit, Kbit, Mbit, Gbit",
    table: BYTE_UNITS,
    bare: Some(1.0),
};
const RATE: Kind = Kind {
    name: "bandwidth",
    example: "50GB/s or 400Gbit/s",
    known: "B/s, KB/s, MB/s, GB/s, TB/s (decimal), KiB/s, MiB/s, GiB/s, bit/s, Kbit/s, Mbit/s, Gbit/s, Tbit/s, Gb/s, Gbps",
    table: RATE_UNITS,
    bare: None,
};
const TIME: Kind = Kind { name: "time", example: "0.833us, 0.833µs or 20ms", known: "s, ms, us, µs, ns, ps, min, h", table: TIME_UNITS, bare: None };
const LENGTH: Kind = Kind { name: "length", example: "30m", known: "m, km, cm, mm", table: LENGTH_UNITS, bare: None };

/// Length of the leading number (sign, digits, point, exponent) in `s`.
fn number_len(s: &str) -> usize {
    let b = s.as_bytes();
    let mut i = 0;
    if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
        i += 1;
    }
    while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'.') {
        i += 1;
    }
    // An exponent only if digits follow: "1e3B" is 1000 B, but "5e" is not a number.
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        let mut j = i + 1;
        if j < b.len() && (b[j] == b'+' || b[j] == b'-') {
            j += 1;
        }
        if j < b.len() && b[j].is_ascii_digit() {
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            i = j;
        }
    }
    i
}

fn parse_kind(input: &str, kind: Kind) -> Result<f64, UnitError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(UnitError::Empty { kind: kind.name, example: kind.example });
    }
    let n = number_len(s);
    let num: f64 = s[..n].parse().map_err(|_| UnitError::BadNumber { input: input.to_string(), kind: kind.name, example: kind.example })?;
    let unit = s[n..].trim();
    let k = match (unit, kind.bare) {
        ("", Some(k)) => k,
        ("", None) => return Err(UnitError::MissingUnit { input: input.to_string(), kind: kind.name, example: kind.example }),
        _ => match kind.table.iter().find(|(u, _)| *u == unit) {
            Some(&(_, k)) => k,
            None => return Err(UnitError::UnknownUnit { input: input.to_string(), kind: kind.name, unit: unit.to_string(), known: kind.known }),
        },
    };
    let v = num * k;
    if !v.is_finite() {
        return Err(UnitError::NotFinite { input: input.to_string() });
    }
    if v < 0.0 {
        return Err(UnitError::Negative { input: input.to_string(), kind: kind.name });
    }
    Ok(v)
}

fn positive(input: &str, kind: Kind) -> Result<f64, UnitError> {
    let v = parse_kind(input, kind)?;
    if v <= 0.0 {
        return Err(UnitError::NotPositive { input: input.to_string(), kind: kind.name });
    }
    Ok(v)
}

/// A size (`192MiB`, `8KiB`, `1.125GiB`, `256B`, or `1500`: a bare number is bytes); zero
/// allowed, negative rejected.
pub fn parse_bytes(s: &str) -> Result<Bytes, UnitError> {
    parse_kind(s, BYTES).map(Bytes)
}
/// A size that must be greater than zero.
pub fn parse_bytes_pos(s: &str) -> Result<Bytes, UnitError> {
    positive(s, BYTES).map(Bytes)
}
/// A bandwidth (`50GB/s`, `400Gbit/s`); zero allowed (e.g. a source that is off).
pub fn parse_rate(s: &str) -> Result<BytesPerSecond, UnitError> {
    parse_kind(s, RATE).map(BytesPerSecond)
}
/// A bandwidth that must be greater than zero (every link, NIC and slot).
pub fn parse_rate_pos(s: &str) -> Result<BytesPerSecond, UnitError> {
    positive(s, RATE).map(BytesPerSecond)
}
/// A time (`0.833us`, `0.833µs`, `20ms`); zero allowed (a rank ready at 0).
pub fn parse_seconds(s: &str) -> Result<Seconds, UnitError> {
    parse_kind(s, TIME).map(Seconds)
}
/// A duration that must be greater than zero.
pub fn parse_seconds_pos(s: &str) -> Result<Seconds, UnitError> {
    positive(s, TIME).map(Seconds)
}
/// A length (`30m`): metres, never minutes.
pub fn parse_metres(s: &str) -> Result<Metres, UnitError> {
    parse_kind(s, LENGTH).map(Metres)
}

/// A comma-separated list of quantities; `x*N` repeats `x` N times (`0.4ms*98,2.4ms`).
#[derive(Clone, Debug, PartialEq)]
pub struct List<T>(pub Vec<T>);

/// Most items a list may expand to: far beyond any cluster the models describe, and small
/// enough that `1ms*18446744073709551615` is an error rather than an out-of-memory abort
/// (found writing the `units` fuzz target).
pub const MAX_LIST_ITEMS: usize = 1 << 20;

fn parse_list<T: Copy>(s: &str, item: fn(&str) -> Result<T, UnitError>) -> Result<List<T>, UnitError> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let (value, count) = match part.rsplit_once('*') {
            Some((v, n)) => {
                let n: usize = n.trim().parse().ok().filter(|&n| n >= 1).ok_or_else(|| UnitError::BadRepeat { input: part.to_string() })?;
                (v, n)
            }
            None => (part, 1),
        };
        let x = item(value)?;
        if count > MAX_LIST_ITEMS - out.len() {
            return Err(UnitError::TooMany { input: s.to_string(), max: MAX_LIST_ITEMS });
        }
        out.extend(std::iter::repeat_n(x, count));
    }
    Ok(List(out))
}

pub fn parse_bytes_list(s: &str) -> Result<List<Bytes>, UnitError> {
    parse_list(s, parse_bytes_pos)
}
pub fn parse_rate_list(s: &str) -> Result<List<BytesPerSecond>, UnitError> {
    parse_list(s, parse_rate_pos)
}
pub fn parse_seconds_list(s: &str) -> Result<List<Seconds>, UnitError> {
    parse_list(s, parse_seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_and_decimal_are_kept_apart() {
        assert_eq!(parse_bytes("192MiB").unwrap(), Bytes(192.0 * 1048576.0));
        assert_eq!(parse_bytes("192MiB").unwrap(), Bytes(12288.0 * 4096.0 * 4.0));
        assert_eq!(parse_bytes("8KiB").unwrap(), Bytes(8192.0));
        assert_eq!(parse_bytes("8KB").unwrap(), Bytes(8000.0));
        assert_eq!(parse_bytes("1.125GiB").unwrap(), Bytes(1.125 * 1073741824.0));
        assert_eq!(parse_bytes("1e3B").unwrap(), Bytes(1000.0));
        assert_eq!(parse_rate("50GB/s").unwrap(), BytesPerSecond(5e10));
        assert_eq!(parse_rate("400Gbit/s").unwrap(), BytesPerSecond(5e10));
        assert_eq!(parse_rate("400Gbit/s").unwrap(), BytesPerSecond::gb_s(50.0));
    }

    #[test]
    fn times_and_lengths() {
        let a = parse_seconds("0.833us").unwrap();
        let b = parse_seconds("0.833µs").unwrap();
        let c = parse_seconds("0.833μs").unwrap();
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert!((a.0 - 0.833e-6).abs() < 1e-18);
        assert_eq!(parse_seconds("20ms").unwrap(), Seconds(0.02));
        assert_eq!(parse_seconds("8090h").unwrap(), Seconds(8090.0 * 3600.0));
        // "30m" is a length: metres, not minutes (cable length for §4.3).
        assert_eq!(parse_metres("30m").unwrap(), Metres(30.0));
        assert!(parse_seconds("30m").is_err());
    }

    #[test]
    fn lists_and_repeats() {
        let l = parse_seconds_list("1us,2us").unwrap();
        assert_eq!(l.0, vec![Seconds::us(1.0), Seconds::us(2.0)]);
        let l = parse_seconds_list("0.4ms*98,2.4ms").unwrap();
        assert_eq!(l.0.len(), 99);
        assert!(matches!(parse_seconds_list("1us*0"), Err(UnitError::BadRepeat { .. })));
    }

    /// Regression (fuzz target `units`): a huge repeat count aborted the process trying to
    /// allocate it; now it is a typed error, and the cap holds across items.
    #[test]
    fn huge_repeat_counts_are_errors_not_allocations() {
        assert!(matches!(parse_seconds_list("1ms*18446744073709551615"), Err(UnitError::TooMany { .. })));
        assert!(matches!(parse_bytes_list("1B*1048576,1B"), Err(UnitError::TooMany { .. })));
        assert_eq!(parse_rate_list("1GB/s*1048576").map(|l| l.0.len()), Ok(MAX_LIST_ITEMS));
        assert_eq!(parse_seconds_list("0.4ms*2,2.4ms").map(|l| l.0.len()), Ok(3));
    }

    #[test]
    fn errors_say_what_to_write() {
        let e = parse_bytes("12furlongs").unwrap_err();
        assert!(matches!(e, UnitError::UnknownUnit { .. }));
        assert!(e.to_string().contains("unknown size unit 'furlongs'"), "{e}");
        let e = parse_bytes("-5MiB").unwrap_err();
        assert!(e.to_string().contains("cannot be negative"), "{e}");
        let e = parse_rate_pos("0GB/s").unwrap_err();
        assert!(e.to_string().contains("greater than zero"), "{e}");
        let e = parse_rate("400").unwrap_err();
        assert!(e.to_string().contains("no unit"), "{e}");
        assert!(parse_seconds("20").unwrap_err().to_string().contains("no unit"), "a bare time stays ambiguous (s? ms?)");
        let e = parse_rate("fastGB/s").unwrap_err();
        assert!(matches!(e, UnitError::BadNumber { .. }));
        assert!(matches!(parse_bytes(""), Err(UnitError::Empty { .. })));
    }

    #[test]
    fn a_bare_number_is_a_size_in_bytes() {
        assert_eq!(parse_bytes("1500"), Ok(Bytes(1500.0)), "an MTU as people type it");
        assert_eq!(parse_bytes_pos(" 4096 "), Ok(Bytes(4096.0)));
        assert_eq!(parse_bytes("0"), Ok(Bytes(0.0)));
        assert_eq!(parse_bytes("1e3"), Ok(Bytes(1000.0)));
        assert_eq!(parse_bytes_list("1500,9000*2").map(|l| l.0), Ok(vec![Bytes(1500.0), Bytes(9000.0), Bytes(9000.0)]));
        // Still refused: garbage, a sign alone, negatives, zero where it must be positive.
        assert!(matches!(parse_bytes("abc"), Err(UnitError::BadNumber { .. })));
        assert!(matches!(parse_bytes("-"), Err(UnitError::BadNumber { .. })));
        assert!(matches!(parse_bytes("1500 furlongs"), Err(UnitError::UnknownUnit { .. })));
        assert!(matches!(parse_bytes("-1500"), Err(UnitError::Negative { .. })));
        assert!(matches!(parse_bytes_pos("0"), Err(UnitError::NotPositive { .. })));
        assert!(matches!(parse_bytes("1500.0.0"), Err(UnitError::BadNumber { .. })));
        assert!(matches!(parse_bytes("1e999"), Err(UnitError::NotFinite { .. })));
    }

    #[test]
    fn arithmetic_is_typed() {
        let t = Bytes::mib(12.0) / BytesPerSecond::gb_s(50.0);
        assert!((t.in_us() - 251.658_24).abs() < 1e-6);
        let v = BytesPerSecond::gb_s(50.0) * Seconds::us(2.0);
        assert_eq!(v, Bytes(100_000.0));
        assert_eq!(Bytes::mib(360.0) / Bytes::mib(720.0), 0.5);
    }

    #[test]
    fn rendering() {
        assert_eq!(Bytes::mib(192.0).to_string(), "192 MiB");
        assert_eq!(Bytes(250e6).dec().to_string(), "250 MB");
        assert_eq!(Seconds::ms(7.5752).to_string(), "7.575 ms");
        assert_eq!(BytesPerSecond::gb_s(16.384).to_string(), "16.38 GB/s");
        assert_eq!(sig(1.2996, 4), "1.3");
        assert_eq!(Bytes(999_999.999_999_9).dec().to_string(), "1 MB");
        assert_eq!(Bytes(1500.0).to_string(), "1500 B");
        assert_eq!(Bytes(4096.0).to_string(), "4 KiB");
        assert_eq!(Seconds(0.0).to_string(), "0 s");
    }
}
