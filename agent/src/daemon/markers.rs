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
/// socket the stamp is taken in the sender's `sendmsg`).
fn enable_send_timestamps(sock: &tokio::net::UnixDatagram) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    crate::sources::sockpath::set_flag(sock.as_raw_fd(), libc::SO_TIMESTAMPNS)
}

/// One datagram into `buf` with its `SCM_TIMESTAMPNS` send time (wall-clock seconds), if any.
fn recv_stamped(sock: &tokio::net::UnixDatagram, buf: &mut [u8]) -> std::io::Result<(usize, Option<f64>)> {
    use std::os::fd::AsRawFd;
    // MSG_DONTWAIT because readiness is handled by tokio.
    let got = crate::sources::sockpath::recv(sock.as_raw_fd(), buf, libc::MSG_DONTWAIT)?;
    Ok((got.len, got.sent))
}
