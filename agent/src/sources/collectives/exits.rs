//! How a traced process ended, and what a live one is doing.
//!
//! The agent is not the parent of the processes it traces, so it cannot `waitpid` them. It
//! holds a pidfd of each (`pidfd_open`, no privilege needed): from Linux 6.15 the kernel
//! keeps the exit status of a process that has a pidfd and returns it through
//! `ioctl(PIDFD_GET_INFO)` with `PIDFD_INFO_EXIT`, even after the parent reaped it. On an
//! older kernel the status is read from `/proc/<pid>/stat` (field 52) while the process is a
//! zombie, and is unknown once it has been reaped. Live state comes from `/proc/<pid>/stat`
//! and each thread's `stat`, `comm` and `wchan` (through [`crate::sources::fsread`]).

use std::{
    collections::HashMap,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::Path,
};

use crate::timeline::open::{state_label, ProcState, ThreadState, MAX_THREADS};

/// Pidfds held at most (one per traced process).
pub const MAX_WATCHED: usize = 4096;

const PIDFD_INFO_EXIT: u64 = 1 << 3;
/// `struct pidfd_info` up to `exit_code` (PIDFD_INFO_SIZE_VER0, include/uapi/linux/pidfd.h).
#[repr(C)]
#[derive(Default)]
struct PidfdInfo {
    mask: u64,
    cgroupid: u64,
    ids: [u32; 11],
    exit_code: i32,
}
/// `_IOWR(PIDFS_IOCTL_MAGIC = 0xFF, 11, struct pidfd_info)`.
const PIDFD_GET_INFO: u64 = (3 << 30) | ((std::mem::size_of::<PidfdInfo>() as u64) << 16) | (0xFF << 8) | 11;

/// A `waitpid` status → (signal, exit code).
pub fn decode_status(status: i32) -> (Option<i32>, Option<i32>) {
    let sig = status & 0x7f;
    if sig == 0 {
        (None, Some((status >> 8) & 0xff))
    } else {
        (Some(sig), None)
    }
}

/// Pidfds of the traced processes.
#[derive(Debug, Default)]
pub struct ExitWatch {
    fds: HashMap<u32, OwnedFd>,
}

impl ExitWatch {
    /// Opens a pidfd of `pid` (once; ignored past [`MAX_WATCHED`] or when it fails).
    pub fn watch(&mut self, pid: u32) {
        if self.fds.contains_key(&pid) || self.fds.len() >= MAX_WATCHED {
            return;
        }
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd >= 0 {
            // SAFETY: the kernel just returned this fd; nothing else owns it.
            self.fds.insert(pid, unsafe { OwnedFd::from_raw_fd(fd as i32) });
        }
    }

    pub fn forget(&mut self, pid: u32) {
        self.fds.remove(&pid);
    }

    /// The exit status of `pid`, which has exited: (signal, exit code), both `None` when no
    /// source knows it.
    pub fn status(&self, proc_root: &Path, pid: u32) -> (Option<i32>, Option<i32>) {
        if let Some(fd) = self.fds.get(&pid) {
            let mut info = PidfdInfo { mask: PIDFD_INFO_EXIT, ..Default::default() };
            // SAFETY: a valid pidfd and a writable struct of the size encoded in the request.
            let rc = unsafe { libc::ioctl(fd.as_raw_fd(), PIDFD_GET_INFO as _, &mut info as *mut PidfdInfo) };
            if rc == 0 && info.mask & PIDFD_INFO_EXIT != 0 {
                return decode_status(info.exit_code);
            }
        }
        zombie_status(proc_root, pid).map(decode_status).unwrap_or((None, None))
    }
}

/// Fields after the `(comm)` of a `stat` line.
fn stat_fields(stat: &str) -> Vec<&str> {
    stat.rfind(')').map(|i| stat[i + 1..].split_whitespace().collect()).unwrap_or_default()
}

/// The exit status of a zombie (`stat` field 52), if `pid` is one.
fn zombie_status(proc_root: &Path, pid: u32) -> Option<i32> {
    let s = crate::sources::fsread::read_to_string(&proc_root.join(pid.to_string()).join("stat")).ok()?;
    let f = stat_fields(&s);
    // f[0] is field 3 (state), so field 52 is f[49].
    (f.first() == Some(&"Z")).then(|| f.get(49).and_then(|v| v.parse().ok())).flatten()
}

