//! Fault injection (issue 7): each test injects one fault into a real agent — real eBPF
//! uprobes, real namespaces and veths, the sysfs scenario writer for RDMA counters — and
//! asserts that the agent stays healthy (alive, `/healthz` 200, still sweeping) and that
//! nothing is lost, invented or counted twice.
//!
//! Covered elsewhere and not repeated here: an NCCL rank SIGKILLed inside ncclAllReduce
//! (reaped and not), and a library dlopen'ed late then dlclose'd/dlopen'ed again with calls
//! and `/metrics` counted once (tests/tests/probes_nccl.rs); a peer that hangs or answers
//! HTML during `diagnose --peers` (agent/tests/diagnose_cli.rs); a veth re-created under the
//! bare sources (tests/tests/kernel_sources.rs). Here: the MPI variant with the step history,
//! a preloaded library *replaced on disk* between loads, an agent SIGKILLed and restarted on
//! its store, counter reset/wrap/saturation inside steps, a veth re-created during steps,
//! RingBuf overflow, config errors and reload, HTTP abuse, and peers that send endless or
//! unparseable bodies.
//!
//! Every test has its own namespace, directory and ports (parallel-safe); processes are
//! killed and namespaces deleted on drop, also when an assertion fails.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{Read, Write},
    net::{TcpListener, TcpStream, UdpSocket},
    path::Path,
    process::Command,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use serde_json::Value;
use stepwise::store::{StepQuery, Store};
use stepwise_tests::{
    faults::{build_storm, in_netns, metric_sum, mpi_ranks, run_storm, signal, storm_cmd, wall, AgentSpec, FaultAgent, Marks, ProcStats, StormResult},
    harness::{agent_bin, wait_for, Proc},
    netns::{Netns, Veth},
    scenario::{PmaTable, Scenario},
    workloads,
};

fn tempdir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("stepwise-faults-{tag}-")).tempdir_in(stepwise_tests::scenario::memory_dir()).expect("tmp")
}

/// Config text: sampling every `interval`, only the `sources` named, probes on processes of
/// `ns` (library_dirs = the test workloads, preloaded), plus `extra` (tables only).
fn config(interval: &str, sources: &[&str], ns: &Netns, extra: &str) -> String {
    let on = |s: &str| sources.contains(&s);
    format!(
        "interval = \"{interval}\"\n[sources]\nrdma = {}\nethtool = {}\nnetdev = {}\nqdisc = {}\ntcp = {}\n[collectives]\nlibrary_dirs = [\"{}\", \"/usr/lib/x86_64-linux-gnu\"]\n[collectives.select]\nnetns = \"/run/netns/{}\"\n{extra}",
        on("rdma"),
        on("ethtool"),
        on("netdev"),
        on("qdisc"),
        on("tcp"),
        workloads::build().expect("workloads build").display(),
        ns.name()
    )
}

fn spec(config: String) -> AgentSpec {
    AgentSpec { config, log_env: Some("info".into()), ..Default::default() }
}

/// Waits for the agent's probes on the preloaded NCCL-ABI library (the preload runs after
/// `/readyz`).
fn wait_probes(agent: &FaultAgent, library: &str) {
    wait_for(Duration::from_secs(60), "probes attached", || (agent.metric("stepwise_probe_attached", &[("library", library)]) > 0.0).then_some(()))
        .unwrap_or_else(|e| panic!("{e}; agent log:\n{}", agent.proc.log_text()));
}

/// Ranks of a `nccl_steps` job in `ns` (loopback), markers to `sock`.
fn nccl_job(ns: &Netns, dir: &Path, tag: &str, n: u32, sock: &Path, args: &[&str]) -> Vec<Proc> {
    let bin = workloads::build().expect("workloads").join("nccl_steps");
    let id = dir.join(format!("{tag}.id"));
    let _ = std::fs::remove_file(&id);
    (0..n)
        .map(|r| {
            let mut c = Command::new("ip");
            // CUDA_LAUNCH_BLOCKING=1 — blocking: host-timed until the profiler-plugin path covers this scenario
            c.args(["netns", "exec", ns.name(), "env", "STEPS_COMPUTE=sleep", "NCCL_ABI_IFACE_ADDR=127.0.0.1", "CUDA_LAUNCH_BLOCKING=1"]).arg(&bin);
            c.args(["--rank", &r.to_string(), "--nranks", &n.to_string(), "--id-file"]).arg(&id).arg("--marker-socket").arg(sock).args(args);
            Proc::spawn(&format!("{tag}-r{r}"), &mut c, dir.join(format!("{tag}-r{r}.log"))).expect("spawn rank")
        })
        .collect()
}

