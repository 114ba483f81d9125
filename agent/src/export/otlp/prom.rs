//! The registry's OpenMetrics text → OTLP metrics. Converting the text that `/metrics`
//! serves (rather than each metric's Rust type) makes "the same metrics as `/metrics`" true
//! by construction: every family any source registers is exported, with its type
//! (counter → monotonic cumulative Sum, gauge → Gauge, histogram → Histogram; info,
//! stateset and unknown → Gauge), help text and unit.
//!
//! Names follow the OpenTelemetry ↔ Prometheus compatibility rules: a counter keeps its
//! family name without `_total` (`stepwise_steps_total` → `stepwise_steps`), which a
//! Prometheus exporter downstream turns back into `stepwise_steps_total`.

use opentelemetry_proto::tonic::{
    common::v1::{any_value, AnyValue, KeyValue},
    metrics::v1::{metric::Data, number_data_point, AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint, Sum},
};

/// A family's type, from its `# TYPE` line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
    /// `info`, `stateset`, `unknown`, `gaugehistogram`, `summary`: exported as gauges of
    /// their samples (the agent registers none of these today).
    Other,
}

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The sample name's suffix after the family name (`_total`, `_bucket`, or empty).
    pub suffix: String,
    pub labels: Labels,
    pub value: f64,
    /// The value as written was an integer.
    pub int: Option<i64>,
}

/// One metric family as the text describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    pub name: String,
    pub kind: Kind,
    pub help: String,
    pub unit: String,
    pub samples: Vec<Sample>,
}

/// Why a line of the text could not be read (the encoder wrote something unexpected).
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("line {line}: {reason}")]
pub struct ParseError {
    pub line: usize,
    pub reason: String,
}

fn unescape_help(s: &str) -> String {
    s.replace("\\n", "\n").replace("\\\\", "\\")
}

/// Label pairs of a sample, in order.
pub type Labels = Vec<(String, String)>;

/// `{a="x",b="y\"z"}` → pairs, and the rest of the line after `}`.
fn labels(s: &str) -> Result<(Labels, &str), String> {
    let mut out = Vec::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((out, r));
        }
        let (name, r) = rest.split_once("=\"").ok_or("label without =\"")?;
        let mut value = String::new();
        let mut chars = r.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => return Err("unterminated escape".into()),
                },
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => return Err("unterminated label value".into()),
            }
        };
        out.push((name.trim().to_string(), value));
        rest = &r[end + 1..];
    }
}

fn number(s: &str) -> Result<(f64, Option<i64>), String> {
    let v = match s {
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        _ => s.parse::<f64>().map_err(|e| format!("value {s:?}: {e}"))?,
    };
    let int = if s.bytes().all(|b| b.is_ascii_digit() || b == b'-') { s.parse::<i64>().ok() } else { None };
    Ok((v, int))
}

fn suffixes(k: Kind) -> &'static [&'static str] {
    match k {
        // "" for Prometheus 0.0.4 text, whose counter families carry the `_total` name.
        Kind::Counter => &["_total", "_created", ""],
        Kind::Gauge => &[""],
        Kind::Histogram => &["_bucket", "_sum", "_count", "_created"],
        Kind::Other => &["", "_info", "_sum", "_count", "_bucket", "_gsum", "_gcount", "_created"],
    }
}

/// Parses OpenMetrics (or Prometheus 0.0.4) text into families, in the order written.
pub fn parse(text: &str) -> Result<Vec<Family>, ParseError> {
    let mut fams: Vec<Family> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let err = |reason: String| ParseError { line: i + 1, reason };
        let line = line.trim_end();
        if line.is_empty() || line == "# EOF" {
            continue;
        }
        if let Some(meta) = line.strip_prefix("# ") {
            let mut parts = meta.splitn(3, ' ');
            let (what, name, rest) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            if !matches!(what, "TYPE" | "HELP" | "UNIT") {
                continue;
            }
            if fams.last().is_none_or(|f| f.name != name) {
                fams.push(Family { name: name.to_string(), kind: Kind::Other, help: String::new(), unit: String::new(), samples: Vec::new() });
            }
            let Some(f) = fams.last_mut() else { continue };
            match what {
                "TYPE" => {
                    f.kind = match rest {
                        "counter" => Kind::Counter,
                        "gauge" => Kind::Gauge,
                        "histogram" => Kind::Histogram,
                        _ => Kind::Other,
                    }
                }
                "HELP" => f.help = unescape_help(rest),
                _ => f.unit = rest.to_string(),
            }
            continue;
        }
        let name_end = line.find(['{', ' ']).ok_or_else(|| err("sample without a value".into()))?;
        let name = &line[..name_end];
        let (labels, rest) = if line[name_end..].starts_with('{') { labels(&line[name_end + 1..]).map_err(err)? } else { (Vec::new(), &line[name_end..]) };
        // `value [timestamp] [# exemplar]`: only the value is used.
        let value = rest.split_whitespace().next().ok_or_else(|| err(format!("{name}: no value")))?;
        let (value, int) = number(value).map_err(err)?;
        let fam = fams
            .iter_mut()
            .rev()
            .find(|f| name.strip_prefix(f.name.as_str()).is_some_and(|s| suffixes(f.kind).contains(&s)))
            .ok_or_else(|| err(format!("sample {name} outside any # TYPE family")))?;
        let suffix = name[fam.name.len()..].to_string();
        fam.samples.push(Sample { suffix, labels, value, int });
    }
    Ok(fams)
}

