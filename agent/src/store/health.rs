//! Whether the history store works, for `/api/v1/status` (`store`) and `/metrics`
//! (`stepwise_store_up`, `stepwise_store_errors_total`): an unusable store no longer leaves
//! the agent looking healthy while nothing is kept.

use crate::export::reference::RegisterSampled as _;
use std::{
    path::Path,
    sync::{Arc, Mutex},
};

use prometheus_client::{
    metrics::{counter::Counter, gauge::Gauge},
    registry::Registry,
};

use super::Store;

#[derive(Debug, Default)]
struct State {
    enabled: bool,
    path: String,
    up: bool,
    /// The last failure (open, write or retention), kept after a later success.
    error: Option<String>,
}

/// Shared by the sampler (which writes the store) and the status it publishes.
#[derive(Clone, Debug, Default)]
pub struct Health {
    up: Gauge,
    errors: Counter,
    reopened: Counter,
    state: Arc<Mutex<State>>,
}

impl Health {
    pub fn register(registry: &mut Registry) -> Health {
        let h = Health::default();
        registry.register_sampled(
            "stepwise_store_up",
            "1 while the history store is open and its last write succeeded; 0 when unusable or disabled",
            h.up.clone(),
        );
        registry.register_sampled("stepwise_store_errors", "History store failures (open, write, retention)", h.errors.clone());
        registry.register_sampled("stepwise_store_reopened", "History store files found deleted or replaced while open, and reopened", h.reopened.clone());
        h
    }

    fn with(&self, f: impl FnOnce(&mut State)) {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g);
        self.up.set(i64::from(g.up));
    }

    /// A write or retention pass succeeded.
    pub fn ok(&self) {
        self.with(|s| s.up = true);
    }

    /// Something failed: counted, `up` 0 until the next success.
    pub fn failed(&self, e: &dyn std::fmt::Display) {
        self.errors.inc();
        let msg = e.to_string();
        self.with(|s| {
            s.up = false;
            s.error = Some(msg);
        });
    }

    /// The file was found deleted or replaced (`why`) and reopened: counted, and kept as the
    /// last error (`up` stays 1: the reopened store works).
    fn reopened(&self, why: &str) {
        self.reopened.inc();
        let msg = why.to_string();
        self.with(|s| s.error = Some(msg));
    }

    /// The `store` object of `/api/v1/status`.
    pub fn json(&self) -> serde_json::Value {
        let g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        serde_json::json!({"enabled": g.enabled, "path": g.path, "up": g.up, "errors": self.errors.get(), "reopened": self.reopened.get(), "error": g.error})
    }
}

/// Opens the store for the daemon (its directory is created 0750 by [`Store::open`]); a
/// failure is logged, counted and shown, and the agent runs without history.
pub fn open(enabled: bool, path: &Path, health: &Health) -> Option<Store> {
    health.with(|s| {
        s.enabled = enabled;
        s.path = path.display().to_string();
    });
    if !enabled {
        return None;
    }
    match Store::open(path) {
        Ok(s) => {
            tracing::info!(path = %path.display(), "history store open");
            health.ok();
            Some(s)
        }
        Err(e) => {
            tracing::warn!("{e}; running without history (`agent diagnose --agent` still works)");
            health.failed(&e);
            None
        }
    }
}

