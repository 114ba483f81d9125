//! Claiming the path of a Unix datagram socket the agent listens on (the marker socket, the
//! NCCL profiler plugin's socket): a stale socket file left by a dead agent is replaced, but a
//! socket another live process listens on is never taken — unlinking it would leave that
//! listener bound to a name nobody can reach any more, its senders lost for good. And
//! reading them with what the kernel says of each datagram: when it was sent
//! (`SCM_TIMESTAMPNS`) and by which process (`SCM_CREDENTIALS`), which a sender cannot forge.

use std::{
    os::{fd::RawFd, unix::net::UnixDatagram},
    path::Path,
};

/// Makes `path` free to bind: creates its directory and removes a stale socket file. An error
/// when a live listener answers on it (another agent), or when the directory or the stale
/// file cannot be handled.
pub fn claim(path: &Path) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    if std::fs::symlink_metadata(path).is_ok() {
        if listening(path) {
            return Err(format!("{} is in use by another listener (another agent?)", path.display()));
        }
        std::fs::remove_file(path).map_err(|e| format!("cannot remove the stale {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Whether a live process listens on the datagram socket at `path` (a connect succeeds only
/// while the socket is bound by a live process).
pub fn listening(path: &Path) -> bool {
    path.exists() && UnixDatagram::unbound().and_then(|s| s.connect(path)).is_ok()
}

/// The sending process of a datagram as the kernel saw it (`SCM_CREDENTIALS`), in the
/// agent's pid namespace: `pid` 0 when the sender's process is not visible from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    pub pid: u32,
    pub uid: u32,
}

/// One datagram's length and what the kernel attached to it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Received {
    pub len: usize,
    /// Wall-clock send time (seconds), with `SO_TIMESTAMPNS` on.
    pub sent: Option<f64>,
    /// The sender, with `SO_PASSCRED` on.
    pub peer: Option<Peer>,
}

/// Sets a boolean `SOL_SOCKET` option (`SO_TIMESTAMPNS`, `SO_PASSCRED`). Hand code: neither
/// tokio nor std exposes socket options or control messages.
pub fn set_flag(fd: RawFd, option: libc::c_int) -> std::io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: valid fd, option value of the documented type and size.
    let r =
        unsafe { libc::setsockopt(fd, libc::SOL_SOCKET, option, (&on as *const libc::c_int).cast(), std::mem::size_of::<libc::c_int>() as libc::socklen_t) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// One datagram into `buf` (`recvmsg` with `flags`), with its send time and sender when the
/// socket has the options on.
pub fn recv(fd: RawFd, buf: &mut [u8], flags: libc::c_int) -> std::io::Result<Received> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // Room for a timespec and a ucred control message (and alignment).
    let mut control = [0u64; 16];
    // SAFETY: a zeroed msghdr is valid; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: valid fd and msghdr.
    let n = unsafe { libc::recvmsg(fd, &mut msg, flags) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut got = Received { len: n as usize, ..Default::default() };
    // SAFETY: walking the control buffer the kernel filled, with the libc CMSG macros.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                got.sent = Some(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9).filter(|t| *t > 0.0);
            } else if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_CREDENTIALS {
                let cr: libc::ucred = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                got.peer = Some(Peer { pid: u32::try_from(cr.pid).unwrap_or(0), uid: cr.uid });
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn the_kernel_names_the_sender_whatever_the_datagram_says() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("c.sock");
        let rx = UnixDatagram::bind(&path).expect("bind");
        set_flag(rx.as_raw_fd(), libc::SO_PASSCRED).expect("passcred");
        UnixDatagram::unbound().expect("tx").send_to(b"pid 1", &path).expect("send");
        let mut buf = [0u8; 16];
        let got = recv(rx.as_raw_fd(), &mut buf, 0).expect("recv");
        assert_eq!(&buf[..got.len], b"pid 1");
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        assert_eq!(got.peer, Some(Peer { pid: std::process::id(), uid }));
    }

    #[test]
    fn a_live_listener_is_refused_and_a_stale_socket_replaced() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("sub/x.sock");
        claim(&path).expect("a free path");
        let live = UnixDatagram::bind(&path).expect("bind");
        let err = claim(&path).expect_err("a live listener is kept");
        assert!(err.contains("in use"), "{err}");
        assert!(path.exists(), "the live listener's name is still there");
        drop(live);
        assert!(!listening(&path));
        claim(&path).expect("a stale socket is replaced");
        assert!(!path.exists());
    }
}
