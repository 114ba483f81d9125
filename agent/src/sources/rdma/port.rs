//! One RDMA port: its counters' state, how a sweep reads them through the open-file cache
//! ([`files`](super::files)) and how they are exported.
//!
//! A sweep is two passes: first every file due is read (nothing else changes, so a stale
//! cache can be dropped and the port read again from paths), then the readings are applied
//! in the order the source has always used (groups `counters`, `counters_ext`, `hw_counters`,
//! names sorted within each), which decides which generic names fit under the label cap.
//! Everything a port needs per sweep is resolved once and kept: each file's counter slot,
//! each counter's spec and series handle, the port's labels and typed series handles.

use std::{collections::BTreeSet, path::PathBuf, time::Duration};

use prometheus_client::metrics::{counter::Counter, gauge::Gauge};

use super::{
    files::{Budget, PortFiles, Tag},
    gather::{read_files, Due},
    hw_every,
    metrics::{set_counter, CounterLabels, FloatGauge, Metrics, PortLabels},
    now_ns,
    parse::{self, ReadFailure},
    spec::{self, Group, Target, Typed},
    TopoEntry, KIND_CARDINALITY, MAX_COUNTER_NAMES, SOURCE,
};
use crate::sources::{
    counter::{rate_bound, Delta, Guarded, Semantics},
    kind, Errors,
};

/// The counter groups, in the order of [`files::GROUP_DIRS`](super::files::GROUP_DIRS).
const GROUPS: [Group; 3] = [Group::Pma, Group::PmaLegacyExt, Group::Hw];
pub(super) const HW: usize = 2;

/// One counter file's accumulated state (kept when its file vanishes or is reopened).
#[derive(Debug)]
pub(super) struct CounterState {
    pub group: Group,
    pub name: String,
    prev: Guarded,
    /// Monotonic time of the last reading (good or not), for the rate bound.
    at_ns: u64,
    /// Cumulative value in the metric's unit.
    pub total: u64,
    target: Target,
    /// Depends on the port's table width (`ext`): recomputed when it changes.
    semantics: Semantics,
    scale: u64,
    /// The series of a generic counter (typed ones are summed per port first).
    series: Option<Counter>,
}

impl CounterState {
    /// Adds the delta to reading `v` at monotonic `now`, or counts it as a glitch.
    fn fold(&mut self, io: &Io, v: u64, rate: Option<f64>, now: u64) {
        let max = if self.target.is_line_rate_bound() { rate_bound(rate, now.saturating_sub(self.at_ns)).map(|b| b / self.scale.max(1)) } else { None };
        self.at_ns = now;
        let Some(d) = self.prev.next(self.semantics, v, max) else {
            io.err(kind::COUNTER_GLITCH);
            return;
        };
        match d {
            Delta::Reset(_) => io.err(kind::COUNTER_RESET),
            // Entering saturation: the true count is lost from here until a reset.
            Delta::Saturated(x) if x > 0 => io.err(kind::COUNTER_RESET),
            _ => {}
        }
        self.total = self.total.saturating_add(d.value().saturating_mul(self.scale));
    }
}

/// A port's series under its current labels, created on first use.
#[derive(Debug, Default)]
struct Series {
    up: Option<Gauge>,
    rate: Option<FloatGauge>,
    typed: [Option<Counter>; Typed::COUNT],
}

impl Series {
    fn up(&mut self, m: &Metrics, l: &PortLabels) -> &Gauge {
        self.up.get_or_insert_with(|| m.port_up.get_or_create_owned(l))
    }
    fn rate(&mut self, m: &Metrics, l: &PortLabels) -> &FloatGauge {
        self.rate.get_or_insert_with(|| m.link_rate.get_or_create_owned(l))
    }
    fn typed(&mut self, m: &Metrics, l: &PortLabels, i: usize) -> Option<&Counter> {
        if self.typed[i].is_none() {
            let t = Typed::from_index(i)?;
            self.typed[i] = Some(match (t, m.port_family(t)) {
                (_, Some(fam)) => fam.get_or_create_owned(l),
                (Typed::Retransmit(reason), None) => m.retransmit_events.get_or_create_owned(&l.retransmit(reason)),
                (Typed::TransmitWaitTicks, None) => m.transmit_wait.get_or_create_owned(l).ticks,
                _ => return None,
            });
        }
        self.typed[i].as_ref()
    }
}

