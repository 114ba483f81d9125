//! List pages written to the client while they are serialized: a page's JSON goes out in
//! chunks of [`CHUNK_BYTES`], at most [`CHUNKS_AHEAD`] of them waiting for the client, so a
//! response is never one buffer. Built whole (axum's `Json`), ten parallel listings of
//! `/api/v1/windows` on a 500-device tree (13.7–13.8 MB of JSON each) raised the debug
//! agent's peak RSS by 109–134 MB: the four being built and every finished body waiting for
//! its client were in memory at once (streamed: 1.1–5.6 MB; tests/tests/hostile.rs).
//!
//! The bytes are those `Json` wrote (the same `serde_json::to_writer` of the same page); only
//! the framing differs (`Transfer-Encoding: chunked` instead of `Content-Length`). The API
//! permit the request took (`api::limit_api`) is held until its page is serialized, so at
//! most [`super::api::MAX_API_CONCURRENCY`] pages (and their copies) are in memory at once; a
//! client that takes no chunk for [`CLIENT_STALL`] has its response cut (the connection is
//! closed, never ended as if complete), which frees the permit.

use std::{
    io::Write,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    task::{Context, Poll},
    time::Duration,
};

use axum::{
    http::{header, StatusCode},
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use hyper::body::Frame;

/// Bytes serialized before they are handed to the connection.
pub const CHUNK_BYTES: usize = 64 * 1024;
/// Chunks serialized ahead of the client.
pub const CHUNKS_AHEAD: usize = 4;
/// Longest a chunk waits for the client to take the ones before it; then the response is cut.
pub const CLIENT_STALL: Duration = Duration::from_secs(10);

/// Writes a page's JSON.
pub type WriteJson = Box<dyn FnOnce(&mut dyn Write) -> serde_json::Result<()> + Send>;

/// What a list endpoint's page builder answers: a response as it is (errors, small pages), or
/// a page to serialize as JSON while it is sent.
pub enum Listing {
    Response(Response),
    Json(WriteJson),
}

impl Listing {
    /// `page` as JSON, streamed ([`Json`](axum::Json)'s bytes).
    pub fn json<T: serde::Serialize + Send + 'static>(page: T) -> Listing {
        Listing::Json(Box::new(move |w| serde_json::to_writer(w, &page)))
    }
}

impl From<Response> for Listing {
    fn from(r: Response) -> Listing {
        Listing::Response(r)
    }
}

tokio::task_local! {
    /// The API permit of the request being handled (set by `api::limit_api`), taken by
    /// [`off_runtime`] so that it lasts as long as the page's serialization.
    pub static API_PERMIT: std::cell::RefCell<Option<tokio::sync::OwnedSemaphorePermit>>;
}

/// Builds a list page on a blocking thread (the runtime's few workers stay free for
/// `/metrics` and `/healthz` however large the page) and answers as soon as it is built;
/// its JSON is then written on that thread as the client takes it.
pub async fn off_runtime(f: impl FnOnce() -> Listing + Send + 'static) -> Response {
    let permit = API_PERMIT.try_with(|p| p.borrow_mut().take()).ok().flatten();
    let (head_tx, head_rx) = tokio::sync::oneshot::channel();
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "list request outside the runtime\n").into_response();
    };
    let task = tokio::task::spawn_blocking(move || {
        let write = match f() {
            Listing::Response(r) => {
                let _ = head_tx.send(r);
                return;
            }
            Listing::Json(write) => write,
        };
        let (tx, rx) = tokio::sync::mpsc::channel(CHUNKS_AHEAD);
        let done = Arc::new(AtomicBool::new(false));
        let body = ChunkBody { rx, done: done.clone() };
        let head = ([(header::CONTENT_TYPE, "application/json")], axum::body::Body::new(body)).into_response();
        if head_tx.send(head).is_err() {
            return; // the client is gone
        }
        let mut w = ChunkWriter { buf: Vec::with_capacity(CHUNK_BYTES), tx, rt };
        match write(&mut w).map_err(std::io::Error::from).and_then(|()| w.flush()) {
            Ok(()) => done.store(true, Ordering::Release),
            Err(e) => tracing::debug!("list response cut: {e}"),
        }
        drop(permit);
    });
    match head_rx.await {
        Ok(r) => r,
        Err(_) => {
            let why = task.await.err().map(|e| e.to_string()).unwrap_or_default();
            (StatusCode::INTERNAL_SERVER_ERROR, format!("list request failed: {why}\n")).into_response()
        }
    }
}

/// Collects serialized bytes and hands them to the body a chunk at a time, waiting (at most
/// [`CLIENT_STALL`]) while [`CHUNKS_AHEAD`] are unsent.
struct ChunkWriter {
    buf: Vec<u8>,
    tx: tokio::sync::mpsc::Sender<Bytes>,
    rt: tokio::runtime::Handle,
}

impl ChunkWriter {
    fn send(&mut self) -> std::io::Result<()> {
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK_BYTES)));
        match self.rt.block_on(tokio::time::timeout(CLIENT_STALL, self.tx.send(chunk))) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(std::io::Error::new(std::io::ErrorKind::BrokenPipe, "client gone")),
            Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("client took no data for {CLIENT_STALL:?}"))),
        }
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        if self.buf.len() >= CHUNK_BYTES {
            self.send()?;
        }
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.send()
    }
}

/// The response body: chunks as [`ChunkWriter`] sends them; an error (the connection is
/// closed) when the writer stopped before the page's end.
struct ChunkBody {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    done: Arc<AtomicBool>,
}

impl hyper::body::Body for ChunkBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(b)) => Poll::Ready(Some(Ok(Frame::data(b)))),
            Poll::Ready(None) if self.done.load(Ordering::Acquire) => Poll::Ready(None),
            Poll::Ready(None) => Poll::Ready(Some(Err(std::io::Error::other("list response cut before its end")))),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime")
    }

    #[test]
    fn a_streamed_page_is_the_bytes_json_writes() {
        let page: Vec<(u32, String)> = (0..50_000).map(|i| (i, format!("row {i}"))).collect();
        let want = serde_json::to_vec(&page).expect("json");
        assert!(want.len() > 4 * CHUNK_BYTES, "several chunks");
        let r = rt().block_on(async move {
            let r = off_runtime(move || Listing::json(page)).await;
            assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
            axum::body::to_bytes(r.into_body(), usize::MAX).await.expect("body")
        });
        assert!(r.as_ref() == want.as_slice(), "same bytes");
    }

    #[test]
    fn a_page_that_fails_to_serialize_ends_in_an_error_not_a_short_body() {
        struct Bad;
        impl serde::Serialize for Bad {
            fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
                Err(serde::ser::Error::custom("no"))
            }
        }
        let r = rt().block_on(async { axum::body::to_bytes(off_runtime(|| Listing::json(vec![Bad])).await.into_body(), usize::MAX).await });
        assert!(r.is_err(), "{r:?}");
    }
}