fn wait_ranks(ranks: &mut [Proc], t: Duration) {
    let end = Instant::now() + t;
    for p in ranks.iter_mut() {
        loop {
            match p.child.try_wait().expect("try_wait") {
                Some(st) => {
                    assert!(st.success(), "{} failed ({st}):\n{}", p.name, p.log_text());
                    break;
                }
                None if Instant::now() > end => panic!("{} still running after {t:?}:\n{}", p.name, p.log_text()),
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

/// Step rows of the store: (job key is always "markers" here) step id → begins.
fn stored_steps(db: &Path) -> (Vec<String>, Vec<stepwise::attribution::Attribution>) {
    let st = Store::open(db).unwrap_or_else(|e| panic!("open the agent's store {}: {e}", db.display()));
    let integrity = st.integrity_check().expect("integrity_check");
    let steps = st.steps(&StepQuery::default()).expect("read steps");
    (integrity, steps)
}

/// Every step once: (id, begin µs) unique, and per id as many rows as incarnations.
fn ids_once(steps: &[Value]) -> BTreeMap<u64, usize> {
    let mut per: BTreeMap<u64, usize> = BTreeMap::new();
    let mut keys = BTreeSet::new();
    for s in steps {
        let id = s["step"].as_u64().expect("step id");
        let begin = (s["begin"].as_f64().expect("begin") * 1e6) as i64;
        assert!(keys.insert((id, begin)), "step {id} (begin {begin} µs) listed twice: {steps:#?}");
        *per.entry(id).or_default() += 1;
    }
    per
}

fn assert_parts_sum(steps: &[Value]) {
    for s in steps {
        let total: f64 = s["causes"].as_array().expect("causes").iter().map(|c| c["seconds"].as_f64().expect("finite seconds")).sum();
        let secs = s["seconds"].as_f64().expect("seconds");
        assert!(secs.is_finite() && secs >= 0.0 && (total - secs).abs() < 1e-9, "step {}: parts {total} vs {secs}", s["step"]);
    }
}

// ---------------------------------------------------------------------------------------
// 1. A traced process SIGKILLed inside a collective: the MPI variant, and the step history.

#[test]
fn mpi_rank_killed_inside_allreduce_leaves_an_aborted_call_and_a_consistent_step_history() {
    let build = workloads::build().expect("workloads build");
    let dir = tempdir("mpikill");
    let ns = Netns::new().expect("netns (needs root and iproute2)");
    let mut agent = FaultAgent::start(dir.path(), &spec(config("100ms", &[], &ns, ""))).expect("agent");
    wait_probes(&agent, "mpi");
    let sock = agent.sock.to_str().expect("utf8").to_string();
    // Rank 3 computes 60 s longer on step 4 (the 5th): ranks 0-2 wait inside MPI_Allreduce.
    let mut job = Proc::spawn(
        "mpirun",
        &mut workloads::mpi_steps(
            ns.name(),
            4,
            &[
                "--steps",
                "8",
                "--bytes",
                "65536",
                "--compute-us",
                "20000",
                "--delay-rank",
                "3",
                "--delay-us",
                "60000000",
                "--delay-every",
                "5",
                "--marker-socket",
                &sock,
            ],
        ),
        dir.path().join("mpi1.log"),
    )
    .expect("mpirun");
    wait_for(Duration::from_secs(60), "step 3 done on rank 0", || job.log_text().contains("step rank=0 step=3 ").then_some(()))
        .unwrap_or_else(|e| panic!("{e}: {}", job.log_text()));
    let ranks = wait_for(Duration::from_secs(10), "4 ranks", || Some(mpi_ranks(&build.join("mpi_steps"))).filter(|v| v.len() == 4)).expect("rank pids");
    let pid_of = |r: u32| ranks.iter().find(|x| x.0 == r).map(|x| x.1).expect("rank pid");
    let victim = pid_of(0);
    // Rank 0 is inside step 4's MPI_Allreduce once its 4 earlier calls are in and a 5th has
    // not returned (20 ms of compute after step 3's line).
    wait_for(Duration::from_secs(10), "rank 0's four all-reduces decoded", || {
        (agent.calls().ok()?.iter().filter(|c| c["pid"] == victim && c["op"] == "all_reduce").count() == 4).then_some(())
    })
    .expect("calls");
    std::thread::sleep(Duration::from_millis(500));
    let aborted0 = agent.metric("stepwise_collective_aborted_calls_total", &[("library", "mpi")]);
    signal(victim, libc::SIGKILL);
    let st = wait_for(Duration::from_secs(60), "mpirun to end the job", || job.child.try_wait().ok().flatten()).expect("mpirun exits");
    assert!(!st.success(), "mpirun must report the killed rank");

    let aborted =
        wait_for(Duration::from_secs(5), "the aborted call of rank 0", || agent.calls().ok()?.into_iter().find(|c| c["pid"] == victim && c["aborted"] == true))
            .unwrap_or_else(|e| panic!("{e}; log:\n{}", agent.proc.log_text()));
    assert_eq!(
        (aborted["op"].as_str(), aborted["seq"].as_u64(), aborted["bytes"].as_u64(), aborted["rank"].as_u64()),
        (Some("all_reduce"), Some(4), Some(65536), Some(0)),
        "{aborted}"
    );
    assert!(aborted["ret"].is_null());
    let calls = agent.calls().expect("calls");
    for (r, pid) in &ranks {
        let ar: Vec<&Value> = calls.iter().filter(|c| c["pid"] == *pid && c["op"] == "all_reduce").collect();
        let done: Vec<u64> = ar.iter().filter(|c| c["aborted"] == false).filter_map(|c| c["seq"].as_u64()).collect();
        assert_eq!(done, vec![0, 1, 2, 3], "rank {r}: each completed all-reduce once");
        let ab: Vec<u64> = ar.iter().filter(|c| c["aborted"] == true).filter_map(|c| c["seq"].as_u64()).collect();
        // Rank 3 was computing (not in a collective) when mpirun killed it.
        assert!(ab.is_empty() || (ab == [4] && *r != 3), "rank {r}: aborted calls {ab:?}");
    }
    assert!(agent.metric("stepwise_collective_aborted_calls_total", &[("library", "mpi")]) >= aborted0 + 1.0);

    // The step history: steps 0-3 once; step 4 (begun, never ended) not invented.
    std::thread::sleep(Duration::from_millis(2500));
    let steps = agent.steps().expect("steps");
    assert_eq!(ids_once(&steps), (0..4).map(|i| (i, 1)).collect::<BTreeMap<_, _>>(), "{steps:#?}");
    assert_parts_sum(&steps);
    agent.assert_healthy("after the kill");

    // The next job (same step ids, same marker socket) is attributed too, its steps apart
    // from the killed job's.
    let t2 = wall();
    let out =
        workloads::run_ok(&mut workloads::mpi_steps(ns.name(), 4, &["--steps", "5", "--bytes", "65536", "--compute-us", "20000", "--marker-socket", &sock]))
            .expect("second job");
    assert!(String::from_utf8_lossy(&out.stdout).contains("summary"));
    std::thread::sleep(Duration::from_millis(2500));
    let steps = agent.steps().expect("steps");
    let per = ids_once(&steps);
    let second: BTreeSet<u64> = steps.iter().filter(|s| s["begin"].as_f64().unwrap_or(0.0) >= t2).filter_map(|s| s["step"].as_u64()).collect();
    assert_eq!(second, (0..5).collect(), "the second job's steps, each once (agent log:\n{})", agent.proc.log_text());
    assert_eq!(per.values().sum::<usize>(), 9, "4 steps of the killed job + 5: {per:?}");
    assert!(steps.iter().all(|s| s["seconds"].as_f64().unwrap_or(1e9) < 5.0), "no step spans the two jobs: {steps:#?}");
    let (integrity, stored) = stored_steps(&agent.db);
    assert_eq!(integrity, vec!["ok"]);
    let keys: BTreeSet<(u64, i64)> = stored.iter().map(|a| (a.step, (a.begin * 1e6) as i64)).collect();
    assert_eq!((keys.len(), stored.len()), (9, 9), "store: every step once");
    agent.assert_healthy("after the second job");
}

// ---------------------------------------------------------------------------------------
// 2. The target library unloaded and loaded again — here replaced on disk in between (a
//    package upgrade), while preloaded from library_dirs.

/// `reload LIB DIR ROUNDS CALLS`: per round r: wait for DIR/next<r-1> (r > 0), dlopen LIB,
/// print "loaded r", wait for DIR/go<r>, 1-rank communicator (id to DIR/id<r>), CALLS
/// all-reduces of 1000 floats, destroy, dlclose, print "closed r".
const RELOAD_C: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
typedef struct { char internal[128]; } ncclUniqueId;
typedef int (*getid_t)(ncclUniqueId*);
typedef int (*init_t)(void**, int, ncclUniqueId, int);
typedef int (*allreduce_t)(const void*, void*, size_t, int, int, void*, void*);
typedef int (*destroy_t)(void*);
static void wait_file(const char* dir, const char* what, int round) {
  char p[4096]; snprintf(p, sizeof p, "%s/%s%d", dir, what, round);
  while (access(p, F_OK) != 0) usleep(5000);
}
static void *sym(void *h, const char *name) {
  void *f = dlsym(h, name);
  if (!f) { fprintf(stderr, "dlsym %s: %s\n", name, dlerror()); exit(2); }
  return f;
}
int main(int argc, char **argv) {
  if (argc != 5) return 2;
  setvbuf(stdout, NULL, _IOLBF, 0);
  int rounds = atoi(argv[3]), calls = atoi(argv[4]);
  for (int round = 0; round < rounds; round++) {
    if (round > 0) wait_file(argv[2], "next", round - 1);
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
    printf("loaded %d\n", round);
    wait_file(argv[2], "go", round);
    ncclUniqueId id; void *comm = NULL;
    if (((getid_t)sym(h, "ncclGetUniqueId"))(&id) != 0) return 3;
    if (((init_t)sym(h, "ncclCommInitRank"))(&comm, 1, id, 0) != 0) return 4;
    float *buf = calloc(1000, sizeof(float));
    for (int i = 0; i < calls; i++)
      if (((allreduce_t)sym(h, "ncclAllReduce"))(buf, buf, 1000, 7, 0, comm, NULL) != 0) return 5;
    if (((destroy_t)sym(h, "ncclCommDestroy"))(comm) != 0) return 6;
    free(buf);
    usleep(100000);
    if (dlclose(h) != 0) return 7;
    printf("closed %d\n", round);
  }
  return 0;
}
"#;

/// Replaces `lib` by a fresh copy of `src` (new inode, same path), as a package upgrade does.
fn replace_file(src: &Path, lib: &Path) {
    let tmp = lib.with_extension("new");
    std::fs::copy(src, &tmp).expect("copy");
    std::fs::rename(&tmp, lib).expect("rename over");
}

#[test]
fn preloaded_library_replaced_on_disk_between_loads_is_probed_once_and_from_the_first_call() {
    let build = workloads::build().expect("workloads build");
    let dir = tempdir("reload");
    let d = dir.path();
    let libdir = d.join("lib");
    std::fs::create_dir_all(&libdir).expect("mkdir");
    let lib = libdir.join("libnccl.so.2");
    std::fs::copy(build.join("libnccl.so.2"), &lib).expect("copy lib");
    std::fs::write(d.join("reload.c"), RELOAD_C).expect("write reload.c");
    workloads::run_ok(Command::new("cc").args(["-O1", "-Wall", "-Werror", "-o"]).arg(d.join("reload")).arg(d.join("reload.c")).arg("-ldl"))
        .expect("cc reload.c");
    let ns = Netns::new().expect("netns");
    let cfg = format!(
        "interval = \"100ms\"\n[sources]\nrdma = false\nethtool = false\n[collectives]\nlibrary_dirs = [\"{}\"]\n[collectives.select]\nnetns = \"/run/netns/{}\"\n",
        libdir.display(),
        ns.name()
    );
    let mut agent = FaultAgent::start(d, &spec(cfg)).expect("agent");
    wait_probes(&agent, "nccl");
    let per_attach = agent.metric("stepwise_probe_attached", &[("library", "nccl")]);
    let (rounds, calls) = (3u32, 5u64);
    let mut p = Proc::spawn(
        "reload",
        Command::new("ip")
            .args(["netns", "exec", ns.name(), "env", "NCCL_ABI_IFACE_ADDR=127.0.0.1"])
            .arg(d.join("reload"))
            .arg(&lib)
            .arg(d)
            .arg(rounds.to_string())
            .arg(calls.to_string()),
        d.join("reload.log"),
    )
    .expect("spawn");
    let pid = p.pid();
    let touch = |name: String| std::fs::write(d.join(name), b"").expect("touch");
    for round in 0..rounds {
        wait_for(Duration::from_secs(30), "loaded", || p.log_text().contains(&format!("loaded {round}")).then_some(()))
            .unwrap_or_else(|e| panic!("{e}: {}", p.log_text()));
        // Go at once: the calls start within milliseconds of the dlopen, before any rescan
        // could find the mapping. Only a preloaded (current) file sees the first call.
        touch(format!("go{round}"));
        wait_for(Duration::from_secs(30), "closed", || p.log_text().contains(&format!("closed {round}")).then_some(()))
            .unwrap_or_else(|e| panic!("{e}: {}", p.log_text()));
        if round + 1 < rounds {
            replace_file(&build.join("libnccl.so.2"), &lib);
            // The agent's rescans (every 500 ms) find the replaced file.
            std::thread::sleep(Duration::from_millis(2000));
            touch(format!("next{round}"));
        }
    }
    let st = wait_for(Duration::from_secs(15), "reload exits", || p.child.try_wait().ok().flatten()).expect("exit");
    assert!(st.success(), "{}", p.log_text());
    std::thread::sleep(Duration::from_millis(1500));
    let mine: Vec<Value> = agent.calls().expect("calls").into_iter().filter(|c| c["pid"] == pid).collect();
    let want = rounds as usize * (calls as usize + 2);
    let ops: Vec<&str> = mine.iter().map(|c| c["op"].as_str().unwrap_or("")).collect();
    assert_eq!(mine.len(), want, "every call once, from each load's first (comm_init): {ops:?}\nagent log:\n{}", agent.proc.log_text());
    let m = agent.metrics().expect("metrics");
    assert_eq!(
        metric_sum(&m, "stepwise_collective_calls_total", &[("library", "nccl"), ("op", "all_reduce")]),
        f64::from(rounds) * calls as f64,
        "no double count in /metrics"
    );
    // One entry + one return per call that kept its return; the entry alone for an
    // all-reduce the session program left alone (this asynchronous process once the agent
    // has read it): no event counted twice, none lost.
    let hits: f64 = mine.iter().map(|c| if c["ret"].is_null() { 1.0 } else { 2.0 }).sum();
    assert!(mine.iter().all(|c| !c["ret"].is_null() || c["op"] == "all_reduce"), "only asynchronous calls are left alone: {ops:?}");
    assert_eq!(metric_sum(&m, "stepwise_probe_events_total", &[]), hits, "2 events per paired call, 1 per call left alone");
    // Probes on the current file only: the replaced files' are gone with them.
    wait_for(Duration::from_secs(60), "one attachment", || (agent.metric("stepwise_probe_attached", &[("library", "nccl")]) == per_attach).then_some(()))
        .unwrap_or_else(|e| {
            panic!(
                "{e}: stepwise_probe_attached = {} (one file: {per_attach}); log:\n{}",
                agent.metric("stepwise_probe_attached", &[("library", "nccl")]),
                agent.proc.log_text()
            )
        });
    agent.assert_healthy("after the reloads");
}

// ---------------------------------------------------------------------------------------
// 3. The agent SIGKILLed and restarted mid-run on the same store.

#[test]
fn agent_killed_and_restarted_mid_run_keeps_its_store_and_counts_nothing_twice() {
    workloads::build().expect("workloads");
    let dir = tempdir("restart");
    let sys = dir.path().join("sys");
    let sc = Arc::new(Mutex::new(Scenario::new(&sys).host_dgx(2)));
    sc.lock().expect("lock").write().expect("fixture");
    let (stop, pause) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let writer = {
        let (sc, stop, pause) = (sc.clone(), stop.clone(), pause.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(10));
                if !pause.load(Ordering::Relaxed) {
                    sc.lock()
                        .expect("lock")
                        .step(Duration::from_millis(10), |n| {
                            n.tx_bytes(1_000_000).rx_bytes(500_000);
                        })
                        .expect("scenario step");
                }
            }
        })
    };
    let ns = Netns::new().expect("netns");
    // NCCL probes only: fewer uprobes make the killed agent's teardown shorter.
    let mut s = spec(
        config("50ms", &["rdma"], &ns, "").replace(", \"/usr/lib/x86_64-linux-gnu\"", "").replace("[collectives]\n", "[collectives]\nlibraries = [\"nccl\"]\n"),
    );
    s.args = vec!["--sysfs-root".into(), sys.display().to_string()];
    let agent = FaultAgent::start(dir.path(), &s).expect("agent");
    wait_probes(&agent, "nccl");
    let sock = agent.sock.clone();
    let total_steps = 200u64;
    let mut ranks = nccl_job(&ns, dir.path(), "job", 2, &sock, &["--steps", &total_steps.to_string(), "--bytes", "65536", "--compute-us", "100000"]);
    // Let some steps be attributed and stored, then kill the agent without warning.
    wait_for(Duration::from_secs(30), "steps stored by the first agent", || (agent.steps().ok()?.len() >= 3).then_some(())).expect("first steps");
    let first: Vec<Value> = agent.steps().expect("steps");
    let (cfg, db) = (agent.config.clone(), agent.db.clone());
    let mut agent = agent;
    let killed_at = wall();
    agent.proc.child.kill().expect("SIGKILL the agent");
    // Reaping takes seconds: the kernel tears the uprobes down (RCU grace periods) before
    // the process is gone; a supervisor restarts it only then.
    let _ = agent.proc.child.wait();
    let exited_at = wall();
    std::thread::sleep(Duration::from_millis(700));
    s.tag = "agent2".into();
    let mut agent = FaultAgent::start_with(dir.path(), &s, cfg, db.clone(), sock).expect("restart on the same store");
    let ready_at = wall();
    wait_ranks(&mut ranks, Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(2500));
    let second = agent.steps().expect("steps");
    eprintln!(
        "restart: SIGKILL at {killed_at:.3}, exited after {:.2} s, the new agent ready {:.2} s after the kill",
        exited_at - killed_at,
        ready_at - killed_at
    );
    assert!(second.len() >= 10, "the restarted agent attributes the rest of the job: {} steps; log:\n{}", second.len(), agent.proc.log_text());
    assert!(second.iter().all(|s| s["end"].as_f64().unwrap_or(0.0) > killed_at), "the new agent re-attributed steps that ended before it started");

    // Store: intact, every step once (job × step id: the job ran once, so one row per id).
    let (integrity, stored) = stored_steps(&db);
    assert_eq!(integrity, vec!["ok"], "PRAGMA integrity_check after SIGKILL");
    let mut per_id: BTreeMap<u64, usize> = BTreeMap::new();
    for a in &stored {
        *per_id.entry(a.step).or_default() += 1;
    }
    let twice: Vec<(&u64, &usize)> = per_id.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "steps stored twice: {twice:?}");
    let before: BTreeSet<u64> = first.iter().filter_map(|s| s["step"].as_u64()).collect();
    let after: BTreeSet<u64> = second.iter().filter_map(|s| s["step"].as_u64()).collect();
    assert!(before.is_disjoint(&after), "no step attributed by both agents: {:?}", before.intersection(&after).collect::<Vec<_>>());
    let ids: BTreeSet<u64> = per_id.keys().copied().collect();
    assert!(before.is_subset(&ids) && after.is_subset(&ids), "both agents' steps are stored");
    // Missing: only the steps in flight or in their grace period at the kill and those that
    // ran while no agent listened (their markers went nowhere): one gap, no holes elsewhere.
    let (lo, hi) = (ids.iter().take_while(|i| ids.contains(&(**i + 1))).count() as u64, ids.iter().next_back().copied().unwrap_or(0));
    let gap_from = lo + 1;
    let gap_to = (gap_from..=hi).find(|i| ids.contains(i)).unwrap_or(hi);
    assert!(ids.iter().all(|i| *i < gap_from || *i >= gap_to) && hi == total_steps - 1 && ids.contains(&0), "one gap: {ids:?}");
    let dark = ready_at - killed_at + 1.5; // the dying agent, the new one starting, one grace period
    assert!(((gap_to - gap_from) as f64) <= dark / 0.1 + 3.0, "{} steps missing for {dark:.1} s without an agent: {ids:?}", gap_to - gap_from);
    let m = agent.metrics().expect("metrics");
    assert_eq!(metric_sum(&m, "stepwise_steps_total", &[]), second.len() as f64, "the new agent counts only its own steps");

    // NIC counters: the restarted agent exports the fixture's absolute values, not old + new.
    pause.store(true, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(1000));
    let m = agent.metrics().expect("metrics");
    let sc_now = sc.lock().expect("lock");
    for (i, nic) in sc_now.nics().iter().enumerate() {
        let dev = format!("mlx5_{i}");
        let exported = metric_sum(&m, "stepwise_nic_transmit_bytes_total", &[("device", &dev)]);
        assert_eq!(exported, (nic.pma_value("port_xmit_data") * 4) as f64, "{dev}: exported transmit bytes = the counter's absolute value");
        let rx = metric_sum(&m, "stepwise_nic_receive_bytes_total", &[("device", &dev)]);
        assert_eq!(rx, (nic.pma_value("port_rcv_data") * 4) as f64, "{dev}: receive bytes");
    }
    drop(sc_now);
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("writer");
    agent.assert_healthy("after the restart");
}

