//! The two OTLP transports, each plain (`http://`) or TLS (`https://`, [`super::tls`]), both
//! with optional gzip.
//!
//! - `grpc`: one unary call per export over HTTP/2 with the `h2` crate (the HTTP/2 stack
//!   tonic itself uses). A unary gRPC call is a POST of one length-prefixed message with
//!   `content-type: application/grpc` and `te: trailers`; the outcome is the `grpc-status`
//!   trailer (gRPC over HTTP/2, PROTOCOL-HTTP2.md). Over TLS, HTTP/2 is negotiated by ALPN
//!   (`h2`) on a `tokio-rustls` stream. The connection is kept and re-dialled after any error.
//! - `http/protobuf`: POST of the binary message to `{endpoint}/v1/metrics` and
//!   `/v1/traces` with `content-type: application/x-protobuf` (OTLP/HTTP), over `ureq`.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};

use super::tls::{self, TlsError};

/// Why one export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS with {addr}: {source}")]
    Handshake {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("HTTP/2: {0}")]
    H2(#[from] h2::Error),
    #[error("gRPC status {code} from {path}: {message}")]
    Grpc { code: u32, path: String, message: String },
    #[error("HTTP {status} from {url}: {body}")]
    Status { status: u16, url: String, body: String },
    #[error("HTTP: {0}")]
    Http(#[from] ureq::Error),
    #[error("invalid request header: {0}")]
    Header(#[from] http::Error),
    #[error("cannot start the exporter's runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

/// gRPC paths of the two Export RPCs.
pub const GRPC_METRICS: &str = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";
pub const GRPC_TRACES: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
/// OTLP/HTTP paths under the endpoint.
pub const HTTP_METRICS: &str = "/v1/metrics";
pub const HTTP_TRACES: &str = "/v1/traces";

/// An OTLP client for one endpoint.
pub enum Client {
    Grpc(Grpc),
    Http(Http),
}

impl Client {
    /// Sends one encoded Export request for `metrics` (else traces).
    pub fn export(&mut self, metrics: bool, body: Vec<u8>) -> Result<(), ExportError> {
        match self {
            Client::Grpc(g) => g.call(if metrics { GRPC_METRICS } else { GRPC_TRACES }, body),
            Client::Http(h) => h.post(if metrics { HTTP_METRICS } else { HTTP_TRACES }, body),
        }
    }
}

/// TLS of a gRPC connection: the client configuration and the name to verify.
#[derive(Clone)]
pub struct GrpcTls {
    pub config: Arc<rustls::ClientConfig>,
    pub name: ServerName<'static>,
}

impl GrpcTls {
    /// Trusting `roots`, verifying `host`, negotiating `h2`.
    pub fn new(roots: &[CertificateDer<'static>], host: &str) -> Result<GrpcTls, TlsError> {
        Ok(GrpcTls { config: tls::client_config(roots, &[b"h2"])?, name: tls::server_name(host)? })
    }
}

pub struct Grpc {
    /// `host:port`.
    authority: String,
    tls: Option<GrpcTls>,
    headers: Vec<(http::HeaderName, http::HeaderValue)>,
    timeout: Duration,
    rt: tokio::runtime::Runtime,
    conn: Option<h2::client::SendRequest<Bytes>>,
    gzip: bool,
}

/// gzip of one body (flate2's pure-Rust backend, default level).
pub fn gzip(body: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::with_capacity(body.len() / 4 + 64), flate2::Compression::default());
    // Writing into a Vec cannot fail.
    let _ = e.write_all(body);
    e.finish().unwrap_or_default()
}

/// A gRPC length-prefixed message: compressed flag, u32 big-endian length, the message.
fn grpc_frame(body: &[u8], gzip_it: bool) -> Vec<u8> {
    let gz;
    let msg = if gzip_it {
        gz = gzip(body);
        &gz[..]
    } else {
        body
    };
    let mut framed = Vec::with_capacity(msg.len() + 5);
    framed.push(u8::from(gzip_it));
    framed.extend_from_slice(&u32::try_from(msg.len()).unwrap_or(u32::MAX).to_be_bytes());
    framed.extend_from_slice(msg);
    framed
}

impl Grpc {
    pub fn new(
        authority: String,
        tls: Option<GrpcTls>,
        headers: Vec<(http::HeaderName, http::HeaderValue)>,
        timeout: Duration,
        gzip: bool,
    ) -> Result<Grpc, ExportError> {
        // One worker keeps the connection task (pings, window updates) running between
        // exports; it is the exporter's own, so a stuck collector never touches the API's.
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).thread_name("otlp-h2").enable_all().build().map_err(ExportError::Runtime)?;
        Ok(Grpc { authority, tls, headers, timeout, rt, conn: None, gzip })
    }

    fn call(&mut self, path: &str, body: Vec<u8>) -> Result<(), ExportError> {
        let timeout = self.timeout;
        let reused = self.conn.is_some();
        let first = self.call_once(path, body.clone());
        match first {
            // A kept connection the collector closed meanwhile (idle timeout, restart):
            // dial once more before calling it a failure.
            Err(ExportError::H2(_)) if reused => self.call_once(path, body),
            r => r,
        }
        .map_err(|e| if let ExportError::Timeout(_) = e { ExportError::Timeout(timeout) } else { e })
    }

    fn call_once(&mut self, path: &str, body: Vec<u8>) -> Result<(), ExportError> {
        let timeout = self.timeout;
        let conn = self.conn.take();
        let to = Peer { authority: &self.authority, tls: self.tls.as_ref() };
        let fut = call(conn, to, &self.headers, path, grpc_frame(&body, self.gzip), self.gzip);
        match self.rt.block_on(async { tokio::time::timeout(timeout, fut).await }) {
            Ok(Ok(conn)) => {
                self.conn = Some(conn);
                Ok(())
            }
            Ok(Err((e, keep))) => {
                self.conn = keep;
                Err(e)
            }
            Err(_) => Err(ExportError::Timeout(timeout)),
        }
    }
}

/// Where a gRPC call goes.
#[derive(Clone, Copy)]
struct Peer<'a> {
    authority: &'a str,
    tls: Option<&'a GrpcTls>,
}

/// HTTP/2 over `io`; its connection task runs on the exporter's runtime.
async fn h2_over<T: AsyncRead + AsyncWrite + Unpin + Send + 'static>(io: T) -> Result<h2::client::SendRequest<Bytes>, h2::Error> {
    let (send, connection) = h2::client::handshake(io).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("OTLP gRPC connection closed: {e}");
        }
    });
    Ok(send)
}

