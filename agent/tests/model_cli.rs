//! `agent model … --json` reproduces every **[check]** value of docs/models.md through the built
//! binary, and bad input exits 2 with a clear message on stderr.

mod common;
use common::agent_command;

use serde_json::Value;

const MIB: f64 = 1024.0 * 1024.0;
const KIB: f64 = 1024.0;

fn agent(args: &[&str]) -> (i32, String, String) {
    let out = agent_command().arg("model").args(args).output().expect("run agent");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `agent model <args> --json`, parsed.
fn json(args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    let (rc, out, err) = agent(&a);
    assert_eq!(rc, 0, "agent model {args:?} failed: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("agent model {args:?}: bad JSON ({e}): {out}"))
}

fn num(v: &Value, path: &str) -> f64 {
    let mut cur = v;
    for key in path.split('.') {
        cur = match key.parse::<usize>() {
            Ok(i) => &cur[i],
            Err(_) => &cur[key],
        };
    }
    cur.as_f64().unwrap_or_else(|| panic!("{path} is not a number in {v}"))
}

/// Within ±`ulp` of the value the book prints (its last digit).
#[track_caller]
fn digit(got: f64, book: f64, ulp: f64, what: &str) {
    assert!((got - book).abs() <= ulp * 1.000_001, "{what}: got {got}, book prints {book} (±{ulp})");
}

#[track_caller]
fn exact(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() <= 1e-9 * want.abs().max(1.0), "{what}: got {got}, want {want}");
}

#[test]
fn path_relay() {
    // §1.2: 1.125 GiB at 50 / 100 / 150 GB/s downstream ≈ 24.2 / 12.1 / 8.1 ms.
    let v = json(&["path"]);
    for (i, ms) in [24.2, 12.1, 8.1].into_iter().enumerate() {
        digit(num(&v, &format!("relay.{i}.time")) * 1e3, ms, 0.1, "relay time");
    }
}

#[test]
fn allreduce_placements() {
    // §1.4: 360 MiB per rank, 5760 MiB total, 30 rounds.
    let ring = json(&["allreduce"]);
    exact(num(&ring, "max_rank_bytes") / MIB, 360.0, "per rank");
    exact(num(&ring, "total_bytes") / MIB, 5760.0, "total");
    assert_eq!(ring["rounds"].as_u64(), Some(30));
    // §1.5: flat ≈ 7.6 ms, interleaved ≈ 7.6 ms, hierarchical ≈ 1.3 ms; 720 / 5760 / 384 MiB.
    digit(num(&ring, "total") * 1e3, 7.6, 0.1, "flat");
    exact(num(&ring, "cross_host_bytes") / MIB, 720.0, "flat cross");
    let inter = json(&["allreduce", "--algo", "interleaved"]);
    digit(num(&inter, "total") * 1e3, 7.6, 0.1, "interleaved");
    exact(num(&inter, "cross_host_bytes") / MIB, 5760.0, "interleaved cross");
    let hier = json(&["allreduce", "--algo", "hierarchical"]);
    digit(num(&hier, "total") * 1e3, 1.3, 0.1, "hierarchical");
    exact(num(&hier, "cross_host_bytes") / MIB, 384.0, "hierarchical cross");
    // −47 % cross-server bytes, −83 % time; break-even local bandwidth ≈ 50 GB/s.
    let cmp = json(&["allreduce", "--compare"]);
    let algos = &cmp["algorithms"];
    digit((1.0 - num(algos, "2.cross_host_bytes") / num(algos, "0.cross_host_bytes")) * 100.0, 47.0, 1.0, "bytes saved");
    digit((1.0 - num(algos, "2.total") / num(algos, "0.total")) * 100.0, 83.0, 1.0, "time saved");
    digit(num(&cmp, "break_even_local") / 1e9, 50.0, 1.0, "break-even");
}

#[test]
fn allreduce_pcie_reference_flips() {
    // §1.5: flat ring ≈ 11.0 ms on the PCIe box, hierarchical larger.
    let v = json(&["allreduce", "--compare", "--pcie-reference"]);
    let a = &v["algorithms"];
    digit(num(a, "0.total") * 1e3, 11.0, 0.1, "PCIe flat");
    assert!(num(a, "2.total") > num(a, "0.total"), "hierarchical must lose on the PCIe box");
}

#[test]
fn message_cost() {
    // §1.7: 64 MiB ≈ 1.3 ms; 8 KiB ≈ 5.2 µs (~97 % launch); crossover 250 000 B ≈ 244 KiB.
    let v = json(&["msg"]);
    digit(num(&v, "messages.0.time") * 1e3, 1.3, 0.1, "64 MiB");
    digit(num(&v, "messages.1.time") * 1e6, 5.2, 0.1, "8 KiB");
    digit(num(&v, "messages.1.launch_share") * 100.0, 97.0, 1.0, "launch share");
    exact(num(&v, "crossover"), 250_000.0, "crossover");
    digit(num(&v, "crossover") / KIB, 244.0, 1.0, "crossover KiB");
}

#[test]
fn pipeline() {
    // §1.8: p = 4, m = 8, τ = 1 ms: 11 ms, 73 %; U ≥ 90 % needs m ≥ 27.
    let v = json(&["pipeline"]);
    exact(num(&v, "time") * 1e3, 11.0, "time");
    digit(num(&v, "utilisation") * 100.0, 73.0, 1.0, "U");
    exact(num(&v, "micro_batches_for_target"), 27.0, "m for 90 %");
}

#[test]
fn expert_parallel() {
    // §1.9: 32 MiB each way; one NIC ≥ 0.67 ms; 8 NICs ≈ 0.08 ms; 32 GB/s slot ≥ 1.05 ms.
    let v = json(&["ep"]);
    exact(num(&v, "each_way") / MIB, 32.0, "each way");
    digit(num(&v, "scenarios.0.time") * 1e3, 0.67, 0.01, "one NIC");
    digit(num(&v, "scenarios.1.time") * 1e3, 0.08, 0.01, "8 NICs");
    digit(num(&v, "scenarios.2.time") * 1e3, 1.05, 0.01, "slot");
    let rows: f64 = v["row_sums"].as_array().map_or(0.0, |r| r.iter().filter_map(Value::as_f64).sum());
    exact(rows / MIB, 32.0, "row sums = sent");
}

#[test]
fn rails() {
    // §1.10: aligned pairing: 24 MiB per rail per direction, 0.505 ms; one NIC 4.03 ms.
    let v = json(&["rails"]);
    for i in 0..8 {
        exact(num(&v, &format!("rails.{i}.a_nic_bytes")) / MIB, 24.0, "per rail");
    }
    digit(num(&v, "time") * 1e3, 0.505, 0.001, "aligned");
    let one = json(&["rails", "--failed", "1,2,3,4,5,6,7"]);
    exact(num(&one, "max_nic_bytes") / MIB, 192.0, "one NIC");
    digit(num(&one, "time") * 1e3, 4.03, 0.01, "one NIC time");
    let shifted = json(&["rails", "--shift", "1"]);
    exact(num(&shifted, "spine_bytes") / MIB, 192.0, "shifted pairing crosses the spine");
}

#[test]
fn clos() {
    // §1.11: k = 64: 2048 / 96 / 51.2 TB/s; 3-tier 65 536 / 5120 / 1638.4 TB/s; r = 3:
    // 3072 / 80 / 25.6 TB/s.
    for (args, ep, sw, tbs) in [
        (vec!["clos"], 2048.0, 96.0, 51.2),
        (vec!["clos", "--tiers", "3"], 65_536.0, 5120.0, 1638.4),
        (vec!["clos", "--oversubscription", "48:16"], 3072.0, 80.0, 25.6),
        (vec!["clos", "--oversubscription", "3"], 3072.0, 80.0, 25.6),
    ] {
        let v = json(&args);
        exact(num(&v, "endpoints"), ep, "endpoints");
        exact(num(&v, "switches"), sw, "switches");
        exact(num(&v, "bisection") / 1e12, tbs, "bisection TB/s");
    }
}

#[test]
fn ecmp_distribution() {
    let v = json(&["ecmp", "--flows", "1024", "--uplinks", "64"]);
    let d = v["distribution"].as_array().cloned().unwrap_or_default();
    let sum: f64 = d.iter().map(|p| p["p"].as_f64().unwrap_or(f64::NAN)).sum();
    assert!((sum - 1.0).abs() < 1e-9, "Σp = {sum}");
    let e = num(&v, "expected_max");
    assert!(e > 16.0 && e < 64.0, "E[L_max] = {e}");
    exact(num(&v, "relative_speed"), 16.0 / e, "relative speed");
    // 8 flows on 8 uplinks: the birthday problem, P(no collision) = 8!/8^8.
    let v = json(&["ecmp"]);
    exact(num(&v, "p_no_collision"), 40320.0 / 16_777_216.0, "8!/8^8");
}

#[test]
fn spray_and_reordering() {
    // §1.13: 2 paths, 1 µs: ≈ 1.33 µs (1.66 µs on one); second path 9 µs: ≈ 9.33 µs, 12 KiB.
    digit(num(&json(&["spray"]), "in_order") * 1e6, 1.33, 0.01, "two paths");
    digit(num(&json(&["spray", "--delays", "1us"]), "in_order") * 1e6, 1.66, 0.01, "one path");
    let v = json(&["spray", "--delays", "1us,9us"]);
    digit(num(&v, "in_order") * 1e6, 9.33, 0.01, "9 µs path");
    exact(num(&v, "peak_reorder_bytes") / KIB, 12.0, "buffered");
    assert_eq!(v["choice"]["multipath_wins"], Value::Bool(false));
}

#[test]
fn multipath_loss() {
    // §1.13: loss of packet 0 resent 20 µs after its first send: in order ≈ 21.2 µs, 28 KiB
    // buffered; selective resends 4 KiB, go-back-N 32 KiB.
    let v = json(&["multipath"]);
    digit(num(&v, "selective.in_order") * 1e6, 21.2, 0.1, "selective");
    exact(num(&v, "selective.peak_reorder_bytes") / KIB, 28.0, "buffered");
    exact(num(&v, "selective.resent_bytes") / KIB, 4.0, "selective resend");
    exact(num(&v, "go_back_n.resent_bytes") / KIB, 32.0, "go-back-N resend");
}

#[test]
fn inflight() {
    // §2.1: 100 000 B in flight, N ≥ 391.
    let v = json(&["inflight"]);
    exact(num(&v, "bytes_in_flight"), 100_000.0, "B·T");
    exact(num(&v, "required_slots"), 391.0, "N");
    // §2.2: 128 slots 16.4 GB/s; 1 slot 0.128 GB/s; δ = 18.6 ns ≈ 13.7 GB/s; δ ≤ 5.12 ns;
    // 4 KiB: δ ≤ 82 ns, 25 slots; crossover ≈ 0.93 KB.
    digit(num(&json(&["inflight", "--slots", "128"]), "effective") / 1e9, 16.4, 0.1, "128 slots");
    exact(num(&json(&["inflight", "--slots", "1"]), "effective") / 1e9, 0.128, "1 slot");
    let d = json(&["inflight", "--issue-interval", "18.6ns"]);
    digit(num(&d, "effective") / 1e9, 13.7, 0.1, "issue rate");
    exact(num(&d, "max_issue_interval") * 1e9, 5.12, "δ for 256 B");
    digit(num(&d, "crossover_payload") / 1e3, 0.93, 0.01, "crossover KB");
    assert_eq!(d["binding"], Value::String("issue-rate".into()));
    let big = json(&["inflight", "--payload", "4KiB"]);
    digit(num(&big, "max_issue_interval") * 1e9, 82.0, 1.0, "δ for 4 KiB");
    exact(num(&big, "required_slots"), 25.0, "slots for 4 KiB");
    // A bare number of bytes is a size, as people type an MTU or a buffer.
    assert_eq!(json(&["inflight", "--payload", "256"]), json(&["inflight", "--payload", "256B"]));
    assert_eq!(num(&json(&["incast", "--mtu", "9000"]), "hop_delay"), num(&json(&["incast", "--mtu", "9000B"]), "hop_delay"));
}

#[test]
fn completions() {
    // §2.3: 16 slots: transfers end 20 µs, slots free 80 µs; 8 slots: 48 µs; 200 000 items/s
    // = 1.64 GB/s; 50 GB/s at 8 KiB needs ≈ 6.1 M completions/s.
    let v = json(&["completions"]);
    exact(num(&v, "transfers_end") * 1e6, 20.0, "transfers end");
    exact(num(&v, "slots_free") * 1e6, 80.0, "slots free");
    exact(num(&v, "sustained_items_per_s"), 200_000.0, "items/s");
    digit(num(&v, "sustained_rate") / 1e9, 1.64, 0.01, "sustained");
    digit(num(&v, "completions_needed_per_s") / 1e6, 6.1, 0.1, "completions/s");
    exact(num(&json(&["completions", "--slots", "8"]), "transfers_end") * 1e6, 48.0, "8 slots");
}

#[test]
fn step_timelines() {
    // §3.3: 29.6, 23.3, 24.3, 26.6, 22.0 (latest hidden t_r ≈ 18.7), 23.8 ms.
    let v = json(&["step"]);
    for (i, ms) in [29.6, 23.3, 24.3, 26.6, 22.0, 23.8].into_iter().enumerate() {
        digit(num(&v, &format!("scenarios.{i}.step")) * 1e3, ms, 0.1, "step");
    }
    digit(num(&v, "latest_hidden_ready") * 1e3, 18.7, 0.1, "latest t_r");
}

#[test]
fn readiness_skew() {
    // §3.2: done at 2.4 ms; halving the exchange 2.2 ms; all ready at 0: 0.4 ms.
    let v = json(&["skew"]);
    exact(num(&v, "done") * 1e3, 2.4, "done");
    exact(num(&v, "done_with_half_exchange") * 1e3, 2.2, "half exchange");
    exact(num(&v, "done_without_skew") * 1e3, 0.4, "no skew");
    let v = json(&["skew", "--ready", "0ms,0ms,0ms,0ms"]);
    exact(num(&v, "done") * 1e3, 0.4, "all at 0");
}

#[test]
fn tail() {
    // §3.4: mean ≈ 0.52 ms, p99 2.4 ms; halving normal time 2.2 ms; two recoveries 10.4 ms.
    let v = json(&["tail"]);
    digit(num(&v, "mean") * 1e3, 0.52, 0.01, "mean");
    exact(num(&v, "p99") * 1e3, 2.4, "p99");
    exact(num(&json(&["tail", "--samples", "0.2ms*98,2.2ms,10.2ms"]), "p99") * 1e3, 2.2, "halved");
    exact(num(&json(&["tail", "--samples", "0.4ms*97,2.4ms,10.4ms*2"]), "p99") * 1e3, 10.4, "two recoveries");
}

#[test]
fn small_messages() {
    // §3.5: crossover 2 MB; 8 MiB 364 → 168 µs; 8 KiB 70.3 → 70.1 µs; 72 ≈ 5.1 ms; α → 2 µs
    // saves ≈ 3.0 ms.
    let v = json(&["smallmsg"]);
    exact(num(&v, "crossover"), 2e6, "crossover");
    digit(num(&v, "rows.0.time") * 1e6, 364.0, 1.0, "8 MiB");
    digit(num(&v, "rows.0.time_faster_link") * 1e6, 168.0, 1.0, "8 MiB 3×");
    digit(num(&v, "rows.1.time") * 1e6, 70.3, 0.1, "8 KiB");
    digit(num(&v, "rows.1.time_faster_link") * 1e6, 70.1, 0.1, "8 KiB 3×");
    digit(num(&v, "rows.1.total") * 1e3, 5.1, 0.1, "72 reductions");
    digit(num(&v, "rows.1.alpha_saving") * 1e3, 3.0, 0.1, "α saving");
}

#[test]
fn fluid_queue() {
    // §4.1: mean 20 GB/s (40 %); aligned: 1 GB queued, 20 ms to drain; 5 ms overlap: 250 MB;
    // 512 KiB tolerates ≈ 10.5 µs.
    let v = json(&["queue"]);
    exact(num(&v, "mean_load"), 20e9, "mean");
    exact(num(&v, "utilisation"), 0.4, "utilisation");
    exact(num(&v, "unbounded.peak"), 1e9, "aligned peak");
    exact(num(&v, "drain_after_peak") * 1e3, 20.0, "drain");
    digit(num(&v, "tolerated_overlap") * 1e6, 10.5, 0.1, "tolerated overlap");
    let b = &v["bounded"];
    exact(num(b, "bytes_in"), num(b, "bytes_out") + num(b, "queued") + num(b, "dropped"), "conservation");
    let v = json(&["queue", "--phases", "0ms,15ms"]);
    exact(num(&v, "unbounded.peak"), 250e6, "5 ms overlap");
}

#[test]
fn feedback() {
    // §4.2: full after ≈ 5.2 µs; 1 MB excess, ≈ 738 KB dropped; drain ≈ 52 µs, empty ≈ 72 µs;
    // reducing only to B never drains.
    let v = json(&["feedback"]);
    digit(num(&v, "time_to_full") * 1e6, 5.2, 0.1, "full after");
    exact(num(&v, "excess"), 1e6, "excess");
    digit(num(&v, "dropped") / 1e3, 738.0, 1.0, "dropped KB");
    digit(num(&v, "drain_time") * 1e6, 52.0, 1.0, "drain");
    digit(num(&v, "empty_at") * 1e6, 72.0, 1.0, "empty at");
    let v = json(&["feedback", "--reduced", "50GB/s"]);
    assert_eq!(v["drain_time"], Value::Null, "never drains");
}

#[test]
fn incast() {
    // §4.3: PFC one hop, 30 m and 1500 B → 0.33 µs.
    let v = json(&["incast"]);
    digit(num(&v, "hop_delay") * 1e6, 0.33, 0.01, "t_hop");
    exact(num(&v, "arrival"), 7.0 * 50e9, "λ = (N−1)B");
    exact(num(&v, "pfc_headroom"), 300e9 * num(&v, "hop_delay"), "headroom");
}

#[test]
fn strong_scaling() {
    // §4 item 5: 360 MiB through one 50 GB/s NIC: 7.5 ms; crossover x ≈ 2.6.
    let v = json(&["cut"]);
    digit(num(&v, "time") * 1e3, 7.5, 0.1, "cut");
    digit(num(&v, "crossover"), 2.6, 0.1, "crossover");
}

#[test]
fn scale_sweep() {
    let v = json(&["scale", "--sweep"]);
    let rows = v["rows"].as_array().cloned().unwrap_or_default();
    let s: Vec<f64> = rows.iter().filter_map(|r| r["supernode"].as_f64()).collect();
    assert_eq!(s, vec![8.0, 64.0, 128.0, 256.0]);
    for r in &rows {
        exact(num(r, "step"), num(r, "compute") + num(r, "tp_time") + num(r, "t_grad") + num(r, "optimizer"), "step");
        let tg = num(r, "t_grad_hierarchical").min(num(r, "t_grad_flat"));
        exact(num(r, "t_grad"), tg, "faster chosen");
    }
    // The 1024-GPU job is interrupted every ≈ 7.9 h.
    digit(num(&json(&["scale"]), "job_mtbf") / 3600.0, 7.9, 0.1, "job MTBF");
    let fixed = json(&["scale", "--supernode", "64", "--egress", "400GB/s"]);
    assert_eq!(fixed["grad_algo"], Value::String("flat ring".into()));
}

/// Nanoseconds rounded to `decimals`, to compare with the chapter's printed value exactly.
fn ns_at(seconds: f64, decimals: i32) -> f64 {
    let k = 10f64.powi(decimals);
    (seconds * 1e9 * k).round() / k
}

#[test]
fn access_paths_match_the_stage_table() {
    // docs/models.md §6 stage table at L = 100 ns, unrounded pipeline cycles at 322 MHz, printed
    // to the whole ns: PCIe NIC 2 222, UB async read 746, UB load 419, NIC-internal 1 572.
    let v = json(&["access", "--link-latency", "100ns"]);
    let names: Vec<&str> = v["paths"].as_array().unwrap().iter().map(|p| p["path"].as_str().unwrap()).collect();
    assert_eq!(names, ["pcie-nic", "ub-async", "load", "nic-internal"]);
    for (i, want) in [2222.0, 746.0, 419.0, 1572.0].into_iter().enumerate() {
        assert_eq!(ns_at(num(&v, &format!("paths.{i}.total")), 0), want, "{} total", names[i]);
    }
    // Per-category sums of the PCIe path (ns): software post 50+30+50, PCIe 150+500+500+250+250,
    // NIC pipeline 4 × 27.95, wire 2L, memory and completion 30+70+30.
    let cats = v["paths"][0]["by_category"].as_array().unwrap();
    let got: Vec<(&str, f64)> = cats.iter().map(|c| (c["category"].as_str().unwrap(), ns_at(num(c, "latency"), 2))).collect();
    assert_eq!(
        got,
        [("software-post", 130.0), ("pcie-crossing", 1650.0), ("on-chip-bus", 0.0), ("nic-pipeline", 111.8), ("wire", 200.0), ("memory-and-completion", 130.0)]
    );
    // PCIe crossings are 1650 / 2221.80 ns = 74.3 % of the PCIe path.
    assert_eq!((num(&v, "paths.0.by_category.1.share") * 1000.0).round() / 10.0, 74.3);
    let stages = v["paths"][0]["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 17);
    assert_eq!(stages.iter().filter(|s| s["category"] == "nic-pipeline").count(), 4);
    assert_eq!(stages[4]["cycles"].as_f64(), Some(9.0));
    // Stage-in crossover r* = t_s/(t_r − t_l) at the defaults t_s = 10 µs, t_l = 100 ns.
    for (i, want) in [4.71, 15.49, 31.31, 6.79].into_iter().enumerate() {
        assert_eq!((num(&v, &format!("stage_in.{i}.crossover")) * 100.0).round() / 100.0, want, "{} crossover", names[i]);
        assert_eq!(v["stage_in"][i]["path"], v["paths"][i]["path"]);
    }
    // The text output has the table and the stacked breakdown.
    let (rc, out, _) = agent(&["access"]);
    assert_eq!(rc, 0);
    assert!(out.contains("Stacked by category") && out.contains("1.65 µs (74.3 %)"), "{out}");
}

#[test]
fn access_and_state() {
    let a = json(&["access", "--link-latency", "0ns"]);
    let b = json(&["access", "--link-latency", "1us"]);
    for i in 0..4 {
        exact(num(&b, &format!("paths.{i}.total")) - num(&a, &format!("paths.{i}.total")), 2e-6, "fixed + 2L");
    }
    let s = json(&["state"]);
    assert_eq!(s["rows"].as_array().map(Vec::len), Some(5));
}

/// Issue 33: `--hosts 1024` (the chapter's scale) ran over 30 s and 4.3 GB before answering;
/// the model now costs ranks × phases, not ranks × rounds. The answer must still be the
/// closed form of §1.4 (timing is measured by `cargo xtask bench models`, not asserted here).
#[test]
fn allreduce_at_the_chapters_scale_answers_with_the_closed_form() {
    let v = json(&["allreduce", "--hosts", "1024"]);
    let p = 1024.0 * 8.0;
    assert_eq!(v["rounds"].as_u64(), Some(2 * 8191));
    exact(num(&v, "max_rank_bytes"), 2.0 * (p - 1.0) / p * 192.0 * MIB, "2(p−1)/p · M per rank");
    // One host-boundary edge per host crosses, each way, every round: 2 · 1024 · (p−1) · M/p.
    exact(num(&v, "cross_host_bytes"), 2.0 * 1024.0 * (p - 1.0) * 192.0 * MIB / p, "cross-host bytes");
    // Every round is bound by the NIC of a host's last GPU: (p−1)·2 rounds of α + (M/p)/B.
    let round = 0.833e-6 + 192.0 * MIB / p / 50e9;
    exact(num(&v, "total"), 2.0 * (p - 1.0) * round, "total");
    let groups = v["round_groups"].as_array().expect("round_groups");
    assert_eq!(groups.len(), 2, "reduce-scatter and all-gather: {groups:?}");
    assert_eq!(groups[1]["first"].as_u64(), Some(8191));
    assert_eq!(v["nic_tx_bytes"].as_array().map(Vec::len), Some(8192));
    // All four algorithms and the break-even bisection answer too.
    let cmp = json(&["allreduce", "--hosts", "1024", "--compare"]);
    assert_eq!(cmp["algorithms"].as_array().map(Vec::len), Some(4));
    assert!(num(&cmp, "break_even_local") > 0.0);
    let (rc, out, err) = agent(&["allreduce", "--hosts", "1024"]);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("384 MiB ×1024, 0 B ×7168 (by value"), "per-NIC bytes summarised: {out}");
    assert!(out.len() < 20_000, "the table stays a table at 8192 NICs ({} bytes)", out.len());
}

#[test]
fn every_bare_subcommand_prints_a_table() {
    for sub in [
        "allreduce",
        "path",
        "cut",
        "msg",
        "pipeline",
        "ep",
        "rails",
        "clos",
        "ecmp",
        "spray",
        "multipath",
        "inflight",
        "completions",
        "step",
        "skew",
        "tail",
        "smallmsg",
        "queue",
        "feedback",
        "incast",
        "scale",
        "access",
        "state",
    ] {
        let (rc, out, err) = agent(&[sub]);
        assert_eq!(rc, 0, "agent model {sub}: {err}");
        assert!(out.lines().count() >= 3, "agent model {sub} printed almost nothing: {out}");
    }
}

#[test]
fn bad_input_exits_2_with_a_message() {
    for (args, says) in [
        (vec!["allreduce", "--bytes", "-5MiB"], "cannot be negative"),
        (vec!["allreduce", "--nic", "0GB/s"], "greater than zero"),
        (vec!["msg", "--bandwidth", "0Gbit/s"], "greater than zero"),
        (vec!["msg", "--bytes", "12furlongs"], "unknown size unit 'furlongs'"),
        (vec!["step", "--compute", "20fortnights"], "unknown time unit"),
        (vec!["inflight", "--bandwidth", "50"], "has no unit"),
        (vec!["inflight", "--payload", "256 bytes"], "unknown size unit 'bytes'"),
        (vec!["ecmp", "--flows", "0"], "flows must be at least 1"),
        (vec!["ecmp", "--uplinks", "0"], "uplinks must be at least 1"),
        (vec!["ecmp", "--flows", "-3"], "cannot be negative"),
        (vec!["clos", "--oversubscription", "2"], "cannot be split"),
        (vec!["scale", "--supernode", "12"], "must divide"),
        // Issue 33: every numeric input is bounded, the bound named in the message.
        (vec!["allreduce", "--bytes", "1e30"], "at most 1 PiB"),
        (vec!["allreduce", "--hosts", "100000000000000000000"], "at most 1048576"),
        (vec!["allreduce", "--hosts", "1048577"], "at most 1048576"),
        (vec!["allreduce", "--hosts", "32769"], "ranks (hosts × GPUs per host) must be at most 262144 (got 262152)"),
        (vec!["allreduce", "--gpus-per-host", "2048"], "GPUs per host must be at most 1024"),
        (vec!["allreduce", "--nic", "1e-300GB/s"], "at least 1 bit/s"),
        (vec!["msg", "--bandwidth", "1e20GB/s"], "at most 1 PB/s"),
        (vec!["step", "--compute", "1e20h"], "at most 1000000h"),
        (vec!["ecmp", "--flows", "1025"], "flows must be at most 1024"),
        (vec!["ecmp", "--monte-carlo", "1048576", "--flows", "1024"], "trials × (flows + uplinks) must be at most"),
        (vec!["ep", "--nics", "1048576"], "matrix cells"),
        (vec!["rails", "--gpus-per-host", "1048576"], "GPUs per host must be at most 1024"),
        (vec!["completions", "--ops", "1025"], "operations must be at most 1024"),
        (vec!["skew", "--ready", "1ms*65537"], "ranks (ready times) must be at most 65536"),
        (vec!["queue", "--horizon", "1000h"], "on/off edges"),
        (vec!["smallmsg", "--speedup", "1e300"], "at most 1e6"),
        (vec!["clos", "--oversubscription", "1e300"], "between 1:1e6 and 1e6:1"),
    ] {
        let (rc, out, err) = agent(&args);
        assert_eq!(rc, 2, "agent model {args:?} should exit 2; stdout {out}, stderr {err}");
        assert!(err.contains(says), "agent model {args:?}: stderr should say '{says}', got: {err}");
        assert!(out.is_empty(), "agent model {args:?} printed to stdout: {out}");
    }
}
