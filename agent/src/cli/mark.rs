//! `agent mark`: send one step marker, for shell scripts and manual tests. Training code
//! should send the same one-line JSON itself (README: "Step markers").

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{Args, ValueEnum};

use crate::timeline::{Marker, Phase};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum PhaseArg {
    Begin,
    End,
}

#[derive(Debug, Args)]
#[command(after_help = "Exit status: 0 the marker was sent (socket: the datagram was accepted; --agent: HTTP 2xx); \
1 it was not (no socket at the path, agent unreachable, HTTP error such as 403 without markers_over_tcp or 401 \
without the token: the message says which); 2 usage error.")]
pub struct MarkArgs {
    /// Rank that reached the marker.
    #[arg(long)]
    pub rank: u32,
    /// Step number.
    #[arg(long)]
    pub step: u64,
    /// begin or end of the step.
    #[arg(long, value_enum)]
    pub phase: PhaseArg,
    /// The agent's marker socket [default: /run/stepwise/markers.sock].
    #[arg(long, env = "STEPWISE_MARKER_SOCKET", conflicts_with = "agent")]
    pub socket: Option<PathBuf>,
    /// Send to an agent's HTTP API instead (host:port; POST /api/v1/markers, which the agent
    /// accepts only with [api] markers_over_tcp = true and its token).
    #[arg(long)]
    pub agent: Option<String>,
    /// Bearer token for --agent (the agent's [api] token). Prefer the environment variable:
    /// a flag is visible to every user in `ps`.
    #[arg(long, env = "STEPWISE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

pub fn main(a: MarkArgs) -> ExitCode {
    let m = Marker {
        rank: a.rank,
        step: a.step,
        phase: match a.phase {
            PhaseArg::Begin => Phase::Begin,
            PhaseArg::End => Phase::End,
        },
        time: Some(crate::engine::wall_now()),
        host: None,
    };
    let line = match serde_json::to_string(&m) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("agent mark: {e}");
            return ExitCode::FAILURE;
        }
    };
    let r = match &a.agent {
        Some(addr) => {
            let url = if addr.contains("://") { format!("{addr}/api/v1/markers") } else { format!("http://{addr}/api/v1/markers") };
            let agent = ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(5))).http_status_as_error(false).build().new_agent();
            let mut req = agent.post(&url).header("content-type", "application/json");
            if let Some(t) = &a.token {
                req = req.header("authorization", format!("Bearer {}", t.trim()));
            }
            match req.send(line.as_bytes()) {
                Ok(resp) if resp.status().is_success() => Ok(()),
                Ok(mut resp) => Err(format!("{url}: HTTP {}: {}", resp.status(), resp.body_mut().read_to_string().unwrap_or_default().trim())),
                Err(e) => Err(format!("{url}: {e}")),
            }
        }
        None => {
            let path = a.socket.clone().unwrap_or_else(|| crate::config::StepsConfig::default().marker_socket);
            std::os::unix::net::UnixDatagram::unbound()
                .and_then(|s| s.send_to(line.as_bytes(), &path))
                .map(drop)
                .map_err(|e| format!("cannot send to {}: {e} (is the agent running? --socket or --agent)", path.display()))
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agent mark: {e}");
            ExitCode::FAILURE
        }
    }
}
