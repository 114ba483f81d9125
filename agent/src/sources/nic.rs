//! The common per-NIC sample every counter source turns its snapshot into
//! (`timeline::NicSample`; each source's own `nic_parts` does the turning, so this module
//! imports no source). Sources fill only the fields they know; the engine adds up the fields
//! of every source per NIC name (RoCE traffic bypasses the netdev counters, so RDMA bytes and
//! netdev bytes of one port are disjoint and add).

use crate::timeline::{windows::NicInfo, NicSample};

/// Fields of one NIC from one source (time is stamped by the caller).
pub type NicPart = (NicInfo, NicSample);

pub fn info(name: String, rail: Option<u32>, rate: Option<f64>) -> NicInfo {
    NicInfo { name, host: None, rail, rate_bytes_per_second: rate }
}

/// Adds `b`'s fields into `a` (same NIC, different sources).
pub fn merge(a: &mut NicSample, b: &NicSample) {
    a.tx_bytes += b.tx_bytes;
    a.rx_bytes += b.rx_bytes;
    a.pause_seconds += b.pause_seconds;
    a.pause_frames += b.pause_frames;
    a.ecn_marked += b.ecn_marked;
    a.cnp_sent += b.cnp_sent;
    a.cnp_handled += b.cnp_handled;
    a.xmit_wait_ticks += b.xmit_wait_ticks;
    a.retransmits += b.retransmits;
    a.drops += b.drops;
    a.backlog_bytes = a.backlog_bytes.max(b.backlog_bytes);
    a.opaque_tx_bytes += b.opaque_tx_bytes;
    if let Some(o) = &b.own_tx {
        let mine = a.own_tx.get_or_insert_with(Vec::new);
        for &(pid, bytes) in o {
            match mine.binary_search_by_key(&pid, |e| e.0) {
                Ok(k) => mine[k].1 += bytes,
                Err(k) => mine.insert(k, (pid, bytes)),
            }
        }
    }
    // One source (tcp) fills these; added like the counters, gauges kept where set.
    let (t, u) = (&mut a.tcp, &b.tcp);
    t.bytes_acked += u.bytes_acked;
    t.busy_seconds += u.busy_seconds;
    t.rwnd_limited_seconds += u.rwnd_limited_seconds;
    t.sndbuf_limited_seconds += u.sndbuf_limited_seconds;
    t.in_flight_byte_seconds += u.in_flight_byte_seconds;
    t.rtt_seconds = t.rtt_seconds.max(u.rtt_seconds);
    t.min_rtt_seconds = t.min_rtt_seconds.max(u.min_rtt_seconds);
    t.mss_bytes = t.mss_bytes.max(u.mss_bytes);
    t.sndbuf_bytes += u.sndbuf_bytes;
    t.cwnd_bytes += u.cwnd_bytes;
}
