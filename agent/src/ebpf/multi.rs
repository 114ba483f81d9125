//! Programs linked through *uprobe-multi* links (`BPF_LINK_CREATE`, Linux 6.6+): every probe
//! of a library in one link, so a library attaches in one syscall and detaches in one RCU
//! grace period instead of one per probe (a perf-event uprobe waits for its own
//! `synchronize_rcu_tasks_trace` when it is closed: 20 libraries of 15 probe links took 37 s
//! to close one after another).
//!
//! Three programs are loaded this way: the entry and return programs (`call_enter`,
//! `call_exit`, the same instructions aya loads for its perf-event uprobes, here with the
//! uprobe-multi attach type) and the uprobe *session* program (Linux 6.13+) `call_session`:
//! one program run at a function's entry and, unless that run returned 1, at its return, so
//! whether a call's return is probed is decided per call. The agent uses it for asynchronous
//! NCCL calls: one probe hit per call for processes whose calls only enqueue, entry and
//! return for a process whose calls block (`CUDA_LAUNCH_BLOCKING=1`) — from its first call,
//! with no attachment racing the process.
//!
//! aya 0.14 can neither load a program with these attach types nor create the link (see
//! docs/dependencies.md), so this module does both: aya-obj (aya's own object parser) parses
//! and relocates a program against the maps aya created — the programs share the ring and
//! tables —, the session program's placeholder call is rewritten into the kfunc
//! `bpf_session_is_return`, and the bpf(2) syscall loads it and creates the link.

use std::{
    collections::HashSet,
    ffi::CString,
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd},
    path::Path,
};

use aya_obj::{btf::BtfKind, generated::bpf_insn, Object};

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_KPROBE: u32 = 2;
/// `enum bpf_attach_type` (uapi/linux/bpf.h, Linux 6.13).
const BPF_TRACE_UPROBE_SESSION: u32 = 57;
/// `BPF_TRACE_UPROBE_MULTI` (Linux 6.6).
const BPF_TRACE_UPROBE_MULTI: u32 = 48;
/// `BPF_F_UPROBE_MULTI_RETURN`: the link's program runs at the functions' returns.
const BPF_F_UPROBE_MULTI_RETURN: u32 = 1;
const BPF_JMP_CALL: u8 = 0x85;
const BPF_PSEUDO_KFUNC_CALL: u8 = 2;
/// The kfunc the program calls to tell its return run from its entry run.
const KFUNC_IS_RETURN: &str = "bpf_session_is_return";
/// The license the object declares (GPL-compatible: kfuncs require it).
const LICENSE: &str = "Dual MIT/GPL";

/// Why a uprobe-multi program cannot be used here (the agent falls back to a perf-event
/// uprobe per probe, entry and return programs for every call).
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("the kernel's BTF has no {KFUNC_IS_RETURN} (uprobe sessions need Linux 6.13+ with BTF)")]
    NoKfunc,
    #[error("the eBPF object: {0}")]
    Object(String),
    #[error("the eBPF object has no program {0}")]
    NoProgram(&'static str),
    #[error("the program calls no {KFUNC_IS_RETURN} placeholder: object and loader disagree")]
    NoPlaceholder,
    #[error("map {0} was not created by the loader")]
    NoMap(String),
    #[error("the kernel refused the program: {0}")]
    Load(String),
}

/// `union bpf_attr` for BPF_PROG_LOAD, up to `expected_attach_type` (the kernel takes a
/// shorter attr and reads the rest as zero).
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// `union bpf_attr` for BPF_LINK_CREATE with its `uprobe_multi` member.
#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    multi_flags: u32,
    pid: u32,
    _pad: u32,
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<RawFd> {
    // SAFETY: `attr` is a repr(C) prefix of `union bpf_attr` for `cmd`, its size passed
    // along; pointers inside it reference memory alive for the call.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, std::mem::size_of::<T>()) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r as RawFd)
    }
}

