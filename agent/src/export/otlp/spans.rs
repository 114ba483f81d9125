//! An attributed step → OTLP spans: one `step` span, a child per collective (first arrival
//! → last exit, an `arrival` event per rank at the moment its data was ready) and a child
//! per cause.
//!
//! Causes are seconds, not intervals (docs/architecture.md "What a cause's seconds mean"), so
//! the cause spans are laid end to end from the step's begin in a fixed order — the stacked
//! breakdown of the step as a trace view draws it; their durations are exact, their start
//! times are only a layout.
//!
//! Attribute keys are namespaced `stepwise.*` (OpenTelemetry naming rules for attributes
//! outside the semantic conventions): `stepwise.rank`, `.comm`, `.op`, `.bytes`,
//! `.seconds`, `.kind`, …; `stepwise.span` says which of the three a span is.

use std::hash::{BuildHasher, Hasher};

use opentelemetry_proto::tonic::{
    common::v1::{any_value, AnyValue, KeyValue},
    trace::v1::{span, Span},
};

use super::prom::kv_str;
use crate::{
    attribution::{Attribution, CauseKind},
    timeline::Collective,
};

/// A step the engine attributed, as handed to the exporter.
#[derive(Clone, Debug)]
pub struct FinishedStep {
    /// The engine's job key (`markers`, or the communicator whose period defined the step).
    pub job: String,
    pub attribution: Attribution,
    pub collectives: Vec<Collective>,
}

/// Most collective spans under one step; the rest are counted in
/// `stepwise.collective_spans_dropped` (a step of an FSDP job may issue thousands).
pub const MAX_COLLECTIVE_SPANS: usize = 256;
/// Most `arrival` events on one collective span.
pub const MAX_ARRIVAL_EVENTS: usize = 128;

/// Trace and span ids: SipHash with this process's random keys over a counter — unique,
/// unpredictable enough for tracing, never zero, and no RNG crate.
pub struct Ids {
    state: std::collections::hash_map::RandomState,
    n: u64,
}

impl Default for Ids {
    fn default() -> Self {
        Ids { state: std::collections::hash_map::RandomState::new(), n: 0 }
    }
}

impl Ids {
    fn next(&mut self) -> u64 {
        loop {
            self.n = self.n.wrapping_add(1);
            let mut h = self.state.build_hasher();
            h.write_u64(self.n);
            let v = h.finish();
            if v != 0 {
                return v;
            }
        }
    }
    pub fn span_id(&mut self) -> Vec<u8> {
        self.next().to_be_bytes().to_vec()
    }
    pub fn trace_id(&mut self) -> Vec<u8> {
        let mut v = self.next().to_be_bytes().to_vec();
        v.extend_from_slice(&self.next().to_be_bytes());
        v
    }
}

fn kv_i(k: &str, v: i64) -> KeyValue {
    KeyValue { key: k.into(), value: Some(AnyValue { value: Some(any_value::Value::IntValue(v)) }), ..Default::default() }
}
fn kv_f(k: &str, v: f64) -> KeyValue {
    KeyValue { key: k.into(), value: Some(AnyValue { value: Some(any_value::Value::DoubleValue(v)) }), ..Default::default() }
}
fn kv_b(k: &str, v: bool) -> KeyValue {
    KeyValue { key: k.into(), value: Some(AnyValue { value: Some(any_value::Value::BoolValue(v)) }), ..Default::default() }
}

/// Wall seconds → Unix nanoseconds (0 for times before the epoch or not finite).
pub fn nanos(t: f64) -> u64 {
    if t.is_finite() && t > 0.0 {
        (t * 1e9).round() as u64
    } else {
        0
    }
}

fn internal() -> i32 {
    span::SpanKind::Internal as i32
}

