//! Reads of files the agent does not own (sysfs, procfs, libraries other processes map).
//!
//! A blocking `open` of a FIFO waits for a writer — a FIFO planted in place of a counter file
//! froze a sweep, and with it SIGTERM, until someone wrote to it. Every such read here opens
//! with `O_NONBLOCK` (no effect on regular files, which sysfs attributes and procfs entries
//! are) and refuses anything but a regular file before reading.

use std::{
    fs::File,
    io::{self, Read},
    os::unix::fs::OpenOptionsExt,
    path::Path,
};

/// Opens `path` for reading without blocking; `Err(InvalidInput)` unless a regular file.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(path)?;
    if !f.metadata()?.file_type().is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{}: not a regular file", path.display())));
    }
    Ok(f)
}

/// [`std::fs::read`] through [`open_regular`].
pub fn read(path: &Path) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    open_regular(path)?.read_to_end(&mut out)?;
    Ok(out)
}

/// [`std::fs::read_to_string`] through [`open_regular`].
pub fn read_to_string(path: &Path) -> io::Result<String> {
    let mut out = String::new();
    open_regular(path)?.read_to_string(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mkfifo(p: &Path) {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path().join("port_rcv_data");
        mkfifo(&p);
        // A blocking open would never return here: no writer ever comes.
        let e = read_to_string(&p).expect_err("a FIFO is not an attribute");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(read(&p).is_err());
    }

    #[test]
    fn directories_and_devices_are_refused_regular_files_read() {
        let d = tempfile::tempdir().expect("tempdir");
        assert!(read(d.path()).is_err());
        assert_eq!(read_to_string(Path::new("/dev/null")).expect_err("device").kind(), io::ErrorKind::InvalidInput);
        let f = d.path().join("rate");
        std::fs::write(&f, "400 Gb/sec\n").expect("write");
        assert_eq!(read_to_string(&f).expect("regular"), "400 Gb/sec\n");
    }
}
