//! Claiming the path of a Unix datagram socket the agent listens on (the marker socket, the
//! NCCL profiler plugin's socket): a stale socket file left by a dead agent is replaced, but a
//! socket another live process listens on is never taken — unlinking it would leave that
//! listener bound to a name nobody can reach any more, its senders lost for good.

use std::{os::unix::net::UnixDatagram, path::Path};

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

#[cfg(test)]
mod tests {
    use super::*;

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