// ---------------------------------------------------------------------------------------
// 4. NIC counter reset, 32-bit wrap and saturation inside steps.

#[test]
fn counter_reset_wrap_and_saturation_inside_steps_never_invent_or_lose_bytes() {
    let dir = tempdir("counters");
    let sys = dir.path().join("sys");
    let mut sc = Scenario::new(&sys).host_dgx(2);
    const MAX32: u64 = u32::MAX as u64;
    // mlx5_0: Ext table (64-bit data), mlx5 Q counters well below their 2^32 wrap.
    // mlx5_1: the 32-bit table, 2.5 MB below saturation of port_xmit_data, and its
    // out_of_buffer Q counter 500 below the wrap.
    for (c, v) in
        [("out_of_buffer", 1_000), ("local_ack_timeout_err", 131), ("duplicate_request", 41), ("out_of_sequence", 12), ("rx_write_requests", 175_528_982)]
    {
        sc.nic_mut(0).set_hw(c, v);
    }
    sc.nic_mut(1).table = PmaTable::Bits32;
    sc.nic_mut(1).set_pma("port_xmit_data", MAX32 - 625_000);
    sc.nic_mut(1).set_hw("out_of_buffer", MAX32 + 1 - 500);
    sc.write().expect("fixture");
    let init0 = sc.nics()[0].pma_value("port_xmit_data") * 4;
    let init1 = sc.nics()[1].pma_value("port_xmit_data") * 4;
    let ns = Netns::new().expect("netns");
    let mut s = spec(config("20ms", &["rdma"], &ns, ""));
    s.args = vec!["--sysfs-root".into(), sys.display().to_string()];
    let mut agent = FaultAgent::start(dir.path(), &s).expect("agent");
    let marks = Marks::new(&agent.sock).expect("marker socket");

    // Watch the exported counters the whole time: they must never decrease.
    let stop = Arc::new(AtomicBool::new(false));
    let series = [
        ("stepwise_nic_transmit_bytes_total", "mlx5_0"),
        ("stepwise_nic_transmit_bytes_total", "mlx5_1"),
        ("stepwise_nic_out_of_buffer_drops_total", "mlx5_1"),
    ];
    let watcher = {
        let (stop, addr) = (stop.clone(), agent.addr.clone());
        std::thread::spawn(move || {
            let mut last = [f64::NEG_INFINITY; 3];
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                if let Ok(r) = stepwise_tests::harness::http_get(&addr, "/metrics") {
                    for (i, (name, dev)) in series.iter().enumerate() {
                        let v = metric_sum(&r.body, name, &[("device", dev)]);
                        assert!(v >= last[i], "{name}{{device={dev}}} went down: {} -> {v}", last[i]);
                        last[i] = v;
                    }
                    n += 1;
                }
                std::thread::sleep(Duration::from_millis(15));
            }
            n
        })
    };
    let resets = |a: &FaultAgent| a.metric("stepwise_errors_total", &[("source", "rdma"), ("kind", "counter_reset")]);
    let tick = Duration::from_millis(10);
    let mut sent = [0u64; 2];
    let mut per_step: Vec<[u64; 2]> = Vec::new();
    let traffic = |sc: &mut Scenario, ticks: u32, nics: [bool; 2], oob: u64, sent: &mut [u64; 2], step_sent: &mut [u64; 2]| {
        for _ in 0..ticks {
            std::thread::sleep(tick);
            sc.step(tick, |n| {
                if nics[n.index] {
                    n.tx_bytes(1_000_000);
                }
                if n.index == 1 && oob > 0 {
                    n.out_of_buffer(oob);
                }
            })
            .expect("step");
            for i in 0..2 {
                if nics[i] {
                    sent[i] += 1_000_000;
                    step_sent[i] += 1_000_000;
                }
            }
        }
    };
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(resets(&agent), 0.0, "no reset yet");

    // Step 0: traffic on mlx5_0, a quiet moment, a reset of every counter, traffic again.
    let mut st = [0u64; 2];
    marks.send(0, 0, "begin");
    traffic(&mut sc, 15, [true, false], 0, &mut sent, &mut st);
    traffic(&mut sc, 10, [false, false], 0, &mut sent, &mut st);
    std::thread::sleep(Duration::from_millis(300));
    // The event counters of mlx5_0 before its reset: cleared to 0 by it, they must not jump
    // by 2^32 (a 32-bit "wrap" of a reset counter).
    let events = [
        "stepwise_rdma_hw_stat_total",
        "stepwise_rdma_hw_stat_packets_total",
        "stepwise_nic_retransmit_events_total",
        "stepwise_nic_out_of_sequence_packets_total",
        "stepwise_nic_out_of_buffer_drops_total",
    ];
    let before_reset = agent.metrics().expect("metrics");
    sc.nic_mut(0).reset();
    sc.write().expect("reset");
    traffic(&mut sc, 15, [true, false], 0, &mut sent, &mut st);
    marks.send(0, 0, "end");
    std::thread::sleep(Duration::from_millis(300));
    let after_reset = agent.metrics().expect("metrics");
    let mut compared = 0;
    for fam in events {
        let (b, a) = (stepwise_tests::harness::samples(&before_reset, fam), stepwise_tests::harness::samples(&after_reset, fam));
        compared += b.iter().filter(|(l, _)| l.contains("device=\"mlx5_0\"")).count();
        for (labels, v) in b.iter().filter(|(l, _)| l.contains("device=\"mlx5_0\"")) {
            let now = a.iter().find(|(l, _)| l == labels).map(|x| x.1).unwrap_or(f64::NAN);
            assert_eq!(now, *v, "{fam}{{{labels}}} across the port reset (no new events)");
        }
    }
    assert!(compared >= 5, "event counters of mlx5_0 compared: {compared}");
    per_step.push(st);
    // Step 1: out_of_buffer wraps at 2^32 on mlx5_0; mlx5_1 saturates at 2^32-1 words.
    let mut st = [0u64; 2];
    marks.send(0, 1, "begin");
    traffic(&mut sc, 20, [false, true], 50, &mut sent, &mut st);
    marks.send(0, 1, "end");
    per_step.push(st);
    // Step 2: mlx5_1 quiet, reset (clears the saturated counter), traffic.
    let mut st = [0u64; 2];
    marks.send(0, 2, "begin");
    traffic(&mut sc, 10, [false, false], 0, &mut sent, &mut st);
    sc.nic_mut(1).reset();
    sc.write().expect("reset");
    let after_reset1 = {
        let mut st2 = [0u64; 2];
        traffic(&mut sc, 15, [false, true], 0, &mut sent, &mut st2);
        st[1] += st2[1];
        st2[1]
    };
    marks.send(0, 2, "end");
    per_step.push(st);
    traffic(&mut sc, 10, [false, false], 0, &mut sent, &mut [0; 2]);
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    let polls = watcher.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
    assert!(polls > 20, "watched {polls} scrapes");

    let m = agent.metrics().expect("metrics");
    let tx = |dev: &str| metric_sum(&m, "stepwise_nic_transmit_bytes_total", &[("device", dev)]);
    // mlx5_0: every byte, across the reset (quiet before it, so nothing fell between samples).
    assert_eq!(tx("mlx5_0"), (init0 + sent[0]) as f64, "mlx5_0 = initial + sent");
    // mlx5_1: what the counter could show — up to saturation — plus what it counted since
    // the reset; never the bytes it could not see.
    let visible1 = MAX32 * 4 + after_reset1;
    assert_eq!(tx("mlx5_1"), visible1 as f64, "mlx5_1 = saturation + after the reset");
    assert!(tx("mlx5_1") <= (init1 + sent[1]) as f64, "never more than was sent");
    // Wrapped once at 2^32 in step 1, cleared (not wrapped again) by the reset in step 2.
    assert_eq!(
        metric_sum(&m, "stepwise_nic_out_of_buffer_drops_total", &[("device", "mlx5_1")]),
        (MAX32 + 1 - 500 + 20 * 50) as f64,
        "the 32-bit wrap is one wrap; the reset adds nothing"
    );
    let r = resets(&agent);
    assert!(r >= 3.0, "counter_reset counted for the two resets and the saturation: {r}");

    // Steps: three, with windows that are never negative nor invented.
    let steps = agent.steps().expect("steps");
    assert_eq!(ids_once(&steps), (0..3).map(|i| (i, 1)).collect::<BTreeMap<_, _>>(), "{steps:#?}");
    let st = Store::open(&agent.db).expect("store");
    let name_of =
        |i: usize| std::fs::read_to_string(sys.join(format!("class/infiniband/mlx5_{i}/ports/1/gid_attrs/ndevs/0"))).expect("ndev").trim().to_string();
    for (k, truth) in per_step.iter().enumerate() {
        let ws = st.windows_of("markers", k as u64).expect("windows");
        for w in &ws {
            for (f, v) in
                [("tx", w.tx_bytes), ("rx", w.rx_bytes), ("pause", w.pause_seconds), ("ecn", w.ecn_marked), ("wait", w.xmit_wait_ticks), ("drops", w.drops)]
            {
                assert!(v.is_finite() && v >= 0.0, "step {k} {}: {f} = {v}", w.nic.name);
            }
        }
        for (i, t) in truth.iter().enumerate() {
            let w = ws.iter().find(|w| w.nic.name == name_of(i)).unwrap_or_else(|| panic!("step {k}: no window for mlx5_{i}: {ws:?}"));
            // Interpolation at the step's edges may move one writer tick and one sample.
            assert!(w.tx_bytes <= *t as f64 + 2_000_000.0, "step {k} mlx5_{i}: window {} B > sent {t} B", w.tx_bytes);
            if i == 0 || k == 2 {
                assert!(w.tx_bytes >= *t as f64 - 3_000_000.0, "step {k} mlx5_{i}: window {} B, sent {t} B", w.tx_bytes);
            }
        }
    }
    agent.assert_healthy("after the counter faults");
}

