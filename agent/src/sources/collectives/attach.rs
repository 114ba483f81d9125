//! Attaching the probes of one library: entry and return programs (two uprobe-multi links per
//! library), the session program for asynchronous NCCL calls (one more), and the sampled
//! probes of hot internal functions, attached only in windows (two links a window). A
//! library's probes detach in one grace period per link, so shutdown and the last user's exit
//! do not grow with the number of probes; a kernel without uprobe-multi links gets one
//! perf-event uprobe per program and probe.

use std::{collections::HashSet, path::Path};

use tracing::{debug, info, warn};

use super::{
    decode::ProbeInfo,
    elf::{ElfError, SymbolTable},
    procs::FileKey,
    targets::{Family, ProbeSpec, OMPI_COMM_NULL, OMPI_COMM_WORLD, OMPI_DATATYPES},
    Attachment, Collectives,
};
use crate::ebpf::AttachedLink;

impl Collectives {
    pub(super) fn attach_library(&mut self, ti: usize, path: &Path, key: FileKey) {
        let target = self.targets[ti].clone();
        let mut wanted: Vec<&str> = target.probes.iter().flat_map(|p| p.symbols.iter().map(String::as_str)).collect();
        if target.family == Family::Mpi {
            wanted.extend(OMPI_DATATYPES.iter().map(|(n, _)| *n));
            wanted.extend([OMPI_COMM_WORLD, OMPI_COMM_NULL]);
        }
        let symbols = match SymbolTable::read(path, &wanted) {
            Ok(s) => s,
            Err(e @ ElfError::ForeignArch { .. }) => {
                debug!("{e}");
                return;
            }
            Err(e) => {
                warn!("{e}");
                self.metrics.decode_error("elf");
                return;
            }
        };
        let mut links = Vec::new();
        let mut sampled = Vec::new();
        let mut probe_ids = Vec::new();
        let mut seen_offsets: HashSet<u64> = HashSet::new();
        let mut missing = Vec::new();
        let (mut session, mut pairs) = (Vec::new(), Vec::new());
        for spec in &target.probes {
            let Some((sym, off)) = spec.symbols.iter().find_map(|s| symbols.offset(s).map(|o| (s.clone(), o))) else {
                if !spec.optional {
                    missing.push(spec.symbols[0].clone());
                }
                continue;
            };
            if !seen_offsets.insert(off) {
                continue; // an alias of a symbol already attached
            }
            let id = self.next_probe_id;
            self.next_probe_id += 1;
            probe_ids.push(id);
            self.decoder.register(id, ProbeInfo { family: spec.family, op: spec.op, decoder: spec.decoder, user_op: spec.user_op.clone() });
            let cookie = probe_cookie(id, spec);
            if spec.sampled {
                sampled.push((off, cookie, sym));
                continue;
            }
            if spec.entry_only_async && self.probes.session_unavailable().is_none() {
                session.push((off, cookie, sym));
                continue;
            }
            pairs.push((off, cookie, sym));
        }
        let attached_probes = self.attach_points(path, &pairs, &mut links) + self.attach_session(path, &session, &mut links);
        if !missing.is_empty() {
            warn!(library = %path.display(), "symbols not found: {}", missing.join(", "));
        }
        info!(library = %path.display(), family = target.family.as_str(), probes = attached_probes, session = session.len(), sampled = sampled.len(), "attached");
        debug!(?key, "attachment key");
        self.attached.insert(
            key,
            Attachment {
                target: ti,
                path: path.to_path_buf(),
                links,
                sampled,
                sampled_links: Vec::new(),
                users: HashSet::new(),
                symbols,
                pinned: false,
                probe_ids,
                attached_probes,
            },
        );
    }

    /// Attaches the session program at the asynchronous calls' `points` (file offset,
    /// cookie, symbol) of one library, in one link; on failure, entry and return programs
    /// at each. Returns the probes attached.
    fn attach_session(&mut self, path: &Path, points: &[(u64, u64, String)], links: &mut Vec<AttachedLink>) -> usize {
        self.attach_linked(path, points, links, |p, path, offsets, what| {
            p.attach_session(path, offsets, what).map(|l| vec![l]).map_err(|e| warn!("{e}; attaching entry and return programs instead"))
        })
    }

