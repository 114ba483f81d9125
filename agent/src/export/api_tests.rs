//! The list endpoints' bounds, through their handlers (a child module of `api`).

use std::sync::{Arc, Mutex};

use axum::{
    extract::{Query, State},
    http::{StatusCode, Uri},
    response::Response,
};
use prometheus_client::registry::Registry;

use super::*;
use crate::{
    config::StepsConfig,
    engine::Engine,
    timeline::{Marker, Phase},
};

fn state(markers: usize) -> AppState {
    let mut registry = Registry::default();
    let mut engine = Engine::new(StepsConfig::default(), "test".into(), &mut registry).expect("engine");
    let t0 = crate::engine::wall_now();
    for i in 0..markers {
        // 64 ranks and few steps: within admission control's bursts.
        engine.add_marker(Marker { rank: (i % 64) as u32, step: (i / 64) as u64, phase: Phase::Begin, time: Some(t0 + i as f64 * 1e-3), host: None });
    }
    let mut s = AppState::new(registry);
    s.set_engine(Arc::new(Mutex::new(engine)));
    s
}

fn query<T: serde::de::DeserializeOwned>(q: &str) -> Result<Query<T>, axum::extract::rejection::QueryRejection> {
    Query::try_from_uri(&format!("http://agent/x?{q}").parse::<Uri>().expect("uri"))
}

async fn body(r: Response) -> (StatusCode, serde_json::Value) {
    let status = r.status();
    let b = axum::body::to_bytes(r.into_body(), usize::MAX).await.expect("body");
    (status, serde_json::from_slice(&b).unwrap_or(serde_json::Value::Null))
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime")
}

#[test]
fn markers_are_paged_with_a_documented_maximum() {
    rt().block_on(async {
        let s = state(MAX_MARKERS_LIMIT + 500);
        let (st, v) = body(markers_get(State(s.clone()), query("")).await).await;
        assert_eq!(st, StatusCode::OK);
        assert_eq!(v["markers"].as_array().map(Vec::len), Some(MAX_MARKERS_LIMIT), "the maximum, never all");
        assert_eq!(v["truncated"], true);
        let (_, v) = body(markers_get(State(s.clone()), query("limit=1000000")).await).await;
        assert_eq!(v["markers"].as_array().map(Vec::len), Some(MAX_MARKERS_LIMIT), "a larger limit is capped");
        let (_, page) = body(markers_get(State(s.clone()), query("limit=3")).await).await;
        let page = page["markers"].as_array().cloned().unwrap_or_default();
        assert_eq!(page.len(), 3);
        // The next page starts after the last marker's time.
        let last = page[2]["time"].as_f64().expect("time");
        let (_, next) = body(markers_get(State(s.clone()), query(&format!("since={}&limit=2", last + 1e-4))).await).await;
        assert_eq!((&next["markers"][0]["rank"], &next["markers"][0]["step"]), (&serde_json::json!(3), &serde_json::json!(0)), "the fourth marker");
        let (_, tail) = body(markers_get(State(s), query(&format!("since={}", last + 1e3))).await).await;
        assert_eq!(tail["truncated"], false);
    });
}

#[test]
fn since_and_until_must_be_finite_on_every_list_endpoint() {
    rt().block_on(async {
        let s = state(10);
        for q in ["since=NaN", "since=1e400", "since=-inf", "until=NaN"] {
            assert_eq!(markers_get(State(s.clone()), query(q)).await.status(), StatusCode::BAD_REQUEST, "markers {q}");
            assert_eq!(windows(State(s.clone()), query(q)).await.status(), StatusCode::BAD_REQUEST, "windows {q}");
            if !q.starts_with("until") {
                assert_eq!(steps(State(s.clone()), query(q)).await.status(), StatusCode::BAD_REQUEST, "steps {q}");
                assert_eq!(collectives(State(s.clone()), query(q)).await.status(), StatusCode::BAD_REQUEST, "collectives {q}");
            }
        }
        for q in ["since=1", "since=1&limit=5", ""] {
            assert_eq!(markers_get(State(s.clone()), query(q)).await.status(), StatusCode::OK, "markers {q}");
            assert_eq!(windows(State(s.clone()), query(q)).await.status(), StatusCode::OK, "windows {q}");
            assert_eq!(steps(State(s.clone()), query(q)).await.status(), StatusCode::OK, "steps {q}");
        }
        assert_eq!(markers_get(State(s), query("limit=-1")).await.status(), StatusCode::BAD_REQUEST);
    });
}

