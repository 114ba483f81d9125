//! A fast, independent reader of a network namespace's link counters: ground truth for the
//! bytes a link carried in a window of a few milliseconds, which `ip -s link` before and after
//! a job (its total) cannot give.
//!
//! A thread reads `/proc/<pid>/net/dev` of a placeholder process in each namespace every
//! `period` and stamps each read with `CLOCK_MONOTONIC` — the clock the test workloads
//! report their arrivals in — so a step's window from the workload's own lines cuts the
//! series where the step's bytes really went out.

use std::{
    collections::BTreeMap,
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context, Result};

/// CLOCK_MONOTONIC now, in µs (the workloads' `arrive_us` clock).
pub fn monotonic_us() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 * 1e6 + ts.tv_nsec as f64 * 1e-3
}

/// Per namespace, per device: (time µs, cumulative tx bytes).
type Series = Vec<BTreeMap<String, Vec<(f64, f64)>>>;

/// Polls the tx counters of some devices in some namespaces until dropped.
pub struct LinkPoller {
    holders: Vec<Child>,
    stop: Arc<AtomicBool>,
    data: Arc<Mutex<Series>>,
    thread: Option<JoinHandle<()>>,
}

/// The tx bytes of each of `devs` in one `/proc/net/dev` text.
fn parse(text: &str, devs: &[String]) -> Vec<(String, f64)> {
    text.lines()
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let name = name.trim();
            // Fields after the name: 8 receive counters, then transmit bytes.
            let tx = rest.split_whitespace().nth(8)?.parse::<f64>().ok()?;
            devs.iter().any(|d| d == name).then(|| (name.to_string(), tx))
        })
        .collect()
}

impl LinkPoller {
    /// Starts polling `devs` in each of the namespaces `netns` every `period`.
    pub fn start(netns: &[&str], devs: &[String], period: Duration) -> Result<LinkPoller> {
        let mut holders = Vec::new();
        for ns in netns {
            let child = Command::new("ip")
                .args(["netns", "exec", ns, "sleep", "3600"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .with_context(|| format!("placeholder in {ns}"))?;
            holders.push(child);
        }
        // `ip netns exec` execs `sleep` in the same process once it has entered the namespace.
        let paths: Vec<String> = holders.iter().map(|c| format!("/proc/{}/net/dev", c.id())).collect();
        let wait_until = std::time::Instant::now() + Duration::from_secs(5);
        for p in &paths {
            while std::fs::read_to_string(p).map(|t| parse(&t, devs).len() < devs.len()).unwrap_or(true) {
                anyhow::ensure!(std::time::Instant::now() < wait_until, "{p}: the devices {devs:?} did not appear");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let data: Arc<Mutex<Series>> = Arc::new(Mutex::new(vec![BTreeMap::new(); paths.len()]));
        let (s, d, devs) = (stop.clone(), data.clone(), devs.to_vec());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                for (k, p) in paths.iter().enumerate() {
                    let Ok(text) = std::fs::read_to_string(p) else { continue };
                    let t = monotonic_us();
                    let mut g = d.lock().expect("poller data");
                    for (dev, tx) in parse(&text, &devs) {
                        g[k].entry(dev).or_default().push((t, tx));
                    }
                }
                std::thread::sleep(period);
            }
        });
        Ok(LinkPoller { holders, stop, data, thread: Some(thread) })
    }

    /// Bytes `dev` of namespace `k` (in the order given) sent in `[t0, t1]` µs (linear between
    /// the reads around each end).
    pub fn tx_between(&self, k: usize, dev: &str, t0: f64, t1: f64) -> f64 {
        let g = self.data.lock().expect("poller data");
        let Some(v) = g.get(k).and_then(|m| m.get(dev)) else { return 0.0 };
        let at = |t: f64| {
            let i = v.partition_point(|p| p.0 <= t);
            match (i.checked_sub(1).map(|j| v[j]), v.get(i)) {
                (Some(a), Some(b)) if b.0 > a.0 => a.1 + (b.1 - a.1) * (t - a.0) / (b.0 - a.0),
                (Some(a), _) => a.1,
                (None, Some(b)) => b.1,
                (None, None) => 0.0,
            }
        };
        (at(t1) - at(t0)).max(0.0)
    }

    /// The time of the last read, µs.
    pub fn last_read_us(&self) -> f64 {
        let g = self.data.lock().expect("poller data");
        g.iter().flat_map(|m| m.values()).filter_map(|v| v.last().map(|p| p.0)).fold(0.0, f64::max)
    }
}

impl Drop for LinkPoller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for c in &mut self.holders {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_dev_transmit_bytes_are_the_ninth_field_after_the_name() {
        let text = "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    lo:     100       1    0    0    0     0          0         0      200       2    0    0    0     0       0          0\n rail0: 5000 10 0 0 0 0 0 0 464000 300 0 0 0 0 0 0\n";
        let got = parse(text, &["rail0".to_string()]);
        assert_eq!(got, vec![("rail0".to_string(), 464000.0)]);
        assert_eq!(parse(text, &["lo".to_string(), "rail9".to_string()]), vec![("lo".to_string(), 200.0)]);
    }
}
