//! The daemon's hang detector: [`super::evaluate`] over this host's progress at every engine
//! tick, with hysteresis (a raised suspicion holds until the rule has been false for
//! `[hang] clear_after`), a log line when one is raised and cleared, and the metrics
//! `stepwise_collective_open_seconds`, `stepwise_hang_suspected`,
//! `stepwise_hang_missing_ranks` (per communicator, at most [`MAX_COMM_LABELS`]; a finished
//! job's series are removed [`LINGER_SECONDS`] after its last process here) and
//! `stepwise_hang_suspicions_total`.

use crate::export::reference::RegisterSampled as _;
use std::{collections::HashMap, sync::atomic::AtomicU64};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use tracing::{info, warn};

use super::{evaluate, Hang, Why};
use crate::{config::HangConfig, timeline::open::HostProgress};

/// Communicators with their own series at most (the longest-open first).
pub const MAX_COMM_LABELS: usize = 32;
/// How long a communicator none of whose processes lives here keeps its series (at 0).
pub const LINGER_SECONDS: f64 = 600.0;

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CommLabels {
    comm: String,
    library: String,
}

struct Metrics {
    open: Family<CommLabels, Gauge<f64, AtomicU64>>,
    suspected: Family<CommLabels, Gauge>,
    missing: Family<CommLabels, Gauge>,
    raised: Counter,
}

#[derive(Clone, Debug, Default)]
struct State {
    raised: Option<f64>,
    false_since: Option<f64>,
    /// The verdict while raised, kept while the suspicion is held after its call closed.
    last: Option<Hang>,
}

pub struct Detector {
    cfg: HangConfig,
    state: HashMap<String, State>,
    last: Vec<Hang>,
    /// Communicators with series, and when each last had a live process here.
    labelled: Vec<(CommLabels, f64)>,
    metrics: Metrics,
}

impl Detector {
    pub fn new(cfg: HangConfig, r: &mut Registry) -> Detector {
        let metrics = Metrics { open: Family::default(), suspected: Family::default(), missing: Family::default(), raised: Counter::default() };
        r.register_sampled(
            "stepwise_collective_open_seconds",
            "Seconds the oldest open call of a communicator has been open (0: none open)",
            metrics.open.clone(),
        );
        r.register_sampled("stepwise_hang_suspected", "1 while a communicator is suspected hung ([hang] rule, with hysteresis)", metrics.suspected.clone());
        r.register_sampled(
            "stepwise_hang_missing_ranks",
            "Ranks of a communicator not in its oldest open call (not arrived or exited) as seen on this host",
            metrics.missing.clone(),
        );
        r.register_sampled("stepwise_hang_suspicions", "Hang suspicions raised", metrics.raised.clone());
        Detector { cfg, state: HashMap::new(), last: Vec::new(), labelled: Vec::new(), metrics }
    }

    pub fn config(&self) -> &HangConfig {
        &self.cfg
    }

    pub fn set_config(&mut self, cfg: HangConfig) {
        self.cfg = cfg;
    }

    /// The verdicts of the last update.
    pub fn hangs(&self) -> &[Hang] {
        &self.last
    }

    /// Judges `view` at wall time `now`.
    pub fn update(&mut self, view: &HostProgress, now: f64) {
        // Communicators with a live process here keep their series (at 0 when nothing is
        // open); those of finished jobs lose them.
        let live: std::collections::HashSet<&str> = view.comms.iter().filter(|c| c.ranks.iter().any(|r| r.exited.is_none())).map(|c| c.comm.as_str()).collect();
        if !self.cfg.enabled {
            self.last.clear();
            self.publish(&[], &live, now);
            return;
        }
        let mut hangs = evaluate(std::slice::from_ref(view), &self.cfg, false);
        for h in &mut hangs {
            let st = self.state.entry(h.comm.clone()).or_default();
            step(st, h.rule, now, self.cfg.clear_after.as_secs_f64());
            if h.rule && st.raised == Some(now) {
                self.metrics.raised.inc();
                warn!(comm = %h.comm, seq = h.seq, op = %h.op, open_seconds = h.open_seconds, missing = ?missing_ranks(h), desync = h.desync.as_ref().map(|d| d.summary()), "collective suspected hung");
            }
            h.suspected = st.raised.is_some();
            h.suspected_since = st.raised;
            st.last = h.suspected.then(|| h.clone());
        }
        // Communicators with no open call any more: the rule is false for them.
        let open: std::collections::HashSet<&str> = hangs.iter().map(|h| h.comm.as_str()).collect();
        let clear_after = self.cfg.clear_after.as_secs_f64();
        let mut held = Vec::new();
        self.state.retain(|comm, st| {
            if open.contains(comm.as_str()) {
                return true;
            }
            step(st, false, now, clear_after);
            if st.raised.is_none() {
                info!(comm = %comm, "hang suspicion cleared");
            }
            // Held: the last verdict stays visible (rule false, nothing open) until cleared.
            if let Some(mut h) = st.last.clone().filter(|_| st.raised.is_some()) {
                (h.rule, h.open_seconds) = (false, 0.0);
                h.inside.clear();
                held.push(h);
            }
            st.raised.is_some()
        });
        hangs.extend(held);
        self.publish(&hangs, &live, now);
        self.last = hangs;
    }

