//! Counter semantics: turning successive raw readings into non-negative deltas.
//!
//! Hardware counters come in three kinds and each needs its own rule:
//! - **wrapping** fixed-width counters (mlx5 Q counters in `hw_counters/` are read as 32-bit,
//!   netdev/qdisc 32-bit fields): a decrease means the counter passed 2^w − 1, so the delta is
//!   `(cur + 2^w) − prev` — unless that is more than half the range: no counter advances by
//!   2^(w−1) between two readings (2^31 events is 3.5 s of 600 Mpps), so such a decrease is a
//!   reset (driver reload, port reset) and the delta is `cur`. A reset within 2^(w−1) of the
//!   wrap point still reads as a wrap (the two look the same), inventing less than that;
//! - **saturating** IBA PMA counters (`counters/`, docs/platform-facts.md §1): they stop at all-ones
//!   and are cleared by a reset. A reading at all-ones is stuck: no delta beyond it can be known;
//!   a decrease is a reset, and the delta is `cur` (what was counted since the reset);
//! - **64-bit monotonic** counters (Ext PMA, ethtool, netdev64): never wrap in practice, so a
//!   decrease is a reset (driver reload, `ethtool` clear): the delta is `cur`.
//!
//! Adding 2^32 to a reset 64-bit counter would invent 4 GiB of traffic; these rules never do.
//!
//! On top of these, [`Guarded`] refuses glitches: a value wider than the counter, or a delta
//! beyond the link rate × elapsed time ([`rate_bound`]), is counted and never added.

/// How a counter behaves at its limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Semantics {
    /// Wraps modulo 2^bits.
    Wrapping { bits: u8 },
    /// Stops at 2^bits − 1 until reset.
    Saturating { bits: u8 },
    /// 64-bit, monotonic until reset.
    Monotonic,
}

/// What happened between two readings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delta {
    /// Normal increase (or no change).
    Normal(u64),
    /// The counter wrapped once; the value is the corrected delta.
    Wrapped(u64),
    /// The counter was reset; the value is what it counted since the reset.
    Reset(u64),
    /// The counter is stuck at its maximum: the true delta is unknown (at least the value).
    Saturated(u64),
}

impl Delta {
    /// The delta to add to a monotonic accumulator.
    pub fn value(self) -> u64 {
        match self {
            Delta::Normal(v) | Delta::Wrapped(v) | Delta::Reset(v) | Delta::Saturated(v) => v,
        }
    }
}

fn max_for(bits: u8) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

impl Semantics {
    /// The largest value the counter can hold.
    pub fn max(self) -> u64 {
        match self {
            Semantics::Wrapping { bits } | Semantics::Saturating { bits } => max_for(bits),
            Semantics::Monotonic => u64::MAX,
        }
    }

    /// Delta from `prev` to `cur` under these semantics.
    pub fn delta(self, prev: u64, cur: u64) -> Delta {
        match self {
            Semantics::Wrapping { bits } => {
                if cur >= prev {
                    Delta::Normal(cur - prev)
                } else if bits < 64 && prev <= max_for(bits) && cur <= max_for(bits) && (max_for(bits) - prev) + cur < max_for(bits) / 2 {
                    Delta::Wrapped((max_for(bits) - prev) + cur + 1)
                } else {
                    // A value wider than the declared width: treat as a reset, never invent bytes.
                    Delta::Reset(cur)
                }
            }
            Semantics::Saturating { bits } => {
                let max = max_for(bits);
                if cur < prev {
                    Delta::Reset(cur)
                } else if cur >= max && prev < max {
                    Delta::Saturated(max - prev)
                } else if cur >= max {
                    Delta::Saturated(0)
                } else {
                    Delta::Normal(cur - prev)
                }
            }
            Semantics::Monotonic => {
                if cur >= prev {
                    Delta::Normal(cur - prev)
                } else {
                    Delta::Reset(cur)
                }
            }
        }
    }
}

