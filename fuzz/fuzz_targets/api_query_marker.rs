//! The HTTP API as a network client reaches it: any method, URI (query strings of every
//! endpoint), `Authorization` header and body, through the real router. Writes are refused
//! without the token (403 when markers over TCP are off, 401 with a wrong token), nothing
//! answers 500, and marker JSON is either a validated marker or an error.
#![no_main]

use std::{
    cell::RefCell,
    sync::{Arc, Mutex},
};

use axum::{
    body::Body,
    extract::Query,
    http::{header, Method, Request, StatusCode, Uri},
    Router,
};
use libfuzzer_sys::fuzz_target;
use prometheus_client::registry::Registry;
use stepwise::{
    config::{Secret, StepsConfig},
    engine::Engine,
    export::api::{router, AppState, CollectivesQuery, SinceQuery, StepsQuery},
    sources::collectives::history::History,
    timeline::{markers::MAX_RANK, Marker},
};
use tower::ServiceExt;

const TOKEN: &str = "fuzz-token-0123456789";

struct App {
    rt: tokio::runtime::Runtime,
    /// `[api] markers_over_tcp = false` (the default) and `true` with [`TOKEN`].
    routers: [Router; 2],
    uses: u32,
}

fn app() -> App {
    let make = |token: Option<Secret>| {
        let mut registry = Registry::default();
        let engine = Engine::new(StepsConfig::default(), "fuzz".into(), &mut registry).expect("engine");
        let mut state = AppState::new(registry);
        state.engine = Some(Arc::new(Mutex::new(engine)));
        state.markers_token = token;
        if let Ok(mut h) = state.collectives.write() {
            *h = Some(Arc::new(Mutex::new(History::new("fuzz".into(), 16))));
        }
        router(state)
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
    App { rt, routers: [make(None), make(Some(Secret::new(TOKEN)))], uses: 0 }
}

thread_local! {
    static APP: RefCell<Option<App>> = const { RefCell::new(None) };
}

fn bearer_ok(auth: &[u8]) -> bool {
    let Ok(s) = std::str::from_utf8(auth) else { return false };
    s.trim().split_once(' ').is_some_and(|(scheme, t)| scheme.eq_ignore_ascii_case("bearer") && t.trim() == TOKEN)
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else { return };
    // `METHOD URI\nAUTHORIZATION\nBODY`
    let mut parts = rest.splitn(3, |b| *b == b'\n');
    let line = parts.next().unwrap_or_default();
    let auth = parts.next().unwrap_or_default();
    let body = parts.next().unwrap_or_default();
    let mut line = line.splitn(2, |b| *b == b' ');
    let (Some(method), Some(uri)) = (line.next(), line.next()) else { return };
    let (Ok(method), Ok(uri)) = (Method::from_bytes(method), Uri::try_from(uri)) else { return };

    // Every endpoint's query struct, as the handlers extract it.
    let _ = Query::<CollectivesQuery>::try_from_uri(&uri);
    let _ = Query::<StepsQuery>::try_from_uri(&uri);
    let _ = Query::<SinceQuery>::try_from_uri(&uri);
    // The marker protocol, as the Unix socket and the POST handler parse it.
    if let Ok(m) = Marker::parse(body, 1.7e9) {
        assert!(m.rank < MAX_RANK && m.time.is_some_and(|t| t.is_finite() && t > 0.0), "{m:?}");
    }

    let with_token = flags & 1 == 1;
    let mut req = Request::builder().method(method.clone()).uri(uri.clone());
    if !auth.is_empty() {
        req = req.header(header::AUTHORIZATION, auth);
    }
    let Ok(req) = req.body(Body::from(body.to_vec())) else { return };
    let sent_auth = req.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes().to_vec());
    let status = APP.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|a| a.uses >= 512) {
            *slot = Some(app()); // bounded marker history between runs
        }
        let a = slot.as_mut().expect("app");
        a.uses += 1;
        let r = a.routers[usize::from(with_token)].clone();
        match a.rt.block_on(r.oneshot(req)) {
            Ok(resp) => resp.status(),
            Err(never) => match never {},
        }
    });
    assert_ne!(status, StatusCode::INTERNAL_SERVER_ERROR, "{method} {uri}");
    if method == Method::POST && uri.path() == "/api/v1/markers" {
        if !with_token {
            assert_eq!(status, StatusCode::FORBIDDEN, "POST over TCP must be refused when off");
        } else if !sent_auth.as_deref().is_some_and(bearer_ok) {
            assert_eq!(status, StatusCode::UNAUTHORIZED, "POST without the token: {:?}", sent_auth.map(|a| String::from_utf8_lossy(&a).into_owned()));
        }
    }
    if !status.is_client_error() && method == Method::POST {
        assert!(with_token && sent_auth.as_deref().is_some_and(bearer_ok), "a write succeeded without the token: {status}");
    }
});
