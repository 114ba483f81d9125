//! `agent check`: preflight. Tells whether this host can run the agent and what it would see:
//! kernel, BTF, capabilities, tracefs/bpffs, uprobes, the eBPF pipeline (a real load, attach
//! and RingBuf round trip), every NIC found and which counter groups are readable.
//! Exit status 1 with the reasons when the agent could not do its job.
//!
//! The human output is a table, each counter source's status below its line as indented
//! `key=value` lines; `--json` has the same checks with the source's sweep and status as
//! objects.

use std::{path::PathBuf, process::ExitCode};

use clap::Args;
use prometheus_client::registry::Registry;
use serde::Serialize;

use crate::{
    config::{Config, Overrides},
    sources::{self, Errors, Selector, SourceContext},
    topology,
};

#[derive(Debug, Args)]
#[command(after_help = "Exit status: 0 no check failed (warnings allowed); 1 at least one check failed \
(FAIL lines; --json: \"ok\": false) or the output cannot be written; 2 usage error.")]
pub struct CheckArgs {
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// Mount tracefs at /sys/kernel/tracing and bpffs at /sys/fs/bpf if they are not mounted.
    #[arg(long)]
    pub mount: bool,
    /// Config file (same as `agent run`).
    #[arg(long, env = "STEPWISE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Root of sysfs for NIC discovery [default: /sys].
    #[arg(long, env = "STEPWISE_SYSFS_ROOT")]
    pub sysfs_root: Option<PathBuf>,
}

/// Outcome of one check.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, Serialize)]
pub struct Item {
    pub name: String,
    pub status: Status,
    /// One line for a person.
    pub detail: String,
    /// A counter source's sweep and status (`source …` checks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<SourceCheck>,
}

/// What one real sweep of a counter source found.
#[derive(Debug, Serialize)]
pub struct SourceCheck {
    /// Devices, values read and skipped; `None` when the sweep failed (the detail says why).
    pub sweep: Option<sources::SweepReport>,
    /// The source's own status (as in `/api/v1/status`).
    pub status: serde_json::Value,
}

/// Linux capability numbers (include/uapi/linux/capability.h).
pub const CAP_DAC_READ_SEARCH: u32 = 2;
pub const CAP_SYS_PTRACE: u32 = 19;
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// Effective capability mask of this process (`CapEff` in /proc/self/status).
pub fn effective_caps() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("CapEff:"))?;
    u64::from_str_radix(line.trim_start_matches("CapEff:").trim(), 16).ok()
}

pub fn has_cap(mask: u64, cap: u32) -> bool {
    mask & (1u64 << cap) != 0
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_else(|_| "unknown".into())
}

fn mounted(path: &str, fstype: &str) -> bool {
    std::fs::read_to_string("/proc/self/mounts")
        .map(|m| {
            m.lines().any(|l| {
                let mut f = l.split_whitespace();
                let (_, mp, ty) = (f.next(), f.next(), f.next());
                mp == Some(path) && ty == Some(fstype)
            })
        })
        .unwrap_or(false)
}

fn try_mount(path: &str, fstype: &str) -> Result<(), String> {
    let st = std::process::Command::new("mount").args(["-t", fstype, "nodev", path]).status().map_err(|e| e.to_string())?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("mount -t {fstype} {path} failed: {st}"))
    }
}

