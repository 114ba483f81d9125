//! Named fixtures (committed under `tests/fixtures/<name>/sys`) and named scenarios that
//! evolve them, played by `cargo xtask scenario`.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::{fsio::MARKER, nic::PmaTable, Nic, Scenario};

/// Fixture names, each written to `tests/fixtures/<name>/sys`.
pub const FIXTURES: [&str; 5] = ["dgx8", "wrap32", "restricted", "malformed", "dgx16"];

/// Playable scenarios: (name, base fixture, what it does).
pub const SCENARIOS: [(&str, &str, &str); 8] = [
    ("dgx8-idle", "dgx8", "8 NICs with a trickle of background traffic"),
    ("dgx8-traffic", "dgx8", "8 NICs, training-like: 40% of each second at 80% of line rate, then compute"),
    ("dgx16", "dgx16", "16 NICs with the dgx8-traffic pattern (for the counters benchmark)"),
    ("wrap32", "wrap32", "32-bit PMA counters saturate and mlx5 Q counters roll over at 2^32"),
    ("restricted", "restricted", "mlx5_3 is a restricted function whose counter reads fail; the others carry traffic"),
    ("pfc-storm", "dgx8", "traffic; every 2 s mlx5_3 is paused for 600 ms (port_xmit_wait up, throughput down)"),
    ("ecn-cnp-storm", "dgx8", "traffic with 5% of received packets ECN-marked: CNPs sent/handled, adaptive retransmissions"),
    ("vanish", "dgx8", "traffic; mlx5_5 vanishes at 30% of the run and comes back reset at 60%"),
];

/// Transmit-wait ticks per second of full stall. The tick unit is implementation-specific;
/// the writer assumes 4 ns ticks (a modelling choice, not a hardware fact).
pub const WAIT_TICKS_PER_SECOND: f64 = 250_000_000.0;

/// Realistic, deterministic "since boot" counts for a healthy port.
fn seed(n: &mut Nic) {
    let i = n.index as u64;
    let words = match n.table {
        PmaTable::Ext => 2_880_761_508_848 + i * 1_000_003_001,
        PmaTable::Bits32 => 1_000_000 + i * 1000,
    };
    let pkts = words * 4 / super::MTU_BYTES;
    n.set_pma("port_xmit_data", words)
        .set_pma("port_rcv_data", words - words / 7)
        .set_pma("port_xmit_packets", pkts)
        .set_pma("port_rcv_packets", pkts - pkts / 7)
        .set_pma("unicast_xmit_packets", pkts)
        .set_pma("unicast_rcv_packets", pkts - pkts / 7)
        .set_pma("multicast_xmit_packets", 12)
        .set_pma("multicast_rcv_packets", 40 + i)
        .set_pma("port_xmit_wait", 1_234_567 + i * 1000)
        .set_pma("link_downed", 1)
        .set_pma("port_xmit_discards", i % 3)
        .set_hw("rx_write_requests", 175_528_982 + i)
        .set_hw("rx_read_requests", 175_528_982 - i)
        .set_hw("duplicate_request", 41)
        .set_hw("local_ack_timeout_err", 131 + i)
        .set_hw("req_cqe_error", 3481)
        .set_hw("roce_adp_retrans", 99)
        .set_hw("out_of_sequence", 12 + i)
        .set_hw("np_ecn_marked_roce_packets", 5_000 + i)
        .set_hw("np_cnp_sent", 4_900 + i)
        .set_hw("rp_cnp_handled", 4_800 + i);
}

/// Builds a named fixture's initial state (nothing written yet).
pub fn fixture(name: &str, root: &Path) -> Option<Scenario> {
    let max32 = u64::from(u32::MAX);
    let s = match name {
        "dgx8" => Scenario::new(root).host_dgx(8).each_nic_owned(seed),
        "dgx16" => Scenario::new(root).host_dgx(16).each_nic_owned(seed),
        "wrap32" => {
            let mut s = Scenario::new(root).host_dgx(2);
            s.nic_mut(0).table = PmaTable::Bits32;
            s.each_nic(seed);
            for nic in [0, 1] {
                s.nic_mut(nic)
                    .set_hw("out_of_buffer", max32 - 10)
                    .set_hw("out_of_sequence", max32 - 20)
                    .set_hw("local_ack_timeout_err", max32 - 5)
                    .set_hw("rx_write_requests", max32 - 100);
            }
            // The 32-bit PMA table: data, packets and wait just below saturation.
            s.nic_mut(0)
                .set_pma("port_xmit_data", max32 - 1000)
                .set_pma("port_rcv_data", max32 - 2000)
                .set_pma("port_xmit_packets", max32 - 10)
                .set_pma("port_xmit_wait", max32 - 500);
            s
        }
        "restricted" => {
            let mut s = Scenario::new(root).host_dgx(4).each_nic_owned(seed);
            s.nic_mut(3).restrict();
            s
        }
        "malformed" => {
            let mut s = Scenario::new(root).host_dgx(2).each_nic_owned(seed);
            s.nic_mut(0)
                .not_available("counters/port_xmit_wait")
                .not_available("counters/port_rcv_errors")
                .no_newline("counters/port_xmit_data")
                .no_newline("hw_counters/np_cnp_sent")
                .no_newline("../../node_guid")
                .garbage("counters/symbol_error", "")
                .garbage("counters/port_rcv_packets", "-1\n")
                .garbage("hw_counters/out_of_sequence", "0x1f\n")
                .garbage("link_layer", "Ethernet\nEthernet\n");
            let names: Vec<String> = s.nics()[1].pma_files().map(|(n, _)| format!("counters/{n}")).collect();
            for n in names {
                s.nic_mut(1).no_newline(&n);
            }
            s.nic_mut(1).garbage("hw_counters/rp_cnp_handled", "12 34\n");
            s
        }
        _ => return None,
    };
    Some(s)
}