fn collective_span(c: &Collective, trace_id: &[u8], parent: &[u8], ids: &mut Ids) -> Span {
    let (first, last, exit) = (c.first_arrival(), c.last_arrival(), c.last_exit());
    let mut attributes = vec![
        kv_str("stepwise.span", "collective"),
        kv_str("stepwise.comm", c.comm.as_str()),
        kv_i("stepwise.seq", c.seq as i64),
        kv_str("stepwise.op", c.op.as_str()),
        kv_str("stepwise.library", c.library.as_str()),
        kv_f("stepwise.seconds", (exit - first).max(0.0)),
        kv_f("stepwise.skew_seconds", c.skew()),
        kv_f("stepwise.transfer_seconds", c.transfer()),
        kv_i("stepwise.ranks", c.arrivals.len() as i64),
    ];
    if let Some(b) = c.bytes {
        attributes.push(kv_i("stepwise.bytes", i64::try_from(b).unwrap_or(i64::MAX)));
    }
    if let Some(n) = c.nranks {
        attributes.push(kv_i("stepwise.nranks", n as i64));
    }
    // The rank everyone waited for.
    if let Some(a) = c.late_rank().filter(|_| c.arrivals.len() >= 2) {
        attributes.push(kv_i("stepwise.rank", a.rank as i64));
        attributes.push(kv_str("stepwise.late_host", a.host.as_str()));
    }
    let events: Vec<span::Event> = c
        .arrivals
        .iter()
        .take(MAX_ARRIVAL_EVENTS)
        .map(|a| span::Event {
            time_unix_nano: nanos(a.enter),
            name: "arrival".into(),
            attributes: vec![
                kv_i("stepwise.rank", a.rank as i64),
                kv_str("stepwise.host", a.host.as_str()),
                kv_f("stepwise.wait_seconds", (last - a.enter).max(0.0)),
                kv_f("stepwise.inside_seconds", (a.exit - a.enter).max(0.0)),
            ],
            dropped_attributes_count: 0,
        })
        .collect();
    Span {
        trace_id: trace_id.to_vec(),
        span_id: ids.span_id(),
        parent_span_id: parent.to_vec(),
        name: c.op.clone(),
        kind: internal(),
        start_time_unix_nano: nanos(first),
        end_time_unix_nano: nanos(exit.max(first)),
        attributes,
        dropped_events_count: c.arrivals.len().saturating_sub(MAX_ARRIVAL_EVENTS) as u32,
        events,
        ..Default::default()
    }
}

