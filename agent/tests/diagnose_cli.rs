//! `agent diagnose` through the built binary: exit statuses, the history store, and cluster
//! mode over real HTTP against small axum servers on 127.0.0.1 that answer like agents (two
//! hosts of 4 ranks, rank 5 on node-b 30 ms late in every step), plus a peer that never
//! answers, one that answers garbage and one that refuses the connection.

mod common;
use common::agent_command;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::{routing::get, Json, Router};
use serde_json::{json, Value};
use stepwise::{
    attribution::{attribute, Params, StepData},
    store::Store,
    timeline::{Arrival, Collective, Step, StepSource},
};

fn agent(args: &[&str]) -> (i32, String, String, Duration) {
    let t = Instant::now();
    let out = agent_command().arg("diagnose").args(args).output().expect("run agent");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned(), t.elapsed())
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

const STEPS: u64 = 5;
const COMM: &str = "8f3c2a1b00c0ffee";

/// One host's `/api/v1/collectives`, `/markers` and `/windows`, steps every 0.5 s from `t0`:
/// markers at t and t+180 ms; a 64 MiB allreduce entered at t+100 ms (rank 5 at t+130 ms)
/// until t+150 ms, then a 4 KiB allreduce; each NIC sends 100 MB per 10 ms sample while the
/// big one transfers.
fn host_answers(host: &str, ranks: std::ops::Range<u32>, t0: f64, clock_error: f64) -> (Value, Value, Value) {
    let mut calls = Vec::new();
    let mut markers = Vec::new();
    let mut net = Vec::new();
    for k in 0..STEPS {
        let t = t0 + k as f64 * 0.5;
        for r in ranks.clone() {
            let late = if r == 5 { 0.030 } else { 0.0 };
            for (seq, enter, exit, bytes) in [(2 * k, t + 0.100 + late, t + 0.150, 64u64 << 20), (2 * k + 1, t + 0.160, t + 0.161, 4096)] {
                calls.push(json!({
                    "pid": 4000 + r, "tid": 4000 + r, "library": "nccl", "op": "all_reduce", "bytes": bytes,
                    "comm": COMM, "comm_global": true, "rank": r, "nranks": 8, "seq": seq,
                    "enter_ns": 1_000_000_000u64 + seq * 1000, "exit_ns": 1_000_000_000u64 + seq * 1000 + 500,
                    "ret": 0, "aborted": false, "grouped": false,
                    "host": host, "enter": enter, "exit": exit, "duration": exit - enter,
                }));
            }
            markers.push(json!({"rank": r, "step": k + 1, "phase": "begin", "time": t, "host": host}));
            markers.push(json!({"rank": r, "step": k + 1, "phase": "end", "time": t + 0.180, "host": host}));
        }
        net.push(
            json!({"pid": 4000 + ranks.start, "send": true, "bytes": 524288, "posted_ns": 1, "completed_ns": 2, "posted": t + 0.131, "completed": t + 0.133}),
        );
    }
    let nics: Vec<Value> = ["eth0", "eth1"]
        .iter()
        .enumerate()
        .map(|(i, nic)| {
            let mut tx = 0.0;
            let samples: Vec<Value> = (0..(STEPS * 50 + 10))
                .map(|j| {
                    let t = t0 + j as f64 * 0.01;
                    let phase = (j % 50) as i64;
                    if phase == 14 || phase == 15 {
                        tx += 100e6;
                    }
                    json!({"time": t, "tx_bytes": tx, "rx_bytes": tx, "pause_seconds": 0.0, "pause_frames": 0.0, "ecn_marked": 0.0,
                           "cnp_sent": 0.0, "cnp_handled": 0.0, "xmit_wait_ticks": 0.0, "retransmits": 0.0, "drops": 0.0, "backlog_bytes": 0.0})
                })
                .collect();
            json!({"nic": {"name": nic, "host": host, "rail": i, "rate_bytes_per_second": 12.5e9}, "samples": samples})
        })
        .collect();
    (
        json!({"host": host, "clock_error_seconds": clock_error, "clock_synchronized": true, "evicted": 0, "calls": calls, "net_requests": net}),
        json!({"host": host, "markers": markers}),
        json!({"host": host, "nics": nics}),
    )
}

fn agent_router(answers: (Value, Value, Value)) -> Router {
    let (c, m, w) = answers;
    Router::new()
        .route("/api/v1/collectives", get(move || async move { Json(c) }))
        .route("/api/v1/markers", get(move || async move { Json(m) }))
        .route("/api/v1/windows", get(move || async move { Json(w) }))
}

