//! Congestion model (docs/models.md §4): is the fabric queueing.
//!
//! A fluid queue `dQ/dt = λ(t) − B` clipped to `[0, Q_cap]`; what overflows is dropped (or,
//! with PFC, paused upstream). Inputs are piecewise constant, so every segment is integrated
//! exactly: no time step, no discretisation error.

use serde::Serialize;

use super::{at_least, non_negative, positive, ModelError};
use crate::units::{Bytes, BytesPerSecond, Metres, Seconds};

/// A source sending at `rate` for `on` out of every `period`, starting at `phase`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PeriodicSource {
    pub rate: BytesPerSecond,
    pub on: Seconds,
    pub period: Seconds,
    pub phase: Seconds,
}

impl PeriodicSource {
    fn validate(&self) -> Result<(), ModelError> {
        non_negative("source rate", self.rate.0)?;
        positive("source period", self.period.0)?;
        non_negative("source on-time", self.on.0)?;
        if self.on.0 > self.period.0 {
            return Err(ModelError::Inconsistent { what: "source on-time", detail: format!("{} is longer than its period {}", self.on, self.period) });
        }
        Ok(())
    }
    fn is_on(&self, t: f64) -> bool {
        let x = (t - self.phase.0).rem_euclid(self.period.0);
        x < self.on.0
    }
    /// On/off edges inside `[0, horizon]`.
    fn edges(&self, horizon: f64, out: &mut Vec<f64>) {
        let p = self.period.0;
        // Only the phase modulo the period matters: a phase of hours on a µs period would
        // otherwise walk every period from −phase.
        let phase = self.phase.0.rem_euclid(p);
        let first = (-phase / p).floor() - 1.0;
        let mut k = first;
        loop {
            let start = phase + k * p;
            if start > horizon {
                break;
            }
            for e in [start, start + self.on.0] {
                if e > 0.0 && e < horizon {
                    out.push(e);
                }
            }
            k += 1.0;
        }
    }
}

/// Most on/off edges a queue simulation walks (2 per source per period in the horizon).
pub const MAX_EDGES: usize = 1 << 20;