/// The step's spans, root first.
pub fn step_spans(s: &FinishedStep, ids: &mut Ids) -> Vec<Span> {
    let a = &s.attribution;
    let trace_id = ids.trace_id();
    let root_id = ids.span_id();
    let mut root_attrs = vec![
        kv_str("stepwise.span", "step"),
        kv_i("stepwise.step", i64::try_from(a.step).unwrap_or(i64::MAX)),
        kv_str("stepwise.job", s.job.as_str()),
        kv_f("stepwise.seconds", a.seconds),
        kv_i("stepwise.collectives", a.collectives as i64),
        kv_b("stepwise.incomplete", a.incomplete),
    ];
    if let Some(top) = a.top_problem(0.0) {
        root_attrs.push(kv_str("stepwise.top_cause", top.kind.as_str()));
    }
    if s.collectives.len() > MAX_COLLECTIVE_SPANS {
        root_attrs.push(kv_i("stepwise.collective_spans_dropped", (s.collectives.len() - MAX_COLLECTIVE_SPANS) as i64));
    }
    let mut out = vec![Span {
        trace_id: trace_id.clone(),
        span_id: root_id.clone(),
        name: "step".into(),
        kind: internal(),
        start_time_unix_nano: nanos(a.begin),
        end_time_unix_nano: nanos(a.end.max(a.begin)),
        attributes: root_attrs,
        ..Default::default()
    }];
    for c in s.collectives.iter().take(MAX_COLLECTIVE_SPANS) {
        out.push(collective_span(c, &trace_id, &root_id, ids));
    }
    let mut t = a.begin;
    for k in CauseKind::ALL {
        let Some(c) = a.causes.iter().find(|c| c.kind == k) else { continue };
        let secs = c.seconds.max(0.0);
        let mut attributes =
            vec![kv_str("stepwise.span", "cause"), kv_str("stepwise.kind", k.as_str()), kv_f("stepwise.seconds", c.seconds), kv_f("stepwise.share", c.share)];
        if let Some(r) = c.rank {
            attributes.push(kv_i("stepwise.rank", r as i64));
        }
        if k.is_problem() && c.seconds > 0.0 && !c.fix.is_empty() {
            attributes.push(kv_str("stepwise.fix", c.fix.as_str()));
        }
        // Scalar evidence (lists such as the per-NIC table stay in the API and the store).
        for (key, v) in &c.evidence {
            let key = format!("stepwise.evidence.{key}");
            match v {
                serde_json::Value::Number(n) => attributes.push(n.as_i64().map(|i| kv_i(&key, i)).unwrap_or_else(|| kv_f(&key, n.as_f64().unwrap_or(0.0)))),
                serde_json::Value::String(x) => attributes.push(kv_str(&key, x.as_str())),
                serde_json::Value::Bool(b) => attributes.push(kv_b(&key, *b)),
                _ => {}
            }
        }
        out.push(Span {
            trace_id: trace_id.clone(),
            span_id: ids.span_id(),
            parent_span_id: root_id.clone(),
            name: k.as_str().into(),
            kind: internal(),
            start_time_unix_nano: nanos(t),
            end_time_unix_nano: nanos(t + secs),
            attributes,
            ..Default::default()
        });
        t += secs;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::Arrival;

    fn attr<'a>(s: &'a Span, k: &str) -> Option<&'a any_value::Value> {
        s.attributes.iter().find(|kv| kv.key == k).and_then(|kv| kv.value.as_ref()).and_then(|v| v.value.as_ref())
    }

    #[test]
    fn step_with_collective_and_cause_children() {
        let a = crate::report::fixtures::attribution();
        let arr = |rank, enter: f64| Arrival { rank, host: "node-a".into(), pid: 1, enter, exit: a.begin + 0.16, aborted: false, clock: Default::default() };
        let c = Collective {
            comm: "8f3c".into(),
            seq: 7,
            op: "all_reduce".into(),
            library: "nccl".into(),
            bytes: Some(1 << 26),
            nranks: Some(2),
            arrivals: vec![arr(0, a.begin + 0.1), arr(5, a.begin + 0.13)],
        };
        let s = FinishedStep { job: "markers".into(), attribution: a.clone(), collectives: vec![c] };
        let spans = step_spans(&s, &mut Ids::default());
        assert_eq!(spans.len(), 1 + 1 + 8, "root, one collective, eight causes");
        let root = &spans[0];
        assert_eq!(root.name, "step");
        assert_eq!(root.trace_id.len(), 16);
        assert_eq!(root.span_id.len(), 8);
        assert!(root.parent_span_id.is_empty());
        assert_eq!(attr(root, "stepwise.step"), Some(&any_value::Value::IntValue(42)));
        assert_eq!(attr(root, "stepwise.top_cause"), Some(&any_value::Value::StringValue("readiness_skew".into())));
        for s in &spans[1..] {
            assert_eq!(s.parent_span_id, root.span_id);
            assert_eq!(s.trace_id, root.trace_id);
            assert_ne!(s.span_id, root.span_id);
        }
        let coll = &spans[1];
        assert_eq!(coll.name, "all_reduce");
        assert_eq!(attr(coll, "stepwise.bytes"), Some(&any_value::Value::IntValue(1 << 26)));
        assert_eq!(attr(coll, "stepwise.rank"), Some(&any_value::Value::IntValue(5)), "late rank");
        assert_eq!(coll.events.len(), 2);
        assert_eq!(coll.events[1].time_unix_nano, nanos(a.begin + 0.13));
        let skew = spans.iter().find(|s| s.name == "readiness_skew").expect("cause span");
        assert_eq!(attr(skew, "stepwise.rank"), Some(&any_value::Value::IntValue(5)));
        assert_eq!(attr(skew, "stepwise.kind"), Some(&any_value::Value::StringValue("readiness_skew".into())));
        assert!(attr(skew, "stepwise.fix").is_some());
        // Cause spans tile the step exactly.
        let causes: Vec<&Span> = spans.iter().filter(|s| attr(s, "stepwise.span") == Some(&any_value::Value::StringValue("cause".into()))).collect();
        assert_eq!(causes[0].start_time_unix_nano, root.start_time_unix_nano);
        let last_end = causes.iter().map(|s| s.end_time_unix_nano).max().unwrap_or(0);
        assert!(last_end.abs_diff(root.end_time_unix_nano) < 1_000, "{last_end} vs {}", root.end_time_unix_nano);
    }

    #[test]
    fn ids_are_unique_and_nonzero() {
        let mut ids = Ids::default();
        let v: std::collections::BTreeSet<Vec<u8>> = (0..1000).map(|_| ids.span_id()).collect();
        assert_eq!(v.len(), 1000);
        assert!(!v.contains(&vec![0u8; 8]));
    }
}
