//! Which NICs each rank's process uses, so a collective's rail and congestion attribution
//! looks only at the NICs that carry its job — not at every NIC of the host, where another
//! job's traffic or a stalled port would be charged to it.
//!
//! A link comes from what the host and the process say (`sources/collectives/links.rs`): the
//! interfaces of the local addresses of the process's TCP connections (sock_diag inodes matched
//! with `/proc/<pid>/fd`), narrowed by `NCCL_SOCKET_IFNAME` / `GLOO_SOCKET_IFNAME` where the
//! process sets them. RDMA traffic has no socket: on a host with RDMA devices a process's link
//! is not `complete`, and its collectives keep every NIC as a candidate.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{Collective, NicWindow};

/// The NICs one process was seen using.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcessLink {
    pub host: String,
    pub pid: u32,
    /// Interface (netdev) names.
    pub nics: BTreeSet<String>,
    /// Per NIC, how it was linked (`tcp 198.18.0.1:41000 → 198.18.0.2:5000`,
    /// `NCCL_SOCKET_IFNAME=rail0`).
    pub how: BTreeMap<String, String>,
    /// The process's traffic can only use these NICs (no RDMA device on the host).
    pub complete: bool,
}

/// Every known process link, by (host, pid).
#[derive(Clone, Debug, Default)]
pub struct Links {
    by: BTreeMap<(String, u32), ProcessLink>,
}

impl Links {
    pub fn new(links: impl IntoIterator<Item = ProcessLink>) -> Links {
        Links { by: links.into_iter().map(|l| ((l.host.clone(), l.pid), l)).collect() }
    }

    pub fn is_empty(&self) -> bool {
        self.by.is_empty()
    }

    /// Per host of `c`'s arrivals, the NICs it may use: `None` when a process there is not
    /// (completely) linked, so every NIC of that host stays a candidate.
    pub fn allowed<'a>(&'a self, c: &'a Collective) -> BTreeMap<&'a str, Option<BTreeSet<&'a str>>> {
        let mut out: BTreeMap<&str, Option<BTreeSet<&str>>> = BTreeMap::new();
        for a in &c.arrivals {
            let link = self.by.get(&(a.host.clone(), a.pid)).filter(|l| l.complete);
            let e = out.entry(a.host.as_str()).or_insert_with(|| Some(BTreeSet::new()));
            match (e.as_mut(), link) {
                (Some(set), Some(l)) => set.extend(l.nics.iter().map(String::as_str)),
                _ => *e = None,
            }
        }
        out
    }

    /// `c`'s counter windows reduced to the NICs its ranks use: a linked host's other NICs
    /// go, and — when every rank of `c` was seen — so do the NICs of hosts none of its ranks
    /// is on. Without any link, the windows stay as they are.
    pub fn filter(&self, c: &Collective, windows: Vec<NicWindow>) -> Vec<NicWindow> {
        if self.by.is_empty() {
            return windows;
        }
        let allowed = self.allowed(c);
        windows
            .into_iter()
            .filter(|w| {
                let Some(host) = w.nic.host.as_deref() else { return true };
                match allowed.get(host) {
                    Some(None) => true,
                    Some(Some(set)) => {
                        let dev = w.nic.name.strip_prefix(host).and_then(|n| n.strip_prefix('/')).unwrap_or(&w.nic.name);
                        set.contains(dev)
                    }
                    None => !c.complete(),
                }
            })
            .collect()
    }

    /// How the NICs of `c`'s hosts were linked, for the step's notes: `server0: rail0 (tcp …)`.
    pub fn describe(&self, c: &Collective) -> Vec<String> {
        let mut seen: BTreeMap<(&str, &str), &str> = BTreeMap::new();
        for a in &c.arrivals {
            if let Some(l) = self.by.get(&(a.host.clone(), a.pid)).filter(|l| l.complete) {
                for (nic, how) in &l.how {
                    seen.entry((l.host.as_str(), nic.as_str())).or_insert(how.as_str());
                }
            }
        }
        seen.into_iter().map(|((h, n), how)| format!("{h}/{n} ({how})")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::{join::Arrival, NicInfo};

    fn coll(hosts: &[(&str, u32)], nranks: u32) -> Collective {
        Collective {
            comm: "c".into(),
            seq: 0,
            op: "all_reduce".into(),
            library: "nccl".into(),
            bytes: Some(1 << 20),
            nranks: Some(nranks),
            arrivals: hosts
                .iter()
                .enumerate()
                .map(|(r, (h, pid))| Arrival {
                    rank: r as u32,
                    host: h.to_string(),
                    pid: *pid,
                    enter: 0.0,
                    exit: 1.0,
                    aborted: false,
                    clock: Default::default(),
                })
                .collect(),
        }
    }

    fn win(host: &str, name: &str) -> NicWindow {
        NicWindow {
            nic: NicInfo { name: name.into(), host: Some(host.into()), rail: None, rate_bytes_per_second: Some(1e9) },
            tx_bytes: 1e6,
            ..Default::default()
        }
    }

    fn link(host: &str, pid: u32, nics: &[&str], complete: bool) -> ProcessLink {
        ProcessLink {
            host: host.into(),
            pid,
            nics: nics.iter().map(|n| n.to_string()).collect(),
            how: nics.iter().map(|n| (n.to_string(), "tcp".to_string())).collect(),
            complete,
        }
    }

    #[test]
    fn only_the_nics_the_ranks_use_carry_their_collective() {
        let c = coll(&[("a", 1), ("b", 2)], 2);
        let w = || vec![win("a", "rail0"), win("a", "rail1"), win("b", "b/rail0"), win("b", "b/rail1"), win("z", "z/rail0")];
        let l = Links::new([link("a", 1, &["rail0"], true), link("b", 2, &["rail0"], true)]);
        let kept: Vec<String> = l.filter(&c, w()).into_iter().map(|w| w.nic.name).collect();
        assert_eq!(kept, ["rail0", "b/rail0"], "the other rail and a host without ranks go");
        assert_eq!(l.describe(&c), ["a/rail0 (tcp)", "b/rail0 (tcp)"]);
        // A process not linked (or on a host with RDMA devices): every NIC of its host stays.
        let l = Links::new([link("a", 1, &["rail0"], true), link("b", 2, &["rail0"], false)]);
        let kept: Vec<String> = l.filter(&c, w()).into_iter().map(|w| w.nic.name).collect();
        assert_eq!(kept, ["rail0", "b/rail0", "b/rail1"]);
        // No links at all: unchanged. A collective not every rank of which was seen keeps
        // the NICs of hosts its unseen ranks may be on.
        assert_eq!(Links::default().filter(&c, w()).len(), 5);
        let partial = coll(&[("a", 1)], 2);
        let l = Links::new([link("a", 1, &["rail0"], true)]);
        let kept: Vec<String> = l.filter(&partial, w()).into_iter().map(|w| w.nic.name).collect();
        assert_eq!(kept, ["rail0", "b/rail0", "b/rail1", "z/rail0"]);
    }

    #[test]
    fn a_process_with_no_nic_leaves_its_collective_none() {
        let c = coll(&[("a", 1), ("a", 2)], 2);
        let l = Links::new([link("a", 1, &[], true), link("a", 2, &[], true)]);
        assert!(l.filter(&c, vec![win("a", "mlx5_3")]).is_empty());
    }
}
