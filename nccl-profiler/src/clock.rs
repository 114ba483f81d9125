//! GPU global timer → host clock. NCCL hands the plugin the GPU's global timer (`pTimer`, ns)
//! at a channel's kernel start and stop; the plugin reads CLOCK_REALTIME when the proxy thread
//! reports them. Two bounds of the offset (host − GPU) follow from causality:
//!
//! - upper: a callback runs after the GPU event it reports, so `host_at_callback − pTimer ≥
//!   offset` for every KernelCh start and stop; the smallest such value is the estimate;
//! - lower: a kernel cannot start before its collective was enqueued, so `host_at_enqueue −
//!   pTimer_start ≤ offset`; the largest such value bounds it from below.
//!
//! The estimate is the upper bound; its error is at most upper − lower. Both are taken over a
//! sliding window of two [`WINDOW_NS`] buckets (2-4 s), so a slow drift between the GPU timer
//! and a slewed CLOCK_REALTIME (tens of ppm: under 0.2 ms over 4 s) is followed.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// One bucket of the window, ns of host time.
pub const WINDOW_NS: u64 = 2_000_000_000;

pub struct OffsetEstimator {
    upper: [AtomicI64; 2],
    lower: [AtomicI64; 2],
    bucket: AtomicU64,
}

impl Default for OffsetEstimator {
    fn default() -> Self {
        OffsetEstimator {
            upper: [AtomicI64::new(i64::MAX), AtomicI64::new(i64::MAX)],
            lower: [AtomicI64::new(i64::MIN), AtomicI64::new(i64::MIN)],
            bucket: AtomicU64::new(0),
        }
    }
}

impl OffsetEstimator {
    /// The bucket for host time `now`, clearing buckets that fell out of the window.
    fn slot(&self, now: u64) -> usize {
        let b = now / WINDOW_NS;
        let cur = self.bucket.load(Ordering::Relaxed);
        if b > cur && self.bucket.compare_exchange(cur, b, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            // The new bucket starts empty; both are stale after a gap of two buckets or more.
            let stale: &[usize] = if b - cur >= 2 { &[0, 1] } else { &[(b & 1) as usize] };
            for &i in stale {
                if let (Some(u), Some(l)) = (self.upper.get(i), self.lower.get(i)) {
                    u.store(i64::MAX, Ordering::Relaxed);
                    l.store(i64::MIN, Ordering::Relaxed);
                }
            }
        }
        (b & 1) as usize
    }

    /// A GPU timestamp `ptimer` reported by a callback that ran at host time `host_ns`.
    pub fn observe_upper(&self, host_ns: u64, ptimer: u64) {
        let i = self.slot(host_ns);
        if let Some(u) = self.upper.get(i) {
            u.fetch_min((host_ns as i64).wrapping_sub(ptimer as i64), Ordering::Relaxed);
        }
    }

    /// A kernel that started at GPU time `ptimer` was enqueued at host time `enqueue_ns`
    /// (observed at host time `host_ns`).
    pub fn observe_lower(&self, host_ns: u64, enqueue_ns: u64, ptimer: u64) {
        let i = self.slot(host_ns);
        if let Some(l) = self.lower.get(i) {
            l.fetch_max((enqueue_ns as i64).wrapping_sub(ptimer as i64), Ordering::Relaxed);
        }
    }

    /// (offset, error bound) in ns, or None before the first observation.
    pub fn estimate(&self) -> Option<(i64, u64)> {
        let u = self.upper.iter().map(|a| a.load(Ordering::Relaxed)).min().unwrap_or(i64::MAX);
        if u == i64::MAX {
            return None;
        }
        let l = self.lower.iter().map(|a| a.load(Ordering::Relaxed)).max().unwrap_or(i64::MIN);
        let err = if l == i64::MIN { u64::MAX } else { (u as i128 - l as i128).clamp(0, u64::MAX as i128 - 1) as u64 };
        Some((u, err))
    }
}

/// CLOCK_REALTIME now, ns.
pub fn realtime_ns() -> u64 {
    read(libc::CLOCK_REALTIME)
}

/// CLOCK_MONOTONIC now, ns.
pub fn monotonic_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

fn read(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer; the clock ids are constants the kernel supports.
    unsafe { libc::clock_gettime(id, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OFF: i64 = 1_000_000_000_000; // host − GPU

    #[test]
    fn offset_is_the_smallest_delay_and_bounded_by_causality() {
        let e = OffsetEstimator::default();
        assert_eq!(e.estimate(), None);
        let t0: u64 = 10 * WINDOW_NS + 1000;
        // Three kernels: GPU starts 5 µs after enqueue; the proxy sees them 40, 7, 90 µs later.
        for (i, delay) in [40_000u64, 7_000, 90_000].into_iter().enumerate() {
            let enqueue = t0 + i as u64 * 1_000_000;
            let start_host = enqueue + 5_000;
            let ptimer = (start_host as i64 - OFF) as u64;
            e.observe_upper(start_host + delay, ptimer);
            e.observe_lower(start_host + delay, enqueue, ptimer);
        }
        let (off, err) = e.estimate().expect("estimate");
        assert_eq!(off, OFF + 7_000, "the smallest observation delay");
        // Lower bound: enqueue − ptimer = OFF − 5 µs; the error bound covers the true offset.
        assert_eq!(err, 12_000);
        assert!(off - err as i64 <= OFF && OFF <= off);
    }

    #[test]
    fn old_observations_leave_the_window() {
        let e = OffsetEstimator::default();
        let t0 = 100 * WINDOW_NS;
        e.observe_upper(t0, (t0 as i64 - OFF) as u64); // delay 0: offset OFF
        e.observe_upper(t0 + WINDOW_NS, (t0 as i64 + WINDOW_NS as i64 - OFF - 3_000) as u64);
        assert_eq!(e.estimate().map(|x| x.0), Some(OFF), "still in the two-bucket window");
        // The GPU timer drifted by 3 µs: two buckets later the old minimum is gone.
        let t2 = t0 + 2 * WINDOW_NS;
        e.observe_upper(t2, (t2 as i64 - OFF - 3_000) as u64);
        assert_eq!(e.estimate().map(|x| x.0), Some(OFF + 3_000));
        assert_eq!(e.estimate().map(|x| x.1), Some(u64::MAX), "no enqueue seen: error unknown");
    }
}
