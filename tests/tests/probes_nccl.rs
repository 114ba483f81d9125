//! Issue 4, NCCL side, against the real agent binary with real eBPF uprobes:
//!
//! - NCCL-ABI decoding: `nccl_steps` and `nccl_abi_test` (tests/workloads/nccl-abi) on 4
//!   ranks in a fresh network namespace; every call's op, bytes (= count × dtype size), rank,
//!   nranks, communicator (FNV-1a of the 128-byte ncclUniqueId) and sequence number checked
//!   exactly against what the workload did.
//! - Lifecycle: a rank SIGKILLed inside ncclAllReduce leaves an aborted call and a healthy
//!   agent; a copy of libnccl.so.2 dlopen'ed late (a file the agent never preloaded) is
//!   probed, and after dlclose + dlopen again calls are seen once, not twice. A process
//!   started after the agent is covered by e2e_straggler.rs (the agent starts before mpirun).
//! - The real libnccl.so.2 from the `nvidia-nccl-cu12` wheel: every probe point of
//!   `targets::nccl()` resolves (public API and the internal `ncclIb*` functions), aliases
//!   share one offset, and the agent attaches to all of them (no GPU needed to attach).
//!
//! Tests run in parallel: every agent selects by a network namespace its test created.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::{Command, ExitStatus},
    sync::OnceLock,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use stepwise::sources::collectives::{decode::fnv1a, elf::SymbolTable, targets};
use stepwise_tests::{
    harness::{http_get, sample, wait_for, Agent, Proc},
    netns::Netns,
    workloads,
};

// ---------------------------------------------------------------------------------------
// Helpers

/// Writes an agent config selecting `ns`, preloading `library_dirs`, and starts the agent.
fn start_agent(dir: &Path, ns: &Netns, library_dirs: &[&Path]) -> Agent {
    let dirs = library_dirs.iter().map(|d| format!("{:?}", d.display().to_string())).collect::<Vec<_>>().join(", ");
    let cfg = dir.join("agent.toml");
    std::fs::write(
        &cfg,
        format!(
            "interval = \"100ms\"\n[sources]\nrdma = false\nethtool = false\n[collectives]\nlibrary_dirs = [{dirs}]\n[collectives.select]\nnetns = \"/run/netns/{}\"\n",
            ns.name()
        ),
    )
    .expect("write agent config");
    let agent = Agent::start(dir, &["--config", cfg.to_str().expect("utf8 path")]).expect("agent starts");
    // /readyz answers after the first counter sweep, while the probe thread may still be
    // preloading library_dirs: a job started now could run before the probes exist.
    if !library_dirs.is_empty() {
        wait_for(Duration::from_secs(30), "probes attached to the preloaded libraries", || {
            (metric(&agent, "stepwise_probe_attached", &[("library", "nccl")]) > 0.0).then_some(())
        })
        .unwrap_or_else(|e| panic!("{e}; agent log:\n{}", agent.proc.log_text()));
    }
    agent
}

/// A command run inside `ns` with extra environment (`ip netns exec NS env K=V … prog args`).
/// `ip` and `env` exec, so the child's pid is the program's.
fn in_netns(ns: &Netns, env: &[(&str, String)], prog: &Path, args: &[String]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns.name(), "env"]);
    for (k, v) in env {
        c.arg(format!("{k}={v}"));
    }
    c.arg(prog).args(args);
    c
}

