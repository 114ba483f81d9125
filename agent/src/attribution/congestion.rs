//! Congestion (docs/models.md §4): the seconds a collective's transfer spent with its busiest
//! NIC stalled (PFC pause, or transmit wait — the larger, as they overlap) or queued behind
//! other traffic on the NICs it used (bytes beyond what the ring puts on them, §1.4).
//!
//! Inputs: the linked NICs' counter windows over the transfer (`[last arrival, last exit]`),
//! the collective's expected cross-host bytes, the transmit-wait tick length. Evidence: pause
//! and transmit-wait seconds, pause frames, other traffic, ECN-marked packets, CNPs,
//! retransmits, drops, peak queue backlog and the worst NIC. ECN/CNP marks and retransmits
//! are left as evidence: the rate reduction they trigger shows up as the bytes queued or the
//! stall already counted, so turning them into seconds as well would count it twice.

use std::collections::BTreeMap;

use super::Params;
use crate::timeline::{Collective, NicWindow};

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

/// Bytes the windows' NICs transmitted, per host (a NIC without a host: ""), sorted by host
/// (a collective's windows span a few hosts: a sorted list beats a map).
fn carried_per_host<'w>(wins: &[&'w NicWindow]) -> Vec<(&'w str, f64)> {
    let mut m: Vec<(&str, f64)> = Vec::new();
    for w in wins {
        let host = w.nic.host.as_deref().unwrap_or("");
        match m.iter_mut().find(|(h, _)| *h == host) {
            Some(e) => e.1 += w.tx_bytes,
            None => m.push((host, w.tx_bytes)),
        }
    }
    m.sort_unstable_by(|a, b| a.0.cmp(b.0));
    m
}

/// Congestion evidence over a transfer window.
#[derive(Clone, Debug, Default)]
pub struct Congestion {
    pub seconds: f64,
    pub pause_seconds: f64,
    pub pause_frames: f64,
    pub xmit_wait_seconds: f64,
    /// Other traffic on the worst host's linked NICs: the path that set the delay.
    pub other_traffic_bytes: f64,
    pub other_traffic_seconds: f64,
    /// Other traffic on the linked NICs of every host (what is not this collective's bytes).
    pub other_traffic_all_hosts_bytes: f64,
    pub ecn_marked: f64,
    pub cnp: f64,
    pub retransmits: f64,
    pub drops: f64,
    pub max_backlog_bytes: f64,
    pub nic: Option<String>,
    /// Other traffic was measured (the job's own bytes known on every NIC), not inferred from
    /// the bytes the collective should have sent.
    pub own_bytes_measured: bool,
}

impl Congestion {
    /// Time the busiest path was stalled — paused by PFC or waiting to transmit, whichever is
    /// larger (the two overlap) — plus the time it carried other traffic ahead of ours (bytes
    /// beyond what this collective is expected to send, at nominal rate). Queue backlog,
    /// drops, ECN/CNP marks and retransmissions are evidence of the same queues, never
    /// seconds of their own: their delay is already in the stall or the queued bytes.
    ///
    /// Other traffic is counted per host (`expected` gives the bytes this collective puts on
    /// a host's NICs): the hosts' uplinks are parallel paths of one ring, so the ring waits for
    /// the most loaded one, not for the sum — two hosts each carrying one other burst delay a
    /// collective by one burst, not two.
    ///
    /// With the job's own bytes per NIC measured (`own`, in the order of `wins`), only the NICs
    /// the transfer used (own bytes of at least `min_nic_bytes`) count, and their other traffic
    /// is measured, not inferred: see [`Congestion::other_traffic_measured`].
    pub fn from_windows(wins: &[&NicWindow], rate: f64, own: Option<&[f64]>, transfer: f64, expected: &dyn Fn(&str) -> Option<f64>, p: &Params) -> Congestion {
        let Some(o) = own else {
            let mut c = Congestion::stalls(wins, p);
            c.other_traffic_inferred(wins, rate, expected);
            return c;
        };
        let used: Vec<(&NicWindow, f64)> = wins.iter().zip(o).filter(|(_, b)| **b >= p.min_nic_bytes).map(|(w, b)| (*w, *b)).collect();
        let mut c = Congestion::stalls(&used.iter().map(|u| u.0).collect::<Vec<_>>(), p);
        c.other_traffic_measured(&used, rate, transfer, p);
        c.own_bytes_measured = true;
        c
    }

