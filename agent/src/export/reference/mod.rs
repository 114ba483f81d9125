//! The metrics reference (`docs/metrics.md`), generated from the registry the daemon builds.
//!
//! Every family is registered through [`RegisterSampled::register_sampled`]. In a running
//! agent that is `Registry::register`; while [`families`] builds the reference (a thread-local
//! switch, so concurrent tests are not affected) it also creates one series of the family
//! with the label set's `Default` value. prometheus-client encodes only families that have a
//! series, so that one series is what makes every family, its type, help and label *names*
//! visible without hardware. A family registered without `register_sampled` would not appear:
//! [`check::against_exposition`] then fails on a real agent's `/metrics`, naming it.
//!
//! Each family's source is the stage of [`families`] that registered it, in the daemon's
//! order; [`notes`] says when a source's families are absent. `docs/metrics.md` is
//! [`render::markdown`] of [`families`]; a unit test fails when the file is not up to date
//! (`STEPWISE_BLESS=1` rewrites it).

pub mod check;
pub mod notes;
pub mod render;

use std::{cell::Cell, collections::BTreeMap, hash::Hash};

use prometheus_client::{
    metrics::{
        counter::Counter,
        family::{Family, MetricConstructor},
        gauge::Gauge,
        histogram::Histogram,
    },
    registry::{Metric, Registry},
};

thread_local! {
    /// Set while [`families`] builds the reference registry on this thread.
    static SAMPLING: Cell<bool> = const { Cell::new(false) };
}

/// A metric that can show itself with one series of default labels (see the module doc).
pub trait Sample {
    fn sample(&self);
}

impl<N, A> Sample for Counter<N, A> {
    fn sample(&self) {}
}

impl<N, A> Sample for Gauge<N, A> {
    fn sample(&self) {}
}

impl Sample for Histogram {
    fn sample(&self) {}
}

impl<S: Clone + Hash + Eq + Default, M, C: MetricConstructor<M>> Sample for Family<S, M, C> {
    fn sample(&self) {
        let _ = self.get_or_create(&S::default());
    }
}

/// `Registry::register`, plus the reference's sample series while [`families`] runs.
pub trait RegisterSampled {
    fn register_sampled<N: Into<String>, H: Into<String>>(&mut self, name: N, help: H, metric: impl Metric + Sample);
}

impl RegisterSampled for Registry {
    fn register_sampled<N: Into<String>, H: Into<String>>(&mut self, name: N, help: H, metric: impl Metric + Sample) {
        if SAMPLING.with(Cell::get) {
            metric.sample();
        }
        self.register(name, help, metric);
    }
}

/// One family as `/metrics` (Prometheus text 0.0.4) names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FamilyRef {
    /// The name on `/metrics`: counters with `_total`.
    pub name: String,
    /// `counter`, `gauge`, `histogram`, …
    pub kind: String,
    pub help: String,
    /// The label names of its series (`le` of histograms left out), in encoding order.
    pub labels: Vec<String>,
    /// Which part of the agent registers it (a [`notes::SOURCES`] key).
    pub source: &'static str,
}

/// The families of one Prometheus text (0.0.4 or OpenMetrics) exposition: name → (type,
/// help, label names of each series). Counters are named with `_total`.
pub fn parse_exposition(text: &str) -> BTreeMap<String, Exposed> {
    let mut out: BTreeMap<String, Exposed> = BTreeMap::new();
    let mut helps: BTreeMap<&str, &str> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            helps.insert(name, help);
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let name = if kind == "counter" && !name.ends_with("_total") { format!("{name}_total") } else { name.to_string() };
            let help = helps.get(rest.split(' ').next().unwrap_or_default()).copied().unwrap_or_default().to_string();
            out.insert(name, Exposed { kind: kind.to_string(), help, labels: Vec::new() });
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let series = line.split(['{', ' ']).next().unwrap_or_default();
            let labels = label_names(line);
            if let Some(f) = family_of(&mut out, series) {
                if !f.labels.contains(&labels) {
                    f.labels.push(labels);
                }
            }
        }
    }
    out
}

/// What an exposition says of one family.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Exposed {
    pub kind: String,
    pub help: String,
    /// The distinct label-name lists of its series (`le`, `quantile` left out).
    pub labels: Vec<Vec<String>>,
}

/// The family a series belongs to: its own name, or a histogram's `_bucket`/`_sum`/`_count`,
/// or an OpenMetrics counter's `_total`/`_created`.
fn family_of<'a>(fams: &'a mut BTreeMap<String, Exposed>, series: &str) -> Option<&'a mut Exposed> {
    let base = ["_bucket", "_sum", "_count", "_created"].iter().find_map(|s| series.strip_suffix(s)).filter(|b| fams.contains_key(*b));
    let key = if fams.contains_key(series) {
        series.to_string()
    } else if let Some(b) = base {
        b.to_string()
    } else {
        format!("{}_total", series.strip_suffix("_created").unwrap_or(series))
    };
    fams.get_mut(&key)
}

/// The label names of one series line, in order (`le`, `quantile` left out).
fn label_names(line: &str) -> Vec<String> {
    let Some(open) = line.find('{') else { return Vec::new() };
    let mut names = Vec::new();
    let mut rest = &line[open + 1..];
    while let Some(eq) = rest.find("=\"") {
        let name = rest[..eq].trim_start_matches([',', ' ']).to_string();
        // Skip the quoted value (with `\"` escapes).
        let mut value = rest[eq + 2..].char_indices();
        let mut end = None;
        let mut escaped = false;
        for (i, c) in value.by_ref() {
            match c {
                '\\' if !escaped => escaped = true,
                '"' if !escaped => {
                    end = Some(eq + 2 + i + 1);
                    break;
                }
                _ => escaped = false,
            }
        }
        if name != "le" && name != "quantile" {
            names.push(name);
        }
        let Some(end) = end else { break };
        rest = &rest[end..];
        if rest.starts_with('}') {
            break;
        }
    }
    names
}

/// Every family the agent can export, in the daemon's registration order, with its source.
pub fn families() -> Vec<FamilyRef> {
    SAMPLING.with(|s| s.set(true));
    let _reset = Reset;
    let mut b = Builder::default();
    for (source, register) in notes::stages() {
        register(&mut b.registry);
        b.take(source);
    }
    b.out
}

/// Clears [`SAMPLING`] however [`families`] ends.
struct Reset;

impl Drop for Reset {
    fn drop(&mut self) {
        SAMPLING.with(|s| s.set(false));
    }
}

#[derive(Default)]
struct Builder {
    registry: Registry,
    out: Vec<FamilyRef>,
}

impl Builder {
    /// The families registered since the last call belong to `source`.
    fn take(&mut self, source: &'static str) {
        let mut om = String::new();
        prometheus_client::encoding::text::encode(&mut om, &self.registry).expect("encoding to a String does not fail");
        let text = super::metrics::openmetrics_to_text(&om);
        let exposed = parse_exposition(&text);
        // Registration order: the order of `# TYPE` lines.
        for name in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|r| r.split(' ').next()) {
            if self.out.iter().any(|f| f.name == name) {
                continue;
            }
            let e = &exposed[name];
            self.out.push(FamilyRef {
                name: name.to_string(),
                kind: e.kind.clone(),
                help: e.help.clone(),
                labels: e.labels.first().cloned().unwrap_or_default(),
                source,
            });
        }
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
