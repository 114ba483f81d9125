//! End to end on real "servers": network namespaces joined by TBF-shaped veth NICs, the
//! NCCL-ABI workload moving real bytes between them, one agent per server running inside its
//! namespace (its netdev/qdisc sources see that server's NICs; its probes select that
//! server's processes). Each scenario injects one problem, measures the excess it causes
//! independently — the workload's own timings of the same job with and without the problem,
//! `ip -s link` counters and the TBF rate — and checks that the agent attributes those
//! seconds to the right cause (±15 %) and nothing else above a stated threshold.
//!
//! - rails: flat ring over 4 rails → `rail_imbalance` (busiest − balanced rail time of the
//!   bytes the rails sent after each step's last arrival, per step, from the rails' own
//!   counters read every 2 ms by the test: `stepwise_tests::linkpoll`), balanced time in the
//!   evidence, `agent diagnose --peers` joins both servers'
//!   8 ranks; hierarchical → no rail imbalance;
//! - congestion: two jobs' bursts on one uplink in phase → `congestion` (their transfer in
//!   phase − out of phase) with qdisc backlog and the other job's bytes as evidence; out of
//!   phase → none;
//! - in-flight: window 1 vs 16 over a modelled round trip → `in_flight_limit` (all-reduce at
//!   window 1 − at 16) with N ≈ 1, m = the chunk, N·m/T = the workload's rate; none at 16;
//!   `/metrics` alone gives the same N, m, T (the `stepwise_net_request_*` sums), and the
//!   requests' bytes match the rail's transmitted bytes; with the probes attached in short
//!   sampled windows (as by default), N is still ≈ 1 per step and at most one from `/metrics`;
//! - healthy: hierarchical, nothing injected → compute and ideal communication only (what is
//!   unexplained is exactly what the workload itself lost beyond the ideal: the intra-server
//!   phases and CPU contention from unrelated work).
//!
//! The flat ring, congestion and in-flight scenarios also run as real NCCL does — calls only
//! enqueue (`CUDA_LAUNCH_BLOCKING=0`), the profiler plugin times the collectives on the
//! library's simulated GPU and reports to its server's agent — with the same tolerances, and
//! the steps must say `timing: gpu`.
//!
//! Causes that were not injected must stay under MEDIAN_FALSE (7.5 %) of the median step
//! and, in any single step, under STEP_FALSE (25 %, at least 25 ms) of it plus the extra
//! time the workload itself saw in that step (a rank descheduled by unrelated work).
//!
//! The agents run at the shipped defaults (1 s sweeps, the fast lane at 10 ms within 1 % of
//! a core, the TCP dumps within 2 %) in every scenario but congestion, which still samples
//! every 10 ms (`scenarios::agent_config_10ms`, the measured reason there).
//!
//! The scenarios time things on a 2-core machine, so they run one at a time (a lock), each
//! in its own namespaces (unique names; everything removed on Drop, also on failure), the
//! ranks and agents at a raised priority. `STEPWISE_E2E_VERBOSE=1` prints every step's
//! breakdown; each scenario prints a one-line summary of its numbers.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;
use stepwise_tests::{
    linkpoll::LinkPoller,
    scenarios::{
        self, agent_config, agent_config_10ms, cause, cause_seconds, median, rail_addr, rail_dev, start_job, summarize, top_problem, within, JobOutput,
        RankSpec, Servers, Shape,
    },
    workloads,
};

/// Thresholds for causes that were not injected: at most this fraction of the median step
/// (median over steps) …
const MEDIAN_FALSE: f64 = 0.075;
/// … and of any single step, or STEP_FALSE_FLOOR seconds if that is more: a gross error in
/// one step fails, a one-off scheduler stall of a rank on a shared 2-core machine (which
/// shows as `unexplained`, or as `in_flight_limit` when it delays reaping completions) does
/// not.
const STEP_FALSE: f64 = 0.25;
const STEP_FALSE_FLOOR: f64 = 0.025;

/// One scenario at a time: they measure time on a 2-core machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

fn verbose() -> bool {
    std::env::var_os("STEPWISE_E2E_VERBOSE").is_some()
}

fn setup() -> tempfile::TempDir {
    scenarios::require_tools(&["ip", "tc", "nice", "env"]).expect("tools");
    workloads::build().expect("workloads build");
    tempfile::Builder::new().prefix("stepwise-e2e-netns-").tempdir().expect("tmp")
}

fn secs(step: &Value) -> f64 {
    step["seconds"].as_f64().expect("step seconds")
}

fn args(list: &[(&str, String)]) -> Vec<String> {
    list.iter().flat_map(|(k, v)| [k.to_string(), v.clone()]).collect()
}

/// Steps of agent `i` that began in [t0, t1], waiting (up to 10 s) until there are `n`.
fn steps_between(s: &Servers, i: usize, t0: f64, t1: f64, n: usize) -> Vec<Value> {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let v: Vec<Value> = s.steps(i).expect("steps").into_iter().filter(|x| x["begin"].as_f64().is_some_and(|b| b >= t0 && b <= t1)).collect();
        if v.len() >= n || Instant::now() > end {
            return v;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// How much longer than usual each step's all-reduce took on the given ranks, by the
/// workload's own clock: its excess over the run's median (0 when not longer). A one-off
/// disturbance (a rank descheduled on a shared 2-core machine) is real time the agent must
/// put somewhere; it is not a false cause up to that much.
fn disturbance(o: &JobOutput, ranks: &[u32]) -> BTreeMap<u64, f64> {
    let mut per: BTreeMap<u64, f64> = BTreeMap::new();
    for &r in ranks {
        let lines = o.rank(r);
        if lines.is_empty() {
            continue;
        }
        let med = median(lines.iter().map(|l| l.allreduce_us * 1e-6).collect());
        for l in lines {
            let e = per.entry(l.step).or_default();
            *e = e.max(l.allreduce_us * 1e-6 - med);
        }
    }
    per
}

/// Causes other than compute, ideal communication and `except` above their allowance in a
/// step: `frac` of the step (at least STEP_FALSE_FLOOR) plus the step's own disturbance.
fn false_causes(steps: &[Value], except: &[&str], frac: f64, disturbed: &BTreeMap<u64, f64>) -> Vec<String> {
    let mut bad = Vec::new();
    for st in steps {
        let extra = st["step"].as_u64().and_then(|id| disturbed.get(&id)).copied().unwrap_or(0.0);
        for c in st["causes"].as_array().expect("causes") {
            let k = c["kind"].as_str().unwrap_or("");
            if ["compute", "ideal_comm"].contains(&k) || except.contains(&k) {
                continue;
            }
            let x = c["seconds"].as_f64().unwrap_or(0.0);
            if x.abs() > (frac * secs(st)).max(STEP_FALSE_FLOOR) + extra {
                bad.push(format!("step {} ({:.1} ms, the workload's own excess {:.1} ms): {k} = {:.1} ms", st["step"], secs(st) * 1e3, extra * 1e3, x * 1e3));
            }
        }
    }
    bad
}

/// No cause but compute, ideal communication and `except` above the thresholds: each at most
/// MEDIAN_FALSE of the median step (median over steps), and in any single step at most
/// STEP_FALSE of it (at least STEP_FALSE_FLOOR) plus the extra time the workload itself saw
/// in that step (`disturbed`).
fn assert_no_false_causes(steps: &[Value], except: &[&str], what: &str, disturbed: &BTreeMap<u64, f64>) {
    let med_step = median(steps.iter().map(secs).collect());
    for kind in ["readiness_skew", "rail_imbalance", "in_flight_limit", "congestion", "unexplained"] {
        if except.contains(&kind) {
            continue;
        }
        let m = median(steps.iter().map(|st| cause_seconds(st, kind)).collect());
        assert!(
            m.abs() <= MEDIAN_FALSE * med_step,
            "{what}: {kind} {:.1} ms in the median step (threshold {} % of {:.1} ms)\n{}",
            m * 1e3,
            MEDIAN_FALSE * 100.0,
            med_step * 1e3,
            summarize(steps)
        );
    }
    let bad = false_causes(steps, except, STEP_FALSE, disturbed);
    assert!(bad.is_empty(), "{what}: causes other than {except:?}, compute and ideal communication above {} % of the step (at least {} ms) plus the workload's own excess in that step:\n{}", STEP_FALSE * 100.0, STEP_FALSE_FLOOR * 1e3, bad.join("\n"));
}

// ---------------------------------------------------------------------------------------
// Rails: two servers × 4 rails, each rail end shaped by TBF to 10 Mbit/s (MTU 9000, 16 KiB
// burst, 1 MiB queue), 8 ranks (rank r on server r/4, NIC r%4), markers on.
// 256 KiB all-reduce: the flat ring puts 1.75 × 256 KiB per server on rail 0 (≈ 370 ms) where
// the same bytes balanced over 4 rails need ≈ 93 ms.

const RAIL_MBIT: u32 = 10;
const RAIL_BYTES: u64 = 256 * 1024;
const RAIL_STEPS: u64 = 8;
const RAIL_COMPUTE_US: u64 = 50_000;

fn marker_sock(dir: &Path, server: usize) -> PathBuf {
    dir.join(format!("markers-{server}.sock"))
}

/// How a scenario's NCCL calls are timed.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Timing {
    /// `CUDA_LAUNCH_BLOCKING=1`: calls return when the collective is done (host-timed);
    /// in-flight figures from the sampled `ncclIb*` probes.
    Blocking,
    /// As real NCCL: calls only enqueue; the profiler plugin times the collectives on the
    /// (simulated) GPU and its proxy steps give every network request.
    AsyncPlugin,
}

impl Timing {
    /// The environment a rank needs for this mode (the plugin reports to its server's agent:
    /// `STEPWISE_PROFILER_SOCKET` is set per rank).
    fn env(self) -> Vec<(String, String)> {
        match self {
            Timing::Blocking => Vec::new(),
            Timing::AsyncPlugin => vec![
                ("CUDA_LAUNCH_BLOCKING".into(), "0".into()),
                ("NCCL_PROFILER_PLUGIN".into(), workloads::profiler_plugin().expect("plugin").display().to_string()),
            ],
        }
    }
    /// The `timing` its steps report.
    fn step_timing(self) -> &'static str {
        match self {
            Timing::Blocking => "host_completion",
            Timing::AsyncPlugin => "gpu",
        }
    }
}

/// Four rails, agents at the shipped defaults.
fn rails_servers(dir: &Path) -> Servers {
    let mut s = Servers::new(4, 9000, Some(Shape::mbit(RAIL_MBIT, 16, 1024))).expect("servers");
    start_rail_agents(&mut s, dir);
    s
}

