//! One mlx5 RDMA port as the hardware and kernel present it: raw register values with the
//! hardware's own limit behaviour, plus the faults a test wants to see.
//!
//! The widths are written down here independently of the agent (docs/platform-facts.md §1): the
//! writer is a fake of the kernel's files, so it must not borrow the agent's code.

use std::{collections::BTreeMap, time::Duration};

/// Which PMA PortCounters table the port's `counters/` directory shows (sysfs.c
/// `get_counter_table()`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PmaTable {
    /// PortCountersExt (`IB_PMA_CLASS_CAP_EXT_WIDTH`): 64-bit data/packets plus
    /// unicast/multicast files. What mlx5 RoCE ports show.
    Ext,
    /// The 32-bit fallback: data/packets saturate at 2^32 − 1, no unicast/multicast.
    Bits32,
}

/// A file whose content is not what the counter says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Literal content instead of the value (garbage, empty, `-1`…).
    Content(String),
    /// `N/A (no PMA)` (sysfs.c `show_pma_counter` when the MAD query fails).
    NotAvailable,
    /// The value without its trailing newline.
    NoNewline,
    /// `read()` fails. Real restricted functions answer EIO; here the file is a dangling
    /// symlink (ENOENT on read, still listed by readdir), which git can also store.
    Unreadable,
}

/// The PMA counters of the Ext table, in sysfs.c order, with their widths in the 32-bit
/// table (`PORT_PMA_ATTR`).
pub const PMA_COUNTERS: [(&str, u8); 21] = [
    ("symbol_error", 16),
    ("link_error_recovery", 8),
    ("link_downed", 8),
    ("port_rcv_errors", 16),
    ("port_rcv_remote_physical_errors", 16),
    ("port_rcv_switch_relay_errors", 16),
    ("port_xmit_discards", 16),
    ("port_xmit_constraint_errors", 8),
    ("port_rcv_constraint_errors", 8),
    ("local_link_integrity_errors", 4),
    ("excessive_buffer_overrun_errors", 4),
    ("VL15_dropped", 16),
    ("port_xmit_wait", 32),
    ("port_xmit_data", 32),
    ("port_rcv_data", 32),
    ("port_xmit_packets", 32),
    ("port_rcv_packets", 32),
    ("unicast_xmit_packets", 64),
    ("unicast_rcv_packets", 64),
    ("multicast_xmit_packets", 64),
    ("multicast_rcv_packets", 64),
];

/// mlx5 Q counters (counters.c reads them as 32-bit: they roll over at 2^32).
pub const MLX5_Q_COUNTERS: [&str; 26] = [
    // basic
    "rx_write_requests",
    "rx_read_requests",
    "rx_atomic_requests",
    "rx_dct_connect",
    "out_of_buffer",
    // out_of_seq
    "out_of_sequence",
    // retransmission
    "duplicate_request",
    "rnr_nak_retry_err",
    "packet_seq_err",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    // enhanced_error_q_counters
    "resp_local_length_error",
    "resp_cqe_error",
    "req_cqe_error",
    "req_remote_invalid_request",
    "req_remote_access_errors",
    "resp_remote_access_errors",
    "resp_cqe_flush_error",
    "req_cqe_flush_error",
    "req_transport_retries_exceeded",
    "req_rnr_retries_exceeded",
    // roce_accl
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
];

/// mlx5 cong (`cc_query_allowed`) and PPCNT counters: 64-bit.
pub const MLX5_64BIT_COUNTERS: [&str; 5] = ["rp_cnp_ignored", "rp_cnp_handled", "np_ecn_marked_roce_packets", "np_cnp_sent", "rx_icrc_encapsulated"];

/// Payload bytes per RoCE packet (4096-byte MTU), to derive packet counts from bytes.
pub const MTU_BYTES: u64 = 4096;

/// One RDMA port (port 1 of an mlx5 function) and its netdev.
#[derive(Clone, Debug)]
pub struct Nic {
    /// Position on the host (0-based): NIC i sits under PCIe switch i % 8.
    pub index: usize,
    /// `mlx5_<index>`.
    pub dev: String,
    /// Interface name (systemd predictable: `enp<bus>s0np0`).
    pub netdev: String,
    /// PCI address of the function.
    pub pci: String,
    pub numa_node: i32,
    pub table: PmaTable,
    /// `hw_counters/lifespan` in ms (mlx5 default 10).
    pub lifespan_ms: u64,
    /// Link speed in Gb/s and its IB name (`400`, `NDR`).
    pub rate_gbps: u32,
    pub rate_name: &'static str,
    pub(crate) present: bool,
    pub(crate) link_up: bool,
    pub(crate) pma: BTreeMap<&'static str, u64>,
    pub(crate) hw: BTreeMap<String, u64>,
    /// Faults by path relative to the port directory (`counters/port_xmit_wait`) or to the
    /// IB device directory prefixed with `../../` (`../../node_guid`).
    pub(crate) faults: BTreeMap<String, Fault>,
    /// Bytes not yet counted as a whole 4-byte word, per direction.
    tx_rem: u64,
    rx_rem: u64,
    dt: Duration,
}

