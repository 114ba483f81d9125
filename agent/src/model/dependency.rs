//! Dependency and critical-path model (docs/models.md §3): what is on the critical path.

use serde::Serialize;

use super::collective::{allreduce, Algo, Cluster};
use super::{at_least, ceil_robust, non_negative, positive, ModelError};
use crate::units::{Bytes, BytesPerSecond, Seconds};

// ---------------------------------------------------------------------------------------
// §3.1 A step is a DAG: finish = max(finish of predecessors) + own duration.

#[derive(Clone, Debug, Default)]
pub struct Dag {
    names: Vec<String>,
    durations: Vec<Seconds>,
    preds: Vec<Vec<usize>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Schedule {
    pub start: Vec<Seconds>,
    pub finish: Vec<Seconds>,
    pub makespan: Seconds,
    /// Node names along the longest chain, first to last.
    pub critical_path: Vec<String>,
}

impl Dag {
    pub fn new() -> Dag {
        Dag::default()
    }
    /// Adds a node and returns its index.
    pub fn node(&mut self, name: impl Into<String>, duration: Seconds) -> usize {
        self.names.push(name.into());
        self.durations.push(duration);
        self.preds.push(Vec::new());
        self.names.len() - 1
    }
    /// `to` cannot start before `from` finishes (an ordering or a shared resource).
    pub fn edge(&mut self, from: usize, to: usize) {
        self.preds[to].push(from);
    }

