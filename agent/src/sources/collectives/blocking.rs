//! One probe hit per asynchronous NCCL call. NCCL collectives and point-to-point calls only
//! enqueue their work and return (microseconds), so their return says nothing the entry did
//! not: their probes attach the entry program alone, for every process. A process whose
//! calls block until done (`CUDA_LAUNCH_BLOCKING=1`, on the environment allowlist) gets the
//! return program too, attached for that process only when it is first seen, and its calls
//! are timed from entry to return from then on ([`CallDecoder::returns_from`]).
//!
//! [`CallDecoder::returns_from`]: super::decode::CallDecoder::returns_from

use tracing::{debug, warn};

use super::{mono_ns, procs, procs::FileKey, Collectives};

impl Collectives {
    /// Attaches the entry-only probes' returns for `pid` in the files it maps, when its calls
    /// block (once per process and file).
    pub(super) fn blocking_returns(&mut self, pid: u32, keys: &[FileKey]) {
        if !self.procs.get(&pid).is_some_and(|p| procs::launch_blocking(&p.env)) {
            return;
        }
        let mut attached = false;
        for key in keys {
            let Some(a) = self.attached.get(key) else { continue };
            if a.returns.is_empty() || a.pid_returns.contains_key(&pid) {
                continue;
            }
            let (path, returns) = (a.path.clone(), a.returns.clone());
            let mut links = Vec::with_capacity(returns.len());
            for (off, cookie, sym) in &returns {
                match self.probes.attach_return_offset_for(&path, *off, sym, *cookie, pid) {
                    Ok(l) => links.extend(l),
                    Err(e) => {
                        warn!(pid, "{e}");
                        self.metrics.decode_error("attach");
                    }
                }
            }
            debug!(pid, library = %path.display(), returns = links.len(), "return probes for a blocking process");
            if let Some(a) = self.attached.get_mut(key) {
                a.pid_returns.insert(pid, links);
                attached = true;
            }
        }
        if attached {
            // Entries from now on have their return probe in place.
            self.decoder.returns_from(pid, mono_ns());
        }
    }

    /// Detaches an exited process's return probes.
    pub(super) fn drop_returns(&mut self, pid: u32) {
        let links: Vec<_> = self.attached.values_mut().filter_map(|a| a.pid_returns.remove(&pid)).flatten().collect();
        for l in links {
            self.probes.detach(l);
        }
    }
}
