//! The PyTorch environment's first install (`stepwise_tests::torch::python_in`), into a
//! fresh cache directory: two callers at once (threads, each with its own descriptor on the
//! lock file, as two test processes have) — one installs, the other waits and finds it done;
//! the result imports torch with gloo and no `torch.partial` is left behind.
//!
//! Ignored by default: it downloads torch from PyPI again (about 2.8 GB, 5.3 GB on disk,
//! removed afterwards). `cargo test -p stepwise-tests --test torch_install -- --ignored`.

use std::{process::Command, time::Instant};

use stepwise_tests::torch;

#[test]
#[ignore = "downloads 2.8 GB from PyPI; run with --ignored"]
fn first_install_is_done_once_under_the_lock() {
    let cache = tempfile::Builder::new().prefix("stepwise-torch-install-").tempdir().expect("tmp");
    let t0 = Instant::now();
    let runs: Vec<(std::path::PathBuf, f64)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let py = torch::python_in(cache.path()).expect("install");
                    (py, t0.elapsed().as_secs_f64())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    println!("install: callers returned after {:.0} s and {:.0} s", runs[0].1, runs[1].1);
    assert_eq!(runs[0].0, runs[1].0);
    assert!(!cache.path().join("torch.partial").exists());
    let out = Command::new(&runs[0].0).args(["-W", "ignore", "-c", "import torch.distributed as d; print(d.is_gloo_available())"]).output().expect("python");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "True", "{}", String::from_utf8_lossy(&out.stderr));
    // Present: the next call is quick (one import check) and keeps the same environment.
    let t1 = Instant::now();
    assert_eq!(torch::python_in(cache.path()).expect("cached"), runs[0].0);
    println!("install: cached call {:.1} s", t1.elapsed().as_secs_f64());
    assert!(t1.elapsed().as_secs() < 30);
}
