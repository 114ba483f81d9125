//! Scale planning: the 1024-accelerator exercise (docs/models.md §5).
//!
//! 1024 H100, TP × DP with the TP group inside a supernode of S GPUs, 2^20 tokens per step,
//! 64 layers, hidden 5120, P = 32e9, BF16 gradients. The question: what does a bigger
//! supernode, a fixed egress or oversubscription do to the gradient AllReduce, the step and
//! the effective tokens per second once checkpoint/restart is paid (§3.6)?

use serde::Serialize;

use super::dependency::{checkpoint_overhead, effective_throughput};
use super::{at_least, non_negative, positive, ModelError};
use crate::units::{Bytes, BytesPerSecond, Seconds};

/// Supernode sizes of `agent model scale --sweep`.
pub const SWEEP: [usize; 4] = [8, 64, 128, 256];

/// Supernode egress bandwidth `B_out`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Egress {
    /// `S × B_NIC`: every GPU keeps its own NIC ("egress scales").
    Scales,
    /// A fixed egress per supernode (the chapter's 400 GB/s).
    Fixed(BytesPerSecond),
}

#[derive(Clone, Debug, Serialize)]
pub struct ScaleInput {
    pub gpus: usize,
    pub supernode: usize,
    pub tp: usize,
    pub tokens: f64,
    pub layers: usize,
    pub hidden: usize,
    pub params: f64,
    /// BF16 gradients and activations.
    pub bytes_per_value: f64,
    pub alpha_local: Seconds,
    pub alpha_remote: Seconds,
    pub local: BytesPerSecond,
    pub nic: BytesPerSecond,
    pub egress: Egress,
    /// Divides `B_out`.
    pub oversubscription: f64,
    /// Sustained FLOP/s per GPU (41 % MFU of 989.4 TFLOP/s).
    pub flops_per_gpu: f64,
    pub tp_allreduces_per_layer: usize,
    pub optimizer: Seconds,
    pub ckpt_interval: Seconds,
    pub ckpt_pause: Seconds,
    pub gpu_mtbf: Seconds,
    pub restart: Seconds,
    pub ckpt_bytes_per_gpu: Bytes,
    /// One PCIe Gen5 x16 link per supernode for reading the checkpoint back.
    pub ckpt_read: BytesPerSecond,
}

