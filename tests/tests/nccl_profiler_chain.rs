//! Stepwise's profiler plugin with a second plugin chained behind it (STEPWISE_PROFILER_CHAIN,
//! docs/profiler-plugin.md "Chaining"), on the NCCL-ABI test library without the agent:
//! `nccl_prof_test` on 2 local ranks (all-reduces, an all-gather, a grouped send/recv ring, a
//! broadcast), Stepwise's records read from its socket, the chained plugin
//! (`libnccl-profiler-chaintest*.so`, tests/workloads/nccl-abi/chain_plugin.c) writing what it
//! received per communicator to a file at finalize, as NCCL Inspector writes its output.
//!
//! - The chained plugin gets exactly what NCCL gives it when it is loaded alone: the same
//!   callbacks per event type and state, with its own context and its own handles as parents
//!   (its file is compared line for line with a run where it is NCCL's plugin), for masks
//!   smaller and larger than Stepwise's, under every table version NCCL may use with Stepwise
//!   (v7-v4) and with a chained plugin older than that (v5 behind v7).
//! - Stepwise's records are those of a run without the chained plugin, and the same whichever
//!   table (v7-v4) NCCL uses.
//! - A missing file, a library without a profiler table, Stepwise itself, or a chained init
//!   that fails: one warning per process, Stepwise records as without it.

use std::{
    os::unix::net::UnixDatagram,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use nccl_profiler::wire;
use stepwise_tests::workloads;

const RANKS: usize = 2;

/// What one job left: Stepwise's final records (deterministic fields, sorted), the chained
/// plugin's lines (commid dropped, sorted), and the job's output.
struct Run {
    records: Vec<String>,
    chained: Vec<String>,
    output: String,
}

fn chaintest(name: &str) -> PathBuf {
    workloads::build().expect("tests/workloads/build.sh").join(format!("libnccl-profiler-{name}.so"))
}

/// The fields of a final record that do not depend on timing.
fn key(r: &wire::Record) -> String {
    format!(
        "rank={} func={} seq={} bytes={} count={} dt={} algo={} proto={} nch={} kstops={} flags={} gpu={}/{} requests={:?} request_bytes={:?}",
        r.rank,
        r.func,
        r.seq,
        r.bytes,
        r.count,
        r.datatype,
        r.algo,
        r.proto,
        r.n_channels,
        r.kernel_stops,
        r.flags,
        r.gpu_start_ptimer != 0,
        r.gpu_end_ptimer != 0,
        r.requests,
        r.request_bytes
    )
}

fn drain(sock: &UnixDatagram) -> Vec<String> {
    let mut buf = vec![0u8; 1 << 16];
    let mut out = Vec::new();
    while let Ok(n) = sock.recv(&mut buf) {
        let (_, recs) = wire::decode(&buf[..n]).expect("a plugin datagram");
        out.extend(recs.iter().filter(|r| r.flags & wire::FLAG_STARTED == 0).map(key));
    }
    out.sort();
    out
}

/// One `nccl_prof_test` job with `plugin` as NCCL's profiler plugin and `env`.
fn job(plugin: &Path, env: &[(&str, String)]) -> Run {
    let build = workloads::build().expect("tests/workloads/build.sh");
    let dir = tempfile::tempdir().expect("tempdir");
    let sock_path = dir.path().join("profiler.sock");
    let sock = UnixDatagram::bind(&sock_path).expect("bind");
    sock.set_read_timeout(Some(Duration::from_millis(300))).expect("timeout");
    let out_file = dir.path().join("chained.txt");
    let mut c = Command::new("bash");
    c.arg(build.join("../nccl-abi/run-local.sh")).args(["--bin", "nccl_prof_test"]).arg(RANKS.to_string());
    c.env("LD_LIBRARY_PATH", &build).env("NCCL_ABI_IFACE_ADDR", "127.0.0.1").env("ABITEST_EXPECT", "other");
    for v in ["NCCL_PROFILE_EVENT_MASK", "CUDA_LAUNCH_BLOCKING", "NCCL_ABI_NCHANNELS", "NCCL_ABI_PROFILER_VERSION", "CHAINTEST_MASK", "CHAINTEST_INIT_FAIL"] {
        c.env_remove(v);
    }
    c.env("NCCL_PROFILER_PLUGIN", plugin).env("STEPWISE_PROFILER_SOCKET", &sock_path).env("CHAINTEST_OUT", &out_file);
    c.env("STEPWISE_PROFILER_EVENTS", "kernel,proxy").env_remove("STEPWISE_PROFILER_CHAIN");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = workloads::run_ok(&mut c).unwrap_or_else(|e| panic!("{env:?}: {e:#}"));
    let output = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(output.lines().filter(|l| l.contains("prof_test rank=") && l.ends_with(" ok")).count(), RANKS, "{output}");
    let text = std::fs::read_to_string(&out_file).unwrap_or_default();
    let mut chained: Vec<String> = text.lines().map(|l| l.split_whitespace().filter(|t| !t.starts_with("commid=")).collect::<Vec<_>>().join(" ")).collect();
    chained.sort();
    Run { records: drain(&sock), chained, output }
}

fn stepwise() -> PathBuf {
    workloads::profiler_plugin().expect("the Stepwise plugin")
}

fn field<'a>(line: &'a str, k: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|t| t.strip_prefix(k)?.strip_prefix('='))
}

