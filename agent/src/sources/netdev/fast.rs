//! The netdev source's fast lane: the eight statistics of the few netdevs a job uses, from
//! `<sysfs>/class/net/<dev>/statistics/*` through files kept open (read again from offset 0),
//! between the rtnetlink dumps. sysfs shows the network namespace it was mounted in, which
//! need not be the agent's: a device whose `ifindex` there is not the dump's is not read here
//! (the dumps alone count it).

use std::{fs::File, io, os::unix::fs::FileExt, path::Path};

/// sysfs names of the counters, in the order of [`super::COUNTERS`].
const FILES: [&str; 8] = ["rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_dropped", "tx_dropped", "rx_errors", "tx_errors"];
/// The ones attribution uses (bytes and drops), read by the fast lane; the others keep
/// their values from the last dump.
const READ: [usize; 4] = [0, 1, 4, 5];

/// One netdev's statistics files, opened for the ifindex the dump gave it.
pub struct StatFiles {
    pub ifindex: u32,
    files: Vec<File>,
}

impl StatFiles {
    /// The files of `dev` when sysfs shows it with `ifindex`.
    pub fn open(sysfs_root: &Path, dev: &str, ifindex: u32) -> io::Result<StatFiles> {
        let there = super::read_ifindex(sysfs_root, dev);
        if there != Some(u64::from(ifindex)) {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("{dev}: sysfs shows ifindex {there:?}, the dump {ifindex}")));
        }
        let dir = sysfs_root.join("class/net").join(dev).join("statistics");
        let files = READ.iter().map(|&i| crate::sources::fsread::open_regular(&dir.join(FILES[i]))).collect::<io::Result<Vec<File>>>()?;
        Ok(StatFiles { ifindex, files })
    }

    /// The eight counters now: bytes and drops read, the others as in `prev`.
    pub fn read(&self, prev: &[u64; 8]) -> io::Result<[u64; 8]> {
        let mut out = *prev;
        let mut buf = [0u8; 32];
        for (&i, f) in READ.iter().zip(&self.files) {
            let v = &mut out[i];
            let n = f.read_at(&mut buf, 0)?;
            let text = std::str::from_utf8(&buf[..n]).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            *v = text.trim().parse().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{text:?}: {e}")))?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(root: &Path, name: &str, ifindex: u32, tx: &str) {
        let d = root.join("class/net").join(name);
        std::fs::create_dir_all(d.join("statistics")).expect("mkdir");
        std::fs::write(d.join("ifindex"), format!("{ifindex}\n")).expect("write");
        for f in FILES {
            std::fs::write(d.join("statistics").join(f), if f == "tx_bytes" { tx } else { "0\n" }).expect("write");
        }
    }

    #[test]
    fn reads_again_through_the_open_files_and_refuses_another_ifindex_or_garbage() {
        let t = tempfile::tempdir().expect("tempdir");
        dev(t.path(), "rail0", 7, "1000\n");
        let f = StatFiles::open(t.path(), "rail0", 7).expect("opens");
        let prev = [5, 6, 7, 8, 9, 10, 11, 12];
        assert_eq!(f.read(&prev).expect("reads"), [0, 1000, 7, 8, 0, 0, 11, 12], "bytes and drops read, packets and errors kept");
        std::fs::write(t.path().join("class/net/rail0/statistics/tx_bytes"), "123456789012\n").expect("write");
        assert_eq!(f.read(&prev).expect("reads")[1], 123_456_789_012, "the same open file, read from 0 again");
        assert!(StatFiles::open(t.path(), "rail0", 8).is_err(), "sysfs of another namespace");
        std::fs::write(t.path().join("class/net/rail0/statistics/tx_bytes"), "N/A\n").expect("write");
        assert_eq!(f.read(&prev).expect_err("garbage").kind(), io::ErrorKind::InvalidData);
    }
}
