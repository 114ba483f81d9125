//! The datagram format between the plugin and the agent (docs/profiler-plugin.md "Wire
//! format"). Version 1, little-endian, fixed sizes:
//!
//! ```text
//! header (64 bytes; 48 before the GPU address)
//!   0  u32 magic "SWPF" (0x46505753)     4  u16 version (1)
//!   6  u16 header bytes (64)              8  u16 record bytes (168; 136 before the request totals)
//!  10  u16 records in this datagram      12  u32 pid of the traced process
//!  16  u32 NCCL version (ncclGetVersion, e.g. 22907; 0 unknown)
//!  20  u32 event mask the plugin asked NCCL for
//!  24  u64 records dropped so far: the ring was full
//!  32  u64 records dropped so far: not delivered (no agent, or its queue stayed full)
//!  40  u64 records sent so far (before this datagram)
//!  48  [u8; 16] PCI address of the process's CUDA device (`cuDeviceGetPCIBusId`), ASCII in
//!      sysfs's spelling (e.g. "0000:07:00.0"), NUL-padded; all zero: unknown
//! record (168 bytes) × n, see [`Record`]
//! ```
//!
//! A receiver refuses a datagram whose magic or version it does not know, or whose sizes do not
//! add up; it reads the header and record sizes from the header, so a later version may append
//! fields to either.

/// "SWPF" little-endian.
pub const MAGIC: u32 = 0x4650_5753;
pub const VERSION: u16 = 1;
pub const HEADER_BYTES: usize = 64;
/// The first plugins' header: no GPU address (it decodes as unknown).
pub const MIN_HEADER_BYTES: usize = 48;
pub const RECORD_BYTES: usize = 168;
/// The first plugins' records: no request totals (they decode as zero).
pub const MIN_RECORD_BYTES: usize = 136;
/// Records per datagram at most (about 10.8 KB: well under the default `wmem_default`).
pub const MAX_RECORDS: usize = 64;

/// Proxy step states whose time is totalled per collective, in [`Record::proxy_wait_ns`]
/// order, with NCCL's `ncclProfilerEventState_t` values.
pub const PROXY_STATES: [(&str, u32); 6] =
    [("send_gpu_wait", 8), ("send_peer_wait", 20), ("send_wait", 9), ("recv_wait", 10), ("recv_flush_wait", 11), ("recv_gpu_wait", 12)];

/// The record holds GPU start and end for every channel NCCL announced.
pub const FLAG_COMPLETE: u8 = 1;
/// Sent before every channel stopped: its slot was needed for a newer collective.
pub const FLAG_EVICTED: u8 = 2;
/// No KernelCh events were asked for (the event mask): host enqueue time only.
pub const FLAG_NO_KERNEL: u8 = 4;
/// A progress record: the collective's first channel started on the GPU (`gpu_start_ptimer`
/// set, no end); its full record follows when the last channel stops. A rank whose GPU never
/// starts a collective that its peers' GPUs are inside is what a GPU-side hang looks like.
pub const FLAG_STARTED: u8 = 8;
/// The collective was launched by a CUDA graph replay: its Coll event's parent is a CollApi
/// event that NCCL reported with `graphCaptured` (v5+; docs/profiler-plugin.md, "CUDA
/// graphs"). No host NCCL call ran for it; `enqueue_ns` is when the graph's host node ran.
pub const FLAG_GRAPH: u8 = 16;

