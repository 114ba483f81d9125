//! The soak's attacker (issue 19): every minute, while the jobs run, the attacks the agent
//! must shrug off — a marker flood over a million ranks, 300 idle TCP connections, and 10
//! parallel marker listings — with `/metrics` scraped throughout. The soak then asserts that
//! scrapes stayed fast, the flood was counted as dropped, and its usual bounds (RSS,
//! descriptors, database size) held with the attacks in them.

use std::{
    net::TcpStream,
    os::unix::net::UnixDatagram,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use stepwise_tests::harness::http_get;

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
}

/// Whether a round is under way: its 300 connections are the agent's descriptors for those
/// seconds, so the soak's descriptor bounds skip the rows sampled meanwhile (RSS counts them).
static ACTIVE: AtomicBool = AtomicBool::new(false);

pub fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// Starts the attacker against the agent at `addr` with marker socket `sock`.
pub fn spawn(addr: String, sock: PathBuf, stop: Arc<AtomicBool>) -> JoinHandle<AttackStats> {
    std::thread::spawn(move || {
        let mut stats = AttackStats::default();
        let mut next = Instant::now() + FIRST;
        while !stop.load(Ordering::Relaxed) {
            if Instant::now() >= next {
                ACTIVE.store(true, Ordering::Relaxed);
                round(&addr, &sock, &mut stats);
                ACTIVE.store(false, Ordering::Relaxed);
                next += EVERY;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        stats
    })
}

/// One round: the flood and the listings in the background, 300 idle connections held, and
/// `/metrics` scraped every 100 ms for 3 s.
fn round(addr: &str, sock: &std::path::Path, stats: &mut AttackStats) {
    stats.rounds += 1;
    let flood = {
        let sock = sock.to_path_buf();
        std::thread::spawn(move || flood(&sock, Duration::from_secs(3)))
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