/// Serves each router on its own 127.0.0.1 port; the runtime must outlive the requests.
fn serve(routers: Vec<Router>) -> (tokio::runtime::Runtime, Vec<String>) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let addrs = routers
        .into_iter()
        .map(|r| {
            let l = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind");
            let a = l.local_addr().expect("addr").to_string();
            rt.spawn(async move { axum::serve(l, r).await });
            a
        })
        .collect();
    (rt, addrs)
}

struct Cluster {
    _rt: tokio::runtime::Runtime,
    good: Vec<String>,
    hang: String,
    garbage: String,
    refused: String,
}

fn cluster() -> Cluster {
    let t0 = now() - 60.0;
    let hang = Router::new().fallback(|| async { std::future::pending::<String>().await });
    let garbage = Router::new().fallback(|| async { "<html><body>502 Bad Gateway</body></html>" });
    let (rt, addrs) = serve(vec![agent_router(host_answers("node-a", 0..4, t0, 0.0005)), agent_router(host_answers("node-b", 4..8, t0, 0.002)), hang, garbage]);
    let refused = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").to_string()
    }; // closed here: connecting is refused
    Cluster { _rt: rt, good: addrs[..2].to_vec(), hang: addrs[2].clone(), garbage: addrs[3].clone(), refused }
}