/// One collective on one rank.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// NCCL's communicator hash (`commId` of init): the same on every rank.
    pub comm_hash: u64,
    /// NCCL's sequence number of this function on this communicator (counted per function:
    /// the join key is (comm, func, seq)).
    pub seq: u64,
    pub rank: i32,
    pub nranks: i32,
    /// count × datatype size (0 when the datatype is unknown).
    pub bytes: u64,
    pub count: u64,
    /// CLOCK_REALTIME ns at the Coll start callback (the host enqueue).
    pub enqueue_ns: u64,
    /// Earliest KernelCh start, GPU global timer ns (0: none seen).
    pub gpu_start_ptimer: u64,
    /// Latest KernelChStop, GPU global timer ns (0: none seen).
    pub gpu_end_ptimer: u64,
    /// Host CLOCK_REALTIME − GPU timer, ns: the smallest (host time at a KernelCh start
    /// callback − its pTimer) in the window. An upper bound of the true offset.
    pub offset_ns: i64,
    /// The offset's error bound, ns (u64::MAX: unknown): the upper bound less the largest
    /// (host enqueue time − GPU start) in the window, a lower bound of the true offset (a
    /// kernel cannot start before it was enqueued).
    pub offset_error_ns: u64,
    /// Time proxy steps spent in each of [`PROXY_STATES`], ns, summed over steps.
    pub proxy_wait_ns: [u64; 6],
    /// Network requests the proxy steps posted, [send, recv]: a send step entering SendWait,
    /// a receive step leaving RecvWait. With `proxy_wait_ns`'s send_wait / recv_wait (their
    /// summed occupancy) they give Little's N, m and T of the collective's transfers.
    pub requests: [u64; 2],
    /// Their bytes (NCCL's `transSize`), [send, recv].
    pub request_bytes: [u64; 2],
    pub func: u8,
    pub datatype: u8,
    pub algo: u8,
    pub proto: u8,
    pub n_channels: u8,
    /// Channels whose KernelChStop was seen.
    pub kernel_stops: u8,
    pub flags: u8,
}

impl Record {
    /// GPU start on the host clock (CLOCK_REALTIME ns), when known.
    pub fn gpu_start_host_ns(&self) -> Option<i128> {
        (self.gpu_start_ptimer != 0 && self.offset_error_ns != u64::MAX).then(|| self.gpu_start_ptimer as i128 + self.offset_ns as i128)
    }
    pub fn gpu_end_host_ns(&self) -> Option<i128> {
        (self.gpu_end_ptimer != 0 && self.offset_error_ns != u64::MAX).then(|| self.gpu_end_ptimer as i128 + self.offset_ns as i128)
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        for v in [self.comm_hash, self.seq] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.rank.to_le_bytes());
        out.extend_from_slice(&self.nranks.to_le_bytes());
        for v in [self.bytes, self.count, self.enqueue_ns, self.gpu_start_ptimer, self.gpu_end_ptimer] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.offset_ns.to_le_bytes());
        out.extend_from_slice(&self.offset_error_ns.to_le_bytes());
        for v in self.proxy_wait_ns {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&[self.func, self.datatype, self.algo, self.proto, self.n_channels, self.kernel_stops, self.flags, 0]);
        for v in self.requests.iter().chain(&self.request_bytes) {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// Reads one record from [`MIN_RECORD_BYTES`] or more (fields past the end read as 0;
    /// later versions' extra bytes are ignored); `None` when too short.
    pub fn decode(b: &[u8]) -> Option<Record> {
        if b.len() < MIN_RECORD_BYTES {
            return None;
        }
        let u = |i: usize| b.get(i..i + 8).and_then(|s| s.try_into().ok()).map_or(0, u64::from_le_bytes);
        let i32_at = |i: usize| i32::from_le_bytes(b[i..i + 4].try_into().unwrap_or([0; 4]));
        let mut proxy_wait_ns = [0u64; 6];
        for (k, w) in proxy_wait_ns.iter_mut().enumerate() {
            *w = u(80 + 8 * k);
        }
        Some(Record {
            comm_hash: u(0),
            seq: u(8),
            rank: i32_at(16),
            nranks: i32_at(20),
            bytes: u(24),
            count: u(32),
            enqueue_ns: u(40),
            gpu_start_ptimer: u(48),
            gpu_end_ptimer: u(56),
            offset_ns: u(64) as i64,
            offset_error_ns: u(72),
            proxy_wait_ns,
            requests: [u(136), u(144)],
            request_bytes: [u(152), u(160)],
            func: b[128],
            datatype: b[129],
            algo: b[130],
            proto: b[131],
            n_channels: b[132],
            kernel_stops: b[133],
            flags: b[134],
        })
    }
}

