//! Concurrency and throughput (docs/models.md §2): are there enough requests in flight, and does
//! completion processing keep up.

use serde::Serialize;

use super::{at_least, ceil_robust, non_negative, positive, ModelError};
use crate::units::{Bytes, BytesPerSecond, Seconds};

/// Which term of `B_eff ≤ min(B_path, N·m/T, m/δ)` binds (§2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Bound {
    /// The path's bandwidth.
    Path,
    /// Too few slots: `N·m/T` (reads on PCIe: tags and credits, §2.4).
    Window,
    /// Requests cannot be issued faster than one per δ: `m/δ` (posted writes, §2.4).
    IssueRate,
}

#[derive(Clone, Debug, Serialize)]
pub struct Inflight {
    pub payload: Bytes,
    pub occupancy: Seconds,
    pub bandwidth: BytesPerSecond,
    /// `B·T`
    pub bytes_in_flight: Bytes,
    /// `⌈B·T/m⌉` (§2.1)
    pub required_slots: u64,
    /// `m/B`: the largest issue interval that still fills the path.
    pub max_issue_interval: Seconds,
    /// `N·m/T` when a slot count was given.
    pub window_bound: Option<BytesPerSecond>,
    /// `m/δ` when an issue interval was given.
    pub issue_bound: Option<BytesPerSecond>,
    /// `B·δ`: the payload at which issue rate and bandwidth limit equally.
    pub crossover_payload: Option<Bytes>,
    pub effective: BytesPerSecond,
    pub binding: Bound,
}

/// §2.1–§2.2 for payload `m`, slot occupancy `T`, path bandwidth `B`, optionally `N` slots
/// and a minimum issue interval `δ`.
pub fn inflight(m: Bytes, t: Seconds, b: BytesPerSecond, slots: Option<u64>, delta: Option<Seconds>) -> Result<Inflight, ModelError> {
    positive("payload per request", m.0)?;
    positive("slot occupancy time", t.0)?;
    positive("bandwidth", b.0)?;
    if let Some(n) = slots {
        at_least("slots", n as usize, 1)?;
    }
    if let Some(d) = delta {
        positive("issue interval", d.0)?;
    }
    let bytes_in_flight = b * t;
    let window_bound = slots.map(|n| m * n as f64 / t);
    let issue_bound = delta.map(|d| m / d);
    let mut effective = b;
    let mut binding = Bound::Path;
    for (bound, kind) in [(window_bound, Bound::Window), (issue_bound, Bound::IssueRate)] {
        if let Some(x) = bound {
            if x.0 < effective.0 {
                effective = x;
                binding = kind;
            }
        }
    }
    Ok(Inflight {
        payload: m,
        occupancy: t,
        bandwidth: b,
        bytes_in_flight,
        required_slots: ceil_robust(bytes_in_flight / m) as u64,
        max_issue_interval: m / b,
        window_bound,
        issue_bound,
        crossover_payload: delta.map(|d| b * d),
        effective,
        binding,
    })
}

// ---------------------------------------------------------------------------------------
// §2.3 Completion processing: a slot is free only once software has reaped its completion.

#[derive(Clone, Debug, Serialize)]
pub struct Completions {
    pub ops: usize,
    pub size: Bytes,
    pub slots: usize,
    /// At most one post per interval.
    pub post_interval: Seconds,
    /// Each op completes this long after its post.
    pub completion_delay: Seconds,
    /// Software reaps up to `batch` completions every `period` (first at `period`).
    pub reap_batch: usize,
    pub reap_period: Seconds,
}

impl Completions {
    /// The chapter's example (§2.3): 16 ops of 8 KiB, a post per µs, done 5 µs after post,
    /// 4 completions reaped every 20 µs, 16 slots.
    pub fn chapter() -> Completions {
        Completions {
            ops: 16,
            size: Bytes::kib(8.0),
            slots: 16,
            post_interval: Seconds::us(1.0),
            completion_delay: Seconds::us(5.0),
            reap_batch: 4,
            reap_period: Seconds::us(20.0),
        }
    }
}

/// One request's life.
#[derive(Clone, Debug, Serialize)]
pub struct OpTimeline {
    pub op: usize,
    pub posted: Seconds,
    pub completed: Seconds,
    /// When its completion was processed and the slot freed.
    pub reaped: Seconds,
}

#[derive(Clone, Debug, Serialize)]
pub struct CompletionReport {
    pub timeline: Vec<OpTimeline>,
    /// Last completion: when the data has moved.
    pub transfers_end: Seconds,
    /// Last reap: when every slot is free again.
    pub slots_free: Seconds,
    /// `c/P` items per second.
    pub sustained_items_per_s: f64,
    /// `c/P × item size`.
    pub sustained_rate: BytesPerSecond,
}

