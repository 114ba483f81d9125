//! Configuration: a TOML file (`--config`, default `/etc/stepwise/agent.toml`), overridden by
//! `STEPWISE_*` environment variables and then by flags. Every field's default is documented
//! here and in `deploy/agent.toml.example`; an invalid value is a typed error at start-up.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Serialize};

pub mod api;
pub mod collectives;
pub mod hang;
pub mod otlp;
pub mod sources;
pub mod steps;
pub mod store;

pub use api::{ApiConfig, Secret, MIN_TOKEN_CHARS};
pub use collectives::CollectivesConfig;
pub use hang::HangConfig;
pub use otlp::OtlpConfig;
pub use sources::{SourcesConfig, DEFAULT_FAST_CPU_BUDGET, DEFAULT_FAST_INTERVAL, DEFAULT_TCP_CPU_BUDGET};
pub use steps::{Params, StepsConfig};
pub use store::{StoreConfig, DEFAULT_DB_PATH};

/// Default config file path.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/stepwise/agent.toml";

/// mlx5 `hw_counters/lifespan` default (10 ms): two reads inside it return the same cached
/// values, so sampling faster than this measures nothing (docs/platform-facts.md §1).
pub const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// The agent's configuration.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// HTTP listen address for `/metrics` and the read-only API. Default `0.0.0.0:9477`.
    pub listen: SocketAddr,
    /// Root of sysfs; every sysfs read goes through it (fixtures in tests). Default `/sys`.
    pub sysfs_root: PathBuf,
    /// Counter sampling interval. Default `1s`. Never below 10 ms, nor below an mlx5
    /// device's `hw_counters/lifespan` (the RDMA source raises it per device if needed).
    #[serde(with = "duration_str")]
    pub interval: Duration,
    /// Log filter in `RUST_LOG` syntax. Default `info`. A span field's value in a directive
    /// (`target[span{field=value}]=level`) matches literally, not as a regular expression
    /// ([`log_filter`]).
    pub log: String,
    /// Log line format on stderr: `text` (coloured only when stderr is a terminal and
    /// `NO_COLOR` is unset) or `json` (one object per line, for log collectors). Default
    /// `text`. Flag `--log-format`, variable `STEPWISE_LOG_FORMAT`.
    pub log_format: LogFormat,
    /// Which devices to read (globs on device name or PCI address). Empty = all. Default empty.
    pub include: Vec<String>,
    /// Devices never to read (globs on device name or PCI address). Default empty.
    pub exclude: Vec<String>,
    /// Stop reading a device whose first reads all fail (restricted ConnectX-7 functions flood
    /// dmesg otherwise). Default `true`.
    pub probe_safe: bool,
    /// Rail index per NIC (RDMA device name or netdev name), overriding NIC order. Default empty.
    pub rails: BTreeMap<String, u32>,
    /// Which counter sources run. Default: all.
    pub sources: SourcesConfig,
    /// Collective probes (`[collectives]`): process selection, user probes, history size.
    pub collectives: CollectivesConfig,
    /// Steps and attribution (`[steps]`): marker socket, slow-step threshold, NIC rates.
    pub steps: StepsConfig,
    /// History store (`[store]`).
    pub store: StoreConfig,
    /// OpenTelemetry export (`[otlp]`): off by default.
    pub otlp: OtlpConfig,
    /// What the TCP listener accepts beyond the read-only endpoints (`[api]`).
    pub api: ApiConfig,
    /// Hang detection (`[hang]`): when an open collective is suspected hung.
    pub hang: HangConfig,
}

/// How log lines are written (`log_format`).
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line: timestamp, level, target, message and fields.
    Json,
}

