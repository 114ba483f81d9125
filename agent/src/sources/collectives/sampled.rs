//! Sampled windows: the hot internal functions of NCCL's network transport (`ncclIbIsend`,
//! `ncclIbIrecv`, `ncclIbTest`: an event per chunk) are probed only for `[collectives]
//! sample_window` every `sample_every` (a period, from one window's start to the next).
//!
//! A window is the time from its last sampled link attached to its close. Its links (two
//! uprobe-multi links per library) keep firing for [`DRAIN`] after the close, so that the
//! requests in flight at the close complete under observation, and are then handed to the
//! detacher. A request counts — in the exported in-flight metrics and in the history the
//! steps' in-flight analysis reads — only when it was *posted* inside a window and its
//! completion was seen before the drain ended: its occupancy may run past the close, but
//! requests posted after it were not sampled (counting them divided the drain's requests by
//! the window's seconds and raised N = Σ occupancy / sampled seconds), and a request whose
//! completion is first seen in a later window (NCCL reuses request handles) would count the
//! whole time between the windows. Both are counted apart, in
//! `stepwise_net_requests_unsampled_total`.

use std::{collections::VecDeque, time::Instant};

use super::{mono_ns, Collectives};
use crate::ebpf::AttachedLink;

/// How long a closed window's links keep firing before they are detached.
pub const DRAIN: std::time::Duration = std::time::Duration::from_millis(100);

/// Windows remembered for requests decoded late (the drain runs behind on a loaded host);
/// at the default period this is over ten minutes.
const KEPT: usize = 64;

/// The sampled windows' schedule and their spans.
pub(super) struct Windows {
    /// `[open, close)` in CLOCK_MONOTONIC ns, oldest first; an open window closes at `u64::MAX`.
    spans: VecDeque<(u64, u64)>,
    /// When the open window started (None between windows).
    started: Option<Instant>,
    /// When the last window was due (the period counts from here).
    last: Instant,
    /// Time of the open window already added to `stepwise_net_sampled_seconds_total`.
    counted_until: Instant,
    /// The last window's links while they drain, and until when.
    draining: Vec<AttachedLink>,
    drain_until: Instant,
}

impl Windows {
    pub fn new() -> Windows {
        let now = Instant::now();
        Windows { spans: VecDeque::new(), started: None, last: now, counted_until: now, draining: Vec::new(), drain_until: now }
    }

    /// A window opened at `at_ns` (its links attached).
    pub fn open(&mut self, at_ns: u64) {
        if self.spans.len() >= KEPT {
            self.spans.pop_front();
        }
        self.spans.push_back((at_ns, u64::MAX));
    }

    /// The open window closed at `at_ns`.
    pub fn close(&mut self, at_ns: u64) {
        if let Some(s) = self.spans.back_mut().filter(|s| s.1 == u64::MAX) {
            s.1 = at_ns.max(s.0);
        }
    }

    /// Whether CLOCK_MONOTONIC `ns` lies inside a window.
    #[cfg(test)]
    pub fn contains(&self, ns: u64) -> bool {
        self.spans.iter().rev().any(|&(a, b)| a <= ns && ns < b)
    }

    /// Whether a request posted at `posted_ns` and seen complete at `completed_ns` was
    /// sampled: posted inside a window, completed before that window's drain ended.
    pub fn sampled(&self, posted_ns: u64, completed_ns: u64) -> bool {
        let drain = DRAIN.as_nanos() as u64;
        self.spans.iter().rev().any(|&(a, b)| a <= posted_ns && posted_ns < b && completed_ns < b.saturating_add(drain))
    }
}