/// The raw fd of an aya map.
fn map_fd(map: &aya::maps::Map) -> Option<RawFd> {
    use aya::maps::Map as M;
    let data = match map {
        M::Array(d) | M::HashMap(d) | M::LruHashMap(d) | M::PerCpuArray(d) | M::PerCpuHashMap(d) | M::PerCpuLruHashMap(d) | M::RingBuf(d) => d,
        _ => return None,
    };
    Some(data.fd().as_fd().as_raw_fd())
}

/// The instructions of program `name` of `object`, relocated against the maps of `ebpf`.
pub fn relocated(object: &[u8], name: &'static str, ebpf: &aya::Ebpf) -> Result<Vec<bpf_insn>, SessionError> {
    let mut obj = Object::parse(object).map_err(|e| SessionError::Object(e.to_string()))?;
    let maps = obj.maps.clone();
    let mut with_fds = Vec::with_capacity(maps.len());
    for (map_name, m) in &maps {
        let fd = ebpf.map(map_name).and_then(map_fd).ok_or_else(|| SessionError::NoMap(map_name.clone()))?;
        with_fds.push((map_name.as_str(), fd, m));
    }
    let text_sections: HashSet<usize> = obj.functions.keys().map(|(section, _)| *section).collect();
    obj.relocate_maps(with_fds.into_iter(), &text_sections).map_err(|e| SessionError::Object(e.to_string()))?;
    obj.relocate_calls(&text_sections).map_err(|e| SessionError::Object(e.to_string()))?;
    let key = obj.programs.get(name).ok_or(SessionError::NoProgram(name))?.function_key();
    Ok(obj.functions.get(&key).ok_or(SessionError::NoProgram(name))?.instructions.clone())
}

/// Rewrites every call of helper `placeholder` into a call of the kernel function `btf_id`
/// (vmlinux BTF); returns how many.
pub fn patch_kfunc_calls(insns: &mut [bpf_insn], placeholder: u32, btf_id: u32) -> usize {
    let mut n = 0;
    for ins in insns.iter_mut() {
        if ins.code == BPF_JMP_CALL && ins.src_reg() == 0 && ins.imm as u32 == placeholder {
            ins.set_src_reg(BPF_PSEUDO_KFUNC_CALL);
            ins.imm = btf_id as i32;
            ins.off = 0; // vmlinux
            n += 1;
        }
    }
    n
}

/// The BTF id of the kfunc in the running kernel.
pub fn kfunc_id(btf: &aya::Btf) -> Result<u32, SessionError> {
    btf.id_by_type_name_kind(KFUNC_IS_RETURN, BtfKind::Func).map_err(|_| SessionError::NoKfunc)
}

/// How a [`MultiProgram`] runs at the points of its link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MultiKind {
    /// At the functions' entries.
    Entry,
    /// At the functions' returns.
    Return,
    /// At entries, and at returns unless the entry returned 1 (Linux 6.13+).
    Session,
}

impl MultiKind {
    fn attach_type(self) -> u32 {
        if self == MultiKind::Session {
            BPF_TRACE_UPROBE_SESSION
        } else {
            BPF_TRACE_UPROBE_MULTI
        }
    }
}

/// A program loaded for uprobe-multi links.
#[derive(Debug)]
pub struct MultiProgram {
    fd: OwnedFd,
    kind: MultiKind,
}

