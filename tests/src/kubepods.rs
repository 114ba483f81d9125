//! A process "in a Kubernetes pod" on a host without Kubernetes: a cgroup named as the
//! kubelet's cgroupfs driver names a container's (`/kubepods/besteffort/pod<uid>/<container
//! id>`, in the cgroup v1 `pids` hierarchy) and the pod's log directory
//! (`<namespace>_<name>_<uid>`) where `[collectives] pod_logs` points: what the agent reads to
//! name a traced rank's pod.

use std::{
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{anyhow, Context, Result};

/// A pod's container cgroup and log directory, removed (the cgroup and its pod's) on drop.
pub struct PodCgroup {
    cgroup: PathBuf,
    /// The directory to give the agent as `[collectives] pod_logs`.
    pub pod_logs: PathBuf,
    /// The container ID's first 12 hex digits, as the agent's `container_id` label has it.
    pub container: String,
}

impl PodCgroup {
    /// A container of pod `namespace/name` (its log directory under `dir/pods`), beside the
    /// log directory of another pod (`kube-system/coredns-7d9f`) whose name must never leak.
    pub fn new(dir: &Path, namespace: &str, name: &str) -> Result<PodCgroup> {
        let n = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let uid = format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            std::process::id(),
            n & 0xffff,
            (n >> 16) & 0xfff,
            (n >> 28) & 0xfff,
            (n >> 40) & 0xffff_ffff_ffff
        );
        let id = format!("{:032x}{:032x}", n, n.rotate_left(64) ^ 0x5bd1_e995);
        let root = Path::new("/sys/fs/cgroup/pids");
        if !root.join("cgroup.procs").exists() {
            return Err(anyhow!("this test needs the cgroup v1 pids hierarchy at {}", root.display()));
        }
        let cgroup = root.join("kubepods/besteffort").join(format!("pod{uid}")).join(&id);
        std::fs::create_dir_all(&cgroup).context("create the container's cgroup")?;
        let pod_logs = dir.join("pods");
        std::fs::create_dir_all(pod_logs.join(format!("{namespace}_{name}_{uid}"))).context("pod log dir")?;
        std::fs::create_dir_all(pod_logs.join("kube-system_coredns-7d9f_11111111-2222-4333-8444-555555555555")).context("another pod")?;
        Ok(PodCgroup { cgroup, pod_logs, container: id[..12].to_string() })
    }

    /// Makes `cmd` join the container's cgroup before it execs (`0` moves the writer itself),
    /// so it and its children are born inside it. Spawn before the returned file is dropped.
    pub fn enter(&self, cmd: &mut Command) -> Result<std::fs::File> {
        let procs = std::fs::OpenOptions::new().write(true).open(self.cgroup.join("cgroup.procs")).context("open cgroup.procs")?;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&procs);
        // SAFETY: only write(2) on a descriptor opened before the fork.
        unsafe {
            cmd.pre_exec(move || if libc::write(fd, b"0".as_ptr().cast(), 1) == 1 { Ok(()) } else { Err(std::io::Error::last_os_error()) });
        }
        Ok(procs)
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.cgroup);
        if let Some(pod) = self.cgroup.parent() {
            let _ = std::fs::remove_dir(pod);
        }
    }
}
