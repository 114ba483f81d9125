//! Host topology: RDMA device ↔ netdev ↔ PCI address ↔ NUMA node ↔ nearest GPU ↔ rail, and
//! link rates. Everything is read under the configured sysfs root.
//!
//! "Nearest GPU" is the NVIDIA function sharing the deepest PCIe bridge with the NIC (the
//! same PCIe switch), falling back to the same NUMA node. Rails are numbered by the config
//! override first, else by NIC order (PCI address order), which is how NCCL pairs NIC i of
//! every server on leaf i.

pub mod info;
mod pci;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde::Serialize;

pub use pci::{parse_ib_rate, PciDevice};

/// One NIC port (an RDMA port, or a plain netdev without RDMA).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Nic {
    /// RDMA device (`mlx5_0`), if any.
    pub ib_device: Option<String>,
    /// RDMA port number (1-based), if any.
    pub port: Option<u32>,
    /// Network interface name (`ens1f0np0`), if any.
    pub netdev: Option<String>,
    /// PCI address (`0000:0c:00.0`), if the device sits on PCI.
    pub pci: Option<String>,
    pub numa_node: Option<i32>,
    /// Link layer (`Ethernet` for RoCE, `InfiniBand`).
    pub link_layer: Option<String>,
    /// Port state (`ACTIVE`, `DOWN`, …).
    pub state: Option<String>,
    /// Link rate in bytes per second (from `rate`, else netdev `speed`).
    pub rate_bytes_per_second: Option<f64>,
    /// Nearest GPU's PCI address.
    pub gpu: Option<String>,
    /// Rail index.
    pub rail: u32,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Gpu {
    pub pci: String,
    pub numa_node: Option<i32>,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Topology {
    pub nics: Vec<Nic>,
    pub gpus: Vec<Gpu>,
}

impl Topology {
    /// The NIC entry for a netdev or RDMA device name.
    pub fn nic(&self, name: &str) -> Option<&Nic> {
        self.nics.iter().find(|n| n.netdev.as_deref() == Some(name) || n.ib_device.as_deref() == Some(name))
    }
}

fn read_trim(p: &Path) -> Option<String> {
    crate::sources::fsread::read_to_string(p).ok().map(|s| s.trim().to_string())
}

/// Discovers the topology under `sysfs_root`. Missing pieces are `None`, never errors:
/// a host without RDMA still has netdevs, and a container may hide PCI.
pub fn discover(sysfs_root: &Path, rail_overrides: &BTreeMap<String, u32>) -> Topology {
    let gpus: Vec<PciDevice> = pci::nvidia_gpus(sysfs_root);
    let mut nics = Vec::new();
    let mut netdevs_with_rdma = Vec::new();

    let ib_class = sysfs_root.join("class/infiniband");
    for dev in sorted_dir(&ib_class) {
        let name = file_name(&dev);
        let pcidev = PciDevice::from_class_device(&dev);
        let net_names: Vec<String> = sorted_dir(&dev.join("device/net")).iter().map(|p| file_name(p)).collect();
        for port_dir in sorted_dir(&dev.join("ports")) {
            let port: Option<u32> = file_name(&port_dir).parse().ok();
            // The port's netdev: gid_attrs/ndevs/0 (RoCE), else the PCI function's net/ entry.
            let netdev = read_trim(&port_dir.join("gid_attrs/ndevs/0")).filter(|s| !s.is_empty()).or_else(|| net_names.first().cloned());
            if let Some(n) = &netdev {
                netdevs_with_rdma.push(n.clone());
            }
            let rate = read_trim(&port_dir.join("rate")).and_then(|r| parse_ib_rate(&r));
            nics.push(Nic {
                ib_device: Some(name.clone()),
                port,
                netdev,
                pci: pcidev.as_ref().map(|d| d.address.clone()),
                numa_node: pcidev.as_ref().and_then(|d| d.numa_node),
                link_layer: read_trim(&port_dir.join("link_layer")).map(|s| s.lines().next().unwrap_or("").to_string()),
                state: read_trim(&port_dir.join("state")).map(|s| s.split(':').nth(1).unwrap_or(&s).trim().to_string()),
                rate_bytes_per_second: rate,
                gpu: pcidev.as_ref().and_then(|d| d.nearest(&gpus)).map(|g| g.address.clone()),
                rail: 0,
            });
        }
    }

    // Plain netdevs backed by a device (veth in tests, Ethernet NICs without RDMA).
    for dev in sorted_dir(&sysfs_root.join("class/net")) {
        let name = file_name(&dev);
        if name == "lo" || netdevs_with_rdma.contains(&name) {
            continue;
        }
        let pcidev = PciDevice::from_class_device(&dev);
        // Virtual devices count as NICs only when paired (veth: iflink is the peer's ifindex);
        // bridges, ifb, tunnels and the like are not NICs.
        let paired = match (read_trim(&dev.join("iflink")), read_trim(&dev.join("ifindex"))) {
            (Some(a), Some(b)) => a != b,
            _ => false,
        };
        if pcidev.is_none() && !paired {
            continue;
        }
        let speed_mbps: Option<f64> = read_trim(&dev.join("speed")).and_then(|s| s.parse::<i64>().ok()).filter(|v| *v > 0).map(|v| v as f64);
        nics.push(Nic {
            ib_device: None,
            port: None,
            netdev: Some(name.clone()),
            pci: pcidev.as_ref().map(|d| d.address.clone()),
            numa_node: pcidev.as_ref().and_then(|d| d.numa_node),
            link_layer: Some("Ethernet".into()),
            state: read_trim(&dev.join("operstate")).map(|s| s.to_uppercase()),
            rate_bytes_per_second: speed_mbps.map(|m| m * 1e6 / 8.0),
            gpu: pcidev.as_ref().and_then(|d| d.nearest(&gpus)).map(|g| g.address.clone()),
            rail: 0,
        });
    }

    // Rails: overrides first, the rest by PCI address order (then name).
    nics.sort_by_key(|n| (n.pci.clone(), n.ib_device.clone(), n.netdev.clone()));
    let mut next_rail = 0u32;
    let taken: Vec<u32> = rail_overrides.values().copied().collect();
    for nic in nics.iter_mut() {
        let over = [nic.ib_device.as_deref(), nic.netdev.as_deref()].into_iter().flatten().find_map(|n| rail_overrides.get(n).copied());
        nic.rail = match over {
            Some(r) => r,
            None => {
                while taken.contains(&next_rail) {
                    next_rail += 1;
                }
                next_rail += 1;
                next_rail - 1
            }
        };
    }
    Topology { nics, gpus: gpus.into_iter().map(|g| Gpu { pci: g.address, numa_node: g.numa_node }).collect() }
}

fn sorted_dir(p: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(p).map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect()).unwrap_or_default();
    v.sort();
    v
}

fn file_name(p: &Path) -> String {
    p.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}
