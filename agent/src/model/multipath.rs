//! Multipath, reordering and retransmission (docs/models.md §1.13).
//!
//! Packets are assigned round-robin to paths of equal rate. A packet is *sent* when its
//! serialisation on its path ends and *arrives* one path delay later; data is delivered in
//! order, so a packet that arrives before a gap waits in the reorder buffer. A lost packet
//! is resent `rto` after its first send (on its own path, once the path is free).

use serde::Serialize;

use super::{at_least, non_negative, positive, ModelError};
use crate::units::{Bytes, BytesPerSecond, Seconds};

#[derive(Clone, Debug, Serialize)]
pub struct Spray {
    pub bytes: Bytes,
    pub packet: Bytes,
    /// Rate of every path.
    pub rate: BytesPerSecond,
    /// One delay per path.
    pub delays: Vec<Seconds>,
}

impl Spray {
    fn validate(&self) -> Result<(), ModelError> {
        positive("bytes", self.bytes.0)?;
        positive("packet size", self.packet.0)?;
        positive("path rate", self.rate.0)?;
        at_least("paths", self.delays.len(), 1)?;
        for d in &self.delays {
            non_negative("path delay", d.0)?;
        }
        Ok(())
    }

    fn sizes(&self) -> Vec<Bytes> {
        let n = (self.bytes / self.packet).ceil().max(1.0) as usize;
        (0..n).map(|i| self.packet.min(self.bytes - self.packet * i as f64)).collect()
    }
}

/// One packet's life.
#[derive(Clone, Debug, Serialize)]
pub struct Packet {
    pub index: usize,
    pub path: usize,
    pub size: Bytes,
    /// End of its (last) serialisation.
    pub sent: Seconds,
    pub arrived: Seconds,
    /// When in-order delivery handed it up.
    pub delivered: Seconds,
}

#[derive(Clone, Debug, Serialize)]
pub struct SprayReport {
    pub packets: Vec<Packet>,
    /// Last arrival.
    pub completion: Seconds,
    /// Last in-order delivery.
    pub in_order: Seconds,
    pub peak_reorder_packets: usize,
    pub peak_reorder_bytes: Bytes,
    pub resent_bytes: Bytes,
}

/// Serialisation ends on each path for round-robin assignment starting at `start`.
fn serialise(sizes: &[Bytes], first: usize, paths: usize, rate: BytesPerSecond, start: Seconds) -> Vec<(usize, Seconds)> {
    let mut free = vec![start; paths];
    (0..sizes.len())
        .map(|k| {
            let i = first + k;
            let p = i % paths;
            free[p] += sizes[k] / rate;
            (p, free[p])
        })
        .collect()
}

/// In-order delivery and the reorder buffer's peak, given arrivals in packet order.
fn deliver(packets: &mut [Packet], buffering: bool) -> (usize, Bytes) {
    let mut last = Seconds(0.0);
    for p in packets.iter_mut() {
        last = last.max(p.arrived);
        p.delivered = last;
    }
    if !buffering {
        return (0, Bytes(0.0));
    }
    // A packet occupies the buffer on [arrived, delivered); departures before arrivals at
    // the same instant.
    let mut events: Vec<(f64, i8, usize)> = Vec::new();
    for (i, p) in packets.iter().enumerate() {
        if p.delivered.0 > p.arrived.0 {
            events.push((p.arrived.0, 1, i));
            events.push((p.delivered.0, -1, i));
        }
    }
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut n, mut bytes, mut peak_n, mut peak_b) = (0i64, 0.0, 0usize, 0.0f64);
    for (_, d, i) in events {
        n += i64::from(d);
        bytes += f64::from(d) * packets[i].size.0;
        peak_n = peak_n.max(n as usize);
        peak_b = peak_b.max(bytes);
    }
    (peak_n, Bytes(peak_b))
}