/// Keeps the daemon's store on the file its path names: when the file was deleted or replaced
/// while open (writes since went to an unlinked inode nobody reads), logs it and reopens the
/// path, which recreates the schema; counted in `stepwise_store_reopened_total` and shown as
/// the store's last error. A reopen that fails is a store failure (`up` 0), retried at the
/// next check; meanwhile writes go on into the old file.
pub fn keep_open(store: &mut Store, health: &Health) {
    let Some(why) = store.lost() else { return };
    match Store::open(store.path()) {
        Ok(fresh) => {
            tracing::warn!("history store: {why}; reopened it (steps written since the loss, and the history before it, are gone)");
            *store = fresh;
            health.reopened(&why);
        }
        Err(e) => {
            tracing::warn!("history store: {why}; cannot reopen it: {e}");
            health.failed(&format!("{why}; cannot reopen it: {e}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unusable_store_is_visible_in_status_and_metrics() {
        let dir = tempfile::tempdir().expect("tmp");
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, "x").expect("write");
        let mut reg = Registry::default();
        let h = Health::register(&mut reg);
        assert!(open(true, &file.join("agent.db"), &h).is_none());
        let v = h.json();
        assert_eq!((v["enabled"].as_bool(), v["up"].as_bool(), v["errors"].as_u64()), (Some(true), Some(false), Some(1)), "{v}");
        assert!(v["error"].as_str().is_some_and(|e| e.contains("not-a-dir")), "{v}");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).expect("encode");
        assert!(text.contains("stepwise_store_up 0") && text.contains("stepwise_store_errors_total 1"), "{text}");
    }

    fn steps(s: &Store) -> i64 {
        s.fuzzing_connection().query_row("SELECT count(*) FROM steps", [], |r| r.get(0)).expect("count")
    }

    #[test]
    fn a_store_deleted_or_replaced_while_open_is_reopened_and_counted() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("agent.db");
        let mut reg = Registry::default();
        let h = Health::register(&mut reg);
        let mut s = open(true, &path, &h).expect("store");
        keep_open(&mut s, &h);
        assert_eq!(h.json()["reopened"], 0, "an intact store is kept");
        for f in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{f}", path.display()));
        }
        assert!(s.lost().is_some_and(|w| w.contains("deleted")), "{:?}", s.lost());
        keep_open(&mut s, &h);
        assert!(s.lost().is_none() && path.exists(), "reopened: the path names the open file again");
        assert_eq!(steps(&s), 0, "the schema is recreated");
        let v = h.json();
        assert_eq!((v["up"].as_bool(), v["reopened"].as_u64()), (Some(true), Some(1)), "{v}");
        assert!(v["error"].as_str().is_some_and(|e| e.contains("deleted while open")), "{v}");
        // Replaced by another file (a restore, a move): the new file is the one written.
        drop(Store::open(dir.path().join("other.db")).expect("other"));
        std::fs::rename(dir.path().join("other.db"), &path).expect("rename");
        assert!(s.lost().is_some_and(|w| w.contains("replaced")), "{:?}", s.lost());
        keep_open(&mut s, &h);
        assert!(s.lost().is_none());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).expect("encode");
        assert!(text.contains("stepwise_store_reopened_total 2"), "{text}");
    }

    #[test]
    fn a_fifo_at_the_store_path_is_refused_not_opened() {
        let dir = tempfile::tempdir().expect("tmp");
        let fifo = dir.path().join("agent.db");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
        let h = Health::default();
        // SQLite would block in its first read of the header here.
        assert!(open(true, &fifo, &h).is_none());
        assert!(h.json()["error"].as_str().is_some_and(|e| e.contains("not a regular file")), "{}", h.json());
        assert!(matches!(Store::open(dir.path()), Err(crate::store::StoreError::NotAFile { .. })), "a directory");
    }

    #[test]
    fn the_daemon_creates_the_store_directory_0750_whatever_the_umask() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tmp");
        let h = Health::default();
        // SAFETY: umask only changes this process's file creation mask.
        let old = unsafe { libc::umask(0o022) };
        let s = open(true, &dir.path().join("var/lib/stepwise/agent.db"), &h);
        // SAFETY: as above, restoring the previous mask.
        unsafe { libc::umask(old) };
        assert!(s.is_some());
        let mode = std::fs::metadata(dir.path().join("var/lib/stepwise")).expect("dir").permissions().mode() & 0o777;
        assert_eq!(mode, 0o750);
        assert_eq!(h.json()["up"], true);
        assert!(open(false, &dir.path().join("x.db"), &h).is_none());
        assert_eq!(h.json()["enabled"], false);
    }
}