/// Event simulation of posts, completions and batched reaping (§2.3).
pub fn completions(c: &Completions) -> Result<CompletionReport, ModelError> {
    at_least("operations", c.ops, 1)?;
    super::at_most("operations", c.ops, MAX_OPS)?;
    at_least("slots", c.slots, 1)?;
    at_least("completions per reap", c.reap_batch, 1)?;
    positive("reap period", c.reap_period.0)?;
    non_negative("post interval", c.post_interval.0)?;
    non_negative("completion delay", c.completion_delay.0)?;
    positive("operation size", c.size.0)?;
    // Reap indices stay exact in f64 (and in usize) over the whole timeline.
    let horizon = (c.post_interval.0 + c.completion_delay.0 + c.reap_period.0) * (c.ops as f64 + 1.0);
    if horizon / c.reap_period.0 > MAX_REAPS {
        return Err(ModelError::Inconsistent {
            what: "reap period",
            detail: format!("{} is too short for a timeline of about {}: at most {MAX_REAPS:e} reap periods", c.reap_period, Seconds(horizon)),
        });
    }
    // Float sums like 15 µs + 5 µs must count as "done by 20 µs".
    let eps = 1e-9 * c.reap_period.0;
    let mut timeline: Vec<OpTimeline> = Vec::with_capacity(c.ops);
    let mut unreaped: Vec<usize> = Vec::new(); // posted, not yet reaped, in post order
    let mut free = c.slots;
    let mut next_reap = 1usize;
    let reap = |k: usize, timeline: &mut Vec<OpTimeline>, unreaped: &mut Vec<usize>| -> usize {
        let at = c.reap_period * k as f64;
        // The completion queue is FIFO in completion order.
        let mut done: Vec<usize> = unreaped.iter().copied().filter(|&i| timeline[i].completed.0 <= at.0 + eps).collect();
        done.sort_by(|&a, &b| timeline[a].completed.0.total_cmp(&timeline[b].completed.0).then(a.cmp(&b)));
        done.truncate(c.reap_batch);
        for &i in &done {
            timeline[i].reaped = at;
        }
        unreaped.retain(|i| !done.contains(i));
        done.len()
    };
    let mut earliest = Seconds(0.0);
    for op in 0..c.ops {
        // Reaps that happen before this post anyway; those before the first unreaped
        // completion reap nothing and are skipped (a post interval of hours is not a
        // billion empty reaps).
        loop {
            next_reap = next_reap.max(first_useful_reap(&timeline, &unreaped, c.reap_period, eps, earliest));
            if (c.reap_period * next_reap as f64).0 > earliest.0 + eps {
                break;
            }
            free += reap(next_reap, &mut timeline, &mut unreaped);
            next_reap += 1;
        }
        let mut posted = earliest;
        while free == 0 {
            next_reap = next_reap.max(first_useful_reap(&timeline, &unreaped, c.reap_period, eps, Seconds(f64::INFINITY)));
            let at = c.reap_period * next_reap as f64;
            free += reap(next_reap, &mut timeline, &mut unreaped);
            next_reap += 1;
            posted = posted.max(at);
        }
        free -= 1;
        timeline.push(OpTimeline { op, posted, completed: posted + c.completion_delay, reaped: Seconds(f64::NAN) });
        unreaped.push(op);
        earliest = posted + c.post_interval;
    }
    while !unreaped.is_empty() {
        next_reap = next_reap.max(first_useful_reap(&timeline, &unreaped, c.reap_period, eps, Seconds(f64::INFINITY)));
        reap(next_reap, &mut timeline, &mut unreaped);
        next_reap += 1;
    }
    let transfers_end = timeline.iter().map(|o| o.completed).fold(Seconds(0.0), Seconds::max);
    let slots_free = timeline.iter().map(|o| o.reaped).fold(Seconds(0.0), Seconds::max);
    let items = c.reap_batch as f64 / c.reap_period.0;
    Ok(CompletionReport { timeline, transfers_end, slots_free, sustained_items_per_s: items, sustained_rate: BytesPerSecond(items * c.size.0) })
}

/// Most operations of a completion timeline (one row each; each reap scans the unreaped ones:
/// 4096 operations with one slot per reap took 3.3 s on a debug build).
pub const MAX_OPS: usize = 1024;
/// Most reap periods a timeline may span (reap indices stay exact in f64).
const MAX_REAPS: f64 = 1e15;

/// The index of the first reap that can reap anything: none before the earliest completion
/// of an unreaped operation; none at all before `until` when nothing is unreaped (the
/// caller's next post). One below the float estimate, so rounding never skips a useful reap.
fn first_useful_reap(timeline: &[OpTimeline], unreaped: &[usize], period: Seconds, eps: f64, until: Seconds) -> usize {
    let first_done = unreaped.iter().map(|&i| timeline[i].completed.0).fold(f64::INFINITY, f64::min);
    let t = first_done.min(until.0);
    if !t.is_finite() {
        return 0;
    }
    (((t - eps) / period.0).floor().max(0.0) as usize).saturating_sub(1)
}

