//! Two servers whose agents' clocks disagree by 40 ms — one reads 20 ms ahead, the other
//! 20 ms behind (`STEPWISE_TEST_CLOCK_OFFSET`: network namespaces share one kernel clock) —
//! watch a 4-rank job (two ranks per server, the NCCL-ABI library in blocking mode) whose
//! rank 3 computes 30 ms longer every 3rd step. `agent diagnose --peers` must find the offset
//! from the collectives themselves, name rank 3 on exactly those steps with its seconds within
//! 15 % of what the job measured on its own clock, and elsewhere only the job's own jitter
//! (uncorrected, every step would show the 40 ms of the clocks as readiness skew).

use std::{collections::BTreeMap, time::Duration};

use serde_json::Value;
use stepwise_tests::{
    scenarios::{agent_config, cause, cause_seconds, diagnose, mgmt_addr, rail_addr, start_job, RankSpec, Servers},
    workloads,
};

const STEPS: u64 = 15;
const DELAY_US: u64 = 30_000;

#[test]
fn agents_with_clocks_40_ms_apart_still_name_the_straggler_and_its_seconds() {
    workloads::build().expect("workloads build");
    let dir = tempfile::Builder::new().prefix("stepwise-clocks-").tempdir().expect("tmp");
    let dir = dir.path();
    let mut s = Servers::new(1, 1500, None).expect("servers (needs root)");
    for (k, offset) in [(0usize, "20ms"), (1, "-20ms")] {
        let cfg = agent_config(s.ns(k), dir, k, None, &BTreeMap::new(), false);
        s.start_agent_env(k, dir, &cfg, &[(stepwise::testclock::VAR, offset)]).expect("agent starts");
    }
    let peers: Vec<String> = (0..4).map(|r| rail_addr(r / 2, 0).to_string()).collect();
    let ranks: Vec<RankSpec> = (0..4u32)
        .map(|r| {
            let server = (r / 2) as usize;
            RankSpec {
                ns: s.ns(server).to_string(),
                rank: r,
                env: vec![
                    ("NCCL_ABI_HOST".into(), format!("server{server}")),
                    ("NCCL_ABI_LOCAL_SIZE".into(), "2".into()),
                    ("NCCL_ABI_IFACE_ADDR".into(), rail_addr(server, 0).to_string()),
                    ("NCCL_ABI_PEER_ADDRS".into(), peers.join(",")),
                ],
                args: Vec::new(),
            }
        })
        .collect();
    let args: Vec<String> = [
        "--steps",
        &STEPS.to_string(),
        "--bytes",
        "65536",
        "--compute-us",
        "20000",
        "--delay-rank",
        "3",
        "--delay-us",
        &DELAY_US.to_string(),
        "--delay-every",
        "3",
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    let out = start_job("clocks", dir, &ranks, &args).expect("job starts").wait(Duration::from_secs(60)).expect("job");
    let truth = workloads::true_skew_seconds(&out.lines);
    assert_eq!(truth.len() as u64, STEPS);
    std::thread::sleep(Duration::from_millis(3500));

    let list = format!("{}:9477,{}:9478", mgmt_addr(0), mgmt_addr(1));
    let (code, stdout, stderr) = diagnose(&s, &["--peers", &list, "--since", "5m", "--json"]).expect("diagnose runs");
    assert_eq!(code, 0, "diagnose: {stderr}\n{stdout}");
    let rep: Value = serde_json::from_str(&stdout).expect("json");
    let host = &rep["clocks"]["hosts"][0];
    let offset = host["offset_seconds"].as_f64().expect("offset");
    let error = host["error_seconds"].as_f64().expect("error");
    eprintln!("clocks: {}", rep["clocks"]);
    let want_offset = if rep["clocks"]["reference"] == "server0" { -0.040 } else { 0.040 };
    assert!(
        host["applied"] == true && (offset - want_offset).abs() <= error.max(1e-3) && error < 0.005,
        "clock offset {offset} ± {error} vs {want_offset}: {}",
        rep["clocks"]
    );
    let steps = rep["steps"].as_array().expect("steps");
    assert!(steps.len() as u64 >= STEPS - 2, "{} steps: {stdout}", steps.len());
    for st in steps {
        let id = st["step"].as_u64().expect("id");
        let (want, late) = truth[&id];
        let got = cause_seconds(st, "readiness_skew");
        if (id + 1) % 3 == 0 {
            assert_eq!(late, 3, "step {id}: the injection as planned");
            assert!((got - want).abs() <= 0.15 * want, "step {id}: readiness skew {:.1} ms vs the job's {:.1} ms", got * 1e3, want * 1e3);
            assert_eq!(cause(st, "readiness_skew")["rank"], 3, "step {id}: {st}");
        } else {
            // The job's own jitter, not the clocks' 40 ms. The job reads its clock just before
            // it calls and the probe fires at the call: on this 2-core machine a rank preempted
            // in between puts ms between the two (seen: agent 2.3, 2.6, 2.9 and 5.1 ms against
            // the job's 0.1-0.4 ms in 3 of 8 runs here and one CI rehearsal, the clock offset
            // right within 0.06 ms, with the join before and after f07cbc0), so the bound is a quarter of
            // the clocks' offset: a leak of the offset still fails, the offset itself is
            // checked above.
            assert!(
                (got - want).abs() <= (0.15 * want).max(0.010),
                "step {id}: readiness skew {:.1} ms on a step without delay (the job's {:.1} ms)",
                got * 1e3,
                want * 1e3
            );
        }
    }
}
