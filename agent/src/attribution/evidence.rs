//! Evidence behind each cause, and the fix stated in the user's terms.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{CauseKind, RankTime};
use crate::report::duration;

/// One completed request of the collective library's network transport (from the sampled
/// `ncclIbIsend`/`ncclIbIrecv`/`ncclIbTest` probes), wall-clock seconds.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NetSample {
    pub bytes: f64,
    pub posted: f64,
    pub completed: f64,
    pub send: bool,
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
        CauseKind::IntraHost => format!(
            "{:.1} MB moved between ranks of one host over {} ({}) at {:.1} MB/s: the local phases of hierarchical collectives; a faster same-host transport shortens them (shared memory or NVLink/P2P rather than sockets: NCCL_P2P_LEVEL, NCCL_SHM_DISABLE=0, MPI's shared-memory btl)",
            num(e, "same_host_bytes") / 1e6,
            s_of(e, "link"),
            s_of(e, "transport"),
            num(e, "bytes_per_second") / 1e6
        ),
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