impl Collectives {
    /// Opens a window when one is due, closes the open one when it has lasted
    /// `sample_window`, and adds the open window's time to the sampled seconds.
    pub(super) fn sample_windows(&mut self) {
        let (every, window) = (self.cfg.sample_every, self.cfg.sample_window);
        self.end_drain(false);
        match self.windows.started {
            None if self.windows.last.elapsed() >= every && self.windows.draining.is_empty() => {
                self.windows.last = Instant::now();
                self.attach_sampled();
                let now = Instant::now();
                (self.windows.started, self.windows.counted_until) = (Some(now), now);
                if self.sampled_attached() {
                    self.windows.open(mono_ns());
                }
            }
            Some(t) if t.elapsed() >= window => {
                self.count_sampled();
                self.close_window();
            }
            Some(_) => self.count_sampled(),
            None => {}
        }
    }

    /// Closes the open window (its requests posted from now on are not counted); its links
    /// drain for [`DRAIN`].
    pub(super) fn close_window(&mut self) {
        self.windows.close(mono_ns());
        self.windows.started = None;
        let links: Vec<AttachedLink> = self.attached.values_mut().flat_map(|a| std::mem::take(&mut a.sampled_links)).collect();
        self.windows.draining.extend(links);
        self.windows.drain_until = Instant::now() + DRAIN;
    }

    /// Hands the last window's links to the detacher once they have drained (or now, when
    /// `now` says so).
    pub(super) fn end_drain(&mut self, now: bool) {
        if !self.windows.draining.is_empty() && (now || Instant::now() >= self.windows.drain_until) {
            for l in std::mem::take(&mut self.windows.draining) {
                self.probes.detach(l);
            }
        }
    }

    fn sampled_attached(&self) -> bool {
        self.attached.values().any(|a| !a.sampled_links.is_empty())
    }

    /// Adds the time since the last count to the sampled seconds while sampled probes are
    /// attached (a window is skipped while the last one's links are still being torn down;
    /// counted as it goes, so a long window is visible before it closes).
    fn count_sampled(&mut self) {
        let now = Instant::now();
        if self.sampled_attached() {
            self.net_metrics.window(now.duration_since(self.windows.counted_until).as_secs_f64());
        }
        self.windows.counted_until = now;
    }
}

#[cfg(test)]
mod tests {
    use super::Windows;

    #[test]
    fn a_request_counts_only_when_posted_inside_a_window() {
        let mut w = Windows::new();
        assert!(!w.contains(5), "no window yet");
        w.open(100);
        assert!(w.contains(100) && w.contains(10_000_000), "an open window holds everything from its start");
        assert!(!w.contains(99), "posted before the window opened");
        w.close(300);
        assert!(w.contains(299) && !w.contains(300), "closed at 300: the teardown's requests are outside");
        w.open(1_000);
        w.close(1_200);
        assert!(w.contains(150) && w.contains(1_100) && !w.contains(500) && !w.contains(1_200), "between windows nothing was sampled");
        w.close(5_000);
        assert!(!w.contains(1_500), "closing twice does not reopen a closed window");
    }

    #[test]
    fn a_request_counts_only_when_its_completion_was_seen_before_the_drain_ended() {
        let mut w = Windows::new();
        w.open(1_000);
        assert!(w.sampled(1_500, u64::MAX - 1), "the open window: completion whenever");
        w.close(2_000);
        let drain = super::DRAIN.as_nanos() as u64;
        assert!(w.sampled(1_500, 1_900) && w.sampled(1_999, 2_000 + drain - 1), "completed inside the window or its drain");
        assert!(!w.sampled(1_500, 2_000 + drain), "completion first seen after the drain (a later window)");
        assert!(!w.sampled(2_000, 2_001), "posted after the close");
    }

    #[test]
    fn old_windows_are_forgotten_beyond_the_kept_number() {
        let mut w = Windows::new();
        for k in 0..(super::KEPT as u64 + 5) {
            w.open(k * 10);
            w.close(k * 10 + 5);
        }
        assert!(!w.contains(2), "the first window is forgotten");
        let last = (super::KEPT as u64 + 4) * 10;
        assert!(w.contains(last + 1) && !w.contains(last + 5));
    }
}
