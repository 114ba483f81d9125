//! The sources' `detail` in `/api/v1/status`, rebuilt at most once per [`PERIOD`].
//!
//! A source's `status()` is a JSON tree of every device and port: on the 16-NIC fixture,
//! building it (and dropping the previous one) cost about a tenth of a 20 ms sweep's CPU. At a
//! fast interval the sampler rebuilds it every [`every`] sweeps and, in between, moves the
//! previous sweep's detail into the new status instead ([`carry`]), so `sweeps`, `up`,
//! `last_sweep` and `error` stay current while the detail is at most a second old.

use std::time::Duration;

use serde_json::Value;

/// Longest age of a source's detail.
pub const PERIOD: Duration = Duration::from_secs(1);

/// Sweeps between rebuilds of the detail at `interval` (1: every sweep).
pub fn every(interval: Duration) -> u64 {
    u64::try_from(PERIOD.as_nanos().div_ceil(interval.as_nanos().max(1))).unwrap_or(u64::MAX).max(1)
}

/// Moves each source's `detail` from the published status `old` into `new` where `new` has
/// none (null), without copying.
pub fn carry(old: &mut Value, new: &mut Value) {
    let (Some(old), Some(new)) = (old.get_mut("sources").and_then(Value::as_object_mut), new.get_mut("sources").and_then(Value::as_object_mut)) else {
        return;
    };
    for (name, report) in new.iter_mut() {
        let Some(slot) = report.get_mut("detail").filter(|d| d.is_null()) else { continue };
        if let Some(prev) = old.get_mut(name).and_then(|r| r.get_mut("detail")) {
            *slot = std::mem::take(prev);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_covers_one_period() {
        assert_eq!(every(Duration::from_millis(20)), 50);
        assert_eq!(every(Duration::from_millis(300)), 4);
        assert_eq!(every(Duration::from_secs(1)), 1);
        assert_eq!(every(Duration::from_secs(5)), 1);
    }

    #[test]
    fn a_missing_detail_is_moved_from_the_previous_status_and_a_fresh_one_kept() {
        let mut old = json!({"sweeps": 1, "sources": {"rdma": {"up": true, "detail": {"devices": [1]}}, "tcp": {"up": true, "detail": {"x": 1}}}});
        let mut new =
            json!({"sweeps": 2, "sources": {"rdma": {"up": false, "detail": null}, "tcp": {"up": true, "detail": {"x": 2}}, "qdisc": {"detail": null}}});
        carry(&mut old, &mut new);
        assert_eq!(new["sources"]["rdma"], json!({"up": false, "detail": {"devices": [1]}}));
        assert_eq!(new["sources"]["tcp"]["detail"], json!({"x": 2}), "a rebuilt detail is not replaced");
        assert_eq!(new["sources"]["qdisc"]["detail"], Value::Null, "nothing to carry");
        assert_eq!(new["sweeps"], 2);
    }
}
