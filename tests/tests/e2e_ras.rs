//! NCCL RAS in the hang report (issue 34, docs/ras.md), end to end through the agent: its
//! poller asks the RAS address of its config, `/api/v1/open` carries the answer and
//! `agent diagnose --hang` joins it with the hang.
//!
//! There is no real NCCL here, so the RAS service is a fixture in this test: a TCP server that
//! speaks NCCL 2.30.7's client protocol (src/ras/client_support.cc: `CLIENT PROTOCOL` →
//! `SERVER PROTOCOL 2`, `TIMEOUT`/`SET FORMAT json` → `OK`, `STATUS` → the JSON report, then
//! close) with a report in `rasDumpCommsToJSON`'s layout naming the job's stopped rank 2 (its
//! real pid) dead. The hang is real: a 4-rank NCCL-ABI job whose rank 2 stops itself before
//! all-reduce #5.
//!
//! - the missing rank's row says `NCCL RAS: dead (pid …)`, and the finding is listed;
//! - an agent whose RAS address has nothing listening says RAS is absent.
//!
//! Needs root (network namespaces) and eBPF.

mod support;

use std::{
    io::{BufRead, BufReader, Write},
    net::TcpListener,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use stepwise_tests::{
    harness::{agent_bin, wait_for, Agent},
    netns::Netns,
    scenarios::{self, RankSpec},
    workloads,
};
use support::hang::{pid_of, signal, wait_line, HANG};

fn rank_json(rank: u32, pid: u32, allreduce: u64) -> String {
    format!(
        "        {{\n          \"rank\": {rank},\n          \"host\": \"127.0.0.1\",\n          \"pid\": {pid},\n          \"cuda_dev\": {rank},\n          \"nvml_dev\": {rank},\n          \"status\": {{\n            \"init_state\": 0,\n            \"async_error\": 0,\n            \"finalize_called\": false,\n            \"destroy_flag\": false,\n            \"abort_flag\": false\n          }},\n          \"collective_counts\": {{\n            \"Broadcast\": 0,\n            \"Reduce\": 0,\n            \"AllGather\": 0,\n            \"ReduceScatter\": 0,\n            \"AllReduce\": {allreduce}\n          }}\n        }}"
    )
}

/// NCCL's JSON status of a 4-rank communicator with `dead` missing and considered dead.
fn report(pids: &std::collections::BTreeMap<u32, u32>, dead: u32) -> String {
    let ranks: Vec<String> = pids.iter().filter(|(r, _)| **r != dead).map(|(r, p)| rank_json(*r, *p, 6)).collect();
    format!(
        "{{\n  \"nccl_version\": \"2.30.7\",\n  \"cuda_runtime_version\": 13000,\n  \"cuda_driver_version\": 13000,\n  \"timestamp\": \"2026-12-07 00:30:00\",\n  \"communicators_count\": 1,\n  \"communicators\": [\n    {{\n      \"hash\": \"0x27a079b828ff1a75\",\n      \"secondary_hash\": \"0x1:0x2\",\n      \"size\": 4,\n      \"ranks_count\": 3,\n      \"missing_ranks_count\": 1,\n      \"ranks\": [\n{}\n      ],\n      \"missing_ranks\": [\n        {{\n          \"rank\": {dead},\n          \"host\": \"127.0.0.1\",\n          \"pid\": {},\n          \"cuda_dev\": {dead},\n          \"nvml_dev\": {dead},\n          \"status\": {{\n            \"unresponsive\": true,\n            \"considered_dead\": true\n          }}\n        }}\n      ]\n    }}\n  ],\n  \"ras\": {{\n    \"collection_time_sec\": 5.001,\n    \"timeouts_count\": 1\n  }}\n}}\n",
        ranks.join(",\n"),
        pids[&dead]
    )
}

/// The fixture service: answers every connection until `stop`, with the report in `body`
/// at that moment.
fn fake_ras(body: Arc<Mutex<String>>, stop: Arc<AtomicBool>) -> (String, std::thread::JoinHandle<usize>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.set_nonblocking(true).expect("nonblocking");
    let addr = l.local_addr().expect("addr").to_string();
    let h = std::thread::spawn(move || {
        let mut served = 0;
        while !stop.load(Ordering::Relaxed) {
            let Ok((mut s, _)) = l.accept() else {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            };
            let _ = s.set_nonblocking(false);
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut r = BufReader::new(s.try_clone().expect("clone"));
            let mut line = String::new();
            while r.read_line(&mut line).unwrap_or(0) > 0 {
                let cmd = line.trim_end().to_ascii_lowercase();
                line.clear();
                let reply = if cmd.starts_with("client protocol ") {
                    "SERVER PROTOCOL 2\n".to_string()
                } else if cmd.starts_with("timeout ") || cmd == "set format json" {
                    "OK\n".to_string()
                } else if cmd == "status" {
                    let b = body.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    let _ = s.write_all(b.as_bytes());
                    served += 1;
                    break;
                } else {
                    format!("ERROR: Unknown command {cmd}\n")
                };
                let _ = s.write_all(reply.as_bytes());
            }
        }
        served
    });
    (addr, h)
}

fn agent(dir: &std::path::Path, ns: &Netns, ras_addr: &str) -> Agent {
    let cfg = dir.join("agent.toml");
    let mut text = support::straggler::config(ns, &dir.join("markers.sock"), "");
    // The library's directory is probed at start: the job's first calls are seen.
    let lib = workloads::build().expect("workloads build");
    let coll = format!("[collectives]\nras_addr = \"{ras_addr}\"\nras_every = \"1s\"\nlibrary_dirs = [\"{}\"]\n[collectives.select]", lib.display());
    text = text.replace("[collectives.select]", &coll);
    text.push_str(HANG);
    std::fs::write(&cfg, text).expect("config");
    Agent::start(dir, &["--config", cfg.to_str().expect("utf8")]).expect("agent starts")
}

fn diagnose_hang(a: &Agent) -> (Option<i32>, String) {
    let out = std::process::Command::new(agent_bin()).args(["diagnose", "--hang", "--agent", &a.addr]).output().expect("diagnose");
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn the_hang_report_names_the_rank_ras_reports_dead() {
    workloads::build().expect("workloads build");
    let dir = tempfile::Builder::new().prefix("stepwise-ras-").tempdir().expect("tmp");
    let ns = Netns::new().expect("netns (needs root and iproute2)");
    let ranks: Vec<RankSpec> = (0..4u32).map(|r| RankSpec { ns: ns.name().to_string(), rank: r, env: Vec::new(), args: Vec::new() }).collect();
    let args: Vec<String> =
        ["--steps", "12", "--bytes", "65536", "--compute-us", "20000", "--stop-rank", "2", "--stop-step", "5"].iter().map(|a| a.to_string()).collect();
    // The service and the agent first; the fixture's report names the job's pids once it runs.
    let (body, stop) = (Arc::new(Mutex::new(String::from("{\"communicators\": []}"))), Arc::new(AtomicBool::new(false)));
    let (addr, srv) = fake_ras(body.clone(), stop.clone());
    let a = agent(dir.path(), &ns, &addr);
    a.require_ebpf().expect("eBPF");
    let mut job = scenarios::start_job("ras", dir.path(), &ranks, &args).expect("job");
    let pids = job.pids();
    *body.lock().unwrap_or_else(|p| p.into_inner()) = report(&pids, 2);
    let pid = pid_of(&wait_line(&mut job.ranks[2].1, "stopping rank=2 step=5", Duration::from_secs(120)));
    assert_eq!(pid, pids[&2]);
    let text = wait_for(Duration::from_secs(60), "diagnose --hang suspects, with RAS", || {
        let (code, t) = diagnose_hang(&a);
        (code == Some(4) && t.contains("NCCL RAS: dead")).then_some(t)
    })
    .unwrap_or_else(|e| panic!("{e}: {}", diagnose_hang(&a).1));
    let row = text.lines().find(|l| l.trim_start().starts_with('2') && l.contains(&pid.to_string())).unwrap_or_else(|| panic!("rank 2's row: {text}"));
    assert!(row.contains(&format!("NCCL RAS: dead (pid {pid} on 127.0.0.1)")), "{text}");
    assert!(text.contains(&format!("NCCL RAS: communicator 0x27a079b828ff1a75 dead: rank 2 (127.0.0.1 pid {pid})")), "{text}");
    assert!(!text.contains("NCCL RAS: absent"), "{text}");
    let open: serde_json::Value = serde_json::from_str(&a.get("/api/v1/open").expect("open").body).expect("json");
    assert_eq!(open["ras"]["state"], "answered", "{}", open["ras"]);
    signal(pid, "CONT");
    job.wait(Duration::from_secs(120)).expect("job completes after SIGCONT");
    stop.store(true, Ordering::Relaxed);
    assert!(srv.join().expect("fixture") >= 1);
}

#[test]
fn nothing_answering_on_the_ras_address_is_reported_absent() {
    let dir = tempfile::Builder::new().prefix("stepwise-ras-absent-").tempdir().expect("tmp");
    let ns = Netns::new().expect("netns (needs root and iproute2)");
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let closed = l.local_addr().expect("addr").to_string();
    drop(l);
    let a = agent(dir.path(), &ns, &closed);
    let text = wait_for(Duration::from_secs(30), "RAS asked", || {
        let (_, t) = diagnose_hang(&a);
        t.contains("NCCL RAS").then_some(t)
    })
    .expect("a RAS note");
    assert!(text.contains(&format!("note: NCCL RAS: absent — nothing answered on {closed}")), "{text}");
    assert!(!text.contains("NCCL RAS: dead"), "{text}");
    let open: serde_json::Value = serde_json::from_str(&a.get("/api/v1/open").expect("open").body).expect("json");
    assert_eq!(open["ras"]["state"], "absent", "{}", open["ras"]);
}
