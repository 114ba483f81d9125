//! The step-marker socket: a Unix datagram socket the training job sends markers to, each
//! stamped by the kernel when it was sent (SO_TIMESTAMPNS) and named by its sending process
//! (SO_PASSCRED), parsed and handed to the engine.

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
    use std::os::fd::AsRawFd;
    let fd = sock.as_raw_fd();
    if let Err(e) = crate::sources::sockpath::set_flag(fd, libc::SO_TIMESTAMPNS) {
        warn!("marker socket: no kernel timestamps ({e}); markers are stamped on receipt");
    }
    // The kernel names each marker's sending process: admission holds each to its share of
    // the ranks (a flooding process cannot lock a job's ranks out).
    if let Err(e) = crate::sources::sockpath::set_flag(fd, libc::SO_PASSCRED) {
        warn!("marker socket: no sender credentials ({e}); ranks are admitted without a per-process share");
    }
    info!(path = %path.display(), "listening for step markers");
    tokio::spawn(async move {
        let mut buf = vec![0u8; crate::timeline::markers::MAX_MARKER_BYTES + 1];
        loop {
            if sock.readable().await.is_err() {
                continue;
            }
            // MSG_DONTWAIT because readiness is handled by tokio.
            let got = match sock.try_io(tokio::io::Interest::READABLE, || crate::sources::sockpath::recv(fd, &mut buf, libc::MSG_DONTWAIT)) {
                Ok(r) => r,
                Err(_) => continue, // WouldBlock: readiness was spurious
            };
            let now = got.sent.unwrap_or_else(crate::engine::wall_now);
            let mut e = match engine.lock() {
                Ok(e) => e,
                Err(p) => p.into_inner(),
            };
            match crate::timeline::Marker::parse(&buf[..got.len], now) {
                Ok(m) => e.add_marker_from(m, got.peer.map(|p| p.pid).filter(|p| *p != 0)),
                Err(err) => {
                    e.marker_error();
                    tracing::debug!("marker refused: {err}");
                }
            }
        }
    })
}
