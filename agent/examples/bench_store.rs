//! History store benchmark: the part of `agent diagnose` latency spent in the store, over
//! 1 000 stored steps (target: diagnose < 1 s).
//!
//! `cargo run --release -p agent --example bench_store [-- STEPS RANKS COLLECTIVES NICS]`
//! (defaults 1000 8 20 8) prints
//! `bench store: put_1000_ms=… query_slowest3_ms=… read_1000_ms=…` and the file size.
//! Steps are attributed by the real engine so the stored JSON has its real shape.

use std::{collections::BTreeMap, time::Instant};

use anyhow::{Context, Result};
use stepwise::{
    attribution::{attribute, Attribution, Params, StepData},
    store::{StepQuery, Store},
    timeline::{windows::NicInfo, Arrival, Collective, NicWindow, Step, StepSource},
};

struct Shape {
    steps: u64,
    ranks: u32,
    colls: u64,
    nics: u32,
}

fn arg(i: usize, default: u64) -> Result<u64> {
    std::env::args().nth(i).map_or(Ok(default), |s| s.parse().with_context(|| format!("argument {i} ({s:?}) is not a number")))
}

/// Step `i`: `colls` allreduces of 64 MiB over `ranks` ranks on two hosts, every 5th step
/// with a 30 ms straggler, per-NIC windows with some congestion.
fn step(sh: &Shape, i: u64) -> (Attribution, Vec<Collective>, Vec<NicWindow>) {
    let begin = 1.7e9 + i as f64 * 0.5;
    let late = if i % 5 == 4 { 0.030 } else { 0.0 };
    let mut t = begin + 0.1;
    let colls: Vec<Collective> = (0..sh.colls)
        .map(|k| {
            let extra = if k == 0 { late } else { 0.0 };
            let arrivals = (0..sh.ranks)
                .map(|r| Arrival {
                    rank: r,
                    host: format!("node{}", r / 4),
                    pid: 4000 + r,
                    enter: t + if r == sh.ranks - 1 { extra } else { r as f64 * 1e-6 },
                    exit: t + extra + 0.004,
                    aborted: false,
                    clock: Default::default(),
                })
                .collect();
            t += extra + 0.005;
            Collective {
                comm: "9f3c2a77e1d04b58".into(),
                seq: i * sh.colls + k,
                op: "all_reduce".into(),
                library: "nccl".into(),
                bytes: Some(64 << 20),
                nranks: Some(sh.ranks),
                arrivals,
            }
        })
        .collect();
    let windows: Vec<NicWindow> = (0..sh.nics)
        .map(|n| NicWindow {
            nic: NicInfo { name: format!("mlx5_{n}"), host: Some("node0".into()), rail: Some(n), rate_bytes_per_second: Some(50e9) },
            tx_bytes: 2e8 + 1e7 * n as f64,
            rx_bytes: 2e8,
            pause_seconds: if i.is_multiple_of(7) { 2e-3 } else { 0.0 },
            pause_frames: 12.0,
            ecn_marked: 40.0,
            cnp_sent: 10.0,
            cnp_handled: 9.0,
            xmit_wait_ticks: 5000.0,
            retransmits: 0.0,
            drops: 0.0,
            max_backlog_bytes: 0.0,
            tcp: Default::default(),
            own_tx: None,
            opaque_tx_bytes: 0.0,
        })
        .collect();
    let s = Step { id: i, begin, end: t + 0.01, source: StepSource::Markers, ranks: BTreeMap::new() };
    let refs: Vec<&Collective> = colls.iter().collect();
    let per_coll: Vec<Vec<NicWindow>> = colls.iter().map(|_| windows.clone()).collect();
    let att = attribute(&StepData { step: &s, collectives: &refs, windows: &per_coll, net: &[], same_host: &[], dropped_events: false }, &Params::default());
    (att, colls, windows)
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn main() -> Result<()> {
    let sh = Shape { steps: arg(1, 1000)?, ranks: u32::try_from(arg(2, 8)?)?, colls: arg(3, 20)?, nics: u32::try_from(arg(4, 8)?)? };
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("agent.db");
    let data: Vec<_> = (0..sh.steps).map(|i| step(&sh, i)).collect();

    let mut st = Store::open(&path)?;
    let t = Instant::now();
    for (a, c, w) in &data {
        st.put_step("job", a, c, w)?;
    }
    let put = ms(t);
    drop(st);

    // A fresh connection, as `agent diagnose` opens one.
    let t = Instant::now();
    let st = Store::open(&path)?;
    let slowest = st.steps(&StepQuery { slowest: Some(3), ..Default::default() })?;
    let query = ms(t);
    anyhow::ensure!(slowest.len() == 3.min(data.len()), "slowest 3 returned {}", slowest.len());

    let t = Instant::now();
    let all = st.steps(&StepQuery::default())?;
    let mut colls = 0;
    let mut arrivals = 0;
    let mut windows = 0;
    for a in &all {
        let c = st.collectives_of("job", a.step)?;
        arrivals += c.iter().map(|c| c.arrivals.len()).sum::<usize>();
        colls += c.len();
        windows += st.windows_of("job", a.step)?.len();
    }
    let read = ms(t);
    anyhow::ensure!(all.len() as u64 == sh.steps && st.skipped_rows() == 0, "read {} of {} steps", all.len(), sh.steps);

    let n = sh.steps;
    println!("bench store: put_{n}_ms={put:.1} query_slowest3_ms={query:.1} read_{n}_ms={read:.1}");
    println!(
        "  {n} steps × {} collectives × {} ranks, {} NICs: read {colls} collectives, {arrivals} arrivals, {windows} windows; db {} KiB",
        sh.colls,
        sh.ranks,
        sh.nics,
        st.size_bytes()? / 1024
    );
    Ok(())
}