/// The most a counter can plausibly advance in `elapsed` on a link of `rate_bytes_per_s`, in
/// bytes: twice the line rate over the interval plus one second (a firmware-cached counter may
/// cover more than the measured interval). `None` when the rate is unknown or zero.
pub fn rate_bound(rate_bytes_per_s: Option<f64>, elapsed_ns: u64) -> Option<u64> {
    let rate = rate_bytes_per_s.filter(|r| r.is_finite() && *r > 0.0)?;
    let bound = rate * (2.0 * elapsed_ns as f64 / 1e9 + 1.0);
    // `as` saturates a too-large float at u64::MAX.
    Some(bound as u64)
}

/// Fastest link any source may see, in bytes/s (1.6 Tb/s): the bound for counters whose own
/// link rate is not at hand (netdev, ethtool statistics, which count bytes, packets or events).
pub const MAX_LINK_BYTES_PER_SECOND: f64 = 200e9;

/// A counter's previous reading, guarded against glitches: a value wider than the counter, or
/// a delta beyond what the link could carry, is not added. The reading is remembered as a
/// suspect: if the next one continues from it (plausibly), the counter really jumped and
/// counts on from there; if it continues from the last good reading, the glitch was a misread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Guarded {
    prev: u64,
    suspect: Option<u64>,
}

impl Guarded {
    pub fn new(first: u64) -> Self {
        Guarded { prev: first, suspect: None }
    }

    /// A guard over state kept elsewhere (the last good reading and the suspect).
    pub fn resume(prev: u64, suspect: Option<u64>) -> Self {
        Guarded { prev, suspect }
    }

    /// The glitched reading waiting to be confirmed by the next one, if any.
    pub fn suspect(&self) -> Option<u64> {
        self.suspect
    }

    /// The last reading taken as good.
    pub fn prev(&self) -> u64 {
        self.prev
    }