/// `chained` (a chained run) against `alone` (the chained plugin as NCCL's plugin) and
/// `base` (Stepwise alone).
fn same(what: &str, base: &Run, alone: &Run, chained: &Run, want_version: &str) {
    assert!(!base.records.is_empty(), "{what}: Stepwise recorded nothing:\n{}", base.output);
    assert_eq!(chained.records, base.records, "{what}: Stepwise's records changed with a chained plugin");
    assert_eq!(alone.chained.len(), RANKS, "{what}: one line per communicator:\n{}", alone.output);
    assert_eq!(chained.chained, alone.chained, "{what}: the chained plugin saw other callbacks than alone");
    for l in &chained.chained {
        assert_eq!(field(l, "v"), Some(want_version), "{what}: {l}");
        for bad in ["bad_parent", "no_parent", "double_stop", "foreign_ctx", "bad_handle"] {
            assert_eq!(field(l, bad), Some("0"), "{what}: {l}");
        }
        assert!(field(l, "t2").is_some_and(|n| n.parse::<u32>().unwrap_or(0) > 0), "{what}: no Coll event: {l}");
    }
}

#[test]
fn a_chained_plugin_gets_what_nccl_gives_it_alone_and_stepwise_records_do_not_change() {
    let (sw, ct) = (stepwise(), chaintest("chaintest"));
    let chain = ("STEPWISE_PROFILER_CHAIN", ct.display().to_string());
    let base = job(&sw, &[]);
    // Coll only (less than Stepwise asks for), Coll|KernelCh (Inspector's), and every v7
    // type but ProxyCtrl (whose count depends on the proxy thread's timing).
    for mask in ["0x2", "0x42", "0xffdf"] {
        let m = ("CHAINTEST_MASK", mask.to_string());
        let alone = job(&ct, std::slice::from_ref(&m));
        let chained = job(&sw, &[m, chain.clone()]);
        same(&format!("mask {mask}"), &base, &alone, &chained, "7");
    }
    let mask_of = |r: &Run| r.chained.first().and_then(|l| field(l, "t64").map(str::to_string));
    assert_eq!(mask_of(&job(&sw, &[("CHAINTEST_MASK", "0x2".into()), chain.clone()])), None, "KernelCh reached a plugin that did not ask for it");
}

#[test]
fn each_table_version_nccl_may_use_and_an_older_chained_plugin() {
    let (sw, ct, ct5) = (stepwise(), chaintest("chaintest"), chaintest("chaintest5"));
    let m = ("CHAINTEST_MASK", "0x5e".to_string());
    let v7 = job(&sw, &[]);
    for v in ["6", "5", "4"] {
        let ver = ("NCCL_ABI_PROFILER_VERSION", v.to_string());
        let base = job(&sw, std::slice::from_ref(&ver));
        // Each table reads its own layout: the same records whichever NCCL uses.
        assert_eq!(base.records, v7.records, "Stepwise's records through v{v} differ from v7's");
        let alone = job(&ct, &[ver.clone(), m.clone()]);
        let chained = job(&sw, &[ver, m.clone(), ("STEPWISE_PROFILER_CHAIN", ct.display().to_string())]);
        same(&format!("NCCL using v{v}"), &base, &alone, &chained, v);
    }
    // NCCL on v7 with Stepwise, the chained plugin on v5 (as Inspector's v5-only headers).
    let base = v7;
    let alone = job(&ct5, std::slice::from_ref(&m));
    let chained = job(&sw, &[m, ("STEPWISE_PROFILER_CHAIN", "chaintest5".into())]);
    same("v5 behind v7, by name", &base, &alone, &chained, "5");
}

#[test]
fn a_chained_plugin_that_cannot_be_used_leaves_stepwise_recording() {
    let sw = stepwise();
    let base = job(&sw, &[]);
    let nccl = workloads::build().expect("build").join("libnccl.so.2");
    let cases = [
        ("/nonexistent/libnccl-profiler-x.so".to_string(), vec![], "cannot open"),
        (nccl.display().to_string(), vec![], "exports no ncclProfiler"),
        (sw.display().to_string(), vec![], "Stepwise's own plugin"),
        (chaintest("chaintest").display().to_string(), vec![("CHAINTEST_INIT_FAIL", "1".to_string())], "init failed"),
    ];
    for (target, extra, why) in cases {
        let mut env = extra;
        env.push(("STEPWISE_PROFILER_CHAIN", target.clone()));
        let r = job(&sw, &env);
        assert_eq!(r.records, base.records, "{target}: Stepwise's records changed");
        assert!(r.chained.is_empty(), "{target}: the chained plugin wrote {:?}", r.chained);
        let warnings: Vec<&str> = r.output.lines().filter(|l| l.contains("Stepwise profiler:")).collect();
        assert_eq!(warnings.len(), RANKS, "{target}: one warning per process, got {warnings:?}\n{}", r.output);
        let hint = if why == "cannot open" { "No such file" } else { why };
        assert!(warnings.iter().all(|w| w.contains(hint)), "{target}: {warnings:?}");
    }
}
