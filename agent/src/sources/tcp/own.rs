//! The traced processes' own bytes on each interface: which part of a NIC's transmitted bytes
//! is the job's, so that the rest — another program's traffic sharing the NIC — is not blamed
//! on the job's rails (docs/models.md §4, "Whose bytes").
//!
//! The collectives source publishes the processes it traces ([`Owners::publish`], at every
//! rescan). At each `sock_diag` dump this module finds which of the dumped connections those
//! processes hold — the socket inodes of their `/proc/<pid>/fd` links, read again only when a
//! connection of unknown owner appears — and adds, per interface and pid, the wire bytes each
//! of their connections put on the wire since the previous dump: the payload that left the
//! NIC — acknowledged (`tcpi_bytes_acked`), plus the segments in flight (`tcpi_unacked`, less
//! those TCP takes as lost, `tcpi_lost`) less what of them still waits below TCP in the
//! interface's queue or driver (`SK_MEMINFO_WMEM_ALLOC`) — plus one set of headers per
//! segment (payload ÷ MSS data segments, and the pure ACKs, `tcpi_segs_out −
//! tcpi_data_segs_out`) of Ethernet 14 + IP 20 (IPv6 40) + TCP 32 (with the timestamp
//! option) bytes. Not the bytes sent: TCP counts a byte sent when it enters the interface's
//! queue — 200 kB in front of a 10 Mbit/s rail put them 160 ms ahead of the counter — and a
//! segment dropped by a full queue is sent again; not the bytes acknowledged alone: an
//! acknowledgement comes back through the peer's queue (40–100 ms late behind the other half
//! of a bidirectional ring). A segment lost beyond the NIC counts once, when acknowledged
//! (its first copy did cross the NIC: other traffic of that size is reported). A device that
//! passes a GSO/TSO super-packet on uncut counts its headers once, so the estimate is an
//! upper bound of the connection's share of the NIC counter there. A
//! connection absent from the previous dump was established since it: all its bytes are of
//! this interval (at the first dump nothing is known of before).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use super::diag::TcpConn;

/// Which processes are traced: written by the collectives source, read by the tcp source.
#[derive(Clone, Default)]
pub struct Owners(Arc<Mutex<Traced>>);

#[derive(Default)]
struct Traced {
    proc_root: PathBuf,
    pids: Vec<u32>,
    generation: u64,
}

impl Owners {
    /// The traced processes now (`proc_root`: where their `/proc/<pid>` entries are).
    pub fn publish(&self, proc_root: &Path, pids: impl Iterator<Item = u32>) {
        let mut pids: Vec<u32> = pids.collect();
        pids.sort_unstable();
        if let Ok(mut t) = self.0.lock() {
            if t.pids != pids || t.proc_root != proc_root {
                t.pids = pids;
                t.proc_root = proc_root.to_path_buf();
                t.generation += 1;
            }
        }
    }

    fn generation(&self) -> u64 {
        self.0.lock().map(|t| t.generation).unwrap_or_default()
    }

    fn snapshot(&self) -> (u64, PathBuf, Vec<u32>) {
        self.0.lock().map(|t| (t.generation, t.proc_root.clone(), t.pids.clone())).unwrap_or_default()
    }
}

/// Wire bytes of a segment's headers beyond its payload.
fn header_bytes(c: &TcpConn) -> f64 {
    match c.local {
        Some(std::net::IpAddr::V6(_)) => 14.0 + 40.0 + 32.0,
        _ => 14.0 + 20.0 + 32.0,
    }
}

/// A connection's cumulative counters that make up its wire bytes.
#[derive(Clone, Copy, Default)]
struct Counts {
    /// Payload bytes that left the NIC: sent less what still waits below TCP.
    departed: f64,
    pure_acks: u32,
    mss: u32,
    dump: u64,
}

impl Counts {
    fn of(c: &TcpConn, dump: u64) -> Counts {
        let in_flight = f64::from(c.unacked.saturating_sub(c.lost)) * f64::from(c.snd_mss);
        let departed = c.bytes_acked as f64 + (in_flight - f64::from(c.wmem_alloc)).max(0.0);
        Counts { departed, pure_acks: c.segs_out.wrapping_sub(c.data_segs_out), mss: c.snd_mss, dump }
    }

