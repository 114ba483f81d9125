//! OpenTelemetry export (`[otlp]`, off by default): every `interval`, the same metrics as
//! `/metrics` (converted from the registry's text, [`prom`]) and each step attributed since
//! the last export as a trace ([`spans`]), over OTLP/gRPC or OTLP/HTTP-protobuf
//! ([`transport`]).
//!
//! The exporter runs on its own thread. The engine hands it finished steps through a
//! bounded queue with `try_send` ([`crate::engine::Engine::add_step_sink`]): a slow or dead
//! collector fills the queue and further steps are dropped and counted
//! (`stepwise_otlp_dropped_total{signal="traces"}`), never waited for; each export is bounded
//! by `timeout` and a failed one is counted (`stepwise_otlp_export_errors_total{signal}`).
//! Sampling, attribution and the API never wait on the network.

pub mod prom;
pub mod spans;
pub mod tls;
pub mod transport;

use crate::export::reference::RegisterSampled as _;
use std::{
    collections::BTreeMap,
    sync::{mpsc, Arc, Mutex},
    thread::JoinHandle,
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use opentelemetry_proto::tonic::{
    collector::{metrics::v1::ExportMetricsServiceRequest, trace::v1::ExportTraceServiceRequest},
    common::v1::InstrumentationScope,
    metrics::v1::{ResourceMetrics, ScopeMetrics},
    resource::v1::Resource,
    trace::v1::{ResourceSpans, ScopeSpans},
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};
use prost::Message;

use self::{
    spans::{FinishedStep, Ids},
    transport::{Client, ExportError},
};
use crate::{
    config::otlp::{env, Compression, OtlpConfig, Protocol},
    engine::Engine,
    export::api::AppState,
};

/// The exporter's client for an already validated `[otlp]` (`Config::validate`).
impl OtlpConfig {
    fn client(&self) -> Result<Client, ExportError> {
        let auth = self.authority().unwrap_or_default();
        let headers = self.header_list().unwrap_or_default();
        let gzip = self.compression == Compression::Gzip;
        let roots = if self.tls() { self.trust_anchors().map_err(tls::TlsError::from)? } else { Vec::new() };
        Ok(match self.protocol {
            Protocol::Grpc => {
                let t = if self.tls() { Some(transport::GrpcTls::new(&roots, &self.host().unwrap_or_default())?) } else { None };
                Client::Grpc(transport::Grpc::new(auth, t, headers, self.timeout, gzip)?)
            }
            Protocol::HttpProtobuf => {
                Client::Http(transport::Http::new(&self.endpoint(), &roots, self.headers.clone().into_iter().collect(), self.timeout, gzip))
            }
        })
    }
}

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SignalLabel {
    signal: &'static str,
}

/// The exporter's own counters (on `/metrics`, and exported like every other family).
#[derive(Clone, Default)]
pub(crate) struct Metrics {
    errors: Family<SignalLabel, Counter>,
    dropped: Family<SignalLabel, Counter>,
    exports: Family<SignalLabel, Counter>,
}

const METRICS: SignalLabel = SignalLabel { signal: "metrics" };
const TRACES: SignalLabel = SignalLabel { signal: "traces" };

impl Metrics {
    pub(crate) fn register(r: &mut Registry) -> Metrics {
        let m = Metrics::default();
        r.register_sampled("stepwise_otlp_export_errors", "OTLP export requests that failed (collector down, slow, or refusing)", m.errors.clone());
        r.register_sampled("stepwise_otlp_dropped", "Steps not exported: the queue was full or their export failed", m.dropped.clone());
        r.register_sampled("stepwise_otlp_exports", "OTLP export requests the collector accepted", m.exports.clone());
        // Zero-valued series from the start, so rate() and alerts work before the first error.
        for l in [METRICS, TRACES] {
            drop(m.errors.get_or_create(&l));
            drop(m.exports.get_or_create(&l));
        }
        drop(m.dropped.get_or_create(&TRACES));
        m
    }
}

/// The running exporter. Dropping it stops the thread after one last export (bounded by
/// the timeout), so the last steps of a job reach the collector on shutdown.
pub struct Exporter {
    stop: mpsc::Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.stop.send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Most steps in one trace export request.
const MAX_BATCH: usize = 512;

fn unix_nanos() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// The OTLP exporter's step sink: each step is cloned into the exporter's bounded queue
/// with `try_send`; a full queue (a slow or dead collector) drops it and counts it.
struct TraceSink {
    tx: mpsc::SyncSender<FinishedStep>,
    dropped: Counter,
}

impl crate::engine::StepSink for TraceSink {
    fn step(&mut self, s: &crate::engine::FinishedStep<'_>) {
        let f = FinishedStep { job: s.job.to_string(), attribution: s.attribution.clone(), collectives: s.collectives.to_vec() };
        if self.tx.try_send(f).is_err() {
            self.dropped.inc();
        }
    }
}

/// Starts the exporter when `[otlp] enabled`: registers its counters in the state's
/// registry (it must not be shared yet — call this before the state is cloned), hooks a
/// step sink into the engine and spawns the export thread. `None` when disabled or when the
/// thread cannot start (logged; the agent runs on without export).
pub fn start(cfg: &crate::config::Config, state: &mut AppState, engine: &Arc<Mutex<Engine>>) -> Option<Exporter> {
    let oc = cfg.otlp.clone();
    if !oc.enabled {
        return None;
    }
    let Some(registry) = Arc::get_mut(&mut state.registry) else {
        tracing::error!("OTLP export not started: the metrics registry is already shared (start the exporter before cloning the state)");
        return None;
    };
    let metrics = Metrics::register(registry);
    let registry = state.registry.clone();
    let client = match oc.client() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("OTLP export disabled: {e}");
            return None;
        }
    };
    let (tx, rx) = mpsc::sync_channel::<FinishedStep>(oc.queue);
    let dropped = metrics.dropped.get_or_create(&TRACES).clone();
    if let Ok(mut e) = engine.lock() {
        e.add_step_sink(Box::new(TraceSink { tx, dropped }));
    }
    let host = cfg.collectives.host.clone().unwrap_or_else(crate::sources::collectives::hostname);
    let (stop_tx, stop_rx) = mpsc::channel();
    let endpoint = oc.endpoint();
    let protocol = oc.protocol;
    let oc_resource = oc.resource.clone();
    let unread = env::unread(&|k| std::env::var(k).ok());
    if !unread.is_empty() {
        tracing::warn!(variables = ?unread, "OTLP: these OpenTelemetry variables are set but not read (one endpoint serves both signals; no client certificate; the scheme decides TLS)");
    }
    let thread = std::thread::Builder::new().name("otlp-export".into()).spawn(move || {
        Loop { cfg: oc, client, registry, metrics, steps: rx, ids: Ids::default(), resource: resource(&host, &oc_resource), start: unix_nanos(), warned: false }
            .run(stop_rx)
    });
    match thread {
        Ok(t) => {
            tracing::info!(endpoint, ?protocol, "exporting metrics and step traces over OTLP");
            Some(Exporter { stop: stop_tx, thread: Some(t) })
        }
        Err(e) => {
            tracing::warn!("OTLP export disabled: cannot start its thread: {e}");
            None
        }
    }
}

