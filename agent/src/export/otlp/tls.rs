//! TLS for an `https://` collector: rustls with its `ring` provider (TLS 1.2 and 1.3, its
//! safe defaults). The collector's certificate is verified against the trust anchors of
//! [`crate::config::otlp::OtlpConfig::trust_anchors`]: `[otlp] ca_file` (PEM,
//! `OTEL_EXPORTER_OTLP_CERTIFICATE`) when set, else the system's CA certificates. No client
//! certificate (no mutual TLS).

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, ServerName};

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(transparent)]
    Anchors(#[from] crate::config::ConfigError),
    #[error("no certificate among the {0} loaded is a usable trust anchor")]
    NoAnchor(usize),
    #[error("{0:?} is not a host name or address TLS can verify")]
    ServerName(String),
    #[error("TLS set-up: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The crypto provider both transports use.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A client configuration trusting `roots`, offering `alpn` (`h2` for gRPC).
pub fn client_config(roots: &[CertificateDer<'static>], alpn: &[&[u8]]) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut store = rustls::RootCertStore::empty();
    let (added, _) = store.add_parsable_certificates(roots.iter().cloned());
    if added == 0 {
        return Err(TlsError::NoAnchor(roots.len()));
    }
    let mut cfg =
        rustls::ClientConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?.with_root_certificates(store).with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(cfg))
}

/// The name the collector's certificate must carry (a DNS name or an IP address).
pub fn server_name(host: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(host.to_string()).map_err(|_| TlsError::ServerName(host.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_be_verifiable_and_a_client_needs_an_anchor() {
        assert!(server_name("collector.example").is_ok() && server_name("127.0.0.1").is_ok());
        assert!(matches!(server_name("bad name"), Err(TlsError::ServerName(_))));
        assert!(matches!(client_config(&[], &[b"h2"]), Err(TlsError::NoAnchor(0))));
        assert!(matches!(client_config(&[CertificateDer::from(vec![1, 2, 3])], &[b"h2"]), Err(TlsError::NoAnchor(1))), "garbage is no anchor");
    }
}
