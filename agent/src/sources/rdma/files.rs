//! The RDMA source's open-file cache: directories and attribute files stay open between
//! sweeps and each attribute is re-read with one `pread(fd, buf, 0)`.
//!
//! A sysfs attribute runs its `show()` again on every read at offset 0 (seq_file resets at
//! position 0), so a sweep costs one syscall per counter instead of `openat` + `read` +
//! `close`, and no path lookup at all: the lookups were most of a sweep's kernel time.
//!
//! Keeping descriptors means noticing when what they point at is gone or replaced:
//! - on sysfs (`fstatfs` says `SYSFS_MAGIC`), a removed device's attributes fail with
//!   `ENODEV`: the read reports [`ReadError::Stale`] and the caller rebuilds from paths.
//!   Attribute sets only change with the device, so directories are re-listed only every
//!   `relist_every` sweeps (and after a failed read);
//! - elsewhere (test fixtures on ext4/tmpfs, whose writer replaces files by rename), an open
//!   descriptor would keep reading the old inode. A rename, creation or removal in a
//!   directory updates the directory's mtime/ctime, so one `fstat` of each directory per
//!   sweep tells whether anything in it may have been replaced; only then is it re-listed and
//!   the files whose inode number changed are reopened (one `fstat` per directory instead of
//!   one per file: the per-file `fstat` alone would cost as much as the reads). Timestamps are
//!   coarse (a jiffy, or a second on some filesystems), so a change in the same tick as the
//!   stamp seen would be invisible: a stamp younger than [`SETTLE_NS`] is not trusted and the
//!   directory is re-checked every sweep until it is old enough (git's "racily clean" rule).
//!   A removed directory has no links left (`st_nlink == 0`): [`Check::Gone`].
//!
//! Descriptors count against a [`Budget`] below `RLIMIT_NOFILE`; past it files are opened
//! for each read, as before (never a failure), and a port whose directories do not fit is
//! opened for each sweep and closed after it (`port.rs`), so hundreds of ports under a soft
//! limit of 1 024 never take the descriptors the other sources' sockets need.

use std::{
    ffi::{CStr, CString},
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
        unix::ffi::OsStrExt,
    },
    path::Path,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
};

use tracing::{info, warn};

/// `f_type` of sysfs (linux/magic.h).
pub const SYSFS_MAGIC: i64 = 0x6265_6572;
/// A directory stamp at least this old (wall clock) cannot hide a later change.
pub const SETTLE_NS: i128 = 3_000_000_000;
/// Largest attribute read (sysfs attributes are at most a page).
const MAX_ATTR: usize = 1 << 16;

#[derive(Debug)]
struct Shared {
    held: AtomicUsize,
    limit: AtomicUsize,
    /// The soft limit was raised (or could not be) once; no more tries.
    raised: AtomicBool,
    warned: AtomicBool,
}

/// How many descriptors the cache may keep open.
#[derive(Clone, Debug)]
pub struct Budget(Arc<Shared>);

fn nofile() -> Option<libc::rlimit> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `r` is a valid, writable rlimit.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0).then_some(r)
}

/// What the cache may use out of a soft limit: a quarter (at least 256) stays for the rest of
/// the agent (sockets, eBPF maps, the store, other sources).
fn usable(soft: libc::rlim_t) -> usize {
    let soft = usize::try_from(soft).unwrap_or(usize::MAX).min(1 << 24);
    soft.saturating_sub((soft / 4).max(256))
}

impl Budget {
    fn new(limit: usize, may_raise: bool) -> Self {
        Budget(Arc::new(Shared {
            held: AtomicUsize::new(0),
            limit: AtomicUsize::new(limit),
            raised: AtomicBool::new(!may_raise),
            warned: AtomicBool::new(false),
        }))
    }

    /// A budget from `RLIMIT_NOFILE`; the soft limit is raised to the hard one the first time
    /// the budget would be exceeded (only a host with many ports needs it).
    pub fn from_rlimit() -> Self {
        Budget::new(nofile().map(|r| usable(r.rlim_cur)).unwrap_or(768), true)
    }

    /// A fixed budget, never raised (0: every file is opened for each read).
    #[cfg(test)]
    pub fn with_limit(limit: usize) -> Self {
        Budget::new(limit, false)
    }

    /// Descriptors held now.
    pub fn held(&self) -> usize {
        self.0.held.load(Ordering::Relaxed)
    }

    /// More descriptors held than the budget allows (directories are held whatever the budget
    /// while their port is read: the caller closes them after the sweep).
    pub fn over(&self) -> bool {
        self.held() > self.0.limit.load(Ordering::Relaxed)
    }

