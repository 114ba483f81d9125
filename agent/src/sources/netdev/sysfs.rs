//! The few sysfs reads the network sources need, all under `--sysfs-root`.

use std::{io, path::Path};

/// Netdev names under `<sysfs_root>/class/net`, sorted, without `lo`.
pub fn list_netdevs(sysfs_root: &Path) -> io::Result<Vec<String>> {
    let mut out: Vec<String> = std::fs::read_dir(sysfs_root.join("class/net"))?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n != "lo")
        .collect();
    out.sort();
    Ok(out)
}

/// The PCI address behind a netdev (`class/net/<n>/device` → `…/0000:0c:00.0`), if any.
/// Virtual devices (veth, bridges) have no `device` link; virtio ones link to `virtioN`,
/// which is not a PCI address and is ignored.
pub fn pci_address(sysfs_root: &Path, netdev: &str) -> Option<String> {
    let target = std::fs::read_link(sysfs_root.join("class/net").join(netdev).join("device")).ok()?;
    let last = target.file_name()?.to_str()?;
    is_pci_address(last).then(|| last.to_string())
}

/// `dddd:bb:dd.f` (domain, bus, device, function in hex).
fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    let hex = |r: std::ops::Range<usize>| b.get(r).is_some_and(|x| x.iter().all(u8::is_ascii_hexdigit));
    b.len() == 12 && hex(0..4) && b[4] == b':' && hex(5..7) && b[7] == b':' && hex(8..10) && b[10] == b'.' && hex(11..12)
}

/// `class/net/<n>/ifindex`.
pub fn read_ifindex(sysfs_root: &Path, netdev: &str) -> Option<u64> {
    crate::sources::fsread::read_to_string(&sysfs_root.join("class/net").join(netdev).join("ifindex")).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_address_from_device_link_and_not_from_virtio() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let pci = root.join("devices/pci0000:00/0000:00:02.0/0000:0c:00.0");
        std::fs::create_dir_all(&pci).expect("mkdir");
        std::fs::create_dir_all(root.join("devices/virtual/net/veth0")).expect("mkdir");
        std::fs::create_dir_all(root.join("devices/pci0000:00/virtio3")).expect("mkdir");
        for (n, dev) in [("eth0", Some(pci.clone())), ("ens5", Some(root.join("devices/pci0000:00/virtio3"))), ("veth0", None)] {
            let d = root.join("class/net").join(n);
            std::fs::create_dir_all(&d).expect("mkdir");
            std::fs::write(d.join("ifindex"), "7\n").expect("write");
            if let Some(t) = dev {
                std::os::unix::fs::symlink(t, d.join("device")).expect("symlink");
            }
        }
        std::fs::create_dir_all(root.join("class/net/lo")).expect("mkdir");
        assert_eq!(pci_address(root, "eth0").as_deref(), Some("0000:0c:00.0"));
        assert_eq!(pci_address(root, "ens5"), None);
        assert_eq!(pci_address(root, "veth0"), None);
        assert_eq!(read_ifindex(root, "eth0"), Some(7));
        assert_eq!(list_netdevs(root).expect("list"), vec!["ens5", "eth0", "veth0"]);
    }
}
