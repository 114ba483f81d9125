//! What the reference says beyond the registry: the stages that register the families (in the
//! daemon's order, `daemon::run`), what each source is and when its families are absent, and
//! the values of the labels whose values form a closed set in the code.

use std::time::Duration;

use prometheus_client::registry::Registry;

use crate::{
    config::{Config, StepsConfig},
    sources::{self, Errors, Selector, SourceContext},
};

/// A part of the agent and the function that registers its families as the daemon does.
pub type Stage = (&'static str, fn(&mut Registry));

/// Every stage, in the daemon's registration order.
pub fn stages() -> Vec<Stage> {
    vec![
        ("agent", agent),
        ("store", |r| {
            crate::store::health::Health::register(r);
        }),
        ("topology", |r| {
            crate::topology::info::NicInfo::register(r);
        }),
        ("rdma", |r| source(r, "rdma")),
        ("ethtool", |r| source(r, "ethtool")),
        ("netdev", |r| source(r, "netdev")),
        ("qdisc", |r| source(r, "qdisc")),
        ("tcp", |r| source(r, "tcp")),
        ("collectives", sources::collectives::register_metrics),
        ("profiler", |r| {
            sources::collectives::profiler::ProfilerMetrics::register(r);
        }),
        ("engine", |r| {
            crate::engine::Engine::new(StepsConfig::default(), "reference".into(), r).expect("the default [steps] config is valid");
        }),
        ("fast lane", |r| {
            crate::daemon::fast::FastLane::new(Duration::from_millis(10), 0.01, None, r);
        }),
        ("otlp", |r| {
            crate::export::otlp::Metrics::register(r);
        }),
    ]
}

/// The daemon's own families, registered before any source.
fn agent(r: &mut Registry) {
    crate::daemon::reload_counters(r);
    Errors::register(r);
    let m = crate::export::metrics::AgentMetrics::register(r, crate::ebpf::embedded());
    crate::export::watchdog::Watchdog::register(r, &m, Duration::from_secs(5));
}

/// One counter source as `sources::build_sources` builds it, alone, on a sysfs root without
/// devices (its constructor registers its families; nothing is read).
fn source(r: &mut Registry, name: &str) {
    let mut cfg = Config::default();
    let s = &mut cfg.sources;
    (s.rdma, s.ethtool, s.netdev, s.qdisc, s.tcp) = (name == "rdma", name == "ethtool", name == "netdev", name == "qdisc", name == "tcp");
    let ctx = SourceContext {
        sysfs_root: "/nonexistent-stepwise-reference".into(),
        selector: Selector::new(&[], &[], false).expect("empty patterns are valid"),
        errors: Errors::default(),
        interval: Duration::from_secs(1),
        rails: Default::default(),
        owners: Default::default(),
    };
    let built = sources::build_sources(&cfg, &ctx, r);
    assert_eq!(built.len(), 1, "source {name} not built");
}

/// Each stage: what it is (its module) and when its families are on `/metrics`.
pub const SOURCES: &[(&str, &str)] = &[
    ("agent", "The daemon itself (`daemon`, `export::metrics`, `export::watchdog`, `sources::Errors`). Always present; `stepwise_errors_total` and the per-source series once a source has swept."),
    ("store", "The history store (`store::health`). Always present; with `[store] enabled = false` the store is never opened and `stepwise_store_up` is 0."),
    ("topology", "NIC topology (`topology::info`). A series per NIC the first discovery found (RDMA ports, or netdevs without RDMA)."),
    ("rdma", "RDMA sysfs counters (`sources::rdma`, `/sys/class/infiniband`). Absent on a host without RDMA devices (the source is then absent, not down) or with `[sources] rdma = false`."),
    ("ethtool", "Driver statistics over the SIOCETHTOOL ioctl (`sources::ethtool`). Absent for drivers without statistics, netdevs outside the agent's network namespace, or `[sources] ethtool = false`."),
    ("netdev", "Interface statistics over rtnetlink (`sources::netdev`). Absent only with `[sources] netdev = false`."),
    ("qdisc", "Traffic-control qdisc statistics over rtnetlink (`sources::qdisc`). Root qdiscs only unless `[sources] qdisc_per_queue`; absent with `[sources] qdisc = false`."),
    ("tcp", "TCP of the traced jobs (`sources::tcp`: `tcp:tcp_retransmit_skb` tracepoint, `sock_diag`). Absent with `[sources] tcp = false` or without eBPF; per-interface series once a traced job has TCP connections."),
    ("collectives", "Collective calls traced by the eBPF uprobes (`sources::collectives`). Absent with `[collectives] enabled = false` or when the probes cannot load (no eBPF object, no `CAP_BPF`/`CAP_PERFMON`); per-rank series while a traced process runs."),
    ("profiler", "Records of the NCCL profiler plugin (`sources::collectives::profiler`). Present only while the collective probes run and the profiler socket is bound (`[collectives] profiler_socket`)."),
    ("engine", "Steps found in the collectives and markers (`engine`, `timeline::admission`, `hang`). Counters from the start; per-rank and per-cause series once steps are found."),
    ("fast lane", "The fast lane (`daemon::fast`). Absent when `[sources] fast_interval` is 0 or not shorter than `interval`."),
    ("otlp", "The OpenTelemetry exporter (`export::otlp`). Present only with `[otlp]` configured."),
];

/// The counter sources' `source` label values (`Source::name`).
pub const COUNTER_SOURCES: &[&str] = &["rdma", "ethtool", "netdev", "qdisc", "tcp"];

/// Labels whose values are a closed set in the code: (family, label, values).
pub fn bounded_labels() -> Vec<(&'static str, &'static str, Vec<&'static str>)> {
    let with_collectives = || COUNTER_SOURCES.iter().copied().chain(["collectives"]).collect::<Vec<_>>();
    vec![
        ("stepwise_source_up", "source", with_collectives()),
        ("stepwise_source_devices", "source", with_collectives()),
        ("stepwise_source_sweep_duration_seconds", "source", COUNTER_SOURCES.to_vec()),
        ("stepwise_otlp_export_errors_total", "signal", vec!["metrics", "traces"]),
        ("stepwise_otlp_dropped_total", "signal", vec!["metrics", "traces"]),
        ("stepwise_otlp_exports_total", "signal", vec!["metrics", "traces"]),
    ]
}