/// Most collective calls `[collectives] history` may keep in memory (~1 GiB of records).
pub const MAX_CALL_HISTORY: u64 = 1 << 22;
/// Most steps `[steps] history` may keep in memory.
pub const MAX_STEP_HISTORY: u64 = 1_000_000;
/// Smallest `[store] max_bytes`: below it retention would delete every step it writes.
pub const MIN_STORE_BYTES: u64 = 1 << 20;

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([0, 0, 0, 0], 9477)),
            sysfs_root: PathBuf::from("/sys"),
            interval: Duration::from_secs(1),
            log: "info".into(),
            log_format: LogFormat::Text,
            include: Vec::new(),
            exclude: Vec::new(),
            probe_safe: true,
            rails: BTreeMap::new(),
            sources: SourcesConfig::default(),
            collectives: Default::default(),
            steps: Default::default(),
            store: Default::default(),
            otlp: Default::default(),
            api: Default::default(),
            hang: Default::default(),
        }
    }
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("invalid value {value:?} for {field}: {reason}")]
    Invalid { field: &'static str, value: String, reason: String },
    #[error(transparent)]
    Pattern(#[from] PatternError),
}

/// An `include`/`exclude` device glob that does not compile (also `sources::Selector::new`).
#[derive(Debug, thiserror::Error)]
#[error("invalid device pattern {pattern:?}: {err}")]
pub struct PatternError {
    pub pattern: String,
    #[source]
    pub err: glob::PatternError,
}

/// Compiles each device glob, or names the first that does not compile.
pub fn device_patterns(patterns: &[String]) -> Result<Vec<glob::Pattern>, PatternError> {
    patterns.iter().map(|p| glob::Pattern::new(p).map_err(|err| PatternError { pattern: p.clone(), err })).collect()
}

/// Overrides from flags or `STEPWISE_*` environment variables (clap merges the two).
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub listen: Option<SocketAddr>,
    pub sysfs_root: Option<PathBuf>,
    pub interval: Option<Duration>,
    pub log: Option<String>,
    pub log_format: Option<LogFormat>,
    pub db: Option<PathBuf>,
    pub marker_socket: Option<PathBuf>,
    pub profiler_socket: Option<PathBuf>,
}

