//! HTTP endpoints: `/metrics`, `/healthz`, `/readyz`, `/api/v1/topology`, `/api/v1/status`.
//! Everything here is read-only; handlers only read shared state, so a slow client never
//! blocks sampling.

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc, RwLock,
};

use axum::{
    extract::State,
    http::{header, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Json, Router,
};
use prometheus_client::registry::Registry;

/// State shared between the sampler and the HTTP handlers.
#[derive(Clone)]
pub struct AppState {
    pub registry: Arc<Registry>,
    pub ready: Arc<AtomicBool>,
    pub status: Arc<RwLock<serde_json::Value>>,
    pub topology: Arc<RwLock<serde_json::Value>>,
}

impl AppState {
    pub fn new(registry: Registry) -> Self {
        AppState {
            registry: Arc::new(registry),
            ready: Arc::new(AtomicBool::new(false)),
            status: Arc::new(RwLock::new(serde_json::json!({}))),
            topology: Arc::new(RwLock::new(serde_json::json!({}))),
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
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found; see /api/v1/status\n") })
        .with_state(state)
}

async fn metrics(State(s): State<AppState>) -> Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &s.registry) {
        Ok(()) => ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("encoding metrics failed: {e}\n")).into_response(),
    }
}

async fn readyz(State(s): State<AppState>) -> Response {
    if s.ready.load(Ordering::Relaxed) {
        "ready\n".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready: first sweep not finished\n").into_response()
    }
}

fn snapshot(v: &RwLock<serde_json::Value>) -> serde_json::Value {
    v.read().map(|g| g.clone()).unwrap_or_else(|p| p.into_inner().clone())
}

async fn topology(State(s): State<AppState>) -> Json<serde_json::Value> {
    Json(snapshot(&s.topology))
}

async fn status(State(s): State<AppState>) -> Json<serde_json::Value> {
    Json(snapshot(&s.status))
}