/// What a live process is doing: its state and, per thread (at most [`MAX_THREADS`]), its
/// name, state and `wchan`. `None` when the process is gone or unreadable.
pub fn proc_state(proc_root: &Path, pid: u32) -> Option<ProcState> {
    let dir = proc_root.join(pid.to_string());
    let read = |p: &Path| crate::sources::fsread::read_to_string(p).ok();
    let stat = read(&dir.join("stat"))?;
    let letter = stat_fields(&stat).first().and_then(|s| s.chars().next())?;
    let mut tids: Vec<u32> =
        std::fs::read_dir(dir.join("task")).map(|rd| rd.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect()).unwrap_or_default();
    tids.sort_unstable();
    let more = tids.len().saturating_sub(MAX_THREADS);
    let threads = tids
        .into_iter()
        .take(MAX_THREADS)
        .filter_map(|tid| {
            let t = dir.join("task").join(tid.to_string());
            let st = read(&t.join("stat"))?;
            let letter = stat_fields(&st).first().and_then(|s| s.chars().next()).unwrap_or('?');
            let wchan = read(&t.join("wchan")).map(|w| w.trim().to_string()).filter(|w| w != "0").unwrap_or_default();
            Some(ThreadState { tid, name: read(&t.join("comm")).unwrap_or_default().trim().to_string(), state: state_label(letter), wchan })
        })
        .collect();
    Some(ProcState { state: state_label(letter), in_probed_call: false, threads, more_threads: more, pod: None })
}

/// For the hang rule's "not progressing" leg: the scheduler state (letter only, no threads) of
/// every live rank inside a call open longer than `older_than` seconds as of the view. Cheap:
/// one `stat` read per such process, and only while a call has been open that long.
pub fn fill_inside_states(view: &mut crate::timeline::open::HostProgress, proc_root: &Path, older_than: f64) {
    let as_of = view.as_of;
    for r in view.comms.iter_mut().flat_map(|c| c.ranks.iter_mut()) {
        if r.exited.is_some() || r.open.as_ref().is_none_or(|o| as_of - o.since <= older_than) {
            continue;
        }
        let stat = crate::sources::fsread::read_to_string(&proc_root.join(r.pid.to_string()).join("stat")).ok();
        let letter = stat.as_deref().and_then(|s| stat_fields(s).first().and_then(|f| f.chars().next()));
        r.state = letter.map(|l| ProcState { state: state_label(l), in_probed_call: true, ..Default::default() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_statuses_decode() {
        assert_eq!(decode_status(9), (Some(9), None));
        assert_eq!(decode_status(3 << 8), (None, Some(3)));
        assert_eq!(decode_status(0), (None, Some(0)));
        assert_eq!(std::mem::size_of::<PidfdInfo>(), 64, "PIDFD_INFO_SIZE_VER0");
    }

    #[test]
    fn own_state_and_threads_are_read_and_a_zombie_status_parsed() {
        let me = proc_state(Path::new("/proc"), std::process::id()).expect("own state");
        assert!(me.state.starts_with('R') || me.state.starts_with('S'), "{}", me.state);
        assert!(me.threads.iter().any(|t| t.tid == std::process::id()));
        let d = tempfile::tempdir().expect("tmp");
        let p = d.path().join("77");
        std::fs::create_dir_all(&p).expect("dir");
        let mut fields: Vec<String> = (3..=52).map(|i| i.to_string()).collect();
        fields[0] = "Z".into();
        fields[49] = "9".into();
        std::fs::write(p.join("stat"), format!("77 (a) b) {}\n", fields.join(" "))).expect("stat");
        assert_eq!(ExitWatch::default().status(d.path(), 77), (Some(9), None));
        assert!(proc_state(d.path(), 78).is_none());
    }

    #[test]
    fn a_child_killed_by_a_signal_is_reported_through_its_pidfd() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("sleep");
        let mut w = ExitWatch::default();
        w.watch(child.id());
        child.kill().expect("kill");
        child.wait().expect("reaped");
        // Reaped: only the pidfd (Linux ≥ 6.15) still knows; older kernels say unknown.
        let got = w.status(Path::new("/proc"), child.id());
        assert!(got == (Some(9), None) || got == (None, None), "{got:?}");
    }
}
