//! Label values shared by several metric families (a leaf module).
//!
//! The `rank` label of per-rank series: the global rank, for the first
//! [`MAX_RANK_LABELS`] distinct ranks this host has seen, then `other`.
//!
//! A host only exports the ranks of its own processes (8 on an 8-GPU node), so a fixed cap on
//! the rank *number* (`rank < 64`) made every rank of node 9 onwards `other`. Capping the
//! number of distinct *values* keeps each host's series bounded however large the job is,
//! while every rank keeps its global number on the host that runs it.

use std::{collections::HashSet, sync::Mutex};

/// Distinct rank values with their own label per host.
pub const MAX_RANK_LABELS: usize = 64;

#[derive(Default)]
pub struct RankLabels {
    seen: Mutex<HashSet<u32>>,
}

impl RankLabels {
    /// The label value of `rank`.
    pub fn label(&self, rank: u32) -> String {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.contains(&rank) || seen.len() < MAX_RANK_LABELS && seen.insert(rank) {
            rank.to_string()
        } else {
            "other".into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_17_of_a_1024_rank_job_keeps_its_global_ranks_and_the_values_stay_bounded() {
        let l = RankLabels::default();
        // Node 17 of 128 × 8 GPUs: ranks 136..144.
        for _ in 0..3 {
            for r in 136..144 {
                assert_eq!(l.label(r), r.to_string());
            }
        }
        // A host that somehow sees every rank of the job: at most 64 values, then `other`.
        let all: HashSet<String> = (0..1024).map(|r| l.label(r)).collect();
        assert_eq!(all.len(), MAX_RANK_LABELS + 1, "64 values plus other");
        assert!(all.contains("other") && all.contains("136"));
    }
}