pub fn kv_str(k: &str, v: impl Into<String>) -> KeyValue {
    KeyValue { key: k.into(), value: Some(AnyValue { value: Some(any_value::Value::StringValue(v.into())) }), ..Default::default() }
}

fn attrs(labels: &[(String, String)], skip: &str) -> Vec<KeyValue> {
    labels.iter().filter(|(k, _)| k != skip).map(|(k, v)| kv_str(k, v.as_str())).collect()
}

/// UCUM for the base units the agent uses; anything else as written.
fn ucum(unit: &str) -> String {
    match unit {
        "seconds" => "s".into(),
        "bytes" => "By".into(),
        "ratio" => "1".into(),
        u => u.into(),
    }
}

fn number_point(s: &Sample, start: u64, now: u64) -> NumberDataPoint {
    let value = match s.int {
        Some(i) => number_data_point::Value::AsInt(i),
        None => number_data_point::Value::AsDouble(s.value),
    };
    NumberDataPoint { attributes: attrs(&s.labels, ""), start_time_unix_nano: start, time_unix_nano: now, value: Some(value), ..Default::default() }
}

/// One histogram point per label set (without `le`): cumulative buckets → per-bucket
/// counts, `+Inf` implied by OTLP's last bucket.
fn histogram_points(f: &Family, start: u64, now: u64) -> Vec<HistogramDataPoint> {
    // (labels without `le`, (le, cumulative count)s, sum, count)
    type Point = (Labels, Vec<(f64, f64)>, f64, f64);
    let mut points: Vec<Point> = Vec::new();
    for s in &f.samples {
        let key: Labels = s.labels.iter().filter(|(k, _)| k != "le").cloned().collect();
        let idx = match points.iter().position(|p| p.0 == key) {
            Some(i) => i,
            None => {
                points.push((key, Vec::new(), 0.0, 0.0));
                points.len() - 1
            }
        };
        let p = &mut points[idx];
        match s.suffix.as_str() {
            "_bucket" => {
                let le = s.labels.iter().find(|(k, _)| k == "le").and_then(|(_, v)| number(v).ok()).map(|x| x.0).unwrap_or(f64::INFINITY);
                p.1.push((le, s.value));
            }
            "_sum" => p.2 = s.value,
            "_count" => p.3 = s.value,
            _ => {}
        }
    }
    points
        .into_iter()
        .map(|(labels, mut buckets, sum, count)| {
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut prev = 0.0;
            let mut counts = Vec::with_capacity(buckets.len());
            let mut bounds = Vec::with_capacity(buckets.len());
            for (le, cum) in &buckets {
                counts.push((cum - prev).max(0.0) as u64);
                prev = *cum;
                if le.is_finite() {
                    bounds.push(*le);
                }
            }
            if buckets.last().is_none_or(|b| b.0.is_finite()) {
                counts.push((count - prev).max(0.0) as u64); // no +Inf line: the rest
            }
            HistogramDataPoint {
                attributes: attrs(&labels, "le"),
                start_time_unix_nano: start,
                time_unix_nano: now,
                count: count.max(0.0) as u64,
                sum: Some(sum),
                bucket_counts: counts,
                explicit_bounds: bounds,
                ..Default::default()
            }
        })
        .collect()
}

