//! The step-marker socket: a Unix datagram socket the training job sends markers to, each
//! stamped by the kernel when it was sent (SO_TIMESTAMPNS), parsed and handed to the engine.

use std::sync::{Arc, Mutex};

use tracing::{info, warn};

use crate::engine::Engine;

/// Binds the marker socket (mode 0660, so only the socket's group — the training job's — can
/// send). A socket another live agent listens on is an error: the start fails rather than
/// take it (that agent would lose its markers for good). Any other failure to bind is logged
/// (`None`); markers can still be POSTed to the API.
pub fn bind(path: &std::path::Path) -> Result<Option<tokio::net::UnixDatagram>, String> {
    use std::os::unix::fs::PermissionsExt;
    if let Err(e) = crate::sources::sockpath::claim(path) {
        if crate::sources::sockpath::listening(path) {
            return Err(e);
        }
        warn!("marker socket: {e}");
    }
    match tokio::net::UnixDatagram::bind(path) {
        Ok(s) => {
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660));
            Ok(Some(s))
        }
        Err(e) => {
            warn!(path = %path.display(), "cannot bind the marker socket: {e}; markers can still be POSTed to /api/v1/markers");
            Ok(None)
        }
    }
}

/// Listens for step markers on the socket [`bind`] made.
pub fn start(path: &std::path::Path, sock: tokio::net::UnixDatagram, engine: Arc<Mutex<Engine>>) -> tokio::task::JoinHandle<()> {
    // The kernel stamps each datagram when the training process sends it: a marker's time
    // does not depend on when this task gets the CPU or the engine lock (an attribution
    // tick holds it for milliseconds), which would move step boundaries.
    let stamped = enable_send_timestamps(&sock);
    if let Err(e) = &stamped {
        warn!("marker socket: no kernel timestamps ({e}); markers are stamped on receipt");
    }
    info!(path = %path.display(), "listening for step markers");
    tokio::spawn(async move {
        let mut buf = vec![0u8; crate::timeline::markers::MAX_MARKER_BYTES + 1];
        loop {
            let (n, sent) = if stamped.is_ok() {
                if sock.readable().await.is_err() {
                    continue;
                }
                match sock.try_io(tokio::io::Interest::READABLE, || recv_stamped(&sock, &mut buf)) {
                    Ok(r) => r,
                    Err(_) => continue, // WouldBlock: readiness was spurious
                }
            } else {
                let Ok(n) = sock.recv(&mut buf).await else { continue };
                (n, None)
            };
            let now = sent.unwrap_or_else(crate::engine::wall_now);
            let mut e = match engine.lock() {
                Ok(e) => e,
                Err(p) => p.into_inner(),
            };
            match crate::timeline::Marker::parse(&buf[..n], now) {
                Ok(m) => e.add_marker(m),
                Err(err) => {
                    e.marker_error();
                    tracing::debug!("marker refused: {err}");
                }
            }
        }
    })
}

/// Asks the kernel to timestamp datagrams on `sock` (`SO_TIMESTAMPNS`; for a Unix datagram
/// socket the stamp is taken in the sender's `sendmsg`). Hand code: neither tokio nor std
/// exposes socket options or control messages, and this is the only place that needs them.
fn enable_send_timestamps(sock: &tokio::net::UnixDatagram) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: valid fd, option value of the documented type and size.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// One datagram into `buf` with its `SCM_TIMESTAMPNS` send time (wall-clock seconds), if any.
fn recv_stamped(sock: &tokio::net::UnixDatagram, buf: &mut [u8]) -> std::io::Result<(usize, Option<f64>)> {
    use std::os::fd::AsRawFd;
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // Room for one timespec control message (and alignment).
    let mut control = [0u64; 8];
    // SAFETY: a zeroed msghdr is valid; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: valid fd and msghdr; MSG_DONTWAIT because readiness is handled by tokio.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut sent = None;
    // SAFETY: walking the control buffer the kernel filled, with the libc CMSG macros.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                sent = Some(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9).filter(|t| *t > 0.0);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, sent))
}
