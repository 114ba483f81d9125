//! Readiness skew (docs/models.md §3.2): a collective starts when its last participant is
//! ready, so [first arrival, last arrival] of each collective is time the step waited for a
//! late rank. Overlapping collectives are counted once (the union of their intervals).
//!
//! Inputs: each collective's arrivals (when each rank's data was ready) and exits. Evidence:
//! the late rank (largest summed lateness over the step), its host and seconds, the ranks
//! seen. Per rank: seconds late after the first rank, seconds waiting for the last, seconds
//! inside collectives.

use std::collections::BTreeMap;

use super::RankTime;
use crate::timeline::Collective;

/// Per-rank accumulators: a dense vector for the usual ranks 0..N, a map beyond.
#[derive(Default)]
pub(super) struct RankAcc {
    dense: Vec<Option<RankTime>>,
    sparse: BTreeMap<u32, RankTime>,
}

impl RankAcc {
    const DENSE: u32 = 4096;
    pub fn get(&mut self, rank: u32, host: &str) -> &mut RankTime {
        let new = || RankTime { rank, host: host.to_string(), ..Default::default() };
        if rank < Self::DENSE {
            let i = rank as usize;
            if self.dense.len() <= i {
                self.dense.resize(i + 1, None);
            }
            self.dense[i].get_or_insert_with(new)
        } else {
            self.sparse.entry(rank).or_insert_with(new)
        }
    }
    pub fn into_vec(self) -> Vec<RankTime> {
        self.dense.into_iter().flatten().chain(self.sparse.into_values()).collect()
    }
}

/// Union bookkeeping: length of [a, b] not yet covered, then cover it. The spans are kept
/// sorted and disjoint (touching spans merge), so a step's collectives — which mostly arrive
/// in time order — cost a binary search each instead of a pass over every earlier span.
#[derive(Default)]
pub(super) struct Cover {
    pub spans: Vec<(f64, f64)>,
}

impl Cover {
    pub fn take(&mut self, a: f64, b: f64) -> f64 {
        if b <= a {
            return 0.0;
        }
        // Spans that overlap or touch [a, b]: sorted and disjoint, so they are contiguous.
        let lo = self.spans.partition_point(|&(_, y)| y < a);
        let hi = lo + self.spans[lo..].partition_point(|&(x, _)| x <= b);
        let mut free = b - a;
        let (mut na, mut nb) = (a, b);
        for &(x, y) in &self.spans[lo..hi] {
            free -= (b.min(y) - a.max(x)).max(0.0);
            na = na.min(x);
            nb = nb.max(y);
        }
        self.spans.splice(lo..hi, [(na, nb)]);
        free.max(0.0)
    }
}

/// One collective's place in the step: its skew and transfer not yet covered by an earlier
/// collective, and the share of its transfer that is new.
pub(super) struct Span {
    pub skew: f64,
    pub transfer: f64,
    /// The transfer inside the step, covered or not.
    pub full: f64,
    pub frac: f64,
}

/// Adds collective `c` to the step's cover and its ranks' lateness; the step is [t0, t1].
pub(super) fn add(cover: &mut Cover, ranks: &mut RankAcc, c: &Collective, t0: f64, t1: f64) -> Span {
    let (c_first, c_last, c_exit) = (c.first_arrival(), c.last_arrival(), c.last_exit());
    let (first, last) = (c_first.clamp(t0, t1), c_last.clamp(t0, t1));
    let exit = c_exit.clamp(t0, t1);
    // An asynchronous NCCL call timed at its enqueue says nothing of when the rank's GPU
    // reached the collective: no skew and no lateness are charged from it (see
    // `timing_evidence` for what the step gets instead).
    let enqueue = c.host_enqueue_timed();
    let skew = if enqueue { 0.0 } else { cover.take(first, last) };
    let transfer = cover.take(last, exit.max(last));
    // Share of this transfer not already covered by an earlier, overlapping collective
    // (another communicator of the step): its ideal and excess are charged only for that
    // share, so overlapping time is not counted twice.
    let full = exit.max(last) - last;
    let frac = if full > 0.0 { (transfer / full).clamp(0.0, 1.0) } else { 1.0 };
    for a in &c.arrivals {
        let r = ranks.get(a.rank, &a.host);
        if !enqueue {
            r.late_seconds += (a.enter - c_first).max(0.0);
            r.wait_seconds += (c_last - a.enter).max(0.0);
        }
        r.inside_seconds += (a.exit - a.enter).max(0.0);
    }
    Span { skew, transfer, full, frac }
}