// ---------------------------------------------------------------------------------------
// 5. A veth deleted and re-created while sampled, during steps.

#[test]
fn veth_deleted_and_recreated_during_steps_keeps_attributing_them() {
    workloads::build().expect("workloads");
    let dir = tempdir("veth");
    let a = Netns::new().expect("netns a");
    let b = Netns::new().expect("netns b");
    let v = Veth::new(&a, "swa0", &b, "swb0").expect("veth");
    let mut s = spec(config("50ms", &["netdev", "qdisc"], &a, ""));
    s.netns = Some(a.name().to_string());
    let mut agent = FaultAgent::start(dir.path(), &s).expect("agent in namespace a");
    wait_probes(&agent, "nccl");
    let steps_n = 40u64;
    let mut ranks = nccl_job(&a, dir.path(), "job", 2, &agent.sock, &["--steps", &steps_n.to_string(), "--bytes", "65536", "--compute-us", "100000"]);
    // UDP over the veth the whole time (errors while it is gone are expected).
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let (stop, ns, dst) = (stop.clone(), a.name().to_string(), v.b_addr);
        std::thread::spawn(move || {
            in_netns(&ns, || {
                let u = UdpSocket::bind("0.0.0.0:0").expect("udp");
                while !stop.load(Ordering::Relaxed) {
                    let _ = u.send_to(&[7u8; 1000], (dst, 9));
                    std::thread::sleep(Duration::from_micros(500));
                }
            })
            .expect("sender");
        })
    };
    let watcher = {
        let (stop, ns, addr) = (stop.clone(), a.name().to_string(), agent.addr.clone());
        std::thread::spawn(move || {
            in_netns(&ns, || {
                let (mut last, mut n) = (0.0f64, 0);
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(r) = stepwise_tests::harness::http_get(&addr, "/metrics") {
                        let tx = metric_sum(&r.body, "stepwise_netdev_transmit_bytes_total", &[("netdev", "swa0")]);
                        assert!(tx >= last, "swa0 transmit bytes went down: {last} -> {tx}");
                        last = tx;
                        n += 1;
                    }
                    std::thread::sleep(Duration::from_millis(40));
                }
                (last, n)
            })
            .expect("watcher")
        })
    };
    std::thread::sleep(Duration::from_millis(800));
    for round in 0..3 {
        v.delete(&a).expect("delete the veth");
        if round != 1 {
            std::thread::sleep(Duration::from_millis(300)); // seen gone for a few sweeps…
        } // …or replaced between two sweeps
        v.create(&a, &b).expect("re-create the veth");
        std::thread::sleep(Duration::from_millis(900));
    }
    wait_ranks(&mut ranks, Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(2500));
    stop.store(true, Ordering::Relaxed);
    sender.join().expect("sender");
    let (last_tx, polls) = watcher.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
    assert!(polls > 20, "{polls} scrapes");

    let steps = agent.steps().expect("steps");
    assert_eq!(ids_once(&steps), (0..steps_n).map(|i| (i, 1)).collect::<BTreeMap<_, _>>(), "every step attributed once");
    assert_parts_sum(&steps);
    let st = Store::open(&agent.db).expect("store");
    let mut with_veth = 0;
    let mut veth_total = 0.0;
    for k in 0..steps_n {
        let ws = st.windows_of("markers", k).expect("windows");
        for w in &ws {
            for (f, x) in [("tx", w.tx_bytes), ("rx", w.rx_bytes), ("drops", w.drops), ("backlog", w.max_backlog_bytes), ("retransmits", w.retransmits)] {
                assert!(x.is_finite() && x >= 0.0, "step {k} {}: {f} = {x}", w.nic.name);
            }
        }
        if let Some(w) = ws.iter().find(|w| w.nic.name == "swa0") {
            with_veth += 1;
            veth_total += w.tx_bytes;
        }
    }
    assert!(with_veth as u64 >= steps_n - 2, "steps with a swa0 window: {with_veth}");
    assert!(veth_total <= last_tx + 1.0, "windows sum to no more than the counter: {veth_total} > {last_tx}");
    let vanished = agent.metric("stepwise_errors_total", &[("source", "netdev"), ("kind", "vanished")]);
    assert!(vanished >= 3.0, "each deletion counted: {vanished}");
    agent.assert_healthy("after the veth faults");
}