/// (Re)starts both agents: markers carry no job identity, so a second job counting its steps
/// from 0 gets fresh agents.
fn start_rail_agents(s: &mut Servers, dir: &Path) {
    s.agents.clear();
    let rate = s.shape.as_ref().expect("shaped").agent_rate();
    let rates: BTreeMap<String, String> = (0..s.rails).map(|i| (rail_dev(i), rate.clone())).collect();
    for k in 0..2 {
        let cfg = agent_config(s.ns(k), dir, k, Some(&marker_sock(dir, k)), &rates, false);
        s.start_agent(k, dir, &cfg).expect("agent starts");
    }
}

/// Runs the 8-rank job; returns its output, wall-clock span and per-server rail tx deltas.
fn run_rails_job(s: &Servers, dir: &Path, (algo, name): (&str, &str), bytes: u64, steps: u64, mode: Timing) -> (JobOutput, f64, f64, Vec<Vec<f64>>) {
    let peers: Vec<String> = (0..8).map(|r| rail_addr(r / 4, r % 4).to_string()).collect();
    let ranks: Vec<RankSpec> = (0..8u32)
        .map(|r| {
            let server = (r / 4) as usize;
            RankSpec {
                ns: s.ns(server).to_string(),
                rank: r,
                env: [
                    ("NCCL_ABI_ALGO".into(), algo.into()),
                    ("NCCL_ABI_HOST".into(), format!("server{server}")),
                    ("NCCL_ABI_LOCAL_SIZE".into(), "4".into()),
                    ("NCCL_ABI_IFACE_ADDR".into(), rail_addr(server, (r % 4) as usize).to_string()),
                    ("NCCL_ABI_PEER_ADDRS".into(), peers.join(",")),
                    ("STEPWISE_PROFILER_SOCKET".into(), dir.join(format!("profiler-{server}.sock")).display().to_string()),
                ]
                .into_iter()
                .chain(mode.env())
                .collect(),
                args: vec!["--marker-socket".into(), marker_sock(dir, server).display().to_string()],
            }
        })
        .collect();
    let a = args(&[("--steps", steps.to_string()), ("--bytes", bytes.to_string()), ("--compute-us", RAIL_COMPUTE_US.to_string())]);
    let before: Vec<Vec<f64>> = (0..2).map(|k| s.rail_tx(k).expect("tx")).collect();
    let t0 = now();
    let out = start_job(name, dir, &ranks, &a).expect("job starts").wait(Duration::from_secs(60)).expect("job");
    let t1 = now();
    let after: Vec<Vec<f64>> = (0..2).map(|k| s.rail_tx(k).expect("tx")).collect();
    let tx = (0..2).map(|k| (0..s.rails).map(|i| after[k][i] - before[k][i]).collect()).collect();
    (out, t0, t1, tx)
}

/// The rails' own counters of both servers, read every 2 ms for per-step ground truth.
fn poll_rails(s: &Servers) -> LinkPoller {
    let devs: Vec<String> = (0..s.rails).map(rail_dev).collect();
    LinkPoller::start(&[s.ns(0), s.ns(1)], &devs, Duration::from_millis(2)).expect("rail poller")
}

/// Per step, the bytes each rail of `servers` sent (in that order, rails within) from the
/// last arrival of `ranks` (the collective's transfer begins when its last rank is in; what
/// an early rank sent before went out while the step waited for the late one, which is
/// readiness skew's time) to the next step's first arrival of `ranks` (the job's end for the
/// last), as read by `poll`.
fn transfer_tx(out: &JobOutput, ranks: &[u32], servers: &[usize], mode: Timing, poll: &LinkPoller, rails: usize) -> BTreeMap<u64, Vec<f64>> {
    let mut arrivals: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for l in out.lines.iter().filter(|l| ranks.contains(&l.rank)) {
        let at = match mode {
            Timing::Blocking => l.arrive_us,
            Timing::AsyncPlugin => l.kernel_us.expect("kernel_us"),
        };
        arrivals.entry(l.step).or_default().push(at);
    }
    let end = poll.last_read_us();
    let ids: Vec<u64> = arrivals.keys().copied().collect();
    ids.iter()
        .enumerate()
        .map(|(n, id)| {
            let from = arrivals[id].iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let to = ids.get(n + 1).map(|next| arrivals[next].iter().cloned().fold(f64::INFINITY, f64::min)).unwrap_or(end);
            (*id, servers.iter().flat_map(|&k| (0..rails).map(move |i| poll.tx_between(k, &rail_dev(i), from, to))).collect())
        })
        .collect()
}

/// Per step, (busiest − balanced, balanced) seconds of the rails' bytes in `transfer_tx`.
fn rail_truth(tx: BTreeMap<u64, Vec<f64>>, rate: f64) -> BTreeMap<u64, (f64, f64)> {
    tx.into_iter()
        .map(|(id, b)| {
            let (sum, max, n) = (b.iter().sum::<f64>(), b.iter().cloned().fold(0.0, f64::max), b.len() as f64);
            (id, ((max - sum / n) / rate, sum / n / rate))
        })
        .collect()
}

/// The workload's own readiness skew of server `k`'s ranks, per step: from the call times
/// when calls block, from the kernels' begins on the (simulated) GPU when they only enqueue
/// (the stream may start a kernel later than the call: its earlier work, or the stream
/// thread's start at the first call).
fn local_skew(out: &JobOutput, k: usize, mode: Timing) -> BTreeMap<u64, (f64, u32)> {
    let ranks: Vec<u32> = (4 * k as u32..4 * k as u32 + 4).collect();
    let local: Vec<_> = out.lines.iter().filter(|l| ranks.contains(&l.rank)).cloned().collect();
    match mode {
        Timing::Blocking => workloads::true_skew_seconds(&local),
        Timing::AsyncPlugin => workloads::true_kernel_skew_seconds(&local),
    }
}

fn check_skew(steps: &[Value], truth: &BTreeMap<u64, (f64, u32)>, what: &str) {
    for st in steps {
        let id = st["step"].as_u64().expect("id");
        let want = truth.get(&id).map(|t| t.0).unwrap_or(0.0);
        let got = cause_seconds(st, "readiness_skew");
        assert!(
            (got - want).abs() <= (0.15 * want).max(2e-3),
            "{what} step {id}: readiness skew {:.1} ms vs the workload's own {:.1} ms",
            got * 1e3,
            want * 1e3
        );
    }
}

#[test]
fn rails_flat_ring_is_rail_imbalance_hierarchical_is_not() {
    let _g = serial();
    let dir = setup();
    let mut s = rails_servers(dir.path());
    let rate = s.shape.as_ref().expect("shape").bytes_per_second;

    // Flat ring: every cross-server byte on rail 0.
    let poll = poll_rails(&s);
    let (ring, t0, t1, tx) = run_rails_job(&s, dir.path(), ("ring", "ring"), RAIL_BYTES, RAIL_STEPS, Timing::Blocking);
    let balanced_pred = check_flat_ring(&s, &ring, (t0, t1), &tx, Timing::Blocking, &poll);
    let truth = rail_truth(transfer_tx(&ring, &(0..8).collect::<Vec<u32>>(), &[0, 1], Timing::Blocking, &poll, s.rails), rate);
    drop(poll);
    rails_diagnose_and_hierarchical(&mut s, dir.path(), &tx, &truth, balanced_pred, rate);
}

/// The flat ring again, asynchronous with the profiler plugin: GPU-timed steps, same
/// tolerances.
#[test]
fn rails_flat_ring_async_with_the_profiler_plugin_is_rail_imbalance() {
    let _g = serial();
    let dir = setup();
    let s = rails_servers(dir.path());
    let poll = poll_rails(&s);
    let (ring, t0, t1, tx) = run_rails_job(&s, dir.path(), ("ring", "ring-async"), RAIL_BYTES, RAIL_STEPS, Timing::AsyncPlugin);
    check_flat_ring(&s, &ring, (t0, t1), &tx, Timing::AsyncPlugin, &poll);
}

