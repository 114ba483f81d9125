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
    #[error("'{input}': a {kind} must be at most {max}")]
    TooLarge { input: String, kind: &'static str, max: &'static str },
    #[error("'{input}': a {kind} must be at least {min} (or zero where zero is allowed)")]
    TooSmall { input: String, kind: &'static str, min: &'static str },
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
    /// Largest value accepted, and how it is written in the error: far beyond any hardware
    /// or cluster the models describe, so `--bytes 1e30` is an error, not "909494701772928256 TiB".
    max: (f64, &'static str),
    /// Smallest value other than zero accepted: below it a model's times and sizes leave the
    /// range the output can print (a 1e-300 B/s link "takes" 1e300 s).
    min: (f64, &'static str),
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
    max: (GIB * 1024.0 * 1024.0, "1 PiB"),
    min: (0.125, "1 bit"),
};
const RATE: Kind = Kind {
    name: "bandwidth",
    example: "50GB/s or 400Gbit/s",
    known: "B/s, KB/s, MB/s, GB/s, TB/s (decimal), KiB/s, MiB/s, GiB/s, bit/s, Kbit/s, Mbit/s, Gbit/s, Tbit/s, Gb/s, Gbps",
    table: RATE_UNITS,
    bare: None,
    max: (1e15, "1 PB/s"),
    min: (0.125, "1 bit/s"),
};
const TIME: Kind = Kind {
    name: "time",
    example: "0.833us, 0.833µs or 20ms",
    known: "s, ms, us, µs, ns, ps, min, h",
    table: TIME_UNITS,
    bare: None,
    max: (1e6 * 3600.0, "1000000h"),
    min: (1e-12, "1ps"),
};
const LENGTH: Kind =
    Kind { name: "length", example: "30m", known: "m, km, cm, mm", table: LENGTH_UNITS, bare: None, max: (1e8, "100000km"), min: (1e-3, "1mm") };

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
    if v > kind.max.0 {
        return Err(UnitError::TooLarge { input: input.to_string(), kind: kind.name, max: kind.max.1 });
    }
    if v > 0.0 && v < kind.min.0 * (1.0 - 1e-12) {
        return Err(UnitError::TooSmall { input: input.to_string(), kind: kind.name, min: kind.min.1 });
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
#[path = "units_tests.rs"]
mod tests;
