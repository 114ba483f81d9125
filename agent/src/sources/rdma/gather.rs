//! The read pass over a port's open files into the scratch buffers (see `port`).

use super::{
    files::{PortFiles, ReadError},
    parse::{self, ReadFailure},
    port::{Gathered, Io, HW},
};

/// What one pass reads besides the counters attribution uses.
#[derive(Clone, Copy, Debug)]
pub(super) struct Due<'a> {
    /// hw_counters (see [`super::hw_every`]).
    pub hw: bool,
    /// Per group: its paced (metric-only) files.
    pub paced: [bool; 3],
    /// `rate` and `link_layer`.
    pub text: bool,
    /// `state` (read at every full sweep; not by the fast lane).
    pub state: bool,
    /// Only the files at these indices of the PMA groups (`None`: every due file) — the fast
    /// lane's bytes and transmit wait.
    pub only: Option<&'a [Vec<bool>; 2]>,
}

/// Reads the port's text files and the counter groups due into the scratch buffers; a
/// group's paced files only where `due.paced` says so ([`ReadFailure::NotDue`] otherwise).
/// With `abort_stale`, a descriptor whose file is gone stops the pass (`Err`); otherwise it
/// is one more failed read.
pub(super) fn read_files(files: &mut PortFiles, io: &mut Io, due: Due<'_>, abort_stale: bool) -> Result<Gathered, ReadError> {
    let mut got = Gathered::default();
    let mut failed = false;
    let s = &mut *io.scratch;
    for (i, f) in files.text.iter_mut().enumerate() {
        if (i > 0 && !due.text) || (i == 0 && !due.state) {
            got.text_not_due[i] = true;
            continue;
        }
        match f.read(&files.dir, &mut s.text[i], io.budget) {
            Ok(()) => got.text[i] = true,
            Err(ReadError::Stale) if abort_stale => return Err(ReadError::Stale),
            Err(_) => failed = true,
        }
    }
    for (g, dir) in files.groups.iter_mut().enumerate() {
        let Some(dir) = dir else { continue };
        if g == HW && !due.hw {
            continue;
        }
        let vals = &mut s.values[g];
        vals.clear();
        for (k, f) in dir.files.iter_mut().enumerate() {
            let wanted = due.only.is_none_or(|o| o.get(g).and_then(|w| w.get(k)).copied().unwrap_or(false));
            if (f.paced && !due.paced[g]) || !wanted {
                vals.push(Err(ReadFailure::NotDue));
                continue;
            }
            let v = match f.read(&dir.dir, &mut s.buf, io.budget) {
                Ok(()) => parse::parse_counter_bytes(&s.buf).map_err(ReadFailure::Value),
                Err(ReadError::Stale) if abort_stale => return Err(ReadError::Stale),
                Err(_) => {
                    failed = true;
                    Err(ReadFailure::Io)
                }
            };
            vals.push(v);
        }
        got.groups[g] = true;
    }
    // On sysfs a failed read may be a file the driver re-created: look again next sweep.
    if failed && files.dir.sysfs {
        files.relist_soon();
    }
    Ok(got)
}