/// The late rank (largest summed lateness) and the skew cause's evidence.
pub(super) fn late_rank(ranks: &[RankTime]) -> (Option<RankTime>, BTreeMap<String, serde_json::Value>) {
    let late = ranks.iter().max_by(|a, b| a.late_seconds.total_cmp(&b.late_seconds)).filter(|r| r.late_seconds > 0.0).cloned();
    let ev = match &late {
        Some(r) => super::ev(&[
            ("late_rank", r.rank.into()),
            ("late_host", r.host.clone().into()),
            ("late_rank_seconds", r.late_seconds.into()),
            ("ranks", ranks.len().into()),
        ]),
        None => super::ev(&[("ranks", ranks.len().into())]),
    };
    (late, ev)
}

/// What the step's timing sources add (issue 14): a note and the host enqueue skew (in the
/// readiness-skew evidence) when NCCL calls were timed at enqueue, and the NCCL proxy wait
/// totals (in the in-flight evidence) from the profiler plugin.
pub(super) fn timing_evidence(colls: &[&Collective], causes: &mut [super::Cause], notes: &mut Vec<String>) {
    use crate::timeline::join::{host_enqueue_skew, proxy_wait_total};
    let find = |causes: &mut [super::Cause], k: super::CauseKind| causes.iter_mut().position(|c| c.kind == k);
    if let Some((secs, rank)) = host_enqueue_skew(colls) {
        let who = rank.map(|r| format!(", rank {r} enqueued last most often")).unwrap_or_default();
        notes.push(format!(
            "host-only timing: NCCL calls return once their work is enqueued (no profiler plugin, CUDA_LAUNCH_BLOCKING unset), so readiness skew is not computed from them; host enqueue skew {:.1} ms{who} (a CPU figure: it names no straggler). Load the NCCL profiler plugin for GPU timing (docs/profiler-plugin.md)",
            secs * 1e3
        ));
        if let Some(i) = find(causes, super::CauseKind::ReadinessSkew) {
            causes[i].evidence.insert("host_enqueue_skew_seconds".into(), secs.into());
        }
    }
    if let Some(w) = proxy_wait_total(colls) {
        if let Some(i) = find(causes, super::CauseKind::InFlightLimit) {
            causes[i].evidence.insert("nccl_proxy_wait_seconds".into(), w.waits());
        }
    }
}

/// §3.2 across hosts whose clocks are known only to ± `clock_error`: when that is no better
/// than the step's wall-clock readiness skew, the clock-free estimate `free` (with its late
/// rank) replaces it through [`use_clock_free`] — unless it is refuted. Each collective's
/// wall-clock skew is off by at most the clocks' error, so the true skew lies within the
/// wall-clock figure ± the error per collective; an estimate outside that band is ruled out
/// by causality (the time inside a call also varies with each rank's place in the algorithm,
/// not only with lateness) and the wall-clock figure stays. Every case leaves a note.
pub fn fall_back_to_clock_free(a: &mut super::Attribution, free: Option<f64>, late: Option<u32>, clock_error: f64, collectives: usize) {
    use crate::report::duration;
    let wall = a.cause(super::CauseKind::ReadinessSkew);
    if clock_error <= 0.0 || clock_error < wall {
        return;
    }
    let why =
        format!("the hosts' clocks are known to ± {} only, not better than this step's wall-clock readiness skew ({})", duration(clock_error), duration(wall));
    let band = clock_error * collectives.max(1) as f64;
    let note = match free {
        Some(f) if (f - wall).abs() <= band => {
            use_clock_free(a, f, late, clock_error);
            format!("{why}: readiness skew is the clock-free estimate ({})", duration(f))
        }
        Some(f) => format!(
            "{why}, but the clock-free estimate ({}) lies outside what the clocks allow ({} ± {}): not used, readiness skew stays the wall-clock figure",
            duration(f),
            duration(wall),
            duration(band)
        ),
        None => format!("{why}, and no collective of it was seen on two ranks for a clock-free estimate"),
    };
    a.notes.push(note);
}

