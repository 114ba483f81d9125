//! Evidence behind each cause, and the fix stated in the user's terms.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{CauseKind, Params, RankTime};
use crate::{
    model::concurrency,
    report::duration,
    timeline::{Collective, NicWindow},
    units::{Bytes, BytesPerSecond, Seconds},
};

/// One completed request of the collective library's network transport (from the sampled
/// `ncclIbIsend`/`ncclIbIrecv`/`ncclIbTest` probes), wall-clock seconds.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NetSample {
    pub bytes: f64,
    pub posted: f64,
    pub completed: f64,
    pub send: bool,
}

/// Bytes a ring collective is expected to put on the NICs of `hosts` (docs/models.md §1.4: each
/// rank sends 2(p−1)/p·M to its successor; only edges whose successor is on another host
/// leave the host). A rank that no arrival shows runs on another host: each host's agent
/// sees every rank of its own host, so one agent's partial view of a multi-host job still
/// places its own ranks' edges. `None` when the placement is not known (no arrival on
/// `hosts`, or ranks outside 0..p).
pub fn expected_cross_host_bytes(c: &Collective, hosts: &[&str]) -> Option<f64> {
    let m = c.bytes? as f64;
    let p = c.nranks? as usize;
    if p < 2 || hosts.is_empty() || c.arrivals.iter().any(|a| a.rank as usize >= p) || !c.arrivals.iter().any(|a| hosts.contains(&a.host.as_str())) {
        return None;
    }
    let factor = match c.op.as_str() {
        "all_reduce" => 2.0 * (p - 1) as f64 / p as f64,
        "all_gather" | "reduce_scatter" => (p - 1) as f64,
        _ => 1.0,
    };
    // Arrivals are sorted by rank; ranks 0..p-1 each once is the normal case.
    let dense = c.arrivals.len() == p && c.arrivals.iter().enumerate().all(|(i, a)| a.rank as usize == i);
    let host_of = |r: usize| -> Option<&str> {
        if dense {
            c.arrivals.get(r).map(|a| a.host.as_str())
        } else {
            c.arrivals.iter().find(|a| a.rank as usize == r).map(|a| a.host.as_str())
        }
    };
    let mut bytes = 0.0;
    for r in 0..p {
        // Only edges from a rank seen on `hosts` leave through these NICs; an unseen
        // successor is on another host.
        if let Some(h) = host_of(r).filter(|h| hosts.contains(h)) {
            if host_of((r + 1) % p) != Some(h) {
                bytes += factor * m;
            }
        }
    }
    Some(bytes)
}

/// Congestion evidence over a transfer window.
#[derive(Clone, Debug, Default)]
pub struct Congestion {
    pub seconds: f64,
    pub pause_seconds: f64,
    pub pause_frames: f64,
    pub xmit_wait_seconds: f64,
    pub other_traffic_bytes: f64,
    pub other_traffic_seconds: f64,
    pub ecn_marked: f64,
    pub cnp: f64,
    pub retransmits: f64,
    pub drops: f64,
    pub max_backlog_bytes: f64,
    pub nic: Option<String>,
}