    /// Wire bytes between `self` (earlier) and `now` (negative when the queue estimate grew
    /// by more than the bytes sent).
    fn wire_bytes_to(&self, now: &Counts, header: f64) -> f64 {
        let payload = now.departed - self.departed;
        let data_segments = if now.mss > 0 { (payload / f64::from(now.mss)).ceil() } else { 0.0 };
        payload + (data_segments + f64::from(now.pure_acks.wrapping_sub(self.pure_acks))) * header
    }
}

/// Cap on the connections and inodes remembered (a host's churn must not grow the agent).
const MAX_KEPT: usize = 65_536;

/// Per interface and traced pid, the wire bytes sent (cumulative).
#[derive(Default)]
pub struct OwnTraffic {
    owners: Owners,
    generation: u64,
    /// Socket inode → traced pid holding it.
    inode_pid: HashMap<u32, u32>,
    /// Inodes no traced process held at the last lookup.
    foreign: HashSet<u32>,
    /// Connection cookie → its counters at the dump it was last seen in.
    last: HashMap<u64, Counts>,
    dumps: u64,
    /// `/proc/<pid>/fd` lookups done (one per dump at most).
    pub lookups: u64,
    /// Interface → pid → wire bytes sent, since the agent started.
    pub per_iface: BTreeMap<String, BTreeMap<u32, f64>>,
    /// Interfaces the last dump covered: their own bytes are measured (0 when none).
    pub measured: BTreeSet<String>,
    /// The traced pids whose sockets were read at the last lookup (sorted).
    resolved: Vec<u32>,
    /// The traced connections at the last read, by cookie, with their interface and pid.
    live: HashMap<u64, (String, u32)>,
    /// Interfaces where a traced connection closed since the read before: what it sent
    /// after that read is not known, so their own bytes are not measured at this one.
    closed: BTreeSet<String>,
    /// Connections whose end was counted from their destroy event: a read taken before it
    /// that still lists them is not counted again.
    ended: HashSet<u64>,
    /// Pids no longer traced (their process exited) → the dump that found them gone: they
    /// stay listed with their totals for [`DEPARTED_DUMPS`] dumps, so the bytes they sent
    /// after the read before their exit (counted from their sockets' destroy events) are in
    /// the samples, not lost with the pid.
    departed: BTreeMap<u32, u64>,
}

/// Dumps a departed pid stays listed.
const DEPARTED_DUMPS: u64 = 2;

impl OwnTraffic {
    pub fn new(owners: Owners) -> OwnTraffic {
        OwnTraffic { owners, ..Default::default() }
    }

    /// One dump: `ifaces` are the interfaces it covers, `iface_of` a connection's interface.
    pub fn update(&mut self, conns: &[TcpConn], ifaces: impl Iterator<Item = String>, iface_of: impl Fn(&TcpConn) -> Option<String>) {
        self.dumps += 1;
        let traced = self.resolve(conns);
        let before = std::mem::take(&mut self.live);
        self.add(conns, iface_of);
        let dumped: HashSet<u64> = conns.iter().map(|c| c.cookie).collect();
        self.closed = before.into_iter().filter(|(k, _)| !dumped.contains(k) && !self.ended.contains(k)).map(|(_, (dev, _))| dev).collect();
        self.ended.clear();
        let d = self.dumps;
        self.last.retain(|_, l| d - l.dump <= 2);
        if self.last.len() > MAX_KEPT {
            self.last.clear();
        }
        self.departed.retain(|_, at| d - *at <= DEPARTED_DUMPS);
        let departed = &self.departed;
        for m in self.per_iface.values_mut() {
            m.retain(|p, _| traced.binary_search(p).is_ok() || departed.contains_key(p));
        }
        self.measured = ifaces.collect();
    }

    /// Some of the traced connections read again between dumps (the fast lane's): their bytes
    /// since, nothing forgotten, owners as the last dump resolved them.
    pub fn update_some(&mut self, asked: &[u64], conns: &[TcpConn], iface_of: impl Fn(&TcpConn) -> Option<String>) {
        self.add(conns, iface_of);
        self.ended.clear();
        let answered: HashSet<u64> = conns.iter().map(|c| c.cookie).collect();
        self.closed = asked.iter().filter(|k| !answered.contains(k)).filter_map(|k| self.live.remove(k)).map(|(dev, _)| dev).collect();
    }

