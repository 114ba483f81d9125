//! Desync detection: ranks of one communicator that disagree at the same sequence number.
//!
//! Every rank must issue a communicator's collectives in the same order with matching
//! arguments; `(comm, seq)` names the same collective on every rank ([`super::join`]). When
//! the ranks' calls at one sequence number differ in operation or in payload bytes (count ×
//! element size, where the arguments give it) the job hangs, errors or corrupts silently.
//! [`find`] compares, per communicator, every rank's completed, aborted and open call at
//! each sequence number (numbers aligned as the join aligns them) and reports the first
//! number where they diverge, what each rank called there and, when the calls after it
//! show it, that the odd ranks run one collective ahead or behind (a skipped or an extra
//! collective). Not compared: datatype (only its size, through the bytes), root, reduction
//! operator — the probes do not capture them — and gloo's byte counts (its options
//! structure is not decoded). Pure: no I/O.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::{
    join::{seq_offsets, CallView},
    open::{HostProgress, OpenCall},
};

/// Where a rank's call at the diverging number stands.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum CallState {
    Done,
    Open,
    Aborted,
}

/// One rank's call at one sequence number.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RankCall {
    pub rank: u32,
    pub host: String,
    pub pid: u32,
    pub op: String,
    #[serde(default)]
    pub bytes: Option<u64>,
    pub state: CallState,
    /// Wall-clock seconds of its entry (of a completed call known only by its return, as in
    /// a hang view's last completed call: the return).
    pub enter: f64,
}

/// Ranks that made the same call.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Group {
    pub op: String,
    #[serde(default)]
    pub bytes: Option<u64>,
    pub ranks: Vec<u32>,
}

/// Ranks of one communicator that disagree.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Desync {
    pub comm: String,
    pub library: String,
    /// The first sequence number at which the ranks' calls differ.
    pub seq: u64,
    /// What the ranks called there, the largest group first (ties: the lowest rank's).
    pub groups: Vec<Group>,
    /// Each rank's call there, by rank.
    pub calls: Vec<RankCall>,
    /// Ranks outside the first group.
    pub odd_ranks: Vec<u32>,
    /// Sequence numbers seen disagreeing from `seq` on.
    pub diverging: usize,
    /// The odd ranks' calls from `seq` on match the others' at `seq + shift`: 1 when they
    /// skipped a collective, −1 when they made one more. Absent when the calls seen do not
    /// show it: a job that hangs at `seq` has no later calls, and one whose collectives
    /// repeat with period 2 matches both ways.
    #[serde(default)]
    pub shift: Option<i64>,
    /// Wall-clock seconds of the earliest entry at `seq`.
    pub since: f64,
}

fn agree(a_op: &str, a_bytes: Option<u64>, b_op: &str, b_bytes: Option<u64>) -> bool {
    a_op == b_op && (a_bytes.is_none() || b_bytes.is_none() || a_bytes == b_bytes)
}

/// The ranks grouped by what they called (unknown bytes match their operation's group).
pub fn groups<'a>(calls: impl IntoIterator<Item = &'a RankCall>) -> Vec<Group> {
    let mut exact: BTreeMap<(&str, Option<u64>), Vec<u32>> = BTreeMap::new();
    for c in calls {
        exact.entry((c.op.as_str(), c.bytes)).or_default().push(c.rank);
    }
    let mut out: Vec<Group> = exact.iter().filter(|(k, _)| k.1.is_some()).map(|(k, r)| Group { op: k.0.to_string(), bytes: k.1, ranks: r.clone() }).collect();
    for ((op, _), ranks) in exact.iter().filter(|(k, _)| k.1.is_none()) {
        match out.iter_mut().filter(|g| g.op == *op).max_by_key(|g| g.ranks.len()) {
            Some(g) => g.ranks.extend(ranks),
            None => out.push(Group { op: op.to_string(), bytes: None, ranks: ranks.clone() }),
        }
    }
    for g in &mut out {
        g.ranks.sort_unstable();
    }
    out.sort_by(|a, b| b.ranks.len().cmp(&a.ranks.len()).then(a.ranks.first().cmp(&b.ranks.first())));
    out
}