impl Scenario {
    /// `each_nic` for builder chains.
    fn each_nic_owned(mut self, f: impl FnMut(&mut Nic)) -> Self {
        self.each_nic(f);
        self
    }
}

/// Removes `root` if the writer made it (it has the marker); refuses any other non-empty dir.
fn clear_root(root: &Path) -> Result<()> {
    let nonempty = std::fs::read_dir(root).map(|mut d| d.next().is_some()).unwrap_or(false);
    if !nonempty {
        return Ok(());
    }
    if !root.join(MARKER).exists() {
        bail!("refusing to write into {}: it is not empty and was not written by the scenario writer (no {MARKER})", root.display());
    }
    std::fs::remove_dir_all(root).with_context(|| format!("cannot remove the old tree {}", root.display()))
}

/// Writes a named fixture to `root` (replacing an older copy written by this writer).
pub fn write_fixture(name: &str, root: &Path) -> Result<Scenario> {
    let mut s = fixture(name, root).with_context(|| format!("unknown fixture {name:?}; known: {}", FIXTURES.join(", ")))?;
    clear_root(root)?;
    s.write().with_context(|| format!("cannot write fixture {name} to {}", root.display()))?;
    Ok(s)
}

/// One step of a named scenario.
fn play_step(name: &str, s: &mut Scenario, dt: Duration, duration: Duration) -> std::io::Result<usize> {
    let t = s.elapsed().as_secs_f64();
    let frac = if duration.is_zero() { 0.0 } else { t / duration.as_secs_f64() };
    // Training-like traffic: communication during the first 40% of every second.
    let comm = (t % 1.0) < 0.4;
    let traffic = move |n: &mut Nic| {
        let r = n.line_rate();
        let (tx, rx) = if comm { (0.8 * r, 0.8 * r) } else { (0.002 * r, 0.002 * r) };
        n.tx_rate(tx).rx_rate(rx);
        let dt = n.dt().as_secs_f64();
        n.hw("rx_read_requests", (200.0 * dt) as u64);
    };
    match name {
        "dgx8-idle" => s.step(dt, |n| {
            n.tx_rate(1e6).rx_rate(1e6);
        }),
        "dgx8-traffic" | "dgx16" | "restricted" => s.step(dt, traffic),
        "wrap32" => s.step(dt, |n| {
            n.tx_rate(10e9).rx_rate(10e9).xmit_wait(100).out_of_buffer(3).out_of_sequence(5).retransmit("local_ack_timeout_err", 2);
            n.hw("rx_write_requests", 30);
        }),
        "pfc-storm" => {
            let storm = (t % 2.0) < 0.6;
            s.step(dt, |n| {
                if n.index == 3 && storm {
                    let r = n.line_rate();
                    let wait = (0.9 * WAIT_TICKS_PER_SECOND * n.dt().as_secs_f64()) as u64;
                    n.tx_rate(0.1 * r).rx_rate(0.8 * r).pfc_pause(wait);
                } else {
                    traffic(n);
                }
            })
        }
        "ecn-cnp-storm" => s.step(dt, |n| {
            traffic(n);
            let r = n.line_rate();
            let pkts = (0.8 * r * n.dt().as_secs_f64()) as u64 / super::MTU_BYTES;
            let marked = pkts / 20;
            n.ecn(marked).cnp_handled(marked - marked / 10).cnp_ignored(marked / 10);
            n.retransmit("roce_adp_retrans", marked / 1000).out_of_sequence(marked / 500);
        }),
        "vanish" => {
            let s5 = s.nic_mut(5);
            if (0.3..0.6).contains(&frac) && s5.is_present() {
                s5.vanish();
            } else if frac >= 0.6 && !s5.is_present() {
                s5.reappear().reset();
            }
            s.step(dt, traffic)
        }
        _ => Err(std::io::Error::other(format!("unknown scenario {name:?}"))),
    }
}

