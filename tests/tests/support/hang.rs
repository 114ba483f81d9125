//! Shared by the hang tests (`e2e_hang.rs` over OpenMPI and NCCL-ABI jobs, `e2e_gloo.rs`
//! over PyTorch gloo): the `[hang]` rule they run with, reading `/api/v1/open`, finding the
//! suspicion that names a rank, and the detection latency.

use std::{collections::BTreeMap, time::Duration};

use serde_json::Value;
use stepwise_tests::harness::{wait_for, Agent, Proc};

/// The rule every hang test runs with: 2 s floor, 5 × the median, cleared after 2 s.
pub const HANG: &str = "[hang]\nfloor = \"2s\"\nk = 5\nclear_after = \"2s\"\n";

/// Wall-clock seconds (the clock of `/api/v1/open`'s `since`).
pub fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs_f64()
}

/// The `key=value` fields of the first line of `text` starting with `prefix`.
pub fn line_fields(text: &str, prefix: &str) -> Option<BTreeMap<String, String>> {
    let l = text.lines().find(|l| l.starts_with(prefix))?;
    Some(l.split_whitespace().filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect())
}

/// Waits up to `t` for `p` to print a line starting with `prefix`; its fields.
pub fn wait_line(p: &mut Proc, prefix: &str, t: Duration) -> BTreeMap<String, String> {
    wait_for(t, prefix, || {
        let text = p.log_text();
        if let Some(f) = line_fields(&text, prefix) {
            return Some(Ok(f));
        }
        (!p.alive()).then_some(Err(text))
    })
    .unwrap_or_else(|e| panic!("{e}:\n{}", p.log_text()))
    .unwrap_or_else(|log| panic!("the job ended before printing {prefix:?}:\n{log}"))
}

pub fn pid_of(f: &BTreeMap<String, String>) -> u32 {
    f["pid"].parse().expect("pid")
}

/// `kill -SIG pid`.
pub fn signal(pid: u32, sig: &str) {
    let st = std::process::Command::new("kill").args([&format!("-{sig}"), &pid.to_string()]).status().expect("kill");
    assert!(st.success(), "kill -{sig} {pid}");
}

pub fn open_of(a: &Agent) -> Value {
    let r = a.get("/api/v1/open").expect("/api/v1/open");
    assert_eq!(r.status, 200, "{}", r.body);
    serde_json::from_str(&r.body).expect("json")
}

pub fn rank_of(v: &Value) -> Option<u64> {
    v["rank"].as_u64()
}

/// The first suspected hang whose missing ranks include `rank`.
pub fn suspected_with(v: &Value, rank: u64) -> Option<Value> {
    v["hangs"]
        .as_array()?
        .iter()
        .find(|h| h["suspected"] == true && h["missing"].as_array().is_some_and(|m| m.iter().any(|x| rank_of(x) == Some(rank))))
        .cloned()
}

pub fn missing(h: &Value, rank: u64) -> Value {
    h["missing"].as_array().and_then(|m| m.iter().find(|x| rank_of(x) == Some(rank)).cloned()).expect("missing rank")
}

pub fn inside_ranks(h: &Value) -> Vec<u64> {
    let mut v: Vec<u64> = h["inside"].as_array().map(|a| a.iter().filter_map(rank_of).collect()).unwrap_or_default();
    v.sort_unstable();
    v
}

/// Seconds from the oldest open call's entry to `seen`.
pub fn latency(h: &Value, seen: f64) -> f64 {
    let since = h["inside"].as_array().expect("inside").iter().filter_map(|i| i["since"].as_f64()).fold(f64::INFINITY, f64::min);
    seen - since
}
