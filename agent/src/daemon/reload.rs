//! SIGHUP reloads the config file (flags and `STEPWISE_*` variables still override it, as at
//! start): a file that does not load or validate is logged and counted
//! (`stepwise_config_reload_errors_total`) and the running configuration stays. A valid one
//! applies `log`, `[hang]` and `[steps]` (slow-step threshold, grace, history, NIC rates,
//! attribution parameters) at once; every other key — log_format, listen, sysfs_root,
//! interval, include/exclude, rails, `[sources]`, `[collectives]`, `[store]`, `[otlp]`,
//! `[steps] marker_socket` — needs a restart, and the log names the changed ones.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
};

use prometheus_client::metrics::counter::Counter;
use tracing::{error, info, warn};

use crate::{
    config::{Config, Overrides},
    engine::Engine,
};

/// Where the configuration came from, to load it again on SIGHUP.
pub struct Reload {
    pub path: Option<PathBuf>,
    pub overrides: Overrides,
}

/// Top-level config keys (and `steps.marker_socket`) that differ: what a reload cannot apply.
fn restart_keys(old: &Config, new: &Config) -> Vec<String> {
    let (a, b) = (serde_json::to_value(old).unwrap_or_default(), serde_json::to_value(new).unwrap_or_default());
    let mut keys: Vec<String> = match (a.as_object(), b.as_object()) {
        (Some(a), Some(b)) => {
            a.iter().filter(|(k, v)| !matches!(k.as_str(), "log" | "steps" | "hang") && b.get(k.as_str()) != Some(*v)).map(|(k, _)| k.clone()).collect()
        }
        _ => Vec::new(),
    };
    if old.steps.marker_socket != new.steps.marker_socket {
        keys.push("steps.marker_socket".into());
    }
    if keys.is_empty() && (Config { log: new.log.clone(), steps: new.steps.clone(), hang: new.hang.clone(), ..old.clone() }) != *new {
        keys.push("(a setting not shown, e.g. a secret)".into());
    }
    keys
}

/// SIGHUP's handler, installed when made (early in start-up: a SIGHUP before the reload task
/// runs is kept rather than killing the agent, which is SIGHUP's default action).
pub fn sighup() -> Option<tokio::signal::unix::Signal> {
    super::handler(tokio::signal::unix::SignalKind::hangup(), "SIGHUP", "config reload disabled")
}

/// Reloads the config file on every SIGHUP `hup` receives (see the module docs).
pub async fn reload_on_sighup(
    mut hup: tokio::signal::unix::Signal,
    reload: Reload,
    mut running: Config,
    engine: Arc<Mutex<Engine>>,
    reloads: Counter,
    errors: Counter,
) {
    while hup.recv().await.is_some() {
        let new = match Config::load(reload.path.as_deref(), &reload.overrides) {
            Ok(c) => c,
            Err(e) => {
                errors.inc();
                error!("config reload failed, the running configuration stays: {e}");
                continue;
            }
        };
        let applied = match engine.lock() {
            Ok(mut e) => e.set_steps_config(new.steps.clone()).map(|()| e.set_hang_config(new.hang.clone())),
            Err(p) => p.into_inner().set_steps_config(new.steps.clone()),
        };
        if let Err(e) = applied {
            errors.inc();
            error!("config reload failed, the running configuration stays: invalid [steps]: {e}");
            continue;
        }
        if new.log != running.log {
            if let Err(e) = super::logging::set_filter(&new.log) {
                warn!("cannot apply the new log filter: {e}");
            }
        }
        reloads.inc();
        let restart = restart_keys(&running, &new);
        if restart.is_empty() {
            info!("configuration reloaded (log, [steps] and [hang] applied)");
        } else {
            warn!("configuration reloaded (log, [steps] and [hang] applied); changed keys that need a restart: {}", restart.join(", "));
        }
        let marker_socket = running.steps.marker_socket.clone();
        running.log = new.log;
        running.steps = new.steps;
        running.hang = new.hang;
        running.steps.marker_socket = marker_socket;
    }
}
