//! The soak's attacker (issues 19, 38): every minute, while the jobs run, the attacks the
//! agent must shrug off — a marker flood over a million ranks, a flood of forged profiler
//! records (pids 0, 1 and 2³²−1, and the sender's own on ever new communicators), 300 idle
//! TCP connections, 10 parallel marker listings, and a second agent started on the live
//! agent's marker and profiler sockets — with `/metrics` scraped throughout. The soak runs
//! the agent under a descriptor limit of 1 024 (`mod.rs`), then asserts that scrapes stayed
//! fast, both floods were counted as dropped, every second agent refused to start and left
//! the sockets with the first, and its usual bounds (RSS, descriptors, database size) held
//! with the attacks in them.

use std::{
    net::TcpStream,
    os::unix::net::UnixDatagram,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use stepwise_tests::harness::{agent_bin, free_port, http_get, Proc};

/// First attack this long after the start (the storms start at 20 s), then one a minute.
const FIRST: Duration = Duration::from_secs(40);
const EVERY: Duration = Duration::from_secs(60);
/// A `/metrics` scrape slower than this during an attack fails the soak (Prometheus' default
/// scrape timeout is 10 s; the issue asks for a p99 under 1 s).
pub const MAX_SCRAPE: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
pub struct AttackStats {
    pub rounds: u64,
    pub markers_sent: u64,
    pub scrapes: u64,
    pub failed_scrapes: u64,
    pub worst_scrape: Duration,
    pub listings: u64,
    pub idle_connections: usize,
    pub profiler_records_sent: u64,
    /// Second agents started on the live agent's sockets, and those that did not exit
    /// non-zero within [`SECOND_AGENT_EXIT`] or left a socket without its listener.
    pub second_agents: u64,
    pub second_agent_failures: Vec<String>,
}

/// What the attacker aims at: the agent's address, its sockets and config.
#[derive(Clone, Debug)]
pub struct Target {
    pub addr: String,
    pub marker_socket: PathBuf,
    pub profiler_socket: PathBuf,
    pub config: PathBuf,
    /// Where the second agent's store and log go.
    pub dir: PathBuf,
}

/// A second agent on a live agent's socket must give up at least this fast.
const SECOND_AGENT_EXIT: Duration = Duration::from_secs(5);

/// Whether a round is under way: its 300 connections are the agent's descriptors for those
/// seconds, so the soak's descriptor bounds skip the rows sampled meanwhile (RSS counts them).
static ACTIVE: AtomicBool = AtomicBool::new(false);

pub fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// Starts the attacker against `target`.
pub fn spawn(target: Target, stop: Arc<AtomicBool>) -> JoinHandle<AttackStats> {
    std::thread::spawn(move || {
        let mut stats = AttackStats::default();
        let mut next = Instant::now() + FIRST;
        while !stop.load(Ordering::Relaxed) {
            if Instant::now() >= next {
                ACTIVE.store(true, Ordering::Relaxed);
                round(&target, &mut stats);
                ACTIVE.store(false, Ordering::Relaxed);
                next += EVERY;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        stats
    })
}

/// One round: the floods, the listings and the second agent in the background, 300 idle
/// connections held, and `/metrics` scraped every 100 ms for 3 s.
fn round(target: &Target, stats: &mut AttackStats) {
    let addr = target.addr.as_str();
    stats.rounds += 1;
    let flood = {
        let sock = target.marker_socket.clone();
        std::thread::spawn(move || flood(&sock, Duration::from_secs(3)))
    };
    let profiler_flood = {
        let sock = target.profiler_socket.clone();
        std::thread::spawn(move || profiler_flood(&sock, Duration::from_secs(3)))
    };
    let second = {
        let target = target.clone();
        std::thread::spawn(move || second_agent(&target))
    };
    let listings: Vec<_> = (0..10)
        .map(|_| {
            let addr = addr.to_string();
            std::thread::spawn(move || http_get(&addr, "/api/v1/markers?limit=10000").is_ok_and(|r| r.status == 200 || r.status == 503))
        })
        .collect();
    let idle: Vec<TcpStream> = (0..300).filter_map(|_| TcpStream::connect(addr).ok()).collect();
    stats.idle_connections = stats.idle_connections.max(idle.len());
    for _ in 0..30 {
        let t = Instant::now();
        let ok = http_get(addr, "/metrics").is_ok_and(|r| r.status == 200);
        let took = t.elapsed();
        stats.scrapes += 1;
        stats.failed_scrapes += u64::from(!ok);
        stats.worst_scrape = stats.worst_scrape.max(took);
        std::thread::sleep(Duration::from_millis(100).saturating_sub(took));
    }
    drop(idle);
    stats.markers_sent += flood.join().unwrap_or(0);
    stats.profiler_records_sent += profiler_flood.join().unwrap_or(0);
    stats.second_agents += 1;
    if let Err(why) = second.join().unwrap_or_else(|_| Err("the second agent's thread panicked".into())) {
        stats.second_agent_failures.push(why);
    }
    stats.listings += listings.into_iter().map(|h| u64::from(h.join().unwrap_or(false))).sum::<u64>();
}

/// Markers for pseudo-random ranks below 10^6 and steps below 10^9, as fast as a datagram
/// socket takes them (EAGAIN when the agent's queue is full is the sender's loss, as for
/// any marker client); returns how many were sent.
fn flood(sock: &std::path::Path, how_long: Duration) -> u64 {
    let Ok(tx) = UnixDatagram::unbound() else { return 0 };
    let _ = tx.set_nonblocking(true);
    let (mut x, mut sent) = (0x9e37_79b9_7f4a_7c15u64, 0u64);
    let end = Instant::now() + how_long;
    while Instant::now() < end {
        // xorshift: cheap, deterministic, spread over the whole rank range.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let line = format!("{{\"rank\":{},\"step\":{},\"phase\":\"{}\"}}", x % 1_000_000, (x >> 20) % 1_000_000_000, if x & 1 == 0 { "begin" } else { "end" });
        if tx.send_to(line.as_bytes(), sock).is_ok() {
            sent += 1;
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    sent
}

/// Forged profiler datagrams (64 records each) as fast as the socket takes them: records
/// claiming pids 0, 1 and 2³²−1 (credentials say otherwise: all dropped), and records under
/// the sender's own pid on a new communicator every datagram (this process is outside the
/// jobs' network namespace the agent selects: dropped as not selected; rate and
/// communicator admission of a selected sender are the agent's unit tests'); returns the
/// records sent.
fn profiler_flood(sock: &Path, how_long: Duration) -> u64 {
    use nccl_profiler::wire::{encode, Header, Record, MAX_RECORDS};
    let Ok(tx) = UnixDatagram::unbound() else { return 0 };
    let _ = tx.set_nonblocking(true);
    let me = std::process::id();
    let (mut sent, mut n, mut buf) = (0u64, 0u64, Vec::new());
    let end = Instant::now() + how_long;
    while Instant::now() < end {
        n += 1;
        let pid = [0, 1, u32::MAX, me][(n % 4) as usize];
        let now_ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let records: Vec<Record> = (0..MAX_RECORDS as u64)
            .map(|i| Record {
                comm_hash: 0x5eed_0000_0000 + n,
                seq: i,
                rank: 0,
                nranks: 2,
                bytes: 4096,
                count: 1024,
                enqueue_ns: now_ns,
                func: 2,
                ..Record::default()
            })
            .collect();
        encode(&Header { pid, ..Header::default() }, &records, &mut buf);
        if tx.send_to(&buf, sock).is_ok() {
            sent += records.len() as u64;
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    sent
}

/// Starts a second agent with the live agent's config and both of its sockets: it must exit
/// non-zero within [`SECOND_AGENT_EXIT`], and the sockets must still reach a listener after.
fn second_agent(t: &Target) -> Result<(), String> {
    let mut cmd = Command::new(agent_bin());
    cmd.args(["run", "--listen", &format!("127.0.0.1:{}", free_port()), "--config"])
        .arg(&t.config)
        .arg("--db")
        .arg(t.dir.join("second-agent.db"))
        .arg("--marker-socket")
        .arg(&t.marker_socket)
        .env("STEPWISE_PROFILER_SOCKET", &t.profiler_socket)
        .env("STEPWISE_LOG", "warn");
    let mut p = Proc::spawn("second agent", &mut cmd, t.dir.join("second-agent.log")).map_err(|e| format!("{e:#}"))?;
    let end = Instant::now() + SECOND_AGENT_EXIT;
    let code = loop {
        if let Ok(Some(st)) = p.child.try_wait() {
            break st.code();
        }
        if Instant::now() > end {
            return Err(format!("a second agent on the live sockets still ran after {SECOND_AGENT_EXIT:?}:\n{}", p.log_text()));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if code == Some(0) || code.is_none() {
        return Err(format!("a second agent on the live sockets exited {code:?}:\n{}", p.log_text()));
    }
    let tx = UnixDatagram::unbound().map_err(|e| e.to_string())?;
    // Blocking with a bound: a full queue (the floods) waits for the agent to drain it.
    tx.set_write_timeout(Some(SECOND_AGENT_EXIT)).map_err(|e| e.to_string())?;
    for sock in [&t.marker_socket, &t.profiler_socket] {
        // A datagram the live agent ignores (not a marker, not a record): only whether a
        // listener is bound there matters.
        tx.send_to(b"{}", sock).map_err(|e| format!("{} has no listener after the second agent exited: {e}", sock.display()))?;
    }
    Ok(())
}
