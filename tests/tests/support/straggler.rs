//! The straggler scenario of `e2e_straggler.rs`: a real 4-rank OpenMPI job in a network
//! namespace, rank 2 computing 30 ms longer every 5th step, watched by an agent that selects
//! the namespace. [`check`] makes the same assertions as that test (every call seen, probe
//! skew vs the workload's own clock within 10 %, readiness skew within 15 %, rank 2 named,
//! no false cause), so an agent started differently must do exactly as well.

use std::{collections::BTreeMap, path::Path, time::Duration};

use stepwise_tests::{
    harness::Agent,
    netns::Netns,
    workloads::{self, StepLine},
};

pub const DELAY_MS: f64 = 30.0;
pub const STEPS: usize = 15;

/// The agent configuration of the scenario (counter sources that need no fixture, probes
/// selecting `ns`, markers on `sock`), plus `extra` TOML lines.
pub fn config(ns: &Netns, sock: &Path, extra: &str) -> String {
    format!(
        "interval = \"100ms\"\n{extra}\n[sources]\nrdma = false\nethtool = false\n[collectives.select]\nnetns = \"/run/netns/{}\"\n[steps]\nmarker_socket = \"{}\"\n",
        ns.name(),
        sock.display()
    )
}

/// What the job itself measured, on its own CLOCK_MONOTONIC.
pub struct Job {
    /// Per step: (skew seconds, last rank).
    pub truth: BTreeMap<u64, (f64, u32)>,
    /// Every rank's line of every step (arrival times).
    pub lines: Vec<StepLine>,
}

/// Runs the job (markers to `sock`) and returns its own measurements. Asserts the injection
/// happened as planned (rank 2 late by 30 ms ± 50 % every 5th step).
pub fn run_job(ns: &Netns, sock: &Path) -> Job {
    let job = run_job_unchecked(ns, sock);
    for (k, (skew, rank)) in &job.truth {
        if (k + 1) % 5 == 0 {
            assert!(*rank == 2 && (skew * 1e3 - DELAY_MS).abs() < 0.5 * DELAY_MS, "injection did not happen as planned at step {k}: {skew} s, rank {rank}");
        }
    }
    job
}

/// [`run_job`] without the check of the injection's timing (for tests that only need the
/// job's series, on a loaded machine).
pub fn run_job_unchecked(ns: &Netns, sock: &Path) -> Job {
    run_steps(ns, sock, STEPS)
}

/// The job with `steps` steps (every 5th delayed), unchecked.
pub fn run_steps(ns: &Netns, sock: &Path, steps: usize) -> Job {
    workloads::build().expect("workloads build");
    let out = workloads::run_ok(&mut workloads::mpi_steps(
        ns.name(),
        4,
        &[
            "--steps",
            &steps.to_string(),
            "--bytes",
            "1048576",
            "--compute-us",
            "20000",
            "--delay-rank",
            "2",
            "--delay-us",
            "30000",
            "--delay-every",
            "5",
            "--marker-socket",
            sock.to_str().expect("utf8"),
        ],
    ))
    .expect("mpi job");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(stdout.contains("summary"), "{stdout}");
    let lines = workloads::parse_steps(&stdout);
    let truth = workloads::true_skew_seconds(&lines);
    assert_eq!(truth.len(), steps, "{stdout}");
    Job { truth, lines }
}

fn seconds(c: &serde_json::Value) -> f64 {
    c["seconds"].as_f64().unwrap_or(0.0)
}