/// A text attribute's last raw bytes and what they parsed to (re-parsed only on change).
#[derive(Debug, Default)]
struct Text<T> {
    raw: Vec<u8>,
    valid: bool,
    parsed: T,
}

impl<T> Text<T> {
    fn get(&mut self, now: &[u8], parse: impl FnOnce(&str) -> T) -> &T {
        if !self.valid || self.raw != now {
            self.raw.clear();
            self.raw.extend_from_slice(now);
            self.parsed = parse(String::from_utf8_lossy(now).trim());
            self.valid = true;
        }
        &self.parsed
    }
}

/// Scratch space and shared context of a sweep.
pub(super) struct Io<'a> {
    pub metrics: &'a Metrics,
    pub errors: &'a Errors,
    pub names: &'a mut BTreeSet<String>,
    pub budget: &'a Budget,
    pub interval: Duration,
    /// Re-list directories every this many sweeps (see [`files`](super::files)).
    pub relist_every: u32,
    /// Read paced (metric-only) files every this many sweeps (see [`super::METRICS_PERIOD`]).
    pub metrics_every: u32,
    pub scratch: &'a mut Scratch,
}

impl Io<'_> {
    fn err(&self, kind: &'static str) {
        self.errors.inc(SOURCE, kind);
    }
}

/// Buffers reused by every port of every sweep.
#[derive(Debug, Default)]
pub(super) struct Scratch {
    pub(super) buf: Vec<u8>,
    pub(super) text: [Vec<u8>; 3],
    pub(super) values: [Vec<Result<u64, ReadFailure>>; 3],
}

/// What the read pass got: which text files and which counter groups were read.
#[derive(Debug, Default)]
pub(super) struct Gathered {
    pub(super) text: [bool; 3],
    /// Text files left unread this sweep (`rate`, `link_layer` between their paced reads).
    pub(super) text_not_due: [bool; 3],
    pub(super) groups: [bool; 3],
}

#[derive(Debug)]
pub(super) struct PortState {
    /// `<sysfs>/class/infiniband/<dev>/ports/<p>`.
    pub path: PathBuf,
    pub labels: Option<PortLabels>,
    series: Series,
    /// Topology generation the labels were computed for.
    topo_gen: Option<u64>,
    pub netdev: Option<String>,
    pub rail: u32,
    pub present: bool,
    /// Data/packet PMA counters are 64-bit (Ext or NOIETF table); sticky once seen.
    pub ext: bool,
    /// The `ext` the counters' semantics were computed for.
    spec_ext: bool,
    /// Never shrinks: [`Tag::Counter`] indices stay valid.
    pub counters: Vec<CounterState>,
    /// Per [`Typed::index`]: the port's total, if a counter feeds it.
    pub totals: [Option<u64>; Typed::COUNT],
    /// Read hw_counters every this many sweeps (see [`hw_every`]).
    pub hw_every: u32,
    hw_countdown: u32,
    /// Sweeps left until the paced files are due again.
    paced_countdown: u32,
    /// Per group: its paced files are due at the next sweep that reads the group (hw_counters
    /// may not be read on the sweep the period ends).
    paced_due: [bool; 3],
    /// `rate` and `link_layer` are due: at each period, and after `state` changed (a link
    /// renegotiates its rate only through a state change).
    text_due: bool,
    pub lifespan_ms: Option<u64>,
    pub up: bool,
    pub state: Option<String>,
    pub link_layer: Option<String>,
    pub rate: Option<f64>,
    /// Files read / skipped per group in the last sweep that read the group.
    pub groups: [Option<(usize, usize)>; 3],
    pub read_monotonic_ns: u64,
    pub read_unix_ns: u64,
    /// Sweep number of the last sweep that listed the port.
    pub seen: u64,
    /// Open files; `None` until the first sweep, and after the port vanished.
    pub files: Option<PortFiles>,
    state_text: Text<Option<parse::PortState>>,
    rate_text: Text<Option<f64>>,
    link_text: Text<Option<String>>,
}