impl Config {
    /// Loads the file (a missing file at the *default* path means defaults; a missing file
    /// given explicitly is an error), applies overrides, validates.
    pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
        let (path, explicit) = match path {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from(DEFAULT_CONFIG_PATH), false),
        };
        let (mut cfg, otlp_keys) = match read_regular(&path) {
            Ok(text) => (Config::from_toml(&text).map_err(|source| ConfigError::Parse { path: path.clone(), source })?, otlp::env::file_keys(&text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => (Config::default(), Default::default()),
            Err(source) => return Err(ConfigError::Read { path, source }),
        };
        // The standard OTEL_* variables fill what `[otlp]` leaves out.
        otlp::env::apply(&mut cfg.otlp, &otlp_keys, &|k| std::env::var(k).ok())?;
        if let Some(v) = overrides.listen {
            cfg.listen = v;
        }
        if let Some(v) = &overrides.sysfs_root {
            cfg.sysfs_root = v.clone();
        }
        if let Some(v) = overrides.interval {
            cfg.interval = v;
        }
        if let Some(v) = &overrides.log {
            cfg.log = v.clone();
        }
        if let Some(v) = overrides.log_format {
            cfg.log_format = v;
        }
        if let Some(v) = &overrides.db {
            cfg.store.path = v.clone();
        }
        if let Some(v) = &overrides.marker_socket {
            cfg.steps.marker_socket = v.clone();
        }
        if let Some(v) = &overrides.profiler_socket {
            cfg.collectives.profiler_socket = v.clone();
        }
        cfg.validate()?;
        cfg.api.read_token_file()?;
        Ok(cfg)
    }

    pub fn from_toml(text: &str) -> Result<Config, toml::de::Error> {
        toml::from_str(text)
    }

    /// Checks values that serde alone cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.interval < MIN_INTERVAL {
            return Err(ConfigError::Invalid {
                field: "interval",
                value: humantime::format_duration(self.interval).to_string(),
                reason: "must be at least 10ms (the mlx5 hw_counters lifespan); faster sampling reads cached values".into(),
            });
        }
        if self.interval > Duration::from_secs(3600) {
            return Err(ConfigError::Invalid {
                field: "interval",
                value: humantime::format_duration(self.interval).to_string(),
                reason: "must be at most 1h".into(),
            });
        }
        if !self.sysfs_root.is_absolute() {
            return Err(ConfigError::Invalid { field: "sysfs_root", value: self.sysfs_root.display().to_string(), reason: "must be an absolute path".into() });
        }
        log_filter(&self.log).map_err(|e| ConfigError::Invalid { field: "log", value: self.log.clone(), reason: e.to_string() })?;
        device_patterns(&self.include)?;
        device_patterns(&self.exclude)?;
        for (nic, rate) in &self.steps.nic_rates {
            crate::units::parse_rate_pos(rate).map_err(|e| ConfigError::Invalid {
                field: "steps.nic_rates",
                value: format!("{nic} = {rate}"),
                reason: e.to_string(),
            })?;
        }
        self.sources.validate()?;
        self.otlp.validate()?;
        self.api.validate()?;
        self.hang.validate()?;
        self.validate_sizes()
    }

    /// Sizes that would disable what they size or exhaust memory: refused (exit 2).
    fn validate_sizes(&self) -> Result<(), ConfigError> {
        let range = |field: &'static str, v: u64, min: u64, max: u64| match v {
            v if (min..=max).contains(&v) => Ok(()),
            v => Err(ConfigError::Invalid { field, value: v.to_string(), reason: format!("must be between {min} and {max}") }),
        };
        range("collectives.history", self.collectives.history as u64, 1, MAX_CALL_HISTORY)?;
        range("steps.history", self.steps.history as u64, 1, MAX_STEP_HISTORY)?;
        range("steps.counter_samples", self.steps.counter_samples as u64, 16, 1 << 20)?;
        range("store.max_bytes", self.store.max_bytes, MIN_STORE_BYTES, u64::MAX)?;
        // Waits and windows of years overflow the clock arithmetic they feed (an `Instant`
        // plus 100 years) or never end: bounded with the reason.
        let at_most = |field: &'static str, v: Duration, max: Duration| match v {
            v if v <= max => Ok(()),
            v => Err(ConfigError::Invalid {
                field,
                value: humantime::format_duration(v).to_string(),
                reason: format!("must be at most {}", humantime::format_duration(max)),
            }),
        };
        at_most("steps.max_wait", self.steps.max_wait, Duration::from_secs(3600))?;
        at_most("collectives.sample_window", self.collectives.sample_window, Duration::from_secs(86_400))?;
        at_most("collectives.sample_every", self.collectives.sample_every, Duration::from_secs(86_400))
    }

    /// The documented default configuration as TOML (`agent run --print-default-config`).
    pub fn default_toml() -> String {
        toml::to_string_pretty(&Config::default()).unwrap_or_default()
    }
}

/// Reads a file the operator points at without blocking on it: opened `O_NONBLOCK` and refused
/// unless a regular file (a FIFO at the config path hung SIGHUP's reload, and with it the HTTP
/// server, until something wrote to it twice).
fn read_regular(path: &Path) -> std::io::Result<String> {
    use std::{io::Read, os::unix::fs::OpenOptionsExt};
    let mut f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(path)?;
    if !f.metadata()?.file_type().is_file() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file"));
    }
    let mut text = String::new();
    f.read_to_string(&mut text)?;
    Ok(text)
}

/// Parses a human duration (`1s`, `250ms`, `2m`) for flags and env.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 1s, 250ms, 2m)"))
}

/// serde adapter: durations as humantime strings (`"1s"`).
pub mod duration_str {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(serde::de::Error::custom)
    }
}

