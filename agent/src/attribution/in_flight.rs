//! In-flight limits (docs/models.md §2): a transfer held below the path's rate because too few
//! requests (RDMA) or too few bytes (TCP) were outstanding — `V/(N·m/T) − V/B`.
//!
//! Inputs, the first that measured the transfer: the NCCL profiler plugin's proxy steps of
//! the collective (every network request of every rank that loaded the plugin: N = Σ
//! SendWait / the transfer window, m = bytes / requests, T = SendWait / requests); the sampled
//! `ncclIb*` requests of the step (N: time-averaged outstanding, m: mean payload, T: mean
//! occupancy); the TCP connections' in-flight samples of the NICs' windows (bytes in flight /
//! RTT, and what limited them). Evidence: N, m, T, the window bound, the path rate and which
//! source measured them (TCP: the limit that held and its share of time).

use std::collections::BTreeMap;

use super::{transport, NetSample};
use crate::{
    model::concurrency,
    timeline::{Collective, NicWindow},
    units::{Bytes, BytesPerSecond, Seconds},
};

/// In-flight evidence from sampled transport requests overlapping a transfer.
#[derive(Clone, Debug, PartialEq)]
pub struct InFlight {
    /// `nccl_proxy_steps` (the profiler plugin) or `sampled_requests` (the `ncclIb*` probes).
    pub source: &'static str,
    pub requests: usize,
    pub mean_outstanding: f64,
    pub mean_payload_bytes: f64,
    pub mean_occupancy_seconds: f64,
    pub bound_bytes_per_second: f64,
    pub path_bytes_per_second: f64,
    /// Share of the transfer the measurement covers (sampled requests: the probes' windows;
    /// 1 for the proxy steps, which are every request).
    pub covered_share: f64,
}

impl InFlight {
    /// §2.2 `B_eff ≤ N·m/T` with N the time-averaged outstanding requests, m the mean payload
    /// and T the mean slot occupancy (post → completion seen), measured over the part of
    /// [t0, t1] the requests cover: from the first one's post to the last one's completion.
    /// The requests are those posted inside the probes' sampled windows (200 ms every 10 s by
    /// default), which may cover a transfer only in part: over all of [t0, t1], N would count
    /// the time nobody sampled as time with nothing in flight (a transfer half covered at
    /// N = 1 measured N = 0.5, and half its window bound).
    pub fn measure(net: &[NetSample], t0: f64, t1: f64, path: f64) -> Option<InFlight> {
        if t1 <= t0 || net.is_empty() {
            return None;
        }
        let reqs: Vec<&NetSample> = net.iter().filter(|r| r.send && r.completed > t0 && r.posted < t1).collect();
        if reqs.len() < 4 {
            return None;
        }
        let lo = reqs.iter().map(|r| r.posted).fold(t1, f64::min).max(t0);
        let hi = reqs.iter().map(|r| r.completed).fold(t0, f64::max).min(t1);
        let covered = hi - lo;
        if covered <= 0.0 {
            return None;
        }
        let busy: f64 = reqs.iter().map(|r| r.completed.min(t1) - r.posted.max(t0)).sum();
        let m = reqs.iter().map(|r| r.bytes).sum::<f64>() / reqs.len() as f64;
        let t = reqs.iter().map(|r| r.completed - r.posted).sum::<f64>() / reqs.len() as f64;
        let inf = InFlight::of("sampled_requests", reqs.len(), busy / covered, m, t, path)?;
        Some(InFlight { covered_share: covered / (t1 - t0), ..inf })
    }

    /// N, m, T of the profiler plugin's proxy steps of collective `c` over its transfer
    /// [t0, t1] (send side, summed over the ranks that reported them); `None` with fewer than
    /// four requests.
    pub fn from_proxy(c: &Collective, t0: f64, t1: f64, path: f64) -> Option<InFlight> {
        let span = t1 - t0;
        let waits: Vec<_> = c.arrivals.iter().filter_map(|a| a.clock.proxy_wait.as_ref()).filter(|w| w.send_requests > 0.0).collect();
        let requests: f64 = waits.iter().map(|w| w.send_requests).sum();
        if span <= 0.0 || requests < 4.0 {
            return None;
        }
        let busy: f64 = waits.iter().map(|w| w.send_wait).sum();
        let bytes: f64 = waits.iter().map(|w| w.send_bytes).sum();
        let n = busy / (span * waits.len() as f64);
        InFlight::of("nccl_proxy_steps", requests as usize, n, bytes / requests, busy / requests, path)
    }

    /// §2.2 with N requests of m bytes each outstanding for T.
    fn of(source: &'static str, requests: usize, n: f64, m: f64, t: f64, path: f64) -> Option<InFlight> {
        if !(n > 0.0 && m > 0.0 && t > 0.0) {
            return None;
        }
        let slots = n.round().max(1.0) as u64;
        let model = concurrency::inflight(Bytes(m), Seconds(t), BytesPerSecond(path), Some(slots), None).ok()?;
        Some(InFlight {
            source,
            requests,
            mean_outstanding: n,
            mean_payload_bytes: m,
            mean_occupancy_seconds: t,
            bound_bytes_per_second: model.window_bound.map(|b| b.0).unwrap_or(path),
            path_bytes_per_second: path,
            covered_share: 1.0,
        })
    }