impl PortState {
    pub fn new(path: PathBuf) -> Self {
        PortState {
            path,
            labels: None,
            series: Series::default(),
            topo_gen: None,
            netdev: None,
            rail: 0,
            present: false,
            ext: false,
            spec_ext: false,
            counters: Vec::new(),
            totals: [None; Typed::COUNT],
            hw_every: 1,
            hw_countdown: 0,
            paced_countdown: 0,
            paced_due: [true; 3],
            text_due: true,
            lifespan_ms: None,
            up: false,
            state: None,
            link_layer: None,
            rate: None,
            groups: [None; 3],
            read_monotonic_ns: 0,
            read_unix_ns: 0,
            seen: 0,
            files: None,
            state_text: Text::default(),
            rate_text: Text::default(),
            link_text: Text::default(),
        }
    }

    /// Whether the labels predate topology generation `gen` (the caller then looks the port
    /// up in the topology).
    pub fn labels_stale(&self, gen: u64) -> bool {
        self.topo_gen != Some(gen)
    }

    /// Sum of the retransmission reasons' totals.
    pub fn retransmits(&self) -> u64 {
        (0..Typed::COUNT).filter(|i| matches!(Typed::from_index(*i), Some(Typed::Retransmit(_)))).filter_map(|i| self.totals[i]).fold(0u64, u64::saturating_add)
    }

    pub fn total(&self, t: Typed) -> u64 {
        self.totals[t.index()].unwrap_or(0)
    }

    /// The port is gone: its series keep their values, `port_up` drops to 0, files close.
    pub fn vanish(&mut self, m: &Metrics) {
        self.files = None;
        if self.present {
            self.present = false;
            self.up = false;
            if let Some(l) = &self.labels {
                self.series.up(m, l).set(0);
            }
        }
    }

    /// Labels from the topology (recomputed only when it was rediscovered). A known port keeps
    /// its rail: rediscovery after another NIC vanished renumbers the remaining ones by
    /// position, but the rail is a physical fact of this port.
    fn relabel(&mut self, m: &Metrics, dev: &str, port: u32, topo: Option<&TopoEntry>, topo_gen: u64) {
        if self.topo_gen == Some(topo_gen) {
            return;
        }
        self.topo_gen = Some(topo_gen);
        if self.labels.is_none() {
            self.rail = topo.map_or(0, |t| t.rail);
        }
        if let Some(n) = topo.and_then(|t| t.netdev.as_ref()) {
            self.netdev = Some(n.clone());
        }
        let labels =
            PortLabels { device: dev.to_string(), port: port.to_string(), netdev: self.netdev.clone().unwrap_or_default(), rail: self.rail.to_string() };
        if self.labels.as_ref() == Some(&labels) {
            return;
        }
        self.forget_series(m);
        self.labels = Some(labels);
    }

    /// Removes a port's labelled series before it is re-exported under new labels (the new
    /// series start at the port's full cumulative values, so nothing is lost).
    fn forget_series(&mut self, m: &Metrics) {
        self.series = Series::default();
        let Some(l) = &self.labels else { return };
        for t in (0..Typed::COUNT).filter(|i| self.totals[*i].is_some()).filter_map(Typed::from_index) {
            match (t, m.port_family(t)) {
                (_, Some(fam)) => {
                    fam.remove(l);
                }
                (Typed::Retransmit(reason), None) => {
                    m.retransmit_events.remove(&l.retransmit(reason));
                }
                (Typed::TransmitWaitTicks, None) => {
                    m.transmit_wait.remove(l);
                }
                _ => {}
            }
        }
        m.port_up.remove(l);
        m.link_rate.remove(l);
    }

