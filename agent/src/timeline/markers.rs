//! Step markers: the one-line JSON protocol any training script can use.
//!
//! ```text
//! {"rank": 0, "step": 12, "phase": "begin"}
//! {"rank": 0, "step": 12, "phase": "end", "time": 1764500000.123}
//! ```
//! Sent as one datagram to the agent's Unix socket (default `/run/stepwise/markers.sock`),
//! or POSTed to `/api/v1/markers`. `time` (wall-clock seconds) is optional: without it the
//! agent stamps the marker when it receives it.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Begin,
    End,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Marker {
    pub rank: u32,
    pub step: u64,
    pub phase: Phase,
    /// Wall-clock seconds since the epoch.
    #[serde(default)]
    pub time: Option<f64>,
    /// Host that received the marker (filled in by the agent).
    #[serde(default)]
    pub host: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum MarkerError {
    #[error("marker is not valid JSON ({0}); expected {{\"rank\":0,\"step\":1,\"phase\":\"begin\"|\"end\"}}")]
    Json(#[from] serde_json::Error),
    #[error("marker too large ({0} bytes; at most 1024)")]
    TooLarge(usize),
    #[error("marker field {field} out of range: {value}")]
    Range { field: &'static str, value: String },
}

/// Largest marker accepted.
pub const MAX_MARKER_BYTES: usize = 1024;
/// Ranks beyond this are refused (bounded memory per step).
pub const MAX_RANK: u32 = 1 << 20;
/// A marker's `time`: wall-clock seconds since the epoch, from 2001-09-09 to 2100-01-01.
pub const TIME_RANGE: std::ops::Range<f64> = 1e9..4_102_444_800.0;
/// Longest `host` accepted (Linux `HOST_NAME_MAX`): a marker held 200 000 times must not
/// carry a kilobyte of name each.
pub const MAX_HOST_BYTES: usize = 64;
/// Largest step id accepted: the history store keeps ids as SQLite's signed 64-bit integers,
/// so a larger one would be shown by the API but never stored.
pub const MAX_STEP: u64 = i64::MAX as u64;

impl Marker {
    /// Parses and validates one marker; `now` stamps markers without a time.
    pub fn parse(line: &[u8], now: f64) -> Result<Marker, MarkerError> {
        if line.len() > MAX_MARKER_BYTES {
            return Err(MarkerError::TooLarge(line.len()));
        }
        let mut m: Marker = serde_json::from_slice(trim(line))?;
        if m.rank >= MAX_RANK {
            return Err(MarkerError::Range { field: "rank", value: m.rank.to_string() });
        }
        if m.step > MAX_STEP {
            return Err(MarkerError::Range { field: "step", value: m.step.to_string() });
        }
        if let Some(h) = m.host.as_ref().filter(|h| h.len() > MAX_HOST_BYTES) {
            return Err(MarkerError::Range { field: "host", value: format!("{} bytes (at most {MAX_HOST_BYTES})", h.len()) });
        }
        match m.time {
            Some(t) if !t.is_finite() || t <= 0.0 => return Err(MarkerError::Range { field: "time", value: t.to_string() }),
            // Wall-clock seconds since the epoch: 1e18 or 1e-6 would make a step of 31 billion
            // years, or one in 1970.
            Some(t) if !TIME_RANGE.contains(&t) => {
                return Err(MarkerError::Range { field: "time", value: format!("{t} (wall-clock seconds between 2001 and 2100 expected)") })
            }
            Some(_) => {}
            None => m.time = Some(now),
        }
        Ok(m)
    }
}

fn trim(b: &[u8]) -> &[u8] {
    let s = b.iter().position(|c| !c.is_ascii_whitespace()).unwrap_or(b.len());
    let e = b.iter().rposition(|c| !c.is_ascii_whitespace()).map(|i| i + 1).unwrap_or(s);
    &b[s..e.max(s)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_protocol() {
        let m = Marker::parse(b"{\"rank\":3,\"step\":7,\"phase\":\"begin\"}\n", 100.5).expect("parse");
        assert_eq!((m.rank, m.step, m.phase, m.time), (3, 7, Phase::Begin, Some(100.5)));
        let m = Marker::parse(br#"{"rank":0,"step":1,"phase":"end","time":1764500000.25}"#, 99.0).expect("parse");
        assert_eq!(m.time, Some(1764500000.25));
    }

    #[test]
    fn bad_markers_are_clear_errors() {
        for bad in [
            &b"not json"[..],
            br#"{"rank":0,"step":1,"phase":"middle"}"#,
            br#"{"rank":-1,"step":1,"phase":"end"}"#,
            br#"{"rank":0,"step":1,"phase":"end","extra":1}"#,
            b"",
        ] {
            assert!(Marker::parse(bad, 1.0).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(matches!(Marker::parse(br#"{"rank":4294967295,"step":1,"phase":"end"}"#, 1.0), Err(MarkerError::Range { .. })));
        assert!(matches!(Marker::parse(&[b' '; 2000], 1.0), Err(MarkerError::TooLarge(2000))));
        assert!(matches!(Marker::parse(br#"{"rank":0,"step":1,"phase":"end","time":-3}"#, 1.0), Err(MarkerError::Range { .. })));
        let host = |n: usize| format!(r#"{{"rank":0,"step":1,"phase":"end","host":"{}"}}"#, "h".repeat(n));
        assert!(Marker::parse(host(MAX_HOST_BYTES).as_bytes(), 1.0).is_ok());
        assert!(Marker::parse(format!(r#"{{"rank":0,"step":{MAX_STEP},"phase":"end"}}"#).as_bytes(), 1.0).is_ok());
        for step in [1u64 << 63, u64::MAX] {
            let m = format!(r#"{{"rank":0,"step":{step},"phase":"end"}}"#);
            assert!(matches!(Marker::parse(m.as_bytes(), 1.0), Err(MarkerError::Range { field: "step", .. })), "{m}");
        }
        assert!(matches!(Marker::parse(host(950).as_bytes(), 1.0), Err(MarkerError::Range { field: "host", .. })));
        let now = 1.7e9;
        for t in ["1e18", "1e-6", "12.25", "4102444800"] {
            let m = format!(r#"{{"rank":0,"step":1,"phase":"end","time":{t}}}"#);
            assert!(matches!(Marker::parse(m.as_bytes(), now), Err(MarkerError::Range { field: "time", .. })), "{m}");
        }
        assert!(Marker::parse(br#"{"rank":0,"step":1,"phase":"end","time":1e9}"#, now).is_ok(), "the range's start");
    }
}