impl Congestion {
    /// Time the busiest path was paused (PFC pause µs), waiting to transmit (xmit_wait
    /// ticks), or carrying other traffic ahead of ours (bytes beyond what this collective is
    /// expected to send, at nominal rate). Queue backlog, drops, ECN/CNP and retransmissions
    /// are evidence of the same queues.
    pub fn from_windows(wins: &[&NicWindow], rate: f64, expected: Option<f64>, p: &Params) -> Congestion {
        let mut c = Congestion::default();
        let mut worst = 0.0;
        let mut worst_nic: Option<&str> = None;
        for w in wins {
            let paused = w.pause_seconds + w.xmit_wait_ticks * p.xmit_wait_tick_seconds;
            if paused > worst {
                worst = paused;
                worst_nic = Some(w.nic.name.as_str());
            }
            c.pause_seconds = c.pause_seconds.max(w.pause_seconds);
            c.xmit_wait_seconds = c.xmit_wait_seconds.max(w.xmit_wait_ticks * p.xmit_wait_tick_seconds);
            c.pause_frames += w.pause_frames;
            c.ecn_marked += w.ecn_marked;
            c.cnp += w.cnp_sent + w.cnp_handled;
            c.retransmits += w.retransmits;
            c.drops += w.drops;
            c.max_backlog_bytes = c.max_backlog_bytes.max(w.max_backlog_bytes);
        }
        c.nic = worst_nic.map(str::to_string);
        if let Some(exp) = expected {
            let carried: f64 = wins.iter().map(|w| w.tx_bytes).sum();
            c.other_traffic_bytes = (carried - exp).max(0.0);
            // Other traffic only delays us when the path also queued or dropped.
            if c.max_backlog_bytes > 0.0 || c.drops > 0.0 || c.retransmits > 0.0 || worst > 0.0 {
                c.other_traffic_seconds = c.other_traffic_bytes / rate.max(1.0);
                if c.nic.is_none() {
                    c.nic = wins.iter().max_by(|a, b| a.tx_bytes.total_cmp(&b.tx_bytes)).map(|w| w.nic.name.clone());
                }
            }
        }
        c.seconds = worst + c.other_traffic_seconds;
        c
    }

    /// The additive numbers scaled by `f` (a collective's share of a window it shares with
    /// an earlier collective of the step); the peak backlog and the NIC stay.
    pub fn scaled(&self, f: f64) -> Congestion {
        Congestion {
            seconds: self.seconds * f,
            pause_seconds: self.pause_seconds * f,
            pause_frames: self.pause_frames * f,
            xmit_wait_seconds: self.xmit_wait_seconds * f,
            other_traffic_bytes: self.other_traffic_bytes * f,
            other_traffic_seconds: self.other_traffic_seconds * f,
            ecn_marked: self.ecn_marked * f,
            cnp: self.cnp * f,
            retransmits: self.retransmits * f,
            drops: self.drops * f,
            max_backlog_bytes: self.max_backlog_bytes,
            nic: self.nic.clone(),
        }
    }

    pub fn merge(&mut self, o: &Congestion) {
        self.seconds += o.seconds;
        self.pause_seconds += o.pause_seconds;
        self.pause_frames += o.pause_frames;
        self.xmit_wait_seconds += o.xmit_wait_seconds;
        self.other_traffic_bytes += o.other_traffic_bytes;
        self.other_traffic_seconds += o.other_traffic_seconds;
        self.ecn_marked += o.ecn_marked;
        self.cnp += o.cnp;
        self.retransmits += o.retransmits;
        self.drops += o.drops;
        self.max_backlog_bytes = self.max_backlog_bytes.max(o.max_backlog_bytes);
        if self.nic.is_none() {
            self.nic = o.nic.clone();
        }
    }

    pub fn to_evidence(&self) -> BTreeMap<String, serde_json::Value> {
        let mut m = BTreeMap::new();
        for (k, v) in [
            ("pfc_pause_seconds", self.pause_seconds),
            ("pfc_pause_frames", self.pause_frames),
            ("transmit_wait_seconds", self.xmit_wait_seconds),
            ("other_traffic_bytes", self.other_traffic_bytes),
            ("other_traffic_seconds", self.other_traffic_seconds),
            ("ecn_marked_packets", self.ecn_marked),
            ("cnp_packets", self.cnp),
            ("retransmits", self.retransmits),
            ("drops", self.drops),
            ("max_queue_backlog_bytes", self.max_backlog_bytes),
        ] {
            m.insert(k.to_string(), serde_json::json!(v));
        }
        if let Some(n) = &self.nic {
            m.insert("nic".into(), serde_json::json!(n));
        }
        m
    }
}