    /// Pauses, transmit wait, marks, retransmissions, drops and queues of `wins`; the stall of
    /// the worst NIC as seconds.
    fn stalls(wins: &[&NicWindow], p: &Params) -> Congestion {
        let mut c = Congestion::default();
        let mut worst = 0.0;
        let mut worst_nic: Option<&str> = None;
        for w in wins {
            // A port paused by PFC has data pending and cannot send: its transmit-wait ticks
            // already count the pause. The stall is the larger of the two, never the sum.
            let paused = w.pause_seconds.max(w.xmit_wait_ticks * p.xmit_wait_tick_seconds);
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
        c.seconds = worst;
        c
    }

    /// Other traffic measured per NIC: a NIC's transmitted bytes beyond the job's own. On a
    /// link of rate R that carried our O bytes and X bytes of others during our transfer of
    /// T seconds, the others' bytes delay ours by the time the link spent sending them, X/R —
    /// never more than the transfer time our own bytes do not account for, T − O/R — when
    /// the link was contended: it queued, dropped, retransmitted or stalled, or it was busy
    /// at least 90 % of the transfer ((O + X)/R ≥ 0.9·T), and X is at least `min_nic_bytes`
    /// (below, the own-bytes estimate's error). A link with idle time left that
    /// never queued gave the others capacity we did not use. The links of one transfer are
    /// parallel paths (its rails, the ring's hops), so the transfer waits for the worst one.
    fn other_traffic_measured(&mut self, used: &[(&NicWindow, f64)], rate: f64, transfer: f64, p: &Params) {
        let mut worst: Option<(f64, f64, &str)> = None;
        for &(w, own) in used {
            // Fewer other bytes than `min_nic_bytes` (what a NIC must carry in a window to
            // count at all) are the own-bytes estimate's error, not traffic: a job's burst
            // read 40–50 kB short at its edges under a loaded CPU (e2e_netns, out of phase).
            let other = Some((w.tx_bytes - own).max(0.0)).filter(|x| *x >= p.min_nic_bytes).unwrap_or(0.0);
            self.other_traffic_all_hosts_bytes += other;
            let r = w.nic.rate_bytes_per_second.filter(|r| *r > 0.0).unwrap_or(rate.max(1.0));
            let stalled = w.pause_seconds.max(w.xmit_wait_ticks * p.xmit_wait_tick_seconds) > 0.0;
            let contended = w.max_backlog_bytes > 0.0 || w.drops > 0.0 || w.retransmits > 0.0 || stalled || (own + other) / r >= 0.9 * transfer;
            let delay = if contended { (other / r).min((transfer - own / r).max(0.0)) } else { 0.0 };
            if worst.is_none_or(|(d, x, _)| delay > d || (delay == d && other > x)) {
                worst = Some((delay, other, w.nic.name.as_str()));
            }
        }
        let Some((delay, other, nic)) = worst else { return };
        (self.other_traffic_bytes, self.other_traffic_seconds) = (other, delay);
        if delay > 0.0 && self.seconds <= 0.0 {
            self.nic = Some(nic.to_string());
        }
        self.seconds += delay;
    }

    /// Other traffic inferred per host where own bytes are not measured: a host's linked NICs'
    /// bytes beyond what the collective is expected to put on them (§1.4).
    fn other_traffic_inferred(&mut self, wins: &[&NicWindow], rate: f64, expected: &dyn Fn(&str) -> Option<f64>) {
        let c = self;
        let mut worst_host: Option<&str> = None;
        for (host, carried) in carried_per_host(wins) {
            let Some(exp) = expected(host) else { continue };
            let other = (carried - exp).max(0.0);
            c.other_traffic_all_hosts_bytes += other;
            if worst_host.is_none() || other > c.other_traffic_bytes {
                (c.other_traffic_bytes, worst_host) = (other, Some(host));
            }
        }
        // Other traffic only delays us when the path also queued or dropped.
        if worst_host.is_some() && (c.max_backlog_bytes > 0.0 || c.drops > 0.0 || c.retransmits > 0.0 || c.seconds > 0.0) {
            c.other_traffic_seconds = c.other_traffic_bytes / rate.max(1.0);
            if c.nic.is_none() {
                let on_path = wins.iter().filter(|w| w.nic.host.as_deref().unwrap_or("") == worst_host.unwrap_or(""));
                c.nic = on_path.max_by(|a, b| a.tx_bytes.total_cmp(&b.tx_bytes)).map(|w| w.nic.name.clone());
            }
        }
        c.seconds += c.other_traffic_seconds;
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
            other_traffic_all_hosts_bytes: self.other_traffic_all_hosts_bytes * f,
            ecn_marked: self.ecn_marked * f,
            cnp: self.cnp * f,
            retransmits: self.retransmits * f,
            drops: self.drops * f,
            max_backlog_bytes: self.max_backlog_bytes,
            nic: self.nic.clone(),
            own_bytes_measured: self.own_bytes_measured,
        }
    }

