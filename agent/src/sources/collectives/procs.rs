//! Process discovery: which processes map a target library, through `/proc/<pid>/maps`
//! (paths resolved through `/proc/<pid>/root` so other containers' files are found), which of
//! them this agent watches (all, by pid, by cgroup, by network namespace), and the allowlisted
//! part of their environment.

use std::{
    collections::BTreeMap,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use crate::config::collectives::Selection;

/// Environment variable prefixes (or exact names) the agent may read from a traced process.
/// Nothing else is ever read into memory beyond the scan, stored or exported.
pub const ENV_ALLOWLIST: &[&str] = &[
    "NCCL_",
    "UCX_",
    "OMPI_COMM_WORLD_",
    "OMPI_UNIVERSE_SIZE",
    "PMIX_RANK",
    "PMIX_NAMESPACE",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "STEPWISE_RANK",
    "STEPWISE_JOB",
    // Whether the process's NCCL calls block until done (otherwise they time the enqueue).
    "CUDA_LAUNCH_BLOCKING",
    // The interfaces gloo uses (NCCL_SOCKET_IFNAME is under NCCL_): which NICs carry a job.
    "GLOO_SOCKET_IFNAME",
];

/// Even under an allowed prefix, names that look like credentials are never kept.
const ENV_DENY_WORDS: &[&str] = &["TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "PRIVATE", "_KEY"];

pub fn env_allowed(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    if ENV_DENY_WORDS.iter().any(|w| upper.contains(w)) {
        return false;
    }
    ENV_ALLOWLIST.iter().any(|p| if p.ends_with('_') { name.starts_with(p) } else { name == *p })
}

/// `CUDA_LAUNCH_BLOCKING=1`: every CUDA launch, so every NCCL call, returns when done.
pub fn launch_blocking(env: &BTreeMap<String, String>) -> bool {
    env.get("CUDA_LAUNCH_BLOCKING").is_some_and(|v| v.trim() == "1")
}

/// Parses `/proc/<pid>/environ` content, keeping only allowlisted variables.
pub fn parse_environ(raw: &[u8]) -> BTreeMap<String, String> {
    raw.split(|b| *b == 0)
        .filter_map(|kv| {
            let s = std::str::from_utf8(kv).ok()?;
            let (k, v) = s.split_once('=')?;
            env_allowed(k).then(|| (k.to_string(), v.to_string()))
        })
        .collect()
}

/// A resolved selection (the netns inode is looked up once).
#[derive(Clone, Debug, Default)]
pub struct Selector {
    pids: Vec<u32>,
    cgroup: Option<String>,
    netns_ino: Option<u64>,
}

/// Looks the selection's network namespace up once.
impl Selection {
    pub fn resolve(&self) -> std::io::Result<Selector> {
        let netns_ino = match &self.netns {
            Some(p) => Some(std::fs::metadata(p)?.ino()),
            None => None,
        };
        Ok(Selector { pids: self.pids.clone(), cgroup: self.cgroup.clone(), netns_ino })
    }
}

impl Selector {
    pub fn selects(&self, proc_root: &Path, pid: u32) -> bool {
        if !self.pids.is_empty() && !self.pids.contains(&pid) {
            return false;
        }
        let dir = proc_root.join(pid.to_string());
        if let Some(want) = self.netns_ino {
            match std::fs::metadata(dir.join("ns/net")) {
                Ok(m) if m.ino() == want => {}
                _ => return false,
            }
        }
        if let Some(prefix) = &self.cgroup {
            let cg = crate::sources::fsread::read_to_string(&dir.join("cgroup")).unwrap_or_default();
            if !cg.lines().any(|l| l.splitn(3, ':').nth(2).is_some_and(|p| p.starts_with(prefix.as_str()))) {
                return false;
            }
        }
        true
    }
}

/// One mapping of a file-backed library in a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub offset: u64,
    pub dev: String,
    pub inode: u64,
    pub path: String,
}

/// Parses `/proc/<pid>/maps` lines (`start-end perms offset dev inode path`); malformed lines
/// are skipped.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let range = f.next()?;
            let _perms = f.next()?;
            let offset = u64::from_str_radix(f.next()?, 16).ok()?;
            let dev = f.next()?.to_string();
            let inode: u64 = f.next()?.parse().ok()?;
            let path: String = f.collect::<Vec<_>>().join(" ");
            if inode == 0 || !path.starts_with('/') {
                return None;
            }
            let start = u64::from_str_radix(range.split('-').next()?, 16).ok()?;
            Some(Mapping { start, offset, dev, inode, path })
        })
        .collect()
}

/// The identity of a library file across mount namespaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey {
    pub dev: u64,
    pub inode: u64,
}

/// A process that maps at least one target library.
#[derive(Clone, Debug)]
pub struct Found {
    pub pid: u32,
    /// (target index, path to open from the agent's namespace, file key, load base)
    pub libs: Vec<(usize, PathBuf, FileKey, u64)>,
}