#[test]
fn cluster_json_names_rank_5_lists_failed_peers_and_returns_within_the_timeout() {
    let c = cluster();
    let peers = [c.good[0].as_str(), c.good[1].as_str(), &c.hang, &c.garbage, &c.refused].join(",");
    let (rc, out, err, took) = agent(&["--peers", &peers, "--timeout", "2s", "--slowest", "3", "--json"]);
    assert_eq!(rc, 0, "stderr: {err}\nstdout: {out}");
    assert!(took < Duration::from_secs(3), "took {took:?} with a 2 s per-peer timeout");
    assert!(err.contains("querying 5 peer(s)") && err.contains("2 answered, 3 failed"), "progress on stderr: {err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("bad JSON ({e}): {out}"));
    let steps = v["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 3);
    for s in steps {
        assert_eq!(s["incomplete"], false, "8 of 8 ranks: {s}");
        let skew = s["causes"].as_array().and_then(|c| c.iter().find(|x| x["kind"] == "readiness_skew")).expect("skew cause");
        let secs = skew["seconds"].as_f64().unwrap_or(0.0);
        assert!((secs - 0.030).abs() < 0.0005, "readiness skew {secs}");
        assert_eq!(skew["rank"], 5);
        assert_eq!(skew["evidence"]["late_host"], "node-b");
        assert_eq!(s["top_cause"], "readiness_skew");
        let cf = s["skew"]["clock_free_seconds"].as_f64().unwrap_or(0.0);
        assert!((cf - 0.030).abs() < 0.0005, "clock-free {cf}");
        assert_eq!(s["skew"]["clock_free_late_rank"], 5);
        let sum: f64 = s["causes"].as_array().map(|c| c.iter().filter_map(|x| x["seconds"].as_f64()).sum()).unwrap_or(0.0);
        assert!((sum - s["seconds"].as_f64().unwrap_or(-1.0)).abs() < 1e-9, "parts sum to the step");
        let nics: Vec<&str> = s["nics"].as_array().map(|n| n.iter().filter_map(|x| x["nic"].as_str()).collect()).unwrap_or_default();
        assert_eq!(nics, vec!["node-a/eth0", "node-a/eth1", "node-b/eth0", "node-b/eth1"]);
    }
    // Causality bounds node-b's clock to ± 1 ms (the 4 KiB all-reduce: every rank entered at
    // t+160 ms and left at t+161 ms), tighter than the NTP bounds added (0.5 + 2 ms).
    let e = v["clock_error_seconds"].as_f64().unwrap_or(-1.0);
    assert!((e - 0.001).abs() < 1e-6, "clock error {e}");
    assert_eq!(v["clocks"]["hosts"][0]["host"], "node-b", "{}", v["clocks"]);
    assert_eq!(v["clocks"]["hosts"][0]["applied"], false, "0 lies inside the bound: {}", v["clocks"]);
    assert_eq!(v["peers"]["answered"].as_array().map(|a| a.len()), Some(2));
    let failed = v["peers"]["failed"].as_array().expect("failed");
    let err_of =
        |p: &str| failed.iter().find(|f| f["peer"] == p).and_then(|f| f["error"].as_str()).unwrap_or_else(|| panic!("{p} not listed: {failed:?}")).to_string();
    assert!(err_of(&c.hang).contains("timed out"), "{}", err_of(&c.hang));
    assert!(err_of(&c.garbage).contains("not the agent's JSON"), "{}", err_of(&c.garbage));
    assert!(err_of(&c.refused).contains("refused"), "{}", err_of(&c.refused));
}

#[test]
fn cluster_text_report_and_html() {
    let c = cluster();
    let peers = [c.good[0].as_str(), c.good[1].as_str(), &c.garbage].join(",");
    let dir = tempfile::tempdir().expect("tempdir");
    let html = dir.path().join("report.html");
    let (rc, out, err, _) = agent(&["--peers", &peers, "--timeout", "2s", "--html", html.to_str().expect("utf-8 path")]);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("top cause: readiness_skew 30.0 ms") && out.contains("rank 5 on node-b was late"), "{out}");
    assert!(out.contains("2/3 peers answered") && out.contains(&c.garbage), "{out}");
    // The causality bound of the 4 KiB all-reduce, 1 ms less float noise at t ≈ 1.7e9 s.
    let bound = out.contains("clock error ≤ 999.9 µs") || out.contains("clock error ≤ 1.0 ms");
    assert!(bound && out.contains("clock-free 30.0 ms, late rank 5"), "{out}");
    let row5 = out.lines().find(|l| l.trim_start().starts_with("5 ")).unwrap_or_else(|| panic!("rank 5 row: {out}"));
    assert!(row5.contains("node-b") && row5.contains("30.0 ms"), "{row5}");
    let h = std::fs::read_to_string(&html).expect("html written");
    assert!(h.contains("<svg") && h.contains("readiness_skew") && !h.contains("<script src"), "{h}");
    // Cluster mode joins every host's arrivals: one timeline row per rank of both hosts.
    let step = h.split("<section class=\"step\"").nth(1).expect("a step section");
    assert_eq!(step.matches("class=\"rank-row\"").count(), 8, "{step}");
    assert!(step.contains("rank 5 · node-b"), "{step}");
}

#[test]
fn dns_name_resolves_to_every_agent() {
    let c = cluster();
    let port = c.good[0].rsplit(':').next().expect("port");
    // localhost may also resolve to ::1, where nothing listens: that address is listed as failed.
    let (rc, out, err, _) = agent(&["--dns", &format!("localhost:{port}"), "--timeout", "1s", "--json"]);
    assert_eq!(rc, 0, "{err}");
    let v: Value = serde_json::from_str(&out).expect("JSON");
    let answered = v["peers"]["answered"].as_array().expect("answered");
    assert_eq!(answered.len(), 1, "{answered:?}");
    assert!(answered[0].as_str().unwrap_or("").contains("node-a"));
    assert_eq!(v["steps"][0]["incomplete"], true, "only node-a's ranks 0-3 of 8");
}

#[test]
fn no_peer_answering_is_exit_3_with_the_peers_listed() {
    let c = cluster();
    let (rc, out, err, took) = agent(&["--peers", &format!("{},{}", c.hang, c.refused), "--timeout", "1s", "--json"]);
    assert_eq!(rc, 3, "{err}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(err.contains("none of the 2 peer(s) answered"), "{err}");
    let v: Value = serde_json::from_str(&out).expect("JSON even without steps");
    assert_eq!(v["peers"]["failed"].as_array().map(|a| a.len()), Some(2));
}

#[test]
fn usage_errors_exit_2() {
    for args in [&["--step", "1", "--slowest", "2"][..], &["--since", "soon"], &["--timeout", "0s"], &["--peers", "node:99999"], &["--json", "--html", "x"]] {
        let (rc, _, err, _) = agent(args);
        assert_eq!(rc, 2, "{args:?}: {err}");
        assert!(!err.is_empty(), "{args:?} says why");
    }
}

#[test]
fn empty_or_missing_store_is_exit_3_saying_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").expect("create");
    let (rc, out, err, _) = agent(&["--db", empty.to_str().expect("path"), "--json"]);
    assert_eq!(rc, 3, "{err}");
    assert!(err.contains("empty"), "{err}");
    let v: Value = serde_json::from_str(&out).expect("JSON even without steps");
    assert!(v["source"].as_str().unwrap_or("").contains("empty.db") && v["notes"][0].as_str().unwrap_or("").contains("empty"), "{v}");
    let missing = dir.path().join("nope.db");
    let (rc, _, err, _) = agent(&["--db", missing.to_str().expect("path")]);
    assert_eq!(rc, 3, "{err}");
    assert!(err.contains("no history store"), "{err}");
    assert!(!missing.exists(), "reading never creates a store");
}

fn stored_step(id: u64, t: f64, late: f64) -> stepwise::attribution::Attribution {
    let arrivals = (0..4u32)
        .map(|r| Arrival {
            rank: r,
            host: "node-a".into(),
            pid: r,
            enter: t + 0.1 + if r == 2 { late } else { 0.0 },
            exit: t + 0.1 + late + 0.001,
            aborted: false,
            clock: Default::default(),
        })
        .collect();
    let c = Collective { comm: COMM.into(), seq: id, op: "all_reduce".into(), library: "mpi".into(), bytes: Some(4096), nranks: Some(4), arrivals };
    let s = Step { id, begin: t, end: t + 0.1 + late + 0.002, source: StepSource::Markers, ranks: Default::default() };
    let cs = [&c];
    attribute(&StepData { step: &s, collectives: &cs, windows: &[vec![]], net: &[], same_host: &[], dropped_events: false }, &Params::default())
}

#[test]
fn store_steps_by_id_slowest_and_range() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("agent.db");
    let t = now() - 3600.0;
    {
        let mut st = Store::open(&db).expect("open");
        for (id, late) in [(1, 0.0), (2, 0.030), (3, 0.005)] {
            st.put_step("job", &stored_step(id, t + id as f64, late), &[], &[]).expect("put");
        }
    }
    let dbs = db.to_str().expect("path");
    let (rc, out, err, _) = agent(&["--db", dbs, "--slowest", "1", "--since", "2h", "--json"]);
    assert_eq!(rc, 0, "{err}");
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["steps"][0]["step"], 2);
    assert_eq!(v["steps"][0]["top_cause"], "readiness_skew");
    assert!(v["clock_error_seconds"].is_null(), "one host's clock");
    let (rc, out, err, _) = agent(&["--db", dbs, "--step", "3"]);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("step 3 ·") && out.contains("readiness_skew") && out.contains("5.0 ms"), "{out}");
    let (rc, _, err, _) = agent(&["--db", dbs, "--since", "10m"]);
    assert_eq!(rc, 3, "steps are an hour old");
    assert!(err.contains("time range empty") && err.contains("widen --since"), "{err}");
    let (rc, _, err, _) = agent(&["--db", dbs, "--step", "9"]);
    assert_eq!(rc, 3);
    assert!(err.contains("step 9 is not in the store"), "{err}");
}