/// Piecewise-constant input of the sources over `[0, horizon]`: `(duration, λ)` segments.
pub fn periodic_input(sources: &[PeriodicSource], horizon: Seconds) -> Result<Vec<(Seconds, BytesPerSecond)>, ModelError> {
    positive("horizon", horizon.0)?;
    for s in sources {
        s.validate()?;
    }
    // Two edges per period per source: bounded so a long horizon is an error, not minutes.
    let edges: f64 = sources.iter().map(|s| 2.0 * (horizon.0 / s.period.0 + 3.0)).sum();
    if edges > MAX_EDGES as f64 {
        return Err(ModelError::Inconsistent {
            what: "horizon",
            detail: format!("{horizon} covers about {edges:.3e} on/off edges of the sources; at most {MAX_EDGES} (shorten the horizon or lengthen the period)"),
        });
    }
    let mut cuts = vec![0.0, horizon.0];
    for s in sources {
        s.edges(horizon.0, &mut cuts);
    }
    cuts.sort_by(f64::total_cmp);
    cuts.dedup_by(|a, b| (*a - *b).abs() <= 1e-15 * horizon.0);
    Ok(cuts
        .windows(2)
        .map(|w| {
            let mid = 0.5 * (w[0] + w[1]);
            let lambda = sources.iter().filter(|s| s.is_on(mid)).map(|s| s.rate).sum();
            (Seconds(w[1] - w[0]), lambda)
        })
        .collect())
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct QueuePoint {
    pub t: Seconds,
    pub queue: Bytes,
}

#[derive(Clone, Debug, Serialize)]
pub struct QueueRun {
    pub points: Vec<QueuePoint>,
    pub bytes_in: Bytes,
    pub bytes_out: Bytes,
    pub dropped: Bytes,
    /// In the queue at the end.
    pub queued: Bytes,
    pub peak: Bytes,
    pub peak_at: Seconds,
    /// First time at or after the peak when the queue is empty.
    pub empty_after_peak: Option<Seconds>,
}

/// Runs the fluid queue on `segments` into a link of bandwidth `link`, starting at `q0`.
pub fn fluid_queue(segments: &[(Seconds, BytesPerSecond)], link: BytesPerSecond, capacity: Option<Bytes>, q0: Bytes) -> Result<QueueRun, ModelError> {
    positive("link bandwidth", link.0)?;
    non_negative("initial queue", q0.0)?;
    let cap = match capacity {
        Some(c) => positive("buffer", c.0)?,
        None => f64::INFINITY,
    };
    if q0.0 > cap {
        return Err(ModelError::Inconsistent { what: "initial queue", detail: format!("{q0} exceeds the buffer") });
    }
    let b = link.0;
    let (mut t, mut q) = (0.0f64, q0.0);
    let (mut bin, mut bout, mut dropped) = (0.0, 0.0, 0.0);
    let mut points = vec![QueuePoint { t: Seconds(0.0), queue: q0 }];
    for &(d, lambda) in segments {
        non_negative("segment duration", d.0)?;
        non_negative("arrival rate", lambda.0)?;
        let (d, l) = (d.0, lambda.0);
        let r = l - b;
        bin += l * d;
        if r > 0.0 {
            let t_full = (cap - q) / r;
            if t_full < d {
                points.push(QueuePoint { t: Seconds(t + t_full), queue: Bytes(cap) });
                dropped += r * (d - t_full);
                q = cap;
            } else {
                q += r * d;
            }
            bout += b * d;
        } else if r < 0.0 {
            let t_empty = q / -r;
            if t_empty < d {
                if t_empty > 0.0 {
                    points.push(QueuePoint { t: Seconds(t + t_empty), queue: Bytes(0.0) });
                }
                bout += b * t_empty + l * (d - t_empty);
                q = 0.0;
            } else {
                q += r * d;
                bout += b * d;
            }
        } else {
            bout += b * d;
        }
        t += d;
        points.push(QueuePoint { t: Seconds(t), queue: Bytes(q) });
    }
    let (peak_i, peak) = points.iter().enumerate().fold((0, 0.0f64), |(bi, bq), (i, p)| if p.queue.0 > bq { (i, p.queue.0) } else { (bi, bq) });
    let peak_at = points[peak_i].t;
    let empty_after_peak = points[peak_i..].iter().find(|p| p.queue.0 <= 0.0).map(|p| p.t);
    Ok(QueueRun {
        points,
        bytes_in: Bytes(bin),
        bytes_out: Bytes(bout),
        dropped: Bytes(dropped),
        queued: Bytes(q),
        peak: Bytes(peak),
        peak_at,
        empty_after_peak,
    })
}

/// The §4.1 questions for periodic sources into one link.
#[derive(Clone, Debug, Serialize)]
pub struct QueueReport {
    pub mean_load: BytesPerSecond,
    pub utilisation: f64,
    /// Time with λ > B over the horizon.
    pub overlap: Seconds,
    /// Without a buffer limit.
    pub unbounded: QueueRun,
    /// `empty_after_peak − peak_at` of the unbounded run.
    pub drain_after_peak: Option<Seconds>,
    pub buffer: Bytes,
    /// With the buffer: what is dropped.
    pub bounded: QueueRun,
    /// Longest all-sources-on overlap the buffer absorbs: `Q_cap / (Σ rates − B)`.
    pub tolerated_overlap: Option<Seconds>,
}

pub fn queue(sources: &[PeriodicSource], link: BytesPerSecond, buffer: Bytes, horizon: Seconds) -> Result<QueueReport, ModelError> {
    at_least("sources", sources.len(), 1)?;
    positive("link bandwidth", link.0)?;
    let segs = periodic_input(sources, horizon)?;
    let mean_load: BytesPerSecond = sources.iter().map(|s| s.rate * (s.on / s.period)).sum();
    let overlap = segs.iter().filter(|(_, l)| l.0 > link.0).map(|(d, _)| *d).sum();
    let unbounded = fluid_queue(&segs, link, None, Bytes(0.0))?;
    let bounded = fluid_queue(&segs, link, Some(buffer), Bytes(0.0))?;
    let peak_rate: BytesPerSecond = sources.iter().map(|s| s.rate).sum();
    let tolerated_overlap = (peak_rate.0 > link.0).then(|| buffer / (peak_rate - link));
    Ok(QueueReport {
        mean_load,
        utilisation: mean_load / link,
        overlap,
        drain_after_peak: unbounded.empty_after_peak.map(|e| e - unbounded.peak_at),
        unbounded,
        buffer,
        bounded,
        tolerated_overlap,
    })
}

// ---------------------------------------------------------------------------------------
// §4.2 Feedback delay bound `T_f ≤ Q_free/(λ − B)`.

#[derive(Clone, Debug, Serialize)]
pub struct FeedbackReport {
    pub free: Bytes,
    /// `Q_free/(λ − B)`: the longest feedback delay without loss (∞ if λ ≤ B).
    pub time_to_full: Seconds,
    /// `(λ − B)·T_f`
    pub excess: Bytes,
    pub dropped: Bytes,
    pub queue_at_feedback: Bytes,
    /// `B − λ'` after the sender reduces to `λ'`.
    pub drain_rate: BytesPerSecond,
    /// ∞ when the sender only comes down to `B`: growth stops, the queue never drains.
    pub drain_time: Seconds,
    pub empty_at: Seconds,
}

pub fn feedback(
    arrival: BytesPerSecond,
    link: BytesPerSecond,
    buffer: Bytes,
    queued: Bytes,
    delay: Seconds,
    reduced: BytesPerSecond,
) -> Result<FeedbackReport, ModelError> {
    positive("link bandwidth", link.0)?;
    positive("buffer", buffer.0)?;
    non_negative("arrival rate", arrival.0)?;
    non_negative("reduced rate", reduced.0)?;
    non_negative("feedback delay", delay.0)?;
    if queued.0 > buffer.0 || queued.0 < 0.0 {
        return Err(ModelError::OutOfRange { what: "queued bytes", lo: 0.0, hi: buffer.0, value: queued.0 });
    }
    let free = buffer - queued;
    let over = arrival - link;
    let time_to_full = if over.0 > 0.0 { free / over } else { Seconds(f64::INFINITY) };
    let excess = over.max(BytesPerSecond(0.0)) * delay;
    let dropped = (excess - free).max(Bytes(0.0));
    let queue_at_feedback = (queued + over * delay).max(Bytes(0.0)).min(buffer);
    let drain_rate = link - reduced;
    let drain_time = if queue_at_feedback.0 <= 0.0 {
        Seconds(0.0)
    } else if drain_rate.0 > 0.0 {
        queue_at_feedback / drain_rate
    } else {
        Seconds(f64::INFINITY)
    };
    Ok(FeedbackReport { free, time_to_full, excess, dropped, queue_at_feedback, drain_rate, drain_time, empty_at: delay + drain_time })
}

// ---------------------------------------------------------------------------------------
// §4.3 Incast.

/// Propagation delay of a cable: 5 ns per metre.
pub const NS_PER_METRE: f64 = 5.0;

#[derive(Clone, Debug, Serialize)]
pub struct IncastInput {
    pub senders: usize,
    pub rate: BytesPerSecond,
    pub egress: BytesPerSecond,
    /// Free buffer at the congested egress.
    pub buffer: Bytes,
    pub cable: Metres,
    pub mtu: Bytes,
    pub rtt: Seconds,
}

#[derive(Clone, Debug, Serialize)]
pub struct IncastReport {
    /// `λ = (N−1)·B` as docs/models.md §4.3 writes it.
    pub arrival: BytesPerSecond,
    pub excess: BytesPerSecond,
    /// `Q_free / (λ − B)`
    pub allowed_feedback_delay: Seconds,
    /// PFC, one hop: `2 × cable × 5 ns/m + MTU/B`.
    pub hop_delay: Seconds,
    /// `(λ − B)·t_hop`
    pub pfc_headroom: Bytes,
    /// `(λ − B)·RTT`: what arrives before end-to-end feedback can act.
    pub rtt_excess: Bytes,
    pub lossless_end_to_end: bool,
    /// Largest N with `(λ − B)·RTT ≤ Q_free`.
    pub max_senders_end_to_end: usize,
}

pub fn incast(i: &IncastInput) -> Result<IncastReport, ModelError> {
    at_least("senders", i.senders, 1)?;
    positive("sender rate", i.rate.0)?;
    positive("egress bandwidth", i.egress.0)?;
    non_negative("buffer", i.buffer.0)?;
    non_negative("cable length", i.cable.0)?;
    positive("MTU", i.mtu.0)?;
    positive("RTT", i.rtt.0)?;
    let arrival = i.rate * (i.senders - 1) as f64;
    let excess = (arrival - i.egress).max(BytesPerSecond(0.0));
    let allowed = if excess.0 > 0.0 { i.buffer / excess } else { Seconds(f64::INFINITY) };
    let hop_delay = i.cable * Seconds::ns(2.0 * NS_PER_METRE) + i.mtu / i.rate;
    let rtt_excess = excess * i.rtt;
    let n_max = 1.0 + (i.egress.0 + i.buffer.0 / i.rtt.0) / i.rate.0;
    Ok(IncastReport {
        arrival,
        excess,
        allowed_feedback_delay: allowed,
        hop_delay,
        pfc_headroom: excess * hop_delay,
        rtt_excess,
        lossless_end_to_end: rtt_excess.0 <= i.buffer.0,
        max_senders_end_to_end: ((n_max + 1e-9).floor() as usize).max(1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testutil::{close, digit};

    fn gbs(x: f64) -> BytesPerSecond {
        BytesPerSecond::gb_s(x)
    }

    fn job(phase_ms: f64) -> PeriodicSource {
        PeriodicSource { rate: gbs(50.0), on: Seconds::ms(20.0), period: Seconds::ms(100.0), phase: Seconds::ms(phase_ms) }
    }

    #[test]
    fn check_fluid_queue() {
        // §4.1 [check]: mean 20 GB/s (40 %); aligned peaks queue 1 GB and need 20 ms more to
        // drain; 5 ms of overlap queues 250 MB; a 512 KiB buffer tolerates ≈ 10.5 µs.
        let r = queue(&[job(0.0), job(0.0)], gbs(50.0), Bytes::kib(512.0), Seconds::ms(100.0)).unwrap();
        close(r.mean_load.in_gb_s(), 20.0, 1e-12, "mean");
        close(r.utilisation, 0.4, 1e-12, "utilisation");
        close(r.unbounded.peak.0, 1e9, 1e-9, "aligned peak");
        close(r.drain_after_peak.unwrap().in_ms(), 20.0, 1e-9, "drain");
        digit(r.tolerated_overlap.unwrap().in_us(), 10.5, 0.1, "tolerated overlap");
        assert!(r.bounded.dropped.0 > 0.0);
        let r = queue(&[job(0.0), job(15.0)], gbs(50.0), Bytes::kib(512.0), Seconds::ms(100.0)).unwrap();
        close(r.overlap.in_ms(), 5.0, 1e-9, "overlap");
        close(r.unbounded.peak.0, 250e6, 1e-9, "5 ms overlap");
    }

    #[test]
    fn property_fluid_queue_conserves_bytes() {
        let mut seed = 99u64;
        for _ in 0..200 {
            let mut rnd = || crate::model::ecmp::xorshift(&mut seed);
            let segs: Vec<(Seconds, BytesPerSecond)> =
                (0..1 + rnd() % 30).map(|_| (Seconds::us((rnd() % 1000) as f64), BytesPerSecond((rnd() % 200) as f64 * 1e9))).collect();
            let cap = if rnd() % 3 == 0 { None } else { Some(Bytes((1 + rnd() % 10_000_000) as f64)) };
            let q0 = Bytes(cap.map_or(0.0, |c| c.0 * (rnd() % 100) as f64 / 100.0));
            let r = fluid_queue(&segs, BytesPerSecond((1 + rnd() % 100) as f64 * 1e9), cap, q0).unwrap();
            let lhs = r.bytes_in.0 + q0.0;
            let rhs = r.bytes_out.0 + r.queued.0 + r.dropped.0;
            assert!((lhs - rhs).abs() <= 1e-9 * lhs.max(1.0), "in {lhs} vs out+queued+dropped {rhs}");
            assert!(r.points.iter().all(|p| p.queue.0 >= -1e-6 && cap.is_none_or(|c| p.queue.0 <= c.0 * (1.0 + 1e-12))));
        }
    }

    #[test]
    fn check_feedback() {
        // §4.2 [check]: λ = 100, B = 50 GB/s, 512 KiB half full: full after ≈ 5.2 µs; feedback
        // at 20 µs → 1 MB excess, ≈ 738 KB dropped; draining at 40 GB/s takes ≈ 52 µs, empty
        // at ≈ 72 µs. Reducing only to B never drains.
        let buf = Bytes::kib(512.0);
        let r = feedback(gbs(100.0), gbs(50.0), buf, buf / 2.0, Seconds::us(20.0), gbs(40.0)).unwrap();
        digit(r.time_to_full.in_us(), 5.2, 0.1, "full after");
        close(r.excess.0, 1e6, 1e-12, "excess");
        digit(r.dropped.0 / 1e3, 738.0, 1.0, "dropped KB");
        digit(r.drain_time.in_us(), 52.0, 1.0, "drain");
        digit(r.empty_at.in_us(), 72.0, 1.0, "empty at");
        let r = feedback(gbs(100.0), gbs(50.0), buf, buf / 2.0, Seconds::us(20.0), gbs(50.0)).unwrap();
        assert!(r.drain_time.0.is_infinite());
        // The closed form agrees with the fluid queue.
        let segs = [(Seconds::us(20.0), gbs(100.0)), (Seconds::us(100.0), gbs(40.0))];
        let q = fluid_queue(&segs, gbs(50.0), Some(buf), buf / 2.0).unwrap();
        close(q.dropped.0, 737_856.0, 1e-9, "fluid drops");
        close(q.empty_after_peak.unwrap().in_us(), 20.0 + 52.4288, 1e-9, "fluid empty");
    }

    #[test]
    fn check_incast() {
        // §4.3 [check]: PFC one hop, 30 m and 1500 B → 0.33 µs.
        let i = IncastInput {
            senders: 8,
            rate: gbs(50.0),
            egress: gbs(50.0),
            buffer: Bytes::kib(512.0),
            cable: Metres(30.0),
            mtu: Bytes(1500.0),
            rtt: Seconds::us(20.0),
        };
        let r = incast(&i).unwrap();
        digit(r.hop_delay.in_us(), 0.33, 0.01, "t_hop");
        close(r.arrival.in_gb_s(), 350.0, 1e-12, "λ = (N−1)B");
        close(r.pfc_headroom.0, 300e9 * 0.33e-6, 1e-12, "headroom");
        close(r.rtt_excess.0, 300e9 * 20e-6, 1e-12, "RTT excess");
        assert!(!r.lossless_end_to_end);
        assert_eq!(r.max_senders_end_to_end, 2);
        let ok = incast(&IncastInput { senders: 2, ..i.clone() }).unwrap();
        assert!(ok.lossless_end_to_end && ok.allowed_feedback_delay.0.is_infinite());
        assert!(incast(&IncastInput { senders: 0, ..i }).is_err());
    }
}
