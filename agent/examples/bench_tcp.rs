//! `cargo xtask bench tcp` (runs `cargo run --release -p agent --example bench_tcp`): the cost
//! of the `tcp` source's in-flight sampling — one `sock_diag` dump of the established TCP
//! connections (IPv4 and IPv6, `tcp_info` + memory info) and its per-interface aggregation —
//! with 16, 256 and 2048 loopback connections open (half of them sending), against the
//! baseline of the same process reading `/proc/net/tcp` (the classic way to list sockets,
//! without `tcp_info`).
//!
//! Prints per connection count the median CPU time of a sweep (the thread's, user + system), the CPU share at the tests' 10 ms and
//! the default 1 s interval, and a last machine-readable line
//! `bench tcp: conns=<n> sweep_us=<median> proc_net_tcp_us=<median> cpu_1s_pct=<..>`.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Instant,
};

use prometheus_client::registry::Registry;
use stepwise::sources::tcp::{inflight::InFlightTracker, thread_cpu, SockDiag};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `n` loopback connections; every other one has a thread writing into it (and its peer
/// reading), so the dump sees sockets with data in flight.
fn connections(n: usize, stop: &Arc<AtomicBool>) -> Vec<(TcpStream, TcpStream)> {
    let l = TcpListener::bind("127.0.0.1:0").expect("listen");
    let port = l.local_addr().expect("addr").port();
    let mut out = Vec::new();
    for i in 0..n {
        let a = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        let (b, _) = l.accept().expect("accept");
        if i % 2 == 0 && i < 32 {
            let (mut w, mut r) = (a.try_clone().expect("clone"), b.try_clone().expect("clone"));
            let s = stop.clone();
            std::thread::spawn(move || {
                let buf = vec![1u8; 16384];
                while !s.load(Ordering::Relaxed) && w.write_all(&buf).is_ok() {}
            });
            let s = stop.clone();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 16384];
                while !s.load(Ordering::Relaxed) && r.read(&mut buf).is_ok_and(|k| k > 0) {}
            });
        }
        out.push((a, b));
    }
    out
}

/// 2048 connections are 4096 descriptors: the soft limit raised to the hard one.
fn raise_fd_limit() {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

fn main() {
    raise_fd_limit();
    let reps = 200;
    let mut last = String::new();
    for n in [16usize, 256, 2048] {
        let stop = Arc::new(AtomicBool::new(false));
        let conns = connections(n, &stop);
        let mut diag = SockDiag::open().expect("sock_diag socket");
        let mut reg = Registry::default();
        let mut tracker = InFlightTracker::new(&mut reg);
        let t0 = Instant::now();
        let mut sweep = Vec::new();
        let mut seen = 0;
        for _ in 0..reps {
            let t = thread_cpu();
            let (cs, _) = diag.dump().expect("dump");
            seen = cs.len();
            tracker.update(t0.elapsed().as_secs_f64(), &cs, |c| c.local.map(|_| "lo-bench".to_string()));
            sweep.push((thread_cpu() - t) * 1e6);
        }
        let mut proc = Vec::new();
        for _ in 0..reps {
            let t = thread_cpu();
            let s = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
            std::hint::black_box(s.lines().count());
            proc.push((thread_cpu() - t) * 1e6);
        }
        stop.store(true, Ordering::Relaxed);
        drop(conns);
        let (us, pus) = (median(sweep), median(proc));
        println!(
            "{n:>5} connections ({seen} established in the dump, both ends): sweep {us:.0} µs CPU median, /proc/net/tcp {pus:.0} µs; CPU at a 10 ms interval {:.2} %, at 1 s {:.4} %",
            us / 1e4 * 100.0,
            us / 1e6 * 100.0
        );
        last = format!("bench tcp: conns={n} sweep_us={us:.0} proc_net_tcp_us={pus:.0} cpu_1s_pct={:.4}", us / 1e6 * 100.0);
    }
    println!("{last}");
}
