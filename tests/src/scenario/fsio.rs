//! Writing the rendered tree: atomic per file (temp + rename), only what changed, removals
//! before additions for vanishing devices and class links last for appearing ones, so a
//! reader never sees a half-written value nor a class link to a half-built device.

use std::{
    collections::BTreeMap,
    io,
    path::{Path, PathBuf},
};

/// One entry of a sysfs-like tree (directories are implied by their contents).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    File(String),
    /// A symlink with this (relative) target.
    Link(String),
}

/// Marker at the root of every tree the writer owns; the CLI only ever deletes a tree that has it.
pub const MARKER: &str = ".stepwise-scenario";
/// Where temp files are made before being renamed into place (same filesystem).
const TMP_DIR: &str = ".scenario-tmp";

/// Every file and symlink under `root` (symlinks not followed), by path relative to `root`.
/// Directories appear only through their contents; the temp directory is skipped.
pub fn snapshot(root: &Path) -> io::Result<BTreeMap<String, Entry>> {
    let mut out = BTreeMap::new();
    let mut stack: Vec<PathBuf> = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            let p = e.path();
            let rel = p.strip_prefix(root).map_err(io::Error::other)?.to_string_lossy().into_owned();
            if rel == TMP_DIR {
                continue;
            }
            let ft = e.file_type()?;
            if ft.is_symlink() {
                out.insert(rel, Entry::Link(std::fs::read_link(&p)?.to_string_lossy().into_owned()));
            } else if ft.is_dir() {
                stack.push(p);
            } else {
                out.insert(rel, Entry::File(String::from_utf8_lossy(&std::fs::read(&p)?).into_owned()));
            }
        }
    }
    Ok(out)
}

/// Applies successive renderings of a tree to disk.
#[derive(Debug)]
pub(crate) struct Writer {
    root: PathBuf,
    written: BTreeMap<String, Entry>,
    seq: u64,
}

/// Class and bus links are what a reader enumerates: remove them first, add them last.
fn is_index_link(rel: &str) -> bool {
    rel.starts_with("class/") || rel.starts_with("bus/")
}

impl Writer {
    pub(crate) fn new(root: PathBuf) -> Self {
        Writer { root, written: BTreeMap::new(), seq: 0 }
    }

    /// Brings the tree on disk to `desired`; returns how many entries were written or removed.
    pub(crate) fn apply(&mut self, desired: &BTreeMap<String, Entry>) -> io::Result<usize> {
        let mut removed: Vec<String> = self.written.keys().filter(|k| !desired.contains_key(*k)).cloned().collect();
        removed.sort_by_key(|k| (!is_index_link(k), std::cmp::Reverse(k.matches('/').count())));
        for rel in &removed {
            let p = self.root.join(rel);
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            self.written.remove(rel);
            self.prune(&p);
        }
        let mut changed: Vec<(&String, &Entry)> = desired.iter().filter(|(k, v)| self.written.get(*k) != Some(*v)).collect();
        changed.sort_by_key(|(k, _)| is_index_link(k));
        let n = removed.len() + changed.len();
        if !changed.is_empty() {
            let tmp = self.root.join(TMP_DIR);
            std::fs::create_dir_all(&tmp)?;
            for (rel, entry) in changed {
                self.put(&tmp, rel, entry)?;
                self.written.insert(rel.clone(), entry.clone());
            }
            std::fs::remove_dir_all(&tmp)?;
        }
        Ok(n)
    }

    fn put(&mut self, tmp: &Path, rel: &str, entry: &Entry) -> io::Result<()> {
        let target = self.root.join(rel);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        self.seq += 1;
        let t = tmp.join(self.seq.to_string());
        match entry {
            Entry::File(s) => std::fs::write(&t, s)?,
            Entry::Link(to) => std::os::unix::fs::symlink(to, &t)?,
        }
        // rename() replaces a file or symlink atomically, but not a directory.
        if std::fs::symlink_metadata(&target).is_ok_and(|m| m.is_dir()) {
            std::fs::remove_dir_all(&target)?;
        }
        std::fs::rename(&t, &target)
    }

    /// Removes directories left empty by a removal, up to the root.
    fn prune(&self, removed: &Path) {
        let mut dir = removed.parent();
        while let Some(d) = dir {
            if d == self.root || !d.starts_with(&self.root) || std::fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_writes_changes_removes_and_prunes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("sys");
        let mut w = Writer::new(root.clone());
        let mut d = BTreeMap::new();
        d.insert("a/b/c".to_string(), Entry::File("1\n".into()));
        d.insert("a/x".to_string(), Entry::File("2".into()));
        d.insert("class/l".to_string(), Entry::Link("../a/b".into()));
        assert_eq!(w.apply(&d).expect("apply"), 3);
        assert_eq!(snapshot(&root).expect("snap"), d);
        assert_eq!(w.apply(&d).expect("apply"), 0, "nothing changed, nothing written");
        d.insert("a/b/c".to_string(), Entry::Link("gone".into()));
        d.remove("a/x");
        assert_eq!(w.apply(&d).expect("apply"), 2);
        assert_eq!(snapshot(&root).expect("snap"), d);
        assert!(std::fs::read_to_string(root.join("a/b/c")).is_err(), "dangling link cannot be read");
        d.remove("a/b/c");
        w.apply(&d).expect("apply");
        assert!(!root.join("a").exists(), "empty directories are pruned");
        assert!(!root.join(TMP_DIR).exists());
    }
}