/// Each server's flat-ring steps: rail imbalance = the busiest − balanced rail time of the
/// bytes the rails' own counters sent in the step's transfer (±15 %, per step), the busiest
/// NIC and the balanced prediction (±15 %) in the evidence, the workload's own skew, nothing
/// else. Returns the balanced-transfer predictions.
fn check_flat_ring(s: &Servers, ring: &JobOutput, (t0, t1): (f64, f64), tx: &[Vec<f64>], mode: Timing, poll: &LinkPoller) -> Vec<f64> {
    let rate = s.shape.as_ref().expect("shape").bytes_per_second;
    let mut balanced_pred = Vec::new();
    for (k, tx_k) in tx.iter().enumerate() {
        // The run's totals from `ip -s link` and the TBF rate: the busiest rail's time per
        // step minus the same bytes balanced over the 4 rails, early ranks' bytes included.
        let per: Vec<f64> = tx_k.iter().map(|b| b / RAIL_STEPS as f64).collect();
        let (sum, max) = (per.iter().sum::<f64>(), per.iter().cloned().fold(0.0, f64::max));
        let (busiest_s, balanced_s) = (max / rate, sum / 4.0 / rate);
        let excess = busiest_s - balanced_s;
        // Ground truth per step: the same from the bytes sent after the last local arrival.
        let local: Vec<u32> = (4 * k as u32..4 * k as u32 + 4).collect();
        let truth = rail_truth(transfer_tx(ring, &local, &[k], mode, poll, s.rails), rate);
        assert!(per[0] > 0.95 * sum, "server {k}: the flat ring should put its cross-server bytes on rail 0: {per:?}");
        // The shaped rail is the bottleneck: the workload's own all-reduce time is the busiest
        // rail's time at nominal rate (so the counters' excess is the real excess).
        let ranks: Vec<u32> = (4 * k as u32..4 * k as u32 + 4).collect();
        let measured = median(ring.lines.iter().filter(|l| ranks.contains(&l.rank)).map(|l| l.allreduce_us * 1e-6).collect());
        assert!(
            within(measured, busiest_s, 0.15),
            "server {k}: flat-ring all-reduce {:.1} ms vs busiest rail at 10 Mbit/s {:.1} ms",
            measured * 1e3,
            busiest_s * 1e3
        );

        let steps = steps_between(s, k, t0, t1, RAIL_STEPS as usize);
        if verbose() {
            eprintln!(
                "ring server {k} ({mode:?}): tx/step {per:?}, excess {:.1} ms, per step after the last arrival {truth:.4?} s\n{}",
                excess * 1e3,
                summarize(&steps)
            );
        }
        assert_eq!(steps.len(), RAIL_STEPS as usize, "server {k}: every marker step attributed:\n{}", summarize(&steps));
        scenarios::assert_parts_sum(&steps);
        for st in &steps {
            let id = st["step"].as_u64().expect("id");
            assert_eq!(st["timing"], mode.step_timing(), "server {k} step {id} ({mode:?}): {}", st["timing"]);
            let (top, _) = top_problem(st);
            assert_eq!(top, "rail_imbalance", "server {k} step {id}: top cause\n{}", summarize(std::slice::from_ref(st)));
            let rail = cause(st, "rail_imbalance");
            let got = rail["seconds"].as_f64().expect("seconds");
            let (want, _) = truth.get(&id).copied().unwrap_or_else(|| panic!("server {k} step {id}: not in the workload's output"));
            assert!(
                within(got, want, 0.15),
                "server {k} step {id}: rail_imbalance {:.1} ms vs the rails' excess after the last arrival {:.1} ms (whole step: {:.1} ms)",
                got * 1e3,
                want * 1e3,
                excess * 1e3
            );
            let ev = &rail["evidence"];
            assert_eq!(ev["busiest_nic"], "rail0", "server {k} step {id}: {ev}");
            assert!(ev["busiest_share"].as_f64().is_some_and(|x| x > 0.95), "server {k} step {id}: {ev}");
            assert_eq!(ev["nics"].as_array().map(Vec::len), Some(4), "server {k} step {id}: the 4 rails (idle ones too), not the management NIC: {ev}");
            let bal = ev["balanced_transfer_seconds"].as_f64().expect("balanced_transfer_seconds in the evidence");
            balanced_pred.push(bal);
            assert!(rail["fix"].as_str().is_some_and(|f| f.contains("hierarchical")), "{rail}");
        }
        // The balanced prediction from the step windows' counter bytes against the rails' own
        // per step.
        for (st, pred) in steps.iter().zip(&balanced_pred[balanced_pred.len() - steps.len()..]) {
            let id = st["step"].as_u64().expect("id");
            let want = truth[&id].1;
            assert!(within(*pred, want, 0.15), "server {k} step {id}: predicted balanced transfer {:.1} ms vs the rails' {:.1} ms", pred * 1e3, want * 1e3);
        }
        // The ring's own arrival skew (ranks leave the ring at different times) is real and
        // matches the workload's clock; nothing else is there.
        check_skew(&steps, &local_skew(ring, k, mode), &format!("ring server {k}"));
        eprintln!(
            "rails/ring server {k} ({mode:?}): rail_imbalance {:.1} ms (median step) vs the rails' excess after the last arrival {:.1} ms (median step; whole step {:.1} ms: ip -s link busiest rail {:.1} ms − balanced {:.1} ms); balanced_transfer_seconds {:.1} ms vs the rails' {:.1} ms; workload all-reduce {:.1} ms",
            median(steps.iter().map(|st| cause_seconds(st, "rail_imbalance")).collect()) * 1e3,
            median(truth.values().map(|t| t.0).collect()) * 1e3,
            excess * 1e3,
            busiest_s * 1e3,
            balanced_s * 1e3,
            median(steps.iter().filter_map(|st| cause(st, "rail_imbalance")["evidence"]["balanced_transfer_seconds"].as_f64()).collect()) * 1e3,
            median(truth.values().map(|t| t.1).collect()) * 1e3,
            measured * 1e3
        );
        assert_no_false_causes(&steps, &["rail_imbalance", "readiness_skew"], &format!("ring server {k} ({mode:?})"), &disturbance(ring, &ranks));
    }
    balanced_pred
}

/// `agent diagnose --peers A,B --json --slowest N --since T` over both servers' agents: the
/// whole report, once it ran and both agents answered.
fn diagnose_peers(s: &Servers, slowest: usize, since: &str) -> Value {
    let peers = format!("{},{}", s.agents[0].addr, s.agents[1].addr);
    let (code, text, err) = scenarios::diagnose(s, &["--peers", &peers, "--json", "--slowest", &slowest.to_string(), "--since", since]).expect("diagnose runs");
    assert_eq!(code, 0, "agent diagnose --peers: {err}\n{text}");
    let rep: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("diagnose --json: {e}: {text}"));
    assert_eq!(rep["peers"]["answered"].as_array().map(Vec::len), Some(2), "both agents answered: {}", rep["peers"]);
    rep
}

