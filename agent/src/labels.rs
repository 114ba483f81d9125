//! Label values shared by several metric families (a leaf module).
//!
//! The `rank` label of per-rank series: the global rank, for at most [`MAX_RANK_LABELS`]
//! distinct ranks at a time per host, then `other`.
//!
//! A host only exports the ranks of its own processes (8 on an 8-GPU node), so a fixed cap on
//! the rank *number* (`rank < 64`) made every rank of node 9 onwards `other`. Capping the
//! number of distinct *values* keeps each host's series bounded however large the job is,
//! while every rank keeps its global number on the host that runs it. A long-lived agent sees
//! job after job, each with other rank numbers: a value unused for [`RANK_LABEL_IDLE`] gives
//! its place to a new rank, and the caller removes the old value's series.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

/// Distinct rank values with their own label per host.
pub const MAX_RANK_LABELS: usize = 64;
/// Distinct communicators with their own label per host (the per-communicator in-flight
/// series): a host's ranks rarely belong to more than a few at once (data, tensor, pipeline
/// parallel groups).
pub const MAX_COMM_LABELS: usize = 16;
/// How long a rank value must have been unused before a new rank may take its place.
pub const RANK_LABEL_IDLE: Duration = Duration::from_secs(600);

/// At most `max` distinct values of `K` with their own label at a time, then `other`; a value
/// unused for [`RANK_LABEL_IDLE`] gives its place to a new one.
pub struct BoundedLabels<K> {
    max: usize,
    /// Value → when its label was last used.
    seen: Mutex<HashMap<K, Instant>>,
}

/// The `rank` label: the global rank.
pub type RankLabels = BoundedLabels<u32>;

/// Who a traced process is, as labels of its per-rank series (`stepwise_rank_wait_seconds`,
/// `_late_seconds`) besides `rank`: its local rank, its Kubernetes namespace and pod and its
/// GPU's PCI address (empty when unknown), so dashboards filter ranks by them and join them
/// with DCGM's `pci_bus_id` without a join on an info metric. One value per process, so they
/// add no series of their own.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct RankIdentity {
    pub local_rank: String,
    pub namespace: String,
    pub pod: String,
    pub gpu: String,
}
/// The `comm` label: NCCL's communicator hash.
pub type CommLabels = BoundedLabels<u64>;

impl Default for RankLabels {
    fn default() -> Self {
        BoundedLabels::new(MAX_RANK_LABELS)
    }
}

impl Default for CommLabels {
    fn default() -> Self {
        BoundedLabels::new(MAX_COMM_LABELS)
    }
}

/// How a value is written as a label.
pub trait LabelValue: Copy + Eq + std::hash::Hash {
    fn text(self) -> String;
}

impl LabelValue for u32 {
    fn text(self) -> String {
        self.to_string()
    }
}

impl LabelValue for u64 {
    /// A communicator hash: 16 hex digits, as NCCL logs `commHash`.
    fn text(self) -> String {
        format!("{self:016x}")
    }
}

impl<K: LabelValue> BoundedLabels<K> {
    pub fn new(max: usize) -> Self {
        BoundedLabels { max, seen: Mutex::new(HashMap::new()) }
    }

    /// The label value of `v`, and the value whose label it replaced (remove that value's
    /// series).
    pub fn label(&self, v: K) -> (String, Option<K>) {
        self.label_at(v, Instant::now())
    }

    fn label_at(&self, v: K, now: Instant) -> (String, Option<K>) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = seen.get_mut(&v) {
            *t = now;
            return (v.text(), None);
        }
        if seen.len() < self.max {
            seen.insert(v, now);
            return (v.text(), None);
        }
        let idle = seen.iter().min_by_key(|(_, t)| **t).filter(|(_, t)| now.saturating_duration_since(**t) >= RANK_LABEL_IDLE).map(|(r, _)| *r);
        match idle {
            Some(old) => {
                seen.remove(&old);
                seen.insert(v, now);
                (v.text(), Some(old))
            }
            None => ("other".into(), None),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn node_17_of_a_1024_rank_job_keeps_its_global_ranks_and_the_values_stay_bounded() {
        let l = RankLabels::default();
        // Node 17 of 128 × 8 GPUs: ranks 136..144.
        for _ in 0..3 {
            for r in 136..144 {
                assert_eq!(l.label(r), (r.to_string(), None));
            }
        }
        // A host that somehow sees every rank of the job: at most 64 values, then `other`.
        let all: HashSet<String> = (0..1024).map(|r| l.label(r).0).collect();
        assert_eq!(all.len(), MAX_RANK_LABELS + 1, "64 values plus other");
        assert!(all.contains("other") && all.contains("136"));
    }

    #[test]
    fn job_after_job_on_a_long_lived_agent_each_keeps_its_ranks() {
        let l = RankLabels::default();
        let t0 = Instant::now();
        // Ten successive 8-rank jobs on this host, each with other global ranks, an hour apart.
        for job in 0..10u32 {
            let now = t0 + Duration::from_secs(3600 * u64::from(job));
            let mut evicted = Vec::new();
            for r in job * 100..job * 100 + 8 {
                let (v, old) = l.label_at(r, now);
                assert_eq!(v, r.to_string(), "job {job}: rank {r} keeps its number");
                evicted.extend(old);
            }
            // From the ninth job on, the places are full: the oldest job's ranks give theirs.
            let expect: Vec<u32> = if job >= 8 { ((job - 8) * 100..(job - 8) * 100 + 8).collect() } else { Vec::new() };
            evicted.sort();
            assert_eq!(evicted, expect, "job {job}");
        }
        // A rank still in use is never evicted: 64 ranks busy now, a 65th is `other`.
        let l = RankLabels::default();
        for r in 0..64 {
            l.label_at(r, t0 + Duration::from_millis(u64::from(r)));
        }
        let later = t0 + RANK_LABEL_IDLE / 2;
        assert_eq!(l.label_at(1000, later), ("other".into(), None));
        assert_eq!(l.label_at(1000, t0 + RANK_LABEL_IDLE), ("1000".into(), Some(0)), "the least recently used idle rank gives its place");
    }

    #[test]
    fn communicators_are_hex_hashes_sixteen_at_a_time() {
        let l = CommLabels::default();
        assert_eq!(l.label(0xfeed), ("000000000000feed".into(), None));
        for c in 1..MAX_COMM_LABELS as u64 {
            assert_eq!(l.label(c << 32).1, None);
        }
        assert_eq!(l.label(99), ("other".into(), None), "a 17th communicator while 16 are in use");
    }
}