/// The log filter for a `log` setting: `tracing_subscriber`'s `RUST_LOG` syntax with span
/// field values matched literally. With regular expressions on (the library's default) a field
/// value compiles to a DFA whose size can explode: the config fuzzer found a 780-byte `log`
/// that had not finished validating after 60 s (fuzz/corpus/config_toml keeps it), and a
/// SIGHUP reload would stall the same way. The library's docs advise turning them off for input not
/// trusted to be well-formed.
///
/// Each comma-separated directive is trimmed here first: `tracing_subscriber` 0.3.23 walks a
/// directive's trimmed text but slices the untrimmed one with those offsets, so leading
/// whitespace shifts a slice into a multi-byte character and panics (`"\t\tstepwiseԊ=debug"`,
/// see the test; found by the same fuzzer). Trimmed, both are the same text; a blank directive stays as it was (an error).
pub fn log_filter(directives: &str) -> Result<tracing_subscriber::EnvFilter, tracing_subscriber::filter::ParseError> {
    let trimmed: Vec<&str> = directives
        .split(',')
        .map(|d| match d.trim() {
            "" => d,
            t => t,
        })
        .collect();
    tracing_subscriber::EnvFilter::builder().with_regex(false).parse(trimmed.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_filter_field_values_are_literal_not_regular_expressions() {
        // `[` alone is an invalid regular expression: with regexes on this is a parse error.
        assert!(tracing_subscriber::EnvFilter::try_new("stepwise[{op=[}]=debug").is_err());
        let f = log_filter("stepwise[{op=[}]=debug").expect("a literal field value");
        assert_eq!(f.to_string(), "stepwise[{op=[}]=debug");
        // The fuzzer's slow input: a `log` with a field value that is a huge regex.
        let text = include_str!("../../fuzz/corpus/config_toml/timeout-log-field-regex.toml");
        let cfg = Config::from_toml(text).expect("parses");
        assert!(cfg.log.contains("{{{{{"));
        // Not a well-formed directive either way; now a typed error naming the key, at once.
        match cfg.validate() {
            Err(ConfigError::Invalid { field, .. }) => assert_eq!(field, "log"),
            other => panic!("{other:?}"),
        }
        assert!(log_filter("info,stepwise::api=debug").is_ok() && log_filter("stepwise=notalevel").is_err());
    }

    #[test]
    fn log_filter_with_leading_whitespace_and_multibyte_text_is_an_error_not_a_panic() {
        // Two bytes of leading whitespace put the level's start inside the two-byte character.
        let bad = "\t\tstepwise\u{50a}=debug";
        // The library alone panics on it (slices the untrimmed text at the trimmed offsets).
        let lib = std::panic::catch_unwind(|| tracing_subscriber::EnvFilter::builder().with_regex(false).parse(bad));
        assert!(lib.is_err(), "tracing_subscriber no longer panics here: the trimming in log_filter can go");
        let ours = log_filter(bad).expect("trimmed, a target and a level");
        assert_eq!(ours.to_string(), "stepwise\u{50a}=debug");
        let ok = log_filter(" info ,\tstepwise::api=debug\n").expect("whitespace around directives is ignored");
        assert_eq!(ok.to_string(), log_filter("info,stepwise::api=debug").unwrap().to_string());
        assert!(log_filter("info, ,warn").is_err(), "a blank directive stays an error");
        // The fuzzer's input: a `log` of tabs, then text with a two-byte character.
        let text = include_str!("../../fuzz/corpus/config_toml/crash-log-leading-tab-multibyte.toml");
        let cfg = Config::from_toml(text).expect("parses");
        assert!(cfg.log.starts_with('\t') && !cfg.log.is_ascii());
        match cfg.validate() {
            Err(ConfigError::Invalid { field, .. }) => assert_eq!(field, "log"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let c = Config::default();
        assert_eq!(c.listen.to_string(), "0.0.0.0:9477");
        assert_eq!(c.sysfs_root, PathBuf::from("/sys"));
        assert_eq!(c.interval, Duration::from_secs(1));
        assert!(c.probe_safe && c.sources.rdma && c.sources.ethtool);
        c.validate().expect("defaults validate");
    }

    #[test]
    fn default_toml_round_trips() {
        let text = Config::default_toml();
        assert_eq!(Config::from_toml(&text).expect("parse"), Config::default());
    }

    #[test]
    fn file_values_and_overrides_apply_in_order() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("a.toml");
        std::fs::write(&p, "interval = \"250ms\"\nlisten = \"127.0.0.1:1\"\n[rails]\nmlx5_3 = 0\n").expect("write");
        let o = Overrides { listen: Some("127.0.0.1:2".parse().expect("addr")), ..Default::default() };
        let c = Config::load(Some(&p), &o).expect("load");
        assert_eq!(c.interval, Duration::from_millis(250));
        assert_eq!(c.listen.port(), 2);
        assert_eq!(c.rails.get("mlx5_3"), Some(&0));
    }

    #[test]
    fn log_format_is_text_or_json_from_the_file_or_an_override() {
        assert_eq!(Config::default().log_format, LogFormat::Text);
        assert_eq!(Config::from_toml("log_format = \"json\"").expect("parse").log_format, LogFormat::Json);
        assert!(Config::from_toml("log_format = \"xml\"").is_err());
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("a.toml");
        std::fs::write(&p, "log_format = \"json\"\n").expect("write");
        let o = Overrides { log_format: Some(LogFormat::Text), ..Default::default() };
        assert_eq!(Config::load(Some(&p), &o).expect("load").log_format, LogFormat::Text, "the flag wins");
        assert!(Config::default_toml().contains("log_format = \"text\""));
    }

    #[test]
    fn invalid_configs_are_typed_errors() {
        assert!(Config::from_toml("intervall = \"1s\"").is_err(), "unknown keys are refused");
        assert!(Config::from_toml("interval = \"fast\"").is_err());
        let c = Config { interval: Duration::from_millis(1), ..Config::default() };
        assert!(matches!(c.validate(), Err(ConfigError::Invalid { field: "interval", .. })));
        let c = Config { include: vec!["[".into()], ..Config::default() };
        assert!(matches!(c.validate(), Err(ConfigError::Pattern(_))));
        let c = Config { exclude: vec!["ok*".into(), "mlx5_[".into()], ..Config::default() };
        match c.validate() {
            Err(e @ ConfigError::Pattern(_)) => assert!(e.to_string().starts_with("invalid device pattern \"mlx5_[\""), "{e}"),
            other => panic!("{other:?}"),
        }
        let missing = Config::load(Some(Path::new("/nonexistent/stepwise.toml")), &Overrides::default());
        assert!(matches!(missing, Err(ConfigError::Read { .. })));
        let c = Config::from_toml("[sources]\npfc_priorities = [3, 8]\n").expect("parses");
        assert!(matches!(c.validate(), Err(ConfigError::Invalid { field: "sources.pfc_priorities", .. })));
        assert!(Config::from_toml("[sources]\npfc_priorities = [3]\n").expect("parses").validate().is_ok());
        for bad in ["0", "-0.5", "1.5", "nan"] {
            let c = Config::from_toml(&format!("[sources]\ntcp_cpu_budget = {bad}\n")).expect("parses");
            assert!(matches!(c.validate(), Err(ConfigError::Invalid { field: "sources.tcp_cpu_budget", .. })), "{bad}");
        }
        assert_eq!(Config::default().sources.tcp_cpu_budget, DEFAULT_TCP_CPU_BUDGET);
    }

    #[test]
    fn markers_over_tcp_needs_a_real_token_that_is_never_printed() {
        let c = Config::from_toml("[api]\nmarkers_over_tcp = true\n").expect("parse");
        assert!(matches!(c.validate(), Err(ConfigError::Invalid { field: "api.markers_over_tcp", .. })));
        let c = Config::from_toml("[api]\nmarkers_over_tcp = true\ntoken = \"short\"\n").expect("parse");
        let e = c.validate().expect_err("short token");
        assert!(!e.to_string().contains("short"), "the token is never echoed: {e}");
        let tok = "0123456789abcdef-tok";
        let c = Config::from_toml(&format!("[api]\nmarkers_over_tcp = true\ntoken = \"{tok}\"\n")).expect("parse");
        c.validate().expect("valid");
        assert!(c.api.markers_token().is_some_and(|t| t.matches(tok) && !t.matches("0123456789abcdef-tox") && !t.matches("")));
        assert!(!format!("{c:?}").contains(tok) && !toml::to_string(&c).expect("toml").contains(tok), "Debug and serialization redact it");
        assert_eq!(Config::default().api.markers_token(), None, "read-only by default");

        let dir = tempfile::tempdir().expect("tmp");
        let (cfg, tf) = (dir.path().join("a.toml"), dir.path().join("token"));
        std::fs::write(&tf, format!("{tok}\n")).expect("token");
        std::fs::write(&cfg, format!("[api]\nmarkers_over_tcp = true\ntoken_file = \"{}\"\n", tf.display())).expect("cfg");
        let c = Config::load(Some(&cfg), &Overrides::default()).expect("load");
        assert!(c.api.markers_token().is_some_and(|t| t.matches(tok)));
        std::fs::write(&cfg, format!("[api]\nmarkers_over_tcp = true\ntoken = \"{tok}\"\ntoken_file = \"{}\"\n", tf.display())).expect("cfg");
        assert!(matches!(Config::load(Some(&cfg), &Overrides::default()), Err(ConfigError::Invalid { field: "api.token", .. })));
        std::fs::write(&cfg, "[api]\nmarkers_over_tcp = true\ntoken_file = \"/nonexistent/token\"\n").expect("cfg");
        assert!(matches!(Config::load(Some(&cfg), &Overrides::default()), Err(ConfigError::Read { .. })));
    }

    #[test]
    fn nonsensical_sizes_are_refused() {
        for (text, field) in [
            ("[collectives]\nhistory = 18446744073709551615\n", "collectives.history"),
            ("[collectives]\nhistory = 0\n", "collectives.history"),
            ("[steps]\nhistory = 0\n", "steps.history"),
            ("[steps]\ncounter_samples = 3\n", "steps.counter_samples"),
            ("[store]\nmax_bytes = 0\n", "store.max_bytes"),
            ("[steps]\nmax_wait = \"100years\"\n", "steps.max_wait"),
            ("[collectives]\nsample_window = \"100years\"\n", "collectives.sample_window"),
            ("[collectives]\nsample_every = \"100years\"\n", "collectives.sample_every"),
        ] {
            let c = Config::from_toml(text).expect("parses");
            match c.validate() {
                Err(ConfigError::Invalid { field: f, .. }) => assert_eq!(f, field, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        let ok = Config::from_toml(
            "[collectives]\nhistory = 4194304\nsample_window = \"1day\"\n[steps]\nhistory = 1\nmax_wait = \"1h\"\n[store]\nmax_bytes = 1048576\n",
        )
        .expect("parses");
        ok.validate().expect("the bounds themselves are valid");
        Config::default().validate().expect("defaults are valid");
    }

    #[test]
    fn a_fifo_at_the_config_or_token_path_is_refused_without_blocking() {
        let dir = tempfile::tempdir().expect("tmp");
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
        // A blocking open would wait here for a writer that never comes.
        assert!(matches!(Config::load(Some(&fifo), &Overrides::default()), Err(ConfigError::Read { .. })));
        let cfg = dir.path().join("a.toml");
        std::fs::write(&cfg, format!("[api]\nmarkers_over_tcp = true\ntoken_file = \"{}\"\n", fifo.display())).expect("cfg");
        assert!(matches!(Config::load(Some(&cfg), &Overrides::default()), Err(ConfigError::Read { .. })));
        assert!(matches!(Config::load(Some(dir.path()), &Overrides::default()), Err(ConfigError::Read { .. })));
    }
}