/// Target libraries mapped by one process: (target index, path to open from the agent's
/// namespace, file key, load base).
pub fn libs_of(proc_root: &Path, pid: u32, globs: &[glob::Pattern]) -> Vec<(usize, PathBuf, FileKey, u64)> {
    let dir = proc_root.join(pid.to_string());
    let Ok(maps) = crate::sources::fsread::read_to_string(&dir.join("maps")) else { return Vec::new() };
    let mut libs: Vec<(usize, PathBuf, FileKey, u64)> = Vec::new();
    for m in parse_maps(&maps) {
        let name = Path::new(&m.path).file_name().and_then(|n| n.to_str()).unwrap_or("");
        let Some(ti) = globs.iter().position(|g| g.matches(name)) else { continue };
        if libs.iter().any(|(t, ..)| *t == ti) {
            continue;
        }
        // Open through the process's root so a library inside another container resolves
        // to the same inode the process mapped.
        let via_root = dir.join("root").join(m.path.trim_start_matches('/'));
        let Ok(md) = std::fs::metadata(&via_root) else { continue };
        if md.ino() != m.inode {
            continue; // replaced on disk since it was mapped
        }
        let base = m.start.saturating_sub(m.offset);
        libs.push((ti, via_root, FileKey { dev: md.dev(), inode: md.ino() }, base));
    }
    libs
}

/// Scans `/proc` for processes mapping any library whose file name matches one of `globs`.
pub fn scan(proc_root: &Path, globs: &[glob::Pattern], sel: &Selector, self_pid: u32) -> Vec<Found> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(proc_root) else { return out };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid == self_pid {
            continue;
        }
        let libs = libs_of(proc_root, pid, globs);
        if !libs.is_empty() && sel.selects(proc_root, pid) {
            out.push(Found { pid, libs });
        }
    }
    out
}

/// Whether a pid still exists.
/// Whether a pid is still a running process. A zombie (killed, not yet reaped by its parent
/// — `mpirun` may take its time) has exited: its calls in flight are aborted now.
pub fn alive(proc_root: &Path, pid: u32) -> bool {
    match crate::sources::fsread::read_to_string(&proc_root.join(pid.to_string()).join("stat")) {
        // "pid (comm) S …": the state follows the last ')' (comm may contain parentheses).
        Ok(s) => s.rfind(')').and_then(|i| s[i + 1..].split_whitespace().next()).is_some_and(|st| st != "Z" && st != "X"),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environ_keeps_only_the_allowlist_and_never_secrets() {
        let raw =
            b"NCCL_IB_HCA=mlx5\0AWS_SECRET_ACCESS_KEY=abc\0NCCL_API_TOKEN=zzz\0OMPI_COMM_WORLD_RANK=3\0HOME=/root\0RANK=1\0RANKS=9\0garbage\0\xff\xfe=1\0";
        let env = parse_environ(raw);
        assert_eq!(env.get("NCCL_IB_HCA").map(String::as_str), Some("mlx5"));
        assert_eq!(env.get("OMPI_COMM_WORLD_RANK").map(String::as_str), Some("3"));
        assert_eq!(env.get("RANK").map(String::as_str), Some("1"));
        assert!(!env.contains_key("AWS_SECRET_ACCESS_KEY"));
        assert!(!env.contains_key("NCCL_API_TOKEN"), "credential-looking names are dropped even under NCCL_");
        assert!(!env.contains_key("HOME") && !env.contains_key("RANKS"));
    }

    #[test]
    fn maps_lines_parse_and_garbage_is_skipped() {
        let text = "7f1c2a000000-7f1c2a100000 r-xp 00001000 fd:01 1234 /usr/lib/x86_64-linux-gnu/libnccl.so.2\n\
                    7ffd1000-7ffd2000 rw-p 00000000 00:00 0 [stack]\n\
                    garbage line\n\
                    7f00-7f10 r--p 00000000 fd:01 99 /opt/my lib/libmpi.so.40\n";
        let m = parse_maps(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].offset, 0x1000);
        assert_eq!(m[0].inode, 1234);
        assert_eq!(m[1].path, "/opt/my lib/libmpi.so.40");
    }

    #[test]
    fn selection_by_pid_and_netns() {
        let me = std::process::id();
        let sel = Selection { pids: vec![me], ..Default::default() }.resolve().expect("resolve");
        assert!(sel.selects(Path::new("/proc"), me));
        assert!(!sel.selects(Path::new("/proc"), 1));
        let sel = Selection { netns: Some("/proc/self/ns/net".into()), ..Default::default() }.resolve().expect("resolve");
        assert!(sel.selects(Path::new("/proc"), me));
        assert!(Selection { netns: Some("/nonexistent/ns".into()), ..Default::default() }.resolve().is_err());
    }
}
