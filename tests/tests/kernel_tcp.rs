//! The `tcp:tcp_retransmit_skb` tracepoint source on a real kernel: a TCP stream pushed
//! through a tiny TBF queue between two namespaces retransmits, and the source charges the
//! retransmissions to the sender's interface (and only to it).

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::Path,
    time::{Duration, Instant},
};

use prometheus_client::registry::Registry;
use stepwise::sources::{tcp::TcpSource, Errors, Selector, Source, SourceContext};
use stepwise_tests::netns::{Netns, Veth};

fn ctx(sysfs: &Path) -> SourceContext {
    SourceContext {
        sysfs_root: sysfs.to_path_buf(),
        selector: Selector::new(&[], &[], false).expect("selector"),
        errors: Errors::default(),
        interval: Duration::from_millis(100),
        rails: Default::default(),
        owners: Default::default(),
    }
}

#[test]
fn retransmits_through_a_dropping_queue_are_charged_to_the_sending_interface() {
    let a = Netns::new().expect("namespace a");
    let b = Netns::new().expect("namespace b");
    let v = Veth::new(&a, "swta0", &b, "swtb0").expect("veth");
    let ip_b = v.b_addr;
    // 2 Mbit/s with a 3 KiB queue: a bulk TCP sender overflows it and retransmits.
    a.tbf("swta0", "2mbit", "3kb", "3kb").expect("tbf");
    let listener = b.run(|_| TcpListener::bind((ip_b, 5301))).expect("listen in b");
    let reader = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let mut buf = vec![0u8; 65536];
        let mut n = 0usize;
        while let Ok(k) = s.read(&mut buf) {
            if k == 0 {
                break;
            }
            n += k;
        }
        n
    });
    let mut src = a.run(|sysfs| {
        let mut reg = Registry::default();
        TcpSource::new(ctx(sysfs), &mut reg)
    });
    a.run(|_| src.sweep()).expect("first sweep (the probe must load: root, eBPF, tracefs)");
    let sent = a.run(|_| {
        let mut s = TcpStream::connect((ip_b, 5301)).expect("connect a → b");
        s.set_write_timeout(Some(Duration::from_secs(20))).expect("timeout");
        let chunk = vec![7u8; 65536];
        let end = Instant::now() + Duration::from_secs(3);
        let mut n = 0usize;
        while Instant::now() < end {
            match s.write(&chunk) {
                Ok(k) => n += k,
                Err(_) => break,
            }
        }
        n
    });
    // Let the stream drain and the retransmissions complete.
    let received = reader.join().expect("reader");
    assert!(received > 0 && received <= sent);
    a.run(|_| src.sweep()).expect("sweep");
    let st = src.status();
    let per_if = &st["retransmits"];
    let on_a = per_if["swta0"].as_u64().unwrap_or(0);
    assert!(on_a > 0, "a dropping TBF queue must cause retransmissions charged to swta0: {st}");
    // Never the receiver. (Loopback addresses exist in every namespace and the tracepoint is
    // global, so `lo` may carry other processes' loopback retransmissions: not asserted.)
    assert!(per_if.get("swtb0").is_none(), "only the sender's interface: {st}");
    let samples = src.nic_samples();
    let s = samples.iter().find(|(i, _)| i.name == "swta0").expect("nic sample for swta0");
    assert_eq!(s.1.retransmits as u64, on_a);
    drop(v);
}