/// The datagram header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub pid: u32,
    pub nccl_version: u32,
    pub event_mask: u32,
    pub dropped_full: u64,
    pub dropped_unsent: u64,
    pub sent: u64,
    /// The PCI address of the CUDA device current on the thread that initialised the
    /// process's first communicator, in sysfs's spelling, NUL-padded (zero: unknown).
    pub gpu_pci: [u8; 16],
}

impl Header {
    /// The GPU's PCI address as sysfs names it (`0000:07:00.0`: lower case, 4-digit domain),
    /// whether the driver wrote a 4- or an 8-digit domain; None when unknown or malformed.
    pub fn gpu(&self) -> Option<String> {
        let end = self.gpu_pci.iter().position(|&b| b == 0).unwrap_or(self.gpu_pci.len());
        normalize_pci(std::str::from_utf8(&self.gpu_pci[..end]).ok()?)
    }
}

/// `domain:bus:device.function` in hex (domain 4 or 8 digits) → sysfs's spelling; None when
/// it is not one.
pub fn normalize_pci(s: &str) -> Option<String> {
    let mut it = s.trim().split(':');
    let (dom, bus, rest) = (it.next()?, it.next()?, it.next()?);
    let (dev, func) = rest.split_once('.')?;
    if it.next().is_some() || dom.len() > 8 || bus.len() != 2 || dev.len() != 2 || func.len() != 1 {
        return None;
    }
    let hex = |v: &str| u32::from_str_radix(v, 16).ok();
    let (d, b, v, f) = (hex(dom)?, hex(bus)?, hex(dev)?, hex(func)?);
    (d <= 0xffff && v < 32 && f < 8).then(|| format!("{d:04x}:{b:02x}:{v:02x}.{f:x}"))
}

/// Encodes one datagram (at most [`MAX_RECORDS`] records are written).
pub fn encode(h: &Header, records: &[Record], out: &mut Vec<u8>) {
    let n = records.len().min(MAX_RECORDS);
    out.clear();
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(HEADER_BYTES as u16).to_le_bytes());
    out.extend_from_slice(&(RECORD_BYTES as u16).to_le_bytes());
    out.extend_from_slice(&(n as u16).to_le_bytes());
    for v in [h.pid, h.nccl_version, h.event_mask] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for v in [h.dropped_full, h.dropped_unsent, h.sent] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&h.gpu_pci);
    for r in &records[..n] {
        r.encode(out);
    }
}

