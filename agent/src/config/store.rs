//! `[store]`: the local SQLite history (`store`), and its defaults, which `diagnose` also
//! uses to find the file.

use std::{path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};

/// Where the agent keeps its history unless `[store] path` says otherwise.
pub const DEFAULT_DB_PATH: &str = "/var/lib/stepwise/agent.db";
/// Default retention by age: a week of steps.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// Default retention by size: 1 GiB (`page_count × page_size`).
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;

/// `[store]`: the local SQLite history of attributed steps.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// Keep a history at all. Default `true`.
    pub enabled: bool,
    /// Database file. Default `/var/lib/stepwise/agent.db`.
    pub path: PathBuf,
    /// Steps older than this are deleted. Default `7d`.
    #[serde(with = "super::duration_str")]
    pub max_age: Duration,
    /// The file is kept under this size by deleting the oldest steps. Default 1 GiB.
    pub max_bytes: u64,
    /// How often retention (by age, then by size) runs. It also runs as soon as the file
    /// passes `max_bytes` (at most once a second), deleting down to 90 % of it. Default `10m`.
    #[serde(with = "super::duration_str")]
    pub retention_interval: Duration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            enabled: true,
            path: PathBuf::from(DEFAULT_DB_PATH),
            max_age: DEFAULT_MAX_AGE,
            max_bytes: DEFAULT_MAX_BYTES,
            retention_interval: Duration::from_secs(600),
        }
    }
}
