//! `[steps]`: step formation (marker socket, grace, history) and the attribution
//! parameters (`[steps.params]`, used by `attribution::attribute`).

use std::{collections::BTreeMap, time::Duration};

use serde::{Deserialize, Serialize};

/// `[steps]` configuration.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct StepsConfig {
    /// Unix datagram socket for step markers. Default `/run/stepwise/markers.sock`.
    pub marker_socket: std::path::PathBuf,
    /// A step is slow when longer than this; `0s` = 1.5 × the median of recent steps.
    /// Default `0s`.
    #[serde(with = "super::duration_str")]
    pub slow_step: Duration,
    /// Wait at least this long after a step ends before attributing it (the other ranks'
    /// markers, period detection). Default `1s`.
    #[serde(with = "super::duration_str")]
    pub grace: Duration,
    /// Past the grace, a step also waits until the probe consumer has drained every event up
    /// to its end and a counter sweep has passed it — for at most this long after its end;
    /// a step closed then is marked incomplete with a note. Default `10s`.
    #[serde(with = "super::duration_str")]
    pub max_wait: Duration,
    /// Steps kept in memory for `/api/v1/steps`. Default 1000.
    pub history: usize,
    /// Counter samples kept per NIC for the step windows (one per sweep): the longest step
    /// that can be attributed is about this many sweep intervals. Default 4096 (68 minutes at
    /// the default 1 s interval); each sample is a few hundred bytes, so a host with 18 NICs
    /// holds up to ~20 MiB once full.
    pub counter_samples: usize,
    /// Nominal rate per NIC (`eth1 = "1Gbit/s"`), overriding sysfs `rate`/`speed` — for
    /// shaped links whose real bottleneck is a qdisc. Default empty.
    pub nic_rates: BTreeMap<String, String>,
    /// Attribution parameters (α, transmit-wait tick length, idle-NIC threshold).
    pub params: Params,
}

impl Default for StepsConfig {
    fn default() -> Self {
        StepsConfig {
            marker_socket: "/run/stepwise/markers.sock".into(),
            slow_step: Duration::ZERO,
            grace: Duration::from_secs(1),
            max_wait: Duration::from_secs(10),
            history: 1000,
            counter_samples: 4096,
            nic_rates: BTreeMap::new(),
            params: Params::default(),
        }
    }
}

/// What the engine needs to know beyond the step's own data.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Params {
    /// Per-round launch latency α (docs/models.md §0: 0.833 µs).
    pub alpha: f64,
    /// Duration of one `port_xmit_wait` tick in seconds. The unit is implementation-defined
    /// and not documented for ConnectX [unverified]; 4 ns is assumed (the same assumption as
    /// the fixture scenario writer). Set `[steps.params] xmit_wait_tick_seconds` per fleet.
    pub xmit_wait_tick_seconds: f64,
    /// NICs carrying less than this many bytes in a window are ignored (idle management
    /// traffic).
    pub min_nic_bytes: f64,
}

impl Default for Params {
    fn default() -> Self {
        Params { alpha: 0.833e-6, xmit_wait_tick_seconds: 4e-9, min_nic_bytes: 64.0 * 1024.0 }
    }
}