/// A new connection: TCP, then TLS when configured, then HTTP/2.
async fn dial(to: Peer<'_>) -> Result<h2::client::SendRequest<Bytes>, ExportError> {
    let tcp = tokio::net::TcpStream::connect(to.authority).await.map_err(|source| ExportError::Connect { addr: to.authority.into(), source })?;
    let _ = tcp.set_nodelay(true);
    Ok(match to.tls {
        None => h2_over(tcp).await?,
        Some(t) => {
            let stream = tokio_rustls::TlsConnector::from(t.config.clone()).connect(t.name.clone(), tcp).await;
            h2_over(stream.map_err(|source| ExportError::Handshake { addr: to.authority.into(), source })?).await?
        }
    })
}

/// One unary call; returns the connection for reuse (also after a gRPC-level error, when the
/// connection itself is fine).
async fn call(
    conn: Option<h2::client::SendRequest<Bytes>>,
    to: Peer<'_>,
    headers: &[(http::HeaderName, http::HeaderValue)],
    path: &str,
    framed: Vec<u8>,
    gzip: bool,
) -> Result<h2::client::SendRequest<Bytes>, (ExportError, Option<h2::client::SendRequest<Bytes>>)> {
    let conn = match conn {
        Some(c) => c,
        None => dial(to).await.map_err(|e| (e, None))?,
    };
    let (scheme, authority) = (if to.tls.is_some() { "https" } else { "http" }, to.authority);
    let mut send = conn.ready().await.map_err(|e| (e.into(), None))?;
    let mut req = http::Request::builder()
        .method(http::Method::POST)
        .uri(format!("{scheme}://{authority}{path}"))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .header(http::header::USER_AGENT, concat!("stepwise-agent/", env!("CARGO_PKG_VERSION")));
    if gzip {
        req = req.header("grpc-encoding", "gzip");
    }
    for (k, v) in headers {
        req = req.header(k, v);
    }
    let req = req.body(()).map_err(|e| (e.into(), Some(send.clone())))?;
    let (resp, mut stream) = send.send_request(req, false).map_err(|e| (e.into(), None))?;
    stream.send_data(Bytes::from(framed), true).map_err(|e| (e.into(), None))?;
    let resp = resp.await.map_err(|e| (e.into(), None))?;
    let (parts, mut rbody) = resp.into_parts();
    while let Some(chunk) = rbody.data().await {
        let chunk = chunk.map_err(|e| (e.into(), None))?;
        let _ = rbody.flow_control().release_capacity(chunk.len());
    }
    let trailers = rbody.trailers().await.map_err(|e| (e.into(), None))?;
    // A "trailers-only" response carries grpc-status in its headers.
    let get = |k: &str| trailers.as_ref().and_then(|t| t.get(k)).or_else(|| parts.headers.get(k)).and_then(|v| v.to_str().ok()).map(str::to_string);
    let code = if parts.status == http::StatusCode::OK { get("grpc-status").and_then(|s| s.parse::<u32>().ok()).unwrap_or(2) } else { 14 };
    if code != 0 {
        let message = get("grpc-message").map(|m| super::env::percent_decode(&m)).unwrap_or_else(|| format!("HTTP {}", parts.status));
        return Err((ExportError::Grpc { code, path: path.into(), message }, Some(send)));
    }
    Ok(send)
}