    fn try_take(&self) -> bool {
        let s = &self.0;
        if s.held.load(Ordering::Relaxed) < s.limit.load(Ordering::Relaxed) || self.raise() {
            s.held.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        if !s.warned.swap(true, Ordering::Relaxed) {
            warn!(held = self.held(), "rdma: open-file budget used up; the remaining counter files are opened for each read");
        }
        false
    }

    /// Raises the soft `RLIMIT_NOFILE` to the hard limit, once. True if the budget grew.
    fn raise(&self) -> bool {
        let s = &self.0;
        if s.raised.swap(true, Ordering::Relaxed) {
            return false;
        }
        let Some(r) = nofile() else { return false };
        if r.rlim_max <= r.rlim_cur {
            return false;
        }
        // An unlimited hard limit cannot be the soft one (the kernel caps it at fs.nr_open,
        // 1 Mi by default).
        let soft = if r.rlim_max == libc::RLIM_INFINITY { 1 << 20 } else { r.rlim_max };
        let new = libc::rlimit { rlim_cur: soft, rlim_max: r.rlim_max };
        // SAFETY: `new` is a valid rlimit; raising the soft limit up to the hard one is allowed.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } != 0 {
            warn!(soft = r.rlim_cur, hard = r.rlim_max, err = %io::Error::last_os_error(), "rdma: cannot raise RLIMIT_NOFILE");
            return false;
        }
        info!(from = r.rlim_cur, to = soft, "rdma: raised the soft RLIMIT_NOFILE to the hard limit to keep counter files open");
        s.limit.store(usable(soft), Ordering::Relaxed);
        s.held.load(Ordering::Relaxed) < s.limit.load(Ordering::Relaxed)
    }

    /// Counts a descriptor that must be held whatever the budget (a directory).
    fn force(&self, fd: OwnedFd) -> Held {
        self.0.held.fetch_add(1, Ordering::Relaxed);
        Held { fd, budget: self.0.clone() }
    }
}

/// A descriptor counted in its [`Budget`].
#[derive(Debug)]
pub struct Held {
    fd: OwnedFd,
    budget: Arc<Shared>,
}

impl Held {
    fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(1, Ordering::Relaxed);
    }
}

fn cstring(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(io::Error::other)
}

/// `openat(dir, name)`; `dir` may be `AT_FDCWD` with an absolute or relative path.
fn open_at(dir: RawFd, name: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: `name` is NUL-terminated and outlives the call; `dir` is open or AT_FDCWD.
    let fd = unsafe { libc::openat(dir, name.as_ptr(), flags | libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOCTTY) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by openat and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `O_NOATIME` is refused (`EPERM`) to a reader that neither owns the file nor holds
/// `CAP_FOWNER`: after the first refusal attributes are opened without it.
static NOATIME_REFUSED: AtomicBool = AtomicBool::new(false);

/// Opens an attribute for reading: non-blocking, and without access-time updates where the
/// kernel allows it. sysfs keeps no access times; on a tmpfs or ext4 tree (fixtures, a
/// container's copy) every read would otherwise update the inode's atime: 13 % of a sweep's
/// CPU on the 16-NIC tmpfs fixture.
fn open_attr(dir: RawFd, name: &CStr) -> io::Result<OwnedFd> {
    if !NOATIME_REFUSED.load(Ordering::Relaxed) {
        match open_at(dir, name, libc::O_NONBLOCK | libc::O_NOATIME) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => NOATIME_REFUSED.store(true, Ordering::Relaxed),
            r => return r,
        }
    }
    open_at(dir, name, libc::O_NONBLOCK)
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open for the call and `st` is writable.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

// `f_type` is i64 on x86_64 but narrower on other targets.
#[allow(clippy::useless_conversion)]
fn is_sysfs(fd: RawFd) -> bool {
    // SAFETY: an all-zero `statfs` is a valid value of this plain C struct.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open for the call and `s` is writable.
    (unsafe { libc::fstatfs(fd, &mut s) } == 0) && i64::from(s.f_type) == SYSFS_MAGIC
}

/// Reads a whole attribute from offset 0 into `out` (cleared first): one `pread` for any
/// attribute shorter than the chunk, which is every counter.
pub fn pread_all(fd: RawFd, out: &mut Vec<u8>) -> io::Result<()> {
    out.clear();
    let mut chunk = [0u8; 256];
    loop {
        let off = libc::off_t::try_from(out.len()).map_err(io::Error::other)?;
        // SAFETY: `chunk` is writable for its whole length during the call; `fd` is open.
        let n = unsafe { libc::pread(fd, chunk.as_mut_ptr().cast(), chunk.len(), off) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let n = usize::try_from(n).unwrap_or(0);
        out.extend_from_slice(&chunk[..n]);
        // kernfs returns a whole attribute in the first read; a regular file's short read
        // is its end.
        if n < chunk.len() {
            return Ok(());
        }
        if out.len() > MAX_ATTR {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "not a sysfs attribute (over 64 KiB)"));
        }
    }
}

/// Entries of an open directory (`.` and `..` excluded) with their inode numbers, unsorted.
fn list(fd: RawFd, out: &mut Vec<(CString, u64)>) -> io::Result<()> {
    #[repr(C, align(8))]
    struct Buf([u8; 8192]);
    out.clear();
    // SAFETY: `fd` is an open directory; seeking it to 0 restarts getdents.
    if unsafe { libc::lseek(fd, 0, libc::SEEK_SET) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = Buf([0; 8192]);
    loop {
        // SAFETY: the buffer is writable for its whole length during the call; `fd` is open.
        let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.0.as_mut_ptr(), buf.0.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let n = usize::try_from(n).unwrap_or(0).min(buf.0.len());
        if n == 0 {
            return Ok(());
        }
        // struct linux_dirent64 { u64 d_ino; s64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
        let mut off = 0;
        while off + 19 < n {
            let rec = &buf.0[off..n];
            let ino = u64::from_ne_bytes(rec[0..8].try_into().map_err(io::Error::other)?);
            let reclen = usize::from(u16::from_ne_bytes(rec[16..18].try_into().map_err(io::Error::other)?));
            if reclen < 20 || reclen > rec.len() {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "malformed getdents64 record"));
            }
            let name = &rec[19..reclen];
            let name = &name[..name.iter().position(|b| *b == 0).unwrap_or(name.len())];
            if name != b"." && name != b".." {
                out.push((cstring(name)?, ino));
            }
            off += reclen;
        }
    }
}