/// Waits for a child to exit.
fn wait_exit(p: &mut Proc, t: Duration) -> Result<ExitStatus> {
    let end = Instant::now() + t;
    loop {
        if let Some(st) = p.child.try_wait()? {
            return Ok(st);
        }
        if Instant::now() > end {
            bail!("{} did not exit within {t:?}:\n{}", p.name, p.log_text());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// All calls the agent holds.
fn calls(agent: &Agent) -> Vec<Value> {
    let r = agent.get("/api/v1/collectives?limit=100000").expect("GET /api/v1/collectives");
    assert_eq!(r.status, 200, "{}", r.body);
    let v: Value = serde_json::from_str(&r.body).expect("collectives JSON");
    v["calls"].as_array().cloned().unwrap_or_default()
}

/// Calls of one process, in issue order.
fn calls_of(all: &[Value], pid: u32) -> Vec<Value> {
    let mut v: Vec<Value> = all.iter().filter(|c| c["pid"] == pid).cloned().collect();
    v.sort_by_key(|c| c["enter_ns"].as_u64().unwrap_or(0));
    v
}

/// The CommId the agent must report for the ncclUniqueId in an id file (256 hex digits).
fn comm_of_id_file(path: &Path) -> String {
    let hex = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let hex = hex.trim();
    assert_eq!(hex.len(), 256, "id file {} holds {} hex digits", path.display(), hex.len());
    let blob: Vec<u8> = (0..128).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex id")).collect();
    format!("{:016x}", fnv1a(&[&blob]))
}

/// Value of a metric sample (0 when absent).
fn metric(agent: &Agent, name: &str, labels: &[(&str, &str)]) -> f64 {
    sample(&agent.metrics().expect("metrics"), name, labels).unwrap_or(0.0)
}

/// One line summary of a call for assertion messages.
fn brief(c: &Value) -> String {
    format!(
        "{} bytes={} comm={} seq={} rank={} nranks={} ret={} aborted={} grouped={} tid={}",
        c["op"], c["bytes"], c["comm"], c["seq"], c["rank"], c["nranks"], c["ret"], c["aborted"], c["grouped"], c["tid"]
    )
}

/// Starts N ranks of a NCCL-ABI driver in `ns`; `args(rank)` gives each one's arguments.
fn spawn_ranks(ns: &Netns, dir: &Path, tag: &str, prog: &Path, n: u32, env: &[(&str, String)], args: impl Fn(u32) -> Vec<String>) -> Vec<Proc> {
    let mut env = env.to_vec();
    env.push(("NCCL_ABI_IFACE_ADDR", "127.0.0.1".into()));
    env.push(("CUDA_LAUNCH_BLOCKING", "1".into())); // blocking: host-timed until the profiler-plugin path covers this scenario
    (0..n)
        .map(|r| Proc::spawn(&format!("{tag} rank {r}"), &mut in_netns(ns, &env, prog, &args(r)), dir.join(format!("{tag}-r{r}.log"))).expect("spawn rank"))
        .collect()
}

/// Waits until every rank exited 0.
fn all_succeed(ranks: &mut [Proc], t: Duration) {
    for p in ranks.iter_mut() {
        let st = wait_exit(p, t).expect("rank exits");
        assert!(st.success(), "{} failed ({st}):\n{}", p.name, p.log_text());
    }
}

/// Waits until the agent has decoded at least `n` calls of `pids` (events are drained every
/// 20 ms; a margin covers a loaded machine).
fn wait_calls(agent: &Agent, pids: &[u32], n: usize) -> Vec<Value> {
    let got = wait_for(Duration::from_secs(30), "calls decoded", || {
        let all = calls(agent);
        let mine: Vec<Value> = all.into_iter().filter(|c| c["pid"].as_u64().is_some_and(|p| pids.contains(&(p as u32)))).collect();
        (mine.len() >= n).then_some(mine)
    });
    // Anything that would arrive later (a double count) has had time to show up too.
    std::thread::sleep(Duration::from_millis(300));
    let _ = got.unwrap_or_else(|e| panic!("{e}: {}; have {:?}", probe_counters(agent), calls(agent).iter().map(brief).collect::<Vec<_>>()));
    calls(agent).into_iter().filter(|c| c["pid"].as_u64().is_some_and(|p| pids.contains(&(p as u32)))).collect()
}

/// The agent's probe counters, for failure messages.
fn probe_counters(agent: &Agent) -> String {
    let m = agent.metrics().unwrap_or_default();
    let pick = |n: &str| stepwise_tests::harness::samples(&m, n).into_iter().map(|(l, v)| format!("{n}{{{l}}}={v}")).collect::<Vec<_>>().join(" ");
    ["stepwise_probe_events_total", "stepwise_probe_drops_total", "stepwise_probe_decode_errors_total", "stepwise_probe_processes", "stepwise_probe_attached"]
        .map(pick)
        .join(" ")
}

fn tempdir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("stepwise-probes-{tag}-")).tempdir().expect("tmp")
}

// ---------------------------------------------------------------------------------------
// a. NCCL-ABI decoding

#[test]
fn nccl_steps_allreduce_decoded_exactly_on_every_rank() {
    let build = workloads::build().expect("workloads build");
    let dir = tempdir("steps");
    let ns = Netns::new().expect("netns (needs root and iproute2)");
    let agent = start_agent(dir.path(), &ns, &[&build]);
    let (n, steps, bytes) = (4u32, 5u64, 65536u64 + 4 * 37); // count not a power of two
    let id = dir.path().join("nccl.id");
    let mut ranks = spawn_ranks(&ns, dir.path(), "nccl_steps", &build.join("nccl_steps"), n, &[("STEPS_COMPUTE", "sleep".into())], |r| {
        [
            "--rank",
            &r.to_string(),
            "--nranks",
            &n.to_string(),
            "--id-file",
            id.to_str().expect("utf8"),
            "--steps",
            &steps.to_string(),
            "--bytes",
            &bytes.to_string(),
            "--compute-us",
            "2000",
        ]
        .map(String::from)
        .to_vec()
    });
    let pids: Vec<u32> = ranks.iter().map(Proc::pid).collect();
    all_succeed(&mut ranks, Duration::from_secs(60));
    let comm = comm_of_id_file(&id);
    // Per rank: comm_init, S all_reduce, comm_destroy.
    let mine = wait_calls(&agent, &pids, pids.len() * (steps as usize + 2));
    for (r, pid) in pids.iter().enumerate() {
        let cs = calls_of(&mine, *pid);
        let ops: Vec<&str> = cs.iter().map(|c| c["op"].as_str().unwrap_or("")).collect();
        let mut want = vec!["comm_init"];
        want.extend(std::iter::repeat_n("all_reduce", steps as usize));
        want.push("comm_destroy");
        assert_eq!(ops, want, "rank {r}: every call seen exactly once: {:#?}", cs.iter().map(brief).collect::<Vec<_>>());
        for c in &cs {
            assert_eq!(c["library"], "nccl");
            assert_eq!(c["comm"], comm.as_str(), "rank {r}: CommId = FNV-1a of the uniqueId: {}", brief(c));
            assert_eq!(c["comm_global"], true);
            assert_eq!(c["rank"], r as u64, "{}", brief(c));
            assert_eq!(c["nranks"], u64::from(n), "{}", brief(c));
            assert_eq!(c["ret"], 0, "{}", brief(c));
            assert_eq!(c["aborted"], false);
            assert_eq!(c["grouped"], false);
            assert_eq!(c["host"].as_str().map(|h| !h.is_empty()), Some(true));
            let (e, x) = (c["enter_ns"].as_u64().expect("enter_ns"), c["exit_ns"].as_u64().expect("exit_ns"));
            assert!(e > 0 && x >= e, "{}", brief(c));
            assert!((c["duration"].as_f64().expect("duration") - (x - e) as f64 * 1e-9).abs() < 1e-6);
        }
        let ar: Vec<&Value> = cs.iter().filter(|c| c["op"] == "all_reduce").collect();
        let seqs: Vec<u64> = ar.iter().map(|c| c["seq"].as_u64().expect("collective has a seq")).collect();
        assert_eq!(seqs, (0..steps).collect::<Vec<_>>(), "rank {r}: seq 0..S-1 in issue order");
        assert!(
            ar.iter().all(|c| c["bytes"] == bytes),
            "rank {r}: bytes = count x 4 (float32): {:?}",
            ar.iter().map(|c| c["bytes"].clone()).collect::<Vec<_>>()
        );
        assert!(cs.iter().filter(|c| c["op"] != "all_reduce").all(|c| c["seq"].is_null() && c["bytes"].is_null()));
    }
    let m = agent.metrics().expect("metrics");
    assert_eq!(
        sample(&m, "stepwise_collective_calls_total", &[("library", "nccl"), ("op", "all_reduce")]),
        Some((u64::from(n) * steps) as f64),
        "calls counter"
    );
    assert_eq!(sample(&m, "stepwise_probe_drops_total", &[]), Some(0.0));
}

/// One run of `nccl_abi_test` on 4 ranks under an agent, shared by the tests that check it.
struct AbiRun {
    /// Calls per rank, in issue order.
    per_rank: Vec<Vec<Value>>,
    /// CommId of the world communicator.
    world: String,
    /// Decode errors the agent counted, by kind.
    decode_errors: BTreeMap<String, f64>,
}

fn abi_run() -> &'static AbiRun {
    static RUN: OnceLock<AbiRun> = OnceLock::new();
    RUN.get_or_init(|| {
        let build = workloads::build().expect("workloads build");
        let dir = tempdir("abi");
        let ns = Netns::new().expect("netns (needs root and iproute2)");
        let agent = start_agent(dir.path(), &ns, &[&build]);
        let id = dir.path().join("abi.id");
        let n = 4u32;
        let mut ranks = spawn_ranks(&ns, dir.path(), "nccl_abi_test", &build.join("nccl_abi_test"), n, &[], |r| {
            vec![r.to_string(), n.to_string(), id.display().to_string()]
        });
        let pids: Vec<u32> = ranks.iter().map(Proc::pid).collect();
        all_succeed(&mut ranks, Duration::from_secs(120));
        for p in &ranks {
            assert!(p.log_text().contains(" ok"), "{}: {}", p.name, p.log_text());
        }
        // Every rank issues at least 40 probed calls (see abi_test.c).
        let mine = wait_calls(&agent, &pids, 4 * 40);
        let m = agent.metrics().expect("metrics");
        let decode_errors = stepwise_tests::harness::samples(&m, "stepwise_probe_decode_errors_total").into_iter().collect();
        AbiRun { per_rank: pids.iter().map(|p| calls_of(&mine, *p)).collect(), world: comm_of_id_file(&id), decode_errors }
    })
}