/// In-flight evidence from sampled transport requests overlapping a transfer.
#[derive(Clone, Debug, PartialEq)]
pub struct InFlight {
    pub requests: usize,
    pub mean_outstanding: f64,
    pub mean_payload_bytes: f64,
    pub mean_occupancy_seconds: f64,
    pub bound_bytes_per_second: f64,
    pub path_bytes_per_second: f64,
}

impl InFlight {
    /// §2.2 `B_eff ≤ N·m/T` with N the time-averaged outstanding requests, m the mean payload
    /// and T the mean slot occupancy (post → completion seen), measured over [t0, t1].
    pub fn measure(net: &[NetSample], t0: f64, t1: f64, path: f64) -> Option<InFlight> {
        let span = t1 - t0;
        if span <= 0.0 || net.is_empty() {
            return None;
        }
        let reqs: Vec<&NetSample> = net.iter().filter(|r| r.send && r.completed > t0 && r.posted < t1).collect();
        if reqs.len() < 4 {
            return None;
        }
        let busy: f64 = reqs.iter().map(|r| r.completed.min(t1) - r.posted.max(t0)).sum();
        let n = busy / span;
        let m = reqs.iter().map(|r| r.bytes).sum::<f64>() / reqs.len() as f64;
        let t = reqs.iter().map(|r| r.completed - r.posted).sum::<f64>() / reqs.len() as f64;
        if n <= 0.0 || m <= 0.0 || t <= 0.0 {
            return None;
        }
        let slots = n.round().max(1.0) as u64;
        let model = concurrency::inflight(Bytes(m), Seconds(t), BytesPerSecond(path), Some(slots), None).ok()?;
        Some(InFlight {
            requests: reqs.len(),
            mean_outstanding: n,
            mean_payload_bytes: m,
            mean_occupancy_seconds: t,
            bound_bytes_per_second: model.window_bound.map(|b| b.0).unwrap_or(path),
            path_bytes_per_second: path,
        })
    }

    pub fn merge(&self, o: &InFlight) -> InFlight {
        let w = (self.requests + o.requests).max(1) as f64;
        let avg = |a: f64, b: f64| (a * self.requests as f64 + b * o.requests as f64) / w;
        InFlight {
            requests: self.requests + o.requests,
            mean_outstanding: avg(self.mean_outstanding, o.mean_outstanding),
            mean_payload_bytes: avg(self.mean_payload_bytes, o.mean_payload_bytes),
            mean_occupancy_seconds: avg(self.mean_occupancy_seconds, o.mean_occupancy_seconds),
            bound_bytes_per_second: avg(self.bound_bytes_per_second, o.bound_bytes_per_second),
            path_bytes_per_second: self.path_bytes_per_second.max(o.path_bytes_per_second),
        }
    }