#[test]
fn html_from_the_store_draws_each_ranks_timeline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("agent.db");
    let t = now() - 60.0;
    {
        let mut st = Store::open(&db).expect("open");
        for (id, late) in [(1u64, 0.0), (2, 0.030)] {
            let arrivals = (0..4u32)
                .map(|r| Arrival {
                    rank: r,
                    host: "node-a".into(),
                    pid: r,
                    enter: t + id as f64 + 0.1 + if r == 2 { late } else { 0.0 },
                    exit: t + id as f64 + 0.1 + late + 0.001,
                    aborted: false,
                    clock: Default::default(),
                })
                .collect();
            let c = Collective { comm: COMM.into(), seq: id, op: "all_reduce".into(), library: "mpi".into(), bytes: Some(4096), nranks: Some(4), arrivals };
            st.put_step("job", &stored_step(id, t + id as f64, late), &[c], &[]).expect("put");
        }
    }
    let html = dir.path().join("r.html");
    let (rc, _, err, _) = agent(&["--db", db.to_str().expect("path"), "--slowest", "1", "--html", html.to_str().expect("path")]);
    assert_eq!(rc, 0, "{err}");
    let h = std::fs::read_to_string(&html).expect("html written");
    assert_eq!(h.matches("class=\"rank-row\"").count(), 4, "one row per rank from the stored arrivals: {h}");
    assert!(h.contains("data-step=\"2\"") && h.contains("rank 2: data ready at 130.0 ms (all_reduce #2)"), "{h}");
    assert!(h.contains("rank 0 wait in all_reduce #2"), "{h}");
}

#[test]
fn local_mode_from_one_agents_api() {
    let t = now() - 30.0;
    let steps = json!({"host": "node-a", "steps": [stored_step(7, t, 0.030), stored_step(8, t + 1.0, 0.0)]});
    let (_rt, addrs) = serve(vec![Router::new().route("/api/v1/steps", get(move || async move { Json(steps) }))]);
    let (rc, out, err, _) = agent(&["--agent", &addrs[0], "--json"]);
    assert_eq!(rc, 0, "{err}");
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["steps"].as_array().map(|a| a.len()), Some(1), "default: the slowest step");
    assert_eq!(v["steps"][0]["step"], 7);
    assert!(v["source"].as_str().unwrap_or("").contains("node-a"));
}
