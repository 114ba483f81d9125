//! `[otlp]`: OpenTelemetry export settings (the exporter is `export::otlp`), and the
//! standard `OTEL_*` variables that fill what the file leaves out ([`env`]).

pub mod env;

use std::{collections::BTreeMap, time::Duration};

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
    /// Collector URL, plain `http://` (no TLS: send to a node-local or in-cluster
    /// collector). Default `http://localhost:4317` for grpc, `http://localhost:4318` for
    /// http/protobuf (`/v1/metrics` and `/v1/traces` are appended).
    pub endpoint: Option<String>,
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

    /// `host:port` of the endpoint (gRPC dials it).
    pub fn authority(&self) -> Result<String, ConfigError> {
        let e = self.endpoint();
        let uri: http::Uri = e.parse().map_err(|err: http::uri::InvalidUri| invalid("otlp.endpoint", &e, err.to_string()))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => return Err(invalid("otlp.endpoint", &e, "TLS is not supported: export to a node-local or in-cluster collector over http://")),
            _ => return Err(invalid("otlp.endpoint", &e, "expected http://host:port")),
        }
        let auth = uri.authority().ok_or_else(|| invalid("otlp.endpoint", &e, "no host"))?;
        let default_port = if self.protocol == Protocol::Grpc { 4317 } else { 4318 };
        Ok(format!("{}:{}", auth.host(), auth.port_u16().unwrap_or(default_port)))
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
        for bad in [
            OtlpConfig { endpoint: Some("https://c:4317".into()), ..Default::default() },
            OtlpConfig { endpoint: Some("c:4317".into()), ..Default::default() },
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
