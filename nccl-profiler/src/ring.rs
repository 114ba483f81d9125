//! A preallocated bounded lock-free queue (Vyukov's MPMC array queue): NCCL's threads push
//! finished records, the sender thread pops them. A push never waits and never allocates:
//! when the queue is full the record is dropped and counted.

use std::{
    cell::UnsafeCell,
    sync::atomic::{AtomicU64, AtomicUsize, Ordering},
};

use crate::wire::Record;

struct Cell {
    seq: AtomicUsize,
    rec: UnsafeCell<Record>,
}

pub struct Ring {
    cells: Box<[Cell]>,
    mask: usize,
    head: AtomicUsize,
    tail: AtomicUsize,
    /// Records dropped because the queue was full.
    pub dropped: AtomicU64,
}

// SAFETY: a cell's record is written only by the producer that won its slot (CAS on `tail`)
// and read only by the consumer that won it (CAS on `head`); the cell's `seq` hands it over
// with release/acquire ordering.
unsafe impl Sync for Ring {}
// SAFETY: as above; the ring owns plain data.
unsafe impl Send for Ring {}

impl Ring {
    /// A ring of `capacity` (rounded up to a power of two, at least 2) records.
    pub fn new(capacity: usize) -> Ring {
        let cap = capacity.max(2).next_power_of_two();
        let cells = (0..cap).map(|i| Cell { seq: AtomicUsize::new(i), rec: UnsafeCell::new(Record::default()) }).collect();
        Ring { cells, mask: cap - 1, head: AtomicUsize::new(0), tail: AtomicUsize::new(0), dropped: AtomicU64::new(0) }
    }

    pub fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// Pushes `r`; false (and counted in `dropped`) when full. Never blocks.
    pub fn push(&self, r: &Record) -> bool {
        let mut pos = self.tail.load(Ordering::Relaxed);
        loop {
            let cell = &self.cells[pos & self.mask];
            let seq = cell.seq.load(Ordering::Acquire);
            let diff = seq as isize - pos as isize;
            if diff == 0 {
                match self.tail.compare_exchange_weak(pos, pos.wrapping_add(1), Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => {
                        // SAFETY: this producer won cell `pos`; no one else touches it until
                        // `seq` is published below.
                        unsafe { *cell.rec.get() = *r };
                        cell.seq.store(pos.wrapping_add(1), Ordering::Release);
                        return true;
                    }
                    Err(p) => pos = p,
                }
            } else if diff < 0 {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                return false;
            } else {
                pos = self.tail.load(Ordering::Relaxed);
            }
        }
    }

    /// Pops the oldest record, if any.
    pub fn pop(&self) -> Option<Record> {
        let mut pos = self.head.load(Ordering::Relaxed);
        loop {
            let cell = &self.cells[pos & self.mask];
            let seq = cell.seq.load(Ordering::Acquire);
            let diff = seq as isize - pos.wrapping_add(1) as isize;
            if diff == 0 {
                match self.head.compare_exchange_weak(pos, pos.wrapping_add(1), Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => {
                        // SAFETY: this consumer won cell `pos`, published by its producer.
                        let r = unsafe { *cell.rec.get() };
                        cell.seq.store(pos.wrapping_add(self.mask + 1), Ordering::Release);
                        return Some(r);
                    }
                    Err(p) => pos = p,
                }
            } else if diff < 0 {
                return None;
            } else {
                pos = self.head.load(Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seq: u64) -> Record {
        Record { seq, ..Default::default() }
    }

    #[test]
    fn full_ring_drops_and_counts_without_blocking() {
        let r = Ring::new(8);
        assert_eq!(r.capacity(), 8);
        for i in 0..8 {
            assert!(r.push(&rec(i)));
        }
        let t = std::time::Instant::now();
        for i in 8..1008 {
            assert!(!r.push(&rec(i)));
        }
        // 1000 refused pushes return at once (no waiting for the consumer).
        assert!(t.elapsed() < std::time::Duration::from_millis(100), "{:?}", t.elapsed());
        assert_eq!(r.dropped.load(Ordering::Relaxed), 1000);
        let got: Vec<u64> = std::iter::from_fn(|| r.pop()).map(|r| r.seq).collect();
        assert_eq!(got, (0..8).collect::<Vec<_>>());
        assert!(r.push(&rec(99)));
        assert_eq!(r.pop().map(|r| r.seq), Some(99));
    }

    #[test]
    fn concurrent_producers_lose_nothing_that_fits() {
        let r = std::sync::Arc::new(Ring::new(1 << 16));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for i in 0..10_000u64 {
                        assert!(r.push(&rec(t * 1_000_000 + i)));
                    }
                })
            })
            .collect();
        let mut seen = Vec::new();
        while seen.len() < 40_000 {
            if let Some(x) = r.pop() {
                seen.push(x.seq);
            }
        }
        for t in threads {
            t.join().expect("producer");
        }
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 40_000);
        assert_eq!(r.dropped.load(Ordering::Relaxed), 0);
    }
}