/// Completions per second needed to sustain `b` with items of `size`.
pub fn completions_needed(b: BytesPerSecond, size: Bytes) -> Result<f64, ModelError> {
    positive("item size", size.0)?;
    Ok(b.0 / size.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testutil::{close, digit};

    fn b50() -> BytesPerSecond {
        BytesPerSecond::gb_s(50.0)
    }

    #[test]
    fn check_required_slots() {
        // §2.1 [check]: m = 256 B, T = 2 µs, B = 50 GB/s: 100 000 B in flight, N ≥ 391.
        let r = inflight(Bytes(256.0), Seconds::us(2.0), b50(), None, None).unwrap();
        close(r.bytes_in_flight.0, 100_000.0, 1e-12, "B·T");
        assert_eq!(r.required_slots, 391);
        assert_eq!(r.binding, Bound::Path);
    }

    #[test]
    fn check_effective_bandwidth() {
        // §2.2 [check]: 128 slots 16.4 GB/s; 1 slot 0.128 GB/s; δ = 18.6 ns ≈ 13.7 GB/s at
        // 256 B; full rate at 256 B needs δ ≤ 5.12 ns; 4 KiB: δ ≤ 82 ns and 25 slots;
        // crossover at δ = 18.6 ns ≈ 0.93 KB.
        let t = Seconds::us(2.0);
        let r = inflight(Bytes(256.0), t, b50(), Some(128), None).unwrap();
        digit(r.effective.in_gb_s(), 16.4, 0.1, "128 slots");
        assert_eq!(r.binding, Bound::Window);
        let r = inflight(Bytes(256.0), t, b50(), Some(1), None).unwrap();
        close(r.effective.in_gb_s(), 0.128, 1e-12, "1 slot");
        let r = inflight(Bytes(256.0), t, b50(), None, Some(Seconds::ns(18.6))).unwrap();
        digit(r.effective.in_gb_s(), 13.7, 0.1, "issue rate");
        assert_eq!(r.binding, Bound::IssueRate);
        digit(1.0 / 18.6e-9 / 1e6, 54.0, 1.0, "M req/s");
        close(r.max_issue_interval.in_ns(), 5.12, 1e-12, "δ for 256 B");
        digit(r.crossover_payload.unwrap().0 / 1e3, 0.93, 0.01, "crossover KB");
        let r = inflight(Bytes::kib(4.0), t, b50(), None, None).unwrap();
        digit(r.max_issue_interval.in_ns(), 82.0, 1.0, "δ for 4 KiB");
        assert_eq!(r.required_slots, 25);
    }

    #[test]
    fn check_completion_processing() {
        // §2.3 [check]: 16 slots: transfers end at 20 µs, all slots free at 80 µs; 8 slots:
        // transfers end at 48 µs; sustained 200 000 items/s = 1.64 GB/s; 50 GB/s at 8 KiB
        // needs ≈ 6.1 M completions/s.
        let r = completions(&Completions::chapter()).unwrap();
        digit(r.transfers_end.in_us(), 20.0, 1e-6, "16 slots end");
        digit(r.slots_free.in_us(), 80.0, 1e-6, "slots free");
        close(r.sustained_items_per_s, 200_000.0, 1e-12, "items/s");
        digit(r.sustained_rate.in_gb_s(), 1.64, 0.01, "sustained");
        let r = completions(&Completions { slots: 8, ..Completions::chapter() }).unwrap();
        digit(r.transfers_end.in_us(), 48.0, 1e-6, "8 slots end");
        assert!(r.timeline.iter().all(|o| o.reaped.0 >= o.completed.0));
        digit(completions_needed(b50(), Bytes::kib(8.0)).unwrap() / 1e6, 6.1, 0.1, "completions/s");
    }

    #[test]
    fn slots_never_exceeded() {
        for slots in 1..=16 {
            let r = completions(&Completions { slots, ..Completions::chapter() }).unwrap();
            for o in &r.timeline {
                let held = r.timeline.iter().filter(|x| x.posted.0 <= o.posted.0 && x.reaped.0 > o.posted.0).count();
                assert!(held <= slots, "slots={slots}: {held} held at {}", o.posted);
            }
        }
    }

    #[test]
    fn bad_inputs() {
        assert!(inflight(Bytes(0.0), Seconds::us(2.0), b50(), None, None).is_err());
        assert!(inflight(Bytes(256.0), Seconds::us(2.0), BytesPerSecond(0.0), None, None).is_err());
        assert!(completions(&Completions { reap_batch: 0, ..Completions::chapter() }).is_err());
    }
}
