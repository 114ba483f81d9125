//! Sequence numbers across hosts, for cluster `agent diagnose --peers`.
//!
//! MPI and gloo communicators (and NCCL without the profiler plugin) are numbered by each
//! host's agent: the calls it saw each process make, aligned between the processes of one host
//! by [`super::join`]. Two hosts' numbers only agree when both agents counted from the same
//! collective. An agent that started or restarted while the job ran (a DaemonSet rolling
//! update, a crash) counts from where it came in, and joining on the raw numbers pairs
//! different collectives: the clock estimate then finds them contradictory, and every skew is
//! wrong by whole steps.
//!
//! Causality tells the right pairing (the same bound as [`super::clocks`]): when no rank can
//! leave a collective before every rank has entered, host `b`'s clock offset `θ` against the
//! reference host `a` satisfies `max enter(b) − min exit(a) ≤ θ ≤ min exit(b) − max enter(a)`
//! for every collective they share, so the intervals of correctly paired collectives have a
//! common point and those of a wrong pairing (in a job whose collectives are not perfectly
//! periodic) do not. Per communicator, every host is compared with the reference (the host
//! whose numbers run highest: it counted longest; ties: more calls, then the first name): a
//! host whose pairing as numbered is consistent with a clock offset within [`TRUSTED_OFFSET`]
//! keeps its numbers — hosts that counted from the same place are not moved. Otherwise the
//! shifts that put one of its first calls against a reference call within
//! [`MAX_CLOCK_OFFSET`] are tried; among those consistent with every shared collective the one
//! implying the smallest clock offset wins, if smaller than the numbering's own (a perfectly
//! periodic job admits a shift by whole periods with an offset of that many periods: clocks of
//! one cluster agree far better than that). No such shift: the numbers stay, and the clock
//! estimate reports what it finds.

use std::collections::{BTreeMap, HashMap};

use super::join::{aligned_seq, aligns_by_overlap, CallView, SeqOffsets};

/// The largest clock disagreement between two hosts a re-numbering may imply, seconds.
pub const MAX_CLOCK_OFFSET: f64 = 5.0;
/// A clock offset hosts of one cluster plausibly have (NTP keeps them within milliseconds; a
/// quarter second is a badly kept clock): numbers consistent with an offset this small are
/// kept; beyond it, a shift implying a smaller offset is preferred.
pub const TRUSTED_OFFSET: f64 = 0.25;
/// A host's first calls tried against the reference when its numbers contradict it.
const FIRST_CALLS: usize = 4;
/// Shared collectives a candidate shift is screened on before the full check.
const SCREEN: usize = 64;

/// Per aligned number: (latest enter, earliest exit) of one host's calls.
type Spans = BTreeMap<i64, (f64, f64)>;

/// Intersection of the offset intervals of `b`'s collectives (numbers + `shift`) against
/// `a`'s, over at most `limit` shared ones: (lo, hi, shared). `None` when none is shared.
fn offset_interval(a: &Spans, b: &Spans, shift: i64, limit: usize) -> Option<(f64, f64, usize)> {
    let (mut lo, mut hi, mut n) = (f64::NEG_INFINITY, f64::INFINITY, 0usize);
    for (k, sb) in b {
        let Some(sa) = a.get(&(k + shift)) else { continue };
        lo = lo.max(sb.0 - sa.1);
        hi = hi.min(sb.1 - sa.0);
        n += 1;
        if n >= limit {
            break;
        }
    }
    (n > 0).then_some((lo, hi, n))
}

/// How far an interval is from 0 (0 when it holds it).
fn distance_from_zero(lo: f64, hi: f64) -> f64 {
    if lo > 0.0 {
        lo
    } else if hi < 0.0 {
        -hi
    } else {
        0.0
    }
}

