//! `agent diagnose --html` opened by a real browser: headless Chromium (Debian `chromium`,
//! installed by `cargo xtask setup`) loads the report written from a history store (8 ranks
//! on two hosts, rank 5 30 ms late, two NICs), with the network flags of the machine doc.
//!
//! - `--dump-dom` gives the DOM after the page's scripts ran: the page script marks
//!   `<body data-js="ok">` as its last statement and an error trap in `<head>` copies any
//!   uncaught error into `#js-errors`, so a script that failed anywhere shows up here;
//! - `--enable-logging=stderr --v=0` prints every console message and uncaught exception as
//!   an `INFO:CONSOLE` line: the page logs nothing, so any such line is a failure;
//! - `--screenshot` renders it: the PNG is decoded (zlib via miniz_oxide, PNG filters here)
//!   and must show the timeline's and breakdown's exact fill colours over a mostly white page.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
};

use stepwise::{
    attribution::{attribute, Params, StepData},
    store::Store,
    timeline::{Arrival, Collective, NicInfo, NicWindow, Step, StepSource},
};
use stepwise_tests::harness::{agent_bin, which};

const STEP: u64 = 42;

/// Writes steps 41 and 42 (rank 5 on node-b 30 ms late in 42) to a store, the way the
/// daemon does: attributed by the real attribution from collectives and NIC windows.
fn store(db: &Path) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    let mut st = Store::open(db).expect("store");
    for (id, late) in [(STEP - 1, 0.0), (STEP, 0.030)] {
        let t = now - 60.0 + id as f64;
        let arrivals = |at: f64, exit: f64, late: f64| -> Vec<Arrival> {
            (0..8)
                .map(|r| Arrival {
                    rank: r,
                    host: if r < 4 { "node-a" } else { "node-b" }.into(),
                    pid: 100 + r,
                    enter: t + at + if r == 5 { late } else { 0.0 },
                    exit: t + exit,
                    aborted: false,
                    clock: Default::default(),
                })
                .collect()
        };
        let colls = vec![
            Collective {
                comm: "8f3c2a1b00c0ffee".into(),
                seq: id * 2,
                op: "all_reduce".into(),
                library: "nccl".into(),
                bytes: Some(64 << 20),
                nranks: Some(8),
                arrivals: arrivals(0.100, 0.150 + late, late),
            },
            Collective {
                comm: "8f3c2a1b00c0ffee".into(),
                seq: id * 2 + 1,
                op: "all_reduce".into(),
                library: "nccl".into(),
                bytes: Some(4096),
                nranks: Some(8),
                arrivals: arrivals(0.160 + late, 0.165 + late, 0.0),
            },
        ];
        let nic = |name: &str, tx: f64| NicWindow {
            nic: NicInfo { name: name.into(), host: Some("node-a".into()), rail: None, rate_bytes_per_second: Some(12.5e9) },
            tx_bytes: tx,
            rx_bytes: tx,
            ..Default::default()
        };
        let windows = vec![vec![nic("eth0", 300e6), nic("eth1", 100e6)], vec![]];
        let step = Step { id, begin: t, end: t + 0.2 + late, source: StepSource::Markers, ranks: Default::default() };
        let refs: Vec<&Collective> = colls.iter().collect();
        let a =
            attribute(&StepData { step: &step, collectives: &refs, windows: &windows, net: &[], same_host: &[], dropped_events: false }, &Params::default());
        st.put_step("markers", &a, &colls, &windows[0]).expect("put_step");
    }
}

fn chromium() -> PathBuf {
    which("chromium").unwrap_or_else(|| panic!("chromium not installed: run `cargo xtask setup` (Debian package chromium)"))
}

/// Headless Chromium with the machine doc's flags and a fresh profile.
fn browse(profile: &Path, extra: &[&str], page: &Path) -> (String, String) {
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--enable-logging=stderr", "--v=0", "--hide-scrollbars"])
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("run chromium");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "chromium failed ({}):\n{stderr}", out.status);
    (stdout, stderr)
}

/// RGB(A) 8-bit PNG → (width, height, RGB pixels).
fn decode_png(png: &[u8]) -> (usize, usize, Vec<[u8; 3]>) {
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    let (mut pos, mut idat, mut ihdr) = (8, Vec::new(), None);
    while pos + 8 <= png.len() {
        let len = u32::from_be_bytes([png[pos], png[pos + 1], png[pos + 2], png[pos + 3]]) as usize;
        let kind = &png[pos + 4..pos + 8];
        let data = &png[pos + 8..pos + 8 + len];
        match kind {
            b"IHDR" => {
                ihdr = Some((
                    u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as usize,
                    u32::from_be_bytes([data[4], data[5], data[6], data[7]]) as usize,
                    data[8],
                    data[9],
                    data[12],
                ))
            }
            b"IDAT" => idat.extend_from_slice(data),
            b"IEND" => break,
            _ => {}
        }
        pos += 12 + len;
    }
    let (w, h, depth, colour, interlace) = ihdr.expect("IHDR");
    assert!(depth == 8 && (colour == 2 || colour == 6) && interlace == 0, "8-bit RGB/RGBA, not interlaced: depth {depth} colour {colour}");
    let bpp = if colour == 6 { 4 } else { 3 };
    let raw = miniz_oxide::inflate::decompress_to_vec_zlib(&idat).expect("inflate IDAT");
    let stride = w * bpp;
    assert_eq!(raw.len(), h * (stride + 1), "scanline bytes");
    let mut img = vec![0u8; h * stride];
    for y in 0..h {
        let f = raw[y * (stride + 1)];
        let line = &raw[y * (stride + 1) + 1..(y + 1) * (stride + 1)];
        for x in 0..stride {
            let a = if x >= bpp { img[y * stride + x - bpp] as i32 } else { 0 };
            let b = if y > 0 { img[(y - 1) * stride + x] as i32 } else { 0 };
            let c = if x >= bpp && y > 0 { img[(y - 1) * stride + x - bpp] as i32 } else { 0 };
            let pred = match f {
                0 => 0,
                1 => a,
                2 => b,
                3 => (a + b) / 2,
                4 => {
                    let p = a + b - c;
                    let (pa, pb, pc) = ((p - a).abs(), (p - b).abs(), (p - c).abs());
                    if pa <= pb && pa <= pc {
                        a
                    } else if pb <= pc {
                        b
                    } else {
                        c
                    }
                }
                _ => panic!("PNG filter {f}"),
            };
            img[y * stride + x] = (line[x] as i32 + pred) as u8;
        }
    }
    let px = img.chunks_exact(bpp).map(|p| [p[0], p[1], p[2]]).collect();
    (w, h, px)
}

