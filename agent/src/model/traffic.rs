//! Traffic and resource model, the simple parts (docs/models.md §1.1, §1.2, §1.7, §1.8, §1.9)
//! and strong scaling with a fixed cut (docs/models.md §4, item 5).

use serde::Serialize;

use super::{at_least, ceil_robust, non_negative, positive, ModelError};
use crate::units::{Bytes, BytesPerSecond, Seconds};

// ---------------------------------------------------------------------------------------
// §1.1 Cut lower bound.

/// `T_C = V_C / B_C`: no schedule moves `v` bytes across a cut of bandwidth `b` (one
/// direction) faster than this.
pub fn cut_time(v: Bytes, b: BytesPerSecond) -> Result<Seconds, ModelError> {
    non_negative("bytes crossing the cut", v.0)?;
    positive("cut bandwidth", b.0)?;
    Ok(v / b)
}

/// Ports behind one shared interface (§1.1): each port is bounded by its own bandwidth and
/// the interface by the *sum* of their traffic. Returns the binding time.
pub fn shared_interface_time(port_bytes: &[Bytes], port_bw: BytesPerSecond, interface_bw: BytesPerSecond) -> Result<Seconds, ModelError> {
    positive("port bandwidth", port_bw.0)?;
    positive("interface bandwidth", interface_bw.0)?;
    let per_port = port_bytes.iter().map(|&v| v / port_bw).fold(Seconds(0.0), Seconds::max);
    let total: Bytes = port_bytes.iter().copied().sum();
    Ok(per_port.max(total / interface_bw))
}

// ---------------------------------------------------------------------------------------
// §1.2 Paths.

/// A path between two endpoints built from links (§1.2).
#[derive(Clone, Debug, PartialEq)]
pub enum Path {
    Link(BytesPerSecond),
    /// Segments one after another: the slowest decides (min).
    Serial(Vec<Path>),
    /// Branches side by side: bandwidths add (sum).
    Parallel(Vec<Path>),
    /// An NVLink-like hop to neighbours that then use their own NICs:
    /// `min(hop, Σ neighbours)`.
    Relay {
        hop: Box<Path>,
        neighbours: Vec<Path>,
    },
}

impl Path {
    pub fn bandwidth(&self) -> BytesPerSecond {
        match self {
            Path::Link(b) => *b,
            Path::Serial(v) => v.iter().map(Path::bandwidth).reduce(BytesPerSecond::min).unwrap_or_default(),
            Path::Parallel(v) => v.iter().map(Path::bandwidth).sum(),
            Path::Relay { hop, neighbours } => hop.bandwidth().min(neighbours.iter().map(Path::bandwidth).sum()),
        }
    }
}

/// The relay example of §1.2: own NIC in parallel with a relay over NVLink to neighbour NICs,
/// all in series with the downstream link: `B_eff = min(B_D, direct + min(hop, Σ neighbours))`.
pub fn relay_path(direct: BytesPerSecond, hop: BytesPerSecond, neighbours: &[BytesPerSecond], downstream: BytesPerSecond) -> Path {
    Path::Serial(vec![
        Path::Link(downstream),
        Path::Parallel(vec![
            Path::Link(direct),
            Path::Relay { hop: Box::new(Path::Link(hop)), neighbours: neighbours.iter().map(|&b| Path::Link(b)).collect() },
        ]),
    ])
}

/// One row of the relay table: downstream bandwidth, effective bandwidth, transfer time.
#[derive(Clone, Debug, Serialize)]
pub struct PathRow {
    pub downstream: BytesPerSecond,
    pub effective: BytesPerSecond,
    pub time: Seconds,
}

/// §1.2 relay example over several downstream bandwidths.
pub fn relay_table(
    bytes: Bytes,
    direct: BytesPerSecond,
    hop: BytesPerSecond,
    neighbours: &[BytesPerSecond],
    downstream: &[BytesPerSecond],
) -> Result<Vec<PathRow>, ModelError> {
    non_negative("bytes", bytes.0)?;
    for b in [direct, hop].iter().chain(neighbours).chain(downstream) {
        positive("path bandwidth", b.0)?;
    }
    Ok(downstream
        .iter()
        .map(|&d| {
            let effective = relay_path(direct, hop, neighbours, d).bandwidth();
            PathRow { downstream: d, effective, time: bytes / effective }
        })
        .collect())
}

// ---------------------------------------------------------------------------------------
// §1.7 Message cost.

#[derive(Clone, Debug, Serialize)]
pub struct MessageCost {
    pub bytes: Bytes,
    pub time: Seconds,
    /// Fraction of the time spent in the fixed cost α.
    pub launch_share: f64,
}

