//! The `SIOCETHTOOL` driver-statistics ioctl (what `ethtool -S` does).
//!
//! Hand-written on purpose: no maintained crate exposes driver stats through a small API —
//! ethtool netlink (`ETHTOOL_MSG_STATS_GET`) only carries the standard groups, not the
//! per-priority PFC counters, and the `ethtool` crate is netlink-only (docs/platform-facts.md §2).
//! The ioctl acts in the network namespace of the thread that opened the socket.

use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use super::names::{split_gstrings, ETH_GSTRING_LEN};

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GDRVINFO: u32 = 0x03;
const ETHTOOL_GSTRINGS: u32 = 0x1b;
const ETHTOOL_GSTATS: u32 = 0x1d;
const ETHTOOL_GSSET_INFO: u32 = 0x37;
const ETH_SS_STATS: u32 = 1;
/// `struct ethtool_drvinfo` is 196 bytes; `driver` is at 4, `n_stats` at 180.
const DRVINFO_LEN: usize = 196;
const DRVINFO_N_STATS: usize = 180;

/// The kernel ignores the count we pass to GSTRINGS/GSTATS and writes as many entries as the
/// driver has *now*; if a reconfiguration adds channels between our count query and the
/// read, it writes past what we asked for. Buffers therefore carry this much headroom, and
/// an answer larger than the headroom is rejected (the same race exists in `ethtool`).
fn capacity_for(n: usize) -> usize {
    n + n.max(256)
}

/// `struct ifreq` as used by SIOCETHTOOL: the name, then a pointer in the union.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<IfReq>() == 40);

/// What a driver answered when asked for its statistics count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StatsCount {
    Count(usize),
    /// EOPNOTSUPP/EINVAL, or the driver has no `ETH_SS_STATS` string set.
    NoStats,
}

/// An `AF_INET`/`SOCK_DGRAM` socket used only as the ioctl handle.
pub struct EthtoolSocket(OwnedFd);