fn now_realtime_ns() -> i128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as i128).unwrap_or(0)
}

/// What a directory's `fstat` says about its entries since the last look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// Nothing in it can have been added, removed or replaced.
    Same,
    /// Something may have changed: re-list.
    Changed,
    /// Removed (or unreadable): rebuild from paths.
    Gone,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
struct Stamp {
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(st: &libc::stat) -> Stamp {
        Stamp { mtime: (st.st_mtime, st.st_mtime_nsec), ctime: (st.st_ctime, st.st_ctime_nsec) }
    }
    /// The stamp cannot hide a change made after `now` (see [`SETTLE_NS`]).
    fn settled(&self, now: i128) -> bool {
        let ns = |(s, n): (i64, i64)| i128::from(s) * 1_000_000_000 + i128::from(n);
        ns(self.mtime).max(ns(self.ctime)) + SETTLE_NS < now
    }
}

/// An open directory.
#[derive(Debug)]
pub struct Dir {
    fd: Held,
    /// On sysfs: no stamps, removal shows as read errors.
    pub sysfs: bool,
    id: (u64, u64),
    stamp: Stamp,
    settled: bool,
}

impl Dir {
    fn from_fd(fd: OwnedFd, budget: &Budget) -> io::Result<Dir> {
        let now = now_realtime_ns();
        let st = fstat(fd.as_raw_fd())?;
        let sysfs = is_sysfs(fd.as_raw_fd());
        let stamp = Stamp::of(&st);
        Ok(Dir { sysfs, id: (st.st_dev, st.st_ino), stamp, settled: stamp.settled(now), fd: budget.force(fd) })
    }

    pub fn open_path(path: &Path, budget: &Budget) -> io::Result<Dir> {
        let c = cstring(path.as_os_str().as_bytes())?;
        Dir::from_fd(open_at(libc::AT_FDCWD, &c, libc::O_DIRECTORY)?, budget)
    }

    pub fn open_in(&self, name: &CStr, budget: &Budget) -> io::Result<Dir> {
        Dir::from_fd(open_at(self.raw(), name, libc::O_DIRECTORY)?, budget)
    }

    pub fn raw(&self) -> RawFd {
        self.fd.raw()
    }

    /// Whether entries may have changed since the last check (always [`Check::Same`] on
    /// sysfs). One `fstat`.
    pub fn check(&mut self) -> Check {
        if self.sysfs {
            return Check::Same;
        }
        let now = now_realtime_ns();
        let Ok(st) = fstat(self.raw()) else { return Check::Gone };
        if st.st_nlink == 0 {
            return Check::Gone;
        }
        let stamp = Stamp::of(&st);
        if stamp == self.stamp && self.settled {
            return Check::Same;
        }
        self.stamp = stamp;
        self.settled = stamp.settled(now);
        Check::Changed
    }