/// `T_msg = α + M/B`.
pub fn message_time(alpha: Seconds, m: Bytes, b: BytesPerSecond) -> Result<MessageCost, ModelError> {
    non_negative("α", alpha.0)?;
    non_negative("message size", m.0)?;
    positive("bandwidth", b.0)?;
    let time = alpha + m / b;
    Ok(MessageCost { bytes: m, time, launch_share: if time.0 > 0.0 { alpha / time } else { 0.0 } })
}

/// Size at which launch and transfer cost the same: `M = α·B`.
pub fn message_crossover(alpha: Seconds, b: BytesPerSecond) -> Bytes {
    b * alpha
}

// ---------------------------------------------------------------------------------------
// §1.8 Pipeline.

#[derive(Clone, Debug, Serialize)]
pub struct Pipeline {
    pub stages: usize,
    pub micro_batches: usize,
    pub stage_time: Seconds,
    /// `(m + p − 1) τ`
    pub time: Seconds,
    /// `m / (m + p − 1)`
    pub utilisation: f64,
}

pub fn pipeline(stages: usize, micro_batches: usize, tau: Seconds) -> Result<Pipeline, ModelError> {
    at_least("pipeline stages", stages, 1)?;
    at_least("micro-batches", micro_batches, 1)?;
    positive("stage time", tau.0)?;
    let slots = (micro_batches + stages - 1) as f64;
    Ok(Pipeline { stages, micro_batches, stage_time: tau, time: tau * slots, utilisation: micro_batches as f64 / slots })
}

/// Fewest micro-batches with `m/(m + p − 1) ≥ u`: `m ≥ u(p − 1)/(1 − u)`.
pub fn micro_batches_for(stages: usize, u: f64) -> Result<usize, ModelError> {
    at_least("pipeline stages", stages, 1)?;
    if !(u > 0.0 && u < 1.0) {
        return Err(ModelError::OutOfRange { what: "target utilisation", lo: 0.0, hi: 1.0, value: u });
    }
    Ok((ceil_robust(u * (stages - 1) as f64 / (1.0 - u)) as usize).max(1))
}

// ---------------------------------------------------------------------------------------
// §1.9 Expert-parallel traffic.

/// Bytes each way (dispatch, or combine) for `n` tokens routed to `k` experts, fraction `f`
/// remote, `d` bytes per token copy: `n·k·f·d`. Dispatch + combine is twice that.
pub fn ep_volume_each_way(n: usize, k: usize, f: f64, d: Bytes) -> Result<Bytes, ModelError> {
    at_least("tokens", n, 1)?;
    at_least("experts per token (top-k)", k, 1)?;
    if !(0.0..=1.0).contains(&f) {
        return Err(ModelError::OutOfRange { what: "remote fraction", lo: 0.0, hi: 1.0, value: f });
    }
    positive("bytes per token", d.0)?;
    Ok(d * (n as f64 * k as f64 * f))
}

/// Most cells of a traffic matrix (256 × 256 NICs): `--json` prints every cell.
pub const MAX_MATRIX_CELLS: usize = 1 << 16;

/// A traffic matrix `V_ij` from sending NICs `i` to receiving NICs `j` (§1.9).
#[derive(Clone, Debug, Serialize)]
pub struct TrafficMatrix {
    pub v: Vec<Vec<Bytes>>,
}

impl TrafficMatrix {
    /// `total` spread evenly from `senders` to `receivers`.
    pub fn even(total: Bytes, senders: usize, receivers: usize) -> Result<TrafficMatrix, ModelError> {
        at_least("sending NICs", senders, 1)?;
        at_least("receiving NICs", receivers, 1)?;
        super::at_most("sending × receiving NICs (matrix cells)", senders.saturating_mul(receivers), MAX_MATRIX_CELLS)?;
        let cell = total / (senders * receivers) as f64;
        Ok(TrafficMatrix { v: vec![vec![cell; receivers]; senders] })
    }
    /// Bytes each sender sends.
    pub fn row_sums(&self) -> Vec<Bytes> {
        self.v.iter().map(|r| r.iter().copied().sum()).collect()
    }
    /// Bytes each receiver receives.
    pub fn col_sums(&self) -> Vec<Bytes> {
        let n = self.v.first().map_or(0, Vec::len);
        (0..n).map(|j| self.v.iter().map(|r| r[j]).sum()).collect()
    }
    /// Bytes crossing from the sender set `from` to the receiver set `to`.
    pub fn cut(&self, from: &[usize], to: &[usize]) -> Bytes {
        from.iter().flat_map(|&i| to.iter().map(move |&j| (i, j))).map(|(i, j)| self.v[i][j]).sum()
    }
    pub fn total(&self) -> Bytes {
        self.row_sums().into_iter().sum()
    }
}