    /// The kernel's last `tcp_info` of sockets it freed (`sock_diag` destroy events,
    /// [`super::diag::DestroyEvents`]): a traced connection's bytes up to its end, so that
    /// its closing is not a gap. Returns how many were traced connections.
    pub fn destroyed(&mut self, conns: &[TcpConn]) -> usize {
        let mut n = 0;
        for c in conns {
            let Some((dev, pid)) = self.live.remove(&c.cookie) else { continue };
            self.ended.insert(c.cookie);
            n += 1;
            let Some(prev) = self.last.remove(&c.cookie) else { continue };
            let now = Counts::of(c, self.dumps);
            let total = self.per_iface.entry(dev).or_default().entry(pid).or_default();
            *total = (*total + prev.wire_bytes_to(&now, header_bytes(c))).max(0.0);
        }
        n
    }

    fn add(&mut self, conns: &[TcpConn], iface_of: impl Fn(&TcpConn) -> Option<String>) {
        for c in conns.iter().filter(|c| !self.ended.contains(&c.cookie)) {
            let now = Counts::of(c, self.dumps);
            let prev = self.last.insert(c.cookie, now);
            let Some(&pid) = self.inode_pid.get(&c.inode) else { continue };
            let Some(dev) = iface_of(c) else { continue };
            self.live.insert(c.cookie, (dev.clone(), pid));
            let prev = match prev {
                Some(p) => p,
                None if self.dumps > 1 => Counts::default(),
                None => continue,
            };
            let total = self.per_iface.entry(dev).or_default().entry(pid).or_default();
            *total = (*total + prev.wire_bytes_to(&now, header_bytes(c))).max(0.0);
        }
    }

    /// Brings the inode → pid map up to date for `conns`; the traced pids.
    fn resolve(&mut self, conns: &[TcpConn]) -> Vec<u32> {
        let (generation, root, pids) = self.owners.snapshot();
        let changed = generation != self.generation;
        if changed {
            self.generation = generation;
            self.foreign.clear();
        }
        let unknown = conns.iter().any(|c| !self.inode_pid.contains_key(&c.inode) && !self.foreign.contains(&c.inode));
        if changed || pids.is_empty() {
            let d = self.dumps;
            for &p in self.resolved.iter().filter(|p| pids.binary_search(p).is_err()) {
                self.departed.entry(p).or_insert(d);
            }
            // A pid traced again starts afresh.
            for p in &pids {
                if self.departed.remove(p).is_some() {
                    self.per_iface.values_mut().for_each(|m| _ = m.remove(p));
                }
            }
        }
        if (unknown || changed) && !pids.is_empty() {
            self.lookups += 1;
            self.resolved = pids.clone();
            self.inode_pid = pids.iter().flat_map(|&p| crate::sources::collectives::links::socket_inodes(&root, p).into_iter().map(move |i| (i, p))).collect();
            if self.foreign.len() > MAX_KEPT {
                self.foreign.clear();
            }
            self.foreign.extend(conns.iter().map(|c| c.inode).filter(|i| !self.inode_pid.contains_key(i)));
        } else if pids.is_empty() {
            self.inode_pid.clear();
            self.resolved.clear();
        }
        // Departed pids stay listed a little longer (sorted, as the samples keep them).
        let d = self.dumps;
        self.resolved.retain(|p| pids.binary_search(p).is_ok());
        self.resolved.extend(self.departed.iter().filter(|(_, at)| d - **at < DEPARTED_DUMPS).map(|(p, _)| *p));
        self.resolved.sort_unstable();
        self.resolved.dedup();
        pids
    }

    /// Whether a traced connection of the last read is missing from `conns` (closed since, or
    /// not asked for: only `asked` counts when given).
    pub fn missing(&self, conns: &[TcpConn], asked: Option<&[u64]>) -> bool {
        let have: HashSet<u64> = conns.iter().map(|c| c.cookie).collect();
        match asked {
            Some(a) => a.iter().any(|k| !have.contains(k) && self.live.contains_key(k)),
            None => self.live.keys().any(|k| !have.contains(k)),
        }
    }

    /// Whether the traced processes changed since the last dump (a job started or ended): its
    /// connections are not known until the next one.
    pub fn owners_changed(&self) -> bool {
        self.owners.generation() != self.generation
    }

    /// Whether a traced process holds `c` (as of the last dump).
    pub fn is_own(&self, c: &TcpConn) -> bool {
        self.inode_pid.contains_key(&c.inode)
    }