    /// Reads one port; `None` if its directory no longer exists, else (values read, skipped).
    pub fn sweep(&mut self, io: &mut Io, dev: &str, port: u32, topo: Option<&TopoEntry>, topo_gen: u64) -> Option<(usize, usize)> {
        let hw_due = self.hw_countdown == 0;
        if self.paced_countdown == 0 {
            self.paced_due = [true; 3];
            self.text_due = true;
            self.paced_countdown = io.metrics_every;
        }
        self.paced_countdown -= 1;
        let got = self.gather(io, hw_due)?;
        for (due, read) in self.paced_due.iter_mut().zip(got.groups) {
            *due &= !read;
        }
        self.text_due &= got.text_not_due[1];
        self.present = true;
        self.relabel(io.metrics, dev, port, topo, topo_gen);
        let mut skipped = self.apply_text(io, &got);
        // hw_counters pacing: a lifespan read now sets the period from this sweep on.
        if hw_due {
            if got.groups[HW] {
                if let Some(files) = self.files.as_ref().and_then(|f| f.groups[HW].as_ref()) {
                    let lifespan = files.files.iter().zip(&io.scratch.values[HW]).find(|(f, _)| f.name == "lifespan");
                    if let Some((_, Ok(ms))) = lifespan {
                        self.lifespan_ms = Some(*ms);
                        self.hw_every = hw_every(io.interval, *ms);
                    }
                }
            }
            self.hw_countdown = self.hw_every.saturating_sub(1);
        } else {
            self.hw_countdown -= 1;
        }
        if got.groups[0] {
            if let Some(files) = self.files.as_ref().and_then(|f| f.groups[0].as_ref()) {
                self.ext |=
                    files.files.iter().zip(&io.scratch.values[0]).any(|(f, v)| {
                        spec::is_ext_only(&f.name) || (spec::is_pma_data_or_packets(&f.name) && v.as_ref().is_ok_and(|x| *x > u64::from(u32::MAX)))
                    });
            }
        }
        if self.ext != self.spec_ext {
            self.spec_ext = self.ext;
            for c in &mut self.counters {
                c.semantics = spec::spec(c.group, &c.name, self.ext).semantics;
            }
        }
        let mut read = 0;
        for g in (0..3).filter(|g| got.groups[*g]) {
            let (r, s) = self.apply_group(io, dev, port, g);
            self.groups[g] = Some((r, s));
            read += r;
            skipped += s;
        }
        (self.read_monotonic_ns, self.read_unix_ns) = now_ns();
        self.export(io.metrics);
        // Past the descriptor budget the port's files are closed after its sweep: its
        // directories are opened again at the next one, as reads by path would.
        if io.budget.over() {
            self.files = None;
        }
        Some((read, skipped))
    }

