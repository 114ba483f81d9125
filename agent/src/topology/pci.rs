//! PCI functions under sysfs: address, NUMA node, bridge path, NVIDIA GPUs.

use std::path::{Component, Path, PathBuf};

/// A PCI function, located by its canonical path under `devices/`.
#[derive(Clone, Debug, PartialEq)]
pub struct PciDevice {
    /// `0000:0c:00.0`
    pub address: String,
    pub numa_node: Option<i32>,
    /// PCI addresses from the root port down to this function (bridges first).
    pub chain: Vec<String>,
}

fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12 && b[4] == b':' && b[7] == b':' && b[10] == b'.'
}

impl PciDevice {
    /// From a directory that has a `device` link (class device or the PCI dir itself).
    pub fn from_class_device(dev: &Path) -> Option<PciDevice> {
        let real = std::fs::canonicalize(dev.join("device")).ok()?;
        PciDevice::from_path(&real)
    }

    pub fn from_path(real: &Path) -> Option<PciDevice> {
        let chain: Vec<String> = real
            .components()
            .filter_map(|c| match c {
                Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
                _ => None,
            })
            .filter(|s| is_pci_address(s))
            .collect();
        let address = chain.last()?.clone();
        let numa_node = crate::sources::fsread::read_to_string(&real.join("numa_node")).ok().and_then(|s| s.trim().parse().ok());
        Some(PciDevice { address, numa_node, chain })
    }

    /// The GPU sharing the longest bridge chain (same PCIe switch), ties broken by NUMA node.
    pub fn nearest<'a>(&self, gpus: &'a [PciDevice]) -> Option<&'a PciDevice> {
        gpus.iter()
            .map(|g| {
                let common = self.chain.iter().zip(&g.chain).take_while(|(a, b)| a == b).count();
                let same_numa = (self.numa_node.is_some() && self.numa_node == g.numa_node) as usize;
                (common * 2 + same_numa, g)
            })
            .filter(|(score, _)| *score > 0)
            .max_by(|a, b| a.0.cmp(&b.0).then_with(|| b.1.address.cmp(&a.1.address)))
            .map(|(_, g)| g)
    }
}

/// NVIDIA GPUs (vendor 0x10de, class 0x03xxxx display/3D controller) under `bus/pci/devices`.
pub fn nvidia_gpus(sysfs_root: &Path) -> Vec<PciDevice> {
    let dir = sysfs_root.join("bus/pci/devices");
    let mut out: Vec<PciDevice> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let p: PathBuf = e.path();
                    let vendor = crate::sources::fsread::read_to_string(&p.join("vendor")).ok()?;
                    let class = crate::sources::fsread::read_to_string(&p.join("class")).ok()?;
                    if vendor.trim() != "0x10de" || !class.trim().starts_with("0x03") {
                        return None;
                    }
                    PciDevice::from_path(&std::fs::canonicalize(&p).ok()?)
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort_by(|a, b| a.address.cmp(&b.address));
    out
}

/// Parses an RDMA `rate` file (`"400 Gb/sec (4X NDR)"`, `"2.5 Gb/sec (1X SDR)"`) into bytes/s
/// (decimal Gb: × 1e9 / 8, as procfs does with ×125000000).
pub fn parse_ib_rate(s: &str) -> Option<f64> {
    let num = s.split_whitespace().next()?;
    let gbps: f64 = num.parse().ok()?;
    // The product can overflow where the number did not (`1e301 Gb/sec`): check both.
    let bytes = gbps * 125_000_000.0;
    (gbps >= 0.0 && bytes.is_finite()).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_parses_like_procfs() {
        assert_eq!(parse_ib_rate("400 Gb/sec (4X NDR)\n"), Some(50e9));
        assert_eq!(parse_ib_rate("2.5 Gb/sec (1X SDR)"), Some(312_500_000.0));
        assert_eq!(parse_ib_rate("garbage"), None);
        // Regression (fuzz target `sysfs` asserts finite rates): the number fits an f64, the
        // rate in bytes/s does not.
        assert_eq!(parse_ib_rate("1e301 Gb/sec (4X NDR)"), None);
        assert_eq!(parse_ib_rate("-1 Gb/sec"), None);
        assert_eq!(parse_ib_rate("inf Gb/sec"), None);
        assert_eq!(parse_ib_rate(""), None);
    }

    #[test]
    fn nearest_gpu_prefers_the_shared_switch() {
        let d = |chain: &[&str], numa| PciDevice {
            address: chain.last().map(|s| s.to_string()).unwrap_or_default(),
            numa_node: Some(numa),
            chain: chain.iter().map(|s| s.to_string()).collect(),
        };
        let nic = d(&["0000:00:01.0", "0000:01:00.0", "0000:02:08.0", "0000:0c:00.0"], 0);
        let near = d(&["0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:0a:00.0"], 0);
        let far = d(&["0000:00:03.0", "0000:31:00.0"], 0);
        let gpus = vec![far.clone(), near.clone()];
        assert_eq!(nic.nearest(&gpus).map(|g| g.address.as_str()), Some("0000:0a:00.0"));
        let other_numa = d(&["0000:80:01.0", "0000:81:00.0"], 1);
        assert_eq!(other_numa.nearest(&[far]), None);
    }
}
