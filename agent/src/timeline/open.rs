//! Progress of each communicator as one host sees it: which ranks are inside which call
//! since when, the last call each rank completed, and which ranks' processes exited and how.
//! The collective source fills it ([`crate::sources::collectives::progress`]), `/api/v1/open`
//! serves it, and [`crate::hang`] judges it — for one host in the daemon, for every host's
//! view joined in `agent diagnose --hang`. Plain data: no I/O.

use serde::{Deserialize, Serialize};

/// One host's view (the body of `/api/v1/open`, without the verdicts).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct HostProgress {
    pub host: String,
    /// Wall-clock seconds up to which every probe event is decoded: a call open at `as_of`
    /// has been inside for at least `as_of − since` (its return may not be decoded yet when
    /// the probe consumer lags, so open times are measured to here, never to "now").
    pub as_of: f64,
    pub comms: Vec<CommProgress>,
}

/// One communicator on one host.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CommProgress {
    /// The communicator's id (16 hex digits, as in `/api/v1/collectives`).
    pub comm: String,
    /// Whether every rank computes the same id (so views of several hosts join on it).
    pub global: bool,
    pub library: String,
    pub nranks: Option<u32>,
    /// Median duration of the communicator's recently completed calls on this host.
    pub median_seconds: Option<f64>,
    /// How many completed calls that median is over.
    pub samples: usize,
    pub ranks: Vec<RankProgress>,
}

/// One rank (one process) of a communicator.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RankProgress {
    pub rank: Option<u32>,
    pub pid: u32,
    pub host: String,
    /// The collective this rank is inside now (its entry decoded, no return yet).
    pub open: Option<OpenCall>,
    /// The last collective it completed.
    pub last_done: Option<DoneCall>,
    /// The collective it was inside when its process died.
    pub aborted: Option<OpenCall>,
    pub exited: Option<Exit>,
    /// What the process is doing (filled for live local processes by `/api/v1/open`).
    pub state: Option<ProcState>,
    /// Its calls are timed at the enqueue (asynchronous NCCL without the profiler plugin):
    /// they return before the work runs, so a collective stuck on its GPU is never open here.
    #[serde(default)]
    pub enqueue_only: bool,
}

/// A call entered and not returned.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct OpenCall {
    pub seq: u64,
    pub op: String,
    /// Payload bytes (count × element size), when the arguments say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    pub tid: u32,
    /// Wall-clock seconds of the entry.
    pub since: f64,
}

/// A call that returned.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct DoneCall {
    pub seq: u64,
    pub op: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// Wall-clock seconds of the return.
    pub exit: f64,
}

/// How and when a traced process ended.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Exit {
    /// Wall-clock seconds when the agent found it gone.
    pub at: f64,
    /// The signal that killed it, if one did.
    pub signal: Option<i32>,
    /// Its exit code, if it exited by itself.
    pub code: Option<i32>,
}

impl Exit {
    /// `signal 9 (SIGKILL)`, `exit code 1`, or `status unknown`.
    pub fn how(&self) -> String {
        match (self.signal, self.code) {
            (Some(s), _) => format!("signal {s} ({})", signal_name(s)),
            (None, Some(c)) => format!("exit code {c}"),
            (None, None) => "status unknown".to_string(),
        }
    }
}

/// The usual name of a Linux signal number.
pub fn signal_name(sig: i32) -> &'static str {
    const NAMES: [&str; 32] = [
        "?",
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    usize::try_from(sig).ok().and_then(|i| NAMES.get(i)).copied().unwrap_or("real-time signal")
}

/// A live process's scheduler state, from `/proc/<pid>/stat` and its threads' `wchan`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcState {
    /// The state letter and its meaning, e.g. `T (stopped)`, `S (sleeping)`.
    pub state: String,
    /// Whether the process is inside any probed call (of any communicator).
    pub in_probed_call: bool,
    /// Threads (at most [`MAX_THREADS`]), each with what the kernel says it waits in.
    pub threads: Vec<ThreadState>,
    /// Threads beyond those listed.
    pub more_threads: usize,
    /// Its Kubernetes pod as `namespace/name` (or the pod UID when the name is not readable),
    /// when it runs in one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
}

/// Threads listed per process at most.
pub const MAX_THREADS: usize = 64;

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ThreadState {
    pub tid: u32,
    pub name: String,
    pub state: String,
    /// The kernel function a blocked thread waits in (`/proc/<pid>/task/<tid>/wchan`;
    /// empty for a running thread or when the kernel hides it).
    pub wchan: String,
}

/// `T` → `T (stopped)`, as `ps` and proc(5) name the states.
pub fn state_label(letter: char) -> String {
    let name = match letter {
        'R' => "running",
        'S' => "sleeping",
        'D' => "disk sleep",
        'T' => "stopped",
        't' => "tracing stop",
        'Z' => "zombie",
        'X' => "dead",
        'I' => "idle",
        'P' => "parked",
        'W' => "waking",
        _ => "unknown",
    };
    format!("{letter} ({name})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exits_and_states_are_named() {
        assert_eq!(Exit { at: 1.0, signal: Some(9), code: None }.how(), "signal 9 (SIGKILL)");
        assert_eq!(Exit { at: 1.0, signal: None, code: Some(3) }.how(), "exit code 3");
        assert_eq!(Exit::default().how(), "status unknown");
        assert_eq!(signal_name(40), "real-time signal");
        assert_eq!(signal_name(-1), "real-time signal");
        assert_eq!(state_label('T'), "T (stopped)");
        assert_eq!(state_label('D'), "D (disk sleep)");
        assert_eq!(state_label('?'), "? (unknown)");
    }
}
