//! A test-only clock offset: `STEPWISE_TEST_CLOCK_OFFSET=20ms` (or `-20ms`) makes this agent's
//! wall clock — the probe clock map and the counter sweeps' stamps — read that much ahead
//! (behind), as the clock of a host whose NTP is off would. Agents in network namespaces share
//! one kernel clock; this is how the tests give them different clocks (`timeline::clocks`
//! must then find the offset from the collectives). Not for production: the agent logs a
//! warning at start when it is set.

use std::sync::OnceLock;

/// The variable's name.
pub const VAR: &str = "STEPWISE_TEST_CLOCK_OFFSET";

/// Parses `20ms`, `-20ms`, `+1.5s` (a sign, then a humantime duration).
pub fn parse(s: &str) -> Result<f64, String> {
    let s = s.trim();
    let (sign, rest) = match s.strip_prefix('-') {
        Some(r) => (-1.0, r),
        None => (1.0, s.strip_prefix('+').unwrap_or(s)),
    };
    humantime::parse_duration(rest.trim()).map(|d| sign * d.as_secs_f64()).map_err(|e| format!("{VAR}={s:?}: {e} (expected e.g. 20ms or -20ms)"))
}

/// The offset in seconds (0 when unset). Read once.
pub fn offset_seconds() -> f64 {
    static OFFSET: OnceLock<f64> = OnceLock::new();
    *OFFSET.get_or_init(|| std::env::var(VAR).ok().map(|v| parse(&v)).transpose().ok().flatten().unwrap_or(0.0))
}

/// Refuses a malformed value at start (called by `agent run`).
pub fn check() -> Result<(), String> {
    std::env::var(VAR).ok().map(|v| parse(&v)).transpose().map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_durations() {
        assert_eq!(parse("20ms"), Ok(0.02));
        assert_eq!(parse("-20ms"), Ok(-0.02));
        assert_eq!(parse("+1.5s").map(|x| (x * 1e3).round()), Ok(1500.0));
        assert!(parse("soon").is_err());
    }
}