/// Runs every check.
pub fn run_checks(args: &CheckArgs) -> Vec<Item> {
    let mut items = Vec::new();
    let mut push = |name: &str, status: Status, detail: String| items.push(Item { name: name.into(), status, detail, source: None });

    push("kernel", Status::Ok, kernel_release());
    let btf = std::path::Path::new("/sys/kernel/btf/vmlinux").exists();
    push(
        "btf",
        if btf { Status::Ok } else { Status::Warn },
        if btf { "/sys/kernel/btf/vmlinux present".into() } else { "no kernel BTF: CO-RE programs unavailable (uprobes still work)".into() },
    );

    match effective_caps() {
        Some(mask) => {
            let need = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")];
            let missing: Vec<&str> = need.iter().filter(|(c, _)| !has_cap(mask, *c) && !has_cap(mask, CAP_SYS_ADMIN)).map(|(_, n)| *n).collect();
            if missing.is_empty() {
                push("capabilities", Status::Ok, format!("CapEff={mask:016x}: CAP_BPF and CAP_PERFMON present"));
                if !has_cap(mask, CAP_SYS_ADMIN) {
                    push("capabilities.uprobes", Status::Warn, "no CAP_SYS_ADMIN: Linux 6.16+ and stable kernels with the CVE-2025-38466 fix let only CAP_SYS_ADMIN attach uprobes; the ebpf self-test below tells whether this kernel does".into());
                }
            } else {
                push("capabilities", Status::Fail, format!("missing {}: grant them (setcap, or the DaemonSet securityContext)", missing.join(", ")));
            }
            let extra: Vec<&str> = [(CAP_SYS_PTRACE, "CAP_SYS_PTRACE"), (CAP_DAC_READ_SEARCH, "CAP_DAC_READ_SEARCH")]
                .iter()
                .filter(|(c, _)| !has_cap(mask, *c))
                .map(|(_, n)| *n)
                .collect();
            if !extra.is_empty() {
                push(
                    "capabilities.containers",
                    Status::Warn,
                    format!("without {} the agent cannot read other containers' /proc/<pid>/root and maps", extra.join(", ")),
                );
            }
        }
        None => push("capabilities", Status::Warn, "cannot read /proc/self/status".into()),
    }

    for (path, fstype, what) in [("/sys/kernel/tracing", "tracefs", "tracefs"), ("/sys/fs/bpf", "bpf", "bpffs")] {
        let mut ok = mounted(path, fstype);
        let mut detail = if ok { format!("mounted at {path}") } else { format!("not mounted at {path}; `agent check --mount` mounts it") };
        if !ok && args.mount {
            match try_mount(path, fstype) {
                Ok(()) => {
                    ok = true;
                    detail = format!("mounted at {path} (by this check)");
                }
                Err(e) => detail = e,
            }
        }
        push(what, if ok { Status::Ok } else { Status::Warn }, detail);
    }

    let uprobe_pmu = std::path::Path::new("/sys/bus/event_source/devices/uprobe/type").exists();
    push(
        "uprobes",
        if uprobe_pmu { Status::Ok } else { Status::Fail },
        if uprobe_pmu { "uprobe PMU present".into() } else { "no uprobe PMU (CONFIG_UPROBE_EVENTS): collective probes cannot attach".into() },
    );

    match crate::ebpf::self_test(100) {
        Ok(t) if t.enter_events == t.calls && t.exit_events == t.calls && t.args_ok => push(
            "ebpf",
            Status::Ok,
            format!(
                "load + uprobe/uretprobe attach + RingBuf: {} calls → {} entry and {} return events, arguments decoded",
                t.calls, t.enter_events, t.exit_events
            ),
        ),
        Ok(t) => push(
            "ebpf",
            Status::Fail,
            format!("self-test lost events: {} calls → {} entry, {} return events (args ok: {})", t.calls, t.enter_events, t.exit_events, t.args_ok),
        ),
        Err(e) => push("ebpf", Status::Fail, e.to_string()),
    }

    match crate::ebpf::session_self_test(100) {
        Ok(t) if t.paired_entries == t.calls && t.paired_returns == t.calls && t.alone_entries == t.calls && t.alone_paired_events == 0 => push(
            "ebpf session",
            Status::Ok,
            format!(
                "uprobe session program: {} calls → {} entries and {} returns; marked entry-alone: {} entries, no return (one probe hit per asynchronous NCCL call)",
                t.calls, t.paired_entries, t.paired_returns, t.alone_entries
            ),
        ),
        Ok(t) => push("ebpf session", Status::Fail, format!("session self-test: {t:?}")),
        Err(e) => push("ebpf session", Status::Warn, format!("{e}: asynchronous NCCL calls get entry and return probes (two hits per call)")),
    }

    let overrides = Overrides { sysfs_root: args.sysfs_root.clone(), ..Default::default() };
    let cfg = match Config::load(args.config.as_deref(), &overrides) {
        Ok(c) => c,
        Err(e) => {
            push("config", Status::Fail, e.to_string());
            return items;
        }
    };
    let topo = topology::discover(&cfg.sysfs_root, &cfg.rails);
    if topo.nics.is_empty() {
        push("nics", Status::Warn, format!("no NIC found under {}", cfg.sysfs_root.display()));
    }
    for nic in &topo.nics {
        let name = match (&nic.ib_device, &nic.netdev) {
            (Some(d), Some(n)) => format!("nic {d}/{} ({n})", nic.port.unwrap_or(1)),
            (Some(d), None) => format!("nic {d}/{}", nic.port.unwrap_or(1)),
            (None, Some(n)) => format!("nic {n}"),
            (None, None) => "nic ?".into(),
        };
        let rate = nic.rate_bytes_per_second.map(|r| format!("{:.1} GB/s", r / 1e9)).unwrap_or_else(|| "rate unknown".into());
        push(
            &name,
            Status::Ok,
            format!(
                "rail {}, pci {}, numa {}, gpu {}, {}, {}",
                nic.rail,
                nic.pci.as_deref().unwrap_or("-"),
                nic.numa_node.map(|n| n.to_string()).unwrap_or("-".into()),
                nic.gpu.as_deref().unwrap_or("-"),
                nic.state.as_deref().unwrap_or("-"),
                rate
            ),
        );
    }

    let (ok, detail) = crate::sources::collectives::profiler::check(&cfg.collectives);
    push("nccl profiler plugin", if ok { Status::Ok } else { Status::Warn }, detail);
    match Selector::new(&cfg.include, &cfg.exclude, false) {
        Ok(selector) => items.extend(check_sources(&cfg, selector)),
        Err(e) => push("config", Status::Fail, e.to_string()),
    }
    items
}

