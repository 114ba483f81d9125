//! Hang detection: which communicator is stuck, who everyone is waiting for, and what that
//! rank is doing.
//!
//! [`evaluate`] is the rule, pure: over one host's [`HostProgress`] (the daemon) or every
//! host's joined (`agent diagnose --hang`), for each communicator with an open call it finds
//! the oldest open call, the ranks that have not arrived in it, and says whether the
//! communicator is suspected hung ([`crate::config::HangConfig`]): some rank inside longer
//! than `max(floor, k × median)` and at least one rank missing — still before the call,
//! exited, or inside it but not progressing: its process is stopped (SIGSTOP, a debugger),
//! which the view's process states say — or the ranks' calls at that sequence number
//! disagree (operation or bytes: a desync, [`crate::timeline::desync`]). All ranks inside
//! a slow call and running is a slow call, not a hang: with host-side probes alone a rank
//! that is inside and running cannot be told from one that is progressing. [`detector`] adds the daemon's hysteresis and metrics.

pub mod desync;
pub mod detector;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{
    config::HangConfig,
    timeline::{
        desync::{judge, CallState, Desync, RankCall},
        open::{Exit, HostProgress, OpenCall, ProcState, RankProgress},
    },
};

/// Why a rank is missing from the call everyone else is in.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Why {
    /// Its process exited (before or inside the call).
    Exited,
    /// Inside the call, but its process is stopped (state `T`/`t`: SIGSTOP, a debugger): it
    /// cannot progress, and the others cannot finish without it.
    NotProgressing,
    /// Alive, and still before the call (its last completed call is an earlier one).
    NotArrived,
    /// A rank of the communicator no answering host has seen (on a host not asked, or never
    /// traced).
    NotSeen,
}

/// A rank inside the open call.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Inside {
    pub rank: Option<u32>,
    pub host: String,
    pub pid: u32,
    /// Wall-clock seconds of its entry.
    pub since: f64,
    pub seconds: f64,
}

/// A rank everyone else is waiting for.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Missing {
    pub rank: Option<u32>,
    pub host: Option<String>,
    pub pid: Option<u32>,
    pub why: Why,
    /// Its last completed collective on this communicator (sequence number, wall-clock end).
    pub last_done_seq: Option<u64>,
    pub last_done_at: Option<f64>,
    /// The call it was inside when its process died.
    pub aborted: Option<OpenCall>,
    pub exited: Option<Exit>,
    pub state: Option<ProcState>,
}

/// One communicator with an open call, judged.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Hang {
    pub comm: String,
    pub library: String,
    pub nranks: Option<u32>,
    /// The oldest open call's sequence number and operation.
    pub seq: u64,
    pub op: String,
    /// How long its first rank has been inside (to the view's `as_of`).
    pub open_seconds: f64,
    pub threshold_seconds: f64,
    pub median_seconds: Option<f64>,
    pub inside: Vec<Inside>,
    pub missing: Vec<Missing>,
    /// The rule holds now.
    pub rule: bool,
    /// Suspected hung: the rule, or in the daemon the rule with hysteresis.
    pub suspected: bool,
    /// When the daemon raised the suspicion (wall-clock seconds).
    pub suspected_since: Option<f64>,
    /// The ranks' calls at this sequence number disagree (operation or bytes): the cause of
    /// the hang, and evidence for the rule even when every rank is inside.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desync: Option<Desync>,
}

/// Joined ranks of one communicator.
#[derive(Default)]
struct Joined {
    library: String,
    nranks: Option<u32>,
    median: Option<f64>,
    /// Keyed by rank, or by (host, pid) for ranks without a number.
    ranks: BTreeMap<(u32, String, u32), (RankProgress, f64)>,
}

fn join(views: &[HostProgress]) -> BTreeMap<String, Joined> {
    let mut out: BTreeMap<String, Joined> = BTreeMap::new();
    for v in views {
        for c in &v.comms {
            // A host-local id means nothing on another host: such communicators stay apart.
            let key = if c.global { c.comm.clone() } else { format!("{}@{}", c.comm, v.host) };
            let j = out.entry(key).or_default();
            j.library.clone_from(&c.library);
            j.nranks = j.nranks.max(c.nranks);
            j.median = match (j.median, c.median_seconds) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
            for r in &c.ranks {
                let k = match r.rank {
                    Some(n) => (n, String::new(), 0),
                    None => (u32::MAX, r.host.clone(), r.pid),
                };
                // The same rank seen twice (a restarted process): the live one wins.
                let keep = j.ranks.get(&k).is_some_and(|(old, _)| old.exited.is_none() && r.exited.is_some());
                if !keep {
                    j.ranks.insert(k, (r.clone(), v.as_of));
                }
            }
        }
    }
    out
}