/// What `nccl_abi_test` (tests/workloads/nccl-abi/abi_test.c) issues on the world
/// communicator, in order: (op, bytes, seq, ret, grouped). Bytes = count × ncclTypeSize.
/// (op, bytes, seq, ret, grouped) of one call.
type CallKey<S> = (S, Option<u64>, Option<u64>, i64, bool);

fn abi_world_calls() -> Vec<CallKey<&'static str>> {
    let mut v = vec![("comm_init", None, None, 0, false)]; // ncclCommInitRankConfig
    let mut seq = 0u64;
    let mut coll = |v: &mut Vec<_>, op, bytes: Option<u64>, ret| {
        v.push((op, bytes, Some(seq), ret, false));
        seq += 1;
    };
    // test_allreduce over every dtype, count 1000: Int8 Uint8 Int32 Uint32 Int64 Uint64
    // Float16 Float32 Float64 Bfloat16.
    for size in [1, 1, 4, 4, 8, 8, 2, 4, 8, 2] {
        coll(&mut v, "all_reduce", Some(1000 * size), 0);
    }
    // every op: Float32 × 3, then Int32 × 777 in place
    for _op in 0..5 {
        coll(&mut v, "all_reduce", Some(12), 0);
        coll(&mut v, "all_reduce", Some(777 * 4), 0);
    }
    for count in [0, 1, 1_000_003] {
        coll(&mut v, "all_reduce", Some(count * 4), 0);
    }
    // test_others: c = 10007 floats; broadcast (3 MiB / 4 + 3) floats; reduce with root and
    // comm on the stack.
    coll(&mut v, "reduce_scatter", Some(10007 * 4), 0);
    coll(&mut v, "all_gather", Some(10007 * 4), 0);
    coll(&mut v, "broadcast", Some(((3 << 20) / 4 + 3) * 4), 0);
    coll(&mut v, "reduce", Some(10007 * 4), 0);
    // grouped ring exchange of 3 int64 plus 1 int64 to self: point-to-point, no seq
    v.push(("send", Some(24), None, 0, true));
    v.push(("recv", Some(24), None, 0, true));
    v.push(("send", Some(8), None, 0, true));
    v.push(("recv", Some(8), None, 0, true));
    // test_split: two ncclCommSplit on the world communicator (split calls carry the
    // parent), then the error cases: a bad dtype (bytes unknown, ncclInvalidArgument = 4,
    // still issue order), then the NULL-comm call (not on this communicator), then a send to
    // peer n (ncclInvalidArgument).
    v.push(("comm_split", None, None, 0, false));
    v.push(("comm_split", None, None, 0, false));
    v.push(("comm_split", None, None, 0, false)); // test_abort_from_thread's split
    coll(&mut v, "all_reduce", None, 4);
    v.push(("send", Some(4), None, 4, false));
    v.push(("comm_destroy", None, None, 0, false));
    v
}

#[test]
fn nccl_abi_test_every_op_and_dtype_decoded_exactly() {
    let run = abi_run();
    let n = run.per_rank.len();
    for (r, cs) in run.per_rank.iter().enumerate() {
        let dump = || cs.iter().map(brief).collect::<Vec<_>>();
        assert!(cs.iter().all(|c| c["library"] == "nccl" && c["aborted"] == false), "{:#?}", dump());
        // Calls whose communicator argument is the world communicator. ncclCommSplit's
        // record carries the child; its parent is the world, so they are picked by op.
        let world: Vec<&Value> = cs.iter().filter(|c| c["comm"] == run.world.as_str() || c["op"] == "comm_split").collect();
        let got: Vec<CallKey<String>> = world
            .iter()
            .map(|c| {
                (c["op"].as_str().unwrap_or("").to_string(), c["bytes"].as_u64(), c["seq"].as_u64(), c["ret"].as_i64().unwrap_or(-1), c["grouped"] == true)
            })
            .collect();
        let want: Vec<CallKey<String>> = abi_world_calls().into_iter().map(|(o, b, s, ret, g)| (o.to_string(), b, s, ret, g)).collect();
        assert_eq!(got, want, "rank {r}: world-communicator calls (op, bytes, seq, ret, grouped), exactly once each");
        for c in world.iter().filter(|c| c["op"] != "comm_split") {
            assert_eq!((c["rank"].as_u64(), c["nranks"].as_u64(), c["comm_global"].as_bool()), (Some(r as u64), Some(n as u64), Some(true)), "{}", brief(c));
        }

        // test_split: color r % 2; one Int32 all-reduce (4 bytes) on the child, seq 0.
        let splits: Vec<&Value> = cs.iter().filter(|c| c["op"] == "comm_split").collect();
        let child = splits[0]["comm"].as_str().expect("split child has a CommId").to_string();
        let on_child: Vec<&Value> = cs.iter().filter(|c| c["comm"] == child.as_str() && c["op"] != "comm_split").collect();
        assert_eq!(
            on_child.iter().map(|c| (c["op"].as_str().unwrap_or(""), c["bytes"].as_u64(), c["seq"].as_u64(), c["ret"].as_i64())).collect::<Vec<_>>()[..2],
            [("all_reduce", Some(4), Some(0), Some(0)), ("comm_destroy", None, None, Some(0))],
            "rank {r}: split child calls: {:#?}",
            on_child.iter().map(|c| brief(c)).collect::<Vec<_>>()
        );

        // test_abort_from_thread: rank 0 alone calls a 4 Mi-float all-reduce on a fresh
        // split; another thread aborts the communicator and the call returns
        // ncclRemoteError (6). The other ranks destroy their child.
        let abort_child = splits[2]["comm"].as_str().expect("abort split child").to_string();
        let on_abort: Vec<&Value> = cs
            .iter()
            .filter(|c| c["comm"] == abort_child.as_str() && c["op"] != "comm_split" && c["enter_ns"].as_u64() > splits[2]["enter_ns"].as_u64())
            .collect();
        if r == 0 {
            let ar = on_abort.iter().find(|c| c["op"] == "all_reduce").unwrap_or_else(|| panic!("rank 0: the aborted all-reduce: {:#?}", dump()));
            assert_eq!((ar["bytes"].as_u64(), ar["ret"].as_i64(), ar["aborted"].as_bool()), (Some(16 << 20), Some(6), Some(false)), "{}", brief(ar));
            let ab =
                on_abort.iter().find(|c| c["op"] == "comm_abort").unwrap_or_else(|| panic!("rank 0: ncclCommAbort from the watchdog thread: {:#?}", dump()));
            assert_ne!(ab["tid"], ar["tid"], "abort came from another thread");
            assert!(
                ab["enter_ns"].as_u64() > ar["enter_ns"].as_u64() && ab["enter_ns"].as_u64() < ar["exit_ns"].as_u64(),
                "abort issued while the call was in flight"
            );
        } else {
            assert_eq!(on_abort.iter().map(|c| c["op"].as_str().unwrap_or("")).collect::<Vec<_>>(), ["comm_destroy"], "rank {r}");
        }

        // The NULL-communicator call: ncclInvalidArgument, 1 float.
        let null_comm = cs.iter().filter(|c| c["op"] == "all_reduce" && c["ret"] == 4 && c["bytes"] == 4).collect::<Vec<_>>();
        assert_eq!(null_comm.len(), 1, "rank {r}: the NULL-comm all-reduce seen once: {:#?}", dump());
        assert_ne!(null_comm[0]["comm"], run.world.as_str());
        // Nothing else: every call is accounted for above (by identity: with the split
        // CommId collision the same call can match twice).
        let accounted: BTreeSet<*const Value> = world.iter().chain(&on_child).chain(&on_abort).chain(&null_comm).map(|c| *c as *const Value).collect();
        assert_eq!(accounted.len(), cs.len(), "rank {r}: unexpected calls: {:#?}", dump());
    }
    // Same child CommId on ranks of the same colour, different across colours.
    let child = |r: usize| run.per_rank[r].iter().find(|c| c["op"] == "comm_split").map(|c| c["comm"].clone());
    assert_eq!(child(0), child(2));
    assert_eq!(child(1), child(3));
    assert_ne!(child(0), child(1));
    // The bad dtype (99) is the only decode error (counted, the call still recorded).
    assert_eq!(
        run.decode_errors.iter().filter(|(_, v)| **v > 0.0).map(|(k, v)| (k.clone(), *v)).collect::<Vec<_>>(),
        vec![("kind=\"bad_datatype\"".to_string(), n as f64)]
    );
}

