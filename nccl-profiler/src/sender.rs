//! The background thread: records from the ring, batched into datagrams, to the agent's Unix
//! datagram socket. Every send is non-blocking; when no agent listens the batch is dropped and
//! counted, and sending is retried a second later. The job never waits for the agent.

use std::{
    os::unix::ffi::OsStrExt,
    path::Path,
    sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed},
    time::{Duration, Instant},
};

use crate::{
    ring::Ring,
    wire::{self, Header, Record},
};

/// The agent's socket when `STEPWISE_PROFILER_SOCKET` is unset.
pub const DEFAULT_SOCKET: &str = "/run/stepwise/profiler.sock";
/// How long sending pauses after the agent was found absent.
const BACKOFF: Duration = Duration::from_secs(1);
/// The ring is looked at this often when it was empty.
const IDLE: Duration = Duration::from_millis(5);

/// Process-wide counters, in every datagram's header.
#[derive(Default)]
pub struct Counters {
    pub sent: AtomicU64,
    pub unsent: AtomicU64,
    pub nccl_version: AtomicU32,
    pub mask: AtomicU32,
    /// The process's GPU ([`wire::Header::gpu_pci`]), found once at the first init.
    pub gpu_pci: std::sync::OnceLock<[u8; 16]>,
}

pub struct Sender {
    fd: libc::c_int,
    addr: Option<(libc::sockaddr_un, libc::socklen_t)>,
    buf: Vec<u8>,
    batch: Vec<Record>,
    paused_until: Option<Instant>,
    /// Sends tried on a full receive queue, 1 ms apart.
    tries: u32,
}

impl Drop for Sender {
    fn drop(&mut self) {
        if self.fd >= 0 {
            // SAFETY: our own descriptor, closed once.
            unsafe { libc::close(self.fd) };
        }
    }
}

/// A `sockaddr_un` for `path`; None when it does not fit.
fn sockaddr(path: &Path) -> Option<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data; all-zero is valid.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let b = path.as_os_str().as_bytes();
    if b.is_empty() || b.len() >= a.sun_path.len() {
        return None;
    }
    for (d, s) in a.sun_path.iter_mut().zip(b) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + b.len() + 1;
    Some((a, len as libc::socklen_t))
}

