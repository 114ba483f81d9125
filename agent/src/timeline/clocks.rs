//! Host clock offsets from the collectives themselves, for cluster `diagnose`: wall-clock skew
//! across hosts is only as good as the hosts' clocks agree, and NTP on a busy fleet is off by
//! milliseconds — the size of the skew being measured.
//!
//! Causality bounds the offset without assuming anything symmetric: a collective completes on
//! no rank before its last rank has arrived. With host `b`'s clock reading `θ` ahead of the
//! reference host `a`'s, every collective timed at completion (MPI, gloo, blocking NCCL, or the
//! GPU end from the NCCL profiler plugin) gives
//!
//! ```text
//! max enter(b) − min exit(a)  ≤  θ  ≤  min exit(b) − max enter(a)
//! ```
//!
//! and the offset lies in the intersection over the collectives. Each bound is as tight as the
//! shortest time from a last arrival on one host to the first exit on the other, so a few small
//! collectives pin it to microseconds; large transfers only widen it. When the interval holds 0
//! the hosts' clocks are consistent with every collective and are left as they are (the bound
//! is reported); otherwise the host is moved by the interval's midpoint, with half its width as
//! the error bound. Host-timed asynchronous NCCL calls (enqueue times) say nothing about
//! completion and are not used.

use std::collections::BTreeMap;

use serde::Serialize;

use super::join::{Collective, Timing};

/// One host's clock against the reference host.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HostOffset {
    pub host: String,
    /// Seconds this host's clock reads ahead of the reference's (0 when not applied).
    pub offset_seconds: f64,
    /// Bound of the error after correction: the offset is within ± this.
    pub error_seconds: f64,
    /// The causality interval of the offset, seconds.
    pub interval: (f64, f64),
    /// Collectives shared with the reference that bounded it.
    pub collectives: usize,
    /// Whether times of this host were moved by `offset_seconds`.
    pub applied: bool,
}

/// Offsets of every host against `reference`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Clocks {
    pub reference: String,
    pub hosts: Vec<HostOffset>,
    /// Hosts whose collectives contradict each other (the interval is empty: a clock stepped
    /// during the range, or calls timed at enqueue), left uncorrected.
    pub inconsistent: Vec<String>,
}

impl Clocks {
    /// The correction to subtract from `host`'s times.
    pub fn offset(&self, host: &str) -> f64 {
        self.hosts.iter().find(|h| h.host == host && h.applied).map_or(0.0, |h| h.offset_seconds)
    }

    /// Largest error bound among `hosts` (0 for the reference).
    pub fn error(&self, hosts: &[&str]) -> f64 {
        self.hosts.iter().filter(|h| hosts.contains(&h.host.as_str())).map(|h| h.error_seconds).fold(0.0, f64::max)
    }
}

/// Per collective and host: (max enter, min exit) of its completion-timed arrivals.
fn spans(c: &Collective) -> BTreeMap<&str, (f64, f64)> {
    let mut m: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    if c.arrivals.iter().any(|a| a.aborted || a.clock.timing == Timing::HostEnqueue) {
        return m;
    }
    for a in &c.arrivals {
        let e = m.entry(a.host.as_str()).or_insert((f64::NEG_INFINITY, f64::INFINITY));
        e.0 = e.0.max(a.enter);
        e.1 = e.1.min(a.exit);
    }
    m
}

/// Estimates every host's offset against the host that shares the most collectives (ties:
/// the first name). A host sharing no collective with it is not listed.
pub fn estimate(colls: &[Collective]) -> Clocks {
    let per: Vec<BTreeMap<&str, (f64, f64)>> = colls.iter().map(spans).filter(|m| m.len() >= 2).collect();
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for m in &per {
        for h in m.keys() {
            *count.entry(h).or_default() += 1;
        }
    }
    let Some(reference) = count.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))).map(|(h, _)| h.to_string()) else {
        return Clocks::default();
    };
    let mut out = Clocks { reference: reference.clone(), ..Default::default() };
    for host in count.keys().filter(|h| **h != reference) {
        let (mut lo, mut hi, mut n) = (f64::NEG_INFINITY, f64::INFINITY, 0usize);
        for m in &per {
            let (Some(a), Some(b)) = (m.get(reference.as_str()), m.get(host)) else { continue };
            lo = lo.max(b.0 - a.1);
            hi = hi.min(b.1 - a.0);
            n += 1;
        }
        if n == 0 {
            continue;
        }
        if lo > hi {
            out.inconsistent.push(host.to_string());
            continue;
        }
        let applied = lo > 0.0 || hi < 0.0;
        let (offset, error) = if applied { ((lo + hi) / 2.0, (hi - lo) / 2.0) } else { (0.0, (-lo).max(hi)) };
        out.hosts.push(HostOffset { host: host.to_string(), offset_seconds: offset, error_seconds: error, interval: (lo, hi), collectives: n, applied });
    }
    out
}