    /// Whether any process is traced (else nothing is anyone's own).
    pub fn tracing(&self) -> bool {
        !self.inode_pid.is_empty()
    }

    /// The interface's own bytes per pid (sorted), when the last dump covered it.
    /// Every pid whose sockets were read (0 where it sent nothing through the interface): a
    /// pid not listed was not known yet, and its bytes so far are not measured.
    pub fn of(&self, iface: &str) -> Option<Vec<(u32, f64)>> {
        let sent = self.per_iface.get(iface);
        (self.measured.contains(iface) && !self.closed.contains(iface))
            .then(|| self.resolved.iter().map(|p| (*p, sent.and_then(|m| m.get(p)).copied().unwrap_or(0.0))).collect())
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::{Read, Write},
        net::{IpAddr, Ipv4Addr, TcpListener, TcpStream},
    };

    use super::*;
    use crate::sources::tcp::diag::SockDiag;

    fn lo(c: &TcpConn) -> Option<String> {
        (c.local == Some(IpAddr::V4(Ipv4Addr::LOCALHOST))).then(|| "lo".to_string())
    }

    /// Sends `n` bytes from `tx` and reads them on `rx`.
    fn send(tx: &mut TcpStream, rx: &mut TcpStream, n: usize) {
        let mut rx2 = rx.try_clone().expect("clone");
        let reader = std::thread::spawn(move || {
            let (mut buf, mut got) = (vec![0u8; 65536], 0);
            while got < n {
                got += rx2.read(&mut buf).expect("read");
            }
        });
        tx.write_all(&vec![1u8; n]).expect("write");
        reader.join().expect("reader");
    }

    #[test]
    fn only_the_traced_process_connections_count_as_its_own_from_their_birth() {
        let l = TcpListener::bind("127.0.0.1:0").expect("listen");
        let port = l.local_addr().expect("addr").port();
        let mut diag = SockDiag::open().expect("sock_diag");
        let owners = Owners::default();
        let mut own = OwnTraffic::new(owners.clone());
        let me = std::process::id();
        owners.publish(Path::new("/proc"), [me].into_iter());
        assert!(own.owners_changed(), "a process traced since the last dump: its connections are not known yet");
        let dump = |d: &mut SockDiag| d.dump().expect("dump").0.into_iter().filter(|c| c.local_port == port || c.remote_port == port).collect::<Vec<_>>();
        own.update(&dump(&mut diag), ["lo".to_string()].into_iter(), lo);
        assert_eq!(own.of("lo"), Some(vec![(me, 0.0)]), "its sockets read, nothing sent yet");
        assert_eq!(own.lookups, 1, "read once it is traced, with no connection yet");
        assert!(!own.owners_changed(), "the dump took them in");
        assert_eq!(own.of("eth9"), None, "an interface the dump did not cover is not measured");
        // A connection born after the first dump: all its bytes count, both directions are
        // this process's (it holds both ends).
        let mut a = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        let (mut b, _) = l.accept().expect("accept");
        send(&mut a, &mut b, 1_000_000);
        own.update(&dump(&mut diag), ["lo".to_string()].into_iter(), lo);
        let got = own.of("lo").expect("measured");
        assert_eq!(got.len(), 1, "{got:?}");
        let bytes = got[0].1;
        // Payload plus at most one 66-byte header per segment of ≥ 1 kB (and the ACKs).
        assert!((900_000.0..1_100_000.0).contains(&bytes), "{bytes}");
        assert_eq!(own.lookups, 2, "and again for the new connection");
        // Not traced any more (its process exited): nothing it sends is its own, and its
        // totals stay listed for two dumps — a window ending after its exit still sees the
        // bytes it sent before — then are forgotten.
        owners.publish(Path::new("/proc"), std::iter::empty());
        assert!(own.owners_changed(), "the job ended");
        send(&mut a, &mut b, 100_000);
        for _ in 0..DEPARTED_DUMPS {
            own.update(&dump(&mut diag), ["lo".to_string()].into_iter(), lo);
            assert_eq!(own.of("lo"), Some(vec![(me, bytes)]), "departed: its total as it left");
        }
        own.update(&dump(&mut diag), ["lo".to_string()].into_iter(), lo);
        assert_eq!(own.of("lo"), Some(vec![]));
        // Traced again: only what it sends from now on.
        owners.publish(Path::new("/proc"), [me].into_iter());
        send(&mut a, &mut b, 200_000);
        own.update(&dump(&mut diag), ["lo".to_string()].into_iter(), lo);
        let again = own.of("lo").expect("measured")[0].1;
        assert!((180_000.0..320_000.0).contains(&again), "{again}");
    }

