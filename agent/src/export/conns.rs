//! Connection slots of the HTTP server: at most [`MAX_CONNECTIONS`](super::api::MAX_CONNECTIONS)
//! at once. When they are all taken, a new connection closes the longest-idle one (no request
//! in progress) instead of waiting for a slot: about 260 idle connections from one client
//! used to hold every slot until the 10 s header timeout, so each scrape waited ~10 s. A new
//! connection waits only while every connection is busy with a request.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Instant,
};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// How often a connection waiting for a slot looks again for an idle one to close.
const RECHECK: std::time::Duration = std::time::Duration::from_millis(100);

/// One connection's state, shared between its task and the slots.
#[derive(Debug)]
pub struct Conn {
    /// Requests in progress.
    busy: AtomicUsize,
    /// Nanoseconds since the slots' start of the last request's end (or the accept).
    last: AtomicU64,
    /// Chosen for closing (not chosen twice).
    evicted: AtomicBool,
    close: Notify,
}

impl Conn {
    /// Marks a request in progress until the guard drops.
    pub fn enter(self: &Arc<Self>, slots: &Slots) -> Busy {
        self.busy.fetch_add(1, Ordering::AcqRel);
        Busy { conn: self.clone(), origin: slots.origin }
    }

    /// Resolves when the slots chose this connection to close.
    pub async fn closed(&self) {
        self.close.notified().await;
    }
}

/// A request in progress on a connection.
pub struct Busy {
    conn: Arc<Conn>,
    origin: Instant,
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.conn.last.store(nanos(self.origin), Ordering::Release);
        self.conn.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

fn nanos(origin: Instant) -> u64 {
    u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// The server's connection slots.
#[derive(Debug)]
pub struct Slots {
    permits: Arc<Semaphore>,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    next: AtomicU64,
    origin: Instant,
    /// Connections closed to make room.
    evictions: AtomicU64,
}

/// A held slot; dropping it frees the slot.
pub struct Slot {
    slots: Arc<Slots>,
    id: u64,
    pub conn: Arc<Conn>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.conns.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.id);
    }
}

impl Slots {
    pub fn new(max: usize) -> Arc<Slots> {
        Arc::new(Slots {
            permits: Arc::new(Semaphore::new(max)),
            conns: Mutex::default(),
            next: AtomicU64::new(0),
            origin: Instant::now(),
            evictions: AtomicU64::new(0),
        })
    }

    /// A slot for a connection just accepted: a free one, or one freed by closing the
    /// longest-idle connection; waits only while every connection is busy.
    pub async fn acquire(self: &Arc<Self>) -> Option<Slot> {
        let permit = loop {
            if let Ok(p) = self.permits.clone().try_acquire_owned() {
                break p;
            }
            self.evict_idlest();
            // A busy connection may turn idle (keep-alive) without closing: look again soon.
            if let Ok(p) = tokio::time::timeout(RECHECK, self.permits.clone().acquire_owned()).await {
                break p.ok()?;
            }
        };
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let conn =
            Arc::new(Conn { busy: AtomicUsize::new(0), last: AtomicU64::new(nanos(self.origin)), evicted: AtomicBool::new(false), close: Notify::new() });
        self.conns.lock().unwrap_or_else(|p| p.into_inner()).insert(id, conn.clone());
        Some(Slot { slots: self.clone(), id, conn, _permit: permit })
    }

    /// Asks the connection idle the longest to close; false when every one is busy.
    fn evict_idlest(&self) -> bool {
        let conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        let idlest =
            conns.values().filter(|c| c.busy.load(Ordering::Acquire) == 0 && !c.evicted.load(Ordering::Acquire)).min_by_key(|c| c.last.load(Ordering::Acquire));
        let Some(c) = idlest else { return false };
        c.evicted.store(true, Ordering::Release);
        // Stored if its task is not waiting yet: it closes at its next poll.
        c.close.notify_one();
        self.evictions.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Connections closed so far to make room for new ones.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime")
    }

    #[test]
    fn when_full_the_longest_idle_connection_is_closed_not_a_busy_one() {
        rt().block_on(async {
            let slots = Slots::new(3);
            let a = slots.acquire().await.expect("a");
            let b = slots.acquire().await.expect("b");
            let c = slots.acquire().await.expect("c");
            // a is busy, c served a request after b: b is the longest idle.
            let _busy = a.conn.enter(&slots);
            tokio::time::sleep(Duration::from_millis(2)).await;
            drop(c.conn.enter(&slots));
            let waiter = {
                let slots = slots.clone();
                tokio::spawn(async move { slots.acquire().await.map(|s| s.id) })
            };
            tokio::time::timeout(Duration::from_secs(1), b.conn.closed()).await.expect("b asked to close");
            assert_eq!(slots.evictions(), 1);
            drop(b);
            let id = tokio::time::timeout(Duration::from_secs(1), waiter).await.expect("slot freed").expect("join");
            assert_eq!(id, Some(3));
            assert!(tokio::time::timeout(Duration::from_millis(20), c.conn.closed()).await.is_err(), "c was not chosen");
        });
    }

    #[test]
    fn when_every_connection_is_busy_a_new_one_waits() {
        rt().block_on(async {
            let slots = Slots::new(1);
            let a = slots.acquire().await.expect("a");
            let busy = a.conn.enter(&slots);
            let s2 = slots.clone();
            let waiter = tokio::spawn(async move { s2.acquire().await.is_some() });
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(!waiter.is_finished(), "no idle connection to close");
            assert_eq!(slots.evictions(), 0);
            drop(busy);
            drop(a);
            assert!(tokio::time::timeout(Duration::from_secs(1), waiter).await.expect("freed").expect("join"));
        });
    }
}