/// What limits one traffic matrix: every NIC in both directions, the shared slot(s) and the cut.
#[derive(Clone, Debug, Serialize)]
pub struct MatrixTime {
    pub max_send: Bytes,
    pub max_receive: Bytes,
    pub nic_time: Seconds,
    /// Sending side's shared slot, if any: all rows go through it.
    pub slot_time: Option<Seconds>,
    pub cut_time: Option<Seconds>,
    pub time: Seconds,
    pub bound: &'static str,
}

/// `time = max(load / bandwidth)` over every NIC, the slot and the cut (§1.9).
pub fn matrix_time(m: &TrafficMatrix, nic: BytesPerSecond, slot: Option<BytesPerSecond>, cut: Option<BytesPerSecond>) -> Result<MatrixTime, ModelError> {
    positive("NIC bandwidth", nic.0)?;
    let rows = m.row_sums();
    let cols = m.col_sums();
    let max_send = rows.iter().copied().fold(Bytes(0.0), Bytes::max);
    let max_receive = cols.iter().copied().fold(Bytes(0.0), Bytes::max);
    let nic_time = max_send.max(max_receive) / nic;
    let total = m.total();
    let slot_time = slot.map(|s| positive("slot bandwidth", s.0).map(|_| total / s)).transpose()?;
    let cut_time = cut.map(|c| positive("cut bandwidth", c.0).map(|_| total / c)).transpose()?;
    let mut time = nic_time;
    let mut bound = "NIC";
    for (t, name) in [(slot_time, "slot"), (cut_time, "cut")] {
        if let Some(t) = t {
            if t.0 > time.0 {
                time = t;
                bound = name;
            }
        }
    }
    Ok(MatrixTime { max_send, max_receive, nic_time, slot_time, cut_time, time, bound })
}

// ---------------------------------------------------------------------------------------
// docs/models.md §4 item 5: strong scaling with a fixed cut.

#[derive(Clone, Debug, Serialize)]
pub struct ScalingRow {
    pub factor: f64,
    pub compute: Seconds,
    /// `max(T_compute/x, T_cut)`
    pub overlapped: Seconds,
    /// `T_compute/x + T_cut`
    pub serial: Seconds,
}

/// Time at scale-out factor `x` when compute divides and the cut time does not.
pub fn strong_scaling(t_compute: Seconds, t_cut: Seconds, x: f64) -> Result<ScalingRow, ModelError> {
    positive("scale factor", x)?;
    let compute = t_compute / x;
    Ok(ScalingRow { factor: x, compute, overlapped: compute.max(t_cut), serial: compute + t_cut })
}

