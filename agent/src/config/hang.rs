//! `[hang]`: when a communicator is suspected hung (docs/architecture.md "Hang detection").
//!
//! A communicator is suspected when some rank has been inside one of its calls for longer
//! than `max(floor, k × the median of its recent calls' durations)` and at least one of its
//! ranks has not arrived in that call (it is still before it, or its process exited). Once
//! raised, the suspicion holds until the condition has been false for `clear_after`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ConfigError;

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct HangConfig {
    /// Judge open calls at all. Default `true`.
    pub enabled: bool,
    /// A call is never "too long" below this. Default `30s`.
    #[serde(with = "super::duration_str")]
    pub floor: Duration,
    /// …nor below `k` × the median duration of the communicator's recent calls. Default 10.
    pub k: f64,
    /// A raised suspicion clears once the condition has been false this long. Default `5s`.
    #[serde(with = "super::duration_str")]
    pub clear_after: Duration,
}

impl Default for HangConfig {
    fn default() -> Self {
        HangConfig { enabled: true, floor: Duration::from_secs(30), k: 10.0, clear_after: Duration::from_secs(5) }
    }
}

impl HangConfig {
    /// The threshold for a communicator whose recent calls' median is `median` seconds.
    pub fn threshold(&self, median: Option<f64>) -> f64 {
        self.floor.as_secs_f64().max(self.k * median.unwrap_or(0.0))
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field, value: String, reason: &str| Err(ConfigError::Invalid { field, value, reason: reason.to_string() });
        if !(self.k.is_finite() && self.k >= 1.0 && self.k <= 1000.0) {
            return invalid("hang.k", self.k.to_string(), "must be a number from 1 to 1000 (a call k times longer than the median is suspect)");
        }
        if self.floor < Duration::from_millis(100) || self.floor > Duration::from_secs(86_400) {
            return invalid("hang.floor", humantime::format_duration(self.floor).to_string(), "must be between 100ms and 24h");
        }
        if self.clear_after > Duration::from_secs(3600) {
            return invalid("hang.clear_after", humantime::format_duration(self.clear_after).to_string(), "must be at most 1h");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threshold_is_the_larger_of_floor_and_k_medians() {
        let c = HangConfig { floor: Duration::from_secs(2), k: 5.0, ..Default::default() };
        assert_eq!(c.threshold(None), 2.0);
        assert_eq!(c.threshold(Some(0.1)), 2.0);
        assert_eq!(c.threshold(Some(1.0)), 5.0);
    }

    #[test]
    fn bad_values_name_their_field() {
        for (text, field) in [("k = 0.5", "hang.k"), ("k = nan", "hang.k"), ("floor = \"10ms\"", "hang.floor"), ("clear_after = \"2h\"", "hang.clear_after")] {
            let c: HangConfig = toml::from_str(text).expect(text);
            match c.validate() {
                Err(ConfigError::Invalid { field: f, .. }) => assert_eq!(f, field, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        let ok: HangConfig = toml::from_str("floor = \"2s\"\nk = 4\nclear_after = \"0s\"").expect("parses");
        assert!(ok.validate().is_ok());
        assert!(toml::from_str::<HangConfig>("flor = \"2s\"").is_err(), "unknown keys are refused");
    }
}
