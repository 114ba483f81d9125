//! Links each traced process to the NICs it uses ([`crate::timeline::links`]): the interfaces
//! of the local addresses of its TCP connections — its sockets' inodes from `/proc/<pid>/fd`
//! matched with one `sock_diag` dump of the namespace — narrowed by the interface variables it
//! sets (`NCCL_SOCKET_IFNAME`, `GLOO_SOCKET_IFNAME`, from the allowlisted environment).
//!
//! RDMA traffic has no socket: on a host with RDMA devices (`/sys/class/infiniband`) a link
//! is never `complete`, and the process's collectives keep every NIC as a candidate
//! (linking RDMA ranks through `NCCL_IB_HCA` and the sampled `ncclIb*` devices is not built).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    path::Path,
    time::{Duration, Instant},
};

use crate::{
    sources::tcp::diag::{SockDiag, TcpConn},
    timeline::links::ProcessLink,
};

/// How often links are refreshed (a job opens its connections once, at init).
pub const REFRESH: Duration = Duration::from_secs(2);

/// Inodes of the sockets `pid` holds (`/proc/<pid>/fd/*` → `socket:[inode]`).
pub fn socket_inodes(proc_root: &Path, pid: u32) -> BTreeSet<u32> {
    let Ok(dir) = std::fs::read_dir(proc_root.join(pid.to_string()).join("fd")) else { return BTreeSet::new() };
    dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok()).filter_map(|l| l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()).collect()
}

/// NCCL's interface list syntax (`NCCL_SOCKET_IFNAME`): comma-separated prefixes; `=` before
/// the list makes them exact names; `^` excludes them instead.
pub fn ifname_matches(spec: &str, iface: &str) -> bool {
    let (exclude, rest) = match spec.strip_prefix('^') {
        Some(r) => (true, r),
        None => (false, spec),
    };
    let (exact, rest) = match rest.strip_prefix('=') {
        Some(r) => (true, r),
        None => (false, rest),
    };
    let hit = rest.split(',').map(str::trim).filter(|s| !s.is_empty()).any(|p| if exact { iface == p } else { iface.starts_with(p) });
    hit != exclude
}

/// The link of one process from its sockets' connections and its environment.
pub fn link(
    host: &str,
    pid: u32,
    env: &BTreeMap<String, String>,
    inodes: &BTreeSet<u32>,
    conns: &[TcpConn],
    iface_of: &BTreeMap<IpAddr, String>,
    rdma_host: bool,
) -> ProcessLink {
    let mut l = ProcessLink { host: host.into(), pid, complete: !rdma_host, ..Default::default() };
    // gloo's variable names interfaces exactly; NCCL's are prefixes unless `=`.
    let specs: Vec<(&str, String)> =
        [("NCCL_SOCKET_IFNAME", ""), ("GLOO_SOCKET_IFNAME", "=")].iter().filter_map(|(k, exact)| env.get(*k).map(|v| (*k, format!("{exact}{v}")))).collect();
    for c in conns.iter().filter(|c| inodes.contains(&c.inode)) {
        let Some(iface) = c.local.and_then(|a| iface_of.get(&a)) else { continue };
        if iface == "lo" || !specs.iter().all(|(_, v)| ifname_matches(v, iface)) {
            continue;
        }
        l.nics.insert(iface.to_string());
        l.how.entry(iface.to_string()).or_insert_with(|| {
            let local = c.local.map(|a| a.to_string()).unwrap_or_default();
            let remote = c.remote.map(|a| a.to_string()).unwrap_or_default();
            let via = specs.iter().map(|(k, _)| format!(", {k}={}", env[*k])).collect::<String>();
            format!("tcp {local}:{} → {remote}:{}{via}", c.local_port, c.remote_port)
        });
    }
    l
}

/// Whether the host has RDMA devices (their traffic is invisible to sock_diag).
pub fn rdma_host() -> bool {
    std::fs::read_dir("/sys/class/infiniband").map(|mut d| d.next().is_some()).unwrap_or(false)
}

/// How long a process's link outlives the process: its last steps are attributed after it
/// exited (grace, watermark), and `diagnose` asks for the last 10 minutes.
pub const KEEP: Duration = Duration::from_secs(900);
/// Most processes whose links are kept.
const MAX_KEPT: usize = 16_384;

/// Refreshes the links of the traced processes every [`REFRESH`]. A process's link is every
/// NIC it was seen using over its life — a job closing its connections at the end does not
/// unlink the steps it ran — and is kept [`KEEP`] after it was last seen.
pub struct Linker {
    diag: Option<SockDiag>,
    last: Option<Instant>,
    rdma: bool,
    known: BTreeMap<u32, (ProcessLink, Instant)>,
}