#[test]
fn a_head_over_32_kib_is_refused_like_the_docs_say() {
    let req = |extra: usize| {
        axum::extract::Request::builder()
            .uri("/metrics")
            .header("host", "agent")
            .header("x-pad", "a".repeat(extra))
            .body(axum::body::Body::empty())
            .expect("req")
    };
    let small = head_bytes(&req(0));
    assert!((40..80).contains(&small), "{small}");
    // Heads between 32 and 48 KiB got through hyper's buffer limit.
    assert!(head_bytes(&req(MAX_HEAD_BYTES)) > MAX_HEAD_BYTES);
    assert!(head_bytes(&req(40 * 1024)) > MAX_HEAD_BYTES);
    assert!(head_bytes(&req(MAX_HEAD_BYTES - 100)) <= MAX_HEAD_BYTES);
    // Through the router as the server runs it (hyper's view of the tower service).
    let app = hyper_util::service::TowerToHyperService::new(router(state(0)));
    let svc = |r| hyper::service::Service::call(&app, r);
    rt().block_on(async {
        assert_eq!(svc(req(40 * 1024)).await.expect("infallible").status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
        assert_eq!(svc(req(16 * 1024)).await.expect("infallible").status(), StatusCode::OK);
    });
}

#[test]
fn readyz_names_a_source_stuck_in_its_sweep() {
    let mut reg = Registry::default();
    let m = crate::export::metrics::AgentMetrics::register(&mut reg, false);
    let w = crate::export::watchdog::Watchdog::register(&mut reg, &m, std::time::Duration::from_millis(10));
    let mut s = state(0);
    s.watchdog = Some(w.clone());
    s.ready.store(true, std::sync::atomic::Ordering::Relaxed);
    rt().block_on(async {
        assert_eq!(readyz(State(s.clone())).await.status(), StatusCode::OK);
        w.begin("rdma");
        std::thread::sleep(std::time::Duration::from_millis(20));
        let r = readyz(State(s.clone())).await;
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        let b = axum::body::to_bytes(r.into_body(), usize::MAX).await.expect("body");
        assert!(String::from_utf8_lossy(&b).contains("source rdma has not finished its sweep"), "{b:?}");
        w.end();
        assert_eq!(readyz(State(s)).await.status(), StatusCode::OK);
    });
}

#[test]
fn busy_api_requests_never_hold_metrics_and_wait_their_turn() {
    let mut s = state(0);
    s.api_queue_wait = std::time::Duration::from_millis(50);
    let app = hyper_util::service::TowerToHyperService::new(router(s.clone()));
    let get = |path: &str| axum::extract::Request::builder().uri(path).body(axum::body::Body::empty()).expect("req");
    rt().block_on(async {
        // Every API slot taken by slow requests.
        let held = s.api_permits.clone().acquire_many_owned(MAX_API_CONCURRENCY as u32).await.expect("permits");
        for path in ["/metrics", "/healthz"] {
            let r = hyper::service::Service::call(&app, get(path)).await.expect("infallible");
            assert_eq!(r.status(), StatusCode::OK, "{path} has its own capacity");
        }
        let r = hyper::service::Service::call(&app, get("/api/v1/status")).await.expect("infallible");
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE, "waited its turn, then refused");
        drop(held);
        let r = hyper::service::Service::call(&app, get("/api/v1/status")).await.expect("infallible");
        assert_eq!(r.status(), StatusCode::OK);
    });
}

#[test]
fn collectives_refuse_an_unknown_format_and_a_bad_until() {
    rt().block_on(async {
        let s = state(0);
        for q in ["format=xml", "format=", "until=NaN", "until=1e400", "since=1&until=-inf"] {
            assert_eq!(collectives(State(s.clone()), query(q)).await.status(), StatusCode::BAD_REQUEST, "collectives {q}");
        }
        // Valid queries get past the checks (here to "probes are not running": no history).
        for q in ["format=compact", "format=full", "since=1&until=2&format=compact"] {
            assert_eq!(collectives(State(s.clone()), query(q)).await.status(), StatusCode::SERVICE_UNAVAILABLE, "collectives {q}");
        }
    });
}