impl MultiProgram {
    /// Loads program `name` of `object` (maps from `ebpf`) for links of `kind`; a session
    /// program's placeholder call becomes the kfunc (from `btf`).
    pub fn load(object: &[u8], name: &'static str, kind: MultiKind, ebpf: &aya::Ebpf, btf: Option<&aya::Btf>) -> Result<MultiProgram, SessionError> {
        let mut insns = relocated(object, name, ebpf)?;
        if kind == MultiKind::Session {
            let id = kfunc_id(btf.ok_or(SessionError::NoKfunc)?)?;
            if patch_kfunc_calls(&mut insns, agent_common::SESSION_IS_RETURN_PLACEHOLDER, id) == 0 {
                return Err(SessionError::NoPlaceholder);
            }
        }
        let license = CString::new(LICENSE).unwrap_or_default();
        let mut attr = ProgLoadAttr {
            prog_type: BPF_PROG_TYPE_KPROBE,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            expected_attach_type: kind.attach_type(),
            ..ProgLoadAttr::default()
        };
        let short = name.as_bytes();
        attr.prog_name[..short.len().min(15)].copy_from_slice(&short[..short.len().min(15)]);
        match bpf(BPF_PROG_LOAD, &mut attr) {
            // SAFETY: a new fd the syscall returned, owned by nobody else.
            Ok(fd) => Ok(MultiProgram { fd: unsafe { OwnedFd::from_raw_fd(fd) }, kind }),
            Err(e) => {
                // Again with the verifier's log, for the error message.
                let mut log = vec![0u8; 1 << 20];
                attr.log_level = 1;
                attr.log_size = log.len() as u32;
                attr.log_buf = log.as_mut_ptr() as u64;
                // SAFETY: a new fd the syscall returned (a load that succeeds this time), closed here.
                let _ = bpf(BPF_PROG_LOAD, &mut attr).map(|fd| drop(unsafe { OwnedFd::from_raw_fd(fd) }));
                let text = String::from_utf8_lossy(&log[..log.iter().position(|b| *b == 0).unwrap_or(0)]).into_owned();
                let tail: String = text.lines().rev().take(4).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join(" | ");
                Err(SessionError::Load(format!("{e}: {tail}")))
            }
        }
    }

    /// Attaches the program at `points` (file offset, cookie) of `target` for every process:
    /// one link; closing it detaches every point (in one grace period).
    pub fn attach(&self, target: &Path, points: &[(u64, u64)]) -> std::io::Result<OwnedFd> {
        use std::os::unix::ffi::OsStrExt;
        let path = CString::new(target.as_os_str().as_bytes()).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        let offsets: Vec<u64> = points.iter().map(|p| p.0).collect();
        let cookies: Vec<u64> = points.iter().map(|p| p.1).collect();
        let mut attr = LinkCreateAttr {
            prog_fd: self.fd.as_raw_fd() as u32,
            attach_type: self.kind.attach_type(),
            multi_flags: if self.kind == MultiKind::Return { BPF_F_UPROBE_MULTI_RETURN } else { 0 },
            path: path.as_ptr() as u64,
            offsets: offsets.as_ptr() as u64,
            cookies: cookies.as_ptr() as u64,
            cnt: points.len() as u32,
            ..LinkCreateAttr::default()
        };
        let fd = bpf(BPF_LINK_CREATE, &mut attr)?;
        // SAFETY: a new fd the syscall returned, owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

#[cfg(test)]
mod tests {
    use aya_obj::generated::bpf_insn;

    use super::{patch_kfunc_calls, BPF_JMP_CALL, BPF_PSEUDO_KFUNC_CALL};

    fn call(imm: i32, src: u8) -> bpf_insn {
        // SAFETY: bpf_insn is plain data; all-zero is a valid value.
        let mut i: bpf_insn = unsafe { std::mem::zeroed() };
        i.code = BPF_JMP_CALL;
        i.imm = imm;
        i.set_src_reg(src);
        i
    }

    #[test]
    fn only_calls_of_the_placeholder_become_kfunc_calls() {
        let placeholder = agent_common::SESSION_IS_RETURN_PLACEHOLDER;
        // A helper call (bpf_ktime_get_ns = 5), the placeholder, a bpf-to-bpf call (src 1)
        // whose offset happens to equal the placeholder, and a non-call with that immediate.
        let mut insns = vec![call(5, 0), call(placeholder as i32, 0), call(placeholder as i32, 1), call(placeholder as i32, 0)];
        insns[3].code = 0xb7; // mov r0, imm
        assert_eq!(patch_kfunc_calls(&mut insns, placeholder, 61234), 1);
        assert_eq!((insns[1].src_reg(), insns[1].imm, insns[1].off), (BPF_PSEUDO_KFUNC_CALL, 61234, 0));
        assert_eq!((insns[0].src_reg(), insns[0].imm), (0, 5));
        assert_eq!((insns[2].src_reg(), insns[2].imm), (1, placeholder as i32));
        assert_eq!(insns[3].imm, placeholder as i32);
    }
}