    pub fn schedule(&self) -> Result<Schedule, ModelError> {
        let n = self.names.len();
        for d in &self.durations {
            non_negative("node duration", d.0)?;
        }
        let mut indeg: Vec<usize> = self.preds.iter().map(Vec::len).collect();
        let mut succ = vec![Vec::new(); n];
        for (to, ps) in self.preds.iter().enumerate() {
            for &from in ps {
                succ[from].push(to);
            }
        }
        let mut ready: Vec<usize> = (0..n).filter(|&i| indeg[i] == 0).collect();
        let mut start = vec![Seconds(0.0); n];
        let mut finish = vec![Seconds(0.0); n];
        let mut via: Vec<Option<usize>> = vec![None; n];
        let mut done = 0;
        while let Some(i) = ready.pop() {
            done += 1;
            for &p in &self.preds[i] {
                if via[i].is_none() || finish[p].0 > start[i].0 {
                    via[i] = Some(p);
                    start[i] = finish[p];
                }
            }
            finish[i] = start[i] + self.durations[i];
            for &s in &succ[i] {
                indeg[s] -= 1;
                if indeg[s] == 0 {
                    ready.push(s);
                }
            }
        }
        if done < n {
            let stuck = (0..n).find(|&i| indeg[i] > 0).unwrap_or(0);
            return Err(ModelError::Cycle { node: self.names[stuck].clone() });
        }
        let last = (0..n).max_by(|&a, &b| finish[a].0.total_cmp(&finish[b].0).then(b.cmp(&a)));
        let mut critical_path = Vec::new();
        let mut cur = last;
        while let Some(i) = cur {
            critical_path.push(self.names[i].clone());
            cur = via[i];
        }
        critical_path.reverse();
        let makespan = last.map_or(Seconds(0.0), |i| finish[i]);
        Ok(Schedule { start, finish, makespan, critical_path })
    }
}

// ---------------------------------------------------------------------------------------
// §3.2 Readiness skew: a collective starts when its last participant is ready.

#[derive(Clone, Debug, Serialize)]
pub struct SkewReport {
    pub done: Seconds,
    /// The rank everybody waited for.
    pub last_rank: usize,
    /// How long each rank waits inside the collective call before data moves.
    pub waits: Vec<Seconds>,
    pub skew: Seconds,
    pub done_with_half_exchange: Seconds,
    pub done_without_skew: Seconds,
    pub critical_path: Vec<String>,
}

/// Most ranks `skew` takes (one DAG node and one table row each).
pub const MAX_SKEW_RANKS: usize = 1 << 16;

pub fn skew(ready: &[Seconds], exchange: Seconds) -> Result<SkewReport, ModelError> {
    at_least("ranks", ready.len(), 1)?;
    // One DAG node and one printed row per rank: 2^20 ranks took 10.6 s and printed 35 MB.
    super::at_most("ranks (ready times)", ready.len(), MAX_SKEW_RANKS)?;
    non_negative("exchange time", exchange.0)?;
    let run = |ready: &[Seconds], exchange: Seconds| -> Result<Schedule, ModelError> {
        let mut g = Dag::new();
        let x = g.node("exchange", exchange);
        for (i, &r) in ready.iter().enumerate() {
            let n = g.node(format!("rank {i} ready"), r);
            g.edge(n, x);
        }
        g.schedule()
    };
    let s = run(ready, exchange)?;
    let latest = ready.iter().copied().fold(Seconds(0.0), Seconds::max);
    let earliest = ready.iter().copied().fold(Seconds(f64::INFINITY), Seconds::min);
    let last_rank = ready.iter().rposition(|&r| r == latest).unwrap_or(0);
    Ok(SkewReport {
        done: s.makespan,
        last_rank,
        waits: ready.iter().map(|&r| latest - r).collect(),
        skew: latest - earliest,
        done_with_half_exchange: run(ready, exchange / 2.0)?.makespan,
        done_without_skew: run(&vec![earliest; ready.len()], exchange)?.makespan,
        critical_path: s.critical_path,
    })
}

// ---------------------------------------------------------------------------------------
// §3.3 Step time with overlap.

/// Serial: `T_c + T_n + T_u`.
pub fn step_serial(tc: Seconds, tn: Seconds, tu: Seconds) -> Seconds {
    tc + tn + tu
}

/// With overlap: `max(T_c, t_r + T_n) + T_u` (the DAG compute ∥ (ready → comm) → update).
pub fn step_overlap(tc: Seconds, tr: Seconds, tn: Seconds, tu: Seconds) -> Seconds {
    tc.max(tr + tn) + tu
}

/// Speed-up of the whole when communication gets `s`× faster: `(T_c+T_n)/(T_c+T_n/s)`.
pub fn amdahl(tc: Seconds, tn: Seconds, s: f64) -> Result<f64, ModelError> {
    positive("communication speed-up", s)?;
    Ok((tc + tn) / (tc + tn / s))
}

#[derive(Clone, Debug, Serialize)]
pub struct StepInput {
    pub compute: Seconds,
    pub update: Seconds,
    /// Gradient ready time for the overlapped scenarios.
    pub ready: Seconds,
    pub cluster: Cluster,
    pub bytes: Bytes,
    /// In-flight limit per NIC: slots × payload per occupancy time (§2.2).
    pub slots: u64,
    pub payload: Bytes,
    pub occupancy: Seconds,
}

impl StepInput {
    /// §3.3: T_c = 20 ms, T_u = 2 ms, t_r = 17 ms, 192 MiB on the HGX pair, 128 × 256 B per 2 µs.
    pub fn chapter() -> StepInput {
        StepInput {
            compute: Seconds::ms(20.0),
            update: Seconds::ms(2.0),
            ready: Seconds::ms(17.0),
            cluster: Cluster::hgx(),
            bytes: Bytes::mib(192.0),
            slots: 128,
            payload: Bytes(256.0),
            occupancy: Seconds::us(2.0),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct StepScenario {
    pub name: String,
    pub comm: Seconds,
    /// `None` = serial.
    pub ready: Option<Seconds>,
    pub step: Seconds,
}

#[derive(Clone, Debug, Serialize)]
pub struct StepReport {
    pub scenarios: Vec<StepScenario>,
    /// `T_c − T_n(hierarchical)`: the latest readiness that still hides all communication.
    pub latest_hidden_ready: Seconds,
    /// Flat ring time / hierarchical time.
    pub comm_speedup: f64,
    /// Whole-step speed-up from that, serial (Amdahl).
    pub amdahl: f64,
    pub limited_nic: BytesPerSecond,
}

pub fn step(input: &StepInput) -> Result<StepReport, ModelError> {
    positive("compute time", input.compute.0)?;
    non_negative("update time", input.update.0)?;
    non_negative("ready time", input.ready.0)?;
    at_least("slots", input.slots as usize, 1)?;
    positive("payload", input.payload.0)?;
    positive("occupancy time", input.occupancy.0)?;
    let c = &input.cluster;
    let (tc, tu, tr) = (input.compute, input.update, input.ready);
    let flat = allreduce(c, input.bytes, Algo::Ring)?.total;
    let hier = allreduce(c, input.bytes, Algo::Hierarchical)?.total;
    let limited_nic = c.nic.min(input.payload * input.slots as f64 / input.occupancy);
    let limited = allreduce(&Cluster { nic: limited_nic, ..c.clone() }, input.bytes, Algo::Hierarchical)?.total;
    let one_nic = allreduce(&Cluster { ports_per_host: 1, ..c.clone() }, input.bytes, Algo::Hierarchical)?.total;
    let serial = |name: String, tn: Seconds| StepScenario { name, comm: tn, ready: None, step: step_serial(tc, tn, tu) };
    let overlap = |name: String, tn: Seconds| StepScenario { name, comm: tn, ready: Some(tr), step: step_overlap(tc, tr, tn, tu) };
    let scenarios = vec![
        serial("serial, flat ring".into(), flat),
        serial("serial, hierarchical".into(), hier),
        serial(format!("serial, hierarchical, {} in-flight {} requests per NIC ({limited_nic})", input.slots, input.payload), limited),
        overlap(format!("flat ring starting at {tr}"), flat),
        overlap(format!("hierarchical starting at {tr}"), hier),
        overlap(format!("hierarchical starting at {tr}, one NIC left"), one_nic),
    ];
    let comm_speedup = flat / hier;
    Ok(StepReport { scenarios, latest_hidden_ready: tc - hier, comm_speedup, amdahl: amdahl(tc, flat, comm_speedup)?, limited_nic })
}

// ---------------------------------------------------------------------------------------
// §3.4 Tail.

/// Quantile `q` of `N` samples: element `⌈qN⌉` (1-based) of the sorted list.
pub fn quantile(sorted: &[Seconds], q: f64) -> Result<Seconds, ModelError> {
    at_least("samples", sorted.len(), 1)?;
    if !(q > 0.0 && q <= 1.0) {
        return Err(ModelError::OutOfRange { what: "quantile", lo: 0.0, hi: 1.0, value: q });
    }
    let k = (ceil_robust(q * sorted.len() as f64) as usize).clamp(1, sorted.len());
    Ok(sorted[k - 1])
}

#[derive(Clone, Debug, Serialize)]
pub struct TailReport {
    pub samples: usize,
    pub mean: Seconds,
    pub p50: Seconds,
    pub p99: Seconds,
    pub max: Seconds,
}

pub fn tail(samples: &[Seconds]) -> Result<TailReport, ModelError> {
    at_least("samples", samples.len(), 1)?;
    for s in samples {
        non_negative("sample", s.0)?;
    }
    let mut v = samples.to_vec();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(TailReport {
        samples: v.len(),
        mean: v.iter().copied().sum::<Seconds>() / v.len() as f64,
        p50: quantile(&v, 0.5)?,
        p99: quantile(&v, 0.99)?,
        max: v[v.len() - 1],
    })
}

// ---------------------------------------------------------------------------------------
// §3.5 Small vs large messages.

/// Ring AllReduce on `p` ranks: `2(p−1)α + 2(p−1)/p · M/B` (8 ranks: `14α + 1.75 M/B`).
pub fn ring_allreduce_time(p: usize, alpha: Seconds, m: Bytes, b: BytesPerSecond) -> Result<Seconds, ModelError> {
    at_least("ranks", p, 1)?;
    positive("bandwidth", b.0)?;
    non_negative("α", alpha.0)?;
    non_negative("bytes", m.0)?;
    let k = 2.0 * (p - 1) as f64;
    Ok(alpha * k + m * (k / p as f64) / b)
}

/// Size at which the latency and bandwidth terms are equal: `M = p·α·B`.
pub fn small_message_crossover(p: usize, alpha: Seconds, b: BytesPerSecond) -> Bytes {
    b * alpha * p as f64
}

#[derive(Clone, Debug, Serialize)]
pub struct SmallMsgRow {
    pub bytes: Bytes,
    pub time: Seconds,
    /// With the bandwidth multiplied by the speed-up.
    pub time_faster_link: Seconds,
    pub latency_share: f64,
    /// `count` such reductions.
    pub total: Seconds,
    /// What cutting α to the lower value saves over `count` reductions.
    pub alpha_saving: Seconds,
}

pub fn small_messages(
    p: usize,
    alpha: Seconds,
    b: BytesPerSecond,
    sizes: &[Bytes],
    speedup: f64,
    count: usize,
    lower_alpha: Seconds,
) -> Result<Vec<SmallMsgRow>, ModelError> {
    positive("bandwidth speed-up", speedup)?;
    sizes
        .iter()
        .map(|&m| {
            let time = ring_allreduce_time(p, alpha, m, b)?;
            let lat = alpha * (2.0 * (p - 1) as f64);
            Ok(SmallMsgRow {
                bytes: m,
                time,
                time_faster_link: ring_allreduce_time(p, alpha, m, b * speedup)?,
                latency_share: if time.0 > 0.0 { lat / time } else { 0.0 },
                total: time * count as f64,
                alpha_saving: (time - ring_allreduce_time(p, lower_alpha, m, b)?) * count as f64,
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// §3.6 Checkpoint/restart.

/// `ε ≈ C/I + λ(I/2 + R)`.
pub fn checkpoint_overhead(c: Seconds, i: Seconds, lambda_per_s: f64, r: Seconds) -> Result<f64, ModelError> {
    positive("checkpoint interval", i.0)?;
    non_negative("checkpoint pause", c.0)?;
    non_negative("interruption rate", lambda_per_s)?;
    non_negative("recovery time", r.0)?;
    Ok(c / i + lambda_per_s * (i.0 / 2.0 + r.0))
}

/// `Θ_eff = Θ/(1+ε)`.
pub fn effective_throughput(theta: f64, eps: f64) -> f64 {
    theta / (1.0 + eps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testutil::{close, digit};

    fn ms(x: f64) -> Seconds {
        Seconds::ms(x)
    }

    #[test]
    fn check_readiness_skew() {
        // §3.2 [check]: ready at 0, 0, 0, 2 ms, exchange 0.4 ms: done at 2.4 ms; halving the
        // exchange: 2.2 ms; all ready at 0: 0.4 ms.
        let r = skew(&[ms(0.0), ms(0.0), ms(0.0), ms(2.0)], ms(0.4)).unwrap();
        close(r.done.in_ms(), 2.4, 1e-12, "done");
        close(r.done_with_half_exchange.in_ms(), 2.2, 1e-12, "half exchange");
        close(r.done_without_skew.in_ms(), 0.4, 1e-12, "no skew");
        assert_eq!(r.last_rank, 3);
        assert_eq!(r.critical_path, vec!["rank 3 ready".to_string(), "exchange".to_string()]);
        close(r.waits[0].in_ms(), 2.0, 1e-12, "rank 0 waits");
    }

    #[test]
    fn check_step_timelines() {
        // §3.3 [check]: serial flat 29.6; serial hierarchical 23.3; limited in-flight 24.3;
        // flat at 17 ms 26.6; hierarchical at 17 ms 22.0 (latest hidden t_r ≈ 18.7);
        // hierarchical at 17 ms with one NIC left 23.8 (all ms).
        let r = step(&StepInput::chapter()).unwrap();
        let want = [29.6, 23.3, 24.3, 26.6, 22.0, 23.8];
        for (s, w) in r.scenarios.iter().zip(want) {
            digit(s.step.in_ms(), w, 0.1, &s.name);
        }
        digit(r.latest_hidden_ready.in_ms(), 18.7, 0.1, "latest hidden t_r");
        digit(r.limited_nic.in_gb_s(), 16.4, 0.1, "in-flight limited NIC");
        assert!(r.amdahl > 1.0 && r.amdahl < r.comm_speedup);
    }

    #[test]
    fn dag_matches_overlap_formula() {
        let (tc, tr, tn, tu) = (ms(20.0), ms(17.0), ms(7.5), ms(2.0));
        let mut g = Dag::new();
        let c = g.node("compute", tc);
        let ready = g.node("gradient ready", tr);
        let n = g.node("allreduce", tn);
        let u = g.node("update", tu);
        g.edge(ready, n);
        g.edge(c, u);
        g.edge(n, u);
        let s = g.schedule().unwrap();
        close(s.makespan.0, step_overlap(tc, tr, tn, tu).0, 1e-12, "DAG");
        assert_eq!(s.critical_path, vec!["gradient ready", "allreduce", "update"]);
        let mut cyc = Dag::new();
        let a = cyc.node("a", ms(1.0));
        let b = cyc.node("b", ms(1.0));
        cyc.edge(a, b);
        cyc.edge(b, a);
        assert!(matches!(cyc.schedule(), Err(ModelError::Cycle { .. })));
    }

    #[test]
    fn check_tail() {
        // §3.4 [check]: mean ≈ 0.52 ms, p99 2.4 ms; halving normal time: p99 2.2 ms; two
        // recoveries: p99 10.4 ms.
        let mut v = vec![ms(0.4); 98];
        v.extend([ms(2.4), ms(10.4)]);
        let r = tail(&v).unwrap();
        digit(r.mean.in_ms(), 0.52, 0.01, "mean");
        close(r.p99.in_ms(), 2.4, 1e-12, "p99");
        let mut v = vec![ms(0.2); 98];
        v.extend([ms(2.2), ms(10.2)]);
        close(tail(&v).unwrap().p99.in_ms(), 2.2, 1e-12, "halved");
        let mut v = vec![ms(0.4); 97];
        v.extend([ms(2.4), ms(10.4), ms(10.4)]);
        close(tail(&v).unwrap().p99.in_ms(), 10.4, 1e-12, "two recoveries");
    }

    #[test]
    fn check_small_messages() {
        // §3.5 [check]: α = 5 µs: crossover 2 MB; 8 MiB: 364 → 168 µs at 3× bandwidth; 8 KiB:
        // 70.3 → 70.1 µs; 72 such ≈ 5.1 ms; α → 2 µs saves ≈ 3.0 ms.
        let (a, b) = (Seconds::us(5.0), BytesPerSecond::gb_s(50.0));
        close(small_message_crossover(8, a, b).0, 2e6, 1e-12, "crossover");
        let rows = small_messages(8, a, b, &[Bytes::mib(8.0), Bytes::kib(8.0)], 3.0, 72, Seconds::us(2.0)).unwrap();
        digit(rows[0].time.in_us(), 364.0, 1.0, "8 MiB");
        digit(rows[0].time_faster_link.in_us(), 168.0, 1.0, "8 MiB at 3×");
        digit(rows[1].time.in_us(), 70.3, 0.1, "8 KiB");
        digit(rows[1].time_faster_link.in_us(), 70.1, 0.1, "8 KiB at 3×");
        digit(rows[1].total.in_ms(), 5.1, 0.1, "72 reductions");
        digit(rows[1].alpha_saving.in_ms(), 3.0, 0.1, "α saving");
    }

    #[test]
    fn checkpoint_formula() {
        let eps = checkpoint_overhead(Seconds(10.0), Seconds(600.0), 0.0, Seconds(60.0)).unwrap();
        close(eps, 1.0 / 60.0, 1e-12, "C/I");
        close(effective_throughput(100.0, 0.25), 80.0, 1e-12, "Θ_eff");
        assert!(checkpoint_overhead(Seconds(10.0), Seconds(0.0), 0.0, Seconds(0.0)).is_err());
    }
}