/// `agent diagnose --peers` over the flat ring's steps, then the hierarchical algorithm on
/// fresh agents: no rail imbalance, and as fast as the flat ring's balanced prediction.
fn rails_diagnose_and_hierarchical(s: &mut Servers, dir: &Path, tx: &[Vec<f64>], truth: &BTreeMap<u64, (f64, f64)>, balanced_pred: Vec<f64>, rate: f64) {
    // agent diagnose --peers joins both agents' ranks (8) and NICs.
    let rep = diagnose_peers(s, 3, "5m");
    let dsteps = rep["steps"].as_array().expect("steps");
    assert_eq!(dsteps.len(), 3, "{rep}");
    let excess_all: f64 = {
        let per: Vec<f64> = tx.iter().flatten().map(|b| b / RAIL_STEPS as f64).collect();
        (per.iter().cloned().fold(0.0, f64::max) - per.iter().sum::<f64>() / 8.0) / rate
    };
    let want = |st: &Value| {
        st["step"].as_u64().and_then(|id| truth.get(&id)).map(|t| t.0).unwrap_or_else(|| panic!("diagnose step {}: not in the workload's output", st["step"]))
    };
    eprintln!(
        "rails/diagnose --peers: {} steps, rail_imbalance {:?} ms vs the 8 rails' excess after the last arrival {:?} ms (whole step {:.1} ms)",
        dsteps.len(),
        dsteps.iter().map(|st| (cause_seconds(st, "rail_imbalance") * 1e4).round() / 10.0).collect::<Vec<_>>(),
        dsteps.iter().map(|st| (want(st) * 1e4).round() / 10.0).collect::<Vec<_>>(),
        excess_all * 1e3,
    );
    for st in dsteps {
        assert_eq!(st["ranks"].as_array().map(Vec::len), Some(8), "diagnose joins the 8 ranks of both servers: {}", st["ranks"]);
        assert_eq!(st["top_cause"], "rail_imbalance", "{st}");
        let got = cause_seconds(st, "rail_imbalance");
        assert!(within(got, want(st), 0.15), "diagnose step {}: rail_imbalance {:.1} ms vs the rails' {:.1} ms", st["step"], got * 1e3, want(st) * 1e3);
    }

    // Hierarchical on fresh agents: no rail imbalance, and the alternative is at least as fast
    // as the balanced transfer the flat ring's evidence predicted.
    start_rail_agents(s, dir);
    let (hier, t0, t1, tx) = run_rails_job(s, dir, ("hierarchical", "hier"), RAIL_BYTES, RAIL_STEPS, Timing::Blocking);
    let hier_ar = median(hier.lines.iter().map(|l| l.allreduce_us * 1e-6).collect());
    let predicted = median(balanced_pred);
    assert!(hier_ar <= predicted * 1.15, "hierarchical all-reduce {:.1} ms vs the predicted balanced transfer {:.1} ms", hier_ar * 1e3, predicted * 1e3);
    for (k, tx_k) in tx.iter().enumerate() {
        let per: Vec<f64> = tx_k.iter().map(|b| b / RAIL_STEPS as f64).collect();
        let mean = per.iter().sum::<f64>() / 4.0;
        assert!(per.iter().all(|b| within(*b, mean, 0.1)), "server {k}: hierarchical spreads the bytes over the 4 rails: {per:?}");
        let steps = steps_between(s, k, t0, t1, RAIL_STEPS as usize);
        if verbose() {
            eprintln!("hierarchical server {k}: tx/step {per:?}\n{}", summarize(&steps));
        }
        assert_eq!(steps.len(), RAIL_STEPS as usize, "server {k}:\n{}", summarize(&steps));
        scenarios::assert_parts_sum(&steps);
        eprintln!(
            "rails/hierarchical server {k}: rail_imbalance max {:.1} ms; workload all-reduce {:.1} ms vs predicted balanced {:.1} ms",
            steps.iter().map(|st| cause_seconds(st, "rail_imbalance")).fold(0.0, f64::max) * 1e3,
            hier_ar * 1e3,
            predicted * 1e3
        );
        for st in &steps {
            let r = cause_seconds(st, "rail_imbalance");
            assert!(
                r <= 0.05 * secs(st),
                "server {k} step {}: rail_imbalance {:.1} ms on the hierarchical algorithm (threshold 5 % of every step)",
                st["step"],
                r * 1e3
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Congestion: two 2-rank jobs (rank 0 on server 0, rank 1 on server 1) over one uplink
// shaped by TBF to 10 Mbit/s (MTU 9000, 16 KiB burst, 1 MiB queue). 256 KiB all-reduce
// (each rank sends 256 KiB: ≈ 210 ms alone), at least 800 ms compute. Both jobs are paced
// (`--start-at-us`/`--period-us`: step k's all-reduce is issued at T + k·P, the compute
// waiting for it; P = 1.3 s in phase, 1.1 s out of phase, ≈ 90 ms more than a step needs):
// in phase both jobs get one T and their bursts share the link (≈ 420 ms); out of phase the
// second job's T is 505 ms later (≥ 300 ms of margin on either side) and each has the link
// alone. Without pacing a job that finished its burst first started the next one first and
// the jobs drifted apart (seen: in-phase all-reduces of 300 ms instead of 410 after a
// perturbation at the start). No markers: steps come from each communicator's period.

const UP_MBIT: u32 = 10;
const UP_MTU: u32 = 9000;
const UP_BYTES: u64 = 256 * 1024;
const UP_STEPS: u64 = 7;
const UP_COMPUTE_US: u64 = 800_000;
/// The pace of both jobs in phase: step k's all-reduce at T + k·UP_PERIOD_IN_US, ≈ 90 ms
/// longer than the compute and a shared all-reduce (≈ 420 ms) …
const UP_PERIOD_IN_US: u64 = 1_300_000;
/// … and out of phase, ≈ 90 ms longer than the compute and an all-reduce alone (≈ 210 ms):
/// the in-phase steps stay the slower ones (cluster `diagnose --slowest` picks them).
const UP_PERIOD_OUT_US: u64 = 1_100_000;
/// Out of phase, the second job's T is this much later (≥ 300 ms of margin either side).
const UP_OFFSET_MS: u64 = 505;
/// T of the first job: far enough ahead for both jobs' start-up and rendezvous.
const UP_LEAD_US: u64 = 2_000_000;

fn two_rank_job(s: &Servers, dir: &Path, name: &str, env: &[(&str, String)], args: &[String]) -> scenarios::Job {
    let ranks: Vec<RankSpec> = (0..2u32)
        .map(|r| {
            // The plugin (when a job loads it) reports to its own server's agent.
            let mut e: Vec<(String, String)> = vec![
                ("NCCL_ABI_IFACE_ADDR".into(), rail_addr(r as usize, 0).to_string()),
                ("STEPWISE_PROFILER_SOCKET".into(), dir.join(format!("profiler-{r}.sock")).display().to_string()),
            ];
            e.extend(env.iter().map(|(k, v)| (k.to_string(), v.clone())));
            RankSpec { ns: s.ns(r as usize).to_string(), rank: r, env: e, args: Vec::new() }
        })
        .collect();
    start_job(name, dir, &ranks, args).expect("job starts")
}

/// Steps of agent `k` whose collectives belong to process `pid` (a period step ends at the
/// last exit of its collectives).
fn steps_of_pid(s: &Servers, k: usize, pid: u32, steps: &[Value]) -> Vec<Value> {
    let calls = s.get_json(&s.agents[k].addr, "/api/v1/collectives?limit=100000").expect("calls");
    let exits: Vec<(f64, u64)> = calls["calls"].as_array().expect("calls").iter().filter_map(|c| Some((c["exit"].as_f64()?, c["pid"].as_u64()?))).collect();
    // Whose call exited at `t`: the nearest exit of any process, within 1 µs. Two jobs paced
    // in phase can end steps 0.7 µs apart (both woken by the same drained queue), so "some
    // exit of this pid within 1 µs" would claim the other job's step too.
    let at_exit = |t: Option<f64>| {
        t.and_then(|t| exits.iter().map(|(x, p)| ((x - t).abs(), *p)).filter(|(d, _)| *d < 1e-6).min_by(|a, b| a.0.total_cmp(&b.0)))
            .is_some_and(|(_, p)| p == pid as u64)
    };
    let mine: Vec<Value> = steps.iter().filter(|st| at_exit(st["end"].as_f64())).cloned().collect();
    // Each step once: the engine's done-key for a period step is its id, which counts the
    // main communicator's periods and does not move as the history window does. Two jobs in
    // phase on a loaded host can end a step at the same instant (both woken by one tick: a
    // CI rehearsal saw job 1's and job 2's step 1 end within 0.1 µs, 0.38 ms apart at their
    // begins, over different connections); a period step begins at its previous period's
    // last exit, so the begin tells whose step it is.
    let mut by_id: BTreeMap<u64, Vec<Value>> = BTreeMap::new();
    for st in mine {
        by_id.entry(st["step"].as_u64().expect("id")).or_default().push(st);
    }
    by_id
        .into_values()
        .map(|mut same| {
            if same.len() > 1 {
                same.retain(|st| at_exit(st["begin"].as_f64()));
            }
            match same.len() {
                1 => same.remove(0),
                _ => panic!("agent {k}: not one step of pid {pid} with this id:\n{}", same.iter().map(Value::to_string).collect::<Vec<_>>().join("\n")),
            }
        })
        .collect()
}

struct PhaseRun {
    /// Per job: its output and its steps on each server.
    jobs: Vec<(JobOutput, Vec<Vec<Value>>)>,
    /// Bytes each server sent on the uplink during the run (`ip -s link`).
    tx: Vec<f64>,
}

fn run_phase(s: &Servers, dir: &Path, phase: &str, offset_ms: u64, period_us: u64, mode: Timing) -> PhaseRun {
    let extra = mode.env();
    let env: Vec<(&str, String)> = extra.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let start = workloads::monotonic_us() + UP_LEAD_US;
    let a = |t: u64| {
        args(&[
            ("--steps", UP_STEPS.to_string()),
            ("--bytes", UP_BYTES.to_string()),
            ("--compute-us", UP_COMPUTE_US.to_string()),
            ("--start-at-us", t.to_string()),
            ("--period-us", period_us.to_string()),
        ])
    };
    let tx0: Vec<f64> = (0..2).map(|k| s.rail_tx(k).expect("tx")[0]).collect();
    let t0 = now();
    let j1 = two_rank_job(s, dir, &format!("{phase}-j1"), &env, &a(start));
    let j2 = two_rank_job(s, dir, &format!("{phase}-j2"), &env, &a(start + offset_ms * 1000));
    let pids = [j1.pids(), j2.pids()];
    let outs = [j1.wait(Duration::from_secs(60)).expect("job 1"), j2.wait(Duration::from_secs(60)).expect("job 2")];
    let t1 = now();
    let tx: Vec<f64> = (0..2).map(|k| s.rail_tx(k).expect("tx")[0] - tx0[k]).collect();
    // Period steps: the first collective only starts a step.
    let per_job = UP_STEPS as usize - 1;
    let mut jobs = Vec::new();
    for (j, out) in outs.into_iter().enumerate() {
        let mut per_server = Vec::new();
        for k in 0..2 {
            let end = Instant::now() + Duration::from_secs(10);
            let st = loop {
                let all = steps_between(s, k, t0, t1, 2 * per_job);
                let st = steps_of_pid(s, k, pids[j][&(k as u32)], &all);
                if st.len() >= per_job || Instant::now() > end {
                    break st;
                }
                std::thread::sleep(Duration::from_millis(200));
            };
            if verbose() {
                eprintln!(
                    "{phase} phase, job {} on server {k}: all-reduce {:?} ms\n{}",
                    j + 1,
                    out.rank(k as u32).iter().map(|l| (l.allreduce_us / 1e3).round()).collect::<Vec<_>>(),
                    summarize(&st)
                );
            }
            if let Some(d) = std::env::var_os("STEPWISE_E2E_DUMP") {
                // For looking into a failure: the agent's steps and the workload's own lines.
                let base = Path::new(&d).join(format!("{phase}-{mode:?}-job{}-server{k}", j + 1));
                let _ = std::fs::create_dir_all(&d);
                let _ = std::fs::write(base.with_extension("steps.json"), serde_json::to_string_pretty(&st).unwrap_or_default());
                let _ = std::fs::write(base.with_extension("stdout"), out.text.values().cloned().collect::<Vec<_>>().join(""));
            }
            assert_eq!(st.len(), per_job, "{phase} phase, job {} on server {k}: steps attributed\n{}", j + 1, summarize(&st));
            scenarios::assert_parts_sum(&st);
            per_server.push(st);
        }
        jobs.push((out, per_server));
    }
    PhaseRun { jobs, tx }
}

#[test]
fn congestion_two_jobs_in_phase_on_one_uplink_out_of_phase_not() {
    congestion_scenario(Timing::Blocking);
}

/// The same two jobs, asynchronous with the profiler plugin (GPU-timed period steps).
#[test]
fn congestion_async_with_the_profiler_plugin() {
    congestion_scenario(Timing::AsyncPlugin);
}

fn congestion_scenario(mode: Timing) {
    let _g = serial();
    let dir = setup();
    let mut s = Servers::new(1, UP_MTU, Some(Shape::mbit(UP_MBIT, 16, 1024))).expect("servers");
    let rate = s.shape.as_ref().expect("shape").agent_rate();
    let rates: BTreeMap<String, String> = [(rail_dev(0), rate)].into_iter().collect();
    for k in 0..2 {
        // Not yet at the shipped defaults: there the other job's bytes in the median step came
        // out 10.0 % under its burst in 1 of 4 runs (a CI rehearsal: 240380 vs 267211 bytes,
        // bound ±10 %; the other runs 246–264 kB).
        let cfg = agent_config_10ms(s.ns(k), dir.path(), k, None, &rates, false);
        s.start_agent(k, dir.path(), &cfg).expect("agent");
    }
    let inp = run_phase(&s, dir.path(), "in", 0, UP_PERIOD_IN_US, mode);
    let out = run_phase(&s, dir.path(), "out", UP_OFFSET_MS, UP_PERIOD_OUT_US, mode);
    assert_phase(&inp, 0.0, "in phase");
    assert_phase(&out, UP_OFFSET_MS as f64 * 1e-3, "out of phase");
    let alone = UP_BYTES as f64 * 8.0 / (UP_MBIT as f64 * 1e6);

    for j in 0..2 {
        for k in 0..2 {
            let r = k as u32;
            // Ground truth from the job's own clock (both ranks on one CLOCK_MONOTONIC): per
            // step, rank r's transfer once both ranks were ready, and how late its peer was
            // (on the GPU when the calls only enqueue).
            let (t_in, t_out) = (truth_2rank(&inp.jobs[j].0, r, mode), truth_2rank(&out.jobs[j].0, r, mode));
            let med = |t: &BTreeMap<u64, (f64, f64)>| median(t.iter().filter(|(id, _)| **id >= 1).map(|(_, v)| v.0).collect());
            let (x_in, x_out) = (med(&t_in), med(&t_out));
            assert!(
                within(x_out, alone, 0.15),
                "job {} rank {r}: out of phase the transfer should have the link alone ({:.1} ms at 10 Mbit/s) but took {:.1} ms: the jobs drifted into phase",
                j + 1,
                alone * 1e3,
                x_out * 1e3
            );
            // … in every step, not only in the median: a stall of the transport itself (the
            // test library's acks once waited behind the rank's next transfer, 38-100 ms) is
            // not the other job's doing and must not hide in this run's baseline (seen since:
            // every step within 4 ms of the median).
            for (id, (x, _)) in t_out.iter().filter(|(id, _)| **id >= 1) {
                assert!(
                    *x <= x_out + 0.1 * alone,
                    "job {} rank {r} step {id}: out of phase the transfer took {:.1} ms, the run's median {:.1} ms: a stall of the transport",
                    j + 1,
                    x * 1e3,
                    x_out * 1e3
                );
            }
            let excess = x_in - x_out;
            assert!(
                excess > 0.5 * alone,
                "job {} rank {r}: sharing the uplink should cost about a second burst: {:.1} ms in phase vs {:.1} ms out of phase",
                j + 1,
                x_in * 1e3,
                x_out * 1e3
            );

            for (phase, run, truth) in [("in", &inp, &t_in), ("out", &out, &t_out)] {
                let steps = &run.jobs[j].1[k];
                let what = format!("{phase} phase, job {} server {k} ({mode:?})", j + 1);
                assert!(steps.iter().all(|st| st["timing"] == mode.step_timing()), "{what}: timed by {}: {}", mode.step_timing(), summarize(steps));
                // Each period step is this job's: compute and the step's length are the
                // workload's (a step holds only its own communicator's collectives).
                for st in steps {
                    let id = st["step"].as_u64().expect("id");
                    let l = run.jobs[j].0.rank(r).into_iter().find(|l| l.step == id).unwrap_or_else(|| panic!("{what}: no workload step {id}"));
                    let c = cause_seconds(st, "compute");
                    assert!(
                        within(c, l.compute_us * 1e-6, 0.05),
                        "{what} step {id}: compute {:.1} ms vs the workload's {:.1} ms\n{}",
                        c * 1e3,
                        l.compute_us / 1e3,
                        summarize(std::slice::from_ref(st))
                    );
                }
                // A peer on the other server that arrived late is readiness skew this host's
                // agent cannot see (it has one rank of the job): it is in `unexplained`, and
                // nothing else is.
                let resid: Vec<f64> = steps
                    .iter()
                    .map(|st| cause_seconds(st, "unexplained") - truth.get(&st["step"].as_u64().expect("id")).map(|v| v.1).unwrap_or(0.0))
                    .collect();
                if phase == "out" {
                    // Nothing was injected: nothing beyond the peer's lateness is unexplained.
                    let med_step = median(steps.iter().map(secs).collect());
                    let m = median(resid.iter().map(|x| x.abs()).collect());
                    assert!(
                        m <= MEDIAN_FALSE * med_step,
                        "{what}: unexplained beyond the peer's lateness {:.1} ms in the median step (threshold {} % of {:.1} ms)\n{}",
                        m * 1e3,
                        MEDIAN_FALSE * 100.0,
                        med_step * 1e3,
                        summarize(steps)
                    );
                    let dist = disturbance(&run.jobs[j].0, &[r]);
                    for (st, x) in steps.iter().zip(&resid) {
                        let extra = st["step"].as_u64().and_then(|id| dist.get(&id)).copied().unwrap_or(0.0);
                        assert!(
                            x.abs() <= (STEP_FALSE * secs(st)).max(STEP_FALSE_FLOOR) + extra,
                            "{what} step {}: unexplained beyond the peer's lateness {:.1} ms",
                            st["step"],
                            x * 1e3
                        );
                    }
                }
                if phase == "in" {
                    // Top cause, with `unexplained` counted beyond the peer's lateness: in at
                    // least three steps of four (a step stalled by the loaded 2-core machine can
                    // leave more queueing of our own completions unexplained than the other
                    // job's burst explains), and in the median.
                    let mut top = 0usize;
                    let (mut cs, mut rs) = (Vec::new(), Vec::new());
                    for (st, x) in steps.iter().zip(&resid) {
                        let c = cause_seconds(st, "congestion");
                        let rival = ["readiness_skew", "rail_imbalance", "in_flight_limit"].iter().map(|k| cause_seconds(st, k)).fold(x.abs(), f64::max);
                        top += (c > rival) as usize;
                        cs.push(c);
                        rs.push(rival);
                    }
                    assert!(4 * top >= 3 * steps.len() && median(cs.clone()) > median(rs.clone()), "{what}: congestion top cause in {top} of {} steps (median {:.1} ms vs largest other {:.1} ms; peer lateness taken out of unexplained)\n{}", steps.len(), median(cs) * 1e3, median(rs) * 1e3, summarize(steps));
                    for st in steps.iter() {
                        let ev = &cause(st, "congestion")["evidence"];
                        assert!(ev["max_queue_backlog_bytes"].as_f64().is_some_and(|b| b > 0.0), "{what}: qdisc backlog in the evidence: {ev}");
                        assert_eq!(ev["nic"], "rail0", "{ev}");
                    }
                    let (burst, burst_s) = other_burst(&out, k);
                    let other = median(steps.iter().map(|st| cause(st, "congestion")["evidence"]["other_traffic_bytes"].as_f64().unwrap_or(0.0)).collect());
                    // ±10 %: the jobs are paced in phase, so the whole of the other burst
                    // overlaps each step (seen: 254-264 of 266 KB). Unpaced, the phases drifted
                    // on a loaded machine and only part of it did (204 of 266 KB at load 9).
                    assert!(
                        within(other, burst, 0.10),
                        "{what}: other traffic {other:.0} bytes in the median step vs the other job's {burst:.0}-byte burst (ip -s link)"
                    );
                    let got = median(steps.iter().map(|st| cause_seconds(st, "congestion")).collect());
                    // All of the excess is accounted for: congestion plus what stays
                    // unexplained beyond the peer's lateness (queueing of our completions
                    // behind the other job's bytes, which the congestion model does not count).
                    let accounted = median(steps.iter().zip(&resid).map(|(st, x)| cause_seconds(st, "congestion") + x).collect());
                    eprintln!(
                        "congestion/{what}: congestion {:.1} ms (median step) vs the other job's burst at the TBF rate {:.1} ms; congestion + residual {:.1} ms vs injected excess {:.1} ms (transfer in phase {:.1} − out of phase {:.1}); other traffic {other:.0} B",
                        got * 1e3,
                        burst_s * 1e3,
                        accounted * 1e3,
                        excess * 1e3,
                        x_in * 1e3,
                        x_out * 1e3
                    );
                    // Congestion on its own is what was injected, ±15 % (issue 13): the other
                    // job's burst on the shared uplink at the TBF rate (ip -s link). The job's
                    // own excess (in phase − out of phase, two separate runs) can differ from
                    // it: what the transport itself adds stays unexplained and is checked with
                    // congestion below. (CI once saw 266.6 ms against a 213.0 ms burst and later
                    // out-of-phase all-reduces of 238-290 ms instead of 200: the test library's
                    // acks held back by TCP autocorking behind the rank's next data, fixed in
                    // its transport; the TBF's 1 MiB queue drops nothing here.)
                    assert!(
                        within(got, burst_s, 0.15),
                        "{what}: congestion {:.1} ms (median step) vs the injected burst at 10 Mbit/s {:.1} ms (the job's own excess: in phase {:.1} ms − out of phase {:.1} ms = {:.1} ms)",
                        got * 1e3,
                        burst_s * 1e3,
                        x_in * 1e3,
                        x_out * 1e3,
                        excess * 1e3
                    );
                    assert!(within(accounted, excess, 0.15), "{what}: congestion + residual unexplained {:.1} ms (median step) vs injected excess {:.1} ms (transfer in phase {:.1} ms − out of phase {:.1} ms)", accounted * 1e3, excess * 1e3, x_in * 1e3, x_out * 1e3);
                    assert_no_false_causes(steps, &["congestion", "unexplained"], &what, &disturbance(&run.jobs[j].0, &[r]));
                } else {
                    eprintln!("congestion/{what}: congestion max {:.1} ms", steps.iter().map(|st| cause_seconds(st, "congestion")).fold(0.0, f64::max) * 1e3);
                    for st in steps {
                        let c = cause_seconds(st, "congestion");
                        assert!(c <= 0.02 * secs(st), "{what} step {}: congestion {:.1} ms (threshold 2 % of the step)", st["step"], c * 1e3);
                    }
                    assert_no_false_causes(steps, &["unexplained"], &what, &disturbance(&run.jobs[j].0, &[r]));
                }
            }
        }
    }
    congestion_in_cluster_mode(&s, &out, mode);
}

/// The pacing held (the scenario's premise, from the workloads' own clock): in every step
/// each rank of job 2 issued its all-reduce `offset` seconds after the same rank of job 1,
/// within 20 ms.
fn assert_phase(run: &PhaseRun, offset: f64, what: &str) {
    for r in 0..2u32 {
        for l2 in run.jobs[1].0.rank(r) {
            let l1 = run.jobs[0].0.rank(r).into_iter().find(|l| l.step == l2.step).unwrap_or_else(|| panic!("{what}: job 1 rank {r} has no step {}", l2.step));
            let d = (l2.arrive_us - l1.arrive_us) * 1e-6;
            assert!(
                (d - offset).abs() <= 0.020,
                "{what}: rank {r} step {}: job 2 issued its all-reduce {:.1} ms after job 1 (paced for {:.1} ms)",
                l2.step,
                d * 1e3,
                offset * 1e3
            );
        }
    }
}

/// The other job's burst on server `k`'s uplink: bytes on the wire, from `ip -s link` (wire
/// bytes per payload byte, measured out of phase), and seconds at the TBF rate.
fn other_burst(out: &PhaseRun, k: usize) -> (f64, f64) {
    let wire = out.tx[k] / (2.0 * UP_STEPS as f64 * UP_BYTES as f64);
    let burst = UP_BYTES as f64 * wire;
    (burst, burst / (UP_MBIT as f64 * 1e6 / 8.0))
}

/// `agent diagnose --peers` over both servers (issue 13: the e2e scenarios in cluster mode):
/// the slowest steps are the in-phase ones, congestion is their top cause and, like each
/// server's agent, one burst of the other job at the TBF rate (±15 %). Each host's uplink
/// carries one burst of the other job; the ring waits for one of them, so the evidence's other
/// traffic is one burst too, not the two hosts' sum.
fn congestion_in_cluster_mode(s: &Servers, out: &PhaseRun, mode: Timing) {
    let rep = diagnose_peers(s, 8, "10m");
    let steps = rep["steps"].as_array().expect("steps");
    let what = format!("congestion, diagnose --peers ({mode:?})");
    assert_eq!(steps.len(), 8, "{what}: {rep}");
    let (b0, b1) = (other_burst(out, 0), other_burst(out, 1));
    let (burst, burst_s) = ((b0.0 + b1.0) / 2.0, (b0.1 + b1.1) / 2.0);
    let cong: Vec<f64> = steps.iter().map(|st| cause_seconds(st, "congestion")).collect();
    let other: Vec<f64> = steps.iter().map(|st| cause(st, "congestion")["evidence"]["other_traffic_bytes"].as_f64().unwrap_or(0.0)).collect();
    eprintln!(
        "congestion/{what}: congestion {:?} ms vs the burst {:.1} ms; other traffic {other:?} B vs {burst:.0} B\n{}",
        cong.iter().map(|c| (c * 1e4).round() / 10.0).collect::<Vec<_>>(),
        burst_s * 1e3,
        summarize(steps)
    );
    for st in steps {
        assert_eq!(st["ranks"].as_array().map(Vec::len), Some(2), "{what}: both ranks joined: {}", st["ranks"]);
    }
    let top = steps.iter().filter(|st| st["top_cause"] == "congestion").count();
    assert!(4 * top >= 3 * steps.len(), "{what}: congestion top cause in {top} of {} steps", steps.len());
    let other_med = median(other);
    assert!(
        within(other_med, burst, 0.10),
        "{what}: other traffic {other_med:.0} bytes in the median step vs one burst of {burst:.0} bytes (each host carried one)"
    );
    let got = median(cong);
    assert!(within(got, burst_s, 0.15), "{what}: congestion {:.1} ms (median step) vs the injected burst {:.1} ms", got * 1e3, burst_s * 1e3);
}

/// Per step of a 2-rank job, for rank `r`: (its transfer from the later of the two arrivals
/// to its exit, how long after `r` its peer arrived), seconds, from the workload's own clock.
/// An arrival is the call when calls block, the all-reduce kernel's begin on the (simulated)
/// GPU when they only enqueue (what the GPU-timed steps see).
fn truth_2rank(o: &JobOutput, r: u32, mode: Timing) -> BTreeMap<u64, (f64, f64)> {
    let peer = 1 - r;
    let arrive = |l: &workloads::StepLine| match mode {
        Timing::Blocking => l.arrive_us,
        Timing::AsyncPlugin => l.kernel_us.unwrap_or_else(|| panic!("rank {} step {}: no kernel_us", l.rank, l.step)),
    };
    o.rank(r)
        .into_iter()
        .filter_map(|l| {
            let p = o.rank(peer).into_iter().find(|p| p.step == l.step)?;
            let exit = l.arrive_us + l.allreduce_us;
            let ready = arrive(l).max(arrive(p));
            Some((l.step, ((exit - ready) * 1e-6, (arrive(p) - arrive(l)).max(0.0) * 1e-6)))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// In-flight limit: one link shaped to 200 Mbit/s (25 MB/s, MTU 9000, 64 KiB burst, 4 MiB
// queue), modelled round trip NCCL_ABI_RTT_US=2000, 16 KiB chunks, 2 MiB all-reduce (each
// rank sends 2 MiB: 84 ms at the link's rate). Window 1: one chunk per ≈ 2 ms round trip
// ≈ 8 MB/s (≈ 270 ms); window 16: 16 chunks per round trip, the link's 25 MB/s.

const IF_MBIT: u32 = 200;
const IF_BYTES: u64 = 2 * 1024 * 1024;
const IF_STEPS: u64 = 8;
const IF_CHUNK: u64 = 16 * 1024;
const IF_RTT_US: u64 = 2000;

/// The exported in-flight sums of one agent, send side, and its rail's transmitted bytes:
/// blocking, the sampled requests (`stepwise_net_request_*`, over the sampled seconds);
/// with the plugin, the proxy's (`stepwise_proxy_request*`, every request, over wall time).
#[derive(Clone, Copy, Debug, Default)]
struct NetSums {
    occupancy: f64,
    sampled: f64,
    bytes: f64,
    count: f64,
    rail_tx: f64,
    /// Blocking: bytes of the requests labelled with the rail's NIC (the process's link).
    on_rail: f64,
}

/// Every series of `name` whose labels include `labels`, summed.
fn total(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    stepwise_tests::harness::samples(text, name).iter().filter(|(l, _)| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))).map(|(_, v)| v).sum()
}

impl NetSums {
    fn scrape(s: &Servers, k: usize, mode: Timing) -> NetSums {
        let m = s.get(&s.agents[k].addr, "/metrics").map(|r| r.body).unwrap_or_default();
        let send = [("direction", "send")];
        let rail = rail_dev(0);
        let rail_tx = total(&m, "stepwise_netdev_transmit_bytes_total", &[("netdev", &rail)]);
        match mode {
            Timing::Blocking => NetSums {
                occupancy: total(&m, "stepwise_net_request_occupancy_seconds_total", &send),
                sampled: total(&m, "stepwise_net_sampled_seconds_total", &[]),
                bytes: total(&m, "stepwise_net_request_bytes_total", &send),
                count: total(&m, "stepwise_net_request_seconds_count", &send),
                rail_tx,
                on_rail: total(&m, "stepwise_net_request_bytes_total", &[("direction", "send"), ("nic", &rail)]),
            },
            Timing::AsyncPlugin => NetSums {
                occupancy: total(&m, "stepwise_proxy_request_occupancy_seconds_total", &send),
                sampled: now(),
                bytes: total(&m, "stepwise_proxy_request_bytes_total", &send),
                count: total(&m, "stepwise_proxy_requests_total", &send),
                rail_tx,
                on_rail: 0.0,
            },
        }
    }
    fn minus(self, b: &NetSums) -> NetSums {
        NetSums {
            occupancy: self.occupancy - b.occupancy,
            sampled: self.sampled - b.sampled,
            bytes: self.bytes - b.bytes,
            count: self.count - b.count,
            rail_tx: self.rail_tx - b.rail_tx,
            on_rail: self.on_rail - b.on_rail,
        }
    }
}

/// Little's law from `/metrics` alone, over each job: m = the chunk, T ≥ the round trip, the
/// requests' bytes are what the rail carried, and window 16 keeps many times the requests of
/// window 1 in flight.
fn check_exported_in_flight(exported: &BTreeMap<u32, Vec<NetSums>>, mode: Timing) {
    for (k, (&w1, &w16)) in exported[&1].iter().zip(&exported[&16]).enumerate() {
        for (w, d) in [(1, w1), (16, w16)] {
            if mode == Timing::Blocking {
                // The requests carry no device: the NIC is the process's link (its socket on
                // the rail), known from shortly after its first collective returned.
                assert!(d.on_rail > 0.5 * d.bytes, "window {w} server {k}: the sampled requests are labelled with the rail's NIC: {d:?}");
            }
            let (n, m, t) = (d.occupancy / d.sampled, d.bytes / d.count, d.occupancy / d.count);
            eprintln!(
                "exported in flight, window {w} server {k}: N {n:.2}, m {m:.0} B, T {:.2} ms, N·m/T {:.2} MB/s over {:.2} s sampled; requests {:.2} MB vs rail tx {:.2} MB",
                t * 1e3,
                n * m / t / 1e6,
                d.sampled,
                d.bytes / 1e6,
                d.rail_tx / 1e6
            );
            assert!(d.count > 0.0 && d.sampled > 0.0, "window {w} server {k}: requests exported ({mode:?}): {d:?}");
            assert!(within(m, IF_CHUNK as f64, 0.01), "window {w} server {k}: m = the {IF_CHUNK}-byte chunk: {d:?}");
            assert!(t >= IF_RTT_US as f64 * 1e-6, "window {w} server {k}: T ≥ the {IF_RTT_US} µs round trip: {d:?}");
            assert!(within(d.bytes, d.rail_tx, 0.15), "window {w} server {k}: the requests' bytes are the rail's (Little's law, N·m/T × time): {d:?}");
        }
        let (n1, n16) = (w1.occupancy / w1.sampled, w16.occupancy / w16.sampled);
        assert!(n1 <= 1.05, "window 1 server {k}: at most one request in flight on average, N = {n1:.2}");
        assert!(n16 > 4.0 * n1, "window 16 server {k}: N {n16:.2} should be many times window 1's {n1:.2}");
    }
}

#[test]
fn in_flight_window_of_one_is_the_in_flight_limit_sixteen_is_not() {
    in_flight_scenario(Timing::Blocking);
}

/// The same in NCCL's asynchronous mode with the profiler plugin: the collectives are timed
/// on the (simulated) GPU, and N, m, T come from every proxy step, per communicator.
#[test]
fn in_flight_async_with_the_profiler_plugin_is_measured_from_the_proxy_steps() {
    in_flight_scenario(Timing::AsyncPlugin);
}

fn in_flight_scenario(mode: Timing) {
    let _g = serial();
    let dir = setup();
    let mut s = Servers::new(1, 9000, Some(Shape::mbit(IF_MBIT, 64, 4096))).expect("servers");
    let rate = s.shape.as_ref().expect("shape").agent_rate();
    let rates: BTreeMap<String, String> = [(rail_dev(0), rate)].into_iter().collect();
    for k in 0..2 {
        let cfg = agent_config(s.ns(k), dir.path(), k, None, &rates, true);
        s.start_agent(k, dir.path(), &cfg).expect("agent");
    }
    // The sampled transport probes are attached once, shortly after start: attaching a uprobe
    // can block the agent's probe thread in the kernel for seconds (perf_uprobe_init, seen in
    // D state for ~2 s while the other agent attached), and events of a job that exits
    // meanwhile are lost. A short warm-up job until both agents report sampled requests keeps
    // that out of the measured runs.
    let warm = args(&[("--steps", "3".into()), ("--bytes", "262144".into()), ("--compute-us", "10000".into())]);
    let end = Instant::now() + Duration::from_secs(30);
    for n in 0.. {
        two_rank_job(&s, dir.path(), &format!("warm{n}"), &[], &warm).wait(Duration::from_secs(30)).expect("warm-up job");
        let sampled = |k: usize| {
            s.get(&s.agents[k].addr, "/metrics").ok().and_then(|r| stepwise_tests::harness::sample(&r.body, "stepwise_net_requests_total", &[])).unwrap_or(0.0)
        };
        if sampled(0) > 0.0 && sampled(1) > 0.0 {
            break;
        }
        assert!(
            Instant::now() < end,
            "the agents never reported sampled transport requests (stepwise_net_requests_total):\n{}\n{}",
            s.agents[0].proc.log_text(),
            s.agents[1].proc.log_text()
        );
    }
    let a = args(&[("--steps", IF_STEPS.to_string()), ("--bytes", IF_BYTES.to_string()), ("--compute-us", "50000".into())]);
    let mut runs = BTreeMap::new();
    let mut exported = BTreeMap::new();
    for window in [1u32, 16] {
        let extra = mode.env();
        let mut env = vec![("NCCL_ABI_RTT_US", IF_RTT_US.to_string()), ("NCCL_ABI_WINDOW", window.to_string()), ("NCCL_ABI_CHUNK", IF_CHUNK.to_string())];
        env.extend(extra.iter().map(|(k, v)| (k.as_str(), v.clone())));
        let before: Vec<NetSums> = (0..2).map(|k| NetSums::scrape(&s, k, mode)).collect();
        let t0 = now();
        let o = two_rank_job(&s, dir.path(), &format!("w{window}"), &env, &a).wait(Duration::from_secs(60)).expect("job");
        let t1 = now();
        exported.insert(window, (0..2).map(|k| NetSums::scrape(&s, k, mode).minus(&before[k])).collect::<Vec<_>>());
        let per: Vec<Vec<Value>> = (0..2).map(|k| steps_between(&s, k, t0, t1, IF_STEPS as usize - 1)).collect();
        if verbose() {
            for (k, st) in per.iter().enumerate() {
                eprintln!(
                    "window {window} server {k}: all-reduce {:?} ms\n{}",
                    o.rank(k as u32).iter().map(|l| (l.allreduce_us / 1e3).round()).collect::<Vec<_>>(),
                    summarize(st)
                );
            }
        }
        runs.insert(window, (o, per));
    }
    check_exported_in_flight(&exported, mode);
    let ar = |o: &JobOutput| median(o.lines.iter().filter(|l| l.step >= 1).map(|l| l.allreduce_us * 1e-6).collect());
    let (a1, a16) = (ar(&runs[&1].0), ar(&runs[&16].0));
    let excess = a1 - a16;
    assert!(excess > 0.03, "window 1 should be much slower than 16: {:.1} ms vs {:.1} ms", a1 * 1e3, a16 * 1e3);
    for k in 0..2 {
        let steps = &runs[&1].1[k];
        assert_eq!(steps.len(), IF_STEPS as usize - 1, "window 1 server {k}:\n{}", summarize(steps));
        scenarios::assert_parts_sum(steps);
        for st in steps {
            let (top, _) = top_problem(st);
            assert_eq!(top, "in_flight_limit", "window 1 server {k} step {}: top cause\n{}", st["step"], summarize(std::slice::from_ref(st)));
            let ev = &cause(st, "in_flight_limit")["evidence"];
            let (source, timing) = (if mode == Timing::Blocking { "sampled_requests" } else { "nccl_proxy_steps" }, mode.step_timing());
            assert_eq!(ev["source"], source, "window 1 server {k}: N, m, T measured by {source}: {ev}");
            assert_eq!(st["timing"], timing, "window 1 server {k}: timed by {timing}: {}", st["timing"]);
            let n = ev["in_flight_requests"].as_f64().unwrap_or(0.0);
            assert!((0.7..=1.3).contains(&n), "window 1: N ≈ 1 request in flight: {ev}");
            assert!(ev["request_bytes"].as_f64().is_some_and(|m| within(m, IF_CHUNK as f64, 0.01)), "window 1: m = the {IF_CHUNK}-byte chunk: {ev}");
            // T is at least the round trip; N·m/T is the rate the workload itself achieved.
            let t = ev["slot_occupancy_seconds"].as_f64().unwrap_or(0.0);
            assert!(t >= IF_RTT_US as f64 * 1e-6, "window 1: T ≥ the {IF_RTT_US} µs round trip: {ev}");
            let bound = ev["window_bound_bytes_per_second"].as_f64().unwrap_or(0.0);
            let id = st["step"].as_u64().expect("id");
            let own = runs[&1].0.rank(k as u32).iter().find(|l| l.step == id).map(|l| l.allreduce_us * 1e-6).expect("the workload's step");
            assert!(
                within(bound, IF_BYTES as f64 / own, 0.15),
                "window 1 server {k} step {id}: N·m/T = {:.2} MB/s vs the workload's {:.2} MB/s ({IF_BYTES} bytes in {:.1} ms): {ev}",
                bound / 1e6,
                IF_BYTES as f64 / own / 1e6,
                own * 1e3
            );
        }
        let got = median(steps.iter().map(|st| cause_seconds(st, "in_flight_limit")).collect());
        let ev = &cause(&steps[steps.len() / 2], "in_flight_limit")["evidence"];
        eprintln!("in-flight server {k}: in_flight_limit {:.1} ms (median step) vs injected excess {:.1} ms (all-reduce window 1 {:.1} − window 16 {:.1}); N {:.2}, m {} B, T {:.2} ms", got * 1e3, excess * 1e3, a1 * 1e3, a16 * 1e3, ev["in_flight_requests"].as_f64().unwrap_or(0.0), ev["request_bytes"], ev["slot_occupancy_seconds"].as_f64().unwrap_or(0.0) * 1e3);
        assert!(
            within(got, excess, 0.15),
            "window 1 server {k}: in_flight_limit {:.1} ms (median step) vs injected excess {:.1} ms (all-reduce at window 1 {:.1} ms − at 16 {:.1} ms)",
            got * 1e3,
            excess * 1e3,
            a1 * 1e3,
            a16 * 1e3
        );
        assert_no_false_causes(steps, &["in_flight_limit"], &format!("window 1 server {k}"), &disturbance(&runs[&1].0, &[k as u32]));

        let steps = &runs[&16].1[k];
        assert_eq!(steps.len(), IF_STEPS as usize - 1, "window 16 server {k}:\n{}", summarize(steps));
        eprintln!(
            "in-flight server {k} window 16: median step {:.1} ms, in_flight_limit {:.1} ms, unexplained {:.1} ms; workload all-reduce {:.1} ms vs the link's {:.1} ms",
            median(steps.iter().map(secs).collect()) * 1e3,
            median(steps.iter().map(|st| cause_seconds(st, "in_flight_limit")).collect()) * 1e3,
            median(steps.iter().map(|st| cause_seconds(st, "unexplained")).collect()) * 1e3,
            a16 * 1e3,
            IF_BYTES as f64 / (IF_MBIT as f64 * 1e6 / 8.0) * 1e3
        );
        assert_no_false_causes(steps, &[], &format!("window 16 server {k}"), &disturbance(&runs[&16].0, &[k as u32]));
    }
    in_flight_in_cluster_mode(&s, excess, mode);
}

/// `agent diagnose --peers` over both servers (issue 13: the e2e scenarios in cluster mode):
/// the slowest steps are window 1's, with the in-flight limit their top cause, measured by the
/// same source as each server's agent and as large as the workload's own excess (±15 %).
fn in_flight_in_cluster_mode(s: &Servers, excess: f64, mode: Timing) {
    let n = IF_STEPS as usize - 1;
    let rep = diagnose_peers(s, n, "10m");
    let steps = rep["steps"].as_array().expect("steps");
    let what = format!("in flight, diagnose --peers ({mode:?})");
    assert_eq!(steps.len(), n, "{what}: {rep}");
    let got: Vec<f64> = steps.iter().map(|st| cause_seconds(st, "in_flight_limit")).collect();
    eprintln!(
        "in-flight/{what}: in_flight_limit {:?} ms vs the workload's excess {:.1} ms\n{}",
        got.iter().map(|c| (c * 1e4).round() / 10.0).collect::<Vec<_>>(),
        excess * 1e3,
        summarize(steps)
    );
    let source = if mode == Timing::Blocking { "sampled_requests" } else { "nccl_proxy_steps" };
    for st in steps {
        assert_eq!(st["ranks"].as_array().map(Vec::len), Some(2), "{what}: both ranks joined: {}", st["ranks"]);
        assert_eq!(top_problem(st).0, "in_flight_limit", "{what}: {}", summarize(std::slice::from_ref(st)));
        assert_eq!(cause(st, "in_flight_limit")["evidence"]["source"], source, "{what}: measured by {source}");
    }
    let med = median(got);
    assert!(within(med, excess, 0.15), "{what}: in_flight_limit {:.1} ms (median step) vs the workload's excess {:.1} ms", med * 1e3, excess * 1e3);
}

/// The in-flight scenario's window-1 job under the probes' real sampling: 200 ms windows,
/// here every second (the default period is 10 s; a second puts about nine windows in the
/// job). Once a window closes, its links keep firing for a 100 ms drain (so the requests in
/// flight complete under observation) before they are detached: requests posted then, and
/// any whose completion is first seen later, are counted apart
/// (`stepwise_net_requests_unsampled_total`), so N from `/metrics` is still at most one; and a
/// step that a window covered in part is measured over that part — N ≈ 1, N·m/T the
/// workload's own rate — as with the probes attached throughout.
#[test]
fn in_flight_in_short_sampled_windows_is_measured_over_the_windows() {
    let _g = serial();
    let dir = setup();
    let mut s = Servers::new(1, 9000, Some(Shape::mbit(IF_MBIT, 64, 4096))).expect("servers");
    let rates: BTreeMap<String, String> = [(rail_dev(0), s.shape.as_ref().expect("shape").agent_rate())].into_iter().collect();
    for k in 0..2 {
        let cfg = agent_config(s.ns(k), dir.path(), k, None, &rates, true);
        let windowed = cfg.replace("sample_every = \"100ms\"\nsample_window = \"10m\"", "sample_every = \"1s\"\nsample_window = \"200ms\"");
        assert_ne!(cfg, windowed, "agent_config's sampling settings moved");
        s.start_agent(k, dir.path(), &windowed).expect("agent");
    }
    let steps_n = 30u64;
    let a = args(&[("--steps", steps_n.to_string()), ("--bytes", IF_BYTES.to_string()), ("--compute-us", "50000".into())]);
    let env = [("NCCL_ABI_RTT_US", IF_RTT_US.to_string()), ("NCCL_ABI_WINDOW", "1".to_string()), ("NCCL_ABI_CHUNK", IF_CHUNK.to_string())];
    let metric = |k: usize, name: &str, labels: &[(&str, &str)]| total(&s.get(&s.agents[k].addr, "/metrics").map(|r| r.body).unwrap_or_default(), name, labels);
    let unsampled = |k: usize| metric(k, "stepwise_net_requests_unsampled_total", &[]);
    let recv = |k: usize| metric(k, "stepwise_net_request_occupancy_seconds_total", &[("direction", "recv")]);
    let before: Vec<(NetSums, f64, f64)> = (0..2).map(|k| (NetSums::scrape(&s, k, Timing::Blocking), unsampled(k), recv(k))).collect();
    let t0 = now();
    let o = two_rank_job(&s, dir.path(), "sampled", &env, &a).wait(Duration::from_secs(90)).expect("job");
    let t1 = now();
    for (k, (sums0, unsampled0, recv0)) in before.iter().enumerate() {
        let d = NetSums::scrape(&s, k, Timing::Blocking).minus(sums0);
        let (n, torn) = (d.occupancy / d.sampled, unsampled(k) - unsampled0);
        let n_recv = (recv(k) - recv0) / d.sampled;
        let steps = steps_between(&s, k, t0, t1, steps_n as usize - 1);
        let measured: Vec<&Value> = steps.iter().filter(|st| cause(st, "in_flight_limit")["evidence"]["source"] == "sampled_requests").collect();
        eprintln!(
            "sampled windows, server {k}: N {n:.2} (receives {n_recv:.2}) over {:.2} s sampled ({} requests; {torn} seen in teardowns, not counted); {} of {} steps measured by sampled requests, N {:?}, share sampled {:?}",
            d.sampled,
            d.count,
            measured.len(),
            steps.len(),
            measured.iter().map(|st| cause(st, "in_flight_limit")["evidence"]["in_flight_requests"].as_f64().unwrap_or(0.0)).collect::<Vec<_>>(),
            measured.iter().map(|st| cause(st, "in_flight_limit")["evidence"]["share_of_transfer_sampled"].as_f64().unwrap_or(0.0)).collect::<Vec<_>>()
        );
        assert!(d.count > 0.0 && d.sampled > 0.4, "server {k}: windows sampled requests: {d:?}");
        assert!(torn > 0.0, "server {k}: requests seen while the windows' links were torn down are counted apart");
        // At most one: the sampled seconds also hold windows in the job's start-up and compute.
        assert!((0.2..=1.05).contains(&n), "server {k}: window 1 keeps at most one request in flight: N = {n:.2} ({d:?})");
        // Requests of the drain, had they counted, raised the receive side's N from ≈ 0.8 to
        // 1.88; with the links closed at once and no drain, requests whose completion was
        // first seen in the next window raised N to 1.68 (a CI rehearsal).
        assert!(n_recv <= 1.05, "server {k}: window 1 receives one chunk at a time: N = {n_recv:.2} over {:.2} s sampled", d.sampled);
        assert!(measured.len() >= 3, "server {k}: steps that a window covered measure N from the sampled requests:\n{}", summarize(&steps));
        let mut compared = 0;
        for st in measured {
            let ev = &cause(st, "in_flight_limit")["evidence"];
            let n = ev["in_flight_requests"].as_f64().unwrap_or(0.0);
            assert!((0.7..=1.3).contains(&n), "server {k} step {}: N ≈ 1 over the sampled part of the transfer: {ev}", st["step"]);
            let id = st["step"].as_u64().expect("id");
            // T is a mean over the sampled requests: from the 5 of a window's last 5 % of a
            // transfer it was 2.73 ms against the usual 2.2 (one CI run), so the rate is
            // compared where a window saw at least 20 of the transfer's 128 requests.
            if ev["requests_sampled"].as_u64().unwrap_or(0) < 20 {
                continue;
            }
            compared += 1;
            let own = o.rank(k as u32).iter().find(|l| l.step == id).map(|l| l.allreduce_us * 1e-6).expect("the workload's step");
            let bound = ev["window_bound_bytes_per_second"].as_f64().unwrap_or(0.0);
            assert!(
                within(bound, IF_BYTES as f64 / own, 0.15),
                "server {k} step {id}: N·m/T {:.2} MB/s vs the workload's {:.2} MB/s: {ev}",
                bound / 1e6,
                IF_BYTES as f64 / own / 1e6
            );
        }
        assert!(compared >= 2, "server {k}: at least two steps had 20 sampled requests or more:\n{}", summarize(&steps));
    }
}

// ---------------------------------------------------------------------------------------
// Healthy: the rails setup, hierarchical, nothing injected; 1 MiB all-reduce (256 KiB per
// rail ≈ 210 ms at 10 Mbit/s), 50 ms compute.

#[test]
fn healthy_hierarchical_job_is_compute_and_ideal_communication() {
    let _g = serial();
    let dir = setup();
    let s = rails_servers(dir.path());
    let steps_n = 6;
    let (out, t0, t1, tx) = run_rails_job(&s, dir.path(), ("hierarchical", "healthy"), 4 * RAIL_BYTES, steps_n, Timing::Blocking);
    let rate = s.shape.as_ref().expect("shape").bytes_per_second;
    let mut ideals = Vec::new();
    for (k, tx_k) in tx.iter().enumerate() {
        let all = steps_between(&s, k, t0, t1, steps_n as usize);
        if verbose() {
            eprintln!("healthy server {k}:\n{}", summarize(&all));
        }
        assert_eq!(all.len(), steps_n as usize, "server {k}:\n{}", summarize(&all));
        scenarios::assert_parts_sum(&all);
        // Steady state: step 0 also carries the connections' first use (slow start).
        let steps: Vec<Value> = all.into_iter().filter(|st| st["step"].as_u64() != Some(0)).collect();
        // Whatever arrival skew the workload itself had is reported as such (and is small).
        let truth = local_skew(&out, k, Timing::Blocking);
        check_skew(&steps, &truth, &format!("healthy server {k}"));
        eprintln!(
            "healthy server {k}: median step {:.1} ms; median readiness_skew {:.1}, rail_imbalance {:.1}, in_flight_limit {:.1}, congestion {:.1}, unexplained {:.1} ms",
            median(steps.iter().map(secs).collect()) * 1e3,
            median(steps.iter().map(|st| cause_seconds(st, "readiness_skew")).collect()) * 1e3,
            median(steps.iter().map(|st| cause_seconds(st, "rail_imbalance")).collect()) * 1e3,
            median(steps.iter().map(|st| cause_seconds(st, "in_flight_limit")).collect()) * 1e3,
            median(steps.iter().map(|st| cause_seconds(st, "congestion")).collect()) * 1e3,
            median(steps.iter().map(|st| cause_seconds(st, "unexplained")).collect()) * 1e3
        );
        let ranks: Vec<u32> = (4 * k as u32..4 * k as u32 + 4).collect();
        assert_no_false_causes(&steps, &["unexplained"], &format!("healthy server {k}"), &disturbance(&out, &ranks));
        // What stays unexplained is the time the workload itself lost beyond the ideal (the
        // intra-server phases, and CPU contention from unrelated work on this machine): per
        // step, its transfer from the last local arrival to the last local exit minus the
        // rails' bytes (ip -s link) balanced at the TBF rate.
        let ideal_c = tx_k.iter().sum::<f64>() / steps_n as f64 / 4.0 / rate;
        ideals.push(ideal_c);
        let loss = workload_loss(&out, &ranks, steps_n, ideal_c);
        let ideal = median(steps.iter().map(|st| cause_seconds(st, "ideal_comm")).collect());
        assert!(
            within(ideal, ideal_c, 0.15),
            "healthy server {k}: ideal_comm {:.1} ms vs the rails' bytes balanced at the TBF rate {:.1} ms",
            ideal * 1e3,
            ideal_c * 1e3
        );
        assert_unexplained_is_loss(&steps, &loss, &format!("healthy server {k}"));
        // Compute and ideal communication are what the workload and the counters say.
        let want = median(out.lines.iter().filter(|l| l.rank / 4 == k as u32 && l.step > 0).map(|l| l.compute_us * 1e-6).collect());
        let got = median(steps.iter().map(|st| cause_seconds(st, "compute")).collect());
        assert!(within(got, want, 0.15), "healthy server {k}: compute {:.1} ms vs the workload's {:.1} ms", got * 1e3, want * 1e3);
    }

    // Cluster mode, the same pipeline over both agents' answers: the 8 ranks joined, and no
    // cause but compute, ideal communication and unexplained above the thresholds (the remote
    // ranks' lateness, unexplained on one host, is readiness skew once joined); unexplained is
    // the job's own loss beyond the ideal, as on each server.
    let rep = diagnose_peers(&s, 10, "5m");
    let dsteps: Vec<Value> = rep["steps"].as_array().expect("steps").iter().filter(|st| st["step"].as_u64() != Some(0)).cloned().collect();
    eprintln!("healthy/diagnose --peers:\n{}", summarize(&dsteps));
    assert!(dsteps.len() >= steps_n as usize - 2, "diagnose --peers: {} steps\n{rep}", dsteps.len());
    for st in &dsteps {
        assert_eq!(st["ranks"].as_array().map(Vec::len), Some(8), "diagnose joins the 8 ranks of both servers: {}", st["ranks"]);
    }
    scenarios::assert_parts_sum(&dsteps);
    let all: Vec<u32> = (0..8).collect();
    // The servers are namespaces of one machine, so the wall-clock skew of the joined ranks
    // is exact and must be the job's own (the cause itself may be the clock-free estimate
    // when adjtimex reports the clock unsynchronised, as on this machine).
    let truth = workloads::true_skew_seconds(&out.lines);
    for st in &dsteps {
        let id = st["step"].as_u64().expect("id");
        let (want, got) = (truth.get(&id).map_or(0.0, |t| t.0), st["skew"]["wall_seconds"].as_f64().expect("wall skew"));
        assert!(
            (got - want).abs() <= (0.15 * want).max(1e-3),
            "diagnose --peers step {id}: wall-clock skew of the 8 ranks {:.2} ms vs the job's own {:.2} ms",
            got * 1e3,
            want * 1e3
        );
    }
    assert_no_false_causes(&dsteps, &["unexplained"], "healthy, diagnose --peers", &disturbance(&out, &all));
    // Unexplained, once both servers are joined, is what the whole job lost beyond the ideal
    // (from its last arrival to its last exit), as on each server.
    let loss = workload_loss(&out, &all, steps_n, median(ideals));
    assert_unexplained_is_loss(&dsteps, &loss, "healthy, diagnose --peers");
}

/// Per step (after step 0), what the workload's `ranks` lost beyond `ideal` seconds of
/// communication: from their last arrival to their last exit, by the job's own clock.
fn workload_loss(out: &JobOutput, ranks: &[u32], steps_n: u64, ideal: f64) -> BTreeMap<u64, f64> {
    (1..steps_n)
        .filter_map(|id| {
            let ls: Vec<_> = out.lines.iter().filter(|l| ranks.contains(&l.rank) && l.step == id).collect();
            let arrive = ls.iter().map(|l| l.arrive_us).fold(f64::NEG_INFINITY, f64::max);
            let exit = ls.iter().map(|l| l.arrive_us + l.allreduce_us).fold(f64::NEG_INFINITY, f64::max);
            (!ls.is_empty()).then_some((id, (exit - arrive) * 1e-6 - ideal))
        })
        .collect()
}

/// The steps' unexplained seconds match the workload's own `loss` beyond the ideal: within
/// MEDIAN_FALSE of the median step (median over steps) and STEP_FALSE of each step.
fn assert_unexplained_is_loss(steps: &[Value], loss: &BTreeMap<u64, f64>, what: &str) {
    let diff: Vec<f64> =
        steps.iter().map(|st| cause_seconds(st, "unexplained") - loss.get(&st["step"].as_u64().expect("id")).copied().unwrap_or(0.0)).collect();
    let med_step = median(steps.iter().map(secs).collect());
    let m = median(diff.iter().map(|x| x.abs()).collect());
    eprintln!(
        "{what}: unexplained vs the workload's own loss beyond the ideal: {:.1} ms in the median step (loss {:?} ms)",
        m * 1e3,
        loss.values().map(|x| (x * 1e4).round() / 10.0).collect::<Vec<_>>()
    );
    assert!(
        m <= MEDIAN_FALSE * med_step,
        "{what}: unexplained differs from the workload's own loss beyond the ideal by {:.1} ms in the median step (threshold {} % of {:.1} ms)\n{}",
        m * 1e3,
        MEDIAN_FALSE * 100.0,
        med_step * 1e3,
        summarize(steps)
    );
    for (st, x) in steps.iter().zip(&diff) {
        assert!(
            x.abs() <= (STEP_FALSE * secs(st)).max(STEP_FALSE_FLOOR),
            "{what} step {}: unexplained differs from the workload's own loss by {:.1} ms",
            st["step"],
            x * 1e3
        );
    }
}
