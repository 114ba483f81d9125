//! The thread that empties the events RingBuf. The probe thread decodes, rescans `/proc` and
//! attaches probes; an attachment can block it for seconds on a busy host (the kernel
//! registers a uprobe in every process mapping the file), and a ring left undrained that long
//! overflows. This thread only moves records from the ring into a bounded queue, so the ring
//! drains at its own pace whatever the probe thread is doing. When the queue is full the
//! thread stops draining and the kernel drops (and counts) new events: memory stays bounded.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Condvar, Mutex,
    },
    time::{Duration, Instant},
};

use agent_common::ProbeEvent;

use crate::ebpf::RingReader;

/// Events held between the two threads at most (224 bytes each in memory: 1.75 MiB; the
/// 1 MiB ring holds about 14 500 more as entry/return records of 88 and 56 bytes). Real jobs
/// produce hundreds to thousands of events per second, so this
/// covers an attachment stall of seconds; a storm overflows it either way, and then the
/// kernel drops and counts while the agent's memory stays bounded.
pub const QUEUE_MAX: usize = 8192;
/// How long the drain thread sleeps in poll(2) when no wakeup comes (lazy events).
const POLL_MS: i32 = 20;

#[derive(Default)]
struct Queue {
    events: Vec<ProbeEvent>,
    /// The last flush request the drain thread served (see [`Drainer::flush`]).
    served: u64,
    /// CLOCK_MONOTONIC ns at the start of the last drain that emptied the ring: every event
    /// stamped before it is in `events` or was taken already (the consumer's watermark).
    drained_ns: u64,
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
    requested: AtomicU64,
    stop: AtomicBool,
}

/// Handle of the drain thread; stops and joins it when dropped.
pub struct Drainer {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drainer {
    /// Starts the drain thread; when the thread cannot be created the reader comes back
    /// with the error, so the caller can keep draining it itself.
    pub fn start(reader: RingReader) -> Result<Drainer, (std::io::Error, RingReader)> {
        let shared =
            Arc::new(Shared { queue: Mutex::new(Queue::default()), ready: Condvar::new(), requested: AtomicU64::new(0), stop: AtomicBool::new(false) });
        let sh = shared.clone();
        // The reader passes through a slot: a failed spawn drops the closure, not the reader.
        let slot = Arc::new(Mutex::new(Some(reader)));
        let handed = slot.clone();
        let spawned = std::thread::Builder::new().name("stepwise-ring".into()).spawn(move || {
            let Some(mut reader) = lock(&handed).take() else { return };
            let fd = reader.fd();
            let mut local: Vec<ProbeEvent> = Vec::with_capacity(4096);
            while !sh.stop.load(Ordering::Relaxed) {
                let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd; the timeout bounds the wait (lazy events, stop).
                unsafe { libc::poll(&mut pfd, 1, POLL_MS) };
                // A flush request seen before draining is served by this drain.
                let requested = sh.requested.load(Ordering::Acquire);
                let room = QUEUE_MAX.saturating_sub(lock(&sh.queue).events.len());
                local.clear();
                let started = super::mono_ns();
                reader.drain(&mut local, room);
                let mut q = lock(&sh.queue);
                q.events.extend_from_slice(&local);
                q.served = q.served.max(requested);
                // Fewer records than there was room for: the ring was empty when this drain
                // ended, so nothing stamped before its start is left behind.
                if local.len() < room {
                    q.drained_ns = q.drained_ns.max(started);
                }
                drop(q);
                sh.ready.notify_all();
                if room == 0 {
                    // The probe thread is behind: let the kernel count drops rather than
                    // spin on a full queue.
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        });
        match spawned {
            Ok(thread) => Ok(Drainer { shared, thread: Some(thread) }),
            Err(e) => match lock(&slot).take() {
                Some(reader) => Err((e, reader)),
                // Unreachable: the closure that would take it never ran.
                None => Ok(Drainer { shared, thread: None }),
            },
        }
    }

    /// Moves the queued events into `out` (cleared first), waiting up to `wait` for some;
    /// returns the watermark (CLOCK_MONOTONIC ns, 0 before the first full drain): once `out`
    /// is handled, every event stamped before it has been.
    pub fn take(&self, out: &mut Vec<ProbeEvent>, wait: Duration) -> u64 {
        out.clear();
        let mut q = lock(&self.shared.queue);
        if q.events.is_empty() && !wait.is_zero() {
            q = match self.shared.ready.wait_timeout(q, wait) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        std::mem::swap(&mut q.events, out);
        q.drained_ns
    }

    /// Everything the ring holds *now* into `out`: waits (up to `timeout`) for the drain
    /// thread to drain once more after this call, then takes the queue. Used before a
    /// rescan, so a process found gone has had all its events decoded.
    pub fn flush(&self, out: &mut Vec<ProbeEvent>, timeout: Duration) -> u64 {
        let want = self.shared.requested.fetch_add(1, Ordering::AcqRel) + 1;
        let end = Instant::now() + timeout;
        let mut q = lock(&self.shared.queue);
        while q.served < want {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            q = match self.shared.ready.wait_timeout(q, left) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        out.clear();
        std::mem::swap(&mut q.events, out);
        q.drained_ns
    }
}

impl Drop for Drainer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