/// The shift to add to host `b`'s numbers so its collectives pair with `a`'s.
fn shift_for(a: &Spans, b: &Spans) -> i64 {
    let as_numbered = offset_interval(a, b, 0, usize::MAX).filter(|(lo, hi, _)| lo <= hi).map(|(lo, hi, _)| distance_from_zero(lo, hi));
    if as_numbered.is_some_and(|d| d <= TRUSTED_OFFSET) {
        return 0;
    }
    // Reference calls by their latest enter, to find those within reach of b's first calls.
    let mut by_time: Vec<(f64, i64)> = a.iter().map(|(k, s)| (s.0, *k)).collect();
    by_time.sort_by(|x, y| x.0.total_cmp(&y.0));
    let mut candidates: Vec<(f64, usize, i64)> = Vec::new();
    for (j, sb) in b.iter().take(FIRST_CALLS) {
        let from = by_time.partition_point(|x| x.0 < sb.0 - MAX_CLOCK_OFFSET);
        for &(_, k) in by_time[from..].iter().take_while(|x| x.0 <= sb.0 + MAX_CLOCK_OFFSET) {
            let shift = k - j;
            if candidates.iter().any(|c| c.2 == shift) {
                continue;
            }
            if let Some((lo, hi, n)) = offset_interval(a, b, shift, SCREEN).filter(|(lo, hi, _)| lo <= hi) {
                candidates.push((distance_from_zero(lo, hi), n, shift));
            }
        }
    }
    candidates.sort_by(|x, y| x.0.total_cmp(&y.0).then(y.1.cmp(&x.1)).then(x.2.abs().cmp(&y.2.abs())));
    let bound = as_numbered.unwrap_or(MAX_CLOCK_OFFSET).min(MAX_CLOCK_OFFSET);
    candidates
        .into_iter()
        .filter(|c| c.0 < bound)
        .find(|c| offset_interval(a, b, c.2, usize::MAX).is_some_and(|(lo, hi, _)| lo <= hi && distance_from_zero(lo, hi) < bound))
        .map_or(0, |c| c.2)
}

