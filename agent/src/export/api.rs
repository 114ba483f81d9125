//! HTTP endpoints: `/metrics`, `/healthz`, `/readyz`, `/api/v1/topology`, `/api/v1/status`.
//! Everything here is read-only; handlers only read shared state, so a slow client never
//! blocks sampling. The one write, `POST /api/v1/markers`, is refused on this (TCP) listener
//! unless `[api] markers_over_tcp` is on, and then needs the bearer token (docs/security.md).

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc, RwLock,
};

use axum::{
    extract::{Query, State},
    http::{header, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
    Json, Router,
};
use prometheus_client::registry::Registry;

pub use super::metrics::openmetrics_to_text;
use super::stream::{off_runtime, Listing};

/// State shared between the sampler and the HTTP handlers.
#[derive(Clone)]
pub struct AppState {
    pub registry: Arc<Registry>,
    pub ready: Arc<AtomicBool>,
    pub status: Arc<RwLock<serde_json::Value>>,
    pub topology: Arc<RwLock<serde_json::Value>>,
    /// Collective call history, when the probes run.
    pub collectives: Arc<RwLock<Option<crate::sources::collectives::SharedHistory>>>,
    /// Markers and counter windows (set with [`AppState::set_engine`]).
    pub engine: Option<Arc<std::sync::Mutex<crate::engine::Engine>>>,
    /// The engine's latest steps, read without its lock.
    pub steps: Option<crate::engine::RecentSteps>,
    /// The token `POST /api/v1/markers` must carry; `None` (the default) refuses it.
    pub markers_token: Option<crate::config::Secret>,
    /// Collective probes: start-up probing done (readiness waits for it when they run).
    pub probes_ready: Option<Arc<AtomicBool>>,
    /// Collective probes: attached libraries and traced processes.
    pub probes_detail: Option<Arc<std::sync::Mutex<serde_json::Value>>>,
    /// Which source's sweep is in progress, to report one that is stuck.
    pub watchdog: Option<super::watchdog::Watchdog>,
    /// `/api/v1/*` requests served at once ([`MAX_API_CONCURRENCY`]).
    pub api_permits: Arc<tokio::sync::Semaphore>,
    /// How long one waits for its turn ([`API_QUEUE_WAIT`]).
    pub api_queue_wait: std::time::Duration,
}

impl AppState {
    /// The step engine whose markers, windows and latest steps the API serves.
    pub fn set_engine(&mut self, e: Arc<std::sync::Mutex<crate::engine::Engine>>) {
        self.steps = Some(e.lock().unwrap_or_else(|p| p.into_inner()).recent_steps());
        self.engine = Some(e);
    }

    pub fn new(registry: Registry) -> Self {
        AppState {
            registry: Arc::new(registry),
            ready: Arc::new(AtomicBool::new(false)),
            status: Arc::new(RwLock::new(serde_json::json!({}))),
            topology: Arc::new(RwLock::new(serde_json::json!({}))),
            collectives: Arc::new(RwLock::new(None)),
            engine: None,
            steps: None,
            markers_token: None,
            probes_ready: None,
            probes_detail: None,
            watchdog: None,
            api_permits: Arc::new(tokio::sync::Semaphore::new(MAX_API_CONCURRENCY)),
            api_queue_wait: API_QUEUE_WAIT,
        }
    }
}

/// OpenMetrics text with the Prometheus-compatible content type.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/api/v1/topology", get(topology))
        .route("/api/v1/status", get(status))
        .route("/api/v1/collectives", get(collectives))
        .route("/api/v1/steps", get(steps))
        .route("/api/v1/open", get(open))
        .route("/api/v1/markers", get(markers_get).merge(post(markers_post).route_layer(middleware::from_fn_with_state(state.clone(), require_token))))
        .route("/api/v1/windows", get(windows))
        .layer(axum::extract::DefaultBodyLimit::max(64 * 1024))
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found; see /api/v1/status\n") })
        .layer(middleware::from_fn_with_state(state.clone(), limit_api))
        .layer(axum::middleware::from_fn(request_timeout))
        .layer(axum::middleware::from_fn(head_limit))
        .with_state(state)
}

