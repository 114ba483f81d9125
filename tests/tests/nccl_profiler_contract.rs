//! The NCCL-ABI test library against NCCL's contracts (tests/workloads/nccl-abi, README
//! "Asynchronous execution" and "Profiler plugins"), without the agent and without root:
//! - `nccl_prof_test` on 3 local ranks with the contract-test plugin
//!   (`libnccl-profiler-abitest*.so`): the newest exported table is used (v7, v6, v5, v4), by
//!   name or path, and each older one when the lookup starts lower; init arguments, the activation mask, parents, seqNumbers, KernelCh GPU
//!   timers, ProxyOp/ProxyStep states (checked inside the program, see prof_check.c); a
//!   plugin whose init fails, a missing one and "none" leave the job running;
//! - asynchronous calls return before a late peer's data arrived (and with
//!   CUDA_LAUNCH_BLOCKING=1 only after); an asynchronous failure surfaces at the
//!   synchronize, in ncclCommGetAsyncError and at the next call (blocking: from the call);
//!   `nccl_abi_test` exact results in both modes;
//! - `nccl_steps --gpu-delay-*`: the on-time rank enqueues at once and waits in the
//!   stream synchronize.

use std::{collections::HashMap, path::Path, process::Command};

use stepwise_tests::workloads;

const RANKS: usize = 3;

