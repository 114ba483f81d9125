//! A real 4-rank OpenMPI job that sends no step markers (one all-reduce per iteration, rank 2
//! computing 50 ms longer every 4th iteration), watched by the agent: the steps it finds from
//! the period of the job's collectives must each hold exactly their own all-reduce — from the
//! first straggler iteration on — and charge each straggler iteration's lateness as readiness
//! skew naming rank 2 (within 15 % of what the job measured on its own clock), never as
//! compute.

use std::collections::BTreeMap;

use serde_json::Value;
use stepwise_tests::{harness::Agent, netns::Netns, workloads};

const STEPS: usize = 24;
const DELAY_MS: f64 = 50.0;

fn seconds(v: &Value) -> f64 {
    v["seconds"].as_f64().unwrap_or(0.0)
}

#[test]
fn period_steps_hold_their_own_collective_and_charge_the_straggler_from_the_first_iteration() {
    let dir = tempfile::Builder::new().prefix("stepwise-period-").tempdir().expect("tmp");
    let ns = Netns::new().expect("netns (needs root and iproute2)");
    let cfg = dir.path().join("agent.toml");
    let sock = dir.path().join("markers.sock");
    std::fs::write(
        &cfg,
        format!(
            "interval = \"100ms\"\n[sources]\nrdma = false\nethtool = false\n[collectives.select]\nnetns = \"/run/netns/{}\"\n[steps]\nmarker_socket = \"{}\"\n",
            ns.name(),
            sock.display()
        ),
    )
    .expect("config");
    let agent = Agent::start(dir.path(), &["--config", cfg.to_str().expect("utf8")]).expect("agent starts");
    workloads::build().expect("workloads build");
    let out = workloads::run_ok(&mut workloads::mpi_steps(
        ns.name(),
        4,
        &["--steps", &STEPS.to_string(), "--bytes", "1048576", "--compute-us", "20000", "--delay-rank", "2", "--delay-us", "50000", "--delay-every", "4"],
    ))
    .expect("mpi job");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let truth = workloads::true_skew_seconds(&workloads::parse_steps(&stdout));
    assert_eq!(truth.len(), STEPS, "{stdout}");
    std::thread::sleep(std::time::Duration::from_millis(2500));

    // The job's all-reduces, in order: the k-th is iteration k.
    let calls: Value = serde_json::from_str(&agent.get("/api/v1/collectives?limit=10000").expect("collectives").body).expect("json");
    let views: Vec<stepwise::timeline::join::CallView> = serde_json::from_value(calls["calls"].clone()).expect("call views");
    let mut joined: Vec<_> =
        stepwise::timeline::join_calls(views.iter().filter(|c| c.op == "all_reduce")).into_iter().filter(|c| c.arrivals.len() == 4).collect();
    joined.sort_by_key(|c| c.seq);
    assert_eq!(joined.len(), STEPS, "every iteration's all-reduce seen on all ranks");

    let body: Value = serde_json::from_str(&agent.get("/api/v1/steps?limit=1000").expect("steps").body).expect("json");
    let steps = body["steps"].as_array().expect("steps");
    let mut by_iteration: BTreeMap<usize, &Value> = BTreeMap::new();
    for s in steps {
        let (begin, end) = (s["begin"].as_f64().expect("begin"), s["end"].as_f64().expect("end"));
        assert_eq!(s["collectives"], 1, "a period step holds exactly its own all-reduce: {s}");
        // Its all-reduce: the one that ends it, and lies inside it.
        let k = joined.iter().position(|c| (c.last_exit() - end).abs() < 1e-6).unwrap_or_else(|| panic!("step ends at no all-reduce's exit: {s}"));
        assert!(joined[k].last_arrival() > begin, "iteration {k}'s all-reduce lies outside its step: {s}");
        assert!(by_iteration.insert(k, s).is_none(), "iteration {k} attributed twice");
    }
    // Iteration 0 only starts the first step; every later one has its step.
    let missing: Vec<usize> = (1..STEPS).filter(|k| !by_iteration.contains_key(k)).collect();
    assert!(missing.is_empty(), "iterations without a step: {missing:?}");
    for (&k, s) in &by_iteration {
        let causes = s["causes"].as_array().expect("causes");
        let cause = |kind: &str| causes.iter().find(|c| c["kind"] == kind).expect("cause");
        let skew = cause("readiness_skew");
        let (want, late) = truth[&(k as u64)];
        if (k + 1) % 4 == 0 {
            assert_eq!(late, 2, "iteration {k}: injection as planned");
            assert!((want * 1e3 - DELAY_MS).abs() < 0.5 * DELAY_MS, "iteration {k}: the job measured {want} s");
            assert!(
                (seconds(skew) - want).abs() <= 0.15 * want,
                "iteration {k}: readiness skew {:.1} ms vs the job's {:.1} ms: {s}",
                seconds(skew) * 1e3,
                want * 1e3
            );
            assert_eq!(skew["rank"], 2, "iteration {k}: late rank");
            assert!(seconds(cause("compute")) < seconds(s) - 0.8 * want, "iteration {k}: the straggler's wait counted as compute: {s}");
        } else {
            assert!(seconds(skew) <= want + 0.15 * DELAY_MS, "iteration {k}: readiness skew {:.1} ms, the job's {:.1} ms", seconds(skew) * 1e3, want * 1e3);
        }
    }
    drop(agent);
}