    pub fn to_evidence(&self) -> BTreeMap<String, serde_json::Value> {
        [
            ("requests_sampled", serde_json::json!(self.requests)),
            ("in_flight_requests", serde_json::json!(self.mean_outstanding)),
            ("request_bytes", serde_json::json!(self.mean_payload_bytes)),
            ("slot_occupancy_seconds", serde_json::json!(self.mean_occupancy_seconds)),
            ("window_bound_bytes_per_second", serde_json::json!(self.bound_bytes_per_second)),
            ("path_bytes_per_second", serde_json::json!(self.path_bytes_per_second)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// The transfer time if the same bytes were spread over every NIC (§1.10 balanced pairing).
pub fn balanced_alternative(nic_tx: &BTreeMap<String, (f64, Option<f64>)>) -> Option<f64> {
    let n = nic_tx.len();
    let rate = nic_tx.values().filter_map(|v| v.1).fold(f64::INFINITY, f64::min);
    if n == 0 || !rate.is_finite() || rate <= 0.0 {
        return None;
    }
    let total: f64 = nic_tx.values().map(|v| v.0).sum();
    Some(total / n as f64 / rate)
}

fn num(e: &BTreeMap<String, serde_json::Value>, k: &str) -> f64 {
    e.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0)
}

fn s_of(e: &BTreeMap<String, serde_json::Value>, k: &str) -> String {
    e.get(k).and_then(|v| v.as_str()).unwrap_or("?").to_string()
}

/// The fix for a cause, in the user's terms, with the evidence's numbers (durations in the
/// report's units). Only for a cause that has seconds: [`attribute`](super::attribute) gives
/// a cause of 0 s no fix, whose evidence would only fill these placeholders.
pub fn fix_for(k: CauseKind, e: &BTreeMap<String, serde_json::Value>, late: Option<&RankTime>) -> String {
    match k {
        CauseKind::Compute => "time outside collectives: profile compute, data loading and the optimizer step (not the network)".into(),
        CauseKind::IdealComm => "the communication the bytes need at nominal link rate: reduce bytes (gradient compression, bucketing) or overlap them with compute".into(),
        CauseKind::ReadinessSkew => match late {
            Some(r) => format!(
                "rank {} on {} reached its collectives {} after the first rank: look upstream of the collective on that rank (input pipeline, host jitter, a slower GPU, CPU contention) — the network is not the cause",
                r.rank,
                r.host,
                duration(r.late_seconds)
            ),
            None => "no rank arrived late".into(),
        },
        CauseKind::RailImbalance => format!(
            "{} carried {:.0} % of the bytes while other rails idled: use a rail-aligned (hierarchical) algorithm or ring order so every NIC carries its share (NCCL_ALGO / NCCL_IB_HCA listing every NIC); balanced, the transfer would take {}",
            s_of(e, "busiest_nic"),
            num(e, "busiest_share") * 100.0,
            duration(num(e, "balanced_transfer_seconds"))
        ),
        CauseKind::InFlightLimit if s_of(e, "transport") == "tcp" => format!(
            "the TCP connections kept {:.0} KiB in flight over a {} round trip (N·m/T = {:.2} MB/s < path {:.2} MB/s), held by the {} ({:.0} % of their busy time); {:.0} segments of {:.0} B in flight would fill the path: raise the socket buffers (SO_SNDBUF/SO_RCVBUF, net.ipv4.tcp_wmem/tcp_rmem) or use more connections",
            num(e, "in_flight_bytes") / 1024.0,
            duration(num(e, "slot_occupancy_seconds")),
            num(e, "window_bound_bytes_per_second") / 1e6,
            num(e, "path_bytes_per_second") / 1e6,
            if s_of(e, "limit") == "rwnd" { "peer's receive window" } else { "send buffer" },
            num(e, "limited_share") * 100.0,
            num(e, "requests_needed"),
            num(e, "request_bytes")
        ),
        CauseKind::InFlightLimit => format!(
            "only {:.1} requests of {:.0} KiB were in flight (N·m/T = {:.2} GB/s < path {:.2} GB/s): raise the window — NCCL_NCHANNELS, NCCL_IB_QPS_PER_CONNECTION, NCCL_BUFFSIZE/NCCL_STEPS — or reap completions faster",
            num(e, "in_flight_requests"),
            num(e, "request_bytes") / 1024.0,
            num(e, "window_bound_bytes_per_second") / 1e9,
            num(e, "path_bytes_per_second") / 1e9
        ),
        CauseKind::Congestion => format!(
            "the path through {} was paused or queued (pause {}, transmit wait {}, {:.0} bytes of other traffic, {:.0} drops, {:.0} retransmits): keep other jobs' bursts off this link or out of phase, check ECN/DCQCN marking and PFC headroom",
            s_of(e, "nic"),
            duration(num(e, "pfc_pause_seconds")),
            duration(num(e, "transmit_wait_seconds")),
            num(e, "other_traffic_bytes"),
            num(e, "drops"),
            num(e, "retransmits")
        ),
        CauseKind::Unexplained => "not explained by the models: check for missing data (ranks or NICs not seen) and report it — large unexplained time is a finding in itself".into(),
    }
}