fn report(mut packets: Vec<Packet>, buffering: bool, resent: Bytes) -> SprayReport {
    let (peak_reorder_packets, peak_reorder_bytes) = deliver(&mut packets, buffering);
    let completion = packets.iter().map(|p| p.arrived).fold(Seconds(0.0), Seconds::max);
    let in_order = packets.last().map_or(Seconds(0.0), |p| p.delivered);
    SprayReport { packets, completion, in_order, peak_reorder_packets, peak_reorder_bytes, resent_bytes: resent }
}

/// Spraying without loss.
pub fn spray(s: &Spray) -> Result<SprayReport, ModelError> {
    s.validate()?;
    let sizes = s.sizes();
    let ends = serialise(&sizes, 0, s.delays.len(), s.rate, Seconds(0.0));
    let packets = ends
        .into_iter()
        .enumerate()
        .map(|(i, (path, sent))| Packet { index: i, path, size: sizes[i], sent, arrived: sent + s.delays[path], delivered: Seconds(0.0) })
        .collect();
    Ok(report(packets, true, Bytes(0.0)))
}

/// How the sender repairs a loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Repair {
    /// Resend only the lost packet; the receiver buffers what came after it.
    Selective,
    /// Resend the lost packet and everything after it; the receiver keeps nothing out of
    /// order. (The model lets the resent packets through even if unequal delays reorder
    /// them again.)
    GoBackN,
}

/// Spraying where packet `lost` is dropped once and repaired `rto` after its first send.
pub fn spray_with_loss(s: &Spray, lost: usize, rto: Seconds, repair: Repair) -> Result<SprayReport, ModelError> {
    s.validate()?;
    non_negative("retransmission timeout", rto.0)?;
    let mut r = spray(s)?;
    let paths = s.delays.len();
    let Some(first) = r.packets.get(lost).cloned() else {
        return Err(ModelError::Inconsistent { what: "lost packet", detail: format!("{lost} is not one of the {} packets", r.packets.len()) });
    };
    let path_free = |p: usize, pk: &[Packet]| pk.iter().filter(|x| x.path == p).map(|x| x.sent).fold(Seconds(0.0), Seconds::max);
    let start = first.sent + rto;
    let mut packets = r.packets.clone();
    let resent = match repair {
        Repair::Selective => {
            let begin = start.max(path_free(first.path, &packets));
            let sent = begin + first.size / s.rate;
            packets[lost].sent = sent;
            packets[lost].arrived = sent + s.delays[first.path];
            first.size
        }
        Repair::GoBackN => {
            let begin = (0..paths).map(|p| start.max(path_free(p, &packets))).fold(start, Seconds::max);
            let sizes: Vec<Bytes> = packets[lost..].iter().map(|p| p.size).collect();
            for (k, (path, sent)) in serialise(&sizes, lost, paths, s.rate, begin).into_iter().enumerate() {
                let p = &mut packets[lost + k];
                p.path = path;
                p.sent = sent;
                p.arrived = sent + s.delays[path];
            }
            sizes.into_iter().sum()
        }
    };
    r = report(packets, repair == Repair::Selective, resent);
    Ok(r)
}

/// One path against all paths: two paths win only if the delay difference is smaller than
/// the serialisation they save (§1.13).
#[derive(Clone, Debug, Serialize)]
pub struct PathChoice {
    /// Everything on the fastest single path.
    pub one_path: Seconds,
    pub all_paths: Seconds,
    pub serialisation_saved: Seconds,
    pub delay_difference: Seconds,
    pub multipath_wins: bool,
}