/// Counter groups: one real sweep of every source, on a throwaway registry.
fn check_sources(cfg: &Config, selector: Selector) -> Vec<Item> {
    let mut registry = Registry::default();
    let errors = Errors::register(&mut registry);
    let ctx =
        SourceContext { sysfs_root: cfg.sysfs_root.clone(), selector, errors, interval: cfg.interval, rails: cfg.rails.clone(), owners: Default::default() };
    let mut items = Vec::new();
    for mut s in sources::build_sources(cfg, &ctx, &mut registry) {
        let (status, detail, sweep) = match s.sweep() {
            Ok(r) => {
                let status = if r.devices > 0 { Status::Ok } else { Status::Warn };
                (status, format!("{} devices, {} values read, {} skipped", r.devices, r.values, r.skipped), Some(r))
            }
            Err(e) => (Status::Warn, e.to_string(), None),
        };
        items.push(Item { name: format!("source {}", s.name()), status, detail, source: Some(SourceCheck { sweep, status: s.status() }) });
    }
    items
}

/// A JSON value as indented `key=value` lines for a person: an object's scalars (and lists of
/// scalars, comma-separated) on one line, nulls left out; a nested object of scalars as
/// `key: a=1 b=2`; each list of objects as one `- ` line per item, and deeper objects, below
/// their key and further indented.
pub fn describe(v: &serde_json::Value, indent: usize, out: &mut Vec<String>) {
    use serde_json::Value;
    fn scalar(v: &Value) -> Option<String> {
        match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            Value::Array(a) if a.is_empty() => Some("none".into()),
            Value::Array(a) => a.iter().map(scalar).collect::<Option<Vec<_>>>().filter(|_| !a.iter().any(Value::is_object)).map(|s| s.join(",")),
            Value::Null | Value::Object(_) => None,
        }
    }
    let pad = " ".repeat(indent);
    let Value::Object(m) = v else {
        out.extend(scalar(v).map(|s| format!("{pad}{s}")));
        return;
    };
    let line: Vec<String> = m.iter().filter_map(|(k, v)| Some(format!("{k}={}", scalar(v)?))).collect();
    if !line.is_empty() {
        out.push(format!("{pad}{}", line.join(" ")));
    }
    for (k, v) in m.iter().filter(|(_, v)| !v.is_null() && scalar(v).is_none()) {
        if let Value::Object(inner) = v {
            if inner.values().all(|x| x.is_null() || scalar(x).is_some()) {
                let mut one = Vec::new();
                describe(v, 0, &mut one);
                out.push(format!("{pad}{k}: {}", one.first().map_or("none", String::as_str)));
                continue;
            }
        }
        out.push(format!("{pad}{k}:"));
        match v {
            Value::Array(items) => {
                for item in items {
                    let start = out.len();
                    describe(item, indent + 4, out);
                    if let Some(first) = out.get_mut(start) {
                        first.replace_range(indent + 2..indent + 4, "- ");
                    }
                }
            }
            _ => describe(v, indent + 2, out),
        }
    }
}