/// Why a datagram was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    Short(usize),
    Magic(u32),
    Version(u16),
    Sizes { header: usize, record: usize, records: usize, len: usize },
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Short(n) => write!(f, "datagram of {n} bytes is shorter than the {MIN_HEADER_BYTES}-byte header"),
            DecodeError::Magic(m) => write!(f, "bad magic {m:#010x} (want {MAGIC:#010x})"),
            DecodeError::Version(v) => write!(f, "unsupported version {v} (this agent reads {VERSION})"),
            DecodeError::Sizes { header, record, records, len } => {
                write!(f, "header {header} B + {records} records × {record} B do not fit the {len}-byte datagram")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// Decodes one datagram.
pub fn decode(b: &[u8]) -> Result<(Header, Vec<Record>), DecodeError> {
    if b.len() < MIN_HEADER_BYTES {
        return Err(DecodeError::Short(b.len()));
    }
    let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
    if u32_at(0) != MAGIC {
        return Err(DecodeError::Magic(u32_at(0)));
    }
    if u16_at(4) != VERSION {
        return Err(DecodeError::Version(u16_at(4)));
    }
    let (header, record, records) = (u16_at(6) as usize, u16_at(8) as usize, u16_at(10) as usize);
    if header < MIN_HEADER_BYTES || record < MIN_RECORD_BYTES || header + record * records != b.len() {
        return Err(DecodeError::Sizes { header, record, records, len: b.len() });
    }
    let mut gpu_pci = [0u8; 16];
    if header >= HEADER_BYTES {
        gpu_pci.copy_from_slice(&b[48..64]);
    }
    let h = Header {
        pid: u32_at(12),
        nccl_version: u32_at(16),
        event_mask: u32_at(20),
        dropped_full: u64_at(24),
        dropped_unsent: u64_at(32),
        sent: u64_at(40),
        gpu_pci,
    };
    let recs = (0..records).filter_map(|i| Record::decode(&b[header + i * record..header + (i + 1) * record])).collect();
    Ok((h, recs))
}

/// NCCL's function names (`ncclFuncToString`), code = index + 1 (0: unknown).
pub const FUNCS: [&str; 14] = [
    "AllReduce",
    "AllGather",
    "ReduceScatter",
    "Broadcast",
    "Reduce",
    "AlltoAll",
    "Gather",
    "Scatter",
    "SendRecv",
    "Send",
    "Recv",
    "PutSignal",
    "Signal",
    "WaitSignal",
];
/// The agent's op names for [`FUNCS`] (the uprobe source's `Op` names where one exists).
pub const FUNC_OPS: [&str; 14] = [
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "gather",
    "scatter",
    "send_recv",
    "send",
    "recv",
    "put_signal",
    "signal",
    "wait_signal",
];
/// `ncclDatatypeToString` names and element sizes, code = index + 1.
pub const DATATYPES: [(&str, u64); 12] = [
    ("ncclInt8", 1),
    ("ncclUint8", 1),
    ("ncclInt32", 4),
    ("ncclUint32", 4),
    ("ncclInt64", 8),
    ("ncclUint64", 8),
    ("ncclFloat16", 2),
    ("ncclFloat32", 4),
    ("ncclFloat64", 8),
    ("ncclBfloat16", 2),
    ("ncclFloat8e4m3", 1),
    ("ncclFloat8e5m2", 1),
];
/// `ncclAlgoToString` names, code = index + 1.
pub const ALGOS: [&str; 7] = ["TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT"];
/// `ncclProtoToString` names, code = index + 1.
pub const PROTOS: [&str; 3] = ["LL", "LL128", "SIMPLE"];

/// The code of `name` in `table` (index + 1), 0 when absent.
pub fn code_of(table: &[&str], name: &[u8]) -> u8 {
    table.iter().position(|t| t.as_bytes() == name).map_or(0, |i| (i + 1) as u8)
}

/// The name for a code, "unknown" for 0 or out of range.
pub fn name_of<'a>(table: &[&'a str], code: u8) -> &'a str {
    (code as usize).checked_sub(1).and_then(|i| table.get(i)).copied().unwrap_or("unknown")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(i: u64) -> Record {
        Record {
            comm_hash: 0xdead_beef_0000_0000 | i,
            seq: i,
            rank: 2,
            nranks: 4,
            bytes: 4 << 20,
            count: 1 << 20,
            enqueue_ns: 1_700_000_000_000_000_000 + i,
            gpu_start_ptimer: 5_000_000_000 + i,
            gpu_end_ptimer: 5_001_000_000 + i,
            offset_ns: -12_345,
            offset_error_ns: 3_000,
            proxy_wait_ns: [1, 2, 3, 4, 5, 6 + i],
            requests: [7 + i, 8],
            request_bytes: [(7 + i) << 16, 8 << 16],
            func: 1,
            datatype: 8,
            algo: 2,
            proto: 3,
            n_channels: 2,
            kernel_stops: 2,
            flags: FLAG_COMPLETE,
        }
    }

    #[test]
    fn datagram_round_trips() {
        let mut gpu_pci = [0u8; 16];
        gpu_pci[..16].copy_from_slice(b"00000000:1A:00.0");
        let h = Header { pid: 4242, nccl_version: 22907, event_mask: 0x52, dropped_full: 7, dropped_unsent: 9, sent: 100, gpu_pci };
        let recs: Vec<Record> = (0..5).map(sample).collect();
        let mut buf = Vec::new();
        encode(&h, &recs, &mut buf);
        assert_eq!(buf.len(), HEADER_BYTES + 5 * RECORD_BYTES);
        let (h2, r2) = decode(&buf).expect("decode");
        assert_eq!(h2, h);
        assert_eq!(h2.gpu().as_deref(), Some("0000:1a:00.0"), "NVML's 8-digit domain, sysfs's spelling");
        assert_eq!(r2, recs);
        assert_eq!(r2[3].gpu_start_host_ns(), Some(5_000_000_003 - 12_345));
    }

    #[test]
    fn the_first_plugins_shorter_records_still_decode() {
        let h = Header { pid: 7, ..Default::default() };
        let mut buf = Vec::new();
        encode(&h, &[sample(1), sample(2)], &mut buf);
        // The same datagram as a 136-byte-record plugin sent it.
        let mut old = buf[..HEADER_BYTES].to_vec();
        old[8..10].copy_from_slice(&(MIN_RECORD_BYTES as u16).to_le_bytes());
        for k in 0..2 {
            let at = HEADER_BYTES + k * RECORD_BYTES;
            old.extend_from_slice(&buf[at..at + MIN_RECORD_BYTES]);
        }
        let (_, recs) = decode(&old).expect("decode");
        let want = Record { requests: [0; 2], request_bytes: [0; 2], ..sample(2) };
        assert_eq!(recs[1], want);
        assert_eq!(decode(&old[..old.len() - 1]).map(|_| ()), Err(DecodeError::Sizes { header: 64, record: 136, records: 2, len: old.len() - 1 }));
    }

    #[test]
    fn the_first_plugins_shorter_header_decodes_without_a_gpu() {
        let mut gpu_pci = [0u8; 16];
        gpu_pci[..12].copy_from_slice(b"0000:07:00.0");
        let h = Header { pid: 9, sent: 3, gpu_pci, ..Default::default() };
        let mut buf = Vec::new();
        encode(&h, &[sample(1)], &mut buf);
        let mut old = buf[..MIN_HEADER_BYTES].to_vec();
        old[6..8].copy_from_slice(&(MIN_HEADER_BYTES as u16).to_le_bytes());
        old.extend_from_slice(&buf[HEADER_BYTES..]);
        let (h2, recs) = decode(&old).expect("decode");
        assert_eq!((h2.pid, h2.sent, h2.gpu()), (9, 3, None));
        assert_eq!(recs, vec![sample(1)]);
        assert_eq!(decode(&buf).map(|(h, _)| h.gpu()), Ok(Some("0000:07:00.0".into())));
    }

    #[test]
    fn pci_addresses_take_sysfs_spelling_or_none() {
        assert_eq!(normalize_pci("0000:B3:00.0").as_deref(), Some("0000:b3:00.0"));
        assert_eq!(normalize_pci("00000001:07:1f.7").as_deref(), Some("0001:07:1f.7"));
        for bad in ["", "07:00.0", "0000:07:00", "0000:7:00.0", "0000:07:20.0", "0000:07:00.8", "zz00:07:00.0", "0000:07:00.0:1", "100000000:07:00.0"] {
            assert_eq!(normalize_pci(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn bad_datagrams_are_refused() {
        let mut buf = Vec::new();
        encode(&Header::default(), &[sample(0)], &mut buf);
        assert_eq!(decode(&buf[..10]), Err(DecodeError::Short(10)));
        let mut b = buf.clone();
        b[0] = 0;
        assert!(matches!(decode(&b), Err(DecodeError::Magic(_))));
        let mut b = buf.clone();
        b[4] = 9;
        assert_eq!(decode(&b), Err(DecodeError::Version(9)));
        assert!(matches!(decode(&buf[..buf.len() - 1]), Err(DecodeError::Sizes { .. })));
    }

    #[test]
    fn names_and_codes() {
        assert_eq!(code_of(&FUNCS, b"AllReduce"), 1);
        assert_eq!(name_of(&FUNC_OPS, 1), "all_reduce");
        assert_eq!(code_of(&FUNCS, b"Nope"), 0);
        assert_eq!(name_of(&FUNCS, 0), "unknown");
        assert_eq!(name_of(&FUNCS, 200), "unknown");
    }
}
