//! Rail imbalance (docs/models.md §1.10): the step's bytes balanced over every rail would take
//! `ours / n / rate`; the busiest NIC at nominal rate takes `max / rate`. The difference is
//! time lost to bytes piled on a few NICs.
//!
//! Which NICs are rails of a collective: those that carried at least `min_nic_bytes` in its
//! transfer window, plus the idle NICs of the same hosts with the same nominal rate (and a
//! rail index when the carrying NICs have one) — an idle rail is exactly what a flat ring
//! leaves behind; a management NIC of another rate is not a rail. A collective whose every
//! rank is on one host moved its bytes through shared memory, NVLink or loopback: no NIC is
//! its rail, and it gets no network cause. Evidence: every rail's bytes and rate, the busiest
//! NIC and its share, the balanced transfer time.

use std::collections::BTreeMap;

use super::Params;
use crate::timeline::{Collective, NicWindow};

/// The job's own bytes on each of `wins` (same order): for each NIC, what the collective's
/// ranks on the NIC's host sent through it (`sources/tcp/own.rs`). `None` when any NIC's own
/// bytes were not measured (RDMA bytes, no `sock_diag` dump, or none of the collective's ranks
/// seen on its host): then the NIC counters stand for the job's bytes.
pub(super) fn own_bytes(c: &Collective, wins: &[&NicWindow]) -> Option<Vec<f64>> {
    wins.iter()
        .map(|w| {
            let host = w.nic.host.as_deref().unwrap_or("");
            let pids: Vec<u32> = c.arrivals.iter().filter(|a| a.host == host).map(|a| a.pid).collect();
            if pids.is_empty() {
                return None;
            }
            w.own_tx_of(&pids)
        })
        .collect()
}

/// The rails of one collective's transfer and their nominal rate.
pub(super) struct Rails<'a> {
    pub wins: Vec<&'a NicWindow>,
    /// Mean nominal rate of the carrying NICs, bytes/s.
    pub rate: f64,
}

/// Why a collective has no rails.
pub(super) enum NoRails {
    /// One host, or no NIC carried anything: the transfer is ideal communication.
    NoNic,
    /// NICs carried it but none has a known rate.
    RateUnknown,
}

/// The rails of collective `c` from its windows (`all`: every NIC of the hosts seen).
pub(super) fn select<'a>(c: &Collective, all: Option<&'a Vec<NicWindow>>, p: &Params) -> Result<Rails<'a>, NoRails> {
    let Some(all) = all.filter(|_| !c.one_host()) else { return Err(NoRails::NoNic) };
    let nics = || all.iter().filter(|w| !w.nic.is_same_host_link());
    let mut wins: Vec<&NicWindow> = nics().filter(|w| w.tx_bytes + w.rx_bytes >= p.min_nic_bytes).collect();
    if wins.is_empty() {
        return Err(NoRails::NoNic);
    }
    let (sum, n) = wins.iter().filter_map(|w| w.nic.rate_bytes_per_second.filter(|r| *r > 0.0)).fold((0.0, 0usize), |(s, n), r| (s + r, n + 1));
    if n == 0 {
        return Err(NoRails::RateUnknown);
    }
    let rate = sum / n as f64;
    let carrying = wins.len();
    let railed = wins.iter().any(|w| w.nic.rail.is_some());
    for w in nics().filter(|w| w.tx_bytes + w.rx_bytes < p.min_nic_bytes) {
        let same_host = wins[..carrying].iter().any(|x| x.nic.host == w.nic.host);
        let same_rate = w.nic.rate_bytes_per_second.is_some_and(|r| (r - rate).abs() <= 0.01 * rate);
        if same_host && same_rate && (!railed || w.nic.rail.is_some()) {
            wins.push(w);
        }
    }
    Ok(Rails { wins, rate })
}

/// Per-NIC transmit bytes over the step. Windows list NICs in the same order for every
/// collective, so the previous position is tried first (no allocation per collective).
#[derive(Default)]
pub(super) struct Tally<'a> {
    nics: Vec<(&'a str, f64, Option<f64>)>,
}

impl<'a> Tally<'a> {
    /// Adds the rails' bytes — the job's own per NIC (`own`, in the order of `wins`) where
    /// measured, else the NICs' transmit bytes; returns their (sum, max) for this collective.
    pub fn add(&mut self, wins: &[&'a NicWindow], own: Option<&[f64]>) -> (f64, f64) {
        let (mut sum, mut max) = (0.0, 0.0f64);
        for (j, w) in wins.iter().enumerate() {
            let name = w.nic.name.as_str();
            let bytes = own.and_then(|o| o.get(j).copied()).unwrap_or(w.tx_bytes);
            let pos = if self.nics.get(j).is_some_and(|e| e.0 == name) { Some(j) } else { self.nics.iter().position(|e| e.0 == name) };
            match pos {
                Some(k) => self.nics[k].1 += bytes,
                None => self.nics.push((name, bytes, w.nic.rate_bytes_per_second)),
            }
            sum += bytes;
            max = max.max(bytes);
        }
        (sum, max)
    }

    /// NIC name → (transmit bytes, rate).
    pub fn per_nic(&self) -> BTreeMap<String, (f64, Option<f64>)> {
        self.nics.iter().map(|(n, b, r)| (n.to_string(), (*b, *r))).collect()
    }
}

/// Seconds the busiest rail's `max_ours` bytes take beyond `ours` balanced over `n` rails.
pub(super) fn imbalance_seconds(max_ours: f64, ours: f64, n: f64, rate: f64) -> f64 {
    use crate::{
        model::traffic,
        units::{Bytes, BytesPerSecond},
    };
    traffic::cut_time(Bytes(max_ours), BytesPerSecond(rate)).map(|x| x.0).unwrap_or(0.0) - ours / n / rate
}

/// The rail evidence: every NIC's bytes, the busiest and its share, the balanced time.
pub(super) fn evidence(nic_tx: &BTreeMap<String, (f64, Option<f64>)>, seconds: f64) -> (Vec<serde_json::Value>, BTreeMap<String, serde_json::Value>) {
    let nics: Vec<serde_json::Value> = nic_tx.iter().map(|(n, (b, r))| serde_json::json!({"nic": n, "tx_bytes": b, "rate_bytes_per_second": r})).collect();
    let busiest = nic_tx.iter().max_by(|a, b| a.1 .0.total_cmp(&b.1 .0)).map(|(n, (b, _))| (n.clone(), *b));
    let sum: f64 = nic_tx.values().map(|v| v.0).sum();
    let mut e = match &busiest {
        Some((n, b)) => {
            super::ev(&[("busiest_nic", n.clone().into()), ("busiest_share", (if sum > 0.0 { b / sum } else { 0.0 }).into()), ("nics", nics.clone().into())])
        }
        None => BTreeMap::new(),
    };
    if seconds > 0.0 {
        if let Some(h) = balanced_alternative(nic_tx) {
            e.insert("balanced_transfer_seconds".into(), h.into());
        }
    }
    (nics, e)
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