/// Two communicators must never share a CommId: `(CommId, seq)` joins calls across ranks,
/// so a later split with the same colour (a new communicator, seq restarting at 0) that
/// reuses the first one's id makes different collectives join. And a split that returns no
/// communicator (NCCL_SPLIT_NOCOLOR → NULL) must not create one.
#[test]
fn nccl_split_communicators_have_distinct_identities() {
    let run = abi_run();
    let mut problems = Vec::new();
    for (r, cs) in run.per_rank.iter().enumerate() {
        let splits: Vec<&Value> = cs.iter().filter(|c| c["op"] == "comm_split").collect();
        assert_eq!(splits.len(), 3, "rank {r}");
        // splits: [colour r%2, NOCOLOR, colour 0 (abort test)].
        if r % 2 == 0 && splits[0]["comm"] == splits[2]["comm"] {
            problems.push(format!("rank {r}: the second colour-0 split of the world communicator got the first one's CommId {}", splits[0]["comm"]));
        }
        if !splits[1]["comm"].is_null() {
            problems.push(format!("rank {r}: NCCL_SPLIT_NOCOLOR returned NULL but the call got CommId {}", splits[1]["comm"]));
        }
        let keys: Vec<(String, u64)> = cs.iter().filter_map(|c| Some((c["comm"].as_str()?.to_string(), c["seq"].as_u64()?))).collect();
        let distinct: BTreeSet<&(String, u64)> = keys.iter().collect();
        if distinct.len() != keys.len() {
            problems.push(format!("rank {r}: {} collectives share a (CommId, seq) with another", keys.len() - distinct.len()));
        }
    }
    assert!(problems.is_empty(), "communicator identity (agent decode.rs, CommSplit):\n{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------
// b. Lifecycle

/// Which syscall a thread is in (`/proc/<pid>/task/<tid>/syscall`, first field).
fn in_syscall(pid: u32) -> Option<i64> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/syscall")).ok()?.split_whitespace().next()?.parse().ok()
}

/// Whether the main thread is sleeping (clock_nanosleep = 230, nanosleep = 35), twice
/// 200 ms apart: after init with --compute-us 0 (a spin, not a sleep) the only sleep is
/// the NCCL_ABI_DELAY inside ncclAllReduce.
fn asleep_in_call(pid: u32) -> bool {
    let sleeping = || matches!(in_syscall(pid), Some(230 | 35));
    sleeping() && {
        std::thread::sleep(Duration::from_millis(200));
        sleeping()
    }
}

#[test]
fn rank_killed_inside_allreduce_leaves_an_aborted_call_and_a_healthy_agent() {
    let build = workloads::build().expect("workloads build");
    let dir = tempdir("kill");
    let ns = Netns::new().expect("netns (needs root and iproute2)");
    let agent = start_agent(dir.path(), &ns, &[&build]);
    let id = dir.path().join("kill.id");
    let n = 4u32;
    // Rank 3 sleeps 60 s inside every collective (NCCL_ABI_DELAY_*: inside the call, before
    // it sends anything); the others wait for it inside the same all-reduce.
    let env = [("NCCL_ABI_DELAY_RANK", "3".to_string()), ("NCCL_ABI_DELAY_US", "60000000".into()), ("NCCL_ABI_TIMEOUT_MS", "60000".into())];
    let mut ranks = spawn_ranks(&ns, dir.path(), "kill", &build.join("nccl_steps"), n, &env, |r| {
        ["--rank", &r.to_string(), "--nranks", &n.to_string(), "--id-file", id.to_str().expect("utf8"), "--steps", "3", "--bytes", "4096", "--compute-us", "0"]
            .map(String::from)
            .to_vec()
    });
    let pids: Vec<u32> = ranks.iter().map(Proc::pid).collect();
    let victim = pids[3];
    wait_for(Duration::from_secs(30), "rank 3 initialised", || ranks[3].log_text().contains("init rank=3").then_some(())).expect("rank 3 init");
    wait_for(Duration::from_secs(10), "rank 3 asleep inside ncclAllReduce", || asleep_in_call(victim).then_some(())).expect("rank 3 in the call");
    let aborted0 = metric(&agent, "stepwise_collective_aborted_calls_total", &[("library", "nccl")]);
    let killed_at = Instant::now();
    ranks[3].child.kill().expect("SIGKILL rank 3");
    ranks[3].child.wait().expect("reap rank 3"); // as a launcher does
                                                 // The others fail promptly with ncclRemoteError (their peer's sockets closed).
    for p in ranks.iter_mut().take(3) {
        let st = wait_exit(p, Duration::from_secs(30)).expect("surviving rank exits");
        assert_eq!(st.code(), Some(1), "{}: {}", p.name, p.log_text());
    }
    let comm = comm_of_id_file(&id);
    let aborted = wait_for(Duration::from_secs(5), "an aborted call of the killed rank", || {
        calls(&agent).into_iter().find(|c| c["pid"] == victim && c["aborted"] == true)
    })
    .unwrap_or_else(|e| panic!("{e}; calls of rank 3: {:#?}", calls_of(&calls(&agent), victim).iter().map(brief).collect::<Vec<_>>()));
    let took = killed_at.elapsed();
    assert!(took < Duration::from_millis(2500), "aborted call recorded {took:?} after the kill (rescan every 500 ms)");
    assert_eq!(aborted["op"], "all_reduce", "{}", brief(&aborted));
    assert_eq!(
        (aborted["bytes"].as_u64(), aborted["seq"].as_u64(), aborted["rank"].as_u64(), aborted["nranks"].as_u64()),
        (Some(4096), Some(0), Some(3), Some(4)),
        "{}",
        brief(&aborted)
    );
    assert_eq!(aborted["comm"], comm.as_str());
    assert!(aborted["ret"].is_null(), "an aborted call never returned: {}", brief(&aborted));
    assert!(aborted["exit_ns"].as_u64() >= aborted["enter_ns"].as_u64());
    let all = calls(&agent);
    let victim_calls = calls_of(&all, victim);
    assert_eq!(
        victim_calls.iter().map(|c| (c["op"].as_str().unwrap_or(""), c["aborted"] == true)).collect::<Vec<_>>(),
        [("comm_init", false), ("all_reduce", true)],
        "rank 3 recorded once"
    );
    // The survivors' all-reduce returned ncclRemoteError (6): returned, not aborted.
    for pid in &pids[..3] {
        let ar: Vec<Value> = calls_of(&all, *pid).into_iter().filter(|c| c["op"] == "all_reduce").collect();
        assert_eq!(ar.len(), 1, "{:?}", ar.iter().map(brief).collect::<Vec<_>>());
        assert_eq!((ar[0]["ret"].as_i64(), ar[0]["aborted"].as_bool(), ar[0]["seq"].as_u64()), (Some(6), Some(false), Some(0)));
    }
    let aborted1 = metric(&agent, "stepwise_collective_aborted_calls_total", &[("library", "nccl")]);
    assert_eq!(aborted1 - aborted0, 1.0, "stepwise_collective_aborted_calls_total{{library=\"nccl\"}}");

    // The agent stays healthy and decodes the next job.
    let h = http_get(&agent.addr, "/healthz").expect("healthz");
    assert_eq!(h.status, 200);
    assert!(agent.proc.log_text().lines().all(|l| !l.contains("panicked")), "{}", agent.proc.log_text());
    let id2 = dir.path().join("next.id");
    let mut next = spawn_ranks(&ns, dir.path(), "next", &build.join("nccl_steps"), 2, &[("STEPS_COMPUTE", "sleep".into())], |r| {
        ["--rank", &r.to_string(), "--nranks", "2", "--id-file", id2.to_str().expect("utf8"), "--steps", "2", "--bytes", "8192", "--compute-us", "1000"]
            .map(String::from)
            .to_vec()
    });
    let next_pids: Vec<u32> = next.iter().map(Proc::pid).collect();
    all_succeed(&mut next, Duration::from_secs(60));
    let comm2 = comm_of_id_file(&id2);
    let got = wait_calls(&agent, &next_pids, 2 * 4);
    for (r, pid) in next_pids.iter().enumerate() {
        let ar: Vec<Value> = calls_of(&got, *pid).into_iter().filter(|c| c["op"] == "all_reduce").collect();
        assert_eq!(
            ar.iter().map(|c| (c["seq"].as_u64(), c["bytes"].as_u64(), c["rank"].as_u64(), c["comm"].as_str() == Some(comm2.as_str()))).collect::<Vec<_>>(),
            [(Some(0), Some(8192), Some(r as u64), true), (Some(1), Some(8192), Some(r as u64), true)]
        );
    }
    assert_eq!(metric(&agent, "stepwise_collective_aborted_calls_total", &[("library", "nccl")]), aborted1, "no further aborted calls");
}

/// A killed rank whose parent has not reaped it yet is a zombie: its threads are gone, so
/// the call it was in can never return. The agent must not wait for the reaping.
#[test]
fn rank_killed_and_not_yet_reaped_still_leaves_an_aborted_call() {
    let build = workloads::build().expect("workloads build");
    let dir = tempdir("zombie");
    let ns = Netns::new().expect("netns (needs root and iproute2)");
    let agent = start_agent(dir.path(), &ns, &[&build]);
    let id = dir.path().join("z.id");
    let env = [("NCCL_ABI_DELAY_RANK", "1".to_string()), ("NCCL_ABI_DELAY_US", "60000000".into()), ("NCCL_ABI_TIMEOUT_MS", "60000".into())];
    let mut ranks = spawn_ranks(&ns, dir.path(), "zombie", &build.join("nccl_steps"), 2, &env, |r| {
        ["--rank", &r.to_string(), "--nranks", "2", "--id-file", id.to_str().expect("utf8"), "--steps", "1", "--bytes", "4096", "--compute-us", "0"]
            .map(String::from)
            .to_vec()
    });
    let victim = ranks[1].pid();
    wait_for(Duration::from_secs(30), "rank 1 initialised", || ranks[1].log_text().contains("init rank=1").then_some(())).expect("rank 1 init");
    wait_for(Duration::from_secs(10), "rank 1 asleep inside ncclAllReduce", || asleep_in_call(victim).then_some(())).expect("rank 1 in the call");
    // SIGKILL without reaping (a launcher busy elsewhere, or a container's PID 1 that never
    // reaps): the process is a zombie from now on.
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(victim as i32, libc::SIGKILL) }, 0);
    wait_for(Duration::from_secs(5), "rank 1 a zombie", || {
        let st = std::fs::read_to_string(format!("/proc/{victim}/stat")).ok()?;
        (st[st.rfind(')')? + 2..].starts_with('Z')).then_some(())
    })
    .expect("zombie");
    let seen = wait_for(Duration::from_secs(3), "an aborted call of the killed (unreaped) rank", || {
        calls(&agent).into_iter().find(|c| c["pid"] == victim && c["aborted"] == true)
    });
    let _ = ranks[1].child.wait();
    let after_reap =
        wait_for(Duration::from_secs(3), "the aborted call once reaped", || calls(&agent).into_iter().find(|c| c["pid"] == victim && c["aborted"] == true))
            .is_ok();
    let _ = wait_exit(&mut ranks[0], Duration::from_secs(30));
    seen.unwrap_or_else(|e| {
        panic!(
            "{e}: the agent treats a zombie as alive (procs::alive = /proc/<pid> exists){}; calls of the rank: {:?}",
            if after_reap { ", the aborted call appeared only once the parent reaped it" } else { "" },
            calls_of(&calls(&agent), victim).iter().map(brief).collect::<Vec<_>>()
        )
    });
}