    pub fn merge(&self, o: &InFlight) -> InFlight {
        let w = (self.requests + o.requests).max(1) as f64;
        let avg = |a: f64, b: f64| (a * self.requests as f64 + b * o.requests as f64) / w;
        InFlight {
            source: if self.source == o.source { self.source } else { "mixed" },
            requests: self.requests + o.requests,
            mean_outstanding: avg(self.mean_outstanding, o.mean_outstanding),
            mean_payload_bytes: avg(self.mean_payload_bytes, o.mean_payload_bytes),
            mean_occupancy_seconds: avg(self.mean_occupancy_seconds, o.mean_occupancy_seconds),
            bound_bytes_per_second: avg(self.bound_bytes_per_second, o.bound_bytes_per_second),
            path_bytes_per_second: self.path_bytes_per_second.max(o.path_bytes_per_second),
            covered_share: avg(self.covered_share, o.covered_share),
        }
    }

    pub fn to_evidence(&self) -> BTreeMap<String, serde_json::Value> {
        [
            ("source", serde_json::json!(self.source)),
            ("requests_sampled", serde_json::json!(self.requests)),
            ("in_flight_requests", serde_json::json!(self.mean_outstanding)),
            ("request_bytes", serde_json::json!(self.mean_payload_bytes)),
            ("slot_occupancy_seconds", serde_json::json!(self.mean_occupancy_seconds)),
            ("window_bound_bytes_per_second", serde_json::json!(self.bound_bytes_per_second)),
            ("path_bytes_per_second", serde_json::json!(self.path_bytes_per_second)),
            ("share_of_transfer_sampled", serde_json::json!(self.covered_share)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// Evidence of the in-flight cause: sampled RDMA requests, else TCP connections.
#[derive(Default)]
pub(super) struct Charge {
    rdma: Option<InFlight>,
    tcp: Option<transport::TcpInFlight>,
    /// Request-timed transfers whose occupancy held queueing the congestion cause charged,
    /// and those seconds (taken out of the in-flight excess).
    queued: usize,
    queued_seconds: f64,
    /// Of those, transfers where congestion explained at least half of the excess (nothing
    /// charged), and the excess left unexplained there.
    dominated: usize,
    dominated_seconds: f64,
}

/// What the in-flight limit cost one transfer.
pub(super) struct Transfer<'a> {
    pub coll: &'a Collective,
    pub net: &'a [NetSample],
    pub wins: &'a [&'a NicWindow],
    /// [last arrival, last exit] of the collective.
    pub t0: f64,
    pub t1: f64,
    /// The transfer's length inside the step.
    pub span: f64,
    pub rate: f64,
    /// Bytes the busiest rank moved (the payload when larger).
    pub bytes: f64,
    /// Share of the transfer not covered by an earlier collective.
    pub frac: f64,
    /// Seconds the congestion cause charged this transfer (other traffic, pauses or a queue
    /// on its path), already scaled by `frac`.
    pub congestion: f64,
}

impl Charge {
    /// Seconds the transfer lost to an in-flight limit, at most `left`.
    pub fn add(&mut self, t: &Transfer<'_>, left: f64) -> f64 {
        let rdma = InFlight::from_proxy(t.coll, t.t0, t.t1, t.rate).or_else(|| InFlight::measure(t.net, t.t0, t.t1, t.rate));
        if let Some(inf) = rdma {
            self.rdma = Some(self.rdma.as_ref().map_or(inf.clone(), |e| e.merge(&inf)));
            // T is the requests' observed occupancy, so N·m/T is whatever the transfer
            // achieved: queueing behind other traffic lowers it as much as a small window
            // does. The transfer took about (requests / N)·T = bytes / (N·m/T); the queueing
            // the congestion cause charged added those seconds to it, spread over the
            // requests' occupancy. T less that queueing is the window's own round, so the
            // in-flight excess is the excess of N·m/T less the congestion seconds (§2.2).
            // When congestion explains half the excess or more, what is left is within the
            // error of the congestion estimate (its bytes and pauses are counted per counter
            // sample, not per request): not charged to the window, left unexplained.
            let excess = t.frac * (t.bytes / inf.bound_bytes_per_second - t.bytes / t.rate);
            if t.congestion <= 0.0 {
                return excess.max(0.0).min(left.max(0.0));
            }
            self.queued += 1;
            self.queued_seconds += t.congestion.min(excess.max(0.0));
            if t.congestion >= 0.5 * excess {
                self.dominated += 1;
                self.dominated_seconds += (excess - t.congestion).max(0.0);
                return 0.0;
            }
            return (excess - t.congestion).max(0.0).min(left.max(0.0));
        }
        let Some(tcp) = transport::TcpInFlight::measure(t.wins, t.span, t.rate) else { return 0.0 };
        // TCP (§2.2 per connection, N·m/T = bytes in flight / RTT): only a send buffer or
        // receive window that held the transfer below the path's rate.
        let mut extra = 0.0;
        if tcp.binding() {
            // The payload the connections delivered (the NIC's bytes also hold headers).
            let v = if tcp.acked_bytes > 0.0 { tcp.acked_bytes } else { t.bytes };
            extra = (t.frac * (v / tcp.bound_bytes_per_second - v / t.rate)).max(0.0).min(left.max(0.0));
        }
        self.tcp = Some(tcp);
        extra
    }

    pub fn evidence(&self) -> BTreeMap<String, serde_json::Value> {
        let mut ev = self.rdma.as_ref().map(|e| e.to_evidence()).or_else(|| self.tcp.as_ref().map(|t| t.to_evidence())).unwrap_or_default();
        if self.queued > 0 {
            ev.insert("congested_transfers".into(), serde_json::json!(self.queued));
            ev.insert("queueing_seconds_left_to_congestion".into(), serde_json::json!(self.queued_seconds));
            ev.insert("not_charged_mostly_congested_transfers".into(), serde_json::json!(self.dominated));
            ev.insert("not_charged_seconds".into(), serde_json::json!(self.dominated_seconds));
        }
        ev
    }
}