// ---------------------------------------------------------------------------------------
// 6. RingBuf overflow under an event storm.

#[test]
fn event_storm_overflows_the_ring_drops_are_counted_steps_marked_and_the_process_not_slowed() {
    workloads::build().expect("workloads");
    let dir = tempdir("storm");
    // The storm calls its own copy of the library: no other agent (parallel tests preload
    // tests/workloads/build) has probes on it, so "without the agent" means no probes at all.
    let (storm, storm_lib) = build_storm(dir.path()).expect("storm program");
    let ns = Netns::new().expect("netns");
    // Without the agent: the loop's own cost (per ncclGroupStart + ncclGroupEnd pair).
    let bare = run_storm(&storm, Some(ns.name()), 2, 1.5, None).expect("storm without agent");
    let cfg = config("50ms", &[], &ns, "[steps]\ngrace = \"500ms\"\n").replace("library_dirs = [", &format!("library_dirs = [\"{}\", ", storm_lib.display()));
    let mut agent = FaultAgent::start(dir.path(), &spec(cfg)).expect("agent");
    wait_probes(&agent, "nccl");
    // Probed but paced (bursts of 500 pairs = 2000 events, 450 KB of the 1 MiB ring, 10 ms
    // apart): the probe cost without overflow.
    let paced = run_storm(&storm, Some(ns.name()), 1, 1.5, Some((500, 10_000))).expect("paced storm");
    let drops_paced = agent.metric("stepwise_probe_drops_total", &[]);
    std::thread::sleep(Duration::from_millis(1500));

    // A job with markers; the storm (4 threads, no pause) runs across its middle steps.
    let mut ranks = nccl_job(&ns, dir.path(), "job", 2, &agent.sock, &["--steps", "100", "--bytes", "4096", "--compute-us", "100000"]);
    wait_for(Duration::from_secs(30), "steps before the storm", || (agent.steps().ok()?.len() >= 22).then_some(())).expect("steps");
    // While it floods, the drop counter is read every 20 ms: drops first counted between
    // reads at T1 and T2 were drained (and dated by the agent) inside (T1, T2], so a step
    // spanning both reads overlaps the agent's drop span. The storm need not overflow the
    // ring all along (the probe thread may catch up for a while); a step during which no
    // drop was counted may rightly be complete.
    let flooding = std::sync::atomic::AtomicBool::new(true);
    let (t0, out, t1, reads) = std::thread::scope(|sc| {
        let reader = sc.spawn(|| {
            let mut reads = Vec::new();
            while flooding.load(std::sync::atomic::Ordering::Relaxed) {
                reads.push((wall(), agent.metric("stepwise_probe_drops_total", &[])));
                std::thread::sleep(Duration::from_millis(20));
            }
            reads
        });
        let t0 = wall();
        let out = storm_cmd(&storm, Some(ns.name()), 4, 2.0, None).output().expect("storm");
        let t1 = wall();
        flooding.store(false, std::sync::atomic::Ordering::Relaxed);
        (t0, out, t1, reader.join().expect("drop reader"))
    });
    let rising: Vec<(f64, f64)> = reads.windows(2).filter(|w| w[1].1 > w[0].1).map(|w| (w[0].0, w[1].0)).collect();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let flood = StormResult::parse(&String::from_utf8_lossy(&out.stdout)).expect("result");
    wait_ranks(&mut ranks, Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(2000));

    let m = agent.metrics().expect("metrics");
    let drops = metric_sum(&m, "stepwise_probe_drops_total", &[]);
    let events = metric_sum(&m, "stepwise_probe_events_total", &[]);
    eprintln!(
        "storm: without agent {:.0} ns/pair ({} pairs, 2 threads); probed, paced {:.0} ns/pair (drops {drops_paced}); probed, flooding {:.0} ns/pair ({} pairs in {:.1} s, 4 threads); events {events}, drops {drops}",
        bare.ns_per_pair(),
        bare.pairs,
        paced.ns_per_pair(),
        flood.ns_per_pair(),
        flood.pairs,
        flood.wall_ns as f64 * 1e-9
    );
    assert!(drops > 0.0, "the storm overflowed the ring: drops {drops}, events {events}");
    // Not slowed beyond the probe cost: a full ring drops events, it never makes the traced
    // thread wait. The per-call CPU cost while flooding stays within the paced probed cost
    // (same probes, no overflow) plus the noise of four threads on two cores.
    let probe_cost = paced.ns_per_pair() - bare.ns_per_pair();
    assert!(
        flood.ns_per_pair() <= 1.5 * paced.ns_per_pair() + 1000.0,
        "flooding {:.0} ns/pair vs paced {:.0} ns/pair (probe cost {probe_cost:.0} ns)",
        flood.ns_per_pair(),
        paced.ns_per_pair()
    );

    let steps = agent.steps().expect("steps");
    let (mut before, mut after, mut during) = (0, 0, 0);
    for s in &steps {
        let (b, e) = (s["begin"].as_f64().unwrap_or(0.0), s["end"].as_f64().unwrap_or(0.0));
        if e < t0 - 1.5 {
            before += 1;
            assert_eq!(s["incomplete"], false, "step {} ended before the storm: {s}", s["step"]);
        } else if b > t1 + 1.5 {
            after += 1;
            assert_eq!(s["incomplete"], false, "step {} began after the storm [{t0:.3}, {t1:.3}]: {s}", s["step"]);
        } else if rising.iter().any(|&(r0, r1)| b <= r0 && e >= r1) {
            during += 1;
            assert_eq!(s["incomplete"], true, "step {} spans reads that counted new drops {rising:?}: {s}", s["step"]);
            assert!(s["notes"].as_array().is_some_and(|n| n.iter().any(|x| x.as_str().is_some_and(|t| t.contains("incomplete data")))), "{s}");
        }
    }
    eprintln!("drop counter rose between {} of {} reads; steps before {before}, with counted drops {during}, after {after}", rising.len(), reads.len());
    assert!(before >= 5 && after >= 10 && during >= 1, "steps before the storm {before}, with counted drops {during}, after {after}");
    // `agent diagnose` says so.
    let id = steps.iter().find(|s| s["incomplete"] == true).and_then(|s| s["step"].as_u64()).expect("an incomplete step");
    let out = Command::new(agent_bin()).args(["diagnose", "--agent", &agent.addr, "--step", &id.to_string()]).output().expect("diagnose");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.to_lowercase().contains("incomplete data"), "diagnose shows the step's incomplete data:\n{text}");
    // Cluster mode attributes the steps itself from the agent's calls: it reads the spans of
    // dropped events from /api/v1/collectives and marks the same steps, with the same note.
    let out = Command::new(agent_bin()).args(["diagnose", "--peers", &agent.addr, "--json", "--since", "5m", "--slowest", "1000"]).output().expect("diagnose");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let rep: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("diagnose --json: {e}: {text}"));
    let dropped =
        |s: &serde_json::Value| s["notes"].as_array().is_some_and(|n| n.iter().any(|x| x.as_str().is_some_and(|t| t.contains("probe events were dropped"))));
    let (mut compared, mut marked) = (0, 0);
    for c in rep["steps"].as_array().expect("steps") {
        let Some(d) = steps.iter().find(|d| d["step"] == c["step"] && d["begin"].as_f64().zip(c["begin"].as_f64()).is_some_and(|(a, b)| (a - b).abs() < 1e-3))
        else {
            continue;
        };
        compared += 1;
        marked += dropped(d) as usize;
        assert_eq!(dropped(c), dropped(d), "step {}: cluster {c}\ndaemon {d}", d["step"]);
        assert!(!dropped(c) || c["incomplete"] == true, "step {}: {c}", c["step"]);
    }
    assert!(compared >= 30 && marked >= 10, "steps compared with the daemon's {compared}, marked dropped {marked}");
    agent.assert_healthy("after the storm");
}

