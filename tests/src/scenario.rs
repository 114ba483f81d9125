//! The scenario writer: writes sysfs trees shaped like a host with mlx5 ConnectX-7 NICs and
//! NVIDIA GPUs (docs/platform-facts.md §1) and evolves them over time. It is a fake of the
//! kernel's files, not of our code: it knows nothing about the agent.
//!
//! ```no_run
//! use std::time::Duration;
//! use stepwise_tests::scenario::Scenario;
//! # fn main() -> std::io::Result<()> {
//! let mut s = Scenario::new("/tmp/host/sys").host_dgx(8);
//! s.write()?;
//! s.step(Duration::from_millis(100), |nic| {
//!     let r = nic.line_rate();
//!     nic.tx_rate(0.6 * r).rx_rate(0.6 * r);
//!     if nic.index == 3 {
//!         nic.pfc_pause(50_000).ecn(200).cnp_handled(180);
//!     }
//! })?;
//! # Ok(()) }
//! ```
//!
//! Every file is written atomically (temp file + rename), and only files whose content
//! changed are rewritten, so a reader sees either the old or the new value of each file.
//! Counters behave like the hardware: PMA counters saturate at their field width, mlx5 Q
//! counters roll over at 2^32, cong/PPCNT counters are 64-bit.

mod fsio;
mod layout;
mod named;
mod nic;

use std::{
    io,
    path::{Path, PathBuf},
    time::Duration,
};

pub use fsio::{snapshot, Entry, MARKER};
pub use layout::{Layout, PciFn};
pub use named::{fixture, run_cli, write_fixture, FIXTURES, SCENARIOS, WAIT_TICKS_PER_SECOND};
pub use nic::{Fault, Nic, PmaTable, MLX5_64BIT_COUNTERS, MLX5_Q_COUNTERS, MTU_BYTES, PMA_COUNTERS};