/// The desync at one sequence number, if the calls there disagree.
pub fn judge(comm: &str, library: &str, seq: u64, mut calls: Vec<RankCall>) -> Option<Desync> {
    calls.sort_by_key(|c| c.rank);
    calls.dedup_by_key(|c| c.rank);
    let groups = groups(&calls);
    if groups.len() < 2 {
        return None;
    }
    let mut odd_ranks: Vec<u32> = groups[1..].iter().flat_map(|g| g.ranks.iter().copied()).collect();
    odd_ranks.sort_unstable();
    let since = calls.iter().map(|c| c.enter).fold(f64::INFINITY, f64::min);
    Some(Desync { comm: comm.to_string(), library: library.to_string(), seq, groups, calls, odd_ranks, diverging: 1, shift: None, since })
}

/// One communicator's calls by aligned sequence number and rank.
#[derive(Default)]
struct CommBook {
    comm: String,
    library: String,
    seqs: BTreeMap<u64, BTreeMap<u32, RankCall>>,
}

impl CommBook {
    fn desync(&self) -> Option<Desync> {
        let mut diverging = self.seqs.iter().filter_map(|(s, r)| judge(&self.comm, &self.library, *s, r.values().cloned().collect()));
        let mut d = diverging.next()?;
        d.diverging += diverging.count();
        // A job that repeats a pattern of period 2 matches both ways: no direction claimed.
        let ways: Vec<i64> = [1, -1].into_iter().filter(|k| self.shifted(&d, *k)).collect();
        d.shift = (ways.len() == 1).then(|| ways[0]);
        Some(d)
    }

    /// Every odd rank's call from `d.seq` on matches the others' at the number `k` later,
    /// and such a pair was seen after `d.seq` (at `d.seq` alone, a periodic job's previous
    /// or next collective matches by chance).
    fn shifted(&self, d: &Desync, k: i64) -> bool {
        let mut later = false;
        for (s, ranks) in self.seqs.range(d.seq..) {
            let Some(theirs) = s.checked_add_signed(k).and_then(|t| self.seqs.get(&t)) else { continue };
            let others = groups(theirs.values().filter(|c| !d.odd_ranks.contains(&c.rank)));
            let Some(want) = others.first() else { continue };
            for c in d.odd_ranks.iter().filter_map(|r| ranks.get(r)) {
                if !agree(&c.op, c.bytes, &want.op, want.bytes) {
                    return false;
                }
                later |= *s > d.seq;
            }
        }
        later
    }
}

/// The key of a communicator (a host-local id means nothing on another host).
fn comm_key(comm: &str, global: bool, host: &str) -> String {
    if global {
        comm.to_string()
    } else {
        format!("{comm}@{host}")
    }
}