impl EthtoolSocket {
    pub fn new() -> io::Result<Self> {
        // SAFETY: plain socket(2) call with constant arguments; the returned descriptor is
        // checked and then owned by `OwnedFd`, which closes it exactly once.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a freshly created, valid descriptor that nothing else owns.
        Ok(EthtoolSocket(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// SIOCETHTOOL with `buf` as `ifr_data`; `buf` starts with the command word.
    fn call(&self, ifname: &str, buf: &mut [u8]) -> io::Result<()> {
        let bytes = ifname.as_bytes();
        if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("bad interface name {ifname:?}")));
        }
        let mut req = IfReq { name: [0; libc::IFNAMSIZ], data: buf.as_mut_ptr().cast(), _pad: [0; 16] };
        req.name[..bytes.len()].copy_from_slice(bytes);
        // SAFETY: `req` is a valid, NUL-terminated ifreq whose data pointer refers to `buf`,
        // which is live and exclusively borrowed for the call. Every command we issue writes
        // at most `buf.len()` bytes: GSSET_INFO/GDRVINFO have fixed sizes covered by the
        // callers' buffers, and GSTRINGS/GSTATS buffers carry `capacity_for` headroom
        // (see there for the kernel's count race).
        let rc = unsafe { libc::ioctl(self.0.as_raw_fd(), SIOCETHTOOL as _, &mut req as *mut IfReq) };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// The driver's name (`ETHTOOL_GDRVINFO`), and its legacy `n_stats`.
    pub fn driver_info(&self, ifname: &str) -> io::Result<(String, u32)> {
        let mut buf = vec![0u8; DRVINFO_LEN];
        buf[..4].copy_from_slice(&ETHTOOL_GDRVINFO.to_ne_bytes());
        self.call(ifname, &mut buf)?;
        let driver = split_gstrings(&buf[4..4 + ETH_GSTRING_LEN], 1).pop().unwrap_or_default();
        Ok((driver, read_u32(&buf, DRVINFO_N_STATS)))
    }

    /// Number of driver statistics: `ETHTOOL_GSSET_INFO`, else `ETHTOOL_GDRVINFO.n_stats`.
    pub fn stats_count(&self, ifname: &str) -> io::Result<StatsCount> {
        // struct ethtool_sset_info { u32 cmd; u32 reserved; u64 sset_mask; u32 data[]; }
        let mut buf = vec![0u8; 20];
        buf[..4].copy_from_slice(&ETHTOOL_GSSET_INFO.to_ne_bytes());
        buf[8..16].copy_from_slice(&(1u64 << ETH_SS_STATS).to_ne_bytes());
        match self.call(ifname, &mut buf) {
            Ok(()) => {
                let mask = u64::from_ne_bytes(buf[8..16].try_into().unwrap_or_default());
                if mask & (1 << ETH_SS_STATS) == 0 {
                    return Ok(StatsCount::NoStats);
                }
                Ok(count(read_u32(&buf, 16)))
            }
            Err(e) if no_support(&e) => match self.driver_info(ifname) {
                Ok((_, n)) => Ok(count(n)),
                Err(e) if no_support(&e) => Ok(StatsCount::NoStats),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// The statistic names (`ETHTOOL_GSTRINGS`, string set `ETH_SS_STATS`), trimmed.
    pub fn stat_names(&self, ifname: &str, n: usize) -> io::Result<Vec<String>> {
        // struct ethtool_gstrings { u32 cmd; u32 string_set; u32 len; u8 data[]; }
        let cap = capacity_for(n);
        let mut buf = vec![0u8; 12 + cap * ETH_GSTRING_LEN];
        buf[..4].copy_from_slice(&ETHTOOL_GSTRINGS.to_ne_bytes());
        buf[4..8].copy_from_slice(&ETH_SS_STATS.to_ne_bytes());
        buf[8..12].copy_from_slice(&(n as u32).to_ne_bytes());
        self.call(ifname, &mut buf)?;
        let got = read_u32(&buf, 8) as usize;
        check_len(got, cap)?;
        Ok(split_gstrings(&buf[12..], got))
    }

    /// The statistic values (`ETHTOOL_GSTATS`), in string-table order.
    pub fn stat_values(&self, ifname: &str, n: usize) -> io::Result<Vec<u64>> {
        // struct ethtool_stats { u32 cmd; u32 n_stats; u64 data[]; }
        let cap = capacity_for(n);
        let mut buf = vec![0u8; 8 + cap * 8];
        buf[..4].copy_from_slice(&ETHTOOL_GSTATS.to_ne_bytes());
        buf[4..8].copy_from_slice(&(n as u32).to_ne_bytes());
        self.call(ifname, &mut buf)?;
        let got = read_u32(&buf, 4) as usize;
        check_len(got, cap)?;
        Ok(buf[8..8 + got * 8].chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap_or_default())).collect())
    }

    /// Names and values together, as `ethtool -S` prints them. For tests and `agent check`.
    pub fn driver_stats(&self, ifname: &str) -> io::Result<Vec<(String, u64)>> {
        let n = match self.stats_count(ifname)? {
            StatsCount::Count(n) => n,
            StatsCount::NoStats => return Ok(Vec::new()),
        };
        let names = self.stat_names(ifname, n)?;
        let values = self.stat_values(ifname, names.len())?;
        if values.len() != names.len() {
            return Err(io::Error::other(format!("{ifname}: {} names but {} values (driver reconfigured)", names.len(), values.len())));
        }
        Ok(names.into_iter().zip(values).collect())
    }
}

fn count(n: u32) -> StatsCount {
    if n == 0 {
        StatsCount::NoStats
    } else {
        StatsCount::Count(n as usize)
    }
}

fn read_u32(buf: &[u8], at: usize) -> u32 {
    buf.get(at..at + 4).and_then(|b| b.try_into().ok()).map(u32::from_ne_bytes).unwrap_or(0)
}

fn check_len(got: usize, cap: usize) -> io::Result<()> {
    if got > cap {
        // Only reachable if the driver more than doubled its statistics between our count
        // and this call (see `capacity_for`); the answer is then refused, not parsed.
        return Err(io::Error::other(format!("driver statistics grew from under {cap} to {got} during the read")));
    }
    Ok(())
}

/// Errors that mean "this driver has no statistics", not "the read failed".
pub fn no_support(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP) | Some(libc::EINVAL))
}