/// The late-loading program: starts, sleeps 1 s, then for each round dlopens LIB, waits for
/// DIR/go<round>, creates a 1-rank communicator (writing its uniqueId to DIR/id<round>),
/// issues CALLS all-reduces of (1000 + round) floats, destroys the communicator, dlcloses,
/// and waits for DIR/next<round>.
const LATE_DLOPEN_C: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
typedef struct { char internal[128]; } ncclUniqueId;
typedef int (*getid_t)(ncclUniqueId*);
typedef int (*init_t)(void**, int, ncclUniqueId, int);
typedef int (*allreduce_t)(const void*, void*, size_t, int, int, void*, void*);
typedef int (*destroy_t)(void*);
static void wait_file(const char* dir, const char* what, int round) {
  char p[4096];
  snprintf(p, sizeof p, "%s/%s%d", dir, what, round);
  while (access(p, F_OK) != 0) usleep(10000);
}
static void *sym(void *h, const char *name) {
  void *f = dlsym(h, name);
  if (!f) { fprintf(stderr, "dlsym %s: %s\n", name, dlerror()); exit(2); }
  return f;
}
int main(int argc, char **argv) {
  if (argc != 5) { fprintf(stderr, "usage: late LIB DIR ROUNDS CALLS\n"); return 2; }
  setvbuf(stdout, NULL, _IOLBF, 0);
  int rounds = atoi(argv[3]), calls = atoi(argv[4]);
  sleep(1);
  for (int round = 0; round < rounds; round++) {
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
    printf("loaded %d\n", round);
    wait_file(argv[2], "go", round);
    ncclUniqueId id;
    void *comm = NULL;
    if (((getid_t)sym(h, "ncclGetUniqueId"))(&id) != 0) return 3;
    char p[4096];
    snprintf(p, sizeof p, "%s/id%d", argv[2], round);
    FILE *f = fopen(p, "w");
    for (int i = 0; i < 128; i++) fprintf(f, "%02x", (unsigned char)id.internal[i]);
    fclose(f);
    if (((init_t)sym(h, "ncclCommInitRank"))(&comm, 1, id, 0) != 0) return 4;
    size_t count = 1000 + (size_t)round;
    float *buf = calloc(count, sizeof(float));
    for (int i = 0; i < calls; i++)
      if (((allreduce_t)sym(h, "ncclAllReduce"))(buf, buf, count, 7, 0, comm, NULL) != 0) return 5;
    if (((destroy_t)sym(h, "ncclCommDestroy"))(comm) != 0) return 6;
    free(buf);
    usleep(100000); /* the rendezvous root thread (detached) finishes its last close */
    if (dlclose(h) != 0) { fprintf(stderr, "dlclose: %s\n", dlerror()); return 7; }
    printf("closed %d\n", round);
    wait_file(argv[2], "next", round);
  }
  printf("done\n");
  return 0;
}
"#;

