//! Links each traced process to the NICs it uses ([`crate::timeline::links`]): the interfaces
//! of the local addresses of its TCP connections — its sockets' inodes from `/proc/<pid>/fd`
//! matched with one `sock_diag` dump of the namespace — narrowed by the interface variables it
//! sets (`NCCL_SOCKET_IFNAME`, `GLOO_SOCKET_IFNAME`, from the allowlisted environment).
//!
//! RDMA traffic has no socket. On a host with RDMA ports (the topology's, read under the
//! configured sysfs root) a process is linked to them only by what it says about them
//! ([`rdma_use`]): `NCCL_IB_HCA` (NCCL's HCA list), `UCX_NET_DEVICES` (UCX's device list, as
//! OpenMPI's UCX layer reads it), or `NCCL_IB_DISABLE=1` / `NCCL_NET=Socket` (no RDMA at all).
//! Without those, NCCL picks the HCA nearest the process's GPU on the PCI tree: when the
//! profiler plugin reported the process's CUDA device, the ports whose nearest GPU (the
//! topology's) it is are the link. A process that says nothing and reports no GPU keeps an
//! incomplete link and its collectives every NIC as a candidate (the sampled `ncclIb*`
//! requests' devices are not used).

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

/// What a traced process says about itself: its allowlisted environment and, when its
/// profiler plugin reported one, its GPU's PCI address.
#[derive(Clone, Copy, Debug)]
pub struct Says<'a> {
    pub pid: u32,
    pub env: &'a BTreeMap<String, String>,
    pub gpu: Option<&'a str>,
}