/// Factor beyond which the cut dominates: `x = T_compute / T_cut`.
pub fn strong_scaling_crossover(t_compute: Seconds, t_cut: Seconds) -> Result<f64, ModelError> {
    positive("cut time", t_cut.0)?;
    Ok(t_compute / t_cut)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testutil::{close, digit};

    fn gbs(x: f64) -> BytesPerSecond {
        BytesPerSecond::gb_s(x)
    }

    #[test]
    fn check_relay_path() {
        // §1.2 [check]: 1.125 GiB at 50 / 100 / 150 GB/s downstream ≈ 24.2 / 12.1 / 8.1 ms.
        let rows = relay_table(Bytes::gib(1.125), gbs(50.0), gbs(450.0), &[gbs(50.0), gbs(50.0)], &[gbs(50.0), gbs(100.0), gbs(150.0)]).unwrap();
        digit(rows[0].time.in_ms(), 24.2, 0.1, "50 GB/s");
        digit(rows[1].time.in_ms(), 12.1, 0.1, "100 GB/s");
        digit(rows[2].time.in_ms(), 8.1, 0.1, "150 GB/s");
        assert_eq!(rows[2].effective, gbs(150.0));
    }

    #[test]
    fn path_laws() {
        let p = Path::Serial(vec![Path::Link(gbs(50.0)), Path::Link(gbs(32.0))]);
        assert_eq!(p.bandwidth(), gbs(32.0));
        let p = Path::Parallel(vec![Path::Link(gbs(25.0)), Path::Link(gbs(25.0))]);
        assert_eq!(p.bandwidth(), gbs(50.0));
        let p = Path::Relay { hop: Box::new(Path::Link(gbs(40.0))), neighbours: vec![Path::Link(gbs(50.0)); 2] };
        assert_eq!(p.bandwidth(), gbs(40.0));
    }

    #[test]
    fn shared_interface_sums_ports() {
        // Two 25 GB/s ports behind one 32 GB/s slot, 24 MiB each: the slot binds.
        let t = shared_interface_time(&[Bytes::mib(24.0); 2], gbs(25.0), gbs(32.0)).unwrap();
        close(t.0, Bytes::mib(48.0).0 / 32e9, 1e-12, "slot");
    }

    #[test]
    fn check_message_cost() {
        // §1.7 [check]: 64 MiB ≈ 1.3 ms; 8 KiB ≈ 5.2 µs (~97 % launch); crossover 250 000 B ≈ 244 KiB.
        let a = Seconds::us(5.0);
        let b = gbs(50.0);
        digit(message_time(a, Bytes::mib(64.0), b).unwrap().time.in_ms(), 1.3, 0.1, "64 MiB");
        let small = message_time(a, Bytes::kib(8.0), b).unwrap();
        digit(small.time.in_us(), 5.2, 0.1, "8 KiB");
        digit(small.launch_share * 100.0, 97.0, 1.0, "launch share");
        let x = message_crossover(a, b);
        close(x.0, 250_000.0, 1e-12, "crossover");
        digit(x.in_kib(), 244.0, 1.0, "crossover KiB");
    }

    #[test]
    fn check_pipeline() {
        // §1.8 [check]: p = 4, m = 8, τ = 1 ms: 11 ms, 73 %; U ≥ 90 % needs m ≥ 27.
        let p = pipeline(4, 8, Seconds::ms(1.0)).unwrap();
        close(p.time.in_ms(), 11.0, 1e-12, "time");
        digit(p.utilisation * 100.0, 73.0, 1.0, "U");
        assert_eq!(micro_batches_for(4, 0.9).unwrap(), 27);
        assert!(pipeline(4, 27, Seconds::ms(1.0)).unwrap().utilisation >= 0.9);
        assert!(pipeline(4, 26, Seconds::ms(1.0)).unwrap().utilisation < 0.9);
    }

    #[test]
    fn check_expert_parallel() {
        // §1.9 [check]: 32 MiB each way; one NIC ≥ 0.67 ms; 8 NICs ≈ 0.08 ms; 32 GB/s slot ≥ 1.05 ms.
        let v = ep_volume_each_way(1024, 8, 0.5, Bytes::kib(8.0)).unwrap();
        assert_eq!(v, Bytes::mib(32.0));
        let one = matrix_time(&TrafficMatrix::even(v, 1, 1).unwrap(), gbs(50.0), None, None).unwrap();
        digit(one.time.in_ms(), 0.67, 0.01, "one NIC");
        let eight = matrix_time(&TrafficMatrix::even(v, 8, 8).unwrap(), gbs(50.0), None, None).unwrap();
        digit(eight.time.in_ms(), 0.08, 0.01, "8 NICs");
        let slot = matrix_time(&TrafficMatrix::even(v, 2, 2).unwrap(), gbs(25.0), Some(gbs(32.0)), None).unwrap();
        digit(slot.time.in_ms(), 1.05, 0.01, "slot");
        assert_eq!(slot.bound, "slot");
    }

    #[test]
    fn matrix_sums_are_consistent() {
        let mut m = TrafficMatrix::even(Bytes(1000.0), 2, 3).unwrap();
        m.v[0][1] = Bytes(500.0);
        let total = m.total();
        let by_col: Bytes = m.col_sums().into_iter().sum();
        assert_eq!(total, by_col);
        assert_eq!(m.cut(&[0, 1], &[0, 1, 2]), total);
        assert_eq!(m.cut(&[0], &[1]), Bytes(500.0));
    }

    #[test]
    fn check_strong_scaling() {
        // §4 item 5 [check]: 360 MiB through one 50 GB/s NIC: 7.5 ms; 20 ms/x; crossover x ≈ 2.6.
        let t_cut = cut_time(Bytes::mib(360.0), gbs(50.0)).unwrap();
        digit(t_cut.in_ms(), 7.5, 0.1, "cut");
        let x = strong_scaling_crossover(Seconds::ms(20.0), t_cut).unwrap();
        digit(x, 2.6, 0.1, "crossover");
        let r = strong_scaling(Seconds::ms(20.0), t_cut, 4.0).unwrap();
        assert_eq!(r.overlapped, t_cut);
    }

    #[test]
    fn bad_inputs_are_errors() {
        assert!(cut_time(Bytes(1.0), BytesPerSecond(0.0)).is_err());
        assert!(cut_time(Bytes(-1.0), gbs(1.0)).is_err());
        assert!(micro_batches_for(4, 1.0).is_err());
        assert!(ep_volume_each_way(0, 8, 0.5, Bytes(1.0)).is_err());
    }
}