fn max_for(bits: u8) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

impl Nic {
    pub(crate) fn new(index: usize, pci: String, numa_node: i32, bus: u8) -> Nic {
        let mut pma = BTreeMap::new();
        for (name, _) in PMA_COUNTERS {
            pma.insert(name, 0);
        }
        let mut hw = BTreeMap::new();
        for name in MLX5_Q_COUNTERS.iter().chain(MLX5_64BIT_COUNTERS.iter()) {
            hw.insert(name.to_string(), 0);
        }
        Nic {
            index,
            dev: format!("mlx5_{index}"),
            netdev: format!("enp{bus}s0np0"),
            pci,
            numa_node,
            table: PmaTable::Ext,
            lifespan_ms: 10,
            rate_gbps: 400,
            rate_name: "4X NDR",
            present: true,
            link_up: true,
            pma,
            hw,
            faults: BTreeMap::new(),
            tx_rem: 0,
            rx_rem: 0,
            dt: Duration::ZERO,
        }
    }

    /// The PMA counter files this port shows, with their width in its table.
    pub fn pma_files(&self) -> impl Iterator<Item = (&'static str, u8)> + '_ {
        PMA_COUNTERS.iter().copied().filter_map(move |(n, bits)| match self.table {
            PmaTable::Ext if bits == 32 && is_data_or_packets(n) => Some((n, 64)),
            PmaTable::Ext => Some((n, bits)),
            PmaTable::Bits32 if bits == 64 => None,
            PmaTable::Bits32 => Some((n, bits)),
        })
    }

    fn pma_bits(&self, name: &str) -> Option<u8> {
        self.pma_files().find(|(n, _)| *n == name).map(|(_, b)| b)
    }

    /// Raw value of a `counters/` file.
    pub fn pma_value(&self, name: &str) -> u64 {
        self.pma.get(name).copied().unwrap_or(0)
    }

    /// Raw value of a `hw_counters/` file.
    pub fn hw_value(&self, name: &str) -> u64 {
        self.hw.get(name).copied().unwrap_or(0)
    }

    pub fn is_present(&self) -> bool {
        self.present
    }

    /// Length of the current step (set by `Scenario::step`).
    pub fn dt(&self) -> Duration {
        self.dt
    }

    pub(crate) fn set_dt(&mut self, dt: Duration) {
        self.dt = dt;
    }

    /// Adds to a PMA counter as the hardware does: saturating at the field's width.
    pub fn pma(&mut self, name: &str, n: u64) -> &mut Self {
        if let (Some(bits), Some(v)) = (self.pma_bits(name), self.pma.get_mut(name)) {
            *v = v.saturating_add(n).min(max_for(bits));
        }
        self
    }

    /// Sets a PMA counter's raw value (clamped to its width), e.g. just below the limit.
    pub fn set_pma(&mut self, name: &str, v: u64) -> &mut Self {
        if let (Some(bits), Some(slot)) = (self.pma_bits(name), self.pma.get_mut(name)) {
            *slot = v.min(max_for(bits));
        }
        self
    }

    /// Adds to a hw counter: Q counters roll over at 2^32, the others are 64-bit. A name
    /// that is not an mlx5 counter is created (64-bit), to model other firmware.
    pub fn hw(&mut self, name: &str, n: u64) -> &mut Self {
        let q = MLX5_Q_COUNTERS.contains(&name);
        let v = self.hw.entry(name.to_string()).or_insert(0);
        *v = if q { (*v + n) & max_for(32) } else { v.wrapping_add(n) };
        self
    }

    /// Sets a hw counter's raw value (Q counters are masked to 32 bits).
    pub fn set_hw(&mut self, name: &str, v: u64) -> &mut Self {
        let q = MLX5_Q_COUNTERS.contains(&name);
        self.hw.insert(name.to_string(), if q { v & max_for(32) } else { v });
        self
    }

    /// Sends `bytes` of RDMA payload: data in 4-byte words, packets of [`MTU_BYTES`].
    pub fn tx_bytes(&mut self, bytes: u64) -> &mut Self {
        let total = self.tx_rem + bytes;
        self.tx_rem = total % 4;
        let pkts = bytes.div_ceil(MTU_BYTES);
        self.pma("port_xmit_data", total / 4).pma("port_xmit_packets", pkts).pma("unicast_xmit_packets", pkts)
    }

    /// Receives `bytes` of RDMA payload (data, packets, and one RDMA WRITE request per MiB).
    pub fn rx_bytes(&mut self, bytes: u64) -> &mut Self {
        let total = self.rx_rem + bytes;
        self.rx_rem = total % 4;
        let pkts = bytes.div_ceil(MTU_BYTES);
        self.pma("port_rcv_data", total / 4).pma("port_rcv_packets", pkts).pma("unicast_rcv_packets", pkts).hw("rx_write_requests", bytes >> 20)
    }

    /// Transmits at `bytes_per_second` for the current step.
    pub fn tx_rate(&mut self, bytes_per_second: f64) -> &mut Self {
        let b = (bytes_per_second.max(0.0) * self.dt.as_secs_f64()) as u64;
        self.tx_bytes(b)
    }

    /// Receives at `bytes_per_second` for the current step.
    pub fn rx_rate(&mut self, bytes_per_second: f64) -> &mut Self {
        let b = (bytes_per_second.max(0.0) * self.dt.as_secs_f64()) as u64;
        self.rx_bytes(b)
    }

    /// Line rate in bytes/s (Gb/s × 125000000, as procfs converts `rate`).
    pub fn line_rate(&self) -> f64 {
        f64::from(self.rate_gbps) * 125_000_000.0
    }

    /// Ticks with data pending but not sent (`port_xmit_wait`): what PFC pauses received
    /// from the switch look like from the RDMA side.
    pub fn xmit_wait(&mut self, ticks: u64) -> &mut Self {
        self.pma("port_xmit_wait", ticks)
    }

    /// A PFC-like pause burst seen by RDMA counters: `ticks` of transmit wait.
    pub fn pfc_pause(&mut self, ticks: u64) -> &mut Self {
        self.xmit_wait(ticks)
    }

    /// `n` CE-marked RoCEv2 packets received; the notification point answers each with a CNP.
    pub fn ecn(&mut self, n: u64) -> &mut Self {
        self.hw("np_ecn_marked_roce_packets", n).hw("np_cnp_sent", n)
    }

    /// `n` CNPs received and acted on by the reaction point (rate throttling).
    pub fn cnp_handled(&mut self, n: u64) -> &mut Self {
        self.hw("rp_cnp_handled", n)
    }

    /// `n` CNPs received and ignored.
    pub fn cnp_ignored(&mut self, n: u64) -> &mut Self {
        self.hw("rp_cnp_ignored", n)
    }

    /// `n` retransmission events of one mlx5 kind (`local_ack_timeout_err`,
    /// `roce_adp_retrans`, `packet_seq_err`, `rnr_nak_retry_err`…).
    pub fn retransmit(&mut self, reason: &str, n: u64) -> &mut Self {
        self.hw(reason, n)
    }

    pub fn out_of_sequence(&mut self, n: u64) -> &mut Self {
        self.hw("out_of_sequence", n)
    }

    pub fn out_of_buffer(&mut self, n: u64) -> &mut Self {
        self.hw("out_of_buffer", n)
    }

    /// Every counter back to 0 (driver reload; a PMA MAD reset clears `counters/` too).
    pub fn reset(&mut self) -> &mut Self {
        self.pma.values_mut().for_each(|v| *v = 0);
        self.hw.values_mut().for_each(|v| *v = 0);
        self
    }

    /// Replaces a file's content (path relative to the port directory).
    pub fn garbage(&mut self, rel: &str, content: &str) -> &mut Self {
        self.fault(rel, Fault::Content(content.to_string()))
    }

    /// The file reads `N/A (no PMA)`.
    pub fn not_available(&mut self, rel: &str) -> &mut Self {
        self.fault(rel, Fault::NotAvailable)
    }

    /// The file's value has no trailing newline.
    pub fn no_newline(&mut self, rel: &str) -> &mut Self {
        self.fault(rel, Fault::NoNewline)
    }

    /// The file cannot be read.
    pub fn unreadable(&mut self, rel: &str) -> &mut Self {
        self.fault(rel, Fault::Unreadable)
    }

    pub fn fault(&mut self, rel: &str, f: Fault) -> &mut Self {
        self.faults.insert(rel.to_string(), f);
        self
    }

    pub fn clear_fault(&mut self, rel: &str) -> &mut Self {
        self.faults.remove(rel);
        self
    }

    /// A restricted function (ConnectX-7 on DGX/GB200): every `counters/` and `hw_counters/`
    /// read fails; state, rate and the node files stay readable.
    pub fn restrict(&mut self) -> &mut Self {
        let names: Vec<String> = self
            .pma_files()
            .map(|(n, _)| format!("counters/{n}"))
            .chain(self.hw.keys().map(|n| format!("hw_counters/{n}")))
            .chain(std::iter::once("hw_counters/lifespan".to_string()))
            .collect();
        for n in names {
            self.faults.insert(n, Fault::Unreadable);
        }
        self
    }

    /// The RDMA device disappears (mlx5_ib unbound): `class/infiniband/<dev>` and the
    /// device's directory go; the netdev stays.
    pub fn vanish(&mut self) -> &mut Self {
        self.present = false;
        self
    }

    /// The RDMA device comes back (with whatever counters it has; call `reset()` for a
    /// driver reload).
    pub fn reappear(&mut self) -> &mut Self {
        self.present = true;
        self
    }

    pub fn link_down(&mut self) -> &mut Self {
        self.link_up = false;
        self
    }

    pub fn link_up(&mut self) -> &mut Self {
        self.link_up = true;
        self
    }

    pub fn is_link_up(&self) -> bool {
        self.link_up
    }
}

fn is_data_or_packets(n: &str) -> bool {
    matches!(n, "port_xmit_data" | "port_rcv_data" | "port_xmit_packets" | "port_rcv_packets")
}
