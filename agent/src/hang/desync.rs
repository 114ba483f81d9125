//! The daemon's desync watch: [`crate::timeline::desync::find`] over this host's recent calls
//! and open calls at every engine tick; a `WARN` line and `stepwise_collective_desyncs_total`
//! (label `library`) once per desync, and the desyncs seen in the last
//! [`super::detector::LINGER_SECONDS`] for `/api/v1/open`.
//!
//! One desync is one communicator and the processes of its odd ranks: a rank that skipped a
//! collective disagrees at every later number, and a window of history that moves past the
//! first diverging number must not count it again. The first diverging number reported
//! stays the one served.

use crate::export::reference::RegisterSampled as _;
use std::collections::HashMap;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};
use tracing::warn;

use super::detector::{LINGER_SECONDS, MAX_COMM_LABELS};
use crate::timeline::desync::Desync;

/// Desyncs remembered at most (the oldest seen are forgotten first).
pub const MAX_REMEMBERED: usize = 1024;

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LibLabels {
    library: String,
}

/// (communicator, pids of the odd ranks).
type Key = (String, Vec<u32>);

pub struct Watch {
    seen: HashMap<Key, (Desync, f64)>,
    total: Family<LibLabels, Counter>,
}

impl Watch {
    pub fn new(r: &mut Registry) -> Watch {
        let total = Family::default();
        r.register_sampled(
            "stepwise_collective_desyncs",
            "Desyncs found: ranks of a communicator whose calls at one sequence number differ in operation or bytes",
            total.clone(),
        );
        Watch { seen: HashMap::new(), total }
    }

    /// Takes this tick's findings at wall time `now`; returns how many were new.
    pub fn update(&mut self, found: Vec<Desync>, now: f64) -> usize {
        let mut new = 0;
        for d in found {
            let mut pids: Vec<u32> = d.calls.iter().filter(|c| d.odd_ranks.contains(&c.rank)).map(|c| c.pid).collect();
            pids.sort_unstable();
            let key = (d.comm.clone(), pids);
            match self.seen.get_mut(&key) {
                // The same first number: later calls may have shown more (a shift).
                Some(e) if e.0.seq == d.seq => *e = (d, now),
                Some(e) => e.1 = now,
                None => {
                    warn!(comm = %d.comm, library = %d.library, seq = d.seq, odd_ranks = ?d.odd_ranks, "collective desync: {}", d.summary());
                    let lib = if matches!(d.library.as_str(), "nccl" | "mpi" | "gloo") { d.library.clone() } else { "other".into() };
                    self.total.get_or_create(&LibLabels { library: lib }).inc();
                    self.seen.insert(key, (d, now));
                    new += 1;
                }
            }
        }
        self.seen.retain(|_, (_, t)| now - *t < LINGER_SECONDS);
        while self.seen.len() > MAX_REMEMBERED {
            let Some(k) = self.seen.iter().min_by(|a, b| a.1 .1.total_cmp(&b.1 .1)).map(|(k, _)| k.clone()) else { break };
            self.seen.remove(&k);
        }
        new
    }

    /// The desyncs seen in the last [`LINGER_SECONDS`], the latest first (at most
    /// [`MAX_COMM_LABELS`]).
    pub fn desyncs(&self) -> Vec<Desync> {
        let mut v: Vec<&(Desync, f64)> = self.seen.values().collect();
        v.sort_by(|a, b| b.0.since.total_cmp(&a.0.since));
        v.into_iter().take(MAX_COMM_LABELS).map(|e| e.0.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::desync::{judge, CallState, RankCall};

    fn desync(seq: u64, pid_of_odd: u32) -> Desync {
        let calls = (0..4u32)
            .map(|r| RankCall {
                rank: r,
                host: "a".into(),
                pid: if r == 2 { pid_of_odd } else { 100 + r },
                op: if r == 2 { "broadcast" } else { "all_reduce" }.into(),
                bytes: Some(64),
                state: CallState::Done,
                enter: 10.0 + seq as f64,
            })
            .collect();
        judge("w", "mpi", seq, calls).expect("a desync")
    }

    #[test]
    fn a_desync_is_counted_once_while_its_window_moves_on() {
        let mut r = Registry::default();
        let mut w = Watch::new(&mut r);
        assert_eq!(w.update(vec![desync(4, 102)], 100.0), 1);
        // The same ranks' processes, the history now starting past #4: not new, and #4 stays.
        assert_eq!(w.update(vec![desync(9, 102)], 101.0), 0);
        assert_eq!(w.desyncs().iter().map(|d| d.seq).collect::<Vec<_>>(), [4]);
        // Another incarnation of the job: new.
        assert_eq!(w.update(vec![desync(4, 902)], 102.0), 1);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).expect("encode");
        assert!(text.contains("stepwise_collective_desyncs_total{library=\"mpi\"} 2"), "{text}");
        // Forgotten once not seen for LINGER_SECONDS.
        w.update(Vec::new(), 102.0 + LINGER_SECONDS);
        assert!(w.desyncs().is_empty());
    }
}