// ---------------------------------------------------------------------------------------
// 7. Malformed config at start, and reload on SIGHUP.

#[test]
fn malformed_config_at_start_is_exit_2_naming_the_file_and_line() {
    let dir = tempdir("badcfg");
    let cfg = dir.path().join("bad.toml");
    for (text, what) in [
        ("interval = \"1s\"\n[sources\nrdma = true\n", "line 2"),
        ("interval = \"1ms\"\n", "at least 10ms"),
        ("[sources]\nrdma = \"yes\"\n", "line 2"),
        ("no_such_key = 1\n", "no_such_key"),
    ] {
        std::fs::write(&cfg, text).expect("write");
        let out =
            Command::new(agent_bin()).args(["run", "--listen", "127.0.0.1:0", "--config"]).arg(&cfg).env_remove("STEPWISE_LOG").output().expect("run agent");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text:?}: {err}");
        assert!(err.contains(&*cfg.to_string_lossy()) || what == "at least 10ms", "{text:?}: names the file: {err}");
        assert!(err.contains(what), "{text:?}: says {what:?}: {err}");
    }
}

#[test]
fn sighup_reloads_log_and_slow_step_threshold_and_keeps_the_running_config_on_errors() {
    let dir = tempdir("reload");
    let ns = Netns::new().expect("netns");
    let base = |log: &str, interval: &str, slow: &str| {
        format!("log = \"{log}\"\n{}", config(interval, &[], &ns, &format!("[steps]\nslow_step = \"{slow}\"\ngrace = \"300ms\"\n")))
    };
    let mut s = spec(base("warn", "100ms", "10s"));
    s.log_env = None; // the file's log filter, so a reload can change it
    let mut agent = FaultAgent::start(dir.path(), &s).expect("agent");
    let marks = Marks::new(&agent.sock).expect("socket");
    let slow = |a: &FaultAgent| a.metric("stepwise_slow_steps_total", &[]);
    let steps = |a: &FaultAgent| a.metric("stepwise_steps_total", &[]);
    let mut next = 0u64;
    let mut run_steps = |a: &FaultAgent, n: u64| {
        let s0 = steps(a);
        for _ in 0..n {
            marks.step(1, next, Duration::from_millis(120));
            next += 1;
        }
        wait_for(Duration::from_secs(10), "steps attributed", || (steps(a) >= s0 + n as f64).then_some(()))
            .unwrap_or_else(|e| panic!("{e}: {}", a.proc.log_text()));
    };
    run_steps(&agent, 3);
    assert_eq!(slow(&agent), 0.0, "120 ms steps under a 10 s threshold");
    assert!(!agent.proc.log_text().contains("serving /metrics"), "log = warn: no info lines");

    // A valid change of what applies live: the threshold and the log filter.
    std::fs::write(&agent.config, base("info", "100ms", "50ms")).expect("rewrite config");
    agent.hup();
    wait_for(Duration::from_secs(10), "reload applied", || (agent.metric("stepwise_config_reloads_total", &[]) == 1.0).then_some(()))
        .unwrap_or_else(|e| panic!("{e}: {}", agent.proc.log_text()));
    run_steps(&agent, 3);
    assert_eq!(slow(&agent), 3.0, "the new 50 ms threshold applies");
    let log = agent.proc.log_text();
    assert!(log.contains("configuration reloaded (log, [steps] and [hang] applied)"), "the info-level reload line shows, so the new filter is live:\n{log}");
    // A key that needs a restart: named, not applied.
    std::fs::write(&agent.config, base("info", "200ms", "50ms")).expect("rewrite config");
    agent.hup();
    wait_for(Duration::from_secs(10), "reload applied", || (agent.metric("stepwise_config_reloads_total", &[]) == 2.0).then_some(()))
        .unwrap_or_else(|e| panic!("{e}: {}", agent.proc.log_text()));
    let log = agent.proc.log_text();
    assert!(log.lines().any(|l| l.contains("need a restart") && l.contains("interval")), "the restart-only key is named:\n{log}");
    assert_eq!(agent.json("/api/v1/status").expect("status")["interval_seconds"], 0.1, "interval stays until a restart");

    // Broken files: refused, counted, the running configuration stays.
    for bad in ["log = \"info\"\n[steps\nslow_step = \"1h\"\n".to_string(), base("info", "1ms", "1h"), base("info", "100ms", "soon")] {
        let e0 = agent.metric("stepwise_config_reload_errors_total", &[]);
        std::fs::write(&agent.config, &bad).expect("write bad config");
        agent.hup();
        wait_for(Duration::from_secs(10), "reload refused", || (agent.metric("stepwise_config_reload_errors_total", &[]) == e0 + 1.0).then_some(()))
            .unwrap_or_else(|e| panic!("{e}: {bad:?}: {}", agent.proc.log_text()));
    }
    assert!(agent.proc.log_text().contains("config reload failed"), "{}", agent.proc.log_text());
    run_steps(&agent, 2);
    assert_eq!(slow(&agent), 5.0, "still the 50 ms threshold");
    assert_eq!(agent.metric("stepwise_config_reloads_total", &[]), 2.0);
    agent.assert_healthy("after the reloads");
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", p.display());
}