    /// Whether `path` still names this directory (not one renamed over it).
    pub fn is_at(&self, path: &Path) -> bool {
        std::fs::metadata(path).is_ok_and(|m| {
            use std::os::unix::fs::MetadataExt;
            (m.dev(), m.ino()) == self.id
        })
    }

    /// Entry names, sorted (lossy UTF-8). One `lseek` and two `getdents64`, no path lookup.
    pub fn names(&self) -> io::Result<Vec<String>> {
        let mut raw = Vec::new();
        list(self.raw(), &mut raw)?;
        let mut v: Vec<String> = raw.iter().map(|(n, _)| String::from_utf8_lossy(n.as_bytes()).into_owned()).collect();
        v.sort();
        Ok(v)
    }

    /// Whether `name` inside this directory is the directory `d`.
    fn has_dir(&self, name: &CStr, d: &Dir) -> bool {
        open_at(self.raw(), name, libc::O_DIRECTORY | libc::O_PATH).and_then(|fd| fstat(fd.as_raw_fd())).is_ok_and(|st| (st.st_dev, st.st_ino) == d.id)
    }
}

/// Why an attribute could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadError {
    /// The open descriptor's file was removed (`ENODEV` from kernfs, `ESTALE`): rebuild.
    Stale,
    /// Any other failure (EIO on a restricted function, EISDIR, a dangling link, EACCES…).
    Io,
}

/// What the port code makes of a counter file; kept across re-listings of the same name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tag {
    /// Not looked at yet.
    New,
    /// Not a counter (`hw_counters/lifespan`).
    Control,
    /// A generic name beyond the label cap.
    OverCap,
    /// Index of its counter in the port's state.
    Counter(usize),
}

/// One attribute file of a directory.
#[derive(Debug)]
pub struct File {
    /// File name (lossy UTF-8), as exported in labels.
    pub name: String,
    cname: CString,
    ino: u64,
    /// `None`: opened at the next read (first read, after a replacement, or over budget).
    fd: Option<Held>,
    pub tag: Tag,
    /// Read only on the sweeps that refresh metric-only counters (set by the port code once
    /// it knows what the file feeds; see `port`).
    pub paced: bool,
}

impl File {
    fn new(cname: CString, ino: u64) -> File {
        File { name: String::from_utf8_lossy(cname.as_bytes()).into_owned(), cname, ino, fd: None, tag: Tag::New, paced: false }
    }

    /// A fixed attribute of a directory (`state`, `rate`, `link_layer`).
    pub fn named(name: &str) -> File {
        File::new(CString::new(name).unwrap_or_default(), 0)
    }

    /// Closes the descriptor: the next read opens the name again.
    pub fn reopen(&mut self) {
        self.fd = None;
    }

    /// Reads the whole file into `out`: `pread` on the cached descriptor, or `openat`
    /// relative to `dir` first (the descriptor is kept if the budget allows).
    pub fn read(&mut self, dir: &Dir, out: &mut Vec<u8>, budget: &Budget) -> Result<(), ReadError> {
        if let Some(fd) = &self.fd {
            return pread_all(fd.raw(), out).map_err(|e| match e.raw_os_error() {
                Some(libc::ENODEV | libc::ENOENT | libc::ESTALE) => ReadError::Stale,
                _ => ReadError::Io,
            });
        }
        // Non-blocking, and only a regular file: a FIFO in a counter's place must not stall
        // the sweep (a blocking open waits for a writer).
        let fd = open_attr(dir.raw(), &self.cname).map_err(|e| match e.raw_os_error() {
            Some(libc::ENODEV | libc::ESTALE) => ReadError::Stale,
            _ => ReadError::Io,
        })?;
        if fstat(fd.as_raw_fd()).map_or(true, |st| st.st_mode & libc::S_IFMT != libc::S_IFREG) {
            return Err(ReadError::Io);
        }
        let r = pread_all(fd.as_raw_fd(), out).map_err(|_| ReadError::Io);
        if budget.try_take() {
            self.fd = Some(Held { fd, budget: budget.0.clone() });
        }
        r
    }
}

/// A counter directory and its files, sorted by name.
#[derive(Debug)]
pub struct CounterDir {
    pub dir: Dir,
    pub files: Vec<File>,
}

impl CounterDir {
    #[cfg(test)]
    pub fn open_path(path: &Path, budget: &Budget) -> io::Result<CounterDir> {
        let mut d = CounterDir { dir: Dir::open_path(path, budget)?, files: Vec::new() };
        d.relist()?;
        Ok(d)
    }

