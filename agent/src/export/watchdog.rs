//! Sweep watchdog: a source whose sweep has not finished within a deadline is reported, not
//! hidden. The sampler marks the source it is sweeping; whoever asks (`/readyz`, a `/metrics`
//! scrape) sees a sweep older than the deadline: `stepwise_source_up{source}` drops to 0, the
//! stall is counted once in `stepwise_source_stalls_total{source}`, and `/readyz` answers 503
//! naming the source. Before, a sampler blocked in a read left `/readyz` "ready" and
//! `source_up` 1 while `/metrics` served stale values.

use crate::export::reference::RegisterSampled as _;
use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::metrics::{AgentMetrics, SourceLabel};

#[derive(Debug, Default)]
struct State {
    /// The source being swept and since when.
    current: Option<(&'static str, Instant)>,
    /// The current sweep was already reported as stalled.
    reported: bool,
}

#[derive(Clone)]
pub struct Watchdog {
    state: Arc<Mutex<State>>,
    up: Family<SourceLabel, Gauge>,
    stalls: Family<SourceLabel, Counter>,
    deadline: Duration,
}

impl Watchdog {
    pub fn register(registry: &mut Registry, metrics: &AgentMetrics, deadline: Duration) -> Watchdog {
        let stalls = Family::<SourceLabel, Counter>::default();
        registry.register_sampled(
            "stepwise_source_stalls",
            "Sweeps of a source that did not finish within the deadline (10 intervals, at least 5 s)",
            stalls.clone(),
        );
        Watchdog { state: Arc::default(), up: metrics.source_up.clone(), stalls, deadline }
    }

    /// Ten sampling intervals, at least 5 s.
    pub fn deadline_for(interval: Duration) -> Duration {
        (interval * 10).max(Duration::from_secs(5))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The sampler starts sweeping `source`.
    pub fn begin(&self, source: &'static str) {
        *self.lock() = State { current: Some((source, Instant::now())), reported: false };
    }

    /// The sweep finished (the sampler sets `source_up` itself).
    pub fn end(&self) {
        *self.lock() = State::default();
    }

    /// The source stuck in its sweep past the deadline, and for how long; the first time a
    /// sweep is seen stuck, its `source_up` goes to 0 and the stall is counted.
    pub fn stuck(&self) -> Option<(&'static str, Duration)> {
        let mut g = self.lock();
        let (source, since) = g.current?;
        let age = since.elapsed();
        if age < self.deadline {
            return None;
        }
        if !g.reported {
            g.reported = true;
            let l = SourceLabel { source };
            self.up.get_or_create(&l).set(0);
            self.stalls.get_or_create(&l).inc();
            tracing::warn!(source, "{source}: sweep not finished after {age:?}; source_up 0 until it does");
        }
        Some((source, age))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_past_the_deadline_is_reported_once_and_clears_when_it_ends() {
        let mut reg = Registry::default();
        let m = AgentMetrics::register(&mut reg, false);
        let w = Watchdog::register(&mut reg, &m, Duration::from_millis(30));
        let l = SourceLabel { source: "rdma" };
        m.source_up.get_or_create(&l).set(1);
        assert_eq!(w.stuck(), None, "not sweeping");
        w.begin("rdma");
        assert_eq!(w.stuck(), None, "within the deadline");
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(w.stuck().map(|s| s.0), Some("rdma"));
        assert_eq!(w.stuck().map(|s| s.0), Some("rdma"));
        assert_eq!(m.source_up.get_or_create(&l).get(), 0);
        assert_eq!(w.stalls.get_or_create(&l).get(), 1, "one stall, however often asked");
        w.end();
        assert_eq!(w.stuck(), None);
        assert_eq!(Watchdog::deadline_for(Duration::from_millis(100)), Duration::from_secs(5));
        assert_eq!(Watchdog::deadline_for(Duration::from_secs(2)), Duration::from_secs(20));
    }
}
