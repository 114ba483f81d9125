//! A GPU's identities as other exporters label it, so `stepwise_rank_info` joins their series
//! (docs/dcgm-join.md). dcgm-exporter labels a GPU by `gpu` (its index), `UUID` and
//! `pci_bus_id` in NVML's spelling, `00000000:1B:00.0`: an 8-digit domain, upper-case hex.
//! Stepwise's own `gpu` label is sysfs's spelling, `0000:1b:00.0`.

use std::path::Path;

/// `0000:1b:00.0` (sysfs) → `00000000:1B:00.0` (NVML, dcgm-exporter's `pci_bus_id`); empty
/// for an empty or malformed address.
pub fn dcgm_pci_bus_id(sysfs: &str) -> String {
    let Some((domain, rest)) = sysfs.split_once(':') else { return String::new() };
    match u32::from_str_radix(domain, 16) {
        Ok(d) if !rest.is_empty() => format!("{d:08X}:{}", rest.to_ascii_uppercase()),
        _ => String::new(),
    }
}

/// The GPU's UUID (`GPU-…`, dcgm-exporter's `UUID` label) from the NVIDIA driver's
/// `<proc_root>/driver/nvidia/gpus/<pci>/information` (`GPU UUID:` line); empty when the
/// driver does not expose it (no NVIDIA driver, or a proc root without it).
pub fn nvidia_uuid(proc_root: &Path, sysfs_pci: &str) -> String {
    if sysfs_pci.is_empty() || sysfs_pci.contains(['/', '\0']) || sysfs_pci.starts_with('.') {
        return String::new();
    }
    let path = proc_root.join("driver/nvidia/gpus").join(sysfs_pci.to_ascii_lowercase()).join("information");
    let Ok(text) = crate::sources::fsread::read_to_string(&path) else { return String::new() };
    text.lines()
        .find_map(|l| l.strip_prefix("GPU UUID:"))
        .map(str::trim)
        .filter(|u| u.len() <= 64 && u.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        .map(String::from)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dcgm_spelling_has_an_8_digit_domain_in_upper_case() {
        assert_eq!(dcgm_pci_bus_id("0000:1b:00.0"), "00000000:1B:00.0");
        assert_eq!(dcgm_pci_bus_id("0001:c3:00.1"), "00000001:C3:00.1");
        assert_eq!(dcgm_pci_bus_id(""), "");
        assert_eq!(dcgm_pci_bus_id("zz:1b:00.0"), "");
    }

    #[test]
    fn uuid_from_the_driver_information_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let gpu = dir.path().join("driver/nvidia/gpus/0000:1b:00.0");
        std::fs::create_dir_all(&gpu).expect("mkdir");
        // The driver's layout (tabs after the colons), as on an H100 host.
        std::fs::write(
            gpu.join("information"),
            "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 0\nGPU UUID: \t GPU-3b2c6a1e-8f7d-4c7e-9a51-2f0c1d5e6b7a\nVideo BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nBus Location: \t 0000:1b:00.0\nDevice Minor: \t 0\n",
        )
        .expect("write");
        assert_eq!(nvidia_uuid(dir.path(), "0000:1b:00.0"), "GPU-3b2c6a1e-8f7d-4c7e-9a51-2f0c1d5e6b7a");
        assert_eq!(nvidia_uuid(dir.path(), "0000:1B:00.0"), "GPU-3b2c6a1e-8f7d-4c7e-9a51-2f0c1d5e6b7a", "the driver's directories are lower case");
        assert_eq!(nvidia_uuid(dir.path(), "0000:52:00.0"), "", "no such GPU");
        assert_eq!(nvidia_uuid(dir.path(), "../../etc"), "", "not a path out of the proc root");
    }
}
