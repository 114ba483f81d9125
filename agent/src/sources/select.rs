//! Which devices a source may read: include/exclude globs on the device name and on its PCI
//! address, and probe-safe mode.
//!
//! Probe-safe mode exists because restricted ConnectX-7 functions (DGX/GB200) answer every
//! counter read with an error and a kernel log line; reading them every second floods dmesg
//! (node_exporter #3434/#3823). A device whose first reads all fail is left alone afterwards.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use glob::Pattern;

use crate::config::{device_patterns, PatternError};

/// Device selection shared by all sources.
#[derive(Clone, Debug, Default)]
pub struct Selector {
    include: Vec<Pattern>,
    exclude: Vec<Pattern>,
    probe_safe: bool,
    failures: Arc<Mutex<HashMap<String, ProbeState>>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ProbeState {
    /// At least one read has succeeded: never skipped.
    Healthy,
    /// Only failures so far (count).
    Failing(u32),
    /// Skipped from now on.
    Disabled,
}

/// Consecutive all-failed sweeps after which probe-safe mode stops reading a device.
pub const PROBE_SAFE_FAILURES: u32 = 2;

impl Selector {
    pub fn new(include: &[String], exclude: &[String], probe_safe: bool) -> Result<Self, PatternError> {
        Ok(Selector { include: device_patterns(include)?, exclude: device_patterns(exclude)?, probe_safe, failures: Arc::default() })
    }

    /// Whether a device (by name and, if known, PCI address) is selected by the globs.
    pub fn selects(&self, name: &str, pci: Option<&str>) -> bool {
        let hit = |ps: &[Pattern]| ps.iter().any(|p| p.matches(name) || pci.is_some_and(|a| p.matches(a)));
        (self.include.is_empty() || hit(&self.include)) && !hit(&self.exclude)
    }

    /// Whether probe-safe mode has given up on this device (key: `source/device`).
    pub fn disabled(&self, key: &str) -> bool {
        self.probe_safe && self.failures.lock().map(|m| m.get(key) == Some(&ProbeState::Disabled)).unwrap_or(false)
    }

    /// Records the outcome of one sweep of a device: `ok` if at least one read succeeded.
    /// Returns true when this call disabled the device.
    pub fn record(&self, key: &str, ok: bool) -> bool {
        let Ok(mut m) = self.failures.lock() else { return false };
        let st = m.entry(key.to_string()).or_insert(ProbeState::Failing(0));
        match (*st, ok) {
            (_, true) if *st != ProbeState::Disabled => {
                *st = ProbeState::Healthy;
                false
            }
            (ProbeState::Failing(n), false) => {
                if self.probe_safe && n + 1 >= PROBE_SAFE_FAILURES {
                    *st = ProbeState::Disabled;
                    true
                } else {
                    *st = ProbeState::Failing(n + 1);
                    false
                }
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn include_and_exclude_match_name_or_pci_address() {
        let sel = Selector::new(&s(&["mlx5_*"]), &s(&["0000:c1:00.1"]), true).expect("patterns");
        assert!(sel.selects("mlx5_0", Some("0000:0c:00.0")));
        assert!(!sel.selects("mlx5_1", Some("0000:c1:00.1")));
        assert!(!sel.selects("eth0", None));
        let all = Selector::new(&[], &[], false).expect("patterns");
        assert!(all.selects("anything", None));
    }

    #[test]
    fn bad_pattern_is_a_typed_error() {
        let err = Selector::new(&s(&["mlx5_[", "x"]), &[], true).expect_err("must fail");
        assert!(err.to_string().contains("mlx5_["), "{err}");
    }

    #[test]
    fn probe_safe_disables_a_device_whose_first_reads_fail() {
        let sel = Selector::new(&[], &[], true).expect("patterns");
        assert!(!sel.record("rdma/mlx5_7", false));
        assert!(!sel.disabled("rdma/mlx5_7"));
        assert!(sel.record("rdma/mlx5_7", false));
        assert!(sel.disabled("rdma/mlx5_7"));
        // A healthy device is never disabled by later failures.
        sel.record("rdma/mlx5_0", true);
        sel.record("rdma/mlx5_0", false);
        sel.record("rdma/mlx5_0", false);
        assert!(!sel.disabled("rdma/mlx5_0"));
    }

    #[test]
    fn without_probe_safe_nothing_is_disabled() {
        let sel = Selector::new(&[], &[], false).expect("patterns");
        for _ in 0..5 {
            sel.record("rdma/mlx5_7", false);
        }
        assert!(!sel.disabled("rdma/mlx5_7"));
    }
}