impl Sender {
    pub fn new(path: &Path) -> Sender {
        // SAFETY: plain socket(2) call.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        Sender {
            fd,
            addr: sockaddr(path),
            buf: Vec::with_capacity(wire::HEADER_BYTES + wire::MAX_RECORDS * wire::RECORD_BYTES),
            batch: Vec::new(),
            paused_until: None,
            tries: 20,
        }
    }

    /// A sender for one flush on an NCCL thread (finalize): a full receive queue is tried
    /// twice, 1 ms apart, at most.
    pub fn once(path: &Path) -> Sender {
        let mut s = Sender::new(path);
        s.tries = 2;
        s
    }

    /// Sends what the ring holds, one datagram per [`wire::MAX_RECORDS`]; returns the records
    /// taken from the ring.
    pub fn flush(&mut self, ring: &Ring, c: &Counters) -> usize {
        let mut taken = 0;
        loop {
            self.batch.clear();
            while self.batch.len() < wire::MAX_RECORDS {
                match ring.pop() {
                    Some(r) => self.batch.push(r),
                    None => break,
                }
            }
            if self.batch.is_empty() {
                return taken;
            }
            taken += self.batch.len();
            let n = self.batch.len() as u64;
            if self.send(ring, c) {
                c.sent.fetch_add(n, Relaxed);
            } else {
                c.unsent.fetch_add(n, Relaxed);
            }
        }
    }

    fn send(&mut self, ring: &Ring, c: &Counters) -> bool {
        if self.paused_until.is_some_and(|t| Instant::now() < t) {
            return false;
        }
        self.paused_until = None;
        let Some((addr, len)) = self.addr.as_ref() else { return false };
        let h = Header {
            // SAFETY: getpid never fails.
            pid: unsafe { libc::getpid() } as u32,
            nccl_version: c.nccl_version.load(Relaxed),
            event_mask: c.mask.load(Relaxed),
            dropped_full: ring.dropped.load(Relaxed),
            dropped_unsent: c.unsent.load(Relaxed),
            sent: c.sent.load(Relaxed),
            gpu_pci: c.gpu_pci.get().copied().unwrap_or_default(),
        };
        wire::encode(&h, &self.batch, &mut self.buf);
        // A full receive queue (the agent is busy) is waited out for up to ~20 ms on the sender
        // thread (2 ms at finalize), then this batch is dropped and the next one tried at once;
        // any other error means no agent: sending pauses for BACKOFF.
        let mut busy = false;
        for _ in 0..self.tries {
            // SAFETY: valid buffer and address for the lengths given.
            let r = unsafe {
                libc::sendto(
                    self.fd,
                    self.buf.as_ptr().cast(),
                    self.buf.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                    (addr as *const libc::sockaddr_un).cast(),
                    *len,
                )
            };
            if r >= 0 {
                return true;
            }
            let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            busy = e == libc::EAGAIN || e == libc::ENOBUFS || e == libc::EINTR;
            if !busy {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        if !busy {
            self.paused_until = Some(Instant::now() + BACKOFF);
        }
        false
    }

    /// The thread's loop (never returns).
    pub fn run(mut self, ring: &'static Ring, c: &'static Counters) {
        loop {
            if self.flush(ring, c) == 0 {
                std::thread::sleep(IDLE);
            }
        }
    }
}

/// The socket path from `STEPWISE_PROFILER_SOCKET`, else [`DEFAULT_SOCKET`].
pub fn socket_path() -> std::path::PathBuf {
    std::env::var_os("STEPWISE_PROFILER_SOCKET").filter(|v| !v.is_empty()).map_or_else(|| DEFAULT_SOCKET.into(), Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixDatagram;

    fn rec(seq: u64) -> Record {
        Record { seq, comm_hash: 7, ..Default::default() }
    }

    #[test]
    fn batches_reach_the_socket_and_absence_is_counted() {
        let dir = std::env::temp_dir().join(format!("swprof-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("p.sock");
        let _ = std::fs::remove_file(&path);
        let ring = Ring::new(256);
        let c = Counters::default();
        // No agent: records are dropped, counted, and sending pauses.
        let mut s = Sender::new(&path);
        for i in 0..10 {
            ring.push(&rec(i));
        }
        assert_eq!(s.flush(&ring, &c), 10);
        assert_eq!(c.unsent.load(Relaxed), 10);
        assert!(s.paused_until.is_some());
        // The agent appears: after the pause, 100 records arrive in two datagrams.
        let rx = UnixDatagram::bind(&path).expect("bind");
        s.paused_until = None;
        for i in 0..100 {
            ring.push(&rec(i));
        }
        assert_eq!(s.flush(&ring, &c), 100);
        let mut buf = vec![0u8; 65536];
        let mut got = Vec::new();
        let mut headers = Vec::new();
        while got.len() < 100 {
            let n = rx.recv(&mut buf).expect("recv");
            let (h, r) = wire::decode(&buf[..n]).expect("decode");
            headers.push(h);
            got.extend(r.into_iter().map(|r| r.seq));
        }
        assert_eq!(got, (0..100).collect::<Vec<_>>());
        assert_eq!(headers.len(), 2);
        assert_eq!(headers[0].dropped_unsent, 10);
        assert_eq!(headers[1].sent, 64);
        assert_eq!(headers[0].pid, std::process::id());
        assert_eq!(c.sent.load(Relaxed), 100);
        // A receiver that reads nothing: its queue fills, batches are dropped and counted, and
        // sending does not pause (the agent is there, only busy).
        s.tries = 1;
        let mut sent = 0;
        for i in 0..10_000u64 {
            ring.push(&rec(i));
            if i % 64 == 63 {
                s.flush(&ring, &c);
            }
            sent += 1;
        }
        s.flush(&ring, &c);
        assert!(c.unsent.load(Relaxed) > 10, "a full queue drops: {}", c.unsent.load(Relaxed));
        assert!(s.paused_until.is_none(), "busy is not absent");
        assert_eq!(c.sent.load(Relaxed) + c.unsent.load(Relaxed) + ring.dropped.load(Relaxed), 110 + sent);
        drop(rx);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
