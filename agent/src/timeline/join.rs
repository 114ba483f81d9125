//! Joining calls of all ranks on `(CommId, seq)`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One rank's part in a collective. Times are wall-clock seconds since the epoch.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Arrival {
    pub rank: u32,
    pub host: String,
    pub pid: u32,
    /// When the rank entered the call (its data was ready).
    pub enter: f64,
    /// When the call returned on that rank.
    pub exit: f64,
    #[serde(default)]
    pub aborted: bool,
}

/// One collective operation seen on one or more ranks.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Collective {
    pub comm: String,
    pub seq: u64,
    pub op: String,
    pub library: String,
    /// Payload bytes per rank (count × element size), when known.
    pub bytes: Option<u64>,
    pub nranks: Option<u32>,
    /// Sorted by rank.
    pub arrivals: Vec<Arrival>,
}

impl Collective {
    /// First and last arrival.
    pub fn first_arrival(&self) -> f64 {
        self.arrivals.iter().map(|a| a.enter).fold(f64::INFINITY, f64::min)
    }
    pub fn last_arrival(&self) -> f64 {
        self.arrivals.iter().map(|a| a.enter).fold(f64::NEG_INFINITY, f64::max)
    }
    pub fn last_exit(&self) -> f64 {
        self.arrivals.iter().map(|a| a.exit).fold(f64::NEG_INFINITY, f64::max)
    }
    /// Readiness skew: last arrival − first arrival (docs/models.md §3.2).
    pub fn skew(&self) -> f64 {
        if self.arrivals.len() < 2 {
            0.0
        } else {
            self.last_arrival() - self.first_arrival()
        }
    }
    /// The rank that arrived last.
    pub fn late_rank(&self) -> Option<&Arrival> {
        self.arrivals.iter().max_by(|a, b| a.enter.total_cmp(&b.enter))
    }
    /// Every rank of the communicator was seen.
    pub fn complete(&self) -> bool {
        self.nranks.is_some_and(|n| self.arrivals.len() as u32 >= n)
    }
    /// Time from the last arrival to the last return: the transfer itself once everyone
    /// was ready.
    pub fn transfer(&self) -> f64 {
        (self.last_exit() - self.last_arrival()).max(0.0)
    }
}

/// A call as the API serves it (the subset the join needs).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct CallView {
    pub comm: Option<String>,
    #[serde(default)]
    pub comm_global: bool,
    pub seq: Option<u64>,
    pub op: String,
    pub library: String,
    pub bytes: Option<u64>,
    pub rank: Option<u32>,
    pub nranks: Option<u32>,
    pub host: String,
    pub pid: u32,
    pub enter: f64,
    pub exit: f64,
    #[serde(default)]
    pub aborted: bool,
}

/// Joins calls (from one or many hosts) on `(comm, seq)`. Calls without a communicator or a
/// sequence number (p2p, lifecycle) are skipped. A rank seen twice for the same key (two
/// agents answering for one host) keeps its first call.
pub fn join_calls<'a>(calls: impl IntoIterator<Item = &'a CallView>) -> Vec<Collective> {
    let mut by_key: BTreeMap<(String, u64), Collective> = BTreeMap::new();
    for c in calls {
        let (Some(comm), Some(seq)) = (&c.comm, c.seq) else { continue };
        let e = by_key.entry((comm.clone(), seq)).or_insert_with(|| Collective {
            comm: comm.clone(),
            seq,
            op: c.op.clone(),
            library: c.library.clone(),
            bytes: c.bytes,
            nranks: c.nranks,
            arrivals: Vec::new(),
        });
        let rank = c.rank.unwrap_or(u32::MAX);
        if e.arrivals.iter().any(|a| a.rank == rank && (rank != u32::MAX || a.pid == c.pid && a.host == c.host)) {
            continue;
        }
        e.nranks = e.nranks.or(c.nranks);
        e.bytes = e.bytes.or(c.bytes);
        e.arrivals.push(Arrival { rank, host: c.host.clone(), pid: c.pid, enter: c.enter, exit: c.exit, aborted: c.aborted });
    }
    let mut out: Vec<Collective> = by_key.into_values().collect();
    for c in &mut out {
        c.arrivals.sort_by_key(|a| a.rank);
    }
    out.sort_by(|a, b| a.first_arrival().total_cmp(&b.first_arrival()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn call(comm: &str, seq: u64, rank: u32, host: &str, enter: f64, exit: f64) -> CallView {
        CallView {
            comm: Some(comm.into()),
            comm_global: true,
            seq: Some(seq),
            op: "all_reduce".into(),
            library: "mpi".into(),
            bytes: Some(8000),
            rank: Some(rank),
            nranks: Some(4),
            host: host.into(),
            pid: 100 + rank,
            enter,
            exit,
            aborted: false,
        }
    }

    #[test]
    fn joins_ranks_across_hosts_and_measures_skew() {
        let calls = vec![
            call("c1", 0, 0, "a", 10.000, 10.031),
            call("c1", 0, 1, "a", 10.001, 10.031),
            call("c1", 0, 2, "b", 10.000, 10.031),
            call("c1", 0, 3, "b", 10.030, 10.031),
            call("c1", 1, 0, "a", 10.100, 10.102),
            call("c1", 0, 3, "b", 10.030, 10.031), // duplicate answer
        ];
        let j = join_calls(&calls);
        assert_eq!(j.len(), 2);
        assert_eq!(j[0].arrivals.len(), 4);
        assert!(j[0].complete());
        assert!((j[0].skew() - 0.030).abs() < 1e-9);
        assert_eq!(j[0].late_rank().map(|a| (a.rank, a.host.as_str())), Some((3, "b")));
        assert!((j[0].transfer() - 0.001).abs() < 1e-9);
        assert!(!j[1].complete());
        assert_eq!(j[1].skew(), 0.0);
    }

    #[test]
    fn calls_without_comm_or_seq_are_skipped() {
        let mut c = call("c", 0, 0, "a", 1.0, 2.0);
        c.seq = None;
        assert!(join_calls(&[c]).is_empty());
    }
}
