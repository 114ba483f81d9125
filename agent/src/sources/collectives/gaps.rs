//! When probe events were dropped: the kernel's ring was full and the probe counted the
//! event instead of recording it (`stepwise_probe_drops_total`). The count says how many,
//! not when; the spans here say when, as well as it can be known, so that every step
//! overlapping one is marked incomplete — by the daemon (`Engine::tick`) and, from the same
//! spans on `/api/v1/collectives`, by cluster `agent diagnose`.

use std::collections::VecDeque;

/// How far before the check that saw new drops they may have happened (the probe thread
/// drains every 20 ms, later when starved of CPU).
pub const DROP_MARGIN_SECONDS: f64 = 1.0;
/// Drop spans kept at most (one per check with new drops, merged when consecutive).
const MAX_DROP_SPANS: usize = 100_000;
/// Spans ending longer ago than this are forgotten: steps are attributed from the last ~11
/// minutes and `diagnose` asks for 10 by default.
const KEEP_SECONDS: f64 = 900.0;

/// Wall-time spans in which probe events were dropped.
#[derive(Debug, Default)]
pub struct DropSpans {
    /// The drop count at the previous check.
    seen: u64,
    /// Wall time of the previous check (0: none yet).
    last_check: f64,
    spans: VecDeque<(f64, f64)>,
}

impl DropSpans {
    /// At wall time `now` the probe had dropped `total` events so far. Events dropped since
    /// the previous check were lost in (previous check, now] — or up to
    /// [`DROP_MARGIN_SECONDS`] earlier when the probe thread drained late (a loaded host).
    /// Erring early marks a neighbouring step incomplete; never marking an affected step
    /// complete is the point.
    pub fn record(&mut self, now: f64, total: u64) {
        if total > self.seen {
            let from = if self.last_check > 0.0 { self.last_check.min(now - DROP_MARGIN_SECONDS) } else { now - DROP_MARGIN_SECONDS };
            match self.spans.back_mut() {
                // Drops on consecutive checks: one span.
                Some(last) if last.1 >= from => last.1 = now,
                _ => self.spans.push_back((from, now)),
            }
            if self.spans.len() > MAX_DROP_SPANS {
                self.spans.pop_front();
            }
        }
        self.seen = total;
        self.last_check = now;
        while self.spans.front().is_some_and(|s| s.1 < now - KEEP_SECONDS) {
            self.spans.pop_front();
        }
    }

    /// Spans that end at or after `since`.
    pub fn since(&self, since: f64) -> Vec<(f64, f64)> {
        self.spans.iter().filter(|s| s.1 >= since).copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_drops_span_back_to_the_previous_check_and_merge_when_consecutive() {
        let mut d = DropSpans::default();
        d.record(100.0, 0);
        d.record(100.1, 0);
        assert_eq!(d.since(0.0), vec![], "no drops, no span");
        // Dropped between the checks at 100.1 and 100.2: the span reaches a second back.
        d.record(100.2, 5);
        d.record(100.3, 9);
        assert_eq!(d.since(0.0), vec![(99.2, 100.3)], "consecutive checks with drops are one span");
        d.record(100.4, 9);
        d.record(105.0, 9);
        d.record(105.1, 10);
        assert_eq!(d.since(0.0), vec![(99.2, 100.3), (104.1, 105.1)]);
        assert_eq!(d.since(101.0), vec![(104.1, 105.1)]);
        // A check long after the previous one: the whole gap may hold the drops (here
        // reaching back to the previous span, which it joins).
        d.record(120.0, 11);
        assert_eq!(d.since(106.0), vec![(104.1, 120.0)]);
        // Forgotten after KEEP_SECONDS.
        d.record(120.0 + KEEP_SECONDS + 1.0, 11);
        assert_eq!(d.since(0.0), vec![]);
    }

    #[test]
    fn the_first_check_with_drops_spans_the_margin() {
        let mut d = DropSpans::default();
        d.record(50.0, 3);
        assert_eq!(d.since(0.0), vec![(50.0 - DROP_MARGIN_SECONDS, 50.0)]);
    }
}
