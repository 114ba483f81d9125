//! `[otlp]`: OpenTelemetry export settings (the exporter is `export::otlp`), and the
//! standard `OTEL_*` variables that fill what the file leaves out ([`env`]).

pub mod env;

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use rustls::pki_types::{pem::PemObject, CertificateDer};
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// OTLP transport.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC (default port 4317).
    #[serde(rename = "grpc")]
    Grpc,
    /// OTLP/HTTP with binary protobuf bodies (default port 4318).
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

/// Compression of export bodies.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    #[default]
    None,
    /// gzip (`content-encoding: gzip` over HTTP, `grpc-encoding: gzip` over gRPC).
    Gzip,
}

/// `[otlp]`: OpenTelemetry export of metrics and step traces.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct OtlpConfig {
    /// Export at all. Default `false`.
    pub enabled: bool,
    /// Collector URL: `http://` (plain) or `https://` (TLS, the collector's certificate
    /// verified against `ca_file`, else the system's CA certificates). Default
    /// `http://localhost:4317` for grpc, `http://localhost:4318` for http/protobuf
    /// (`/v1/metrics` and `/v1/traces` are appended).
    pub endpoint: Option<String>,
    /// PEM file of the CA certificates that verify an `https://` collector, instead of the
    /// system's (`OTEL_EXPORTER_OTLP_CERTIFICATE`). Default none.
    pub ca_file: Option<PathBuf>,
    /// `grpc` or `http/protobuf`. Default `grpc`.
    pub protocol: Protocol,
    /// Extra request headers (gRPC metadata), e.g. `authorization = "Bearer …"`. Default
    /// empty.
    pub headers: BTreeMap<String, String>,
    /// Export period for metrics and the steps attributed meanwhile. Default `10s`.
    #[serde(with = "super::duration_str")]
    pub interval: Duration,
    /// Time limit of one export request. Default `5s`.
    #[serde(with = "super::duration_str")]
    pub timeout: Duration,
    /// Steps waiting for export; more are dropped and counted. Default 1024.
    pub queue: usize,
    /// `none` or `gzip`. Default `none`.
    pub compression: Compression,
    /// Resource attributes added to `service.name`, `service.version` and `host.name`
    /// (which these may replace), e.g. `"k8s.cluster.name" = "a100-east"`. Default empty.
    pub resource: BTreeMap<String, String>,
}

impl Default for OtlpConfig {
    fn default() -> Self {
        OtlpConfig {
            enabled: false,
            endpoint: None,
            ca_file: None,
            protocol: Protocol::Grpc,
            headers: BTreeMap::new(),
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            queue: 1024,
            compression: Compression::None,
            resource: BTreeMap::new(),
        }
    }
}

fn invalid(field: &'static str, value: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { field, value: value.into(), reason: reason.into() }
}

impl OtlpConfig {
    /// The endpoint, or the protocol's default.
    pub fn endpoint(&self) -> String {
        match (&self.endpoint, self.protocol) {
            (Some(e), _) => e.clone(),
            (None, Protocol::Grpc) => "http://localhost:4317".into(),
            (None, Protocol::HttpProtobuf) => "http://localhost:4318".into(),
        }
    }

    fn uri(&self) -> Result<http::Uri, ConfigError> {
        let e = self.endpoint();
        let uri: http::Uri = e.parse().map_err(|err: http::uri::InvalidUri| invalid("otlp.endpoint", &e, err.to_string()))?;
        match uri.scheme_str() {
            Some("http" | "https") => Ok(uri),
            _ => Err(invalid("otlp.endpoint", &e, "expected http://host:port or https://host:port")),
        }
    }

    /// `host:port` of the endpoint (gRPC dials it).
    pub fn authority(&self) -> Result<String, ConfigError> {
        let uri = self.uri()?;
        let auth = uri.authority().ok_or_else(|| invalid("otlp.endpoint", self.endpoint(), "no host"))?;
        let default_port = if self.protocol == Protocol::Grpc { 4317 } else { 4318 };
        Ok(format!("{}:{}", auth.host(), auth.port_u16().unwrap_or(default_port)))
    }

    /// The endpoint's host name (what an `https://` collector's certificate must name).
    pub fn host(&self) -> Result<String, ConfigError> {
        let uri = self.uri()?;
        let host = uri.host().ok_or_else(|| invalid("otlp.endpoint", self.endpoint(), "no host"))?;
        Ok(host.trim_start_matches('[').trim_end_matches(']').to_string())
    }

    /// Whether the endpoint is `https://`.
    pub fn tls(&self) -> bool {
        self.uri().is_ok_and(|u| u.scheme_str() == Some("https"))
    }