/// A client must send a request's line and headers within this (slowloris).
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// A request (reading its body and answering) must finish within this; then 408.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Connections served at once; past it a new one closes the longest-idle one, and waits
/// (in the kernel's accept queue) only while all are busy with a request.
pub const MAX_CONNECTIONS: usize = 256;
/// Most bytes buffered per connection (hyper's read buffer, so the request line and
/// headers); a longer head is answered 431. Bounds memory at `MAX_CONNECTIONS` × this.
pub const MAX_HEAD_BYTES: usize = 32 * 1024;

/// The request line and headers as sent: hyper's buffer limit alone let heads of up to
/// 48 KiB through (it checks after a read that may overshoot).
pub fn head_bytes(req: &axum::extract::Request) -> usize {
    let line = req.method().as_str().len() + req.uri().to_string().len() + " HTTP/1.1\r\n ".len();
    req.headers().iter().fold(line + 2, |n, (k, v)| n + k.as_str().len() + v.len() + 4)
}

/// `/api/v1/*` requests (the expensive ones) served at once; `/metrics`, `/healthz` and
/// `/readyz` never wait for them.
pub const MAX_API_CONCURRENCY: usize = 4;
/// How long an API request waits for its turn before a 503.
pub const API_QUEUE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

async fn limit_api(State(s): State<AppState>, req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    if !req.uri().path().starts_with("/api/") {
        return next.run(req).await;
    }
    match tokio::time::timeout(s.api_queue_wait, s.api_permits.clone().acquire_owned()).await {
        // A list endpoint keeps the permit until its page is written (`stream::off_runtime`).
        Ok(Ok(permit)) => super::stream::API_PERMIT.scope(std::cell::RefCell::new(Some(permit)), next.run(req)).await,
        _ => {
            (StatusCode::SERVICE_UNAVAILABLE, [(header::RETRY_AFTER, "1")], format!("{MAX_API_CONCURRENCY} API requests in progress; retry\n")).into_response()
        }
    }
}

/// Refuses a head over [`MAX_HEAD_BYTES`] with 431, as documented.
async fn head_limit(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let n = head_bytes(&req);
    if n > MAX_HEAD_BYTES {
        return (StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, format!("request head of {n} bytes; at most {MAX_HEAD_BYTES}\n")).into_response();
    }
    next.run(req).await
}

async fn request_timeout(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(req)).await {
        Ok(r) => r,
        Err(_) => (StatusCode::REQUEST_TIMEOUT, format!("request not completed within {REQUEST_TIMEOUT:?}\n")).into_response(),
    }
}

/// Serves `app` on `listener` until `stop` turns true: HTTP/1.1 with a header read timeout,
/// a per-request timeout, at most [`MAX_CONNECTIONS`] connections and [`MAX_HEAD_BYTES`]
/// buffered per connection, so slow or oversized clients cost bounded memory and never
/// hold the server. (`axum::serve` sets no timer, so hyper's header timeout would not run.)
/// Handlers only read shared state: sampling never waits for a client.
pub async fn serve(listener: tokio::net::TcpListener, app: Router, mut stop: tokio::sync::watch::Receiver<bool>) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let slots = super::conns::Slots::new(MAX_CONNECTIONS);
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, peer)) => (s, peer.ip()),
                Err(e) => {
                    // Out of descriptors or memory: back off instead of spinning.
                    tracing::debug!("accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stopped(&mut stop) => break,
        };
        // At the cap, this closes the longest-idle connection (see `conns`).
        let (stream, peer) = stream;
        let slot = tokio::select! {
            s = slots.acquire(peer) => match s {
                Some(s) => s,
                None => break,
            },
            _ = stopped(&mut stop) => break,
        };
        let inner = hyper_util::service::TowerToHyperService::new(app.clone());
        let (conn_state, slots_ref) = (slot.conn.clone(), slots.clone());
        let svc = hyper::service::service_fn(move |req| {
            let busy = conn_state.enter(&slots_ref);
            let fut = hyper::service::Service::call(&inner, req);
            async move {
                let r = fut.await;
                drop(busy);
                r
            }
        });
        let mut conn_stop = stop.clone();
        conns.spawn(async move {
            let mut b = hyper::server::conn::http1::Builder::new();
            b.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT).max_buf_size(MAX_HEAD_BYTES);
            let conn = b.serve_connection(TokioIo::new(stream), svc);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => return,
                // Chosen to make room while idle: closed at once.
                _ = slot.conn.closed() => return,
                _ = stopped(&mut conn_stop) => conn.as_mut().graceful_shutdown(),
            }
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), conn).await;
        });
        while conns.try_join_next().is_some() {}
    }
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async { while conns.join_next().await.is_some() {} }).await;
}

