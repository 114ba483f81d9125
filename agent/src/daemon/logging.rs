//! The daemon's log on stderr: `log` filters it (replaced on SIGHUP), `log_format` shapes it.
//! Text is coloured only when stderr is a terminal (and `NO_COLOR` is unset): a DaemonSet's
//! or a journal's log gets no escape codes. JSON is one object per line (timestamp, level,
//! target, message and fields at the top level, spans) for log collectors.

use std::{io::IsTerminal, sync::OnceLock};

use tracing_subscriber::{fmt, layer::SubscriberExt, reload, util::SubscriberInitExt, EnvFilter, Registry};

use crate::config::LogFormat;

/// The installed log filter, replaced on SIGHUP.
static FILTER: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// The installed format.
static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// The filter for a `log` setting, `info` where it does not parse (start-up and reload see a
/// validated config; this is the last resort).
fn filter_or_info(directives: &str) -> EnvFilter {
    crate::config::log_filter(directives).unwrap_or_else(|_| EnvFilter::new("info"))
}

/// Colour only for a person at a terminal who has not asked for none (no-color.org).
fn colour() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Installs the log (once; a second call changes nothing).
pub fn init(filter: &str, format: LogFormat) {
    let (filter, handle) = reload::Layer::new(filter_or_info(filter));
    let logs = tracing_subscriber::registry().with(filter);
    let installed = match format {
        LogFormat::Text => logs.with(fmt::layer().with_writer(std::io::stderr).with_ansi(colour())).try_init(),
        LogFormat::Json => logs.with(fmt::layer().json().flatten_event(true).with_writer(std::io::stderr)).try_init(),
    };
    if installed.is_ok() {
        let _ = FILTER.set(handle);
        let _ = FORMAT.set(format);
    }
}

/// Applies a new `log` filter (SIGHUP).
pub fn set_filter(directives: &str) -> Result<(), reload::Error> {
    FILTER.get().map_or(Ok(()), |h| h.reload(filter_or_info(directives)))
}

/// Whether the log is JSON lines: then nothing else may go to stderr.
pub fn is_json() -> bool {
    FORMAT.get() == Some(&LogFormat::Json)
}
