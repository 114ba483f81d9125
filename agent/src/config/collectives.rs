//! `[collectives]`: which processes and libraries the collective probes watch
//! (`sources::collectives`), plus the NCCL profiler plugin's socket.

use std::{path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};

/// Debian/Ubuntu multiarch library directories of the agent's architecture.
#[cfg(target_arch = "aarch64")]
const MULTIARCH_LIB: &str = "/usr/lib/aarch64-linux-gnu";
#[cfg(target_arch = "aarch64")]
const MULTIARCH_ROOT_LIB: &str = "/lib/aarch64-linux-gnu";
#[cfg(not(target_arch = "aarch64"))]
const MULTIARCH_LIB: &str = "/usr/lib/x86_64-linux-gnu";
#[cfg(not(target_arch = "aarch64"))]
const MULTIARCH_ROOT_LIB: &str = "/lib/x86_64-linux-gnu";

/// `[collectives]` configuration.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct CollectivesConfig {
    /// Probe collective libraries. Default `true`.
    pub enabled: bool,
    /// Which processes to watch. Default: all.
    pub select: Selection,
    /// Library families probed. Default: nccl, mpi, gloo.
    pub libraries: Vec<Family>,
    /// User-defined probes (`[[collectives.user]]`).
    pub user: Vec<UserProbe>,
    /// Calls kept in memory for `/api/v1/collectives`. Default 65536.
    pub history: usize,
    /// How often to rescan `/proc` for new processes and late-loaded libraries. Default 500ms.
    #[serde(with = "super::duration_str")]
    pub rescan: Duration,
    /// Sampled probes (NCCL's `ncclIbTest`, polled continuously by the proxy thread) are
    /// attached for `sample_window` every `sample_every`. Defaults 200ms / 10s.
    #[serde(with = "super::duration_str")]
    pub sample_window: Duration,
    #[serde(with = "super::duration_str")]
    pub sample_every: Duration,
    /// Root of procfs (tests). Default `/proc`.
    pub proc_root: PathBuf,
    /// Directories searched at start-up for target libraries, which are then probed before
    /// any process maps them — so a job started later is seen from its very first call
    /// (uprobes belong to the file, not the process). Default: the system library dirs.
    pub library_dirs: Vec<PathBuf>,
    /// Host name reported with each call. Default: the kernel's hostname.
    pub host: Option<String>,
    /// The kubelet's pod log directories (`<namespace>_<name>_<uid>`), where a traced
    /// process's pod gets its namespace and name (`sources::collectives::k8s`). Default `/var/log/pods`.
    pub pod_logs: PathBuf,
    /// Unix datagram socket the NCCL profiler plugin sends its records to (`sources::collectives::profiler`;
    /// the jobs' `STEPWISE_PROFILER_SOCKET`). Bound at start: a failure stops the agent.
    /// Empty: no receiver. Default `/run/stepwise/profiler.sock`.
    pub profiler_socket: PathBuf,
    /// Where to install the NCCL profiler plugin at start (a hostPath the job pods mount, for
    /// their `NCCL_PROFILER_PLUGIN`): the agent copies `lib/stepwise/libnccl-profiler-stepwise.so`
    /// next to its binary's directory (`/usr/local/lib/stepwise/` in the image) there,
    /// atomically. Empty (default): nothing is installed.
    pub profiler_plugin_install: PathBuf,
    /// NCCL's RAS service on this host (`NCCL_RAS_ADDR` of the jobs; NCCL's default
    /// `localhost:28028`), asked for the job's status every `ras_every` (`sources::ras`,
    /// docs/ras.md). Empty: never asked. Nothing answering is reported as absent.
    pub ras_addr: String,
    #[serde(with = "super::duration_str")]
    pub ras_every: Duration,
}

impl Default for CollectivesConfig {
    fn default() -> Self {
        CollectivesConfig {
            enabled: true,
            select: Selection::default(),
            libraries: vec![Family::Nccl, Family::Mpi, Family::Gloo],
            user: Vec::new(),
            history: 65536,
            rescan: Duration::from_millis(500),
            sample_window: Duration::from_millis(200),
            sample_every: Duration::from_secs(10),
            proc_root: PathBuf::from("/proc"),
            library_dirs: [MULTIARCH_LIB, MULTIARCH_ROOT_LIB, "/usr/lib64", "/usr/local/lib"].iter().map(PathBuf::from).collect(),
            host: None,
            pod_logs: PathBuf::from("/var/log/pods"),
            profiler_socket: PathBuf::from(nccl_profiler::sender::DEFAULT_SOCKET),
            profiler_plugin_install: PathBuf::new(),
            ras_addr: "127.0.0.1:28028".into(),
            ras_every: Duration::from_secs(10),
        }
    }
}

/// Which processes this agent watches (`[collectives] select`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Selection {
    /// Only these pids (empty: no pid filter).
    pub pids: Vec<u32>,
    /// Only processes whose cgroup path (from /proc/<pid>/cgroup) starts with this.
    pub cgroup: Option<String>,
    /// Only processes in this network namespace: a path such as `/run/netns/NAME` or
    /// `/proc/<pid>/ns/net`. One agent per namespace plays one agent per host in tests.
    pub netns: Option<PathBuf>,
}

/// Library families.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    Nccl,
    Mpi,
    Gloo,
    User,
}

impl Family {
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Nccl => "nccl",
            Family::Mpi => "mpi",
            Family::Gloo => "gloo",
            Family::User => "user",
        }
    }
}

/// A user-defined probe from config.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UserProbe {
    /// Glob on the library (or executable) file name.
    pub library: String,
    pub symbol: String,
    /// Operation name reported in metrics and the API.
    pub op: String,
    /// Integer argument index (0-based; 6 and 7 are the 7th and 8th arguments: in memory on
    /// x86-64, in x6/x7 on aarch64) holding the element count, if any.
    pub count_arg: Option<u8>,
    /// Bytes per element.
    #[serde(default = "one")]
    pub elem_size: u64,
    /// Argument holding a communicator handle, if any.
    pub comm_arg: Option<u8>,
    /// Whether the call blocks until the operation completes (else enter/exit is only issue).
    #[serde(default = "yes")]
    pub blocking: bool,
}

fn one() -> u64 {
    1
}
fn yes() -> bool {
    true
}
