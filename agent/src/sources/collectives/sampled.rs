//! Sampled windows: the hot internal functions of NCCL's network transport (`ncclIbIsend`,
//! `ncclIbIrecv`, `ncclIbTest`: an event per chunk) are probed only for `[collectives]
//! sample_window` every `sample_every` (a period, from one window's start to the next).
//!
//! A window is the time from its last sampled link attached to its close. Its links are then
//! handed to the detacher, and tearing a uprobe down takes about 0.12 s per link on this
//! kernel (12 links: 1.4 s), during which the links still fire. A request counts — in the
//! exported in-flight metrics and in the history the steps' in-flight analysis reads — only
//! when it was *posted* inside a window: its occupancy may run past the close, but requests
//! posted after it were not sampled. Counting them divided the teardown's requests by the
//! window's seconds and raised N = Σ occupancy / sampled seconds; they are counted apart, in
//! `stepwise_net_requests_unsampled_total`.

use std::{collections::VecDeque, time::Instant};

use super::{mono_ns, Collectives};
use crate::ebpf::AttachedLink;

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
}

impl Windows {
    pub fn new() -> Windows {
        let now = Instant::now();
        Windows { spans: VecDeque::new(), started: None, last: now, counted_until: now }
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
    pub fn contains(&self, ns: u64) -> bool {
        self.spans.iter().rev().any(|&(a, b)| a <= ns && ns < b)
    }
}

impl Collectives {
    /// Opens a window when one is due, closes the open one when it has lasted
    /// `sample_window`, and adds the open window's time to the sampled seconds.
    pub(super) fn sample_windows(&mut self) {
        let (every, window) = (self.cfg.sample_every, self.cfg.sample_window);
        match self.windows.started {
            None if self.windows.last.elapsed() >= every => {
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

    /// Closes the open window (its requests posted from now on are not counted) and hands its
    /// links to the detacher.
    pub(super) fn close_window(&mut self) {
        self.windows.close(mono_ns());
        self.windows.started = None;
        let links: Vec<AttachedLink> = self.attached.values_mut().flat_map(|a| std::mem::take(&mut a.sampled_links)).collect();
        for l in links {
            self.probes.detach(l);
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