    #[test]
    fn a_traced_connection_that_closed_leaves_its_interface_unmeasured_at_that_read() {
        let l = TcpListener::bind("127.0.0.1:0").expect("listen");
        let port = l.local_addr().expect("addr").port();
        let mut diag = SockDiag::open().expect("sock_diag");
        let owners = Owners::default();
        let mut own = OwnTraffic::new(owners.clone());
        owners.publish(Path::new("/proc"), [std::process::id()].into_iter());
        let dump = |d: &mut SockDiag| d.dump().expect("dump").0.into_iter().filter(|c| c.local_port == port || c.remote_port == port).collect::<Vec<_>>();
        let mut a = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        let (mut b, _) = l.accept().expect("accept");
        own.update(&dump(&mut diag), ["lo".to_string()].into_iter(), lo);
        send(&mut a, &mut b, 100_000);
        let conns = dump(&mut diag);
        let cookies: Vec<u64> = conns.iter().map(|c| c.cookie).collect();
        // The fast lane's partial read: both connections answered, measured.
        own.update_some(&cookies, &diag.query(&conns.iter().collect::<Vec<_>>()).expect("query"), lo);
        assert!(own.of("lo").is_some_and(|v| v[0].1 >= 100_000.0), "{:?}", own.of("lo"));
        drop((a, b));
        std::thread::sleep(std::time::Duration::from_millis(20));
        // Asked again after they closed: what they sent since the last read is unknown.
        own.update_some(&cookies, &diag.query(&conns.iter().collect::<Vec<_>>()).expect("query"), lo);
        assert_eq!(own.of("lo"), None, "closed since the last read");
        // The next dump finds nothing closed since: measured again.
        own.update(&dump(&mut diag), ["lo".to_string()].into_iter(), lo);
        assert!(own.of("lo").is_some());
    }

    #[test]
    fn a_traced_connections_last_bytes_come_from_its_destroy_event() {
        let mut events = crate::sources::tcp::diag::DestroyEvents::open().expect("destroy events");
        let l = TcpListener::bind("127.0.0.1:0").expect("listen");
        let port = l.local_addr().expect("addr").port();
        let mut diag = SockDiag::open().expect("sock_diag");
        let owners = Owners::default();
        let mut own = OwnTraffic::new(owners.clone());
        let me = std::process::id();
        owners.publish(Path::new("/proc"), [me].into_iter());
        let dump = |d: &mut SockDiag| d.dump().expect("dump").0.into_iter().filter(|c| c.local_port == port || c.remote_port == port).collect::<Vec<_>>();
        own.update(&dump(&mut diag), ["lo".to_string()].into_iter(), lo);
        let mut a = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        let (mut b, _) = l.accept().expect("accept");
        own.update(&dump(&mut diag), ["lo".to_string()].into_iter(), lo);
        // 300 kB sent after the last read, then both ends closed.
        send(&mut a, &mut b, 300_000);
        drop((a, b));
        let mut ended = 0;
        for _ in 0..100 {
            ended += own.destroyed(&events.drain().expect("drain"));
            if ended == 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        own.update(&dump(&mut diag), ["lo".to_string()].into_iter(), lo);
        let sent = own.of("lo").expect("measured: nothing closed unseen")[0].1;
        assert!((300_000.0..400_000.0).contains(&sent), "{sent}");
    }

    #[test]
    fn a_connection_of_an_untraced_process_is_looked_up_once_then_known_foreign() {
        let mut own = OwnTraffic::new(Owners::default());
        own.owners.publish(Path::new("/nonexistent"), [42].into_iter());
        let c = TcpConn { cookie: 1, inode: 777, bytes_acked: 5000, segs_out: 5, local: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)), ..Default::default() };
        for k in 0..3 {
            let mut c = c.clone();
            c.bytes_acked += k * 1000;
            own.update(&[c], ["lo".to_string()].into_iter(), lo);
        }
        assert_eq!(own.lookups, 1, "a foreign inode is not looked up again");
        assert_eq!(own.of("lo"), Some(vec![(42, 0.0)]), "pid 42 was looked up: it sent nothing here");
    }
}