/// §3.2 without clocks, for a step whose ranks ran on hosts whose clocks are known only to
/// ± `clock_error`, no better than its wall-clock skew: the readiness skew becomes the
/// clock-free estimate `free` — over the step's collectives, the spread of the ranks' time
/// inside the call (a blocking collective completes on every rank together, so the last rank
/// to arrive spends the least time inside) — and its late rank the one that spent the least
/// time inside most. What the wall clocks charged beyond it goes to `unexplained`; a larger
/// clock-free skew takes its excess from `unexplained` only (it cannot exceed what the models
/// left unexplained beyond the wall-clock figure), so the causes still sum to the step.
pub fn use_clock_free(a: &mut super::Attribution, free: f64, late: Option<u32>, clock_error: f64) {
    use super::CauseKind::{ReadinessSkew, Unexplained};
    let (Some(si), Some(ui)) = (a.causes.iter().position(|c| c.kind == ReadinessSkew), a.causes.iter().position(|c| c.kind == Unexplained)) else {
        return;
    };
    let wall = a.causes[si].seconds;
    let spare = a.causes[ui].seconds.max(0.0);
    let skew = free.max(0.0).min(wall + spare);
    a.causes[si].seconds = skew;
    a.causes[ui].seconds -= skew - wall;
    let c = &mut a.causes[si];
    c.rank = late;
    c.evidence.insert("estimate".into(), "clock_free".into());
    c.evidence.insert("wall_clock_seconds".into(), wall.into());
    c.evidence.insert("clock_error_seconds".into(), clock_error.into());
    c.evidence.insert("clock_free_seconds".into(), free.into());
    match late {
        Some(r) => {
            c.evidence.insert("late_rank".into(), r.into());
            if let Some(h) = a.ranks.iter().find(|x| x.rank == r) {
                c.evidence.insert("late_host".into(), h.host.clone().into());
            }
        }
        None => {
            c.evidence.remove("late_rank");
            c.evidence.remove("late_host");
        }
    }
    c.evidence.remove("late_rank_seconds");
    c.fix = match late {
        Some(r) if skew > 0.0 => format!(
            "rank {r} spent the least time inside the step's collectives (clock-free estimate: the hosts' clocks are known to ± {} only): look upstream of the collective on that rank (input pipeline, host jitter, a slower GPU, CPU contention) — the network is not the cause",
            crate::report::duration(clock_error)
        ),
        _ => String::new(),
    };
    let total = a.seconds;
    for c in &mut a.causes {
        c.share = if total > 0.0 { c.seconds / total } else { 0.0 };
    }
    a.causes.sort_by(|x, y| y.seconds.total_cmp(&x.seconds));
}

#[cfg(test)]
mod tests {
    use super::Cover;

    /// The union length of `spans`, by sorting and sweeping (the reference).
    fn union_len(mut spans: Vec<(f64, f64)>) -> f64 {
        spans.retain(|s| s.1 > s.0);
        spans.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (mut len, mut end) = (0.0, f64::NEG_INFINITY);
        for (a, b) in spans {
            len += (b - a.max(end)).max(0.0);
            end = end.max(b);
        }
        len
    }

    #[test]
    fn cover_takes_exactly_what_the_union_grows_by_in_any_order() {
        // Pseudo-random spans on a coarse grid (so touching and nested spans happen), in
        // random order: each take is the growth of the union, and the spans stay sorted and
        // disjoint.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..200 {
            let (mut cover, mut seen) = (Cover::default(), Vec::new());
            for _ in 0..40 {
                let a = next(100) as f64 * 0.5;
                let b = a + next(12) as f64 * 0.5;
                let before = union_len(seen.clone());
                seen.push((a, b));
                let got = cover.take(a, b);
                assert!((got - (union_len(seen.clone()) - before)).abs() < 1e-9, "take({a}, {b}) = {got} after {seen:?}");
                assert!(cover.spans.windows(2).all(|w| w[0].1 < w[1].0), "not sorted and disjoint: {:?}", cover.spans);
            }
            let total: f64 = cover.spans.iter().map(|s| s.1 - s.0).sum();
            assert!((total - union_len(seen)).abs() < 1e-9);
        }
    }
}