/// Resolves once `stop` is true (or its sender is gone).
async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|v| *v).await;
}

/// Prometheus text exposition format 0.0.4, for clients that do not ask for OpenMetrics
/// (promtool, curl, older scrapers).
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

async fn metrics(State(s): State<AppState>, headers: axum::http::HeaderMap) -> Response {
    // A stuck sweep shows as `source_up 0` in this very scrape.
    let _ = s.watchdog.as_ref().and_then(|w| w.stuck());
    let mut body = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut body, &s.registry) {
        return (StatusCode::INTERNAL_SERVER_ERROR, format!("encoding metrics failed: {e}\n")).into_response();
    }
    let wants_openmetrics = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("application/openmetrics-text"));
    if wants_openmetrics {
        ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], body).into_response()
    } else {
        ([(header::CONTENT_TYPE, TEXT_CONTENT_TYPE)], openmetrics_to_text(&body)).into_response()
    }
}

#[cfg(test)]
#[path = "api_tests.rs"]
mod list_tests;

async fn readyz(State(s): State<AppState>) -> Response {
    if !s.ready.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready: first sweep not finished\n").into_response()
    } else if let Some((source, age)) = s.watchdog.as_ref().and_then(|w| w.stuck()) {
        (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: source {source} has not finished its sweep for {:.1} s\n", age.as_secs_f64())).into_response()
    } else if s.probes_ready.as_ref().is_some_and(|r| !r.load(Ordering::Acquire)) {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready: collective probes are still attaching\n").into_response()
    } else if let Some(why) = crate::sources::nofile::shortage() {
        (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")).into_response()
    } else {
        "ready\n".into_response()
    }
}

fn snapshot(v: &RwLock<serde_json::Value>) -> serde_json::Value {
    v.read().map(|g| g.clone()).unwrap_or_else(|p| p.into_inner().clone())
}

async fn topology(State(s): State<AppState>) -> Json<serde_json::Value> {
    Json(snapshot(&s.topology))
}

async fn status(State(s): State<AppState>) -> Json<serde_json::Value> {
    let mut v = snapshot(&s.status);
    if let (Some(d), Some(obj)) = (&s.probes_detail, v.as_object_mut()) {
        let detail = d.lock().map(|g| g.clone()).unwrap_or_else(|p| p.into_inner().clone());
        obj.insert("collectives_detail".into(), detail);
    }
    Json(v)
}

/// Query of `/api/v1/collectives`.
#[derive(Debug, serde::Deserialize)]
pub struct CollectivesQuery {
    /// Wall-clock seconds since the epoch; calls that entered at or after it. Default 0.
    pub since: Option<f64>,
    /// Only calls that entered at or before it (and requests posted at or before it).
    pub until: Option<f64>,
    /// At most this many calls (default 1000, at most 100 000).
    pub limit: Option<usize>,
    /// `compact`: calls as rows with shared string tables ([`super::pages::CompactCollectivesPage`],
    /// what `agent diagnose` asks for); `full` (the default): every field of every call.
    pub format: Option<String>,
}

/// Most calls (and steps, and samples per NIC) one response carries.
pub const MAX_COLLECTIVES_LIMIT: usize = 100_000;
/// Most markers one response carries (and the default): 10 000 markers are about 1.5 MB;
/// page on with `since` = the last marker's time.
pub const MAX_MARKERS_LIMIT: usize = 10_000;
/// `limit` when the query names none (collectives, steps).
pub const DEFAULT_LIMIT: usize = 1000;

/// `since`/`until`/`limit` of every list endpoint, validated the same way: times must be
/// finite numbers of seconds (`NaN`, `1e400` are 400), `limit` is capped at `max`.
fn list_bounds(since: Option<f64>, until: Option<f64>, limit: Option<usize>, default: usize, max: usize) -> Result<(f64, f64, usize), Response> {
    if [since, until].into_iter().flatten().any(|t| !t.is_finite()) {
        return Err((StatusCode::BAD_REQUEST, "since and until must be finite numbers of seconds\n").into_response());
    }
    Ok((since.unwrap_or(0.0), until.unwrap_or(f64::MAX), limit.unwrap_or(default).min(max)))
}

async fn collectives(State(s): State<AppState>, q: Result<Query<CollectivesQuery>, axum::extract::rejection::QueryRejection>) -> Response {
    let Ok(Query(q)) = q else {
        return (StatusCode::BAD_REQUEST, "bad query: use ?since=<unix seconds>&until=<unix seconds>&limit=<n>&format=full|compact\n").into_response();
    };
    let compact = match q.format.as_deref() {
        None | Some("full") => false,
        Some("compact") => true,
        Some(f) => return (StatusCode::BAD_REQUEST, format!("format {f:?}: use full or compact\n")).into_response(),
    };
    let (since, until, limit) = match list_bounds(q.since, q.until, q.limit, DEFAULT_LIMIT, MAX_COLLECTIVES_LIMIT) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let hist = s.collectives.read().ok().and_then(|g| g.clone());
    let Some(hist) = hist else {
        return (StatusCode::SERVICE_UNAVAILABLE, Json(serde_json::json!({"error": "collective probes are not running (see /api/v1/status)"}))).into_response();
    };
    off_runtime(move || {
        // Copied under the lock, serialized after it: the drain thread never waits for a page.
        let page = {
            let h = match hist.lock() {
                Ok(h) => h,
                Err(p) => p.into_inner(),
            };
            super::pages::CollectivesPage {
                host: h.host.to_string(),
                clock_error_seconds: h.clock.error_seconds,
                clock_synchronized: h.clock.synchronized,
                evicted: h.evicted,
                drained_until: h.drained_until,
                drop_spans: h.drops.since(since),
                lost_spans: h.lost_since(since),
                calls: h.calls_since(since, limit),
                net_requests: h.net_since(since, limit),
                links: h.links.clone(),
            }
        };
        let mut page = page;
        if until < f64::MAX {
            page.calls.retain(|c| c.enter <= until);
            page.net_requests.retain(|r| r.posted <= until);
            page.drop_spans.retain(|s| s.0 <= until);
            page.lost_spans.retain(|s| s.0 <= until);
        }
        if compact {
            return Listing::json(super::pages::CompactCollectivesPage::from_page(page));
        }
        Listing::json(page)
    })
    .await
}

fn engine_of(s: &AppState) -> Result<std::sync::MutexGuard<'_, crate::engine::Engine>, Response> {
    let Some(e) = &s.engine else {
        return Err((StatusCode::SERVICE_UNAVAILABLE, "step engine not running\n").into_response());
    };
    Ok(match e.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    })
}