/// Moves every arrival onto the reference host's clock.
pub fn correct(colls: &mut [Collective], clocks: &Clocks) {
    if !clocks.hosts.iter().any(|h| h.applied) {
        return;
    }
    for c in colls.iter_mut() {
        for a in &mut c.arrivals {
            let off = clocks.offset(&a.host);
            a.enter -= off;
            a.exit -= off;
            if let Some(t) = a.clock.host_enqueue.as_mut() {
                *t -= off;
            }
        }
    }
    colls.sort_by(|a, b| a.first_arrival().total_cmp(&b.first_arrival()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::join::{Arrival, Clocking};

    /// 8 ranks on hosts a (0-3) and b (4-7); b's clock reads `theta` ahead. Step k: every
    /// rank arrives at 10k + jitter, `late` ranks 30 ms later; all exit 2 ms after the last.
    fn job(theta: f64, late: &[(u64, u32)]) -> Vec<Collective> {
        (0..20u64)
            .map(|k| {
                let t = 10.0 * k as f64;
                let enter: Vec<f64> =
                    (0..8u32).map(|r| t + 1e-4 * ((r as u64 * 7 + k * 3) % 5) as f64 + if late.contains(&(k, r)) { 0.030 } else { 0.0 }).collect();
                let exit = enter.iter().cloned().fold(f64::NEG_INFINITY, f64::max) + 0.002;
                let arrivals = (0..8u32)
                    .map(|r| {
                        let (host, off) = if r < 4 { ("a", 0.0) } else { ("b", theta) };
                        let clock = Clocking { timing: Timing::HostCompletion, ..Default::default() };
                        Arrival {
                            rank: r,
                            host: host.into(),
                            pid: r,
                            enter: enter[r as usize] + off,
                            exit: exit + off + 1e-5 * r as f64,
                            aborted: false,
                            clock,
                        }
                    })
                    .collect();
                Collective { comm: "w".into(), seq: k, op: "all_reduce".into(), library: "mpi".into(), bytes: Some(1 << 20), nranks: Some(8), arrivals }
            })
            .collect()
    }

    #[test]
    fn an_offset_clock_is_found_from_causality_and_the_straggler_comes_back() {
        let late: Vec<(u64, u32)> = (0..20).filter(|k| k % 3 == 0).map(|k| (k, 2)).chain((0..20).filter(|k| k % 3 == 1).map(|k| (k, 6))).collect();
        for theta in [0.040, -0.040, 0.020] {
            let mut colls = job(theta, &late);
            // Uncorrected, b's ranks look late (or early) by θ in every step.
            assert!((colls[2].skew() - theta.abs()).abs() < 1e-3, "θ {theta}: raw skew {}", colls[2].skew());
            let clocks = estimate(&colls);
            assert_eq!(clocks.reference, "a");
            let b = &clocks.hosts[0];
            assert!(b.applied && (b.offset_seconds - theta).abs() <= b.error_seconds + 1e-12, "θ {theta}: {b:?}");
            assert!(b.error_seconds < 0.0025, "θ {theta}: error bound {} s", b.error_seconds);
            correct(&mut colls, &clocks);
            for c in &colls {
                let want = if late.iter().any(|l| l.0 == c.seq) { 0.030 } else { 0.0005 };
                assert!((c.skew() - want).abs() <= 0.15 * want.max(0.01), "θ {theta} seq {}: skew {}", c.seq, c.skew());
                if let Some(&(_, r)) = late.iter().find(|l| l.0 == c.seq) {
                    assert_eq!(c.late_rank().map(|a| a.rank), Some(r));
                }
            }
        }
    }

    #[test]
    fn synchronised_clocks_are_left_alone_and_enqueue_times_are_not_used() {
        let mut colls = job(0.0, &[(4, 5)]);
        let clocks = estimate(&colls);
        let b = &clocks.hosts[0];
        assert!(!b.applied && b.offset_seconds == 0.0 && b.interval.0 <= 0.0 && b.interval.1 >= 0.0, "{b:?}");
        let before = colls.clone();
        correct(&mut colls, &clocks);
        assert_eq!(colls, before);
        // Asynchronous host-timed NCCL: nothing to go on.
        let mut colls = job(0.04, &[]);
        for c in &mut colls {
            for a in &mut c.arrivals {
                a.clock.timing = Timing::HostEnqueue;
            }
        }
        assert!(estimate(&colls).hosts.is_empty());
    }
}