/// Parses `100ms`, `10s`, `2m`, `1.5s`, `500us`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num.parse().with_context(|| format!("bad duration {s:?} (use e.g. 100ms, 10s, 2m)"))?;
    let secs = match unit {
        "" | "s" => v,
        "ms" => v / 1e3,
        "us" => v / 1e6,
        "m" => v * 60.0,
        _ => bail!("bad duration unit in {s:?} (use us, ms, s or m)"),
    };
    if !secs.is_finite() || secs < 0.0 {
        bail!("bad duration {s:?}");
    }
    Ok(Duration::from_secs_f64(secs))
}

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

const USAGE: &str = "usage: cargo xtask scenario <name> --root DIR [--duration 10s] [--tick 100ms] [--no-sleep]
       cargo xtask scenario write-fixtures [--dir DIR]   (default: tests/fixtures)
       cargo xtask scenario list";

/// `cargo xtask scenario …` (the arguments after `scenario`).
pub fn run_cli(args: &[String]) -> Result<()> {
    let Some((cmd, rest)) = args.split_first() else {
        println!("{USAGE}");
        return Ok(());
    };
    let mut root: Option<PathBuf> = None;
    let mut duration = Duration::from_secs(10);
    let mut tick = Duration::from_millis(100);
    let mut sleep = true;
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().with_context(|| format!("{a} needs a value\n{USAGE}"));
        match a.as_str() {
            "--root" | "--dir" => root = Some(PathBuf::from(val()?)),
            "--duration" => duration = parse_duration(val()?)?,
            "--tick" => tick = parse_duration(val()?)?,
            "--no-sleep" => sleep = false,
            _ => bail!("unknown argument {a:?}\n{USAGE}"),
        }
    }
    match cmd.as_str() {
        "help" | "--help" | "-h" => println!("{USAGE}"),
        "list" => {
            println!("scenarios:");
            for (n, base, what) in SCENARIOS {
                println!("  {n:<14} (from fixture {base}) {what}");
            }
            println!("fixtures: {}", FIXTURES.join(", "));
        }
        "write-fixtures" => {
            let dir = root.unwrap_or_else(fixtures_dir);
            for name in FIXTURES {
                let r = dir.join(name).join("sys");
                let s = write_fixture(name, &r)?;
                println!("wrote {name}: {} NICs, {} GPUs -> {}", s.nics().len(), s.layout().gpus.len(), r.display());
            }
        }
        name => {
            let Some((_, base, _)) = SCENARIOS.iter().find(|(n, _, _)| *n == name) else {
                bail!("unknown scenario {name:?}; `cargo xtask scenario list` shows them");
            };
            let root = root.with_context(|| format!("--root DIR is required\n{USAGE}"))?;
            if tick.is_zero() {
                bail!("--tick must be positive");
            }
            let mut s = write_fixture(base, &root)?;
            println!("scenario {name}: {} NICs under {} (pass it as --sysfs-root); {:?} in {:?} ticks", s.nics().len(), root.display(), duration, tick);
            let start = Instant::now();
            let mut written = 0usize;
            while s.elapsed() + tick <= duration {
                written += play_step(name, &mut s, tick, duration).with_context(|| format!("cannot update {}", root.display()))?;
                if sleep {
                    let due = start + s.elapsed();
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                }
            }
            println!("scenario {name}: {} steps, {written} files rewritten, tree left at {}", s.steps(), root.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("100ms").expect("ms"), Duration::from_millis(100));
        assert_eq!(parse_duration("10s").expect("s"), Duration::from_secs(10));
        assert_eq!(parse_duration("2m").expect("m"), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5").expect("bare"), Duration::from_millis(1500));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("10h").is_err());
    }

    #[test]
    fn every_named_scenario_plays() {
        for (name, _, _) in SCENARIOS {
            let dir = tempfile::tempdir().expect("tempdir");
            let root = dir.path().join("sys");
            let args: Vec<String> =
                [name, "--root", root.to_str().expect("utf8"), "--duration", "1s", "--tick", "100ms", "--no-sleep"].iter().map(|s| s.to_string()).collect();
            run_cli(&args).unwrap_or_else(|e| panic!("{name}: {e:#}"));
            assert!(root.join("class/infiniband/mlx5_0/ports/1/counters/port_xmit_data").exists(), "{name}");
        }
    }

    #[test]
    fn cli_refuses_a_foreign_non_empty_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("precious"), "x").expect("write");
        let args: Vec<String> = ["dgx8-idle", "--root", dir.path().to_str().expect("utf8"), "--duration", "0s"].iter().map(|s| s.to_string()).collect();
        let e = run_cli(&args).expect_err("must refuse");
        assert!(e.to_string().contains("refusing"), "{e}");
        assert!(dir.path().join("precious").exists());
    }
}