/// The human report: one line per check (a source's status below it), then the verdict.
pub fn render_text(items: &[Item]) -> String {
    let w = items.iter().map(|i| i.name.chars().count()).max().unwrap_or(10);
    let mut out = String::new();
    for i in items {
        let s = match i.status {
            Status::Ok => "ok  ",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        };
        out.push_str(&format!("{s}  {:<w$}  {}\n", i.name, i.detail));
        if let Some(src) = &i.source {
            let mut lines = Vec::new();
            describe(&src.status, 8 + w, &mut lines);
            for l in lines {
                out.push_str(&l);
                out.push('\n');
            }
        }
    }
    let failed: Vec<&Item> = items.iter().filter(|i| i.status == Status::Fail).collect();
    if failed.is_empty() {
        out.push_str("\nthe agent can run on this host\n");
    } else {
        out.push_str("\nthe agent cannot do its job here:\n");
        for f in &failed {
            out.push_str(&format!("  - {}: {}\n", f.name, f.detail));
        }
    }
    out
}

pub fn main(args: CheckArgs) -> ExitCode {
    let items = run_checks(&args);
    let ok = items.iter().all(|i| i.status != Status::Fail);
    let code = if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE };
    if args.json {
        let doc = serde_json::json!({ "ok": ok, "checks": items });
        super::print_stdout(serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n", code)
    } else {
        super::print_stdout(render_text(&items), code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_reads_as_key_value_lines() {
        let status = serde_json::json!({
            "cap": 1024, "last_error": null, "names": ["a", "b"], "empty": [],
            "devices": [
                {"device": "mlx5_0", "ports": [{"port": 1, "groups": {"counters": {"read": 21, "skipped": 0}}}]},
                {"device": "mlx5_1", "ports": []}
            ]
        });
        let mut lines = Vec::new();
        describe(&status, 2, &mut lines);
        assert_eq!(
            lines,
            [
                "  cap=1024 empty=none names=a,b",
                "  devices:",
                "    - device=mlx5_0",
                "      ports:",
                "        - port=1",
                "          groups:",
                "            counters: read=21 skipped=0",
                "    - device=mlx5_1 ports=none",
            ]
        );
    }

    #[test]
    fn the_text_report_has_no_json_and_the_json_report_no_json_in_strings() {
        let sweep = sources::SweepReport { devices: 2, values: 10, skipped: 1 };
        let items = vec![
            Item { name: "kernel".into(), status: Status::Ok, detail: "6.8".into(), source: None },
            Item {
                name: "source qdisc".into(),
                status: Status::Ok,
                detail: "2 devices, 10 values read, 1 skipped".into(),
                source: Some(SourceCheck { sweep: Some(sweep), status: serde_json::json!({"qdiscs": [{"netdev": "eth0", "kind": "mq"}]}) }),
            },
            Item { name: "ebpf".into(), status: Status::Fail, detail: "no BTF".into(), source: None },
        ];
        let text = render_text(&items);
        assert!(!text.contains('{') && !text.contains('"'), "{text}");
        assert!(text.contains("ok    source qdisc  2 devices, 10 values read, 1 skipped\n"), "{text}");
        assert!(text.contains("\n                      - kind=mq netdev=eth0\n"), "{text}");
        assert!(text.ends_with("the agent cannot do its job here:\n  - ebpf: no BTF\n"), "{text}");
        let v = serde_json::to_value(&items).expect("json");
        assert_eq!(v[1]["source"]["sweep"]["skipped"], 1);
        assert_eq!(v[1]["source"]["status"]["qdiscs"][0]["kind"], "mq");
        assert!(v[0].get("source").is_none(), "{v}");
    }
}
