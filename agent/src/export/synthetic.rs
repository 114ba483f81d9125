//! A synthetic training job's history, as the agents of its hosts would hold it: every rank's
//! collective calls in each host's [`History`], every rail's counter samples in each host's
//! [`Engine`]. Served through the real API router by [`super::replay`], it lets `agent
//! diagnose --peers` be tested and benchmarked at cluster scale (128 hosts × 8 ranks) on one
//! machine, without eBPF or GPUs.
//!
//! The job: `hosts × ranks_per_host` ranks in one world communicator; each step is `compute`
//! seconds of work (plus up to `jitter` per rank, deterministic) then one all-reduce of
//! `bytes` that returns `transfer` seconds after the last rank entered it. Steps are found by
//! the period of those all-reduces (no markers), so step `k` is the work before all-reduce `k`
//! and the all-reduce itself, for `k` in `1..=steps` (all-reduce 0 only starts the job). A
//! [`Straggler`] enters its step's all-reduce `late` seconds after it would have. Each host's
//! rail `i` (local rank `i`'s NIC) carries that rank's ring traffic, 2(p−1)/p × `bytes` per
//! all-reduce, spread over the transfer, and is sampled every `sample_interval`.

use std::sync::{Arc, Mutex};

use prometheus_client::registry::Registry;

use super::api::AppState;
use crate::{
    config::StepsConfig,
    engine::Engine,
    sources::collectives::{
        decode::{Call, CommId},
        history::{ClockMap, History},
        targets::Family,
    },
    timeline::{NicInfo, NicSample},
};

/// One rank made late in one step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Straggler {
    pub step: u64,
    pub rank: u32,
    /// Seconds it enters the step's all-reduce after it would have.
    pub late: f64,
}

/// The job (see the module documentation).
#[derive(Clone, Debug)]
pub struct Job {
    pub hosts: usize,
    pub ranks_per_host: u32,
    pub steps: u64,
    /// Wall time the first step's work begins (seconds since the epoch).
    pub start: f64,
    pub compute: f64,
    /// Most extra work one rank does in one step (uniform, from a hash of step and rank).
    pub jitter: f64,
    pub transfer: f64,
    pub bytes: u64,
    /// Counter sampling interval of every host (the agent's default is 1 s).
    pub sample_interval: f64,
    /// Nominal rate of every rail, bytes/s.
    pub rail_rate: f64,
    pub stragglers: Vec<Straggler>,
}

/// The world communicator's id.
pub const WORLD: CommId = CommId(0x5e9f_1024_0000_0001);

impl Job {
    /// 128 hosts × 8 ranks, 1 000 steps of 45 ms work (≤ 20 µs jitter) and a 64 MiB all-reduce
    /// taking 5 ms, 400 Gb/s rails sampled every second, ending `end` (wall seconds); four
    /// stragglers, the slowest rank 517 by 40 ms in step 733.
    pub fn cluster_1024(end: f64) -> Job {
        let mut j = Job {
            hosts: 128,
            ranks_per_host: 8,
            steps: 1000,
            start: 0.0,
            compute: 0.045,
            jitter: 20e-6,
            transfer: 0.005,
            bytes: 64 << 20,
            sample_interval: 1.0,
            rail_rate: 50e9,
            stragglers: vec![
                Straggler { step: 120, rank: 3, late: 0.012 },
                Straggler { step: 401, rank: 1000, late: 0.020 },
                Straggler { step: 733, rank: 517, late: 0.040 },
                Straggler { step: 950, rank: 64, late: 0.008 },
            ],
        };
        j.start = end - j.duration();
        j
    }

    pub fn ranks(&self) -> u32 {
        self.hosts as u32 * self.ranks_per_host
    }

    /// Nominal wall time from the first step's work to the last all-reduce's return.
    pub fn duration(&self) -> f64 {
        let late: f64 = self.stragglers.iter().map(|s| s.late).sum();
        (self.steps + 1) as f64 * (self.compute + self.jitter + self.transfer) + late
    }

    pub fn host_name(h: usize) -> String {
        format!("node-{h:03}")
    }

    /// The straggler of `step`, if one was injected there.
    pub fn straggler(&self, step: u64) -> Option<&Straggler> {
        self.stragglers.iter().find(|s| s.step == step)
    }

    /// The slowest injected straggler's step.
    pub fn slowest(&self) -> Option<&Straggler> {
        self.stragglers.iter().max_by(|a, b| a.late.total_cmp(&b.late))
    }