/// Per `(comm, host)`: the shift to add to that host's numbers (after its processes'
/// `offsets` are taken off) so they match the reference host's. Absent: 0.
pub(super) fn host_shifts<'a>(calls: &[&'a CallView], offsets: &SeqOffsets<'a>) -> HashMap<(&'a str, &'a str), i64> {
    let mut per: BTreeMap<&str, BTreeMap<&str, Spans>> = BTreeMap::new();
    // One host (the daemon's own calls): nothing to align across.
    if calls.iter().all(|c| calls.first().is_some_and(|f| f.host == c.host)) {
        return HashMap::new();
    }
    for c in calls {
        let (Some(comm), Some(raw)) = (c.comm.as_deref(), c.seq) else { continue };
        if !aligns_by_overlap(c) {
            continue;
        }
        let k = aligned_seq(offsets, comm, c, raw);
        let s = per.entry(comm).or_default().entry(c.host.as_str()).or_default().entry(k).or_insert((f64::NEG_INFINITY, f64::INFINITY));
        s.0 = s.0.max(c.enter);
        s.1 = s.1.min(c.exit);
    }
    let mut out = HashMap::new();
    for (comm, hosts) in per {
        // The reference counted longest (its numbers run highest): the others shift up onto
        // it, so no call's number goes below 0 and none is lost.
        let top = |s: &Spans| s.last_key_value().map_or(i64::MIN, |(k, _)| *k);
        let Some((reference, a)) = hosts.iter().max_by(|x, y| top(x.1).cmp(&top(y.1)).then(x.1.len().cmp(&y.1.len())).then(y.0.cmp(x.0))) else { continue };
        for (host, b) in hosts.iter().filter(|(h, _)| *h != reference) {
            let shift = shift_for(a, b);
            if shift != 0 {
                out.insert((comm, *host), shift);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::join::{join_calls, tests::call, Timing};

    /// Two hosts of two ranks, 40 all-reduces at irregular times (a step's length varies),
    /// rank 3 (host b) 20 ms late in every 5th; host b's clock reads `theta` ahead. Host a's
    /// agent has counted since long before (numbers `500 + k`); host b's agent came in at
    /// collective `b_from` and numbers from 0.
    fn job(theta: f64, b_from: u64, a_base: u64) -> Vec<CallView> {
        let mut calls = Vec::new();
        let mut t = 100.0;
        for k in 0..40u64 {
            t += 0.080 + 0.013 * ((k * 7) % 5) as f64;
            let late = if k % 5 == 0 { 0.020 } else { 0.0 };
            let last = t + 0.0004 + late;
            for r in 0..4u32 {
                let enter = t + 1e-4 * f64::from(r) + if r == 3 { late } else { 0.0 };
                let (host, seq, off) = if r < 2 { ("a", Some(a_base + k), 0.0) } else { ("b", k.checked_sub(b_from), theta) };
                let Some(seq) = seq else { continue };
                let mut c = call("w", seq, r, host, enter + off, last + 0.002 + off);
                c.clock.timing = Timing::HostCompletion;
                calls.push(c);
            }
        }
        calls
    }

    /// Joined collectives with all four ranks, as (rank 0's enter, rank 2's enter on a's clock).
    fn pairs(calls: &[CallView], theta: f64) -> Vec<(f64, f64)> {
        let joined = join_calls(calls);
        joined.iter().filter(|c| c.arrivals.len() == 4).map(|c| (c.arrivals[0].enter, c.arrivals[2].enter - theta)).collect()
    }

    #[test]
    fn a_host_whose_agent_came_in_late_is_renumbered_onto_the_reference() {
        for (theta, a_base) in [(0.003, 500), (-0.040, 500), (0.0, 12), (0.030, 0)] {
            let calls = job(theta, 12, a_base);
            let p = pairs(&calls, theta);
            assert_eq!(p.len(), 28, "θ {theta}, a from {a_base}: collectives 12..39 join with their 4 ranks");
            for (a0, b2) in &p {
                assert!((b2 - a0).abs() < 1e-3, "θ {theta}, a from {a_base}: rank 2's call is the same collective as rank 0's ({a0} vs {b2})");
            }
            // The straggler comes back on the collectives where it was late.
            let joined = join_calls(&calls);
            let late = joined.iter().filter(|c| c.arrivals.len() == 4 && c.skew() - theta.max(0.0) > 0.015).count();
            assert!(late >= 5, "θ {theta}: {late} late collectives");
        }
    }

    #[test]
    fn the_host_that_counted_longest_is_the_reference_and_no_call_is_lost() {
        // Host a's agent came in late (numbers from 0 at collective 12); host b's counted since
        // 500 collectives earlier. Host a's calls move up onto b's numbers: none is dropped.
        let calls: Vec<CallView> = job(0.003, 0, 0)
            .into_iter()
            .filter_map(|mut c| {
                let k = c.seq?;
                c.seq = if c.host == "a" { k.checked_sub(12) } else { Some(k + 500) };
                c.seq.map(|_| c)
            })
            .collect();
        let joined = join_calls(&calls);
        assert_eq!(joined.iter().filter(|c| c.arrivals.len() == 4).count(), 28);
        assert!(joined.iter().all(|c| c.seq >= 500), "numbered as host b counts: {:?}", joined.iter().map(|c| c.seq).collect::<Vec<_>>());
        assert_eq!(joined.iter().map(|c| c.arrivals.iter().filter(|a| a.host == "a").count()).sum::<usize>(), 28 * 2);
    }

    #[test]
    fn hosts_that_counted_from_the_same_collective_keep_their_numbers() {
        // Same start, clocks 40 ms apart (half a step): consistent as numbered, never moved.
        let calls = job(0.040, 0, 0);
        let refs: Vec<&CallView> = calls.iter().collect();
        assert!(host_shifts(&refs, &HashMap::new()).is_empty());
        assert_eq!(pairs(&calls, 0.040).len(), 40);
    }

    #[test]
    fn a_perfectly_periodic_job_is_paired_with_the_smallest_clock_offset() {
        // Every step exactly 100 ms: a shift by whole steps is consistent too, with an offset
        // of whole steps; the pairing that needs the clocks to differ least wins.
        let mut calls = Vec::new();
        for k in 0..30u64 {
            let t = 50.0 + 0.1 * k as f64;
            for r in 0..4u32 {
                let (host, seq) = if r < 2 { ("a", Some(k + 7)) } else { ("b", k.checked_sub(3)) };
                let Some(seq) = seq else { continue };
                let mut c = call("w", seq, r, host, t + 1e-4 * f64::from(r), t + 0.002);
                c.clock.timing = Timing::HostCompletion;
                calls.push(c);
            }
        }
        let p = pairs(&calls, 0.0);
        assert_eq!(p.len(), 27);
        assert!(p.iter().all(|(a0, b2)| (b2 - a0).abs() < 1e-3), "{p:?}");
    }
}