/// Query of `/api/v1/open`.
#[derive(Debug, serde::Deserialize)]
pub struct OpenQuery {
    /// Only this communicator (its 16 hex digits, as in `/api/v1/collectives`).
    pub comm: Option<String>,
    /// At most this many communicators, the longest-open first (default and maximum
    /// [`MAX_OPEN_LIMIT`]).
    pub limit: Option<usize>,
}

/// Most communicators one `/api/v1/open` response carries (and the default).
pub const MAX_OPEN_LIMIT: usize = 256;

pub(super) async fn open(State(s): State<AppState>, q: Result<Query<OpenQuery>, axum::extract::rejection::QueryRejection>) -> Response {
    let Ok(Query(q)) = q else {
        return (StatusCode::BAD_REQUEST, "bad query: use ?comm=<16 hex digits>&limit=<n>\n").into_response();
    };
    if let Some(c) = &q.comm {
        if c.len() != 16 || !c.bytes().all(|b| b.is_ascii_hexdigit()) {
            return (StatusCode::BAD_REQUEST, format!("comm {c:?} is not a communicator id: 16 hex digits, as in /api/v1/collectives\n")).into_response();
        }
    }
    let (_, _, limit) = match list_bounds(None, None, q.limit, MAX_OPEN_LIMIT, MAX_OPEN_LIMIT) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let comm = q.comm.map(|c| c.to_ascii_lowercase());
    off_runtime(move || super::open::page(&s, comm.as_deref(), limit).into()).await
}