pub struct Http {
    /// Endpoint without a trailing `/`.
    base: String,
    headers: Vec<(String, String)>,
    agent: ureq::Agent,
    timeout: Duration,
    gzip: bool,
}

impl Http {
    /// `roots`: the trust anchors of an `https://` base (ignored for `http://`).
    pub fn new(base: &str, roots: &[CertificateDer<'static>], headers: Vec<(String, String)>, timeout: Duration, gzip: bool) -> Http {
        let certs: Vec<ureq::tls::Certificate<'static>> = roots.iter().map(|c| ureq::tls::Certificate::from_der(c.as_ref()).to_owned()).collect();
        let tls = ureq::tls::TlsConfig::builder()
            .provider(ureq::tls::TlsProvider::Rustls)
            .root_certs(ureq::tls::RootCerts::Specific(Arc::new(certs)))
            .unversioned_rustls_crypto_provider(tls::provider())
            .build();
        let agent =
            ureq::Agent::config_builder().timeout_global(Some(timeout)).http_status_as_error(false).max_redirects(0).tls_config(tls).build().new_agent();
        Http { base: base.trim_end_matches('/').to_string(), headers, agent, timeout, gzip }
    }

    fn post(&mut self, path: &str, body: Vec<u8>) -> Result<(), ExportError> {
        let url = format!("{}{path}", self.base);
        let mut req = self.agent.post(&url).header("content-type", "application/x-protobuf");
        let body = if self.gzip {
            req = req.header("content-encoding", "gzip");
            gzip(&body)
        } else {
            body
        };
        for (k, v) in &self.headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let mut resp = req.send(&body[..]).map_err(|e| match e {
            ureq::Error::Timeout(_) => ExportError::Timeout(self.timeout),
            e => e.into(),
        })?;
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            let text = resp.body_mut().with_config().limit(4096).read_to_string().unwrap_or_default();
            return Err(ExportError::Status { status, url, body: text.chars().take(200).collect::<String>().trim().to_string() });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gzipped_grpc_frame_is_flagged_and_inflates_to_the_message() {
        let body: Vec<u8> = (0..4000u32).flat_map(|i| (i % 7).to_le_bytes()).collect();
        let plain = grpc_frame(&body, false);
        assert_eq!((plain[0], u32::from_be_bytes([plain[1], plain[2], plain[3], plain[4]]) as usize), (0, body.len()));
        let gz = grpc_frame(&body, true);
        let len = u32::from_be_bytes([gz[1], gz[2], gz[3], gz[4]]) as usize;
        assert_eq!((gz[0], len), (1, gz.len() - 5));
        assert!(len < body.len() / 4, "compressed: {len} of {} bytes", body.len());
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[5..]), &mut out).expect("gunzip");
        assert_eq!(out, body);
    }

    #[test]
    fn dead_collectors_fail_fast_or_within_the_timeout() {
        // Nothing listens on a port just released: both transports fail, neither hangs.
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port");
        let t = std::time::Instant::now();
        let mut g = Client::Grpc(Grpc::new(format!("127.0.0.1:{port}"), None, Vec::new(), Duration::from_secs(2), false).expect("runtime"));
        assert!(matches!(g.export(true, vec![1, 2, 3]), Err(ExportError::Connect { .. })));
        let mut h = Client::Http(Http::new(&format!("http://127.0.0.1:{port}/"), &[], Vec::new(), Duration::from_secs(2), true));
        assert!(h.export(false, vec![1]).is_err());
        // A listener that accepts and never answers: the timeout bounds the call.
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let mut g = Client::Grpc(Grpc::new(addr.to_string(), None, Vec::new(), Duration::from_millis(300), true).expect("runtime"));
        assert!(matches!(g.export(false, vec![0; 10]), Err(ExportError::Timeout(_))));
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        drop(l);
    }
}