/// Where to put a fixture tree that a writer keeps changing: `/dev/shm` when it exists
/// (memory, like sysfs: a tick of 58 changed files costs ~5 ms there against ~29 ms on this
/// machine's ext4 `/tmp`, measured under load), else the temp directory.
pub fn memory_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() && std::fs::metadata(shm).is_ok_and(|m| !m.permissions().readonly()) {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// A host's sysfs tree and its evolution.
#[derive(Debug)]
pub struct Scenario {
    root: PathBuf,
    layout: Layout,
    nics: Vec<Nic>,
    elapsed: Duration,
    steps: u64,
    writer: fsio::Writer,
}

impl Scenario {
    /// A scenario writing under `root` (the directory to pass as `--sysfs-root`). Nothing is
    /// written until [`Scenario::write`] or [`Scenario::step`].
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        Scenario {
            writer: fsio::Writer::new(root.clone()),
            root,
            layout: Layout { hostname: "dgx01".into(), ..Layout::default() },
            nics: Vec::new(),
            elapsed: Duration::ZERO,
            steps: 0,
        }
    }

    /// A DGX-like host: 8 GPUs on 8 PCIe switches over 2 NUMA nodes, and `n_nics` RoCE
    /// ConnectX-7 functions (`mlx5_0…`, 400 Gb/s NDR, Ext PMA table) under the same switches.
    pub fn host_dgx(mut self, n_nics: usize) -> Self {
        let (layout, nics) = layout::dgx(n_nics, &self.layout.hostname);
        self.layout = layout;
        self.nics = nics;
        self
    }

    /// Sets the host name used in `node_desc` (call before `host_dgx`).
    pub fn hostname(mut self, name: &str) -> Self {
        self.layout.hostname = name.to_string();
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn nics(&self) -> &[Nic] {
        &self.nics
    }

    /// A NIC by index (panics if out of range: a scenario bug).
    pub fn nic_mut(&mut self, i: usize) -> &mut Nic {
        let n = self.nics.len();
        self.nics.get_mut(i).unwrap_or_else(|| panic!("scenario has {n} NICs, no NIC {i}"))
    }

    /// Applies `f` to every NIC (present or not).
    pub fn each_nic(&mut self, mut f: impl FnMut(&mut Nic)) -> &mut Self {
        self.nics.iter_mut().for_each(&mut f);
        self
    }

    /// Simulated time elapsed over all steps.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Writes the current state (the whole tree the first time, then only what changed).
    /// Returns how many files or links were written or removed.
    pub fn write(&mut self) -> io::Result<usize> {
        let desired = layout::render(&self.layout, &self.nics);
        self.writer.apply(&desired)
    }

    /// Advances time by `dt`: `f` runs on every present NIC (use [`Nic::dt`] / `tx_rate` for
    /// rates), then the tree is written.
    pub fn step(&mut self, dt: Duration, mut f: impl FnMut(&mut Nic)) -> io::Result<usize> {
        for nic in self.nics.iter_mut() {
            nic.set_dt(dt);
            if nic.is_present() {
                f(nic);
            }
        }
        self.elapsed += dt;
        self.steps += 1;
        self.write()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dgx8_tree_has_the_mlx5_shape() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("sys");
        let mut s = Scenario::new(&root).host_dgx(8);
        s.write().expect("write");
        let ib = root.join("class/infiniband/mlx5_0");
        let port = ib.join("ports/1");
        let rd = |p: &Path| std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert_eq!(rd(&port.join("state")), "4: ACTIVE\n");
        assert_eq!(rd(&port.join("phys_state")), "5: LinkUp\n");
        assert_eq!(rd(&port.join("rate")), "400 Gb/sec (4X NDR)\n");
        assert_eq!(rd(&port.join("link_layer")), "Ethernet\n");
        assert_eq!(rd(&port.join("gid_attrs/types/1")), "RoCE v2\n");
        assert_eq!(rd(&port.join("gid_attrs/ndevs/0")), "enp19s0np0\n");
        assert_eq!(rd(&port.join("hw_counters/lifespan")), "10\n");
        assert!(port.join("counters/unicast_xmit_packets").exists());
        for n in MLX5_Q_COUNTERS.iter().chain(MLX5_64BIT_COUNTERS.iter()) {
            assert!(port.join("hw_counters").join(n).exists(), "{n}");
        }
        let pci = std::fs::canonicalize(ib.join("device")).expect("device link");
        assert!(pci.ends_with("devices/pci0000:00/0000:00:01.0/0000:10:00.0/0000:11:08.0/0000:13:00.0"), "{}", pci.display());
        assert_eq!(rd(&pci.join("vendor")), "0x15b3\n");
        assert_eq!(rd(&pci.join("numa_node")), "0\n");
        assert!(pci.join("net/enp19s0np0/speed").exists());
        let net = std::fs::canonicalize(root.join("class/net/enp19s0np0/device")).expect("net device link");
        assert_eq!(net, pci);
        let gpu = std::fs::canonicalize(root.join("bus/pci/devices/0000:12:00.0")).expect("gpu link");
        assert_eq!(rd(&gpu.join("class")), "0x030200\n");
        assert_eq!(rd(&gpu.join("vendor")), "0x10de\n");
        let last = std::fs::canonicalize(root.join("class/infiniband/mlx5_7/device")).expect("device link");
        assert_eq!(rd(&last.join("numa_node")), "1\n");
    }

    #[test]
    fn counters_saturate_wrap_and_reset_like_the_hardware() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = Scenario::new(dir.path()).host_dgx(2);
        let max32 = u64::from(u32::MAX);
        s.nic_mut(0).set_hw("out_of_buffer", max32 - 1).set_pma("port_xmit_wait", max32 - 1);
        s.nic_mut(1).table = PmaTable::Bits32;
        s.nic_mut(1).set_pma("port_xmit_data", max32 - 2);
        s.step(Duration::from_millis(100), |n| {
            n.out_of_buffer(5).xmit_wait(5).tx_bytes(400);
        })
        .expect("step");
        assert_eq!(s.nics()[0].hw_value("out_of_buffer"), 3, "Q counter wraps");
        assert_eq!(s.nics()[0].pma_value("port_xmit_wait"), max32, "PMA saturates");
        assert_eq!(s.nics()[0].pma_value("port_xmit_data"), 100, "Ext data is 64-bit words");
        assert_eq!(s.nics()[1].pma_value("port_xmit_data"), max32, "32-bit table saturates");
        let p1 = dir.path().join("class/infiniband/mlx5_1/ports/1/counters");
        assert!(!p1.join("unicast_xmit_packets").exists(), "no unicast files in the 32-bit table");
        s.nic_mut(1).reset();
        s.write().expect("write");
        assert_eq!(std::fs::read_to_string(p1.join("port_xmit_data")).expect("read"), "0\n");
    }

    #[test]
    fn vanish_and_reappear_remove_and_restore_the_device() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = Scenario::new(dir.path()).host_dgx(2);
        s.write().expect("write");
        s.nic_mut(1).vanish();
        s.write().expect("write");
        let class = dir.path().join("class/infiniband");
        assert!(!class.join("mlx5_1").exists());
        assert!(dir.path().join("class/net/enp51s0np0").exists(), "the netdev stays");
        let stale = dir.path().join("devices/pci0000:00/0000:00:02.0/0000:30:00.0/0000:31:08.0/0000:33:00.0/infiniband");
        assert!(!stale.exists(), "the device directory is gone");
        s.nic_mut(1).reappear().reset();
        s.write().expect("write");
        assert!(class.join("mlx5_1/ports/1/counters/port_xmit_data").exists());
    }

    #[test]
    fn faults_render_as_the_kernel_would_show_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = Scenario::new(dir.path()).host_dgx(1);
        s.nic_mut(0)
            .not_available("counters/port_xmit_wait")
            .no_newline("counters/port_rcv_data")
            .garbage("hw_counters/np_cnp_sent", "")
            .unreadable("hw_counters/out_of_buffer")
            .no_newline("../../node_guid");
        s.write().expect("write");
        let ib = dir.path().join("class/infiniband/mlx5_0");
        let p = ib.join("ports/1");
        let rd = |p: PathBuf| std::fs::read_to_string(p);
        assert_eq!(rd(p.join("counters/port_xmit_wait")).expect("read"), "N/A (no PMA)\n");
        assert_eq!(rd(p.join("counters/port_rcv_data")).expect("read"), "0");
        assert_eq!(rd(p.join("hw_counters/np_cnp_sent")).expect("read"), "");
        assert!(rd(p.join("hw_counters/out_of_buffer")).is_err());
        assert!(!rd(ib.join("node_guid")).expect("read").ends_with('\n'));
        s.nic_mut(0).clear_fault("hw_counters/out_of_buffer");
        s.write().expect("write");
        assert_eq!(rd(p.join("hw_counters/out_of_buffer")).expect("read"), "0\n");
    }
}