    fn publish(&mut self, hangs: &[Hang], live: &std::collections::HashSet<&str>, t: f64) {
        let mut shown: Vec<&Hang> = hangs.iter().collect();
        shown.sort_by(|a, b| b.suspected.cmp(&a.suspected).then(b.open_seconds.total_cmp(&a.open_seconds)));
        shown.truncate(MAX_COMM_LABELS);
        let now: Vec<CommLabels> = shown.iter().map(|h| CommLabels { comm: h.comm.clone(), library: h.library.clone() }).collect();
        // A communicator that no longer has an open call reads 0, so a cleared hang is seen
        // going to 0; one none of whose processes has lived here for LINGER_SECONDS (a
        // finished job) loses its series.
        let mut keep: Vec<(CommLabels, f64)> = now.iter().map(|l| (l.clone(), t)).collect();
        for (old, seen) in std::mem::take(&mut self.labelled) {
            if now.contains(&old) {
                continue;
            }
            let seen = if live.contains(old.comm.as_str()) { t } else { seen };
            if t - seen < LINGER_SECONDS && keep.len() < MAX_COMM_LABELS {
                self.metrics.open.get_or_create(&old).set(0.0);
                self.metrics.suspected.get_or_create(&old).set(0);
                self.metrics.missing.get_or_create(&old).set(0);
                keep.push((old, seen));
            } else {
                self.metrics.open.remove(&old);
                self.metrics.suspected.remove(&old);
                self.metrics.missing.remove(&old);
            }
        }
        for (l, h) in now.iter().zip(&shown) {
            self.metrics.open.get_or_create(l).set(h.open_seconds);
            self.metrics.suspected.get_or_create(l).set(i64::from(h.suspected));
            self.metrics.missing.get_or_create(l).set(h.missing.iter().filter(|m| m.why != Why::NotSeen).count() as i64);
        }
        self.labelled = keep;
    }
}

/// Hysteresis: raised as soon as the rule holds; cleared once it has been false for
/// `clear_after` seconds.
fn step(st: &mut State, rule: bool, now: f64, clear_after: f64) {
    if rule {
        st.raised.get_or_insert(now);
        st.false_since = None;
    } else if st.raised.is_some() {
        let since = *st.false_since.get_or_insert(now);
        if now - since >= clear_after {
            *st = State::default();
        }
    }
}

fn missing_ranks(h: &Hang) -> Vec<String> {
    h.missing.iter().filter(|m| m.why != Why::NotSeen).map(|m| format!("{}:{:?}", m.rank.map(|r| r.to_string()).unwrap_or_else(|| "?".into()), m.why)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hysteresis_raises_at_once_and_clears_after_the_hold() {
        let mut st = State::default();
        step(&mut st, true, 10.0, 5.0);
        assert_eq!(st.raised, Some(10.0));
        step(&mut st, true, 10.5, 5.0);
        assert_eq!(st.raised, Some(10.0));
        step(&mut st, false, 11.0, 5.0);
        step(&mut st, true, 12.0, 5.0);
        step(&mut st, false, 13.0, 5.0);
        step(&mut st, false, 17.9, 5.0);
        assert_eq!(st.raised, Some(10.0), "false for 4.9 s only: still raised");
        step(&mut st, false, 18.0, 5.0);
        assert_eq!(st.raised, None);
    }
}
