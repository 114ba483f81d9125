//! Agent-level metrics (build info, source health, sweep durations). Sources register their
//! own counters; this module owns only what is common to all of them.

use crate::export::reference::RegisterSampled as _;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    pub source: &'static str,
}

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: &'static str,
    pub ebpf: &'static str,
}

/// Metrics about the agent itself.
#[derive(Clone)]
pub struct AgentMetrics {
    /// `stepwise_source_up{source}`: 1 if the last sweep of the source succeeded or found
    /// nothing to read (an absent source is not down), 0 if it failed or stalled.
    pub source_up: Family<SourceLabel, Gauge>,
    /// `stepwise_source_devices{source}`: devices the last sweep read; 0 for a source that is
    /// absent on this host (e.g. no `/sys/class/infiniband`) or failed.
    pub source_devices: Family<SourceLabel, Gauge>,
    /// `stepwise_source_sweep_duration_seconds{source}`.
    pub sweep_seconds: Family<SourceLabel, Histogram>,
}

fn sweep_histogram() -> Histogram {
    // 100 µs … ~1.6 s: a sweep of 16 NICs should take well under 10 ms.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(1e-4, 2.0, 15))
}

impl AgentMetrics {
    pub fn register(registry: &mut Registry, ebpf_embedded: bool) -> Self {
        let build: Family<BuildLabels, Gauge> = Family::default();
        build.get_or_create(&BuildLabels { version: env!("CARGO_PKG_VERSION"), ebpf: if ebpf_embedded { "embedded" } else { "missing" } }).set(1);
        registry.register_sampled("stepwise_build_info", "The agent's version and whether its eBPF object is embedded or missing (always 1)", build);
        let source_up = Family::<SourceLabel, Gauge>::default();
        registry.register_sampled("stepwise_source_up", "1 if the source's last sweep succeeded or found nothing to read, 0 if it failed", source_up.clone());
        let source_devices = Family::<SourceLabel, Gauge>::default();
        registry.register_sampled(
            "stepwise_source_devices",
            "Devices the source's last sweep read (0: absent on this host, or failed)",
            source_devices.clone(),
        );
        let sweep_seconds = Family::<SourceLabel, Histogram>::new_with_constructor(sweep_histogram as fn() -> Histogram);
        registry.register_sampled("stepwise_source_sweep_duration_seconds", "Time taken by one sweep of a source", sweep_seconds.clone());
        AgentMetrics { source_up, source_devices, sweep_seconds }
    }
}

/// OpenMetrics → Prometheus text 0.0.4. The two differ only in metadata: OpenMetrics names a
/// counter family without `_total` in `# HELP`/`# TYPE`, has `# UNIT` and ends with `# EOF`.
/// prometheus-client encodes only OpenMetrics, so this is the one conversion we do by hand.
pub fn openmetrics_to_text(om: &str) -> String {
    let mut out = String::with_capacity(om.len());
    let mut counters: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for line in om.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(name) = rest.strip_suffix(" counter") {
                counters.insert(name);
            }
        }
    }
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = line.strip_prefix("# HELP ").map(|r| ("# HELP ", r)).or_else(|| line.strip_prefix("# TYPE ").map(|r| ("# TYPE ", r)));
        if let Some((prefix, rest)) = meta {
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            if counters.contains(name) {
                out.push_str(prefix);
                out.push_str(name);
                out.push_str("_total ");
                out.push_str(tail);
                out.push('\n');
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::openmetrics_to_text;

    #[test]
    fn counters_get_total_in_metadata_and_eof_goes() {
        let om =
            "# HELP a_bytes Bytes.\n# TYPE a_bytes counter\n# UNIT a_bytes bytes\na_bytes_total{x=\"1\"} 5\n# HELP g A gauge.\n# TYPE g gauge\ng 1\n# EOF\n";
        let t = openmetrics_to_text(om);
        assert_eq!(t, "# HELP a_bytes_total Bytes.\n# TYPE a_bytes_total counter\na_bytes_total{x=\"1\"} 5\n# HELP g A gauge.\n# TYPE g gauge\ng 1\n");
    }
}