#[test]
fn a_fifo_in_place_of_a_counter_or_the_config_stalls_no_sweep_no_reload_and_not_sigterm() {
    let dir = tempdir("fifo");
    let sys = dir.path().join("sys");
    let mut sc = Scenario::new(&sys).host_dgx(2);
    sc.write().expect("fixture");
    // The issue's attack: a blocking open of this froze the sweep (and SIGTERM) for good.
    let fifo = sys.join("class/infiniband/mlx5_1/ports/1/counters/port_rcv_data");
    std::fs::remove_file(&fifo).expect("rm counter");
    mkfifo(&fifo);
    // No probes: detaching uprobes alone takes 2-3 s of a debug build's exit, which is not
    // what this bounds.
    let mut s = spec("interval = \"50ms\"\n[sources]\nethtool = false\nnetdev = false\nqdisc = false\ntcp = false\n[collectives]\nenabled = false\n".into());
    s.args = vec!["--sysfs-root".into(), sys.display().to_string()];
    // Ready means a first sweep finished: it would never have.
    let mut agent = FaultAgent::start(dir.path(), &s).expect("agent");
    agent.assert_healthy("with a FIFO in the tree");
    let tx = |a: &FaultAgent, dev: &str| a.metric("stepwise_nic_transmit_bytes_total", &[("device", dev)]);
    let before = (tx(&agent, "mlx5_0"), tx(&agent, "mlx5_1"));
    for i in 0..2 {
        let v = sc.nics()[i].pma_value("port_xmit_data") + 1000;
        sc.nic_mut(i).set_pma("port_xmit_data", v);
    }
    sc.write().expect("fixture");
    assert!(fifo.exists() && !fifo.is_file(), "the writer left the FIFO in place");
    wait_for(Duration::from_secs(10), "both devices swept on", || {
        (tx(&agent, "mlx5_0") >= before.0 + 4000.0 && tx(&agent, "mlx5_1") >= before.1 + 4000.0).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}: {}", agent.proc.log_text()));
    assert!(agent.metric("stepwise_errors_total", &[("source", "rdma"), ("kind", "read")]) > 0.0, "the FIFO is a counted failed read");

    // A FIFO at the config path: the reload is refused at once, the server keeps answering.
    std::fs::remove_file(&agent.config).expect("rm config");
    mkfifo(&agent.config);
    agent.hup();
    wait_for(Duration::from_secs(10), "reload refused", || (agent.metric("stepwise_config_reload_errors_total", &[]) == 1.0).then_some(()))
        .unwrap_or_else(|e| panic!("{e}: {}", agent.proc.log_text()));
    let t0 = Instant::now();
    assert_eq!(agent.get("/metrics").expect("metrics").status, 200);
    assert!(t0.elapsed() < Duration::from_secs(2), "/metrics took {:?}", t0.elapsed());
    agent.assert_healthy("after the FIFO reload");

    let t0 = Instant::now();
    let code = agent.proc.terminate(Duration::from_secs(5));
    assert_eq!(code, Some(0), "SIGTERM must end the agent within 5 s (took {:?}):\n{}", t0.elapsed(), agent.proc.log_text());
}

#[test]
fn a_bogus_counter_reading_is_a_counted_glitch_and_the_series_goes_on() {
    let dir = tempdir("glitch");
    let sys = dir.path().join("sys");
    let mut sc = Scenario::new(&sys).host_dgx(1);
    sc.write().expect("fixture");
    let mut s = spec("interval = \"50ms\"\n[sources]\nethtool = false\nnetdev = false\nqdisc = false\ntcp = false\n[collectives]\nenabled = false\n".into());
    s.args = vec!["--sysfs-root".into(), sys.display().to_string()];
    let agent = FaultAgent::start(dir.path(), &s).expect("agent");
    let tx = |a: &FaultAgent| a.metric("stepwise_nic_transmit_bytes_total", &[("device", "mlx5_0")]);
    let glitches = |a: &FaultAgent| a.metric("stepwise_errors_total", &[("source", "rdma"), ("kind", "counter_glitch")]);
    let start = tx(&agent);
    // The issue's sequence: 2^64 − 11 words, then 1000, then 2000.
    sc.nic_mut(0).set_pma("port_xmit_data", 18_446_744_073_709_551_605);
    sc.write().expect("fixture");
    wait_for(Duration::from_secs(10), "glitch counted", || (glitches(&agent) >= 1.0).then_some(()))
        .unwrap_or_else(|e| panic!("{e}: {}", agent.proc.log_text()));
    assert_eq!(tx(&agent), start, "nothing added for the bogus reading");
    for v in [1000u64, 2000] {
        sc.nic_mut(0).set_pma("port_xmit_data", v);
        sc.write().expect("fixture");
        std::thread::sleep(Duration::from_millis(300));
    }
    let end = tx(&agent);
    // From the last good reading: either on from it or a reset to 1000; never ~7e19.
    assert!(end > start && end <= start + 8000.0, "start {start}, end {end}");
    assert_eq!(glitches(&agent), 1.0);
}

// ---------------------------------------------------------------------------------------
// 8. Slow and oversized requests and many concurrent scrapes.

/// Resident memory bound asserted for the agent under HTTP abuse (VmHWM).
const HTTP_ABUSE_HWM_MIB: u64 = 64;

#[test]
fn slowloris_oversized_requests_and_200_concurrent_scrapes_cost_bounded_memory_and_never_stop_sampling() {
    let dir = tempdir("http");
    let ns = Netns::new().expect("netns");
    let mut agent = FaultAgent::start(dir.path(), &spec(config("50ms", &["netdev", "qdisc"], &ns, ""))).expect("agent");
    // The baseline once the preloaded probes (one descriptor per link) are attached.
    wait_probes(&agent, "nccl");
    wait_probes(&agent, "mpi");
    std::thread::sleep(Duration::from_millis(500));
    let base = agent.stats();
    let sweeps0 = agent.sweeps().expect("sweeps");
    let t0 = Instant::now();

    // 150 slowloris connections, one header byte per second each.
    let slow: Vec<TcpStream> = (0..150).map(|_| TcpStream::connect(&agent.addr).expect("connect")).collect();
    let head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let drip = {
        let stop = Arc::new(AtomicBool::new(false));
        let closed = Arc::new(AtomicU64::new(0));
        let (s2, c2) = (stop.clone(), closed.clone());
        let h = std::thread::spawn(move || {
            let mut alive: Vec<Option<TcpStream>> = slow.into_iter().map(Some).collect();
            for i in 0..head.len() {
                if s2.load(Ordering::Relaxed) {
                    break;
                }
                for s in alive.iter_mut() {
                    if let Some(t) = s {
                        if t.write_all(&head[i..i + 1]).is_err() {
                            *s = None;
                            c2.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                std::thread::sleep(Duration::from_secs(1));
            }
            alive
        });
        (h, stop, closed)
    };

    // 200 concurrent scrapes, 3 each, while the slow connections are held.
    let ok = Arc::new(AtomicU64::new(0));
    let scrapers: Vec<_> = (0..200)
        .map(|_| {
            let (addr, ok) = (agent.addr.clone(), ok.clone());
            std::thread::spawn(move || {
                for _ in 0..3 {
                    if stepwise_tests::harness::http_get(&addr, "/metrics").is_ok_and(|r| r.status == 200 && r.body.contains("stepwise_build_info")) {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for s in scrapers {
        s.join().expect("scraper");
    }
    assert_eq!(ok.load(Ordering::Relaxed), 600, "every scrape answered while 150 slow clients are connected");

    // An oversized request head (1 MiB query) and an oversized body.
    let mut big = TcpStream::connect(&agent.addr).expect("connect");
    big.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let q = "a".repeat(1 << 20);
    let _ = write!(big, "GET /api/v1/steps?x={q} HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut resp = String::new();
    let _ = big.read_to_string(&mut resp);
    assert!(resp.is_empty() || resp.starts_with("HTTP/1.1 431") || resp.starts_with("HTTP/1.1 400"), "oversized head: {}", resp.lines().next().unwrap_or(""));
    // Refused with 413 (403 when markers over TCP are off), or the connection reset while
    // the client is still sending what the server will not read.
    if let Ok(r) = stepwise_tests::harness::http_request(&agent.addr, "POST", "/api/v1/markers", Some(&"x".repeat(1 << 20))) {
        assert!([403, 413].contains(&r.status), "oversized body refused: {}", r.status);
    }
    // A body sent one byte per second is cut off by the request timeout (or refused first).
    let mut sb = TcpStream::connect(&agent.addr).expect("connect");
    sb.set_read_timeout(Some(Duration::from_secs(1))).expect("timeout");
    let _ = write!(sb, "POST /api/v1/markers HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n");
    let t_body = Instant::now();
    let mut got = Vec::new();
    while t_body.elapsed() < Duration::from_secs(20) {
        let _ = sb.write_all(b"{");
        let mut buf = [0u8; 512];
        match sb.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                break;
            }
            Err(_) => {}
        }
    }
    assert!(t_body.elapsed() < Duration::from_secs(14), "a slow body holds the server {:?}", t_body.elapsed());
    let first = String::from_utf8_lossy(&got).lines().next().unwrap_or("").to_string();
    assert!(first.is_empty() || first.contains("408") || first.contains("403") || first.contains("401"), "slow body: {first}");

    // The slowloris connections are closed by the header timeout (10 s) before their heads
    // are complete.
    let (h, stop, closed) = drip;
    let waited = wait_for(Duration::from_secs(40), "slow connections closed", || (closed.load(Ordering::Relaxed) >= 150).then_some(t0.elapsed()));
    stop.store(true, Ordering::Relaxed);
    let left = h.join().expect("drip");
    waited.unwrap_or_else(|e| panic!("{e}: {} of 150 closed", 150 - left.iter().filter(|s| s.is_some()).count()));

    let after = agent.stats();
    let sweeps1 = agent.sweeps().expect("sweeps");
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "http abuse: {secs:.1} s, sweeps {} (nominal {:.0}), VmRSS {} -> {} KiB, VmHWM {} KiB, fds {} -> {}",
        sweeps1 - sweeps0,
        secs / 0.05,
        base.rss_kib,
        after.rss_kib,
        after.hwm_kib,
        base.fds,
        after.fds
    );
    assert!((sweeps1 - sweeps0) as f64 >= 0.3 * secs / 0.05, "sampling went on during the storm: {} sweeps in {secs:.1} s", sweeps1 - sweeps0);
    assert!(after.hwm_kib <= HTTP_ABUSE_HWM_MIB * 1024, "VmHWM {} KiB > {HTTP_ABUSE_HWM_MIB} MiB", after.hwm_kib);
    assert!(after.fds <= base.fds + 5, "connections released: fds {} -> {}", base.fds, after.fds);
    agent.assert_healthy("after the HTTP abuse");
}

// ---------------------------------------------------------------------------------------
// 9. Peers that send endless, trickling or unparseable bodies during `diagnose --peers`.

/// A peer that answers every request with `respond` on its own thread.
#[test]
fn three_hundred_idle_connections_reopened_at_once_do_not_delay_scrapes() {
    let dir = tempdir("idle");
    let agent = FaultAgent::start(dir.path(), &spec("interval = \"100ms\"\n[collectives]\nenabled = false\n".into())).expect("agent");
    // The issue's client: ~300 idle connections (over the 256 cap), each reopened as soon as
    // the agent closes it.
    let stop = Arc::new(AtomicBool::new(false));
    let reopened = Arc::new(AtomicU64::new(0));
    let idler = {
        let (stop, reopened, addr) = (stop.clone(), reopened.clone(), agent.addr.clone());
        std::thread::spawn(move || {
            let open = || TcpStream::connect(&addr).inspect(|t| t.set_nonblocking(true).expect("nonblocking")).ok();
            let mut conns: Vec<Option<TcpStream>> = (0..300).map(|_| open()).collect();
            while !stop.load(Ordering::Relaxed) {
                for c in conns.iter_mut() {
                    let closed = match c {
                        Some(t) => matches!(t.read(&mut [0u8; 64]), Ok(0)) || matches!(t.take_error(), Ok(Some(_))),
                        None => true,
                    };
                    if closed {
                        *c = open();
                        reopened.fetch_add(1, Ordering::Relaxed);
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    let mut lat: Vec<Duration> = (0..40)
        .map(|_| {
            let t0 = Instant::now();
            let r = stepwise_tests::harness::http_get(&agent.addr, "/metrics").expect("scrape");
            assert_eq!(r.status, 200);
            std::thread::sleep(Duration::from_millis(100));
            t0.elapsed() - Duration::from_millis(100)
        })
        .collect();
    stop.store(true, Ordering::Relaxed);
    idler.join().expect("idler");
    lat.sort();
    let (p50, p99) = (lat[lat.len() / 2], lat[lat.len() * 99 / 100]);
    eprintln!("idle-connection pressure: /metrics p50 {p50:?}, p99 {p99:?}, max {:?}; {} reconnects", lat[lat.len() - 1], reopened.load(Ordering::Relaxed));
    assert!(p99 < Duration::from_secs(1), "/metrics p99 {p99:?} under 300 idle connections (was ~10 s)");
}

fn fake_peer(respond: fn(&mut TcpStream)) -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                respond(&mut s);
            });
        }
    });
    addr
}

/// Runs `agent diagnose ARGS`; returns (exit code, stdout, stderr, wall time, peak RSS KiB).
fn diagnose_measured(args: &[&str]) -> (i32, String, String, Duration, u64) {
    let t = Instant::now();
    // Reaped below with wait4(2), which also reports the peak RSS (Child::wait does not).
    #[allow(clippy::zombie_processes)]
    let mut child = Command::new(agent_bin())
        .arg("diagnose")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("diagnose");
    let pid = child.id() as i32;
    let (mut so, mut se) = (child.stdout.take().expect("stdout"), child.stderr.take().expect("stderr"));
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 on our own child with valid out-pointers.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    assert_eq!(r, pid, "wait4");
    let code = if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { -1 };
    (code, out_t.join().expect("stdout"), err_t.join().expect("stderr"), t.elapsed(), ru.ru_maxrss as u64)
}

#[test]
fn diagnose_bounds_endless_trickling_and_deeply_nested_peer_answers() {
    let dir = tempdir("peers");
    let ns = Netns::new().expect("netns");
    let mut good = FaultAgent::start(dir.path(), &spec(config("100ms", &[], &ns, ""))).expect("a real agent");
    // An endless body as fast as loopback carries it.
    let endless = fake_peer(|s| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{\"host\":\"x\",\"calls\":[");
        let chunk = "{\"op\":\"all_reduce\",\"pid\":1},".repeat(4096);
        while s.write_all(chunk.as_bytes()).is_ok() {}
    });
    // A body of a few bytes per second that never ends.
    let trickle = fake_peer(|s| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n[");
        while s.write_all(b"[").is_ok() {
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    // 1 MB of nested arrays: a JSON parser without a depth limit overflows its stack.
    let nested = fake_peer(|s| {
        let body = "[".repeat(1 << 20);
        let _ = write!(s, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    });
    let peers = [good.addr.as_str(), &endless, &trickle, &nested].join(",");
    let (rc, out, err, took, maxrss) = diagnose_measured(&["--peers", &peers, "--timeout", "3s", "--json"]);
    eprintln!("diagnose against endless/trickle/nested peers: exit {rc} in {took:?}, peak RSS {} MiB", maxrss / 1024);
    assert!([0, 3].contains(&rc), "exit {rc}: {err}");
    assert!(took < Duration::from_millis(4500), "took {took:?} with a 3 s per-peer timeout");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("JSON ({e}): {out}\n{err}"));
    let failed = v["peers"]["failed"].as_array().cloned().unwrap_or_default();
    let err_of = |p: &str| {
        failed.iter().find(|f| f["peer"] == p).and_then(|f| f["error"].as_str()).unwrap_or_else(|| panic!("{p} not listed as failed: {failed:?}")).to_string()
    };
    let e = err_of(&endless);
    assert!(e.contains("larger than") || e.contains("timed out"), "endless body: {e}");
    assert!(e.contains("larger than"), "the size bound stops an endless body before the timeout: {e}");
    assert!(err_of(&trickle).contains("timed out"), "{}", err_of(&trickle));
    assert!(err_of(&nested).contains("not the agent's JSON"), "{}", err_of(&nested));
    assert!(!failed.iter().any(|f| f["peer"] == good.addr.as_str()), "the real agent answered: {failed:?}");
    // diagnose reads at most 64 MiB of one answer (fetch.rs MAX_BODY_BYTES).
    let bound_mib = 2 * 64 + 64;
    assert!(maxrss / 1024 <= bound_mib, "diagnose peak RSS {} MiB > {bound_mib} MiB (2 x the body bound + 64 MiB)", maxrss / 1024);
    good.assert_healthy("the queried agent");
}

// The soak (`cargo xtask soak`) reuses these helpers; keep one cheap check of them here.
#[test]
fn proc_stats_read_this_process() {
    let s = ProcStats::of(std::process::id());
    assert!(s.rss_kib > 0 && s.hwm_kib >= s.rss_kib && s.fds >= 3, "{s:?}");
}
