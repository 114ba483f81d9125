//! The OpenTelemetry SDK environment variables, read as every other exporter reads them
//! (OpenTelemetry specification, "Environment Variable Specification" and "OTLP Exporter
//! Configuration"):
//!
//! | variable | `[otlp]` key it fills |
//! |---|---|
//! | `OTEL_EXPORTER_OTLP_ENDPOINT` | `endpoint` |
//! | `OTEL_EXPORTER_OTLP_PROTOCOL` | `protocol` (`grpc`, `http/protobuf`) |
//! | `OTEL_EXPORTER_OTLP_HEADERS` | `headers` (`k=v,k2=v2`, values percent-decoded) |
//! | `OTEL_EXPORTER_OTLP_TIMEOUT` | `timeout` (milliseconds) |
//! | `OTEL_EXPORTER_OTLP_COMPRESSION` | `compression` (`gzip`, `none`) |
//! | `OTEL_EXPORTER_OTLP_CERTIFICATE` | `ca_file` (PEM CA certificates for an `https://` endpoint) |
//! | `OTEL_METRIC_EXPORT_INTERVAL` | `interval` (milliseconds) |
//! | `OTEL_SERVICE_NAME` | the `service.name` resource attribute |
//! | `OTEL_RESOURCE_ATTRIBUTES` | `resource` (`k=v,…`, values percent-decoded) |
//! | `OTEL_SDK_DISABLED=true` | turns `enabled` off |
//!
//! A key the config file sets wins over its variable (the file is the agent's programmatic
//! configuration); a variable fills what the file leaves out. Export itself is switched on
//! by `[otlp] enabled` only: a pod that inherits `OTEL_*` for its application does not start
//! exporting by accident. Not read: the per-signal `OTEL_EXPORTER_OTLP_{TRACES,METRICS}_*`
//! variables (the agent has one endpoint for both signals), the client certificate and key
//! (no mutual TLS) and `OTEL_EXPORTER_OTLP_INSECURE` (the scheme decides: `http://` is
//! plain, `https://` is TLS); a set one is reported by [`unread`].

use std::collections::{BTreeMap, BTreeSet};

use super::{Compression, OtlpConfig, Protocol};
use crate::config::ConfigError;

fn invalid(field: &'static str, value: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { field, value: value.into(), reason: reason.into() }
}

/// `k=v,k2=v2` with percent-encoded values (W3C Baggage octets), as
/// `OTEL_EXPORTER_OTLP_HEADERS` and `OTEL_RESOURCE_ATTRIBUTES` are written. Empty members
/// are skipped; a member without `=` or with an empty key is an error.
pub fn parse_pairs(field: &'static str, text: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut out = BTreeMap::new();
    for member in text.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        let Some((k, v)) = member.split_once('=') else {
            return Err(invalid(field, member, "expected key=value pairs separated by commas"));
        };
        let k = k.trim();
        if k.is_empty() {
            return Err(invalid(field, member, "empty key"));
        }
        out.insert(k.to_string(), percent_decode(v.trim()));
    }
    Ok(out)
}

/// Decodes `%XX` escapes (a `%` not followed by two hex digits stays as it is).
pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (b[i], b.get(i + 1).copied().and_then(hex), b.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn millis(field: &'static str, v: &str) -> Result<std::time::Duration, ConfigError> {
    v.trim().parse::<u64>().map(std::time::Duration::from_millis).map_err(|_| invalid(field, v, "expected whole milliseconds, e.g. 10000"))
}

/// The keys the config file's `[otlp]` table sets.
pub fn file_keys(text: &str) -> BTreeSet<String> {
    let table = text.parse::<toml::Table>().ok();
    table.and_then(|t| t.get("otlp").and_then(|o| o.as_table()).map(|o| o.keys().cloned().collect())).unwrap_or_default()
}

/// Fills the keys `file_keys` (those the `[otlp]` table of the file sets) leaves out from
/// the variables `var` returns.
pub fn apply(cfg: &mut OtlpConfig, file_keys: &BTreeSet<String>, var: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
    let get = |key: &str, name: &str| if file_keys.contains(key) { None } else { var(name).filter(|v| !v.trim().is_empty()) };
    if let Some(v) = get("endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT") {
        cfg.endpoint = Some(v.trim().to_string());
    }
    if let Some(v) = get("protocol", "OTEL_EXPORTER_OTLP_PROTOCOL") {
        cfg.protocol = match v.trim() {
            "grpc" => Protocol::Grpc,
            "http/protobuf" => Protocol::HttpProtobuf,
            other => return Err(invalid("OTEL_EXPORTER_OTLP_PROTOCOL", other, "supported: grpc, http/protobuf")),
        };
    }
    if let Some(v) = get("headers", "OTEL_EXPORTER_OTLP_HEADERS") {
        cfg.headers = parse_pairs("OTEL_EXPORTER_OTLP_HEADERS", &v)?;
    }
    if let Some(v) = get("timeout", "OTEL_EXPORTER_OTLP_TIMEOUT") {
        cfg.timeout = millis("OTEL_EXPORTER_OTLP_TIMEOUT", &v)?;
    }
    if let Some(v) = get("compression", "OTEL_EXPORTER_OTLP_COMPRESSION") {
        cfg.compression = match v.trim() {
            "gzip" => Compression::Gzip,
            "none" => Compression::None,
            other => return Err(invalid("OTEL_EXPORTER_OTLP_COMPRESSION", other, "supported: gzip, none")),
        };
    }
    if let Some(v) = get("ca_file", "OTEL_EXPORTER_OTLP_CERTIFICATE") {
        cfg.ca_file = Some(v.trim().into());
    }
    if let Some(v) = get("interval", "OTEL_METRIC_EXPORT_INTERVAL") {
        cfg.interval = millis("OTEL_METRIC_EXPORT_INTERVAL", &v)?;
    }
    if let Some(v) = get("resource", "OTEL_RESOURCE_ATTRIBUTES") {
        cfg.resource = parse_pairs("OTEL_RESOURCE_ATTRIBUTES", &v)?;
    }
    // OTEL_SERVICE_NAME takes precedence over a service.name in OTEL_RESOURCE_ATTRIBUTES
    // (specification); a service.name the file sets stays.
    if let Some(v) = var("OTEL_SERVICE_NAME").filter(|v| !v.trim().is_empty()) {
        if !(file_keys.contains("resource") && cfg.resource.contains_key("service.name")) {
            cfg.resource.insert("service.name".into(), v.trim().to_string());
        }
    }
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        cfg.enabled = false;
    }
    Ok(())
}

