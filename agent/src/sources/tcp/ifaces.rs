//! The host's interface addresses (`getifaddrs(3)`) and which interface a connection's
//! packets leave by.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use super::{nic_of, TcpConn};

/// One address of an interface, with its prefix length (the connected subnet).
#[derive(Clone, Debug, PartialEq)]
pub struct IfAddr {
    pub addr: IpAddr,
    pub prefix: u8,
    pub name: String,
}

impl IfAddr {
    /// Whether `ip` is in this address's connected subnet.
    fn contains(&self, ip: &IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(a), IpAddr::V4(b)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix.min(32))).unwrap_or(0);
                u32::from(a) & mask == u32::from(*b) & mask
            }
            (IpAddr::V6(a), IpAddr::V6(b)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix.min(128))).unwrap_or(0);
                u128::from(a) & mask == u128::from(*b) & mask
            }
            _ => false,
        }
    }
}

/// The address a `sockaddr` holds, for AF_INET and AF_INET6.
///
/// # Safety
/// `sa` is null or points to a `sockaddr` whose `sa_family` says which type it is.
unsafe fn ip_of(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: non-null, and the caller vouches for the sockaddr; sa_family tells its type.
    match unsafe { (*sa).sa_family } as i32 {
        libc::AF_INET => {
            // SAFETY: AF_INET → sockaddr_in.
            let sin = unsafe { &*(sa as *const libc::sockaddr_in) };
            Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))))
        }
        libc::AF_INET6 => {
            // SAFETY: AF_INET6 → sockaddr_in6.
            let sin6 = unsafe { &*(sa as *const libc::sockaddr_in6) };
            Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
        }
        _ => None,
    }
}

/// Every IPv4/IPv6 address of the namespace's interfaces.
pub fn interfaces() -> Vec<IfAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs allocates a list we free below; we only read it in between.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list returned by getifaddrs.
        let ifa = unsafe { &*cur };
        // SAFETY: the list's sockaddrs are null or valid for their family.
        if let (false, Some(addr)) = (ifa.ifa_name.is_null(), unsafe { ip_of(ifa.ifa_addr) }) {
            // SAFETY: ifa_name is a NUL-terminated string owned by the list.
            let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
            // SAFETY: as above, for the netmask.
            let prefix = match unsafe { ip_of(ifa.ifa_netmask) } {
                Some(IpAddr::V4(m)) => u32::from(m).count_ones() as u8,
                Some(IpAddr::V6(m)) => u128::from(m).count_ones() as u8,
                None => {
                    if addr.is_ipv4() {
                        32
                    } else {
                        128
                    }
                }
            };
            out.push(IfAddr { addr, prefix, name });
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: the list came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// Interface name per local address (`getifaddrs(3)`).
pub fn interface_addresses() -> BTreeMap<IpAddr, String> {
    interfaces().into_iter().map(|a| (a.addr, a.name)).collect()
}

/// The interface a connection's packets leave by: the one whose connected subnet holds the
/// peer (the longest prefix; a rank bound to one rail's address reaching a peer in another
/// rail's subnet sends through that rail), else the interface of its local address (a peer
/// behind a gateway). `None` as for [`nic_of`]: loopback, or a peer on this host.
pub fn egress_of<'a>(c: &TcpConn, ifs: &'a [IfAddr], addrs: &'a BTreeMap<IpAddr, String>) -> Option<&'a str> {
    let local = nic_of(c, addrs)?;
    let remote = c.remote?;
    let hit = ifs.iter().filter(|a| a.name != "lo" && a.contains(&remote)).max_by_key(|a| a.prefix);
    Some(hit.map_or(local.as_str(), |a| a.name.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_leaves_by_the_interface_whose_subnet_holds_its_peer() {
        let ifs = vec![
            IfAddr { addr: "198.18.0.1".parse().expect("ip"), prefix: 24, name: "rail0".into() },
            IfAddr { addr: "198.18.3.1".parse().expect("ip"), prefix: 24, name: "rail3".into() },
            IfAddr { addr: "10.0.0.5".parse().expect("ip"), prefix: 8, name: "eth0".into() },
            IfAddr { addr: "10.1.0.5".parse().expect("ip"), prefix: 16, name: "eth1".into() },
            IfAddr { addr: "127.0.0.1".parse().expect("ip"), prefix: 8, name: "lo".into() },
        ];
        let addrs: BTreeMap<IpAddr, String> = ifs.iter().map(|a| (a.addr, a.name.clone())).collect();
        let conn = |l: &str, r: &str| TcpConn { local: Some(l.parse().expect("ip")), remote: Some(r.parse().expect("ip")), ..Default::default() };
        // Bound to rail 3's address, talking to a peer on rail 0's subnet: rail 0.
        assert_eq!(egress_of(&conn("198.18.3.1", "198.18.0.2"), &ifs, &addrs), Some("rail0"));
        // The longest prefix wins; a peer in no connected subnet leaves by the local address.
        assert_eq!(egress_of(&conn("10.0.0.5", "10.1.2.3"), &ifs, &addrs), Some("eth1"));
        assert_eq!(egress_of(&conn("198.18.0.1", "203.0.113.9"), &ifs, &addrs), Some("rail0"));
        // A peer on this host, or loopback: no NIC.
        assert_eq!(egress_of(&conn("198.18.3.1", "198.18.0.1"), &ifs, &addrs), None);
        assert_eq!(egress_of(&conn("127.0.0.1", "127.0.0.2"), &ifs, &addrs), None);
        // The real interfaces have prefixes: loopback's /8 at least.
        let real = interfaces();
        assert!(real.iter().any(|a| a.name == "lo" && a.addr == IpAddr::V4(Ipv4Addr::LOCALHOST) && a.prefix == 8), "{real:?}");
    }
}