/// The assertions of `e2e_straggler.rs` against `agent` after [`run_job`] (call it once the
/// grace period has passed).
pub fn check(agent: &Agent, job: &Job) {
    let truth = &job.truth;
    let calls: serde_json::Value = serde_json::from_str(&agent.get("/api/v1/collectives?limit=10000").expect("collectives").body).expect("json");
    let views: Vec<stepwise::timeline::join::CallView> = serde_json::from_value(calls["calls"].clone()).expect("call views");
    let allreduce: Vec<_> = views.iter().filter(|c| c.op == "all_reduce").collect();
    assert_eq!(allreduce.len(), 4 * STEPS, "every MPI_Allreduce of every rank seen once: {}", allreduce.len());
    assert!(allreduce.iter().all(|c| c.bytes == Some(1048576) && c.nranks == Some(4) && c.comm_global), "bytes/nranks/comm decoded");
    let joined = stepwise::timeline::join_calls(allreduce.iter().copied());
    assert_eq!(joined.len(), STEPS, "one collective per step");
    for c in &joined {
        assert_eq!(c.arrivals.len(), 4, "all ranks joined for seq {}", c.seq);
        let (want, _) = truth[&c.seq];
        if (c.seq + 1) % 5 == 0 {
            assert!((c.skew() - want).abs() <= 0.10 * want, "seq {}: probe skew {:.2} ms vs the workload's own {:.2} ms", c.seq, c.skew() * 1e3, want * 1e3);
            assert_eq!(c.late_rank().map(|a| a.rank), Some(2));
        } else {
            assert!((c.skew() - want).abs() < 1e-3, "seq {}: probe skew {:.3} ms vs workload {:.3} ms", c.seq, c.skew() * 1e3, want * 1e3);
        }
    }

    let body: serde_json::Value = serde_json::from_str(&agent.get("/api/v1/steps?limit=100").expect("steps").body).expect("json");
    let steps = body["steps"].as_array().expect("steps array");
    assert!(steps.len() >= STEPS - 1, "steps attributed: {}", steps.len());
    for s in steps {
        let id = s["step"].as_u64().expect("id");
        let causes = s["causes"].as_array().expect("causes");
        let total: f64 = causes.iter().map(seconds).sum();
        assert!((total - s["seconds"].as_f64().expect("s")).abs() < 1e-9, "step {id}: parts sum to the step");
        let cause = |k: &str| causes.iter().find(|c| c["kind"] == k).cloned().expect("cause present");
        let skew = cause("readiness_skew");
        let skew_ms = seconds(&skew) * 1e3;
        let want_ms = truth[&id].0 * 1e3;
        if (id + 1) % 5 == 0 {
            assert!((skew_ms - want_ms).abs() <= 0.15 * want_ms, "step {id}: readiness skew {skew_ms:.1} ms vs injected excess {want_ms:.1} ms");
            assert_eq!(skew["rank"], 2, "step {id}: late rank");
            let top = causes
                .iter()
                .filter(|c| !["compute", "ideal_comm"].contains(&c["kind"].as_str().unwrap_or("")))
                .max_by(|a, b| seconds(a).total_cmp(&seconds(b)))
                .expect("top");
            assert_eq!(top["kind"], "readiness_skew", "step {id}");
        } else {
            assert!((skew_ms - want_ms).abs() <= (0.15 * want_ms).max(1.0), "step {id}: readiness skew {skew_ms:.1} ms vs the workload's {want_ms:.1} ms");
            for c in causes {
                let k = c["kind"].as_str().unwrap_or("");
                if !["compute", "ideal_comm", "readiness_skew"].contains(&k) {
                    assert!(seconds(c) * 1e3 < 0.2 * DELAY_MS, "step {id}: false cause {k} = {:.1} ms", seconds(c) * 1e3);
                }
            }
        }
    }
    // Metrics: the straggler found by PromQL-able series without a join. Per rank, the seconds
    // it arrived after the first rank, summed over the attributed steps, match the workload's
    // own clock (rank 0 collects a few ms of scheduler noise per step on a loaded machine, so
    // it is compared with its truth, not with a ratio to rank 2).
    let m = agent.metrics().expect("metrics");
    let attributed: std::collections::BTreeSet<u64> = steps.iter().filter_map(|s| s["step"].as_u64()).collect();
    let mut late = [0.0f64; 4];
    let mut truth_late = [0.0f64; 4];
    for (r, l) in late.iter_mut().enumerate() {
        *l = stepwise_tests::harness::sample(&m, "stepwise_rank_late_seconds_total", &[("rank", &r.to_string())]).unwrap_or(0.0);
    }
    for k in &attributed {
        let first = job.lines.iter().filter(|l| l.step == *k).map(|l| l.arrive_us).fold(f64::INFINITY, f64::min);
        for l in job.lines.iter().filter(|l| l.step == *k && l.rank < 4) {
            truth_late[l.rank as usize] += (l.arrive_us - first) * 1e-6;
        }
    }
    let n = attributed.len() as f64;
    for r in 0..4 {
        assert!(
            (late[r] - truth_late[r]).abs() <= 0.1 * truth_late[r] + 1e-3 * n,
            "rank {r}: late {:.1} ms in the metric vs {:.1} ms by the workload's clock (all ranks: {late:?} vs {truth_late:?})",
            late[r] * 1e3,
            truth_late[r] * 1e3
        );
    }
    assert!(late[2] > 0.075, "rank 2 late {} s: the three injected 30 ms delays", late[2]);
    let argmax = |v: &[f64; 4]| (0..4).max_by(|a, b| v[*a].total_cmp(&v[*b])).unwrap_or(0);
    let mut sorted = truth_late;
    sorted.sort_by(|a, b| b.total_cmp(a));
    if sorted[0] - sorted[1] > 0.2 * sorted[0] + 2e-3 * n {
        assert_eq!(argmax(&late), argmax(&truth_late), "the latest rank by the metric is the latest by the workload's clock: {late:?} vs {truth_late:?}");
    }
    assert!(stepwise_tests::harness::sample(&m, "stepwise_step_attributed_seconds_total", &[("cause", "readiness_skew")]).unwrap_or(0.0) > 0.08);
}

/// Waits out the agent's grace period so the last step is attributed.
pub fn settle() {
    std::thread::sleep(Duration::from_millis(2500));
}