/// The standard variables that are set but not read (logged at start-up).
pub fn unread(var: &dyn Fn(&str) -> Option<String>) -> Vec<&'static str> {
    const UNREAD: [&str; 11] = [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
        "OTEL_EXPORTER_OTLP_CLIENT_KEY",
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_INSECURE",
    ];
    UNREAD.into_iter().filter(|k| var(k).is_some()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(v: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| v.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn variables_fill_what_the_file_leaves_out_and_never_override_it() {
        let env = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20abc,x-tenant = t1"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "30000"),
            ("OTEL_RESOURCE_ATTRIBUTES", "k8s.cluster.name=c1,service.name=ignored,deployment.environment=prod%2Ceu"),
            ("OTEL_SERVICE_NAME", "stepwise-node"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/etc/otel/ca.pem"),
        ];
        let mut c = OtlpConfig::default();
        apply(&mut c, &BTreeSet::new(), &vars(&env)).expect("apply");
        assert_eq!(c.endpoint.as_deref(), Some("http://collector:4318"));
        assert_eq!(c.protocol, Protocol::HttpProtobuf);
        assert_eq!(c.headers.get("authorization").map(String::as_str), Some("Bearer abc"));
        assert_eq!(c.headers.get("x-tenant").map(String::as_str), Some("t1"));
        assert_eq!(c.timeout, std::time::Duration::from_millis(2500));
        assert_eq!(c.compression, Compression::Gzip);
        assert_eq!(c.interval, std::time::Duration::from_secs(30));
        assert_eq!(c.resource.get("deployment.environment").map(String::as_str), Some("prod,eu"));
        assert_eq!(c.resource.get("service.name").map(String::as_str), Some("stepwise-node"), "OTEL_SERVICE_NAME wins");
        assert_eq!(c.ca_file.as_deref(), Some(std::path::Path::new("/etc/otel/ca.pem")));
        assert!(!c.enabled, "the variables never switch export on");

        // What the file sets stays.
        let mut c = OtlpConfig { endpoint: Some("http://file:4317".into()), ..OtlpConfig::default() };
        let keys: BTreeSet<String> = ["endpoint", "protocol"].into_iter().map(String::from).collect();
        apply(&mut c, &keys, &vars(&env)).expect("apply");
        assert_eq!((c.endpoint.as_deref(), c.protocol), (Some("http://file:4317"), Protocol::Grpc));
        assert_eq!(c.compression, Compression::Gzip, "keys the file is silent on are filled");
    }

    #[test]
    fn the_kill_switch_and_bad_values() {
        let mut c = OtlpConfig { enabled: true, ..OtlpConfig::default() };
        apply(&mut c, &BTreeSet::new(), &vars(&[("OTEL_SDK_DISABLED", "TRUE")])).expect("apply");
        assert!(!c.enabled);
        for (k, v) in [
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "5s"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "novalue"),
            ("OTEL_RESOURCE_ATTRIBUTES", "=x"),
        ] {
            let e = apply(&mut OtlpConfig::default(), &BTreeSet::new(), &vars(&[(k, v)])).expect_err(k);
            assert!(matches!(e, ConfigError::Invalid { field, .. } if field == k), "{k}={v}: {e}");
        }
        assert_eq!(unread(&vars(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "x")])), ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]);
    }

    #[test]
    fn the_file_keys_are_those_of_its_otlp_table() {
        let keys = file_keys("[otlp]\nenabled = true\nendpoint = \"http://x:4317\"\n[otlp.headers]\na = \"b\"\n[store]\nmax_bytes = 1\n");
        assert_eq!(keys.into_iter().collect::<Vec<_>>(), ["enabled", "endpoint", "headers"]);
        assert!(file_keys("not toml [").is_empty());
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("bad%20request%3A%20x"), "bad request: x");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}