    /// At shutdown: hands every link to the detacher and waits (up to 3 s) until they are
    /// closed — links left open would be closed by the process's exit, one after another.
    pub(super) fn detach_all(&mut self) {
        self.end_drain(true);
        let links: Vec<AttachedLink> = self.attached.values_mut().flat_map(|a| std::mem::take(&mut a.links)).collect();
        for l in links {
            self.probes.detach(l);
        }
        let left = crate::ebpf::wait_detached(std::time::Duration::from_secs(3));
        if left > 0 {
            warn!(links = left, "probe links still closing at shutdown");
        }
    }

    /// Attaches the entry and return programs at `points` (file offset, cookie, symbol) of
    /// one library: two uprobe-multi links, or on failure a pair of perf-event uprobes at
    /// each. Returns the probes attached.
    fn attach_points(&mut self, path: &Path, points: &[(u64, u64, String)], links: &mut Vec<AttachedLink>) -> usize {
        self.attach_linked(path, points, links, |p, path, offsets, what| {
            p.attach_multi(path, offsets, what).map_err(|e| debug!("{e}; attaching one uprobe per program and probe instead"))
        })
    }

    /// Links `points` with `link` (uprobe-multi links; it logs its own failure), or on
    /// failure attaches entry and return perf-event uprobes at each. Returns the probes
    /// attached.
    fn attach_linked(
        &mut self,
        path: &Path,
        points: &[(u64, u64, String)],
        links: &mut Vec<AttachedLink>,
        link: impl FnOnce(&mut crate::ebpf::Probes, &Path, &[(u64, u64)], &str) -> Result<Vec<AttachedLink>, ()>,
    ) -> usize {
        if points.is_empty() {
            return 0;
        }
        let offsets: Vec<(u64, u64)> = points.iter().map(|(o, c, _)| (*o, *c)).collect();
        let what = points.iter().map(|p| p.2.as_str()).collect::<Vec<_>>().join(",");
        if let Ok(l) = link(&mut self.probes, path, &offsets, &what) {
            links.extend(l);
            return points.len();
        }
        points.iter().filter(|(off, cookie, sym)| self.attach_pair(path, *off, sym, *cookie, links)).count()
    }

    /// Attaches the entry and return programs at one file offset; a failure is logged and
    /// counted.
    fn attach_pair(&mut self, path: &Path, off: u64, sym: &str, cookie: u64, links: &mut Vec<AttachedLink>) -> bool {
        match self.probes.attach_offset(path, off, sym, cookie) {
            Ok(l) => {
                links.extend(l);
                true
            }
            Err(e) => {
                warn!("{e}");
                self.metrics.decode_error("attach");
                false
            }
        }
    }

    pub(super) fn attach_sampled(&mut self) {
        // The last window's links still being torn down would fire alongside new ones (same
        // probe ids): this window is skipped.
        if crate::ebpf::detaching() > 0 {
            return;
        }
        let keys: Vec<FileKey> = self.attached.keys().copied().collect();
        for k in keys {
            let (path, sampled) = match self.attached.get(&k) {
                Some(a) if !a.sampled.is_empty() => (a.path.clone(), a.sampled.clone()),
                _ => continue,
            };
            let mut links = Vec::new();
            self.attach_points(&path, &sampled, &mut links);
            if let Some(a) = self.attached.get_mut(&k) {
                a.sampled_links.extend(links);
            }
        }
    }
}

/// The uprobe cookie of probe `id`: what the eBPF program captures for `spec` (stack words, the
/// 128-byte blob and where from, the out-pointer, lazy wake-ups).
pub(super) fn probe_cookie(id: u32, spec: &ProbeSpec) -> u64 {
    let mut cookie = agent_common::cookie(id, spec.stack_blob, spec.deref.map(|a| a.deref_index()));
    if let Some(a) = spec.blob_from {
        cookie = agent_common::blob_from_arg(cookie, a);
    }
    if spec.sampled {
        cookie |= agent_common::COOKIE_LAZY_WAKE;
    }
    if spec.reads_stack_args() {
        cookie |= agent_common::COOKIE_STACK_ARGS;
    }
    cookie
}
