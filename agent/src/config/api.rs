//! `[api]`: what the TCP listener accepts beyond the read-only endpoints, and the bearer
//! token ([`Secret`]) that guards it.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// `[api]`: the TCP API is read-only unless this enables `POST /api/v1/markers` on it, and
/// then only with a bearer token. Markers normally go to the Unix socket (mode 0660).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ApiConfig {
    /// Accept `POST /api/v1/markers` on the TCP listener (`Authorization: Bearer <token>`).
    /// Default `false`: a POST over TCP is refused with 403. Needs `token` or `token_file`.
    pub markers_over_tcp: bool,
    /// The bearer token, at least 16 characters. Prefer `token_file`: the config file then
    /// holds no secret.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<Secret>,
    /// File whose first line is the token (a Kubernetes Secret volume); read at start-up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// The token read from `token_file` by [`super::Config::load`].
    #[serde(skip)]
    pub file_token: Option<Secret>,
}

/// Shortest bearer token accepted.
pub const MIN_TOKEN_CHARS: usize = 16;

impl ApiConfig {
    /// The token POSTs over TCP must carry; `None` when they are refused.
    pub fn markers_token(&self) -> Option<&Secret> {
        if !self.markers_over_tcp {
            return None;
        }
        self.token.as_ref().or(self.file_token.as_ref())
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field, value: &str, reason: &str| ConfigError::Invalid { field, value: value.to_string(), reason: reason.to_string() };
        if self.token.is_some() && self.token_file.is_some() {
            return Err(invalid("api.token", "<redacted>", "set api.token or api.token_file, not both"));
        }
        if self.markers_over_tcp && self.token.is_none() && self.token_file.is_none() {
            return Err(invalid("api.markers_over_tcp", "true", "needs api.token or api.token_file (POST /api/v1/markers over TCP is token-protected)"));
        }
        if let Some(t) = &self.token {
            t.check("api.token")?;
        }
        Ok(())
    }

    /// Reads `token_file` (first line, trimmed) into `file_token`.
    pub(super) fn read_token_file(&mut self) -> Result<(), ConfigError> {
        let Some(path) = &self.token_file else { return Ok(()) };
        let text = super::read_regular(path).map_err(|source| ConfigError::Read { path: path.clone(), source })?;
        let t = Secret(text.lines().next().unwrap_or("").trim().to_string());
        t.check("api.token_file")?;
        self.file_token = Some(t);
        Ok(())
    }
}

/// A credential: never printed (`Debug` and serialization redact it), compared in constant
/// time.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }

    /// Whether `given` is this secret; the time taken depends only on the lengths.
    pub fn matches(&self, given: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), given.as_bytes());
        a.len() == b.len() && std::hint::black_box(a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y))) == 0
    }

    fn check(&self, field: &'static str) -> Result<(), ConfigError> {
        let n = self.0.chars().count();
        if n < MIN_TOKEN_CHARS || self.0.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(ConfigError::Invalid {
                field,
                value: "<redacted>".into(),
                reason: format!("a token has at least {MIN_TOKEN_CHARS} characters and no spaces ({n} given); e.g. `openssl rand -hex 32`"),
            });
        }
        Ok(())
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("<redacted>")
    }
}
