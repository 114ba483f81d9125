//! The RAS client against a fake service that speaks NCCL 2.30.7's protocol
//! (src/ras/client_support.cc) and writes its JSON report in rasDumpCommsToJSON's shape.

use std::{
    io::{BufRead, BufReader, Write},
    net::TcpListener,
    time::Duration,
};

use super::*;

/// A report of a 4-rank communicator: rank 3 missing and considered dead, rank 2 one
/// AllReduce behind (the indentation and field order of NCCL's jsonWrite* functions).
pub const DEAD_RANK_3: &str = r#"{
  "nccl_version": "2.30.7",
  "cuda_runtime_version": 13000,
  "cuda_driver_version": 13000,
  "timestamp": "2026-12-07 00:10:00",
  "communicators_count": 1,
  "communicators": [
    {
      "hash": "0xae94423cfbb2ef4a",
      "secondary_hash": "0xb7e7187447156001:0xb8242ed28a71381e",
      "size": 4,
      "ranks_count": 3,
      "missing_ranks_count": 1,
      "ranks": [
        {
          "rank": 0,
          "host": "10.0.0.1",
          "pid": 1001,
          "cuda_dev": 0,
          "nvml_dev": 0,
          "status": {
            "init_state": 0,
            "async_error": 0,
            "finalize_called": false,
            "destroy_flag": false,
            "abort_flag": false
          },
          "collective_counts": {
            "Broadcast": 0,
            "Reduce": 0,
            "AllGather": 0,
            "ReduceScatter": 0,
            "AllReduce": 12
          }
        },
        {
          "rank": 1,
          "host": "10.0.0.1",
          "pid": 1002,
          "cuda_dev": 1,
          "nvml_dev": 1,
          "status": {
            "init_state": 0,
            "async_error": 0,
            "finalize_called": false,
            "destroy_flag": false,
            "abort_flag": false
          },
          "collective_counts": {
            "Broadcast": 0,
            "Reduce": 0,
            "AllGather": 0,
            "ReduceScatter": 0,
            "AllReduce": 12
          }
        },
        {
          "rank": 2,
          "host": "10.0.0.2",
          "pid": 2001,
          "cuda_dev": 0,
          "nvml_dev": 0,
          "status": {
            "init_state": 0,
            "async_error": 0,
            "finalize_called": false,
            "destroy_flag": false,
            "abort_flag": false
          },
          "collective_counts": {
            "Broadcast": 0,
            "Reduce": 0,
            "AllGather": 0,
            "ReduceScatter": 0,
            "AllReduce": 11
          }
        }
      ],
      "missing_ranks": [
        {
          "rank": 3,
          "host": "10.0.0.2",
          "pid": 2002,
          "cuda_dev": 1,
          "nvml_dev": 1,
          "status": {
            "unresponsive": true,
            "considered_dead": true
          }
        }
      ]
    }
  ],
  "ras": {
    "collection_time_sec": 2.004,
    "timeouts_count": 1
  }
}
"#;

/// A 2-rank communicator (the hang tests' `00000000000000aa` has 2 ranks; pid = rank + 1):
/// rank 1 considered dead.
pub const DEAD_RANK_1_OF_2: &str = r#"{
  "nccl_version": "2.30.7",
  "cuda_runtime_version": 13000,
  "cuda_driver_version": 13000,
  "timestamp": "2026-12-07 00:10:00",
  "communicators_count": 1,
  "communicators": [
    {
      "hash": "0x5e1f00d5e1f00d5e",
      "secondary_hash": "0x1:0x2",
      "size": 2,
      "ranks_count": 1,
      "missing_ranks_count": 1,
      "ranks": [
        {
          "rank": 0,
          "host": "10.0.0.1",
          "pid": 1,
          "cuda_dev": 0,
          "nvml_dev": 0,
          "status": {
            "init_state": 0,
            "async_error": 0,
            "finalize_called": false,
            "destroy_flag": false,
            "abort_flag": false
          },
          "collective_counts": {
            "Broadcast": 0,
            "Reduce": 0,
            "AllGather": 0,
            "ReduceScatter": 0,
            "AllReduce": 4
          }
        }
      ],
      "missing_ranks": [
        {
          "rank": 1,
          "host": "10.0.0.2",
          "pid": 2,
          "cuda_dev": 0,
          "nvml_dev": 0,
          "status": {
            "unresponsive": true,
            "considered_dead": true
          }
        }
      ]
    }
  ],
  "ras": {
    "collection_time_sec": 5.002,
    "timeouts_count": 1
  }
}
"#;

