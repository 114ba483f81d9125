//! `cargo xtask bench cluster`: `agent diagnose --peers` over 128 agents × 8 ranks (one
//! world communicator of 1 024 ranks, 1 000 steps; `export::synthetic::Job::cluster_1024`)
//! served by the real API router on 128 loopback ports of this process
//! (`export::replay`). Prints the wall time and peak RSS (`wait4`) of each `diagnose`.
//!
//! Usage: bench_cluster AGENT_BIN

use stepwise::export::{
    replay::{run_measured, Agents},
    synthetic::Job,
};

/// Runs `diagnose --peers … ARGS --json` 3 times; checks the report names `rank` in `step`
/// and prints the best wall time and the largest peak RSS.
fn case(bin: &str, peers: &str, label: &str, args: &[&str], want: (u64, u32), target: f64) -> anyhow::Result<()> {
    let (mut best, mut rss) = (f64::INFINITY, 0u64);
    for _ in 0..3 {
        let all: Vec<&str> = ["diagnose", "--peers", peers, "--json"].into_iter().chain(args.iter().copied()).collect();
        let m = run_measured(std::path::Path::new(bin), &all)?;
        if !m.status.success() {
            anyhow::bail!("diagnose {args:?}: {}\n{}\n{}", m.status, m.stderr, m.stdout.chars().take(3000).collect::<String>());
        }
        let v: serde_json::Value = serde_json::from_str(&m.stdout)?;
        let step = &v["steps"][0];
        let late = step["causes"].as_array().and_then(|c| c.iter().find(|c| c["kind"] == "readiness_skew")).map(|c| c["evidence"]["late_rank"].clone());
        if step["step"].as_u64() != Some(want.0) || late.as_ref().and_then(|l| l.as_u64()) != Some(want.1 as u64) {
            anyhow::bail!("diagnose {args:?}: expected step {} late rank {}, got step {} late {:?}", want.0, want.1, step["step"], late);
        }
        best = best.min(m.seconds);
        rss = rss.max(m.max_rss_kib);
    }
    println!("bench cluster: {label}: {:.0} ms (best of 3; target < {:.0} ms), peak RSS {:.1} MiB", best * 1e3, target * 1e3, rss as f64 / 1024.0);
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let bin = std::env::args().nth(1).ok_or_else(|| anyhow::anyhow!("usage: bench_cluster AGENT_BIN"))?;
    let now = stepwise::engine::wall_now();
    let job = Job::cluster_1024(now - 1.0);
    let t = std::time::Instant::now();
    let schedule = job.schedule();
    let states = (0..job.hosts).map(|h| job.host_state(h, &schedule)).collect();
    let agents = Agents::serve(states, 2)?;
    eprintln!("{} agents × {} ranks, {} steps, served in {:.1} s", job.hosts, job.ranks_per_host, job.steps, t.elapsed().as_secs_f64());
    let peers: Vec<String> = agents.addrs.iter().map(|a| a.to_string()).collect();
    let peers = peers.join(",");
    if let Some(secs) = std::env::args().nth(2).and_then(|s| s.parse::<u64>().ok()) {
        // bench_cluster AGENT_BIN SECONDS: only serve, printing the peers (for a manual run).
        println!("{peers}");
        std::thread::sleep(std::time::Duration::from_secs(secs));
        return Ok(());
    }
    let one = job.straggler(401).ok_or_else(|| anyhow::anyhow!("no straggler in step 401"))?;
    case(&bin, &peers, "one step (--step 401) of 1000 across 128 hosts", &["--step", "401"], (401, one.rank), 1.0)?;
    let slow = job.slowest().ok_or_else(|| anyhow::anyhow!("no straggler"))?;
    case(&bin, &peers, "slowest of 1000 steps (--slowest 1) across 128 hosts", &["--slowest", "1"], (slow.step, slow.rank), 10.0)?;
    drop(agents);
    Ok(())
}