    fn jitter(&self, step: u64, rank: u32) -> f64 {
        // splitmix64 of (step, rank): the same job everywhere, every time.
        let mut z = (step << 32 | rank as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64 * self.jitter
    }

    /// Every all-reduce `k` in `0..=steps`: each rank's entry, and the time all return.
    /// Ranks return together `transfer` after the last entry (the next step's work starts
    /// then on every rank).
    pub fn schedule(&self) -> Vec<(Vec<f64>, f64)> {
        let mut out = Vec::with_capacity(self.steps as usize + 1);
        let mut begin = self.start;
        for k in 0..=self.steps {
            let late = self.straggler(k);
            let enter: Vec<f64> =
                (0..self.ranks()).map(|r| begin + self.compute + self.jitter(k, r) + late.filter(|s| s.rank == r).map_or(0.0, |s| s.late)).collect();
            let exit = enter.iter().copied().fold(f64::NEG_INFINITY, f64::max) + self.transfer;
            out.push((enter, exit));
            begin = exit;
        }
        out
    }

    /// Host `h`'s agent state: its ranks' calls and its rails' samples, served as a real
    /// agent serves them. `schedule` is [`Job::schedule`] (computed once for all hosts).
    pub fn host_state(&self, h: usize, schedule: &[(Vec<f64>, f64)]) -> AppState {
        let host = Job::host_name(h);
        let per_host = self.ranks_per_host as usize;
        let mut hist = History::new(host.clone(), schedule.len() * per_host + 16);
        // Wall time is the probes' clock here: exact, with a realistic NTP error bound. Calls
        // are timed to completion (as NCCL's under CUDA_LAUNCH_BLOCKING=1): their entries are
        // the ranks' readiness.
        hist.clock = ClockMap { offset_ns: 0, error_seconds: 50e-6, synchronized: true };
        let op: Arc<str> = Arc::from("all_reduce");
        let ns = |t: f64| (t * 1e9).round() as u64;
        for (k, (enter, exit)) in schedule.iter().enumerate() {
            for local in 0..per_host {
                let rank = (h * per_host + local) as u32;
                let pid = 20_000 + local as u32;
                hist.push_call_timed(
                    Call {
                        pid,
                        tid: pid,
                        library: Family::Nccl,
                        op: op.clone(),
                        bytes: Some(self.bytes),
                        comm: Some(WORLD),
                        comm_global: true,
                        rank: Some(rank),
                        nranks: Some(self.ranks()),
                        seq: Some(k as u64),
                        enter_ns: ns(enter[rank as usize]),
                        exit_ns: ns(*exit),
                        ret: Some(0),
                        aborted: false,
                        grouped: false,
                    },
                    true,
                );
            }
        }
        let end = schedule.last().map_or(self.start, |s| s.1);
        hist.drained_until = end + 1e-3;
        let mut registry = Registry::default();
        let cfg = StepsConfig { history: 1, ..Default::default() };
        let mut engine = match Engine::new(cfg, host, &mut registry) {
            Ok(e) => e,
            Err(e) => unreachable!("the default [steps] has no NIC rates to refuse: {e}"),
        };
        self.push_counters(&mut engine, schedule, end);
        let shared = Arc::new(Mutex::new(hist));
        engine.set_calls(shared.clone());
        let mut state = AppState::new(registry);
        state.ready.store(true, std::sync::atomic::Ordering::Relaxed);
        state.collectives = Arc::new(std::sync::RwLock::new(Some(shared)));
        state.set_engine(Arc::new(Mutex::new(engine)));
        state
    }

    /// Every rail's cumulative bytes at each sample time: all-reduce `k`'s ring traffic is
    /// spread evenly over its transfer (last entry → return).
    fn push_counters(&self, engine: &mut Engine, schedule: &[(Vec<f64>, f64)], end: f64) {
        let p = self.ranks() as f64;
        let per = 2.0 * (p - 1.0) / p * self.bytes as f64;
        let spans: Vec<(f64, f64)> = schedule.iter().map(|(enter, exit)| (enter.iter().copied().fold(f64::NEG_INFINITY, f64::max), *exit)).collect();
        let (mut done, mut next) = (0.0, 0usize);
        let mut t = self.start;
        while t <= end + self.sample_interval {
            while next < spans.len() && spans[next].1 <= t {
                done += per;
                next += 1;
            }
            let partial = spans.get(next).map_or(0.0, |(a, b)| per * ((t - a) / (b - a)).clamp(0.0, 1.0));
            let parts = (0..self.ranks_per_host)
                .map(|i| {
                    let info = NicInfo { name: format!("mlx5_{i}"), host: None, rail: Some(i), rate_bytes_per_second: Some(self.rail_rate) };
                    (info, NicSample { time: t, tx_bytes: done + partial, rx_bytes: done + partial, ..Default::default() })
                })
                .collect();
            engine.push_samples(t, parts);
            t += self.sample_interval;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_straggler_is_late_by_what_was_injected_and_the_rest_by_jitter_only() {
        let mut j = Job::cluster_1024(1_764_600_000.0);
        j.hosts = 4;
        j.steps = 800;
        j.stragglers = vec![Straggler { step: 733, rank: 17, late: 0.040 }];
        let s = j.schedule();
        assert_eq!(s.len(), 801);
        let (enter, exit) = &s[733];
        let first = enter.iter().copied().fold(f64::INFINITY, f64::min);
        assert!((enter[17] - first - 0.040).abs() <= j.jitter, "rank 17 is 40 ms late: {}", enter[17] - first);
        assert!((exit - enter[17] - j.transfer).abs() < 1e-6, "all return together after the last entry");
        let (enter, _) = &s[732];
        let skew = enter.iter().copied().fold(f64::NEG_INFINITY, f64::max) - enter.iter().copied().fold(f64::INFINITY, f64::min);
        assert!(skew > 0.0 && skew <= j.jitter, "jitter alone elsewhere: {skew}");
        assert!(s.last().is_some_and(|l| (l.1 - (j.start + j.duration())).abs() < 1e-3 + j.jitter * 801.0));
    }
}