/// `service.*` and `host.name`, then the configured attributes (`[otlp] resource`,
/// `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_SERVICE_NAME`), which replace a default of the same key.
fn resource(host: &str, extra: &BTreeMap<String, String>) -> Resource {
    let mut attrs: BTreeMap<&str, &str> =
        [("service.name", "stepwise-agent"), ("service.version", env!("CARGO_PKG_VERSION")), ("host.name", host)].into_iter().collect();
    attrs.extend(extra.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    Resource { attributes: attrs.into_iter().map(|(k, v)| prom::kv_str(k, v)).collect(), ..Default::default() }
}

fn scope() -> InstrumentationScope {
    InstrumentationScope { name: "stepwise".into(), version: env!("CARGO_PKG_VERSION").into(), ..Default::default() }
}

struct Loop {
    cfg: OtlpConfig,
    client: Client,
    registry: Arc<Registry>,
    metrics: Metrics,
    steps: mpsc::Receiver<FinishedStep>,
    ids: Ids,
    resource: Resource,
    /// Start of the cumulative series (the exporter's start).
    start: u64,
    /// A failure was logged at warn level since the last success (later ones go to debug).
    warned: bool,
}

impl Loop {
    fn run(mut self, stop: mpsc::Receiver<()>) {
        let mut next = Instant::now() + self.cfg.interval;
        loop {
            let stopping = match stop.recv_timeout(next.saturating_duration_since(Instant::now())) {
                Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => true,
                Err(mpsc::RecvTimeoutError::Timeout) => false,
            };
            next = Instant::now() + self.cfg.interval;
            loop {
                let batch: Vec<FinishedStep> = self.steps.try_iter().take(MAX_BATCH).collect();
                if batch.is_empty() {
                    break;
                }
                let n = batch.len();
                self.export_traces(batch);
                if n < MAX_BATCH {
                    break;
                }
            }
            self.export_metrics();
            if stopping {
                return;
            }
        }
    }

    fn outcome(&mut self, label: &SignalLabel, r: Result<(), ExportError>) -> bool {
        match r {
            Ok(()) => {
                self.metrics.exports.get_or_create(label).inc();
                if self.warned {
                    tracing::info!(signal = label.signal, "OTLP export works again");
                }
                self.warned = false;
                true
            }
            Err(e) => {
                self.metrics.errors.get_or_create(label).inc();
                if self.warned {
                    tracing::debug!(signal = label.signal, "OTLP export to {} failed: {e}", self.cfg.endpoint());
                } else {
                    tracing::warn!(signal = label.signal, "OTLP export to {} failed: {e} (counted in stepwise_otlp_export_errors_total)", self.cfg.endpoint());
                    self.warned = true;
                }
                false
            }
        }
    }

    fn export_traces(&mut self, batch: Vec<FinishedStep>) {
        let n = batch.len() as u64;
        let spans = batch.iter().flat_map(|s| spans::step_spans(s, &mut self.ids)).collect();
        let req = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(self.resource.clone()),
                scope_spans: vec![ScopeSpans { scope: Some(scope()), spans, ..Default::default() }],
                ..Default::default()
            }],
        };
        let r = self.client.export(false, req.encode_to_vec());
        if !self.outcome(&TRACES, r) {
            self.metrics.dropped.get_or_create(&TRACES).inc_by(n);
        }
    }

    fn export_metrics(&mut self) {
        let mut text = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::warn!("OTLP: cannot encode the metrics registry: {e}");
            return;
        }
        let fams = match prom::parse(&text) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!("OTLP: cannot read the metrics text: {e}");
                return;
            }
        };
        let metrics = prom::to_metrics(&fams, self.start, unix_nanos());
        let req = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(self.resource.clone()),
                scope_metrics: vec![ScopeMetrics { scope: Some(scope()), metrics, ..Default::default() }],
                ..Default::default()
            }],
        };
        let r = self.client.export(true, req.encode_to_vec());
        self.outcome(&METRICS, r);
    }
}
