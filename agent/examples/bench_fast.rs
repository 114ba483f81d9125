//! `cargo xtask bench fast` (runs `cargo run --release -p agent --example bench_fast -- <sysfs>`
//! on the 16-NIC mlx5 fixture `dgx16`): the fast lane's CPU against the full sweep's, in the
//! same run, on the same tree.
//!
//! - full sweep: `RdmaSource::sweep` of every port, as the sampler runs it every `interval`;
//! - fast lane: the daemon's own `FastLane::run_until` for 10 s at the shipped defaults (10 ms
//!   period, 1 % budget) with a traced collective always at work (its history's `active_at`
//!   ahead of the clock), over all 16 ports: the PMA counters read, the samples pushed into an
//!   engine — what the sampler thread does between sweeps while a job communicates
//!   continuously; and the same without the budget (period-bound), to show what it would cost.
//!
//! Prints the median CPU of one full sweep and of one fast read (the thread's, user + system),
//! reads per second and the share of a core, and a last machine-readable line
//! `bench fast: nics=<n> sweep_us=<..> fast_us=<..> fast_pct=<..> unbudgeted_pct=<..> period_ms=<..>`.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use prometheus_client::registry::Registry;
use stepwise::{
    config::{StepsConfig, DEFAULT_FAST_CPU_BUDGET, DEFAULT_FAST_INTERVAL},
    daemon::fast::FastLane,
    engine::Engine,
    sources::tcp::thread_cpu,
    sources::{collectives::history::History, rdma::RdmaSource, Errors, Selector, Source, SourceContext},
};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the lane for `secs` with `share`; returns (reads, CPU seconds).
fn lane(srcs: &mut [Box<dyn Source>], share: f64, secs: u64) -> (u64, f64) {
    let mut reg = Registry::default();
    let mut h = History::new("bench".into(), 16);
    h.active_at = f64::MAX;
    let history = Arc::new(Mutex::new(h));
    let engine = Arc::new(Mutex::new(Engine::new(StepsConfig::default(), "bench".into(), &mut reg).expect("engine")));
    let mut fast = FastLane::new(DEFAULT_FAST_INTERVAL, share, Some(history), &mut reg);
    let per_source: Vec<_> = srcs.iter().map(|s| s.nic_samples()).collect();
    fast.set_full(&per_source);
    let (_tx, mut rx) = tokio::sync::watch::channel(false);
    let c0 = thread_cpu();
    fast.run_until(Instant::now() + Duration::from_secs(secs), srcs, &engine, &mut rx);
    let cpu = thread_cpu() - c0;
    (fast.status()["reads"].as_u64().unwrap_or(0), cpu)
}

fn main() {
    let root = std::env::args().nth(1).expect("usage: bench_fast <sysfs root>");
    let mut reg = Registry::default();
    let ctx = SourceContext {
        sysfs_root: root.into(),
        selector: Selector::new(&[], &[], true).expect("selector"),
        errors: Errors::register(&mut reg),
        interval: Duration::from_secs(1),
        rails: Default::default(),
        owners: Default::default(),
    };
    let mut srcs: Vec<Box<dyn Source>> = vec![Box::new(RdmaSource::new(ctx, &mut reg))];
    let mut sweeps = Vec::new();
    for _ in 0..200 {
        let c = thread_cpu();
        srcs[0].sweep().expect("sweep");
        sweeps.push(thread_cpu() - c);
    }
    let nics = srcs[0].nic_samples().len();
    let sweep = median(sweeps);
    let (reads, cpu) = lane(&mut srcs, DEFAULT_FAST_CPU_BUDGET, 10);
    let (free_reads, free_cpu) = lane(&mut srcs, 1.0, 5);
    let fast = free_cpu / free_reads.max(1) as f64;
    let pct = cpu / 10.0 * 100.0;
    let free_pct = free_cpu / 5.0 * 100.0;
    let period = 10.0 / reads.max(1) as f64;
    println!("{nics} NICs (mlx5 dgx16 fixture):");
    println!("  full sweep (every counter):          {:>7.1} µs CPU (median of 200)", sweep * 1e6);
    println!("  fast read (PMA counters, 16 ports):  {:>7.1} µs CPU (mean of {free_reads})", fast * 1e6);
    println!("  fast lane at the defaults (10 ms, budget 1 %): {reads} reads in 10 s (one per {:.1} ms), {pct:.2} % of a core", period * 1e3);
    println!("  fast lane without the budget (10 ms period):   {free_reads} reads in 5 s, {free_pct:.2} % of a core");
    println!(
        "bench fast: nics={nics} sweep_us={:.1} fast_us={:.1} fast_pct={pct:.3} unbudgeted_pct={free_pct:.3} period_ms={:.1}",
        sweep * 1e6,
        fast * 1e6,
        period * 1e3
    );
}