fn rgb(hex: &str) -> [u8; 3] {
    let v = u32::from_str_radix(hex.trim_start_matches('#'), 16).expect("hex");
    [(v >> 16) as u8, (v >> 8) as u8, v as u8]
}

#[test]
fn chromium_renders_the_report_without_errors() {
    let dir = tempfile::Builder::new().prefix("stepwise-html-").tempdir().expect("tmp");
    let db = dir.path().join("agent.db");
    store(&db);
    let page = dir.path().join("report.html");
    let out = Command::new(agent_bin()).args(["diagnose", "--db"]).arg(&db).args(["--slowest", "2", "--html"]).arg(&page).output().expect("agent diagnose");
    assert!(out.status.success(), "diagnose: {}", String::from_utf8_lossy(&out.stderr));

    // The DOM after the scripts ran, and the browser's console.
    let (dom, log) = browse(&dir.path().join("profile-dom"), &["--dump-dom"], &page);
    let console: Vec<&str> = log.lines().filter(|l| l.contains(":CONSOLE")).collect();
    assert!(console.is_empty(), "console messages or uncaught errors:\n{}", console.join("\n"));
    assert!(dom.contains("<body data-js=\"ok\">"), "the page script ran to its end:\n{}", &dom[..dom.len().min(3000)]);
    assert!(
        dom.contains("<pre id=\"js-errors\" hidden=\"\"></pre>"),
        "no error trapped: {}",
        dom.split("js-errors").nth(1).unwrap_or("").chars().take(300).collect::<String>()
    );
    let sections: Vec<&str> = dom.split("<section class=\"step\"").skip(1).collect();
    assert_eq!(sections.len(), 2, "both steps, slowest first");
    let slow = sections[0];
    assert!(slow.contains(&format!("data-step=\"{STEP}\"")), "the slower step first");
    assert_eq!(slow.matches("class=\"rank-row\"").count(), 8, "one timeline row per rank");
    let ranks: BTreeSet<&str> = slow.split("class=\"rank-row\" data-rank=\"").skip(1).filter_map(|s| s.split('"').next()).collect();
    assert_eq!(ranks, (0..8).map(|r| r.to_string()).collect::<BTreeSet<_>>().iter().map(String::as_str).collect());
    assert_eq!(slow.matches("class=\"ready\"").count(), 16, "a ready mark per rank and collective");
    assert!(slow.contains("rank 5: data ready at 130.0 ms"), "rank 5's mark at its arrival");
    assert!(slow.contains("<svg class=\"breakdown\""), "stacked breakdown");
    assert!(slow.contains("<table class=\"causes\">"), "cause table");
    assert!(slow.contains("<tr class=\"problem\" data-cause=\"readiness_skew\""), "readiness skew listed as a problem");
    assert!(slow.contains("Top cause: readiness_skew"), "top cause first");
    assert_eq!(slow.matches("class=\"nic-bar\"").count(), 2, "per-NIC bytes");
    assert!(slow.contains("node-a/eth0") || slow.contains("eth0"), "NIC named");

    // The address can focus one phase (the same highlight a click on a cause row sets).
    let focused = format!("{}#focus=wait", page.display());
    let (dom, log) = browse(&dir.path().join("profile-focus"), &["--dump-dom"], Path::new(&focused));
    assert!(!log.contains(":CONSOLE"), "{log}");
    assert_eq!(dom.matches("data-focus=\"wait\"").count(), 2, "both timelines focus the waiting");

    // A screenshot: decoded, mostly white page with the figures' exact colours.
    let shot = dir.path().join("report.png");
    browse(&dir.path().join("profile-shot"), &[&format!("--screenshot={}", shot.display()), "--window-size=1200,1600"], &page);
    let png = std::fs::read(&shot).expect("screenshot written");
    let (w, h, px) = decode_png(&png);
    assert_eq!((w, h), (1200, 1600));
    let colours: BTreeSet<[u8; 3]> = px.iter().copied().collect();
    let white = px.iter().filter(|p| **p == [255, 255, 255]).count() as f64 / px.len() as f64;
    assert!(colours.len() >= 50, "a rendered page has text and figures: {} distinct colours", colours.len());
    assert!((0.3..0.97).contains(&white), "white fraction {white:.2}: neither blank nor unstyled");
    for (what, hex) in [("compute", "#9db4c0"), ("waiting / readiness skew", "#e07a5f"), ("communication", "#5c6b73"), ("update", "#cfe0c3")] {
        let n = px.iter().filter(|p| **p == rgb(hex)).count();
        assert!(n > 200, "{what} ({hex}) drawn: {n} pixels");
    }
    // Keep the picture for a human when asked.
    if let Some(keep) = std::env::var_os("STEPWISE_KEEP_SCREENSHOT") {
        let _ = std::fs::copy(&shot, keep);
    }
}