    fn open_in(parent: &Dir, name: &CStr, budget: &Budget) -> io::Result<CounterDir> {
        let mut d = CounterDir { dir: parent.open_in(name, budget)?, files: Vec::new() };
        d.relist()?;
        Ok(d)
    }

    /// Re-lists the directory: files whose name and inode are unchanged keep their
    /// descriptor, replaced ones are reopened at their next read, names keep their tag and
    /// pacing.
    pub fn relist(&mut self) -> io::Result<()> {
        let mut now = Vec::with_capacity(self.files.len().max(8));
        list(self.dir.raw(), &mut now)?;
        let mut old = std::mem::take(&mut self.files);
        let mut files: Vec<File> = now
            .into_iter()
            .map(|(cname, ino)| match old.iter().position(|f| f.cname == cname).map(|i| old.swap_remove(i)) {
                Some(f) if f.ino == ino => f,
                Some(f) => File { tag: f.tag, paced: f.paced, ..File::new(cname, ino) },
                None => File::new(cname, ino),
            })
            .collect();
        // Sorted by exported name, the order the sweep has always applied readings in (it
        // decides which names get in under the label cap).
        files.sort_by(|a, b| a.name.cmp(&b.name));
        self.files = files;
        Ok(())
    }
}

/// The three optional counter directories of a port, in reading order.
pub const GROUP_DIRS: [&str; 3] = ["counters", "counters_ext", "hw_counters"];
/// The port attributes read every sweep.
pub const TEXT_FILES: [&str; 3] = ["state", "rate", "link_layer"];

/// Everything one port reads, open.
#[derive(Debug)]
pub struct PortFiles {
    pub dir: Dir,
    pub text: [File; 3],
    pub groups: [Option<CounterDir>; 3],
    relist_in: u32,
}

impl PortFiles {
    /// Opens a port directory and its counter directories (each optional).
    pub fn open(path: &Path, budget: &Budget) -> io::Result<PortFiles> {
        let dir = Dir::open_path(path, budget)?;
        let groups = GROUP_DIRS.map(|g| CounterDir::open_in(&dir, &group_name(g), budget).ok());
        Ok(PortFiles { dir, text: TEXT_FILES.map(File::named), groups, relist_in: 0 })
    }

    /// Revalidates before a sweep reads the port (see the module docs). `Err` when the port
    /// directory is gone or no longer at `path`: rebuild with [`PortFiles::open`].
    pub fn refresh(&mut self, path: &Path, relist_every: u32, budget: &Budget) -> Result<(), ReadError> {
        let due = self.relist_in == 0;
        self.relist_in = if due { relist_every.saturating_sub(1) } else { self.relist_in - 1 };
        self.revalidate(path, due, budget)
    }

    /// [`PortFiles::refresh`] without counting towards the periodic re-listing (`due`
    /// forces one): the fast lane's check between sweeps, free on sysfs, where directories
    /// never change under open files.
    pub fn revalidate(&mut self, path: &Path, due: bool, budget: &Budget) -> Result<(), ReadError> {
        let changed = match self.dir.check() {
            Check::Gone => return Err(ReadError::Stale),
            Check::Changed => true,
            Check::Same => false,
        };
        if due && !self.dir.sysfs && !self.dir.is_at(path) {
            return Err(ReadError::Stale);
        }
        if changed {
            self.text.iter_mut().for_each(File::reopen);
        }
        for (slot, name) in self.groups.iter_mut().zip(GROUP_DIRS) {
            let cname = group_name(name);
            let keep = match slot {
                Some(g) if changed && !self.dir.has_dir(&cname, &g.dir) => false,
                Some(g) => match g.dir.check() {
                    Check::Gone => false,
                    Check::Changed => g.relist().is_ok(),
                    Check::Same => !due || g.relist().is_ok(),
                },
                None => true,
            };
            if !keep || (slot.is_none() && (changed || due)) {
                *slot = CounterDir::open_in(&self.dir, &cname, budget).ok();
            }
        }
        Ok(())
    }

    /// Asks for a re-listing of every directory at the next refresh (after a failed read).
    pub fn relist_soon(&mut self) {
        self.relist_in = 0;
    }
}

fn group_name(g: &str) -> CString {
    CString::new(g).unwrap_or_default()
}

/// Names under `path` as sorted strings (a plain listing, for the class and ports directories).
pub fn sorted_names(path: &Path) -> Option<Vec<String>> {
    let rd = std::fs::read_dir(path).ok()?;
    let mut v: Vec<String> = rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    Some(v)
}

#[cfg(test)]
#[path = "files_tests.rs"]
mod tests;