    /// The fast lane's read (`daemon::fast`): the attribution counters only (the PMA and
    /// legacy-ext groups' data and transmit-wait files; not packets, hw_counters, paced files
    /// or text) through the files
    /// the last sweep opened (revalidated: a fixture's files are replaced, sysfs's never),
    /// into the port's totals. `false` when nothing could be read (the
    /// next full sweep reopens what went stale).
    pub fn fast(&mut self, io: &mut Io, dev: &str, port: u32) -> bool {
        let Some(files) = self.files.as_mut().filter(|_| self.present) else { return false };
        if files.revalidate(&self.path, false, io.budget).is_err() {
            return false;
        }
        // Bytes and transmit wait: what attribution reads of a window.
        let counters = &self.counters;
        let wanted = |g: usize| -> Vec<bool> {
            let Some(d) = files.groups[g].as_ref() else { return Vec::new() };
            d.files
                .iter()
                .map(|f| match f.tag {
                    Tag::Counter(i) => counters
                        .get(i)
                        .is_some_and(|c| matches!(c.target, Target::Typed(Typed::TransmitBytes | Typed::ReceiveBytes | Typed::TransmitWaitTicks))),
                    _ => false,
                })
                .collect()
        };
        let only = [wanted(0), wanted(1)];
        let due = Due { hw: false, paced: [false; 3], text: false, state: false, only: Some(&only) };
        let Ok(got) = read_files(files, io, due, true) else {
            return false;
        };
        let mut read = 0;
        for g in (0..HW).filter(|g| got.groups[*g]) {
            read += self.apply_group(io, dev, port, g).0;
        }
        (self.read_monotonic_ns, self.read_unix_ns) = now_ns();
        self.export(io.metrics);
        read > 0
    }

    /// The read pass: through the open files, rebuilt from paths once if they went stale.
    fn gather(&mut self, io: &mut Io, hw_due: bool) -> Option<Gathered> {
        for last in [false, true] {
            match &mut self.files {
                None => match PortFiles::open(&self.path, io.budget) {
                    Ok(f) => self.files = Some(f),
                    Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => return None,
                    // Unreadable: every text read fails, no group, as a failed read would.
                    Err(_) => return Some(Gathered::default()),
                },
                Some(f) => {
                    if f.refresh(&self.path, io.relist_every, io.budget).is_err() {
                        self.files = None;
                        continue;
                    }
                }
            }
            let Some(files) = self.files.as_mut() else { continue };
            match read_files(files, io, Due { hw: hw_due, paced: self.paced_due, text: self.text_due, state: true, only: None }, !last) {
                Ok(g) => return Some(g),
                Err(_) => self.files = None,
            }
        }
        Some(Gathered::default())
    }

    /// state, rate, link_layer (attributes of every IB port, core sysfs.c); returns skipped.
    fn apply_text(&mut self, io: &mut Io, got: &Gathered) -> usize {
        let mut skipped = 0;
        for (ok, not_due) in got.text.into_iter().zip(got.text_not_due) {
            if !ok && !not_due {
                io.err(kind::READ);
                skipped += 1;
            }
        }
        let (m, text) = (io.metrics, &io.scratch.text);
        let Some(labels) = &self.labels else { return skipped };
        if got.text[0] {
            self.text_due |= !self.state_text.valid || self.state_text.raw != text[0];
            match self.state_text.get(&text[0], parse::parse_state) {
                Some(s) => {
                    self.up = s.is_active();
                    if self.state.as_deref() != Some(s.name.as_str()) {
                        self.state = Some(s.name.clone());
                    }
                    self.series.up(m, labels).set(i64::from(self.up));
                }
                None => {
                    io.err(kind::PARSE);
                    skipped += 1;
                }
            }
        }
        if got.text[1] {
            match *self.rate_text.get(&text[1], crate::topology::parse_ib_rate) {
                Some(r) => {
                    self.rate = Some(r);
                    self.series.rate(m, labels).set(r);
                }
                None => {
                    io.err(kind::PARSE);
                    skipped += 1;
                }
            }
        }
        if got.text_not_due[2] {
            return skipped;
        }
        let link = if got.text[2] { self.link_text.get(&text[2], parse::parse_link_layer).as_deref() } else { None };
        if self.link_layer.as_deref() != link {
            self.link_layer = link.map(str::to_string);
        }
        skipped
    }

