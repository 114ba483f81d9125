//! Connection slots of the HTTP server: at most [`MAX_CONNECTIONS`](super::api::MAX_CONNECTIONS)
//! at once. When they are all taken, a new connection closes the longest-idle one (no request
//! in progress) instead of waiting for a slot: about 260 idle connections from one client
//! used to hold every slot until the 10 s header timeout, so each scrape waited ~10 s. A new
//! connection waits only while every connection is busy with a request. Clients (peer
//! addresses) pay for their own idle connections first: one holding [`MAX_PER_CLIENT`] or more
//! closes its own longest-idle one for each new one, and at the cap the client holding the
//! most connections loses its longest-idle one before anyone else does.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// Connections one peer address holds before its new ones close its own idle ones.
pub const MAX_PER_CLIENT: usize = 128;

/// A connection is closed to make room only after this long idle: a new one gets to send its
/// request, and a response (whose request counts as done once the handler returns) gets
/// written, before either can be taken for idle.
pub const MIN_IDLE: Duration = Duration::from_millis(200);

/// How often a connection waiting for a slot looks again for an idle one to close.
const RECHECK: Duration = Duration::from_millis(100);

/// One connection's state, shared between its task and the slots.
#[derive(Debug)]
pub struct Conn {
    peer: IpAddr,
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
    /// Nanoseconds a connection must have been idle to be closed.
    min_idle: u64,
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
        Slots::with_min_idle(max, MIN_IDLE)
    }

    /// [`Slots::new`] closing only connections idle for at least `min_idle`.
    pub fn with_min_idle(max: usize, min_idle: Duration) -> Arc<Slots> {
        Arc::new(Slots {
            permits: Arc::new(Semaphore::new(max)),
            conns: Mutex::default(),
            next: AtomicU64::new(0),
            origin: Instant::now(),
            evictions: AtomicU64::new(0),
            min_idle: u64::try_from(min_idle.as_nanos()).unwrap_or(u64::MAX),
        })
    }

    /// A slot for a connection just accepted from `peer`: a free one, or one freed by closing
    /// a longest-idle connection (see the module); waits only while every connection is busy.
    /// `None`: the slots are closed.
    pub async fn acquire(self: &Arc<Self>, peer: IpAddr) -> Option<Slot> {
        if self.held_by(peer) >= MAX_PER_CLIENT {
            self.evict_idlest(Some(peer));
        }
        let permit = loop {
            if let Ok(p) = self.permits.clone().try_acquire_owned() {
                break p;
            }
            if !self.heaviest().is_some_and(|h| self.evict_idlest(Some(h))) {
                self.evict_idlest(None);
            }
            // A busy connection may turn idle (keep-alive) without closing: look again soon.
            if let Ok(p) = tokio::time::timeout(RECHECK, self.permits.clone().acquire_owned()).await {
                break p.ok()?;
            }
        };
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let conn =
            Arc::new(Conn { peer, busy: AtomicUsize::new(0), last: AtomicU64::new(nanos(self.origin)), evicted: AtomicBool::new(false), close: Notify::new() });
        self.conns.lock().unwrap_or_else(|p| p.into_inner()).insert(id, conn.clone());
        Some(Slot { slots: self.clone(), id, conn, _permit: permit })
    }

    /// The peer holding the most connections.
    fn heaviest(&self) -> Option<IpAddr> {
        let conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        let mut n: HashMap<IpAddr, usize> = HashMap::new();
        for c in conns.values().filter(|c| !c.evicted.load(Ordering::Acquire)) {
            *n.entry(c.peer).or_default() += 1;
        }
        n.into_iter().max_by_key(|(_, k)| *k).map(|(p, _)| p)
    }

    /// Connections `peer` holds (not counting those already asked to close).
    fn held_by(&self, peer: IpAddr) -> usize {
        let conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        conns.values().filter(|c| c.peer == peer && !c.evicted.load(Ordering::Acquire)).count()
    }

    /// Asks the connection idle the longest (of `peer`, if given) to close; false when every
    /// one is busy.
    fn evict_idlest(&self, peer: Option<IpAddr>) -> bool {
        let now = nanos(self.origin);
        let conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        let idlest = conns
            .values()
            .filter(|c| peer.is_none_or(|p| c.peer == p))
            .filter(|c| c.busy.load(Ordering::Acquire) == 0 && !c.evicted.load(Ordering::Acquire))
            .filter(|c| now.saturating_sub(c.last.load(Ordering::Acquire)) >= self.min_idle)
            .min_by_key(|c| c.last.load(Ordering::Acquire));
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
    use super::*;

    const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime")
    }

    #[test]
    fn when_full_the_longest_idle_connection_is_closed_not_a_busy_one() {
        rt().block_on(async {
            let slots = Slots::with_min_idle(3, Duration::ZERO);
            let a = slots.acquire(LOCAL).await.expect("a");
            let b = slots.acquire(LOCAL).await.expect("b");
            let c = slots.acquire(LOCAL).await.expect("c");
            // a is busy, c served a request after b: b is the longest idle.
            let _busy = a.conn.enter(&slots);
            tokio::time::sleep(Duration::from_millis(2)).await;
            drop(c.conn.enter(&slots));
            let waiter = {
                let slots = slots.clone();
                tokio::spawn(async move { slots.acquire(LOCAL).await.map(|s| s.id) })
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
    fn a_client_at_its_share_closes_its_own_idle_connection_not_another_clients() {
        rt().block_on(async {
            let slots = Slots::with_min_idle(MAX_PER_CLIENT + 8, Duration::ZERO);
            let other = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 9));
            // The other client's connection is the longest idle of all.
            let o = slots.acquire(other).await.expect("other");
            tokio::time::sleep(Duration::from_millis(2)).await;
            let held: Vec<Slot> = acquire_n(&slots, MAX_PER_CLIENT).await;
            let _busy: Vec<Busy> = held.iter().skip(1).map(|s| s.conn.enter(&slots)).collect();
            let n = slots.acquire(LOCAL).await.expect("free slots remain");
            assert_eq!(slots.evictions(), 1);
            tokio::time::timeout(Duration::from_secs(1), held[0].conn.closed()).await.expect("its own idle one closed");
            assert!(tokio::time::timeout(Duration::from_millis(20), o.conn.closed()).await.is_err(), "not the other client's");
            drop(n);
        });
    }

    async fn acquire_n(slots: &Arc<Slots>, n: usize) -> Vec<Slot> {
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(slots.acquire(LOCAL).await.expect("slot"));
        }
        v
    }

    #[test]
    fn a_connection_just_accepted_or_just_answered_is_not_taken_for_idle() {
        rt().block_on(async {
            let slots = Slots::with_min_idle(1, Duration::from_secs(60));
            let a = slots.acquire(LOCAL).await.expect("a");
            drop(a.conn.enter(&slots));
            let s2 = slots.clone();
            let waiter = tokio::spawn(async move { s2.acquire(LOCAL).await.is_some() });
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(!waiter.is_finished());
            assert_eq!(slots.evictions(), 0, "idle for less than the minimum");
            drop(a);
            assert!(tokio::time::timeout(Duration::from_secs(1), waiter).await.expect("freed").expect("join"));
        });
    }

    #[test]
    fn when_every_connection_is_busy_a_new_one_waits() {
        rt().block_on(async {
            let slots = Slots::with_min_idle(1, Duration::ZERO);
            let a = slots.acquire(LOCAL).await.expect("a");
            let busy = a.conn.enter(&slots);
            let s2 = slots.clone();
            let waiter = tokio::spawn(async move { s2.acquire(LOCAL).await.is_some() });
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(!waiter.is_finished(), "no idle connection to close");
            assert_eq!(slots.evictions(), 0);
            drop(busy);
            drop(a);
            assert!(tokio::time::timeout(Duration::from_secs(1), waiter).await.expect("freed").expect("join"));
        });
    }
}
