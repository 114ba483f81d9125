//! Same-host links (docs/models.md §1.14): the bytes a collective moves between ranks of one
//! host — a hierarchical all-reduce's local reduce-scatter and all-gather — and the seconds of
//! its transfer they took.
//!
//! Measured, not modelled: the job's own bytes on the same-host link ([`SAME_HOST_LINK`], the
//! traced processes' TCP connections to peers on their host, `sources/tcp/own.rs`) and on its
//! NICs are read in the slices between the counter samples inside the transfer. A slice in
//! which the same-host link carried the job's bytes and no NIC did is a local phase. The
//! phases of a hierarchical collective follow each other, so a slice in which both did holds
//! the edge between two of them: its NIC part took the NICs' bytes at the rate they achieved
//! in their own slices of the transfer, the rest of it was local (half of it when no slice
//! was the NICs' alone). The sum is the `intra_host` cause, charged last (before
//! `unexplained`) out of what the NICs' causes left: they come from the NICs' bytes and take
//! precedence where the local hops run beside the NIC's (a flat ring). A slice in which neither
//! carried the job's bytes is the host's ranks waiting — for ranks on other hosts, or for a
//! CPU — and stays where the other causes leave it; its seconds are evidence.

use std::collections::BTreeMap;

use crate::timeline::{windows::SAME_HOST_LINK, Activity, Collective, CounterLog, NicInfo, NicWindow};

/// What was measured of one collective's same-host transfers over its transfer interval.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SameHost {
    /// The job's own wire bytes between ranks of one host (summed over its hosts).
    pub bytes: f64,
    /// Seconds of the transfer in which only the same-host link carried the job's bytes.
    pub seconds: f64,
    /// Slices the transfer was cut into by the counter samples inside it.
    pub slices: usize,
    /// Seconds of the transfer in which neither the same-host link nor a NIC carried the
    /// job's bytes.
    pub idle_seconds: f64,
}

/// A slice carried a link's bytes when it holds at least this share of the link's bytes over
/// the whole transfer (and a full-size segment): acknowledgements and a store's keep-alives
/// are not a phase.
const BUSY_SHARE: f64 = 0.02;
const BUSY_MIN_BYTES: f64 = 1500.0;

/// The pids of `c`'s ranks on `host`.
fn pids_on(c: &Collective, host: &str) -> Vec<u32> {
    c.arrivals.iter().filter(|a| a.host == host).map(|a| a.pid).collect()
}

/// The job's bytes on the same-host links of the hosts where `c` has two ranks or more;
/// `None` when no such host's link was measured in `wins`.
fn same_host_bytes(c: &Collective, wins: &[NicWindow]) -> Option<f64> {
    let mut sum = None;
    for w in wins.iter().filter(|w| w.nic.is_same_host_link()) {
        let pids = pids_on(c, w.nic.host.as_deref().unwrap_or(""));
        if pids.len() < 2 {
            continue;
        }
        *sum.get_or_insert(0.0) += w.own_tx_of(&pids)?;
    }
    sum
}

/// The job's bytes on the NICs of `c`'s hosts in `nics`: its own where measured, else the
/// NIC's counter.
fn nic_bytes(c: &Collective, nics: &[NicWindow]) -> f64 {
    nics.iter()
        .filter(|w| !w.nic.is_same_host_link())
        .filter_map(|w| {
            let pids = pids_on(c, w.nic.host.as_deref()?);
            (!pids.is_empty()).then(|| w.own_tx_of(&pids).unwrap_or(w.tx_bytes))
        })
        .sum()
}

fn busy(bytes: f64, total: f64) -> bool {
    bytes >= (BUSY_SHARE * total).max(BUSY_MIN_BYTES)
}