/// Serves `n` connections as NCCL's service does; `json` false: an NCCL < 2.28.7 that does
/// not know SET FORMAT. Returns the address and the commands each connection sent.
pub fn fake_ras(report: &'static str, json: bool, n: usize) -> (String, std::thread::JoinHandle<Vec<Vec<String>>>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let h = std::thread::spawn(move || {
        let mut all = Vec::new();
        for _ in 0..n {
            let (mut s, _) = l.accept().expect("accept");
            let mut r = BufReader::new(s.try_clone().expect("clone"));
            let mut cmds = Vec::new();
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                let cmd = line.trim_end().to_string();
                cmds.push(cmd.clone());
                let lc = cmd.to_ascii_lowercase();
                let reply = if lc.starts_with("client protocol ") {
                    "SERVER PROTOCOL 2\n".to_string()
                } else if lc.starts_with("timeout ") || (json && lc == "set format json") {
                    "OK\n".to_string()
                } else if lc == "status" {
                    let _ = s.write_all(report.as_bytes());
                    break; // the service closes the connection after the report
                } else {
                    format!("ERROR: Unknown command {cmd}\n")
                };
                let _ = s.write_all(reply.as_bytes());
            }
            all.push(cmds);
        }
        all
    });
    (addr, h)
}

#[test]
fn the_report_names_the_dead_rank_and_the_one_behind() {
    let (addr, h) = fake_ras(DEAD_RANK_3, true, 1);
    let v = query(&addr, Duration::from_secs(2), 1.0);
    assert_eq!((v.state.as_str(), v.nccl_version.as_str(), v.communicators), ("answered", "2.30.7", 1), "{v:?}");
    let cmds = h.join().expect("server");
    assert_eq!(cmds[0], ["CLIENT PROTOCOL 2", "TIMEOUT 2", "SET FORMAT json", "STATUS"]);
    let dead = v.findings.iter().find(|f| f.kind == "dead").expect("dead");
    assert_eq!((dead.comm_hash.as_str(), dead.ranks.clone()), ("0xae94423cfbb2ef4a", vec![RasRank { rank: 3, host: "10.0.0.2".into(), pid: 2002 }]));
    let mm = v.findings.iter().find(|f| f.kind == "op_count_mismatch").expect("mismatch");
    assert_eq!(mm.ranks.iter().map(|r| r.rank).collect::<Vec<_>>(), [2]);
    assert!(mm.detail.contains("AllReduce") && mm.detail.contains("11") && mm.detail.contains("12"), "{}", mm.detail);
    assert!(!v.findings.iter().any(|f| f.kind == "unreachable"), "dead is not also unreachable: {v:?}");
}

#[test]
fn nothing_listening_is_absent_and_an_old_nccl_is_no_json() {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    drop(l);
    let v = query(&addr, Duration::from_millis(500), 1.0);
    assert_eq!(v.state, "absent");
    assert!(v.detail.contains("nothing answers"), "{}", v.detail);
    let (addr, h) = fake_ras(DEAD_RANK_3, false, 1);
    let v = query(&addr, Duration::from_secs(2), 1.0);
    assert_eq!((v.state.as_str(), v.detail.as_str(), v.findings.len()), ("no_json", "SERVER PROTOCOL 2", 0));
    h.join().expect("server");
}

#[test]
fn a_silent_listener_times_out_as_absent() {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let t = std::time::Instant::now();
    let v = query(&addr, Duration::from_millis(300), 1.0);
    assert_eq!(v.state, "absent", "{v:?}");
    assert!(t.elapsed() < Duration::from_secs(2), "bounded: {:?}", t.elapsed());
    drop(l);
}
