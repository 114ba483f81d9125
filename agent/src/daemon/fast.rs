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

use crate::export::reference::RegisterSampled as _;
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
        registry.register_sampled("stepwise_fast_lane_reads", "Fast-lane reads of the traced jobs' NIC counters between full sweeps", lane.reads.clone());
        registry.register_sampled(
            "stepwise_fast_lane_cpu_seconds",
            "CPU time (user + system) of the fast lane, its checks between reads included",
            lane.cpu.clone(),
        );
        registry.register_sampled(
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
            // With nothing in scope a read still runs while a job is at work: a source may
            // find its links then (the tcp source, a new job's connections).
            let wait = if !self.active() {
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
            let elsewhere: f64 = srcs.iter_mut().map(|s| s.fast_cpu_charged_elsewhere()).sum();
            self.next = self.next.max(t) + (cost - elsewhere).max(0.0) / self.share;
            self.cpu.inc_by(cost);
            let next = (now + wait).min(until);
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
    }

    /// One read of every source's fast path, its samples stamped at the read's middle.
    fn read(&mut self, srcs: &mut [Box<dyn Source>], engine: &Arc<Mutex<Engine>>) {
        let t0 = crate::engine::wall_now();
        let read: Vec<bool> = srcs.iter_mut().map(|s| s.fast_sweep(&self.scope)).collect();
        if !read.contains(&true) {
            return;
        }
        let mut found = false;
        for s in srcs.iter_mut() {
            found |= s.fast_found_links();
        }
        if found {
            // The scope as a full sweep would set it now (each source's last values).
            let full: Vec<Vec<NicPart>> = srcs.iter().map(|s| s.nic_samples()).collect();
            self.set_full(&full);
        }
        let mut parts: Vec<NicPart> = Vec::new();
        for (k, s) in srcs.iter().enumerate() {
            // Every source's fields of a NIC add up to its sample: one without a fast read
            // gives its last values (a sample missing them would read as a drop).
            if read[k] {
                parts.extend(s.nic_samples_of(&self.scope));
            } else {
                parts.extend(self.held.get(k).into_iter().flatten().cloned());
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{config::StepsConfig, sources::collectives::history::History, timeline::NicSample};

    /// A source reading `nic` (and `other`, outside the job's scope) whose fast read burns
    /// `burn` of CPU; `fast: false` has no fast read.
    struct Fake {
        fast: bool,
        burn: Duration,
        reads: u64,
        tx: f64,
    }

    impl Source for Fake {
        fn name(&self) -> &'static str {
            "fake"
        }
        fn sweep(&mut self) -> Result<crate::sources::SweepReport, crate::sources::SourceError> {
            Ok(Default::default())
        }
        fn status(&self) -> serde_json::Value {
            serde_json::Value::Null
        }
        fn nic_samples(&self) -> Vec<NicPart> {
            ["rail0", "eth0"]
                .map(|n| (crate::sources::nic::info(n.into(), (n == "rail0").then_some(0), None), NicSample { tx_bytes: self.tx, ..Default::default() }))
                .to_vec()
        }
        fn fast_sweep(&mut self, nics: &BTreeSet<String>) -> bool {
            if !self.fast || !nics.contains("rail0") {
                return false;
            }
            let t = crate::sources::tcp::thread_cpu();
            while crate::sources::tcp::thread_cpu() - t < self.burn.as_secs_f64() {}
            self.reads += 1;
            self.tx += 1.0;
            true
        }
    }

    fn run(active_at: f64, share: f64, burn: Duration, millis: u64) -> (FastLane, Arc<Mutex<Engine>>, Vec<Box<dyn Source>>) {
        let mut reg = Registry::default();
        let mut h = History::new("h".into(), 16);
        h.active_at = active_at;
        let engine = Arc::new(Mutex::new(Engine::new(StepsConfig::default(), "h".into(), &mut reg).expect("engine")));
        let mut lane = FastLane::new(Duration::from_millis(10), share, Some(Arc::new(Mutex::new(h))), &mut reg);
        let mut srcs: Vec<Box<dyn Source>> =
            vec![Box::new(Fake { fast: true, burn, reads: 0, tx: 0.0 }), Box::new(Fake { fast: false, burn, reads: 0, tx: 7.0 })];
        lane.set_full(&srcs.iter().map(|s| s.nic_samples()).collect::<Vec<_>>());
        let (_tx, mut rx) = tokio::sync::watch::channel(false);
        assert!(!lane.run_until(Instant::now() + Duration::from_millis(millis), &mut srcs, &engine, &mut rx));
        (lane, engine, srcs)
    }

    #[test]
    fn reads_the_jobs_nics_while_it_is_at_work_within_the_budget() {
        // At work, with the whole core to spend: one read per 10 ms period.
        let (lane, engine, _) = run(f64::MAX, 1.0, Duration::ZERO, 300);
        let reads = lane.reads.get();
        assert!((10..=31).contains(&reads), "{reads} reads in 300 ms at a 10 ms period, {} s CPU, {} skipped", lane.cpu.get(), lane.skipped.get());
        assert_eq!(lane.scope, BTreeSet::from(["rail0".to_string()]), "a rail: the job's; eth0 is not");
        // Every read pushed rail0's sample: the fast source's bytes plus the held 7 of the
        // source without a fast read (a sample without them would read as a drop).
        let samples = engine.lock().expect("engine").samples(0.0, f64::MAX);
        let rail0: Vec<f64> = samples.iter().filter(|(i, _)| i.name == "rail0").flat_map(|(_, v)| v.iter().map(|s| s.tx_bytes)).collect();
        assert_eq!(rail0.len() as u64, reads, "{rail0:?}");
        assert_eq!(rail0.first().copied(), Some(8.0), "{rail0:?}");
        assert_eq!(rail0.last().copied(), Some(7.0 + reads as f64), "{rail0:?}");
        assert!(samples.iter().all(|(i, _)| i.name != "eth0"), "eth0 is outside the scope: never read by the lane");
        // No job at work for longer than HOLD: nothing read.
        let (idle, _, _) = run(crate::engine::wall_now() - 2.0 * HOLD, 1.0, Duration::ZERO, 300);
        assert_eq!(idle.reads.get(), 0);
        // Reads of 2 ms of CPU at a 1 % budget: one per ~200 ms, however short the period.
        let (slow, _, _) = run(f64::MAX, 0.01, Duration::from_millis(2), 1000);
        let cpu = slow.cpu.get();
        assert!((1..=7).contains(&slow.reads.get()) && cpu < 0.02, "{} reads, {cpu} s CPU in 1 s", slow.reads.get());
    }
}