/// Query of `/api/v1/steps`.
#[derive(Debug, serde::Deserialize)]
pub struct StepsQuery {
    pub since: Option<f64>,
    pub limit: Option<usize>,
    /// The K longest steps, longest first.
    pub slowest: Option<usize>,
    pub step: Option<u64>,
}

async fn steps(State(s): State<AppState>, q: Result<Query<StepsQuery>, axum::extract::rejection::QueryRejection>) -> Response {
    let Ok(Query(q)) = q else {
        return (StatusCode::BAD_REQUEST, "bad query: use ?since=<unix seconds>&limit=<n>&slowest=<k>&step=<id>\n").into_response();
    };
    let (since, _, limit) = match list_bounds(q.since, None, q.limit, DEFAULT_LIMIT, MAX_COLLECTIVES_LIMIT) {
        Ok(b) => b,
        Err(r) => return r,
    };
    off_runtime(move || steps_page(&s, &q, since, limit)).await
}

fn steps_page(s: &AppState, q: &StepsQuery, since: f64, limit: usize) -> Listing {
    let Some(recent) = &s.steps else {
        return (StatusCode::SERVICE_UNAVAILABLE, "step engine not running\n").into_response().into();
    };
    let mut v = recent.select(|a| a.begin >= since && q.step.is_none_or(|id| a.step == id));
    if let Some(k) = q.slowest {
        v.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        v.truncate(k);
    }
    v.truncate(limit);
    Listing::json(super::pages::StepsPage { host: host_of(s), steps: v })
}

/// The host name every page carries: the call history's (the one its calls carry), else this
/// machine's.
fn host_of(s: &AppState) -> String {
    s.collectives
        .read()
        .ok()
        .and_then(|g| g.clone())
        .map(|h| h.lock().map(|h| h.host.to_string()).unwrap_or_else(|p| p.into_inner().host.to_string()))
        .unwrap_or_else(crate::sources::collectives::hostname)
}

/// Query of `/api/v1/markers` and `/api/v1/windows`.
#[derive(Debug, serde::Deserialize)]
pub struct SinceQuery {
    pub since: Option<f64>,
    pub until: Option<f64>,
    /// Markers: at most this many (default and maximum [`MAX_MARKERS_LIMIT`]); windows: at
    /// most this many samples per NIC (default and maximum [`MAX_COLLECTIVES_LIMIT`]).
    pub limit: Option<usize>,
}

async fn markers_get(State(s): State<AppState>, q: Result<Query<SinceQuery>, axum::extract::rejection::QueryRejection>) -> Response {
    let Ok(Query(q)) = q else {
        return (StatusCode::BAD_REQUEST, "bad query: use ?since=<unix seconds>&limit=<n>\n").into_response();
    };
    let (since, until, limit) = match list_bounds(q.since, q.until, q.limit, MAX_MARKERS_LIMIT, MAX_MARKERS_LIMIT) {
        Ok(b) => b,
        Err(r) => return r,
    };
    off_runtime(move || markers_page(&s, since, until, limit)).await
}

fn markers_page(s: &AppState, since: f64, until: f64, limit: usize) -> Listing {
    let e = match engine_of(s) {
        Ok(e) => e,
        Err(r) => return r.into(),
    };
    // One more than asked for says whether the page is the last.
    let mut markers = e.markers_between(since, until, limit.saturating_add(1));
    drop(e);
    let truncated = markers.len() > limit;
    markers.truncate(limit);
    Listing::json(super::pages::MarkersPage { host: host_of(s), markers, truncated })
}