    pub fn merge(&mut self, o: &Congestion) {
        self.seconds += o.seconds;
        self.pause_seconds += o.pause_seconds;
        self.pause_frames += o.pause_frames;
        self.xmit_wait_seconds += o.xmit_wait_seconds;
        self.other_traffic_bytes += o.other_traffic_bytes;
        self.other_traffic_seconds += o.other_traffic_seconds;
        self.other_traffic_all_hosts_bytes += o.other_traffic_all_hosts_bytes;
        self.ecn_marked += o.ecn_marked;
        self.cnp += o.cnp;
        self.retransmits += o.retransmits;
        self.drops += o.drops;
        self.max_backlog_bytes = self.max_backlog_bytes.max(o.max_backlog_bytes);
        if self.nic.is_none() {
            self.nic = o.nic.clone();
        }
        self.own_bytes_measured |= o.own_bytes_measured;
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
        m.insert("other_traffic_measured".into(), serde_json::json!(self.own_bytes_measured));
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::NicInfo;

    fn nic(pause: f64, wait_ticks: f64) -> NicWindow {
        NicWindow {
            nic: NicInfo { name: "mlx5_0".into(), host: Some("a".into()), rail: Some(0), rate_bytes_per_second: Some(1e9) },
            tx_bytes: 1e6,
            pause_seconds: pause,
            xmit_wait_ticks: wait_ticks,
            ..Default::default()
        }
    }

    #[test]
    fn a_pause_seen_by_both_counters_is_counted_once() {
        let p = Params::default();
        // Paused 300 µs by PFC; transmit wait counted the same 300 µs (75 000 ticks of 4 ns).
        let w = nic(300e-6, 75_000.0);
        let c = Congestion::from_windows(&[&w], 1e9, None, 1.0, &|_| Some(1e6), &p);
        assert!((c.seconds - 300e-6).abs() < 1e-12, "{}", c.seconds);
        // Transmit wait beyond the pause (credits, not PFC): the larger one is the stall.
        let w = nic(100e-6, 125_000.0);
        let c = Congestion::from_windows(&[&w], 1e9, None, 1.0, &|_| Some(1e6), &p);
        assert!((c.seconds - 500e-6).abs() < 1e-12, "{}", c.seconds);
        assert!((c.pause_seconds - 100e-6).abs() < 1e-12 && (c.xmit_wait_seconds - 500e-6).abs() < 1e-12);
    }

    #[test]
    fn other_traffic_on_parallel_hosts_delays_by_the_worst_host_not_the_sum() {
        // A 2-rank ring over two hosts' uplinks (1 MB/s): each host sends 1 MB of ours and
        // carries another job's burst, 0.5 MB on host a and 0.25 MB on host b, both queued.
        let on = |host: &str, tx: f64| {
            let mut w = nic(0.0, 0.0);
            w.nic.host = Some(host.into());
            w.tx_bytes = tx;
            w.max_backlog_bytes = 1e5;
            w
        };
        let (a, b) = (on("a", 1.5e6), on("b", 1.25e6));
        let c = Congestion::from_windows(&[&a, &b], 1e6, None, 1.0, &|_| Some(1e6), &Params::default());
        assert!((c.other_traffic_bytes - 0.5e6).abs() < 1e-6, "{c:?}");
        assert!((c.seconds - 0.5).abs() < 1e-9, "one burst of 0.5 s, not 0.75 s: {c:?}");
        assert!((c.other_traffic_all_hosts_bytes - 0.75e6).abs() < 1e-6, "{c:?}");
        // A host whose bytes of ours are not known adds nothing.
        let c = Congestion::from_windows(&[&a, &b], 1e6, None, 1.0, &|h| (h == "b").then_some(1e6), &Params::default());
        assert!((c.seconds - 0.25).abs() < 1e-9, "{c:?}");
    }

    #[test]
    fn ecn_marks_and_retransmits_are_evidence_not_seconds() {
        let mut w = nic(0.0, 0.0);
        w.ecn_marked = 5000.0;
        w.cnp_sent = 300.0;
        w.retransmits = 12.0;
        let c = Congestion::from_windows(&[&w], 1e9, None, 1.0, &|_| Some(1e6), &Params::default());
        assert_eq!(c.seconds, 0.0);
        let e = c.to_evidence();
        assert_eq!(e["ecn_marked_packets"], 5000.0);
        assert_eq!(e["retransmits"], 12.0);
    }
}