    /// The certificates that verify an `https://` collector: `ca_file`'s (PEM, at least one;
    /// other sections skipped), else the system's (`rustls-native-certs`: `SSL_CERT_FILE` /
    /// `SSL_CERT_DIR`, else the distribution's bundle, `/etc/ssl/certs` on Debian).
    pub fn trust_anchors(&self) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
        if let Some(path) = &self.ca_file {
            let err = |reason: String| invalid("otlp.ca_file", path.display().to_string(), reason);
            let certs = CertificateDer::pem_file_iter(path).map_err(|e| err(e.to_string()))?.collect::<Result<Vec<_>, _>>().map_err(|e| err(e.to_string()))?;
            if certs.is_empty() {
                return Err(err("no PEM certificate (-----BEGIN CERTIFICATE-----) in it".into()));
            }
            return Ok(certs);
        }
        let found = rustls_native_certs::load_native_certs();
        if found.certs.is_empty() {
            let why = found.errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
            return Err(invalid(
                "otlp.endpoint",
                self.endpoint(),
                format!("no CA certificate could be loaded from the system ({}); set otlp.ca_file", if why.is_empty() { "none found" } else { &why }),
            ));
        }
        Ok(found.certs)
    }

    pub fn header_list(&self) -> Result<Vec<(http::HeaderName, http::HeaderValue)>, ConfigError> {
        self.headers
            .iter()
            .map(|(k, v)| {
                let name = http::HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes()).map_err(|e| invalid("otlp.headers", k, e.to_string()))?;
                let value = http::HeaderValue::from_str(v).map_err(|e| invalid("otlp.headers", k, e.to_string()))?;
                Ok((name, value))
            })
            .collect()
    }

    /// Checks the endpoint, headers and durations (also when disabled, so a typo is found
    /// before the day it is switched on).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.authority()?;
        self.header_list()?;
        if self.ca_file.is_some() || self.tls() {
            self.trust_anchors()?;
        }
        if self.interval < Duration::from_millis(100) {
            return Err(invalid("otlp.interval", humantime::format_duration(self.interval).to_string(), "must be at least 100ms"));
        }
        if self.timeout.is_zero() {
            return Err(invalid("otlp.timeout", "0s", "must be longer than 0 (e.g. 5s)"));
        }
        if self.queue == 0 {
            return Err(invalid("otlp.queue", "0", "must be at least 1"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_validation() {
        let c = OtlpConfig::default();
        assert!(!c.enabled, "off by default");
        assert_eq!(c.endpoint(), "http://localhost:4317");
        c.validate().expect("defaults validate");
        let h = OtlpConfig { protocol: Protocol::HttpProtobuf, ..Default::default() };
        assert_eq!(h.endpoint(), "http://localhost:4318");
        let parsed: OtlpConfig = toml::from_str(
            "enabled = true\nendpoint = \"http://collector:4317\"\nprotocol = \"http/protobuf\"\ninterval = \"2s\"\n[headers]\nauthorization = \"Bearer x\"\n",
        )
        .expect("toml");
        assert_eq!(parsed.protocol, Protocol::HttpProtobuf);
        assert_eq!(parsed.authority().expect("authority"), "collector:4317");
        assert_eq!(parsed.interval, Duration::from_secs(2));
        parsed.validate().expect("valid");
        let tls = OtlpConfig { endpoint: Some("https://collector.example:4317".into()), ..Default::default() };
        tls.validate().expect("https is accepted");
        assert!(tls.tls() && !parsed.tls());
        assert_eq!((tls.authority().expect("authority"), tls.host().expect("host")), ("collector.example:4317".into(), "collector.example".into()));
        let dir = tempfile::tempdir().expect("tmp");
        let no_cert = dir.path().join("empty.pem");
        std::fs::write(&no_cert, "not a certificate\n").expect("write");
        let key_only = dir.path().join("key.pem");
        std::fs::write(&key_only, "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n").expect("write");
        let bad_base64 = dir.path().join("bad.pem");
        std::fs::write(&bad_base64, "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n").expect("write");
        for bad in [
            OtlpConfig { endpoint: Some("ftp://c:4317".into()), ..Default::default() },
            OtlpConfig { endpoint: Some("c:4317".into()), ..Default::default() },
            OtlpConfig { ca_file: Some(dir.path().join("missing.pem")), ..Default::default() },
            OtlpConfig { ca_file: Some(no_cert), ..Default::default() },
            OtlpConfig { ca_file: Some(key_only), ..Default::default() },
            OtlpConfig { ca_file: Some(bad_base64), ..Default::default() },
            OtlpConfig { headers: [("bad header".to_string(), "x".to_string())].into(), ..Default::default() },
            OtlpConfig { headers: [("x-a".to_string(), "line\nbreak".to_string())].into(), ..Default::default() },
            OtlpConfig { interval: Duration::from_millis(1), ..Default::default() },
            OtlpConfig { timeout: Duration::ZERO, ..Default::default() },
            OtlpConfig { queue: 0, ..Default::default() },
        ] {
            assert!(matches!(bad.validate(), Err(ConfigError::Invalid { .. })), "{bad:?}");
        }
        assert!(toml::from_str::<OtlpConfig>("protocol = \"http/json\"").is_err(), "only the two protocols");
    }
}