/// Runs `run-local.sh --bin BIN RANKS args…` with `env`; returns stdout (fails on exit != 0).
fn run_local(bin: &str, n: usize, env: &[(&str, String)], args: &[&str]) -> String {
    let build = workloads::build().expect("tests/workloads/build.sh");
    let script = build.join("../nccl-abi/run-local.sh");
    let mut c = Command::new("bash");
    c.arg(&script).args(["--bin", bin]).arg(n.to_string()).args(args);
    c.env("LD_LIBRARY_PATH", &build).env("NCCL_ABI_IFACE_ADDR", "127.0.0.1");
    for v in ["NCCL_PROFILER_PLUGIN", "NCCL_PROFILE_EVENT_MASK", "CUDA_LAUNCH_BLOCKING", "NCCL_ABI_NCHANNELS", "NCCL_ABI_PROFILER_VERSION"] {
        c.env_remove(v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let out = workloads::run_ok(&mut c).unwrap_or_else(|e| panic!("{bin} {env:?}: {e:#}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn kv(line: &str) -> HashMap<&str, &str> {
    line.split_whitespace().filter_map(|t| t.split_once('=')).collect()
}

/// One `nccl_prof_test` job: every rank reports ok with `expect`, all ranks' plugins got the
/// same non-zero commId (or 0 without a plugin); returns the timing line of rank 0.
fn prof_job(lib: &Path, expect: &str, env: &[(&str, String)]) -> HashMap<String, f64> {
    let mut e = vec![("ABITEST_EXPECT", expect.to_string()), ("ABITEST_LIB", lib.display().to_string())];
    e.extend(env.iter().cloned());
    let out = run_local("nccl_prof_test", RANKS, &e, &[]);
    let results: Vec<HashMap<&str, &str>> = out.lines().filter(|l| l.contains("] prof_test rank=") && l.contains(" commid=")).map(kv).collect();
    assert_eq!(results.len(), RANKS, "one result per rank:\n{out}");
    assert!(out.lines().filter(|l| l.contains(" commid=")).all(|l| l.ends_with(" ok")), "{out}");
    let ids: Vec<&str> = results.iter().map(|r| r["commid"]).collect();
    assert!(ids.iter().all(|i| *i == ids[0]), "commId differs between ranks: {ids:?}");
    let with_plugin = expect != "none";
    assert_eq!(ids[0] != "0", with_plugin, "commId {} with expect={expect}", ids[0]);
    // Without a plugin the program also checks how an asynchronous failure surfaces.
    assert_eq!(out.contains("] async_error rank=0"), !with_plugin, "{out}");
    let timing = out.lines().find(|l| l.contains("timing rank=0")).unwrap_or_else(|| panic!("no timing line:\n{out}"));
    kv(timing).into_iter().filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?))).collect()
}

#[test]
fn profiler_plugin_newest_table_by_name_or_path() {
    let build = workloads::build().expect("workloads");
    let v7 = build.join("libnccl-profiler-abitest.so");
    let v6 = build.join("libnccl-profiler-abitest6.so");
    let v5 = build.join("libnccl-profiler-abitest5.so");
    let v4 = build.join("libnccl-profiler-abitest4.so");
    // By name: libnccl-profiler-<name>.so through the library search path.
    prof_job(&v7, "7", &[("NCCL_PROFILER_PLUGIN", "abitest".into())]);
    prof_job(&v6, "6", &[("NCCL_PROFILER_PLUGIN", "abitest6".into())]);
    prof_job(&v5, "5", &[("NCCL_PROFILER_PLUGIN", "abitest5".into())]);
    // As given: a file name, then a path.
    prof_job(&v5, "5", &[("NCCL_PROFILER_PLUGIN", "libnccl-profiler-abitest5.so".into())]);
    prof_job(&v4, "4", &[("NCCL_PROFILER_PLUGIN", v4.display().to_string())]);
}

/// NCCL_ABI_PROFILER_VERSION=N starts the lookup at vN (as an NCCL that knows no newer table):
/// the same library then serves each older table, checked as above; below v4 nothing loads.
#[test]
fn profiler_plugin_each_older_table_when_the_lookup_starts_lower() {
    let all = workloads::build().expect("workloads").join("libnccl-profiler-abitest.so");
    let name = ("NCCL_PROFILER_PLUGIN", "abitest".to_string());
    for v in ["6", "5", "4"] {
        prof_job(&all, v, &[name.clone(), ("NCCL_ABI_PROFILER_VERSION", v.into())]);
    }
    prof_job(&all, "none", &[name, ("NCCL_ABI_PROFILER_VERSION", "3".into())]);
}

#[test]
fn profiler_plugin_mask_and_channels() {
    let v7 = workloads::build().expect("workloads").join("libnccl-profiler-abitest.so");
    let name = ("NCCL_PROFILER_PLUGIN", "abitest".to_string());
    // Coll | KernelCh: no ProxyOp/ProxyStep/P2p-only events (prof_check.c enable_bits).
    prof_job(&v7, "7", &[name.clone(), ("NCCL_PROFILE_EVENT_MASK", "0x42".into())]);
    // ProxyOp only: tasks are still started as its parents, no ProxyStep, no KernelCh.
    prof_job(&v7, "7", &[name.clone(), ("NCCL_PROFILE_EVENT_MASK", "8".into())]);
    // Nothing enabled: no event at all.
    prof_job(&v7, "7", &[name.clone(), ("NCCL_PROFILE_EVENT_MASK", "0".into())]);
    prof_job(&v7, "7", &[name, ("NCCL_ABI_NCHANNELS", "4".into())]);
}

#[test]
fn profiler_plugin_failing_missing_or_off_leaves_the_job_running() {
    let all = workloads::build().expect("workloads").join("libnccl-profiler-abitest.so");
    prof_job(&all, "initfail", &[("NCCL_PROFILER_PLUGIN", "abitest".into()), ("ABITEST_INIT_FAIL", "1".into())]);
    prof_job(&all, "none", &[("NCCL_PROFILER_PLUGIN", "no-such-plugin".into())]);
    prof_job(&all, "none", &[("NCCL_PROFILER_PLUGIN", "NONE".into())]);
    prof_job(&all, "none", &[]);
}

#[test]
fn async_calls_return_before_a_late_peer_and_blocking_restores_waiting() {
    let all = workloads::build().expect("workloads").join("libnccl-profiler-abitest.so");
    let name = ("NCCL_PROFILER_PLUGIN", "abitest".to_string());
    let t = prof_job(&all, "7", std::slice::from_ref(&name));
    let late = t["late_ms"];
    assert_eq!(t["blocking"], 0.0);
    assert!(t["call_ms"] < late * 0.1, "async call took {} ms with a peer {late} ms late", t["call_ms"]);
    assert!(t["call_ms"] + t["sync_ms"] >= late * 0.8, "{t:?}");
    let b = prof_job(&all, "7", &[name, ("CUDA_LAUNCH_BLOCKING", "1".into())]);
    assert_eq!(b["blocking"], 1.0);
    assert!(b["call_ms"] >= late * 0.8, "blocking call returned after {} ms, peer {late} ms late", b["call_ms"]);
    // A failure: at the synchronize, or (blocking) from the call itself (prof_test.c async_error).
    prof_job(&all, "none", &[("NCCL_PROFILER_PLUGIN", "none".into()), ("CUDA_LAUNCH_BLOCKING", "1".into())]);
    for blocking in ["0", "1"] {
        let out = run_local("nccl_abi_test", RANKS, &[("CUDA_LAUNCH_BLOCKING", blocking.into())], &[]);
        assert_eq!(out.lines().filter(|l| l.contains("abi_test rank=") && l.ends_with(" ok")).count(), RANKS, "{out}");
    }
}

#[test]
fn nccl_steps_gpu_delay_is_waited_for_in_the_synchronize() {
    let args = ["--steps", "4", "--bytes", "65536", "--compute-us", "1000", "--gpu-compute-ms", "5", "--gpu-delay-rank", "1", "--gpu-delay-ms", "80"];
    let out = run_local("nccl_steps", 2, &[("STEPS_COMPUTE", "sleep".into())], &args);
    let steps: Vec<HashMap<&str, &str>> = out.lines().filter(|l| l.contains("] step rank=")).map(kv).collect();
    assert_eq!(steps.len(), 8, "{out}");
    for s in &steps {
        let f = |k: &str| s[k].parse::<f64>().unwrap();
        // Both ranks enqueue at once; the on-time rank 0 waits for rank 1's late GPU in the
        // synchronize (all-reduce time = enqueue to stream done), rank 1 for its own compute.
        assert!(f("enqueue_us") < 20_000.0, "{s:?}");
        assert!(f("allreduce_us") >= 80_000.0, "{s:?}");
        assert_eq!(f("gpu_ms"), if s["rank"] == "1" { 85.0 } else { 5.0 }, "{s:?}");
        assert_eq!(s["bad"], "0");
    }
}

/// PyTorch loads NCCL as a dependency of a library Python opened with RTLD_LOCAL, so NCCL's
/// symbols are not global. On a real GPU (PyTorch 2.11, NCCL 2.28.9) the Stepwise plugin then
/// reported NCCL version 0 (it looked `ncclGetVersion` up in the global scope only), and its
/// `auto` event mask, which depends on the version, could not tell NCCL 2.31 apart. Here the
/// test library is opened the same way (Python ctypes, RTLD_LOCAL) and one rank all-reduces
/// with the plugin: every datagram's header carries the library's version (2.30.7).
#[test]
fn the_plugin_reads_the_nccl_version_when_nccl_is_not_global() {
    let build = workloads::build().expect("workloads");
    let plugin = workloads::profiler_plugin().expect("the Stepwise plugin");
    let dir = tempfile::tempdir().expect("tempdir");
    let sock_path = dir.path().join("profiler.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&sock_path).expect("bind");
    sock.set_read_timeout(Some(std::time::Duration::from_secs(5))).expect("timeout");
    const PROG: &str = r#"
import ctypes, os, sys
lib = ctypes.CDLL(sys.argv[1], mode=os.RTLD_LOCAL | os.RTLD_NOW)
class Id(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]
uid, comm = Id(), ctypes.c_void_p()
assert lib.ncclGetUniqueId(ctypes.byref(uid)) == 0
assert lib.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0) == 0
buf = (ctypes.c_float * 1024)()
for _ in range(3):
    assert lib.ncclAllReduce(buf, buf, 1024, 7, 0, comm, None) == 0
assert lib.ncclAbiStreamSynchronize(None) == 0
assert lib.ncclCommDestroy(comm) == 0
"#;
    let out = Command::new("python3")
        .args(["-c", PROG])
        .arg(build.join("libnccl.so.2"))
        .env("NCCL_PROFILER_PLUGIN", &plugin)
        .env("STEPWISE_PROFILER_SOCKET", &sock_path)
        .env("NCCL_ABI_IFACE_ADDR", "127.0.0.1")
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .expect("python3");
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let mut buf = [0u8; 65536];
    let n = sock.recv(&mut buf).expect("a datagram from the plugin");
    assert!(n >= 20 && buf[..4] == 0x4650_5753u32.to_le_bytes(), "not a plugin datagram ({n} bytes)");
    let version = u32::from_le_bytes(buf[16..20].try_into().expect("4 bytes"));
    assert_eq!(version, 23007, "the header's NCCL version");
}