impl Default for Linker {
    fn default() -> Self {
        Linker { diag: SockDiag::open().ok(), last: None, rdma: rdma_host(), known: BTreeMap::new() }
    }
}

impl Linker {
    /// Every kept link, when a refresh of `procs` (pid → allowlisted environment) was due.
    pub fn refresh<'a>(&mut self, host: &str, proc_root: &Path, procs: impl Iterator<Item = (u32, &'a BTreeMap<String, String>)>) -> Option<Vec<ProcessLink>> {
        if self.last.is_some_and(|t| t.elapsed() < REFRESH) {
            return None;
        }
        let now = Instant::now();
        self.last = Some(now);
        let diag = self.diag.as_mut()?;
        let conns = diag.dump().map(|(c, _)| c).unwrap_or_default();
        let iface_of = crate::sources::tcp::interface_addresses();
        for (pid, env) in procs {
            let new = link(host, pid, env, &socket_inodes(proc_root, pid), &conns, &iface_of, self.rdma);
            let e = self.known.entry(pid).or_insert_with(|| (new.clone(), now));
            e.0.nics.extend(new.nics);
            for (nic, how) in new.how {
                e.0.how.entry(nic).or_insert(how);
            }
            e.0.complete = new.complete;
            e.1 = now;
        }
        self.known.retain(|_, (_, seen)| now.duration_since(*seen) < KEEP);
        while self.known.len() > MAX_KEPT {
            let oldest = self.known.iter().min_by_key(|(_, (_, t))| *t).map(|(p, _)| *p);
            oldest.map(|p| self.known.remove(&p));
        }
        let links: Vec<ProcessLink> = self.known.values().map(|(l, _)| l.clone()).collect();
        tracing::debug!(connections = conns.len(), processes = links.len(), ?links, "process NIC links");
        Some(links)
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, TcpListener, TcpStream};

    use super::*;

    #[test]
    fn nccl_interface_lists_match_as_nccl_reads_them() {
        assert!(ifname_matches("rail", "rail0") && ifname_matches("eth,rail", "rail3"));
        assert!(!ifname_matches("=rail", "rail0") && ifname_matches("=rail0,rail1", "rail1"));
        assert!(!ifname_matches("^docker,lo", "docker0") && ifname_matches("^docker,lo", "rail0"));
        assert!(!ifname_matches("^=rail0", "rail0") && ifname_matches("^=rail0", "rail01"));
    }

    #[test]
    fn a_real_connection_links_this_process_to_its_interface() {
        let l = TcpListener::bind("127.0.0.1:0").expect("listen");
        let port = l.local_addr().expect("addr").port();
        let _tx = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        let (_rx, _) = l.accept().expect("accept");
        let (conns, _) = SockDiag::open().expect("sock_diag").dump().expect("dump");
        let me = std::process::id();
        let inodes = socket_inodes(Path::new("/proc"), me);
        let ours: Vec<&TcpConn> = conns.iter().filter(|c| inodes.contains(&c.inode)).collect();
        assert!(ours.len() >= 2, "both ends of our connection are ours: {ours:?}");
        // Loopback is not a NIC; the same connection on a named interface is.
        let env = BTreeMap::new();
        let iface_of: BTreeMap<IpAddr, String> = [(IpAddr::V4(Ipv4Addr::LOCALHOST), "lo".to_string())].into();
        let link0 = link("h", me, &env, &inodes, &conns, &iface_of, false);
        assert!(link0.nics.is_empty() && link0.complete, "{link0:?}");
        let iface_of: BTreeMap<IpAddr, String> = [(IpAddr::V4(Ipv4Addr::LOCALHOST), "rail0".to_string())].into();
        let l1 = link("h", me, &env, &inodes, &conns, &iface_of, false);
        assert_eq!(l1.nics.iter().collect::<Vec<_>>(), ["rail0"]);
        assert!(l1.how["rail0"].starts_with("tcp 127.0.0.1:"), "{l1:?}");
        // NCCL_SOCKET_IFNAME excluding it, or an RDMA host (incomplete).
        let env: BTreeMap<String, String> = [("NCCL_SOCKET_IFNAME".to_string(), "^rail".to_string())].into();
        assert!(link("h", me, &env, &inodes, &conns, &iface_of, false).nics.is_empty());
        assert!(!link("h", me, &BTreeMap::new(), &inodes, &conns, &iface_of, true).complete);
        // Another process's sockets are not ours.
        assert!(link("h", me, &BTreeMap::new(), &BTreeSet::new(), &conns, &iface_of, false).nics.is_empty());
    }
}
