//! `cargo xtask bench attribution`: attribution throughput on a synthetic history, and the
//! store it leaves behind for timing `agent diagnose` over 1 000 stored steps.
//!
//! A "collective record" is one rank's call in one collective (what the probes produce).
//! Usage: bench_attribution [DB_PATH]  (writes 1 000 steps there when given)

use std::time::Instant;

use stepwise::{
    attribution::{attribute, Params, StepData},
    timeline::{join::Arrival, Collective, NicInfo, NicWindow, Step, StepSource},
};

const RANKS: u32 = 8;
const COLLS_PER_STEP: usize = 64;
const NICS: usize = 8;

fn synth(step: u64) -> (Step, Vec<Collective>, Vec<Vec<NicWindow>>) {
    let t0 = 1_000.0 + step as f64 * 1.0;
    let mut colls = Vec::with_capacity(COLLS_PER_STEP);
    let mut wins = Vec::with_capacity(COLLS_PER_STEP);
    for i in 0..COLLS_PER_STEP {
        let start = t0 + 0.2 + i as f64 * 0.01;
        let arrivals = (0..RANKS)
            .map(|r| {
                let late = if r == 3 && i % 7 == 0 { 0.003 } else { (r as f64) * 1e-5 };
                Arrival {
                    rank: r,
                    host: format!("h{}", r / 4),
                    pid: 100 + r,
                    enter: start + late,
                    exit: start + 0.008,
                    aborted: false,
                    clock: Default::default(),
                }
            })
            .collect();
        colls.push(Collective {
            comm: "c0".into(),
            seq: step * COLLS_PER_STEP as u64 + i as u64,
            op: "all_reduce".into(),
            library: "nccl".into(),
            bytes: Some(64 << 20),
            nranks: Some(RANKS),
            arrivals,
        });
        wins.push(
            (0..NICS)
                .map(|n| NicWindow {
                    nic: NicInfo { name: format!("eth{n}"), host: Some("h0".into()), rail: Some(n as u32), rate_bytes_per_second: Some(50e9) },
                    tx_bytes: if n == 0 { 2e8 } else { 3e7 },
                    rx_bytes: 3e7,
                    pause_seconds: if i % 5 == 0 { 0.001 } else { 0.0 },
                    ..Default::default()
                })
                .collect(),
        );
    }
    (Step { id: step, begin: t0, end: t0 + 0.9, source: StepSource::Markers, ranks: Default::default() }, colls, wins)
}

/// CPU time of this thread: "per core" throughput that other load on a shared machine does
/// not distort (wall time is printed too).
fn thread_cpu() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

type Synth = (Step, Vec<Collective>, Vec<Vec<NicWindow>>);

/// Best CPU and wall seconds of `reps` passes of attribution over `data`.
fn measure(data: &[Synth], reps: usize, params: &Params) -> (f64, f64, f64) {
    let (mut best, mut best_wall, mut checksum) = (f64::INFINITY, f64::INFINITY, 0.0);
    for _ in 0..reps {
        let t = Instant::now();
        let c0 = thread_cpu();
        for (step, colls, wins) in data {
            let refs: Vec<&Collective> = colls.iter().collect();
            let a = attribute(&StepData { step, collectives: &refs, windows: wins, net: &[], same_host: &[], dropped_events: false }, params);
            checksum += a.seconds;
        }
        best = best.min(thread_cpu() - c0);
        best_wall = best_wall.min(t.elapsed().as_secs_f64());
    }
    (best, best_wall, checksum)
}

fn main() {
    let params = Params::default();
    // The figure the target is judged on: a 200-step history (≈ 30 MB of records and NIC
    // windows, about this machine's L3) attributed in one pass, so every record is read
    // from memory first. Then 10 steps (≈ 1.5 MB) passed over repeatedly: the daemon
    // attributes a step right after joining it, while its inputs are still in the caches.
    // Best of 15 (300) passes: this shared machine moves single passes by ±30 %.
    for (steps, reps, what) in [(200u64, 15, "history of 200 steps, read from memory"), (10, 300, "10 steps, in cache")] {
        let data: Vec<Synth> = (0..steps).map(synth).collect();
        let (best, best_wall, checksum) = measure(&data, reps, &params);
        let records = steps as f64 * COLLS_PER_STEP as f64 * RANKS as f64;
        let rate = records / best;
        println!("attribution ({what}): {steps} steps x {COLLS_PER_STEP} collectives x {RANKS} ranks = {records:.0} collective records in {:.2} ms CPU ({:.2} ms wall), best of {reps}, one thread", best * 1e3, best_wall * 1e3);
        if steps == 200 {
            println!("bench attribution: records_per_s={rate:.0} target=10000000 ok={} (checksum {checksum:.1})", rate >= 1e7);
        } else {
            println!("bench attribution: in cache records_per_s={rate:.0} (checksum {checksum:.1})");
        }
    }

    if let Some(db) = std::env::args().nth(1) {
        let _ = std::fs::remove_file(&db);
        let mut store = stepwise::store::Store::open(&db).expect("open store");
        let t = Instant::now();
        for k in 0..1000u64 {
            let (step, colls, wins) = synth(k);
            let refs: Vec<&Collective> = colls.iter().collect();
            let a = attribute(&StepData { step: &step, collectives: &refs, windows: &wins, net: &[], same_host: &[], dropped_events: false }, &params);
            store.put_step("markers", &a, &colls[..4], &wins[0]).expect("put");
        }
        println!("stored 1000 steps in {:.0} ms at {db}", t.elapsed().as_secs_f64() * 1e3);
    }
}