/// Measures collective `c`'s same-host transfers from `log`; `nics` keeps the NIC windows
/// its ranks use (`timeline::links::Links::filter`). `None` for a collective of one host (no
/// NIC to tell its phases apart: its whole transfer is local) or one whose same-host links
/// were not measured (no loopback TCP of the job: shared memory, NVLink, PCIe).
pub fn measure(c: &Collective, log: &CounterLog, act: &Activity, nics: impl Fn(Vec<NicWindow>) -> Vec<NicWindow>) -> Option<SameHost> {
    let (t0, t1) = (c.last_arrival(), c.last_exit());
    if c.one_host() || t1 <= t0 || !log.has(NicInfo::is_same_host_link) {
        return None;
    }
    let all = log.window_in(t0, t1, act);
    let bytes = same_host_bytes(c, &all)?;
    let mut m = SameHost { bytes, ..Default::default() };
    if bytes < BUSY_MIN_BYTES {
        return Some(m);
    }
    let nic_total = nic_bytes(c, &nics(all));
    let mut edges = vec![t0];
    edges.extend(log.sample_times(NicInfo::is_same_host_link, t0, t1));
    edges.push(t1);
    // Per slice: its seconds, whether the same-host link carried the job's bytes, and the
    // NICs' bytes when they did.
    let slices: Vec<(f64, bool, Option<f64>)> = edges
        .windows(2)
        .map(|e| {
            let w = log.window_in(e[0], e[1], act);
            let local = busy(same_host_bytes(c, &w).unwrap_or(0.0), bytes);
            let nic = nic_bytes(c, &nics(w));
            (e[1] - e[0], local, busy(nic, nic_total).then_some(nic))
        })
        .collect();
    // The NICs' rate in the slices only they were busy: what their phase achieved.
    let (nic_s, nic_b) = slices.iter().filter(|s| !s.1).fold((0.0, 0.0), |(t, b), s| s.2.map_or((t, b), |n| (t + s.0, b + n)));
    let nic_rate = (nic_s > 0.0 && nic_b > 0.0).then(|| nic_b / nic_s);
    for &(dt, local, nic) in &slices {
        match (local, nic) {
            (true, None) => m.seconds += dt,
            // A phase edge: the NICs' part took their bytes at their rate, the rest was local.
            (true, Some(b)) => m.seconds += nic_rate.map_or(0.5 * dt, |r| (dt - b / r).max(0.0)),
            (false, None) => m.idle_seconds += dt,
            (false, Some(_)) => {}
        }
    }
    m.slices = slices.len();
    Some(m)
}

/// The step's same-host transfers, for the cause's evidence.
#[derive(Default)]
pub(super) struct Tally {
    bytes: f64,
    measured_seconds: f64,
    slices: usize,
    collectives: usize,
    idle_seconds: f64,
    /// Collectives with ranks sharing a host whose same-host link was not measured.
    pub unmeasured: usize,
}

impl Tally {
    /// Adds one collective's measurement (`frac`: the share of its transfer not already
    /// counted by an overlapping one).
    pub fn add(&mut self, m: &SameHost, frac: f64) {
        self.bytes += frac * m.bytes;
        self.measured_seconds += frac * m.seconds;
        self.slices += m.slices;
        self.collectives += 1;
        self.idle_seconds += frac * m.idle_seconds;
    }

    pub fn evidence(&self) -> BTreeMap<String, serde_json::Value> {
        let rate = if self.measured_seconds > 0.0 { self.bytes / self.measured_seconds } else { 0.0 };
        let mut e = super::ev(&[
            ("link", SAME_HOST_LINK.into()),
            ("transport", "tcp".into()),
            ("same_host_bytes", self.bytes.into()),
            ("local_phase_seconds", self.measured_seconds.into()),
            ("bytes_per_second", rate.into()),
            ("collectives", self.collectives.into()),
            ("slices", self.slices.into()),
            ("idle_seconds", self.idle_seconds.into()),
        ]);
        if self.unmeasured > 0 {
            e.insert("collectives_not_measured".into(), self.unmeasured.into());
        }
        e
    }
}

/// Whether some host holds two or more of `c`'s ranks (it has same-host transfers).
pub(super) fn shares_a_host(c: &Collective) -> bool {
    let mut hosts: Vec<&str> = c.arrivals.iter().map(|a| a.host.as_str()).collect();
    let n = hosts.len();
    hosts.sort_unstable();
    hosts.dedup();
    hosts.len() < n
}