    /// Folds one group's readings into the port's counters; returns (read, skipped).
    fn apply_group(&mut self, io: &mut Io, dev: &str, port: u32, g: usize) -> (usize, usize) {
        let group = GROUPS[g];
        let (mut read, mut skipped) = (0, 0);
        let now = now_ns().0;
        let Some(dir) = self.files.as_mut().and_then(|f| f.groups[g].as_mut()) else { return (0, 0) };
        for (f, value) in dir.files.iter_mut().zip(&io.scratch.values[g]) {
            if f.tag == Tag::New && group == Group::Hw && spec::is_hw_control_file(&f.name) {
                f.tag = Tag::Control;
                f.paced = true;
            }
            if f.tag == Tag::Control {
                continue;
            }
            let v = match value {
                Ok(v) => *v,
                Err(ReadFailure::NotDue) => continue,
                Err(e) => {
                    io.err(e.kind());
                    skipped += 1;
                    continue;
                }
            };
            let i = match f.tag {
                Tag::Counter(i) => i,
                Tag::OverCap => {
                    io.err(KIND_CARDINALITY);
                    skipped += 1;
                    continue;
                }
                _ => match self.counters.iter().position(|c| c.group == group && c.name == f.name) {
                    Some(i) => {
                        f.tag = Tag::Counter(i);
                        f.paced = self.counters.get(i).is_some_and(|c| !matches!(c.target, Target::Typed(_)));
                        i
                    }
                    None => {
                        let sp = spec::spec(group, &f.name, self.ext);
                        if !matches!(sp.target, Target::Typed(_)) && !io.names.contains(&f.name) {
                            if io.names.len() >= MAX_COUNTER_NAMES {
                                io.err(KIND_CARDINALITY);
                                skipped += 1;
                                f.tag = Tag::OverCap;
                                f.paced = true;
                                continue;
                            }
                            io.names.insert(f.name.clone());
                        }
                        let fam = match sp.target {
                            Target::Typed(_) => None,
                            Target::HwGeneric => Some(io.metrics.hw_counter.family(&f.name)),
                            Target::PortGeneric => Some(io.metrics.port_counter.family(&f.name)),
                        };
                        let series =
                            fam.map(|fam| fam.get_or_create_owned(&CounterLabels { device: dev.to_string(), port: port.to_string(), counter: f.name.clone() }));
                        f.tag = Tag::Counter(self.counters.len());
                        f.paced = !matches!(sp.target, Target::Typed(_));
                        self.counters.push(CounterState {
                            group,
                            name: f.name.clone(),
                            prev: Guarded::new(v),
                            at_ns: now,
                            total: v.saturating_mul(sp.scale),
                            target: sp.target,
                            semantics: sp.semantics,
                            scale: sp.scale,
                            series,
                        });
                        read += 1;
                        continue;
                    }
                },
            };
            read += 1;
            if let Some(c) = self.counters.get_mut(i) {
                c.fold(io, v, self.rate, now);
            }
        }
        (read, skipped)
    }

    /// Recomputes the port's typed totals and drives its series to them.
    fn export(&mut self, m: &Metrics) {
        // Pre-4.5 kernels expose 64-bit data/packets only as counters_ext/*_64: prefer them
        // over the 32-bit counters/ copies.
        let mut legacy = [false; Typed::COUNT];
        for c in self.counters.iter().filter(|c| c.group == Group::PmaLegacyExt) {
            if let Target::Typed(t) = c.target {
                legacy[t.index()] = true;
            }
        }
        let mut totals = [None; Typed::COUNT];
        for c in &self.counters {
            match c.target {
                Target::Typed(t) if c.group == Group::Pma && legacy[t.index()] => {}
                Target::Typed(t) => {
                    let e: &mut Option<u64> = &mut totals[t.index()];
                    *e = Some(e.unwrap_or(0).saturating_add(c.total));
                }
                Target::HwGeneric | Target::PortGeneric => {
                    if let Some(s) = &c.series {
                        set_counter(s, c.total);
                    }
                }
            }
        }
        if let Some(l) = &self.labels {
            for (i, v) in totals.iter().enumerate() {
                if let (Some(v), Some(c)) = (v, self.series.typed(m, l, i)) {
                    set_counter(c, *v);
                }
            }
        }
        self.totals = totals;
    }
}