fn touch(dir: &Path, name: &str) {
    std::fs::write(dir.join(name), b"").expect("touch");
}

/// Whether `pid` maps a file at `path` now.
fn maps_file(pid: u32, path: &Path) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| m.lines().any(|l| l.ends_with(&*path.to_string_lossy())))
}

#[test]
fn library_dlopened_late_is_probed_and_a_reload_is_counted_once() {
    let build = workloads::build().expect("workloads build");
    let dir = tempdir("dlopen");
    let d = dir.path();
    // A copy: a new inode the agent has never seen (nothing is preloaded: library_dirs = []).
    let libdir = d.join("lib");
    std::fs::create_dir_all(&libdir).expect("mkdir");
    let lib = libdir.join("libnccl.so.2");
    std::fs::copy(build.join("libnccl.so.2"), &lib).expect("copy libnccl.so.2");
    let src = d.join("late.c");
    std::fs::write(&src, LATE_DLOPEN_C).expect("write late.c");
    let exe = d.join("late");
    workloads::run_ok(Command::new("cc").args(["-O1", "-Wall", "-Werror", "-o"]).arg(&exe).arg(&src).arg("-ldl")).expect("cc late.c (needs a C compiler)");

    let ns = Netns::new().expect("netns (needs root and iproute2)");
    let agent = start_agent(d, &ns, &[]);
    let attached = |agent: &Agent| metric(agent, "stepwise_probe_attached", &[("library", "nccl")]);
    assert_eq!(attached(&agent), 0.0, "nothing preloaded");
    let (rounds, per_round) = (3u32, 5u64);
    let mut p = Proc::spawn(
        "late",
        &mut in_netns(
            &ns,
            &[("NCCL_ABI_IFACE_ADDR", "127.0.0.1".into())],
            &exe,
            &[lib.display().to_string(), d.display().to_string(), rounds.to_string(), per_round.to_string()],
        ),
        d.join("late.log"),
    )
    .expect("spawn late");
    let pid = p.pid();
    let log = |p: &Proc| p.log_text();
    let lib_s = lib.to_string_lossy().into_owned();
    // Attach and detach log lines for this file ("attached" is logged after attaching,
    // "last user exited; detaching" before detaching).
    let attach_log = |agent: &Agent| {
        let log = strip_ansi(&agent.proc.log_text());
        let n = |what: &str| log.lines().filter(|l| l.contains(what) && l.contains(&*lib_s)).count();
        (n("attached library="), n("detaching library="))
    };
    let mut probes_per_attach = 0.0;
    for round in 0..rounds {
        wait_for(Duration::from_secs(15), &format!("loaded {round}"), || log(&p).contains(&format!("loaded {round}")).then_some(()))
            .unwrap_or_else(|e| panic!("{e}: {}", log(&p)));
        // The agent finds the new mapping on a rescan (every 500 ms) and attaches. Steady
        // state: attached once more than detached, the gauge set, for three rescans (a
        // rescan that saw the gap before this dlopen may still be detaching).
        let mut stable_since: Option<Instant> = None;
        let n = wait_for(Duration::from_secs(180), "probes attached to the dlopen'ed copy", || {
            let (a, d) = attach_log(&agent);
            let n = attached(&agent);
            if a == d + 1 && n > 0.0 {
                let t = *stable_since.get_or_insert_with(Instant::now);
                return (t.elapsed() > Duration::from_millis(1500)).then_some(n);
            }
            stable_since = None;
            None
        })
        .unwrap_or_else(|e| panic!("{e}; agent log:\n{}", agent.proc.log_text()));
        if round == 0 {
            probes_per_attach = n;
        }
        assert_eq!(n, probes_per_attach, "round {round}: one attachment, not two");
        touch(d, &format!("go{round}"));
        wait_for(Duration::from_secs(15), &format!("closed {round}"), || log(&p).contains(&format!("closed {round}")).then_some(()))
            .unwrap_or_else(|e| panic!("{e}: {}", log(&p)));
        assert!(!maps_file(pid, &lib), "dlclose unmapped the library");
        if round == 0 {
            // Round 1 reloads after the agent saw the library go (detach when the last user
            // unmaps it); round 2 reloads at once, usually before any rescan notices. Closing
            // 32 uprobe links took a minute on an overloaded VM (perf_uprobe_destroy waits for
            // RCU grace periods); the agent now closes them in the background, but old links
            // may still fire after a reload (their events are not calls), hence the limit.
            wait_for(Duration::from_secs(180), "detach after dlclose", || (attached(&agent) == 0.0).then_some(()))
                .unwrap_or_else(|e| panic!("{e}; agent log:\n{}", agent.proc.log_text()));
        }
        touch(d, &format!("next{round}"));
    }
    let st = wait_exit(&mut p, Duration::from_secs(15)).expect("late exits");
    assert!(st.success(), "late failed ({st}): {}", log(&p));

    let want_calls = rounds as usize * (per_round as usize + 2);
    let mine = wait_calls(&agent, &[pid], want_calls);
    let cs = calls_of(&mine, pid);
    assert_eq!(cs.len(), want_calls, "every call once: {:#?}", cs.iter().map(brief).collect::<Vec<_>>());
    for round in 0..rounds {
        let comm = comm_of_id_file(&d.join(format!("id{round}")));
        let mine: Vec<&Value> = cs.iter().filter(|c| c["comm"] == comm.as_str()).collect();
        let got: Vec<(&str, Option<u64>, Option<u64>)> =
            mine.iter().map(|c| (c["op"].as_str().unwrap_or(""), c["bytes"].as_u64(), c["seq"].as_u64())).collect();
        let mut want = vec![("comm_init", None, None)];
        want.extend((0..per_round).map(|s| ("all_reduce", Some((1000 + u64::from(round)) * 4), Some(s))));
        want.push(("comm_destroy", None, None));
        assert_eq!(got, want, "round {round}");
        assert!(mine.iter().all(|c| c["rank"] == 0 && c["nranks"] == 1 && c["comm_global"] == true));
        // Communicator calls keep their return; an all-reduce of this asynchronous process is
        // complete at its entry (no return value) once the agent has seen the process — by the
        // second round at the latest — and before that keeps its return.
        assert!(mine.iter().all(|c| c["ret"] == 0 || (c["op"] == "all_reduce" && c["ret"].is_null())), "{mine:#?}");
        if round > 0 {
            assert!(mine.iter().filter(|c| c["op"] == "all_reduce").all(|c| c["ret"].is_null() && c["enter_ns"] == c["exit_ns"]), "{mine:#?}");
        }
    }
    // One probe hit per call left alone at its entry, two per call with its return.
    let hits: f64 = cs.iter().map(|c| if c["ret"].is_null() { 1.0 } else { 2.0 }).sum();
    assert!(hits < 2.0 * want_calls as f64, "no call was left alone at its entry");
    // Not double counted anywhere: the agent's own counters agree with the workload.
    let m = agent.metrics().expect("metrics");
    assert_eq!(sample(&m, "stepwise_collective_calls_total", &[("library", "nccl"), ("op", "all_reduce")]), Some(f64::from(rounds) * per_round as f64));
    // Entry + return per paired call, the entry alone for the others; a 1-rank communicator
    // moves nothing over the transport.
    assert_eq!(
        sample(&m, "stepwise_probe_events_total", &[]),
        Some(hits),
        "probe program runs = 2 per paired call, 1 per call left alone: {}\n{}",
        probe_counters(&agent),
        strip_ansi(&agent.proc.log_text())
    );
}