/// Families → OTLP metrics. `start` is when the cumulative series began (the agent's
/// start), `now` the collection time, both in Unix nanoseconds.
pub fn to_metrics(fams: &[Family], start: u64, now: u64) -> Vec<Metric> {
    let cumulative = AggregationTemporality::Cumulative as i32;
    fams.iter()
        .map(|f| {
            let data = match f.kind {
                Kind::Counter => Data::Sum(Sum {
                    data_points: f.samples.iter().filter(|s| s.suffix != "_created").map(|s| number_point(s, start, now)).collect(),
                    aggregation_temporality: cumulative,
                    is_monotonic: true,
                }),
                Kind::Histogram => Data::Histogram(Histogram { data_points: histogram_points(f, start, now), aggregation_temporality: cumulative }),
                Kind::Gauge | Kind::Other => {
                    Data::Gauge(Gauge { data_points: f.samples.iter().filter(|s| s.suffix != "_created").map(|s| number_point(s, start, now)).collect() })
                }
            };
            let name = if f.kind == Kind::Counter { f.name.strip_suffix("_total").unwrap_or(&f.name) } else { &f.name };
            Metric { name: name.to_string(), description: f.help.clone(), unit: ucum(&f.unit), data: Some(data), ..Default::default() }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::{
        encoding::EncodeLabelSet,
        metrics::{counter::Counter, family::Family as PFamily, gauge::Gauge as PGauge, histogram::Histogram as PHistogram},
        registry::{Registry, Unit},
    };
    use std::sync::atomic::AtomicU64;

    #[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct L {
        cause: String,
    }

    fn registry() -> Registry {
        let mut r = Registry::default();
        let steps: Counter = Counter::default();
        steps.inc_by(3);
        r.register("stepwise_steps", "Training steps attributed", steps);
        let att: PFamily<L, Counter<f64, AtomicU64>> = PFamily::default();
        att.get_or_create(&L { cause: "readiness_skew".into() }).inc_by(0.03);
        att.get_or_create(&L { cause: "odd \"quoted\"\\ value".into() }).inc_by(1.5);
        r.register("stepwise_step_attributed_seconds", "Step seconds attributed to each cause", att);
        let g: PGauge<f64, AtomicU64> = PGauge::default();
        g.set(1.25);
        r.register("stepwise_rail_imbalance_ratio", "Busiest rail over mean", g);
        let h = PHistogram::new([0.01, 0.1, 1.0]);
        for x in [0.005, 0.05, 0.05, 2.0] {
            h.observe(x);
        }
        r.register_with_unit("stepwise_step_duration", "Duration of steps", Unit::Seconds, h);
        r
    }

    #[test]
    fn every_family_of_the_registry_with_its_type() {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry()).expect("encode");
        let fams = parse(&text).expect("parse");
        let names: Vec<&str> = fams.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["stepwise_steps", "stepwise_step_attributed_seconds", "stepwise_rail_imbalance_ratio", "stepwise_step_duration_seconds"], "{text}");
        let m = to_metrics(&fams, 1, 2);
        let Some(Data::Sum(s)) = &m[0].data else { panic!("counter → Sum: {:?}", m[0]) };
        assert!(s.is_monotonic && s.aggregation_temporality == AggregationTemporality::Cumulative as i32);
        assert_eq!(s.data_points[0].value, Some(number_data_point::Value::AsInt(3)));
        assert_eq!((s.data_points[0].start_time_unix_nano, s.data_points[0].time_unix_nano), (1, 2));
        let Some(Data::Sum(s)) = &m[1].data else { panic!("f64 counter → Sum") };
        assert_eq!(s.data_points.len(), 2);
        let skew = s.data_points.iter().find(|p| p.attributes == vec![kv_str("cause", "readiness_skew")]).expect("labelled point");
        assert_eq!(skew.value, Some(number_data_point::Value::AsDouble(0.03)));
        assert!(s.data_points.iter().any(|p| p.attributes == vec![kv_str("cause", "odd \"quoted\"\\ value")]), "escapes undone: {:?}", s.data_points);
        assert_eq!(m[1].description, "Step seconds attributed to each cause.");
        let Some(Data::Gauge(g)) = &m[2].data else { panic!("gauge → Gauge") };
        assert_eq!(g.data_points[0].value, Some(number_data_point::Value::AsDouble(1.25)));
        let Some(Data::Histogram(h)) = &m[3].data else { panic!("histogram → Histogram") };
        assert_eq!(m[3].unit, "s");
        let p = &h.data_points[0];
        assert_eq!(p.explicit_bounds, vec![0.01, 0.1, 1.0]);
        assert_eq!(p.bucket_counts, vec![1, 2, 0, 1], "per-bucket, +Inf last");
        assert_eq!(p.count, 4);
        assert!((p.sum.unwrap_or(0.0) - 2.105).abs() < 1e-12);
        assert_eq!(h.aggregation_temporality, AggregationTemporality::Cumulative as i32);
    }

    #[test]
    fn prometheus_text_and_exemplars_and_errors() {
        let text = "# HELP a x\n# TYPE a counter\na_total{x=\"1\"} 5 1700000000 # {trace_id=\"ab\"} 1.0\n# TYPE b gauge\nb NaN\nb{y=\"\"} -Inf\n";
        let f = parse(text).expect("parse");
        assert_eq!(f[0].samples[0].int, Some(5));
        // Prometheus 0.0.4: the counter family is named with `_total`; exported without.
        let old = parse("# HELP c_total x\n# TYPE c_total counter\nc_total 2\n").expect("0.0.4");
        let m = to_metrics(&old, 0, 1);
        assert_eq!(m[0].name, "c");
        assert!(matches!(&m[0].data, Some(Data::Sum(s)) if s.data_points.len() == 1));
        assert!(f[1].samples[0].value.is_nan());
        assert_eq!(f[1].samples[1].labels, vec![("y".to_string(), String::new())]);
        assert!(parse("stray 1\n").is_err(), "a sample outside any family is an error");
        assert!(parse("# TYPE a gauge\na{x=\"1} 2\n").is_err(), "unterminated label");
        assert!(parse("# TYPE a gauge\na one\n").is_err());
    }
}