/// The link of one process from its sockets' connections, its environment and its GPU.
pub fn link(host: &str, p: Says<'_>, inodes: &BTreeSet<u32>, conns: &[TcpConn], iface_of: &BTreeMap<IpAddr, String>, rdma: &[RdmaPort]) -> ProcessLink {
    let (pid, env) = (p.pid, p.env);
    let mut l = ProcessLink { host: host.into(), pid, ..Default::default() };
    match rdma_use(env, p.gpu, rdma) {
        RdmaUse::NoDevices => l.complete = true,
        RdmaUse::Unknown => {}
        RdmaUse::Disabled(how) => {
            l.complete = true;
            l.how.insert("rdma".into(), how);
        }
        RdmaUse::Ports(ports) => {
            l.complete = true;
            for (nic, how) in ports {
                l.nics.insert(nic.clone());
                l.how.insert(nic, how);
            }
        }
    }
    // gloo's variable names interfaces exactly; NCCL's are prefixes unless `=`.
    let specs: Vec<(&str, String)> =
        [("NCCL_SOCKET_IFNAME", ""), ("GLOO_SOCKET_IFNAME", "=")].iter().filter_map(|(k, exact)| env.get(*k).map(|v| (*k, format!("{exact}{v}")))).collect();
    for c in conns.iter().filter(|c| inodes.contains(&c.inode)) {
        let Some(iface) = crate::sources::tcp::nic_of(c, iface_of) else { continue };
        if !specs.iter().all(|(_, v)| ifname_matches(v, iface)) {
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

/// One RDMA port of this host and the name the counter sources give it (its netdev, else
/// `device/port`, as `sources::nic` names it).
#[derive(Clone, Debug, PartialEq)]
pub struct RdmaPort {
    pub device: String,
    pub port: Option<u32>,
    pub nic: String,
    /// The GPU nearest the port on the PCI tree (the topology's), PCI address.
    pub gpu: Option<String>,
}

impl RdmaPort {
    /// ` port N` when the port is known, for the link's how-text.
    fn port_suffix(&self) -> String {
        self.port.map_or(String::new(), |n| format!(" port {n}"))
    }

    /// The RDMA ports of a discovered topology.
    pub fn of(topo: &crate::topology::Topology) -> Vec<RdmaPort> {
        topo.nics
            .iter()
            .filter_map(|n| {
                let device = n.ib_device.clone()?;
                let nic = n.netdev.clone().unwrap_or_else(|| format!("{device}/{}", n.port.unwrap_or(1)));
                Some(RdmaPort { device, port: n.port, nic, gpu: n.gpu.clone() })
            })
            .collect()
    }
}

/// What a process says about its RDMA traffic.
#[derive(Debug, PartialEq)]
pub enum RdmaUse {
    /// The host has no RDMA port: sockets are all there is.
    NoDevices,
    /// Nothing said: it may use any port.
    Unknown,
    /// It uses none (how it says so).
    Disabled(String),
    /// Only these ports (NIC name, how linked).
    Ports(Vec<(String, String)>),
}

/// NCCL's HCA list syntax (`NCCL_IB_HCA`): comma-separated `device[:port]` prefixes of device
/// names; `=` first makes them exact names; `^` first excludes them. A port, when given,
/// must match.
pub fn hca_matches(spec: &str, device: &str, port: Option<u32>) -> bool {
    let (exclude, rest) = spec.strip_prefix('^').map_or((false, spec), |r| (true, r));
    let (exact, rest) = rest.strip_prefix('=').map_or((false, rest), |r| (true, r));
    let hit = rest.split(',').map(str::trim).filter(|e| !e.is_empty()).any(|e| {
        let (d, p) = e.split_once(':').map_or((e, None), |(d, p)| (d, Some(p.parse::<u32>().ok())));
        let dev = if exact { device == d } else { device.starts_with(d) };
        dev && p.is_none_or(|p| p.is_some() && p == port)
    });
    hit != exclude
}

/// Which RDMA ports `env` confines a process to. `UCX_NET_DEVICES` lists exact `device:port`
/// names (and netdevs, for UCX's TCP transport, which sock_diag sees anyway); `all` or unset
/// says nothing. Both variables set: the ports either names. Neither: the ports nearest the
/// process's GPU (`gpu`, a PCI address), as NCCL chooses by default, when it is known and
/// one is.
pub fn rdma_use(env: &BTreeMap<String, String>, gpu: Option<&str>, ports: &[RdmaPort]) -> RdmaUse {
    if ports.is_empty() {
        return RdmaUse::NoDevices;
    }
    let var = |k: &str| env.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
    if var("NCCL_IB_DISABLE") == Some("1") {
        return RdmaUse::Disabled("NCCL_IB_DISABLE=1: no RDMA".into());
    }
    if var("NCCL_NET").is_some_and(|n| n.eq_ignore_ascii_case("socket")) {
        return RdmaUse::Disabled("NCCL_NET=Socket: no RDMA".into());
    }
    let hca = var("NCCL_IB_HCA");
    let ucx = var("UCX_NET_DEVICES").filter(|v| !v.eq_ignore_ascii_case("all"));
    if hca.is_none() && ucx.is_none() {
        return gpu.map_or(RdmaUse::Unknown, |g| nearest_ports(g, ports));
    }
    let ucx_names = |p: &RdmaPort| {
        let name = format!("{}:{}", p.device, p.port.unwrap_or(1));
        ucx.is_some_and(|u| u.split(',').map(str::trim).any(|e| e == name))
    };
    let linked = ports
        .iter()
        .filter_map(|p| {
            let port = p.port_suffix();
            let how = if hca.is_some_and(|h| hca_matches(h, &p.device, p.port)) {
                format!("NCCL_IB_HCA={} → {}{port}", hca.unwrap_or_default(), p.device)
            } else if ucx_names(p) {
                format!("UCX_NET_DEVICES={} → {}{port}", ucx.unwrap_or_default(), p.device)
            } else {
                return None;
            };
            Some((p.nic.clone(), how))
        })
        .collect();
    RdmaUse::Ports(linked)
}

/// The ports whose nearest GPU is `gpu` (Unknown when none is: a GPU the topology does not
/// know, or one without a NIC of its own).
fn nearest_ports(gpu: &str, ports: &[RdmaPort]) -> RdmaUse {
    let near: Vec<(String, String)> = ports
        .iter()
        .filter(|p| p.gpu.as_deref() == Some(gpu))
        .map(|p| {
            (p.nic.clone(), format!("GPU {gpu} (its CUDA device, from the profiler plugin) → nearest HCA {}{} on the PCI tree", p.device, p.port_suffix()))
        })
        .collect();
    if near.is_empty() {
        RdmaUse::Unknown
    } else {
        RdmaUse::Ports(near)
    }
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
    rdma: Vec<RdmaPort>,
    known: BTreeMap<u32, (ProcessLink, Instant)>,
    /// Processes seen by a refresh after one of their calls returned.
    settled: BTreeSet<u32>,
    /// Processes seen by a refresh with their GPU known.
    with_gpu: BTreeSet<u32>,
}

impl Default for Linker {
    fn default() -> Self {
        let topo = crate::topology::discover(Path::new("/sys"), &BTreeMap::new());
        Linker {
            diag: SockDiag::open().ok(),
            last: None,
            rdma: RdmaPort::of(&topo),
            known: BTreeMap::new(),
            settled: BTreeSet::new(),
            with_gpu: BTreeSet::new(),
        }
    }
}

impl Linker {
    /// The host's RDMA ports, from the topology the agent discovered (under its sysfs root).
    pub fn set_rdma_ports(&mut self, ports: Vec<RdmaPort>) {
        self.rdma = ports;
    }

    /// Every kept link, when a refresh of `procs` (what each says, whether a call of it has
    /// returned) was due: every [`REFRESH`], and at once (at the next rescan)
    /// when a process that has returned from a call was not yet seen since.
    ///
    /// A link seen before the process's first call returned is never complete: a job opens its
    /// connections in its first collective, and a process seen without them would otherwise be
    /// linked to no NIC at all — every NIC of its steps filtered away.
    pub fn refresh<'a>(&mut self, host: &str, proc_root: &Path, procs: impl Iterator<Item = (Says<'a>, bool)>) -> Option<Vec<ProcessLink>> {
        let procs: Vec<_> = procs.collect();
        let news = procs.iter().any(|(p, called)| (*called && !self.settled.contains(&p.pid)) || (p.gpu.is_some() && !self.with_gpu.contains(&p.pid)));
        if self.last.is_some_and(|t| t.elapsed() < REFRESH) && !news {
            return None;
        }
        let now = Instant::now();
        self.last = Some(now);
        let diag = self.diag.as_mut()?;
        let conns = diag.dump().map(|(c, _)| c).unwrap_or_default();
        let iface_of = crate::sources::tcp::interface_addresses();
        for (says, called) in procs {
            let pid = says.pid;
            let new = link(host, says, &socket_inodes(proc_root, pid), &conns, &iface_of, &self.rdma);
            let e = self.known.entry(pid).or_insert_with(|| (new.clone(), now));
            e.0.nics.extend(new.nics);
            for (nic, how) in new.how {
                e.0.how.entry(nic).or_insert(how);
            }
            e.0.complete = new.complete && called;
            e.1 = now;
            if called {
                self.settled.insert(pid);
            }
            if says.gpu.is_some() {
                self.with_gpu.insert(pid);
            }
        }
        self.known.retain(|_, (_, seen)| now.duration_since(*seen) < KEEP);
        self.settled.retain(|p| self.known.contains_key(p));
        self.with_gpu.retain(|p| self.known.contains_key(p));
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

    fn dgx(n: usize) -> Vec<RdmaPort> {
        (0..n)
            .map(|i| RdmaPort { device: format!("mlx5_{i}"), port: Some(1), nic: format!("ibp{i}s0"), gpu: Some(format!("0000:{:02x}:00.0", 0x12 + 0x20 * i)) })
            .collect()
    }

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn says(pid: u32, env: &BTreeMap<String, String>) -> Says<'_> {
        Says { pid, env, gpu: None }
    }

    fn linked(u: RdmaUse) -> Vec<String> {
        match u {
            RdmaUse::Ports(p) => p.into_iter().map(|(n, _)| n).collect(),
            other => panic!("not ports: {other:?}"),
        }
    }

    #[test]
    fn nccl_hca_lists_match_as_nccl_reads_them() {
        // Prefixes (mlx5_1 is also a prefix of mlx5_10), exact names, exclusions, ports.
        assert!(hca_matches("mlx5_1", "mlx5_10", Some(1)) && !hca_matches("=mlx5_1", "mlx5_10", Some(1)));
        assert!(hca_matches("mlx5_0:1,mlx5_1:1", "mlx5_1", Some(1)) && !hca_matches("mlx5_0:2", "mlx5_0", Some(1)));
        assert!(!hca_matches("^mlx5_3", "mlx5_3", Some(1)) && hca_matches("^mlx5_3", "mlx5_2", Some(1)));
        assert!(!hca_matches("^=mlx5_1", "mlx5_1", Some(1)) && hca_matches("^=mlx5_1", "mlx5_10", Some(1)));
        assert!(!hca_matches("mlx5_0:x", "mlx5_0", Some(1)), "an unreadable port matches nothing");
    }

    #[test]
    fn a_process_is_linked_to_the_rdma_ports_it_names() {
        let ports = dgx(8);
        assert_eq!(rdma_use(&env(&[]), None, &[]), RdmaUse::NoDevices);
        assert_eq!(rdma_use(&env(&[("NCCL_SOCKET_IFNAME", "eth0")]), None, &ports), RdmaUse::Unknown);
        assert_eq!(rdma_use(&env(&[("UCX_NET_DEVICES", "all")]), None, &ports), RdmaUse::Unknown);
        assert!(matches!(rdma_use(&env(&[("NCCL_IB_DISABLE", "1")]), None, &ports), RdmaUse::Disabled(_)));
        assert!(matches!(rdma_use(&env(&[("NCCL_NET", "Socket")]), None, &ports), RdmaUse::Disabled(_)));
        assert_eq!(linked(rdma_use(&env(&[("NCCL_IB_HCA", "=mlx5_0:1,mlx5_1:1")]), None, &ports)), ["ibp0s0", "ibp1s0"]);
        assert_eq!(linked(rdma_use(&env(&[("NCCL_IB_HCA", "^mlx5_0,mlx5_1,mlx5_2,mlx5_3")]), None, &ports)), ["ibp4s0", "ibp5s0", "ibp6s0", "ibp7s0"]);
        assert_eq!(linked(rdma_use(&env(&[("UCX_NET_DEVICES", "mlx5_2:1, eth0")]), None, &ports)), ["ibp2s0"]);
        // A list naming no port of this host confines it to none of them.
        assert!(linked(rdma_use(&env(&[("NCCL_IB_HCA", "=mlx4_0")]), None, &ports)).is_empty());
        let RdmaUse::Ports(p) = rdma_use(&env(&[("NCCL_IB_HCA", "mlx5_3")]), None, &ports) else { panic!("ports") };
        assert_eq!(p, [("ibp3s0".to_string(), "NCCL_IB_HCA=mlx5_3 → mlx5_3 port 1".to_string())]);
    }

    #[test]
    fn a_process_that_names_no_port_is_linked_to_the_ports_nearest_its_gpu() {
        let ports = dgx(8);
        // GPU 2 (0000:52:00.0) sits under the same PCI switch as mlx5_2.
        let RdmaUse::Ports(p) = rdma_use(&env(&[]), Some("0000:52:00.0"), &ports) else { panic!("ports") };
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].0, "ibp2s0");
        assert!(p[0].1.contains("GPU 0000:52:00.0") && p[0].1.contains("mlx5_2 port 1"), "{p:?}");
        // Two ports sharing one GPU's switch are both its own.
        let mut two = dgx(8);
        two[3].gpu = two[2].gpu.clone();
        assert_eq!(linked(rdma_use(&env(&[]), Some("0000:52:00.0"), &two)), ["ibp2s0", "ibp3s0"]);
        // What the process names wins over its GPU; a GPU the topology does not know says nothing.
        assert_eq!(linked(rdma_use(&env(&[("NCCL_IB_HCA", "=mlx5_5")]), Some("0000:52:00.0"), &ports)), ["ibp5s0"]);
        assert!(matches!(rdma_use(&env(&[("NCCL_IB_DISABLE", "1")]), Some("0000:52:00.0"), &ports), RdmaUse::Disabled(_)));
        assert_eq!(rdma_use(&env(&[]), Some("0000:99:00.0"), &ports), RdmaUse::Unknown);
        assert_eq!(rdma_use(&env(&[]), None, &ports), RdmaUse::Unknown);
    }

    #[test]
    fn a_gpu_reported_after_the_first_call_completes_the_link_at_once() {
        let mut linker = Linker::default();
        linker.set_rdma_ports(dgx(8));
        let me = std::process::id();
        let env = BTreeMap::new();
        let first = linker.refresh("h", Path::new("/proc"), [(says(me, &env), true)].into_iter()).expect("the first refresh is due");
        assert!(!first[0].complete, "no GPU yet, no HCA named: every NIC stays a candidate: {first:?}");
        let gpu = Says { gpu: Some("0000:f2:00.0"), ..says(me, &env) };
        let after = linker.refresh("h", Path::new("/proc"), [(gpu, true)].into_iter()).expect("refreshed when the GPU became known");
        assert!(after[0].complete && after[0].nics.contains("ibp7s0"), "{after:?}");
        assert!(after[0].how["ibp7s0"].contains("GPU 0000:f2:00.0"), "{after:?}");
        assert!(linker.refresh("h", Path::new("/proc"), [(gpu, true)].into_iter()).is_none(), "once per process");
    }

    #[test]
    fn a_real_connection_links_this_process_to_its_interface() {
        // 127.0.0.1 → 127.0.0.2 (loopback's source address for any 127/8 peer): two local
        // addresses, so each can play a NIC's address.
        let l = TcpListener::bind("127.0.0.2:0").expect("listen");
        let _tx = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (_rx, _) = l.accept().expect("accept");
        let (conns, _) = SockDiag::open().expect("sock_diag").dump().expect("dump");
        let me = std::process::id();
        let inodes = socket_inodes(Path::new("/proc"), me);
        let ours: Vec<&TcpConn> = conns.iter().filter(|c| inodes.contains(&c.inode)).collect();
        assert!(ours.len() >= 2, "both ends of our connection are ours: {ours:?}");
        let env = BTreeMap::new();
        let (a1, a2) = (IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)));
        // Loopback is not a NIC.
        let iface_of: BTreeMap<IpAddr, String> = [(a1, "lo".to_string()), (a2, "lo".to_string())].into();
        let link0 = link("h", says(me, &env), &inodes, &conns, &iface_of, &[]);
        assert!(link0.nics.is_empty() && link0.complete, "{link0:?}");
        // Both ends at this host's addresses: routed over lo whatever interface holds them.
        let iface_of: BTreeMap<IpAddr, String> = [(a1, "rail0".to_string()), (a2, "rail1".to_string())].into();
        let own = link("h", says(me, &env), &inodes, &conns, &iface_of, &[]);
        assert!(own.nics.is_empty(), "a connection to this host's own address uses no NIC: {own:?}");
        // The peer elsewhere: the local address's interface is the NIC.
        let iface_of: BTreeMap<IpAddr, String> = [(a1, "rail0".to_string())].into();
        let l1 = link("h", says(me, &env), &inodes, &conns, &iface_of, &[]);
        assert_eq!(l1.nics.iter().collect::<Vec<_>>(), ["rail0"]);
        assert!(l1.how["rail0"].starts_with("tcp 127.0.0.1:") && l1.how["rail0"].contains("→ 127.0.0.2:"), "{l1:?}");
        // NCCL_SOCKET_IFNAME excluding it, or an RDMA host (incomplete).
        let env: BTreeMap<String, String> = [("NCCL_SOCKET_IFNAME".to_string(), "^rail".to_string())].into();
        assert!(link("h", says(me, &env), &inodes, &conns, &iface_of, &[]).nics.is_empty());
        let ports = [RdmaPort { device: "mlx5_0".into(), port: Some(1), nic: "ib0".into(), gpu: None }];
        assert!(!link("h", says(me, &BTreeMap::new()), &inodes, &conns, &iface_of, &ports).complete);
        // On an RDMA host, NCCL_IB_HCA completes the link: the socket's NIC and the HCA's.
        let env: BTreeMap<String, String> = [("NCCL_IB_HCA".to_string(), "=mlx5_0:1".to_string())].into();
        let l2 = link("h", says(me, &env), &inodes, &conns, &iface_of, &ports);
        assert!(l2.complete && l2.nics.iter().eq(["ib0", "rail0"].iter()), "{l2:?}");
        // Another process's sockets are not ours.
        assert!(link("h", says(me, &BTreeMap::new()), &BTreeSet::new(), &conns, &iface_of, &[]).nics.is_empty());
    }

    #[test]
    fn a_link_seen_before_the_first_call_returned_is_not_complete() {
        let l = TcpListener::bind("127.0.0.1:0").expect("listen");
        let _tx = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let mut linker = Linker::default();
        linker.set_rdma_ports(Vec::new());
        let me = std::process::id();
        let env = BTreeMap::new();
        let first = linker.refresh("h", Path::new("/proc"), [(says(me, &env), false)].into_iter()).expect("the first refresh is due");
        assert!(!first[0].complete, "seen before any call returned: every NIC stays a candidate: {first:?}");
        assert!(linker.refresh("h", Path::new("/proc"), [(says(me, &env), false)].into_iter()).is_none(), "the next one waits for REFRESH");
        // Its first call returned: refreshed at once, and complete from then on.
        let after = linker.refresh("h", Path::new("/proc"), [(says(me, &env), true)].into_iter()).expect("refreshed after the first call");
        assert!(after[0].complete, "{after:?}");
        assert!(linker.refresh("h", Path::new("/proc"), [(says(me, &env), true)].into_iter()).is_none(), "once per process");
    }
}