// ---------------------------------------------------------------------------------------
// c. The real libnccl.so.2

/// Every probe of a library goes through uprobe-multi links — entry, return and session:
/// three links whatever the number of probes (14 here; two more links while a sampling
/// window is open) —, so twenty libraries hold 60 links where one perf-event uprobe per
/// program and probe held 280, and SIGTERM closes them concurrently: before, the exit closed
/// each alone, one RCU grace period after another (37 s for these twenty on this machine).
/// `cargo xtask bench shutdown` times it against the 2 s target.
#[test]
fn twenty_libraries_attach_in_three_links_each_and_sigterm_closes_them() {
    let dir = tempdir("twenty");
    let ns = Netns::new().expect("netns");
    let libs = workloads::nccl_library_copies(dir.path(), 20).expect("library copies");
    let mut agent = start_agent(dir.path(), &ns, &libs.iter().map(PathBuf::as_path).collect::<Vec<_>>());
    wait_for(Duration::from_secs(60), "all twenty libraries attached", || {
        let log = agent.proc.log_text();
        libs.iter().all(|d| log.contains(&format!("attached library={}/libnccl.so.2", d.display()))).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}:\n{}", agent.proc.log_text()));
    let probes = metric(&agent, "stepwise_probe_attached", &[("library", "nccl")]);
    let links = stepwise_tests::harness::bpf_link_types(agent.proc.pid());
    let count = |t: &str| links.get(t).copied().unwrap_or(0);
    eprintln!("{probes} probes attached in 20 libraries: links {links:?}");
    assert!(probes >= 20.0 * 10.0, "probes attached: {probes}");
    // Entry and session links (uprobe_multi), return links (uretprobe_multi); a sampling
    // window adds an entry and a return link per library.
    assert!([40, 60].contains(&count("uprobe_multi")) && [20, 40].contains(&count("uretprobe_multi")), "links {links:?}");
    assert!(count("perf") <= 1, "no perf-event uprobes (only the tcp tracepoint's link): {links:?}");
    let t0 = Instant::now();
    let code = agent.proc.terminate(Duration::from_secs(15));
    let took = t0.elapsed();
    eprintln!("SIGTERM to exit with twenty libraries attached: {took:?}");
    assert_eq!(code, Some(0), "exit 0 within 15 s of SIGTERM (took {took:?}):\n{}", agent.proc.log_text());
    assert!(!agent.proc.log_text().contains("still closing"), "every link closed before the exit:\n{}", agent.proc.log_text());
}

/// Cache directory for large downloads: `$STEPWISE_CACHE`, else `~/.cache/stepwise`.
fn cache_dir() -> PathBuf {
    std::env::var_os("STEPWISE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache/stepwise"))
}

