//! The fast lane. The full sweep runs every `interval` (1 s by default); a collective's
//! transfer lasts milliseconds to a few hundred, and its counter window is interpolated
//! between the samples around it — at 1 s apart, the window is the second's even share, not
//! the transfer's own bytes, pauses and queues. So while a traced job's collectives are at
//! work (a call, transport request or profiler record in the last [`HOLD`] seconds, or a
//! call still open), the sampler reads again, every `[sources] fast_interval` (10 ms), only
//! what attribution needs of only the NICs the job uses: each source's
//! [`Source::fast_sweep`] (netdev statistics through open sysfs files, the traced
//! connections' `tcp_info` one by one) and their per-NIC samples into the engine. Sources
//! without a fast read (ethtool, qdisc, RDMA) keep their last full sweep's values, which are
//! cumulative: their changes land at the next full sweep.
//!
//! A CPU budget (`[sources] fast_cpu_budget`, 1 % of a core) bounds it: a read that cost c
//! seconds of the sampler thread's CPU is followed by the next no sooner than c / budget
//! later, whatever the period.

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use prometheus_client::{metrics::counter::Counter, registry::Registry};

use crate::{
    engine::Engine,
    sources::{collectives::SharedHistory, nic::NicPart, Source},
};

/// Seconds after the last sign of a traced collective during which the lane keeps reading
/// (an asynchronous NCCL call's transfer follows its host call by up to its queue's length).
pub const HOLD: f64 = 2.0;
/// How often the lane looks for a job at work while there is none.
pub const IDLE_POLL: Duration = Duration::from_millis(100);

pub struct FastLane {
    period: Duration,
    /// Fraction of one core it may use (`[sources] fast_cpu_budget`).
    share: f64,
    /// When the next read may start (seconds since `started`).
    next: f64,
    history: Option<SharedHistory>,
    /// The NICs read: those with a rail (RDMA ports; rails configured) and those the traced
    /// processes' own bytes left by, as of the last full sweep.
    scope: BTreeSet<String>,
    /// Per source, its samples of those NICs at the last full sweep.
    held: Vec<Vec<NicPart>>,
    started: Instant,
    reads: Counter,
    cpu: Counter<f64, std::sync::atomic::AtomicU64>,
    skipped: Counter,
}

impl FastLane {
    pub fn new(period: Duration, share: f64, history: Option<SharedHistory>, registry: &mut Registry) -> FastLane {
        let lane = FastLane {
            period,
            share: share.clamp(1e-6, 1.0),
            next: 0.0,
            history,
            scope: BTreeSet::new(),
            held: Vec::new(),
            started: Instant::now(),
            reads: Counter::default(),
            cpu: Counter::default(),
            skipped: Counter::default(),
        };
        registry.register("stepwise_fast_lane_reads", "Fast-lane reads of the traced jobs' NIC counters between full sweeps", lane.reads.clone());
        registry.register("stepwise_fast_lane_cpu_seconds", "CPU time (user + system) of the fast lane, its checks between reads included", lane.cpu.clone());
        registry.register(
            "stepwise_fast_lane_skipped",
            "Fast-lane reads left out: the job idle, or to stay within [sources] fast_cpu_budget",
            lane.skipped.clone(),
        );
        lane
    }

    /// After a full sweep, from each source's samples (in the sources' order): the NICs to
    /// read, and what the sources without a fast read hold until the next.
    pub fn set_full(&mut self, per_source: &[Vec<NicPart>]) {
        let all = per_source.iter().flatten();
        self.scope = all.filter(|(i, s)| i.rail.is_some() || s.own_tx.iter().flatten().any(|(_, b)| *b > 0.0)).map(|(i, _)| i.name.clone()).collect();
        self.held = per_source.iter().map(|parts| parts.iter().filter(|(i, _)| self.scope.contains(&i.name)).cloned().collect()).collect();
    }

    /// Whether a traced collective was at work in the last [`HOLD`] seconds.
    fn active(&self) -> bool {
        let Some(h) = &self.history else { return false };
        let at = h.lock().map(|h| h.active_at).unwrap_or_else(|p| p.into_inner().active_at);
        at >= crate::engine::wall_now() - HOLD
    }

    /// Reads until `until` (the next full sweep); `true` when `stop` said so. Polls for a
    /// job at work every [`IDLE_POLL`] while there is none, reads every period while there
    /// is, and waits out the budget in between.
    pub fn run_until(
        &mut self,
        until: Instant,
        srcs: &mut [Box<dyn Source>],
        engine: &Arc<Mutex<Engine>>,
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) -> bool {
        let mut cpu = crate::sources::tcp::thread_cpu();
        loop {
            if *stop.borrow_and_update() {
                return true;
            }
            let now = Instant::now();
            if now >= until {
                return false;
            }
            let t = self.started.elapsed().as_secs_f64();
            let wait = if self.scope.is_empty() || !self.active() {
                IDLE_POLL
            } else if t < self.next {
                self.skipped.inc();
                Duration::from_secs_f64(self.next - t).max(self.period)
            } else {
                self.read(srcs, engine);
                self.reads.inc();
                self.period
            };
            // The budget pays for everything the lane does — its checks and the wake-ups of
            // its sleeps too: seconds of CPU at `share` of a core push the next read back by
            // cost / share.
            let c = crate::sources::tcp::thread_cpu();
            let cost = (c - cpu).max(0.0);
            cpu = c;
            self.next = self.next.max(t) + cost / self.share;
            self.cpu.inc_by(cost);
            let next = (now + wait).min(until);
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
    }

    /// One read of every source's fast path, its samples stamped at the read's middle.
    fn read(&self, srcs: &mut [Box<dyn Source>], engine: &Arc<Mutex<Engine>>) {
        let t0 = crate::engine::wall_now();
        let mut any = false;
        let mut parts: Vec<NicPart> = Vec::new();
        for (k, s) in srcs.iter_mut().enumerate() {
            // Every source's fields of a NIC add up to its sample: one without a fast read
            // gives its last values (a sample missing them would read as a drop).
            if s.fast_sweep(&self.scope) {
                any = true;
                parts.extend(s.nic_samples_of(&self.scope));
            } else {
                parts.extend(self.held.get(k).into_iter().flatten().cloned());
            }
        }
        if !any {
            return;
        }
        let t1 = crate::engine::wall_now();
        if let Ok(mut e) = engine.lock() {
            e.push_samples(t0 + (t1 - t0) / 2.0, parts);
        }
    }

    /// For `/api/v1/status`.
    pub fn status(&self) -> serde_json::Value {
        serde_json::json!({
            "period_seconds": self.period.as_secs_f64(),
            "cpu_budget": self.share,
            "nics": self.scope,
            "active": self.active(),
            "reads": self.reads.get(),
            "skipped_for_budget": self.skipped.get(),
        })
    }
}
