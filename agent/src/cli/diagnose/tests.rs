//! Argument validation (exit 2 cases) and step selection.

use clap::Parser;

use super::*;
use crate::cli::{Cli, Command};

fn parse(args: &[&str]) -> Result<DiagnoseArgs, clap::Error> {
    let mut v = vec!["agent", "diagnose"];
    v.extend_from_slice(args);
    match Cli::try_parse_from(v)?.command {
        Command::Diagnose(a) => Ok(a),
        other => panic!("parsed as {other:?}"),
    }
}

/// Usage errors go to stderr, which `cli::main` turns into exit status 2.
fn usage_error(args: &[&str]) -> String {
    match parse(args) {
        Ok(a) => panic!("{args:?} accepted: {a:?}"),
        Err(e) => {
            assert!(e.use_stderr(), "{args:?}: {e}");
            e.to_string()
        }
    }
}

#[test]
fn conflicting_or_malformed_flags_are_usage_errors() {
    assert!(usage_error(&["--step", "3", "--slowest", "2"]).contains("cannot be used with"));
    assert!(usage_error(&["--json", "--html", "r.html"]).contains("cannot be used with"));
    assert!(usage_error(&["--peers", "a:1", "--dns", "agents"]).contains("cannot be used with"));
    assert!(usage_error(&["--peers", "a:1", "--db", "x.db"]).contains("cannot be used with"));
    assert!(usage_error(&["--agent", "a:1", "--db", "x.db"]).contains("cannot be used with"));
    assert!(usage_error(&["--since", "ten minutes"]).contains("examples"));
    assert!(usage_error(&["--timeout", "0s"]).contains("longer than 0"));
    assert!(usage_error(&["--timeout", "5"]).contains("--timeout"));
    assert!(usage_error(&["--slowest", "0"]).contains("at least 1"));
    assert!(usage_error(&["--slowest=-1"]).contains("--slowest"));
    assert!(usage_error(&["--step", "x"]).contains("--step"));
    assert!(usage_error(&["--threshold-ms=-1"]).contains("milliseconds"));
    assert!(usage_error(&["--threshold-ms", "NaN"]).contains("milliseconds"));
    assert!(usage_error(&["--bogus"]).contains("--bogus"));
    for with in [&["--step", "3"][..], &["--slowest", "2"], &["--since", "5m"], &["--db", "x.db"]] {
        let args: Vec<&str> = ["--hang"].into_iter().chain(with.iter().copied()).collect();
        assert!(usage_error(&args).contains("cannot be used with"), "--hang {with:?}");
    }
    let a = parse(&["--hang", "--peers", "a,b:1", "--json"]).expect("--hang with peers");
    assert!(a.hang && a.json && a.peers.len() == 2);
}

/// Issue 33: every numeric flag has an upper bound, with the bound in the message.
#[test]
fn numeric_flags_are_bounded() {
    assert!(usage_error(&["--slowest", "10001"]).contains("at most 10000"));
    assert!(usage_error(&["--slowest", "99999999999999999999999"]).contains("at most 10000"));
    assert_eq!(parse(&["--slowest", "10000"]).expect("the bound itself").slowest, Some(10_000));
    assert!(usage_error(&["--since", "400days"]).contains("at most"));
    assert_eq!(parse(&["--since", "30days"]).expect("a month").since, Some(Duration::from_secs(30 * 86_400)));
    assert!(usage_error(&["--timeout", "2h"]).contains("at most 1h"));
    assert!(usage_error(&["--threshold-ms", "1e300"]).contains("milliseconds from 0 to"));
}

#[test]
fn good_flags_parse_with_defaults() {
    let a = parse(&["--peers", "node-1:9477,node-2", "--slowest", "3", "--since", "2h", "--json"]).expect("valid");
    assert_eq!(a.peers, vec!["node-1:9477", "node-2"]);
    assert_eq!(a.timeout, Duration::from_secs(5));
    assert_eq!(a.threshold_ms, 1.0);
    let a = parse(&["--db", "/tmp/x.db", "--step", "7", "--timeout", "250ms", "--threshold-ms", "0.5"]).expect("valid");
    assert_eq!((a.step, a.timeout, a.threshold_ms), (Some(7), Duration::from_millis(250), 0.5));
}

#[test]
fn peers_are_normalised_to_host_port() {
    assert_eq!(parse_peer("node-7").as_deref(), Ok("node-7:9477"));
    assert_eq!(parse_peer("10.0.0.3:19477").as_deref(), Ok("10.0.0.3:19477"));
    assert_eq!(parse_peer("http://node-7:80/").as_deref(), Ok("node-7:80"));
    assert_eq!(parse_peer("[fd00::1]:9000").as_deref(), Ok("[fd00::1]:9000"));
    assert_eq!(parse_peer("fd00::1").as_deref(), Ok("[fd00::1]:9477"));
    assert_eq!(parse_peer("[fd00::1]").as_deref(), Ok("[fd00::1]:9477"));
    for bad in ["", "node:0", "node:99999", "node:x", ":9477", "a b", "node/x", "[fd00::1"] {
        assert!(parse_peer(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn bad_peer_exits_2_before_any_request() {
    let a = parse(&["--peers", "node:99999"]).expect("clap accepts the string");
    assert_eq!(main(a), ExitCode::from(EXIT_USAGE));
}

#[test]
fn selection_defaults_and_picking() {
    let now = 10_000.0;
    let s = Selection::from_args(&parse(&[]).expect("no flags"), now);
    assert_eq!((s.step, s.slowest, s.since), (None, Some(1), Some(now - 600.0)), "slowest step of the last 10 minutes");
    assert_eq!(s.since_phrase(), " in the last 10m");
    let s = Selection::from_args(&parse(&["--step", "4"]).expect("step"), now);
    assert_eq!((s.step, s.slowest, s.since), (Some(4), None, None), "a step id looks at all history");
    let s = Selection::from_args(&parse(&["--since", "1h"]).expect("since"), now);
    assert_eq!((s.slowest, s.since), (None, Some(now - 3600.0)), "a range alone lists every step in it");

    let items: Vec<(u64, f64)> = vec![(1, 0.2), (2, 0.5), (3, 0.3), (4, 0.9)];
    let slow = Selection { slowest: Some(2), ..Default::default() }.pick(items.clone(), |x| x.0, |x| x.1);
    assert_eq!(slow, vec![(4, 0.9), (2, 0.5)]);
    let one = Selection { step: Some(3), ..Default::default() }.pick(items.clone(), |x| x.0, |x| x.1);
    assert_eq!(one, vec![(3, 0.3)]);
    let many: Vec<(u64, f64)> = (0..(MAX_STEPS as u64 + 5)).map(|i| (i, 0.1)).collect();
    let all = Selection::default().pick(many, |x| x.0, |x| x.1);
    assert_eq!((all.len(), all.first().map(|x| x.0)), (MAX_STEPS, Some(5)), "the most recent kept");
}