/// The first desync of every communicator in `calls` (completed and aborted calls, from
/// one or many hosts) and `open` (the hosts' open and aborted calls), numbers aligned as in
/// [`super::join_calls`]. Calls without a rank and user probes are not compared; of a rank
/// seen in several processes (a restarted job with the same communicator id) only the
/// latest process counts.
pub fn find(calls: &[&CallView], open: &[HostProgress]) -> Vec<Desync> {
    let offsets = seq_offsets(calls);
    let shifts = super::align::host_shifts(calls, &offsets);
    let seq_of = |comm: &str, host: &str, pid: u32, raw: u64| -> Option<u64> {
        let off = offsets.get(&(comm, host, pid)).copied().unwrap_or(0) as i64;
        let shift = shifts.get(&(comm, host)).copied().unwrap_or(0);
        u64::try_from(raw as i64 - off + shift).ok()
    };
    // (comm key, library, seq, call)
    let mut all: Vec<(String, &str, u64, RankCall)> = Vec::new();
    for c in calls.iter().filter(|c| c.library != "user") {
        let (Some(comm), Some(raw), Some(rank)) = (c.comm.as_deref(), c.seq, c.rank) else { continue };
        let Some(seq) = seq_of(comm, &c.host, c.pid, raw) else { continue };
        let state = if c.aborted { CallState::Aborted } else { CallState::Done };
        let rc = RankCall { rank, host: c.host.clone(), pid: c.pid, op: c.op.clone(), bytes: c.bytes, state, enter: c.enter };
        all.push((comm_key(comm, c.comm_global, &c.host), c.library.as_str(), seq, rc));
    }
    for v in open {
        for cp in v.comms.iter().filter(|c| c.library != "user") {
            for r in &cp.ranks {
                let Some(rank) = r.rank else { continue };
                let mut add = |o: &OpenCall, state: CallState| {
                    let Some(seq) = seq_of(&cp.comm, &r.host, r.pid, o.seq) else { return };
                    let rc = RankCall { rank, host: r.host.clone(), pid: r.pid, op: o.op.clone(), bytes: o.bytes, state, enter: o.since };
                    all.push((comm_key(&cp.comm, cp.global, &v.host), cp.library.as_str(), seq, rc));
                };
                r.open.iter().for_each(|o| add(o, CallState::Open));
                r.aborted.iter().for_each(|o| add(o, CallState::Aborted));
            }
        }
    }
    // The latest process of each rank.
    let mut latest: HashMap<(&str, u32), (f64, &str, u32)> = HashMap::new();
    for (k, _, _, c) in &all {
        let e = latest.entry((k.as_str(), c.rank)).or_insert((c.enter, c.host.as_str(), c.pid));
        if c.enter > e.0 {
            *e = (c.enter, c.host.as_str(), c.pid);
        }
    }
    let mut books: BTreeMap<&str, CommBook> = BTreeMap::new();
    for (k, lib, seq, c) in &all {
        if latest.get(&(k.as_str(), c.rank)).is_some_and(|l| (l.1, l.2) != (c.host.as_str(), c.pid)) {
            continue;
        }
        let b = books.entry(k.as_str()).or_insert_with(|| CommBook {
            comm: k.split('@').next().unwrap_or(k).to_string(),
            library: lib.to_string(),
            ..Default::default()
        });
        // The first call seen of a rank at a number (a completed call before its open copy).
        b.seqs.entry(*seq).or_default().entry(c.rank).or_insert_with(|| c.clone());
    }
    books.values().filter_map(CommBook::desync).collect()
}

/// The desyncs touching a step whose collectives are `colls`: one whose first number is
/// among the step's numbers of its communicator, or earlier when its odd ranks run shifted
/// (then every later number of theirs disagrees too).
pub fn of_step(desyncs: &[Desync], colls: &[&super::Collective]) -> Vec<Desync> {
    desyncs
        .iter()
        .filter(|d| {
            let seqs = colls.iter().filter(|c| c.comm == d.comm).map(|c| c.seq);
            let (lo, hi) = seqs.fold((u64::MAX, 0), |(a, b), s| (a.min(s), b.max(s)));
            lo <= hi && ((lo..=hi).contains(&d.seq) || (d.shift.is_some() && d.seq < lo))
        })
        .cloned()
        .collect()
}

fn with_bytes(op: &str, bytes: Option<u64>) -> String {
    match bytes {
        Some(b) => format!("{op} ({b} B)"),
        None => op.to_string(),
    }
}

fn ranks_list(r: &[u32]) -> String {
    let names: Vec<String> = r.iter().map(u32::to_string).collect();
    format!("{} {}", if r.len() == 1 { "rank" } else { "ranks" }, names.join(", "))
}

/// `rank 2 runs` / `ranks 1, 2 run`.
fn ranks_run(r: &[u32]) -> String {
    format!("{} {}", ranks_list(r), if r.len() == 1 { "runs" } else { "run" })
}

impl Desync {
    /// `#12: rank 2 called broadcast (4096 B), ranks 0, 1, 3 called all_reduce (4096 B)`
    /// and what the later calls say.
    pub fn summary(&self) -> String {
        let parts: Vec<String> = self.groups.iter().map(|g| format!("{} called {}", ranks_list(&g.ranks), with_bytes(&g.op, g.bytes))).collect();
        let mut s = format!("#{}: {}", self.seq, parts.join(", "));
        match self.shift {
            Some(1) => s.push_str(&format!("; from there {} one collective ahead (skipped one)", ranks_run(&self.odd_ranks))),
            Some(-1) => s.push_str(&format!("; from there {} one collective behind (made an extra one)", ranks_run(&self.odd_ranks))),
            _ => {}
        }
        if self.diverging > 1 {
            s.push_str(&format!("; {} sequence numbers disagree from #{} on", self.diverging, self.seq));
        }
        s
    }
}

#[cfg(test)]
#[path = "desync_tests.rs"]
mod tests;
