//! Real "hosts" on one machine for the privileged tests: network namespaces joined by veth
//! pairs, tc qdiscs, and a way to run code *inside* a namespace (a thread that has entered
//! it, with that namespace's sysfs mounted privately). Addresses come from the RFC 2544
//! benchmarking range 198.18.0.0/15 only, and all traffic stays between the namespaces a
//! test created. Everything is removed on Drop, also when a test fails.
//!
//! Needs root and iproute2 (`ip`, `tc`); a missing tool is an error that names it, never a
//! silent skip (CI installs them).

use std::{
    ffi::CString,
    fs::File,
    net::Ipv4Addr,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
};

use anyhow::{bail, Context, Result};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A process- and test-unique suffix: `<pid>-<n>`.
fn unique() -> String {
    format!("{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Runs a tool and returns its stdout; the error names the tool when it is missing.
pub fn run_tool(tool: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(tool).args(args).output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            anyhow::anyhow!("`{tool}` not found: the kernel tests need iproute2 and ethtool (xtask/setup.sh and CI install them)")
        } else {
            anyhow::anyhow!("cannot run `{tool}`: {e}")
        }
    })?;
    if !out.status.success() {
        bail!("`{tool} {}` failed ({}): {}", args.join(" "), out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip ARGS…`
pub fn ip(args: &[&str]) -> Result<String> {
    run_tool("ip", args)
}

/// A named network namespace (`ip netns add sw-<pid>-<n>`), deleted on Drop.
pub struct Netns {
    name: String,
    sysfs: PathBuf,
}

impl Netns {
    /// Creates the namespace with loopback up and IPv6 off (no router/neighbour
    /// solicitations in byte counts).
    pub fn new() -> Result<Self> {
        let name = format!("sw-{}", unique());
        let sysfs = std::env::temp_dir().join(format!("{name}-sysfs"));
        std::fs::create_dir_all(&sysfs).with_context(|| format!("create {}", sysfs.display()))?;
        if let Err(e) = ip(&["netns", "add", &name]) {
            let _ = std::fs::remove_dir(&sysfs);
            return Err(e);
        }
        let ns = Netns { name, sysfs };
        ns.ip(&["link", "set", "lo", "up"])?;
        ns.run(|_| {
            for f in ["all", "default"] {
                // Absent when IPv6 is not built in: nothing to turn off then.
                let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{f}/disable_ipv6"), "1");
            }
        });
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where [`Netns::run`] mounts this namespace's sysfs: the `sysfs_root` to give a source
    /// that is swept inside `run`. Empty outside `run`.
    pub fn sysfs(&self) -> &Path {
        &self.sysfs
    }

    /// `ip -n NAME ARGS…`
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut v = vec!["-n", &self.name];
        v.extend_from_slice(args);
        ip(&v)
    }

    /// `tc -n NAME ARGS…`
    pub fn tc(&self, args: &[&str]) -> Result<String> {
        let mut v = vec!["-n", &self.name];
        v.extend_from_slice(args);
        run_tool("tc", &v)
    }

    /// `ip netns exec NAME CMD ARGS…` (for tools without `-n`, e.g. `ethtool`).
    pub fn exec(&self, cmd: &str, args: &[&str]) -> Result<String> {
        let mut v = vec!["netns", "exec", &self.name, cmd];
        v.extend_from_slice(args);
        ip(&v)
    }

    /// A TBF root qdisc on `dev`: `tc qdisc add dev DEV root tbf rate R burst B limit L`.
    pub fn tbf(&self, dev: &str, rate: &str, burst: &str, limit: &str) -> Result<()> {
        self.tc(&["qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", burst, "limit", limit]).map(drop)
    }

    /// Runs `f` on a thread that has entered this namespace: its network namespace, plus a
    /// private mount namespace with this namespace's sysfs mounted at [`Netns::sysfs`]
    /// (passed to `f`). Sockets opened by `f` stay in this namespace wherever they are used
    /// later; threads `f` spawns inherit both namespaces. Blocks until `f` returns; its
    /// panics propagate.
    pub fn run<R: Send, F: FnOnce(&Path) -> R + Send>(&self, f: F) -> R {
        let joined = std::thread::scope(|s| {
            s.spawn(|| {
                if let Err(e) = enter(&self.name, &self.sysfs) {
                    panic!("cannot enter network namespace {}: {e:#}", self.name);
                }
                // The mount lives in this thread's own mount namespace and goes with it.
                f(&self.sysfs)
            })
            .join()
        });
        match joined {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("warning: cannot delete network namespace {}: {e:#}", self.name);
        }
        let _ = std::fs::remove_dir(&self.sysfs);
    }
}

fn check(rc: libc::c_int, what: &str) -> Result<()> {
    if rc < 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| what.to_string());
    }
    Ok(())
}

/// Moves the calling thread into netns `name` and a private mount namespace with that
/// netns's sysfs at `sysfs` (what `ip netns exec` does for a process).
fn enter(name: &str, sysfs: &Path) -> Result<()> {
    let ns = File::open(Path::new("/run/netns").join(name)).with_context(|| format!("open /run/netns/{name}"))?;
    // SAFETY: setns(2) on a valid, open namespace descriptor; it only changes the calling
    // thread's network namespace.
    check(unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) }, "setns(CLONE_NEWNET)")?;
    // SAFETY: unshare(2) with CLONE_NEWNS gives this thread its own copy of the mount table
    // (and its own fs_struct); other threads are unaffected.
    check(unsafe { libc::unshare(libc::CLONE_NEWNS) }, "unshare(CLONE_NEWNS)")?;
    let root = CString::new("/")?;
    let none = CString::new("none")?;
    // SAFETY: valid NUL-terminated strings; MS_REC|MS_SLAVE makes every mount in the new
    // namespace a slave, so nothing mounted below propagates back to the host.
    check(unsafe { libc::mount(none.as_ptr(), root.as_ptr(), std::ptr::null(), libc::MS_REC | libc::MS_SLAVE, std::ptr::null()) }, "make / rslave")?;
    let target = CString::new(sysfs.as_os_str().as_encoded_bytes())?;
    let sysfs_fs = CString::new("sysfs")?;
    // SAFETY: valid NUL-terminated strings; a fresh sysfs instance shows the network
    // namespace of the mounting thread, which is now `name`.
    check(unsafe { libc::mount(sysfs_fs.as_ptr(), target.as_ptr(), sysfs_fs.as_ptr(), 0, std::ptr::null()) }, "mount sysfs")?;
    Ok(())
}

/// A veth pair between two namespaces, with `198.18.<n>.1/24` on `a_dev` and `.2` on `b_dev`.
/// Removed with its namespaces (or explicitly with [`Veth::delete`]).
pub struct Veth {
    pub a_dev: String,
    pub b_dev: String,
    pub a_addr: Ipv4Addr,
    pub b_addr: Ipv4Addr,
}

impl Veth {
    /// Creates the pair directly inside the two namespaces (names need only be unique there).
    pub fn new(a: &Netns, a_dev: &str, b: &Netns, b_dev: &str) -> Result<Self> {
        let n = (NEXT.fetch_add(1, Ordering::Relaxed) % 254 + 1) as u8;
        let v = Veth { a_dev: a_dev.into(), b_dev: b_dev.into(), a_addr: Ipv4Addr::new(198, 18, n, 1), b_addr: Ipv4Addr::new(198, 18, n, 2) };
        v.create(a, b)?;
        Ok(v)
    }

    /// (Re-)creates the pair with its addresses, both ends up.
    pub fn create(&self, a: &Netns, b: &Netns) -> Result<()> {
        ip(&["link", "add", &self.a_dev, "netns", a.name(), "type", "veth", "peer", "name", &self.b_dev, "netns", b.name()])?;
        a.ip(&["addr", "add", &format!("{}/24", self.a_addr), "dev", &self.a_dev])?;
        b.ip(&["addr", "add", &format!("{}/24", self.b_addr), "dev", &self.b_dev])?;
        a.ip(&["link", "set", &self.a_dev, "up"])?;
        b.ip(&["link", "set", &self.b_dev, "up"])?;
        Ok(())
    }

    /// Deletes the pair (both ends go).
    pub fn delete(&self, a: &Netns) -> Result<()> {
        a.ip(&["link", "del", &self.a_dev]).map(drop)
    }
}

/// Reads `<sysfs>/class/net/<dev>/statistics/<name>` (for cross-checks).
pub fn sysfs_stat(sysfs: &Path, dev: &str, name: &str) -> Result<u64> {
    let p: PathBuf = sysfs.join("class/net").join(dev).join("statistics").join(name);
    let s = std::fs::read_to_string(&p).with_context(|| format!("read {}", p.display()))?;
    s.trim().parse().with_context(|| format!("parse {}", p.display()))
}