    /// The delta to `cur`, or `None` for a glitch (count it, add nothing). `max`: the most the
    /// counter (in its own unit) can plausibly advance since the previous reading.
    pub fn next(&mut self, sem: Semantics, cur: u64, max: Option<u64>) -> Option<Delta> {
        if cur > sem.max() {
            // Impossible for the counter's width: not even a suspect.
            return None;
        }
        let plausible = |d: Delta| max.is_none_or(|m| d.value() <= m);
        let d = sem.delta(self.prev, cur);
        if plausible(d) {
            (self.prev, self.suspect) = (cur, None);
            return Some(d);
        }
        if let Some(s) = self.suspect {
            let from_suspect = sem.delta(s, cur);
            if matches!(from_suspect, Delta::Normal(_)) && plausible(from_suspect) {
                (self.prev, self.suspect) = (cur, None);
                return Some(from_suspect);
            }
        }
        self.suspect = Some(cur);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jump_to_u64_max_and_back_adds_nothing_and_the_series_continues() {
        let mut g = Guarded::new(500);
        let max = rate_bound(Some(50e9), 1_000_000_000);
        assert_eq!(g.next(Semantics::Monotonic, u64::MAX - 10, max), None);
        assert_eq!(g.next(Semantics::Monotonic, 1000, max), Some(Delta::Normal(500)));
        assert_eq!(g.next(Semantics::Monotonic, 2000, max), Some(Delta::Normal(1000)));
        assert_eq!(g.prev(), 2000);
    }

    #[test]
    fn a_real_jump_is_followed_from_the_second_reading_on() {
        let mut g = Guarded::new(500);
        let max = rate_bound(Some(1e9), 1_000_000_000);
        let far = 1u64 << 50;
        assert_eq!(g.next(Semantics::Monotonic, far, max), None);
        assert_eq!(g.next(Semantics::Monotonic, far + 100, max), Some(Delta::Normal(100)));
        assert_eq!(g.next(Semantics::Monotonic, far + 300, max), Some(Delta::Normal(200)));
    }

    #[test]
    fn a_32_bit_counter_reading_wider_than_32_bits_is_a_glitch() {
        let mut g = Guarded::new(10);
        let s = Semantics::Wrapping { bits: 32 };
        assert_eq!(g.next(s, u64::MAX, None), None);
        assert_eq!(g.next(s, u64::MAX, None), None, "never confirmed: the width forbids it");
        assert_eq!(g.next(s, 25, None), Some(Delta::Normal(15)));
        let mut sat = Guarded::new(10);
        assert_eq!(sat.next(Semantics::Saturating { bits: 32 }, 1 << 33, None), None);
    }

    #[test]
    fn without_a_rate_only_the_width_is_checked() {
        let mut g = Guarded::new(0);
        assert_eq!(rate_bound(None, 1), None);
        assert_eq!(rate_bound(Some(0.0), 1), None);
        assert_eq!(g.next(Semantics::Monotonic, 1 << 60, None), Some(Delta::Normal(1 << 60)));
        // A reset is still a reset, and its value is plausible.
        assert_eq!(g.next(Semantics::Monotonic, 7, rate_bound(Some(1e9), 1)), Some(Delta::Reset(7)));
    }

    #[test]
    fn rate_bound_has_margin_for_a_full_interval_at_line_rate() {
        // 400 Gb/s for 1 s is 5e10 bytes: within the bound, twice it plus a second is not.
        let b = rate_bound(Some(50e9), 1_000_000_000).unwrap();
        assert!(b >= 50_000_000_000 * 2);
        assert!(b < 50_000_000_000 * 4);
        assert_eq!(rate_bound(Some(f64::MAX), u64::MAX), Some(u64::MAX));
    }

    #[test]
    fn wrapping_32_bit_counter_wraps_once() {
        let s = Semantics::Wrapping { bits: 32 };
        assert_eq!(s.delta(u32::MAX as u64 - 9, 5), Delta::Wrapped(15));
        assert_eq!(s.delta(100, 150), Delta::Normal(50));
        assert_eq!(s.delta(7, 7), Delta::Normal(0));
    }

    #[test]
    fn wrapping_counter_falling_by_more_than_half_its_range_was_reset() {
        let s = Semantics::Wrapping { bits: 32 };
        // A Q counter at 1000 cleared by a port reset: not 2^32 − 1000 new events.
        assert_eq!(s.delta(1000, 0), Delta::Reset(0));
        assert_eq!(s.delta(1 << 31, 10), Delta::Reset(10));
        // Near the top it is a wrap (and a reset there cannot be told from one).
        assert_eq!(s.delta(u32::MAX as u64 - 499, 500), Delta::Wrapped(1000));
    }

    #[test]
    fn wrapping_counter_with_impossible_width_is_a_reset() {
        let s = Semantics::Wrapping { bits: 32 };
        assert_eq!(s.delta(1 << 40, 3), Delta::Reset(3));
    }

    #[test]
    fn saturating_counter_never_adds_a_wrap() {
        let s = Semantics::Saturating { bits: 32 };
        let max = u32::MAX as u64;
        assert_eq!(s.delta(max - 10, max), Delta::Saturated(10));
        assert_eq!(s.delta(max, max), Delta::Saturated(0));
        assert_eq!(s.delta(max, 12), Delta::Reset(12));
        assert_eq!(s.delta(10, 20), Delta::Normal(10));
    }

    #[test]
    fn monotonic_decrease_is_a_reset_not_two_to_the_32() {
        let s = Semantics::Monotonic;
        assert_eq!(s.delta(5_000_000_000, 1_000), Delta::Reset(1_000));
        assert_eq!(s.delta(u64::MAX - 1, u64::MAX), Delta::Normal(1));
        assert_eq!(Delta::Reset(1_000).value(), 1_000);
    }
}