/// The real `libnccl.so.2` from the `nvidia-nccl-cu12` PyPI wheel (≈350 MB, downloaded once
/// with `pip download` and cached), extracted alone into `<cache>/nccl/<wheel>/`. Fails
/// with a clear message when PyPI cannot be reached.
fn real_libnccl() -> Result<PathBuf> {
    let cache = cache_dir();
    let wheels = cache.join("wheels");
    std::fs::create_dir_all(&wheels).with_context(|| format!("create {}", wheels.display()))?;
    let find = || -> Option<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(&wheels)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("nvidia_nccl_cu12-") && n.ends_with(".whl")))
            .collect();
        v.sort();
        v.pop()
    };
    let wheel = match find() {
        Some(w) => w,
        None => {
            let python = ["python3", "python"]
                .into_iter()
                .find(|p| Command::new(p).arg("--version").output().is_ok_and(|o| o.status.success()))
                .ok_or_else(|| anyhow!("no python3 to run `pip download nvidia-nccl-cu12`"))?;
            eprintln!("downloading nvidia-nccl-cu12 (~350 MB) into {} ...", wheels.display());
            let out = Command::new(python)
                .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "nvidia-nccl-cu12", "-d"])
                .arg(&wheels)
                .output()
                .context("cannot run pip")?;
            if !out.status.success() {
                bail!(
                    "cannot download the nvidia-nccl-cu12 wheel from PyPI (is PyPI reachable? this test needs it; or put nvidia_nccl_cu12-*.whl into {}): pip: {}{}",
                    wheels.display(),
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            find().ok_or_else(|| anyhow!("pip download succeeded but no nvidia_nccl_cu12-*.whl in {}", wheels.display()))?
        }
    };
    let stem = wheel.file_stem().and_then(|s| s.to_str()).unwrap_or("nccl").to_string();
    let libdir = cache.join("nccl").join(&stem);
    let lib = libdir.join("libnccl.so.2");
    if lib.is_file() {
        return Ok(lib);
    }
    std::fs::create_dir_all(&libdir)?;
    // Extract to a temporary name and rename: a concurrent run never sees half a file.
    let tmp = libdir.join(format!(".libnccl.so.2.{}", std::process::id()));
    let script = "import sys, zipfile, shutil\nwith zipfile.ZipFile(sys.argv[1]) as z, z.open('nvidia/nccl/lib/libnccl.so.2') as s, open(sys.argv[2], 'wb') as d:\n    shutil.copyfileobj(s, d, 1 << 20)\n";
    let out = Command::new("python3").args(["-c", script]).arg(&wheel).arg(&tmp).output().context("cannot run python3 to unzip the wheel")?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&tmp);
        bail!("cannot extract nvidia/nccl/lib/libnccl.so.2 from {}: {}", wheel.display(), String::from_utf8_lossy(&out.stderr));
    }
    std::fs::rename(&tmp, &lib)?;
    Ok(lib)
}

/// Whether the code at a file offset starts with `push` (optionally after `endbr64`), the
/// first instructions x86 uprobes emulate instead of single-stepping (docs/platform-facts.md §6).
fn starts_with_push(file: &[u8], off: u64) -> bool {
    let mut b = &file[off as usize..off as usize + 8];
    if b.starts_with(&[0xf3, 0x0f, 0x1e, 0xfa]) {
        b = &b[4..];
    }
    (0x50..=0x57).contains(&b[0]) || (b[0] == 0x41 && (0x50..=0x57).contains(&b[1]))
}

#[test]
fn real_libnccl_every_probe_point_resolves_and_attaches() {
    let lib = real_libnccl().unwrap_or_else(|e| panic!("{e:#}"));
    let target = targets::nccl();
    let names: Vec<&str> = target.probes.iter().flat_map(|p| p.symbols.iter().map(String::as_str)).collect();
    let syms = SymbolTable::read(&lib, &names).expect("parse the real libnccl.so.2");
    let bytes = std::fs::read(&lib).expect("read lib");
    let mut offsets = BTreeSet::new();
    let mut sampled = BTreeSet::new();
    let mut report = Vec::new();
    for p in &target.probes {
        let found: Vec<(&str, u64)> = p.symbols.iter().filter_map(|s| syms.offset(s).map(|o| (s.as_str(), o))).collect();
        assert!(!found.is_empty(), "{:?} ({}) not found in {} (optional = {})", p.symbols, p.op.as_str(), lib.display(), p.optional);
        // Every alias listed (pncclX strong, ncclX weak) is there, at one offset.
        assert_eq!(found.len(), p.symbols.len(), "{:?}: only {found:?}", p.symbols);
        let off = found[0].1;
        assert!(found.iter().all(|(_, o)| *o == off), "aliases at different offsets: {found:?}");
        // Per-call probes must stay on the emulated path (a single-stepped first instruction
        // costs ~30x here); communicator setup/teardown runs once per communicator.
        let push = starts_with_push(&bytes, off);
        let once = matches!(p.op, targets::Op::CommInit | targets::Op::CommSplit | targets::Op::CommDestroy | targets::Op::CommAbort);
        assert!(push || once, "{:?} at {off:#x} does not start with push: {:02x?}", p.symbols, &bytes[off as usize..off as usize + 8]);
        report.push(format!(
            "{:<40} {off:#x}{}{}",
            found[0].0,
            if p.sampled { " (sampled)" } else { "" },
            if push { "" } else { " (first instruction not push: single-stepped)" }
        ));
        if p.sampled {
            sampled.insert(off);
        } else {
            offsets.insert(off);
        }
    }
    eprintln!("{}:\n  {}", lib.display(), report.join("\n  "));
    assert!(
        names.iter().any(|n| n.starts_with("_Z11ncclIbIsend")) && sampled.len() == 3,
        "ncclIbIsend/Irecv/Test are the sampled probes (per-chunk functions)"
    );

    // The agent attaches to the file found in library_dirs, before any process maps it.
    let dir = tempdir("realnccl");
    let ns = Netns::new().expect("netns (needs root and iproute2)");
    let libdir = lib.parent().expect("lib dir");
    let agent = start_agent(dir.path(), &ns, &[libdir]);
    let n = wait_for(Duration::from_secs(20), "probes attached to the real libnccl.so.2", || {
        Some(metric(&agent, "stepwise_probe_attached", &[("library", "nccl")])).filter(|n| *n > 0.0)
    })
    .unwrap_or_else(|e| panic!("{e}; agent log:\n{}", agent.proc.log_text()));
    assert_eq!(n, offsets.len() as f64, "stepwise_probe_attached{{library=\"nccl\"}} = distinct non-sampled offsets; agent log:\n{}", agent.proc.log_text());
    let log = agent.proc.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("attached") && l.contains(&*lib.to_string_lossy()))
        .unwrap_or_else(|| panic!("the log names the attached library:\n{log}"));
    let plain: String = strip_ansi(line);
    assert!(plain.contains(&format!("probes={}", offsets.len())) && plain.contains("sampled=3"), "{plain}");
    let bad: Vec<&str> = log.lines().filter(|l| l.contains("cannot attach") || l.contains("symbols not found") || l.contains("WARN")).collect();
    assert!(bad.is_empty(), "attach errors or warnings:\n{}", bad.join("\n"));
    assert_eq!(metric(&agent, "stepwise_probe_decode_errors_total", &[("kind", "attach")]), 0.0);
    assert_eq!(metric(&agent, "stepwise_probe_decode_errors_total", &[("kind", "elf")]), 0.0);
    // The sampled ncclIbTest window opens every 10 s by default; the agent stays healthy.
    assert_eq!(http_get(&agent.addr, "/healthz").expect("healthz").status, 200);
}

/// Removes ANSI colour escapes (the agent's log is coloured).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\u{1b}' {
            for d in it.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
