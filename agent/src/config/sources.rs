//! `[sources]`: which counter sources run, and what their reads may cost.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Source switches and costs (`[sources]` table). Each switch defaults to `true`, but
/// `qdisc_per_queue`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SourcesConfig {
    /// RDMA sysfs counters (`/sys/class/infiniband`).
    pub rdma: bool,
    /// ethtool driver statistics (SIOCETHTOOL ioctl).
    pub ethtool: bool,
    /// netdev statistics (rtnetlink).
    pub netdev: bool,
    /// qdisc statistics (rtnetlink).
    pub qdisc: bool,
    /// Also every non-root qdisc (the per-TX-queue children of `mq`/`mqprio`, classful
    /// qdiscs' leaves). Default `false`: the root qdisc of each interface only, whose
    /// statistics already include its children's (one veth with 64 TX queues made 65 qdiscs
    /// and 455 series; ~10 such netdevs reach the 1 024-qdisc cap).
    pub qdisc_per_queue: bool,
    /// TCP retransmissions per interface (`tcp:tcp_retransmit_skb` tracepoint).
    pub tcp: bool,
    /// PFC priorities (0–7) whose received pause time and frames count as congestion of the
    /// jobs on a NIC (the RoCE traffic class's priority, e.g. `[3]`). Unset: the priorities
    /// that carry traffic on that NIC (see [`crate::sources::ethtool::pfc::pfc_counted`]). Link-level
    /// (global) pause always counts: it stops every priority.
    pub pfc_priorities: Option<Vec<u8>>,
    /// Fraction of one core the TCP source's `sock_diag` dump may use on average (0 < x ≤ 1,
    /// default 0.02): an expensive dump (many connections) is run less often than every
    /// sweep. 1 dumps every sweep whatever it costs.
    pub tcp_cpu_budget: f64,
    /// The fast lane's period: while a traced job's collectives are in flight, the
    /// attribution counters of the NICs it uses are read this often between the full sweeps
    /// at `interval` (see `daemon::fast`). Default `10ms`; `0s` turns the fast lane off.
    #[serde(with = "super::duration_str")]
    pub fast_interval: Duration,
    /// Fraction of one core the fast lane may use on average (0 < x ≤ 1, default 0.01): a
    /// read that cost c seconds of CPU is followed by the next no sooner than c / budget later.
    pub fast_cpu_budget: f64,
}

/// `[sources] tcp_cpu_budget` by default: 2 % of a core.
pub const DEFAULT_TCP_CPU_BUDGET: f64 = 0.02;
/// `[sources] fast_interval` by default.
pub const DEFAULT_FAST_INTERVAL: Duration = Duration::from_millis(10);
/// `[sources] fast_cpu_budget` by default: 1 % of a core.
pub const DEFAULT_FAST_CPU_BUDGET: f64 = 0.01;

impl Default for SourcesConfig {
    fn default() -> Self {
        SourcesConfig {
            rdma: true,
            ethtool: true,
            netdev: true,
            qdisc: true,
            qdisc_per_queue: false,
            tcp: true,
            pfc_priorities: None,
            tcp_cpu_budget: DEFAULT_TCP_CPU_BUDGET,
            fast_interval: DEFAULT_FAST_INTERVAL,
            fast_cpu_budget: DEFAULT_FAST_CPU_BUDGET,
        }
    }
}

fn share(field: &'static str, b: f64) -> Result<(), ConfigError> {
    if b > 0.0 && b <= 1.0 {
        return Ok(());
    }
    Err(ConfigError::Invalid { field, value: b.to_string(), reason: "a fraction of one core, above 0 and at most 1".into() })
}

impl SourcesConfig {
    /// Checks the values `serde` cannot: priorities, budgets, the fast lane's period.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(bad) = self.pfc_priorities.iter().flatten().find(|p| **p > 7) {
            return Err(ConfigError::Invalid { field: "sources.pfc_priorities", value: bad.to_string(), reason: "a PFC priority is 0 to 7".into() });
        }
        share("sources.tcp_cpu_budget", self.tcp_cpu_budget)?;
        share("sources.fast_cpu_budget", self.fast_cpu_budget)?;
        let f = self.fast_interval;
        if !f.is_zero() && f < Duration::from_millis(1) {
            return Err(ConfigError::Invalid {
                field: "sources.fast_interval",
                value: humantime::format_duration(f).to_string(),
                reason: "0s (off), or at least 1ms".into(),
            });
        }
        Ok(())
    }

    /// The fast lane's period, `None` when off: `fast_interval` 0, or not shorter than the
    /// full sweep's `interval` (every sweep is then as fast).
    pub fn fast_period(&self, interval: Duration) -> Option<Duration> {
        (!self.fast_interval.is_zero() && self.fast_interval < interval).then_some(self.fast_interval)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn the_fast_lane_is_on_by_default_and_checked_against_the_interval() {
        let c = Config::default();
        assert_eq!((c.sources.fast_interval, c.sources.fast_cpu_budget), (DEFAULT_FAST_INTERVAL, DEFAULT_FAST_CPU_BUDGET));
        assert!(c.validate().is_ok());
        let off = Config::from_toml("[sources]\nfast_interval = \"0s\"\n").expect("parses");
        assert!(off.validate().is_ok(), "0s turns it off");
        assert_eq!(off.sources.fast_period(off.interval), None);
        assert_eq!(c.sources.fast_period(c.interval), Some(DEFAULT_FAST_INTERVAL));
        let fast = Config::from_toml("interval = \"10ms\"\n").expect("parses");
        assert!(fast.validate().is_ok());
        assert_eq!(fast.sources.fast_period(fast.interval), None, "every sweep is already that fast");
        for (toml, field) in [
            ("[sources]\nfast_interval = \"100us\"\n", "sources.fast_interval"),
            ("[sources]\nfast_cpu_budget = 0\n", "sources.fast_cpu_budget"),
            ("[sources]\nfast_cpu_budget = 1.5\n", "sources.fast_cpu_budget"),
        ] {
            let c = Config::from_toml(toml).expect("parses");
            assert!(matches!(c.validate(), Err(ConfigError::Invalid { field: f, .. }) if f == field), "{toml}");
        }
    }
}