impl ScaleInput {
    /// docs/models.md §5 with an 8-GPU supernode (the HGX box) and egress that scales.
    pub fn chapter() -> ScaleInput {
        ScaleInput {
            gpus: 1024,
            supernode: 8,
            tp: 8,
            tokens: (1u64 << 20) as f64,
            layers: 64,
            hidden: 5120,
            params: 32e9,
            bytes_per_value: 2.0,
            alpha_local: Seconds::us(0.83),
            alpha_remote: Seconds::us(0.83),
            local: BytesPerSecond::gb_s(450.0),
            nic: BytesPerSecond::gb_s(50.0),
            egress: Egress::Scales,
            oversubscription: 1.0,
            flops_per_gpu: 405.7e12,
            tp_allreduces_per_layer: 4,
            optimizer: Seconds(0.050),
            ckpt_interval: Seconds(600.0),
            ckpt_pause: Seconds(10.0),
            gpu_mtbf: Seconds::hours(8090.0),
            restart: Seconds(60.0),
            ckpt_bytes_per_gpu: Bytes::gb(64.0),
            ckpt_read: BytesPerSecond::gb_s(64.0),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ScaleReport {
    pub supernode: usize,
    pub tp: usize,
    /// `H = gpus/S`
    pub supernodes: usize,
    /// `q = S/t`: local DP ranks per TP coordinate.
    pub local_dp: usize,
    /// DP degree `gpus/t`.
    pub dp: usize,
    /// Gradient shard per GPU `G = 2P/t`.
    pub shard: Bytes,
    /// `V_out = 2(H−1)/H · t · G` per direction.
    pub v_out: Bytes,
    /// `B_out / r`
    pub b_out: BytesPerSecond,
    pub t_grad_hierarchical: Seconds,
    pub t_grad_flat: Seconds,
    /// "hierarchical" or "flat ring": the faster one.
    pub grad_algo: &'static str,
    pub t_grad: Seconds,
    pub compute: Seconds,
    /// Activation per TP AllReduce: tokens per replica × hidden × 2 B.
    pub activation: Bytes,
    pub tp_time: Seconds,
    pub optimizer: Seconds,
    pub step: Seconds,
    pub tokens_per_s: f64,
    pub job_mtbf: Seconds,
    /// `R = restart + S × checkpoint bytes per GPU / read bandwidth`.
    pub recovery: Seconds,
    /// `ε = C/I + λ(I/2 + R)`
    pub ckpt_overhead: f64,
    pub effective_tokens_per_s: f64,
}

/// Ring AllReduce time on `p` ranks over one link class: `2(p−1)α + 2(p−1)/p · V/B`.
fn ring(p: usize, alpha: Seconds, v: Bytes, b: BytesPerSecond) -> Seconds {
    let k = 2.0 * (p.max(1) - 1) as f64;
    alpha * k + v * (k / p.max(1) as f64) / b
}

pub fn scale(i: &ScaleInput) -> Result<ScaleReport, ModelError> {
    let n = at_least("GPUs", i.gpus, 1)?;
    let s = at_least("supernode size", i.supernode, 1)?;
    let t = at_least("TP size", i.tp, 1)?;
    if n % s != 0 || s % t != 0 {
        return Err(ModelError::Inconsistent {
            what: "supernode",
            detail: format!("the TP size ({t}) must divide the supernode ({s}) and the supernode the GPUs ({n})"),
        });
    }
    positive("parameters", i.params)?;
    positive("tokens per step", i.tokens)?;
    positive("local bandwidth", i.local.0)?;
    positive("NIC bandwidth", i.nic.0)?;
    positive("oversubscription", i.oversubscription)?;
    positive("FLOP/s per GPU", i.flops_per_gpu)?;
    positive("GPU MTBF", i.gpu_mtbf.0)?;
    positive("checkpoint read bandwidth", i.ckpt_read.0)?;
    non_negative("α local", i.alpha_local.0)?;
    non_negative("α remote", i.alpha_remote.0)?;
    if let Egress::Fixed(b) = i.egress {
        positive("supernode egress", b.0)?;
    }
    let (h, q, d) = (n / s, s / t, n / t);
    let hf = h as f64;
    let g = Bytes(i.bytes_per_value * i.params / t as f64);
    let v_out = g * (t as f64 * 2.0 * (hf - 1.0) / hf);
    let b_out = match i.egress {
        Egress::Scales => i.nic * s as f64,
        Egress::Fixed(b) => b,
    } / i.oversubscription;
    // Hierarchical: local RS/AG over q ranks on NVLink, then a ring over H supernodes per shard
    // G/q, bounded by the NIC and by the supernode egress (§5).
    let mut hier = ring(q, i.alpha_local, g, i.local);
    if h > 1 {
        let qf = q as f64;
        let nic_time = g * (2.0 * (hf - 1.0) / (hf * qf)) / i.nic;
        hier = hier + i.alpha_remote * (2.0 * (hf - 1.0)) + nic_time.max(v_out / b_out);
    }
    // Flat DP ring over d ranks: every round one edge per TP coordinate leaves each supernode.
    let flat = if h > 1 {
        let chunk = g / d as f64;
        let mut worst = (chunk / i.nic).max(chunk * t as f64 / b_out);
        if q > 1 {
            worst = worst.max(chunk / i.local);
        }
        (i.alpha_remote + worst) * (2.0 * (d - 1) as f64)
    } else {
        ring(d, i.alpha_local, g, i.local)
    };
    let (grad_algo, t_grad) = if hier.0 <= flat.0 { ("hierarchical", hier) } else { ("flat ring", flat) };
    let compute = Seconds(6.0 * i.params * i.tokens / (n as f64 * i.flops_per_gpu));
    let activation = Bytes(i.tokens / d as f64 * i.hidden as f64 * i.bytes_per_value);
    let tp_time = ring(t, i.alpha_local, activation, i.local) * (i.layers * i.tp_allreduces_per_layer) as f64;
    let step = compute + tp_time + t_grad + i.optimizer;
    let tokens_per_s = i.tokens / step.0;
    let lambda = n as f64 / i.gpu_mtbf.0;
    let recovery = i.restart + i.ckpt_bytes_per_gpu * s as f64 / i.ckpt_read;
    let eps = checkpoint_overhead(i.ckpt_pause, i.ckpt_interval, lambda, recovery)?;
    Ok(ScaleReport {
        supernode: s,
        tp: t,
        supernodes: h,
        local_dp: q,
        dp: d,
        shard: g,
        v_out,
        b_out,
        t_grad_hierarchical: hier,
        t_grad_flat: flat,
        grad_algo,
        t_grad,
        compute,
        activation,
        tp_time,
        optimizer: i.optimizer,
        step,
        tokens_per_s,
        job_mtbf: i.gpu_mtbf / n as f64,
        recovery,
        ckpt_overhead: eps,
        effective_tokens_per_s: effective_throughput(tokens_per_s, eps),
    })
}

/// The same question over several supernode sizes.
pub fn sweep(i: &ScaleInput, supernodes: &[usize]) -> Result<Vec<ScaleReport>, ModelError> {
    supernodes.iter().map(|&s| scale(&ScaleInput { supernode: s, ..i.clone() })).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testutil::{close, digit};

    #[test]
    fn chapter_constants() {
        let r = scale(&ScaleInput::chapter()).unwrap();
        // G = 2P/8 = 8 GB; V_out = 2(H−1)/H · 8G; 1024 GPUs interrupted every ≈ 7.9 h.
        assert_eq!(r.shard, Bytes::gb(8.0));
        close(r.v_out.0, 2.0 * 127.0 / 128.0 * 64e9, 1e-12, "V_out");
        digit(r.job_mtbf.0 / 3600.0, 7.9, 0.1, "job MTBF h");
        // 8192 tokens per replica × 5120 × 2 B = 80 MiB.
        assert_eq!(r.activation, Bytes::mib(80.0));
        close(r.compute.0, 6.0 * 32e9 * 1048576.0 / (1024.0 * 405.7e12), 1e-12, "compute");
        // With one GPU per TP coordinate per supernode both algorithms are the same ring.
        close(r.t_grad_hierarchical.0, r.t_grad_flat.0, 1e-3, "S = 8");
        close(r.step.0, (r.compute + r.tp_time + r.t_grad + r.optimizer).0, 1e-12, "step");
    }

    #[test]
    fn hand_computed_hierarchical_time() {
        // S = 64: q = 8, H = 16: 14α + 14·G/(8·450 GB/s) + 30α + max(1.875·G/(8·50 GB/s), V_out/3.2 TB/s).
        let r = scale(&ScaleInput { supernode: 64, ..ScaleInput::chapter() }).unwrap();
        let a = 0.83e-6;
        let want = 14.0 * a + 14.0 * 8e9 / (8.0 * 450e9) + 30.0 * a + (1.875 * 8e9 / 400e9f64).max(120e9 / 3.2e12);
        close(r.t_grad_hierarchical.0, want, 1e-12, "T_grad");
        assert_eq!(r.grad_algo, "hierarchical");
    }

    #[test]
    fn fixed_egress_and_oversubscription_hurt_big_supernodes() {
        let base = ScaleInput { egress: Egress::Fixed(BytesPerSecond::gb_s(400.0)), ..ScaleInput::chapter() };
        let rows = sweep(&base, &SWEEP).unwrap();
        assert_eq!(rows.len(), 4);
        // At 64 GPUs a 400 GB/s egress makes the hierarchical stage slower than the flat ring.
        assert_eq!(rows[1].grad_algo, "flat ring");
        let r3 = scale(&ScaleInput { oversubscription: 3.0, supernode: 64, ..ScaleInput::chapter() }).unwrap();
        let r1 = scale(&ScaleInput { supernode: 64, ..ScaleInput::chapter() }).unwrap();
        assert!(r3.t_grad.0 >= r1.t_grad.0);
        // Recovery reads S × 64 GB through one 64 GB/s link.
        close(rows[3].recovery.0, 60.0 + 256.0, 1e-12, "recovery S = 256");
        assert!(rows.iter().all(|r| r.effective_tokens_per_s < r.tokens_per_s));
    }

    #[test]
    fn bad_inputs() {
        assert!(scale(&ScaleInput { supernode: 12, ..ScaleInput::chapter() }).is_err());
        assert!(scale(&ScaleInput { tp: 16, supernode: 8, ..ScaleInput::chapter() }).is_err());
        assert!(scale(&ScaleInput { oversubscription: 0.0, ..ScaleInput::chapter() }).is_err());
    }
}