/// The ranks' calls at `h.seq` (open, completed or aborted there), if they disagree. A rank
/// inside another call is compared only by that call: its numbers are its own (a process
/// that counted from one more collective after a mid-job attach runs one ahead), and its
/// last completed call at `h.seq` would then be an earlier collective.
fn desync_at(h: &Hang, j: &Joined) -> Option<Desync> {
    let mut calls = Vec::new();
    for (r, _) in j.ranks.values() {
        let Some(rank) = r.rank else { continue };
        if r.open.as_ref().is_some_and(|o| o.seq != h.seq) {
            continue;
        }
        let at = |op: &str, bytes: Option<u64>, state: CallState, enter: f64| RankCall {
            rank,
            host: r.host.clone(),
            pid: r.pid,
            op: op.to_string(),
            bytes,
            state,
            enter,
        };
        if let Some(o) = r.open.as_ref().filter(|o| o.seq == h.seq) {
            calls.push(at(&o.op, o.bytes, CallState::Open, o.since));
        } else if let Some(d) = r.last_done.as_ref().filter(|d| d.seq == h.seq) {
            calls.push(at(&d.op, d.bytes, CallState::Done, d.exit));
        } else if let Some(a) = r.aborted.as_ref().filter(|a| a.seq == h.seq) {
            calls.push(at(&a.op, a.bytes, CallState::Aborted, a.since));
        }
    }
    judge(&h.comm, &h.library, h.seq, calls)
}

/// Judges every communicator with an open call. `count_unseen`: ranks of `nranks` that no
/// view has seen count as missing (cluster mode, every peer answered); a single host cannot
/// see other hosts' ranks, so there they are listed but are no evidence.
pub fn evaluate(views: &[HostProgress], cfg: &HangConfig, count_unseen: bool) -> Vec<Hang> {
    let mut out = Vec::new();
    for (comm, j) in join(views) {
        let Some((oldest, as_of)) =
            j.ranks.values().filter_map(|(r, as_of)| r.open.as_ref().map(|o| (o, *as_of))).min_by(|a, b| a.0.since.total_cmp(&b.0.since))
        else {
            continue;
        };
        let seq = oldest.seq;
        let mut h = Hang {
            comm: comm.split('@').next().unwrap_or(&comm).to_string(),
            library: j.library.clone(),
            nranks: j.nranks,
            seq,
            op: oldest.op.clone(),
            open_seconds: (as_of - oldest.since).max(0.0),
            threshold_seconds: cfg.threshold(j.median),
            median_seconds: j.median,
            ..Default::default()
        };
        for (r, as_of) in j.ranks.values() {
            let arrived = r.open.as_ref().is_some_and(|o| o.seq >= seq) || r.last_done.as_ref().is_some_and(|d| d.seq >= seq);
            // Stopped inside this very call: it holds the others.
            let stuck = r.open.as_ref().is_some_and(|o| o.seq == seq)
                && r.last_done.as_ref().is_none_or(|d| d.seq < seq)
                && r.state.as_ref().is_some_and(|s| s.state.starts_with(['T', 't']));
            match &r.open {
                Some(o) if arrived && !stuck => {
                    h.inside.push(Inside { rank: r.rank, host: r.host.clone(), pid: r.pid, since: o.since, seconds: (as_of - o.since).max(0.0) })
                }
                _ if arrived && r.open.is_none() => {}
                _ => h.missing.push(Missing {
                    rank: r.rank,
                    host: Some(r.host.clone()),
                    pid: Some(r.pid),
                    why: if r.exited.is_some() {
                        Why::Exited
                    } else if stuck {
                        Why::NotProgressing
                    } else {
                        Why::NotArrived
                    },
                    last_done_seq: r.last_done.as_ref().map(|d| d.seq),
                    last_done_at: r.last_done.as_ref().map(|d| d.exit),
                    aborted: r.aborted.clone(),
                    exited: r.exited.clone(),
                    state: r.state.clone(),
                }),
            }
        }
        if let Some(n) = j.nranks {
            let seen: std::collections::BTreeSet<u32> = j.ranks.values().filter_map(|(r, _)| r.rank).collect();
            for rank in (0..n.min(1 << 16)).filter(|r| !seen.contains(r)) {
                h.missing.push(Missing {
                    rank: Some(rank),
                    host: None,
                    pid: None,
                    why: Why::NotSeen,
                    last_done_seq: None,
                    last_done_at: None,
                    aborted: None,
                    exited: None,
                    state: None,
                });
            }
        }
        h.missing.sort_by_key(|m| (m.why, m.rank));
        h.desync = desync_at(&h, &j);
        let evidence = h.missing.iter().any(|m| m.why != Why::NotSeen || count_unseen) || h.desync.is_some();
        h.rule = h.open_seconds > h.threshold_seconds && evidence;
        h.suspected = h.rule;
        out.push(h);
    }
    out.sort_by(|a, b| b.suspected.cmp(&a.suspected).then(b.open_seconds.total_cmp(&a.open_seconds)));
    out
}

#[cfg(test)]
mod tests;