/// Guards the writes on the TCP listener, before their body is read: 403 while
/// `[api] markers_over_tcp` is off, 401 without the right `Authorization: Bearer` token.
async fn require_token(State(s): State<AppState>, req: axum::extract::Request, next: Next) -> Response {
    let Some(token) = &s.markers_token else {
        return (
            StatusCode::FORBIDDEN,
            "markers over TCP are disabled: send them to the agent's Unix socket ([steps] marker_socket, default /run/stepwise/markers.sock; `agent mark --socket`), or set [api] markers_over_tcp = true with a token\n",
        )
            .into_response();
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"));
    match given {
        Some((_, t)) if token.matches(t.trim()) => next.run(req).await,
        _ => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "missing or wrong bearer token: send `Authorization: Bearer <[api] token>` (agent mark --token or STEPWISE_TOKEN)\n",
        )
            .into_response(),
    }
}

/// `POST /api/v1/markers`: one marker object or an array of them (the Unix socket is the
/// preferred path; this one exists for scripts that cannot reach it).
async fn markers_post(State(s): State<AppState>, body: axum::body::Bytes) -> Response {
    let now = crate::engine::wall_now();
    let text = body.as_ref();
    let items: Vec<&[u8]> = if text.iter().find(|c| !c.is_ascii_whitespace()) == Some(&b'[') {
        match serde_json::from_slice::<Vec<serde_json::Value>>(text) {
            Ok(v) => {
                let mut e = match engine_of(&s) {
                    Ok(e) => e,
                    Err(r) => return r,
                };
                let mut n = 0;
                for item in v {
                    match crate::timeline::Marker::parse(item.to_string().as_bytes(), now) {
                        Ok(m) => {
                            e.add_marker(m);
                            n += 1;
                        }
                        Err(err) => {
                            e.marker_error();
                            return (StatusCode::BAD_REQUEST, format!("{err}\n")).into_response();
                        }
                    }
                }
                return Json(serde_json::json!({"accepted": n})).into_response();
            }
            Err(err) => return (StatusCode::BAD_REQUEST, format!("markers must be a JSON object or array: {err}\n")).into_response(),
        }
    } else {
        vec![text]
    };
    let mut e = match engine_of(&s) {
        Ok(e) => e,
        Err(r) => return r,
    };
    for item in items {
        match crate::timeline::Marker::parse(item, now) {
            Ok(m) => e.add_marker(m),
            Err(err) => {
                e.marker_error();
                return (StatusCode::BAD_REQUEST, format!("{err}\n")).into_response();
            }
        }
    }
    Json(serde_json::json!({"accepted": 1})).into_response()
}

async fn windows(State(s): State<AppState>, q: Result<Query<SinceQuery>, axum::extract::rejection::QueryRejection>) -> Response {
    let Ok(Query(q)) = q else {
        return (StatusCode::BAD_REQUEST, "bad query: use ?since=<unix seconds>&until=<unix seconds>&limit=<n>\n").into_response();
    };
    let (since, until, limit) = match list_bounds(q.since, q.until, q.limit, MAX_COLLECTIVES_LIMIT, MAX_COLLECTIVES_LIMIT) {
        Ok(b) => b,
        Err(r) => return r,
    };
    off_runtime(move || windows_page(&s, since, until, limit)).await
}

fn windows_page(s: &AppState, since: f64, until: f64, limit: usize) -> Listing {
    let nics = match engine_of(s) {
        Ok(e) => e.nic_names(),
        Err(r) => return r.into(),
    };
    let Some(engine) = s.engine.clone() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "step engine not running\n").into_response().into();
    };
    let fetch = move |nic: &str| engine.lock().unwrap_or_else(|p| p.into_inner()).nic_samples(nic, since, until, limit);
    Listing::json(super::pages::LiveWindowsPage { host: host_of(s), nics, fetch: Box::new(fetch) })
}
