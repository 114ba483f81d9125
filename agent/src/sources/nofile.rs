//! The agent's file-descriptor limit (`RLIMIT_NOFILE`): raised to the hard limit at start, and
//! how close the agent is to it, for `/readyz` (an agent out of descriptors cannot open the
//! sockets its sources need, and should say so rather than look healthy).

use std::io;

/// Descriptors kept free below the soft limit before `/readyz` reports the agent short of
/// them (a sweep's sockets, a scrape's connection, the store's files).
pub const HEADROOM: usize = 32;

/// The current `RLIMIT_NOFILE`.
pub fn limit() -> Option<libc::rlimit> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `r` is a valid, writable rlimit.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0).then_some(r)
}

/// Raises the soft limit to the hard one (an unlimited hard limit to 2²⁰, the kernel's
/// default `fs.nr_open`). `Ok(Some((from, to)))` when raised, `Ok(None)` when already there.
pub fn raise_soft() -> io::Result<Option<(u64, u64)>> {
    let r = limit().ok_or_else(io::Error::last_os_error)?;
    let hard = if r.rlim_max == libc::RLIM_INFINITY { 1 << 20 } else { r.rlim_max };
    if hard <= r.rlim_cur {
        return Ok(None);
    }
    let new = libc::rlimit { rlim_cur: hard, rlim_max: r.rlim_max };
    // SAFETY: `new` is a valid rlimit; raising the soft limit up to the hard one is allowed.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Some((r.rlim_cur, hard)))
}

/// Why the agent is short of descriptors, if it is: fewer than [`HEADROOM`] left below the
/// soft limit, or none left to count them with.
pub fn shortage() -> Option<String> {
    let soft = limit().map(|r| usize::try_from(r.rlim_cur).unwrap_or(usize::MAX))?;
    // The directory's own descriptor is among the entries.
    judge(std::fs::read_dir("/proc/self/fd").map(|d| d.count().saturating_sub(1)), soft)
}

fn judge(open: io::Result<usize>, soft: usize) -> Option<String> {
    match open {
        Ok(open) => (open + HEADROOM > soft).then(|| format!("{open} of {soft} file descriptors open (RLIMIT_NOFILE)")),
        Err(e) if e.raw_os_error() == Some(libc::EMFILE) => Some(format!("out of file descriptors: all {soft} of RLIMIT_NOFILE are open")),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_near_or_at_its_limit_is_short_of_descriptors() {
        assert_eq!(judge(Ok(100), 1024), None);
        assert!(judge(Ok(1000), 1024).is_some_and(|s| s.contains("1000 of 1024")));
        assert!(judge(Err(io::Error::from_raw_os_error(libc::EMFILE)), 1024).is_some_and(|s| s.contains("out of file descriptors")));
        assert_eq!(judge(Err(io::Error::from_raw_os_error(libc::ENOENT)), 1024), None, "no /proc: nothing to say");
        assert_eq!(shortage(), None, "this test process has room");
        assert!(limit().is_some_and(|r| r.rlim_cur <= r.rlim_max));
    }
}