pub fn compare_paths(s: &Spray) -> Result<PathChoice, ModelError> {
    s.validate()?;
    let fastest = s.delays.iter().copied().fold(Seconds(f64::INFINITY), Seconds::min);
    let slowest = s.delays.iter().copied().fold(Seconds(0.0), Seconds::max);
    let one = spray(&Spray { delays: vec![fastest], ..s.clone() })?;
    let all = spray(s)?;
    let ser_one = one.completion - fastest;
    let ser_all = all.packets.iter().map(|p| p.sent).fold(Seconds(0.0), Seconds::max);
    Ok(PathChoice {
        one_path: one.in_order,
        all_paths: all.in_order,
        serialisation_saved: ser_one - ser_all,
        delay_difference: slowest - fastest,
        multipath_wins: all.in_order.0 < one.in_order.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testutil::{close, digit};

    fn base(delays: &[f64]) -> Spray {
        Spray { bytes: Bytes::kib(32.0), packet: Bytes::kib(4.0), rate: BytesPerSecond::gb_s(50.0), delays: delays.iter().map(|&d| Seconds::us(d)).collect() }
    }

    #[test]
    fn check_spray() {
        // §1.13 [check]: 2 paths × 50 GB/s, 1 µs each: ≈ 1.33 µs (vs 1.66 µs on one path);
        // second path 9 µs: ≈ 9.33 µs and up to 12 KiB buffered.
        digit(spray(&base(&[1.0, 1.0])).unwrap().in_order.in_us(), 1.33, 0.01, "two paths");
        digit(spray(&base(&[1.0])).unwrap().in_order.in_us(), 1.66, 0.01, "one path");
        let slow = spray(&base(&[1.0, 9.0])).unwrap();
        digit(slow.in_order.in_us(), 9.33, 0.01, "9 µs path");
        assert_eq!(slow.peak_reorder_bytes, Bytes::kib(12.0));
        assert_eq!(slow.peak_reorder_packets, 3);
    }

    #[test]
    fn check_loss() {
        // §1.13 [check]: loss of packet 0, resent 20 µs after its first send: in order at
        // ≈ 21.2 µs, 28 KiB buffered; selective resends 4 KiB, go-back-N 32 KiB.
        let s = base(&[1.0, 1.0]);
        let sel = spray_with_loss(&s, 0, Seconds::us(20.0), Repair::Selective).unwrap();
        digit(sel.in_order.in_us(), 21.2, 0.1, "selective");
        assert_eq!(sel.peak_reorder_bytes, Bytes::kib(28.0));
        assert_eq!(sel.resent_bytes, Bytes::kib(4.0));
        let gbn = spray_with_loss(&s, 0, Seconds::us(20.0), Repair::GoBackN).unwrap();
        assert_eq!(gbn.resent_bytes, Bytes::kib(32.0));
        assert_eq!(gbn.peak_reorder_bytes, Bytes(0.0));
        assert!(gbn.in_order.0 > sel.in_order.0);
    }

    #[test]
    fn property_one_path_is_serialisation_plus_delay() {
        let mut seed = 7u64;
        for _ in 0..50 {
            let r = crate::model::ecmp::xorshift(&mut seed);
            let s = Spray {
                bytes: Bytes((1 + r % 1_000_000) as f64),
                packet: Bytes((64 + (r >> 20) % 9000) as f64),
                rate: BytesPerSecond(1e9 * (1 + (r >> 40) % 100) as f64),
                delays: vec![Seconds::ns(((r >> 50) % 10_000) as f64)],
            };
            let got = spray(&s).unwrap();
            close(got.in_order.0, (s.bytes / s.rate + s.delays[0]).0, 1e-12, "one path");
            assert_eq!(got.peak_reorder_packets, 0);
        }
    }

    #[test]
    fn check_two_paths_win_only_if_delay_difference_is_small() {
        let c = compare_paths(&base(&[1.0, 1.0])).unwrap();
        assert!(c.multipath_wins);
        let c = compare_paths(&base(&[1.0, 9.0])).unwrap();
        assert!(!c.multipath_wins);
        assert!(c.delay_difference.0 > c.serialisation_saved.0);
    }

    #[test]
    fn bad_inputs() {
        assert!(spray(&Spray { delays: vec![], ..base(&[1.0]) }).is_err());
        assert!(spray(&Spray { rate: BytesPerSecond(0.0), ..base(&[1.0]) }).is_err());
        assert!(spray_with_loss(&base(&[1.0]), 99, Seconds::us(1.0), Repair::Selective).is_err());
    }
}
