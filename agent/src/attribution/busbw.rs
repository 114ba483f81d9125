//! Algorithm and bus bandwidth of a step's collectives, as nccl-tests defines them
//! (docs/models.md §7): algbw = S / t, with S the collective's data size and t its time;
//! busbw = algbw × a factor of the operation and the rank count n that makes it comparable
//! with the link's peak whatever the algorithm — all_reduce 2(n−1)/n; all_gather,
//! reduce_scatter and all_to_all (n−1)/n; broadcast and reduce 1.
//!
//! S is nccl-tests' size: the buffer of all_reduce, broadcast and reduce (count × element
//! size, the probes' `bytes`), the gathered or scattered whole of all_gather,
//! reduce_scatter and all_to_all (a rank's `bytes` × n). t is the transfer (last arrival to
//! last return): the readiness skew before it is not the network's. Collectives timed at
//! the enqueue (asynchronous NCCL without the profiler plugin), without bytes or rank
//! count, of one rank, or of an operation without a factor (barrier, user probes) are left
//! out.

use crate::timeline::Collective;

/// nccl-tests' bus factor of `op` over `n` ranks, and the multiple of a rank's bytes that is
/// the data size S.
pub fn factor(op: &str, n: u32) -> Option<(f64, u64)> {
    let nf = f64::from(n);
    match op {
        "all_reduce" => Some((2.0 * (nf - 1.0) / nf, 1)),
        "all_gather" | "reduce_scatter" | "all_to_all" => Some(((nf - 1.0) / nf, u64::from(n))),
        "broadcast" | "reduce" => Some((1.0, 1)),
        _ => None,
    }
}

/// A step's collectives' bandwidth: the sums over those that have one.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Bandwidth {
    pub collectives: usize,
    /// Σ S, bytes.
    pub bytes: f64,
    /// Σ t, seconds.
    pub seconds: f64,
    /// Σ S / Σ t.
    pub algbw: f64,
    /// Σ (S × factor) / Σ t.
    pub busbw: f64,
}

/// The bandwidth of `colls` (those measurable), or None when none is.
pub fn of(colls: &[&Collective]) -> Option<Bandwidth> {
    let mut b = Bandwidth::default();
    let mut bus_bytes = 0.0;
    for c in colls {
        if c.host_enqueue_timed() {
            continue;
        }
        let (Some(bytes), Some(n)) = (c.bytes, c.nranks) else { continue };
        let Some((f, mult)) = factor(&c.op, n).filter(|_| n > 1) else { continue };
        let t = c.transfer();
        if t <= 0.0 || bytes == 0 {
            continue;
        }
        let s = bytes.saturating_mul(mult) as f64;
        b.collectives += 1;
        b.bytes += s;
        b.seconds += t;
        bus_bytes += s * f;
    }
    (b.collectives > 0).then(|| Bandwidth { algbw: b.bytes / b.seconds, busbw: bus_bytes / b.seconds, ..b })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::{join::Timing, Arrival};

    fn coll(op: &str, bytes: u64, n: u32, transfer: f64) -> Collective {
        let arrivals = (0..n)
            .map(|r| Arrival { rank: r, host: "a".into(), pid: r, enter: 10.0, exit: 10.0 + transfer, aborted: false, clock: Default::default() })
            .collect();
        Collective { comm: "c".into(), seq: 0, op: op.into(), library: "nccl".into(), bytes: Some(bytes), nranks: Some(n), arrivals }
    }

    #[test]
    fn factors_are_nccl_tests_ones() {
        assert_eq!(factor("all_reduce", 8), Some((1.75, 1)));
        assert_eq!(factor("all_gather", 4), Some((0.75, 4)));
        assert_eq!(factor("reduce_scatter", 2), Some((0.5, 2)));
        assert_eq!(factor("all_to_all", 4), Some((0.75, 4)));
        assert_eq!(factor("broadcast", 16), Some((1.0, 1)));
        assert_eq!(factor("barrier", 4), None);
    }

    #[test]
    fn bandwidth_sums_sizes_over_transfer_times() {
        // 1 GB all_reduce over 8 ranks in 0.1 s: algbw 10 GB/s, busbw 17.5 GB/s.
        let ar = coll("all_reduce", 1_000_000_000, 8, 0.1);
        let b = of(&[&ar]).expect("bandwidth");
        assert!((b.algbw - 1e10).abs() < 1.0 && (b.busbw - 1.75e10).abs() < 1.0, "{b:?}");
        // + a 4-rank all_gather of 250 MB per rank (S = 1 GB) in 0.1 s: algbw 2e9 / 0.2 s.
        let ag = coll("all_gather", 250_000_000, 4, 0.1);
        let b = of(&[&ar, &ag]).expect("bandwidth");
        assert_eq!(b.collectives, 2);
        assert!((b.algbw - 1e10).abs() < 1.0, "{b:?}");
        assert!((b.busbw - (1.75e9 + 0.75e9) / 0.2).abs() < 1.0, "{b:?}");
        // Not measurable: a barrier, unknown bytes, an enqueue-timed call, one rank.
        let mut enq = coll("all_reduce", 1000, 4, 0.1);
        enq.arrivals[0].clock.timing = Timing::HostEnqueue;
        let mut unknown = coll("all_reduce", 1000, 4, 0.1);
        unknown.bytes = None;
        assert_eq!(of(&[&coll("barrier", 0, 4, 0.1), &unknown, &enq, &coll("all_reduce", 1000, 1, 0.1)]), None);
    }
}
