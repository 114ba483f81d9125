//! `cargo xtask bench models` (runs `cargo run --release -p agent --example bench_models`):
//! times the exact ECMP distribution for n = 1024 flows on m = 64 uplinks (docs/models.md §1.12)
//! the full `agent model scale --sweep` (§5), and `agent model allreduce --hosts 1024 --compare`
//! (§1.3–§1.6 on 8192 ranks: four algorithms and the break-even bisection; issue 33: over 30 s
//! and 4.3 GB before the rounds were grouped). All must stay well under 100 ms.
//!
//! Prints min and median over several repetitions and a last machine-readable line:
//! `bench models: ecmp_1024x64_ms=<median> scale_sweep_ms=<median> allreduce_1024_hosts_ms=<median> target_ms=100 ok=<bool>`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use stepwise::model::{collective, ecmp, scale};
use stepwise::units::Bytes;

/// `agent model allreduce --hosts 1024 --compare`: every algorithm and the break-even bisection.
fn allreduce_1024() -> Result<f64, stepwise::model::ModelError> {
    let c = collective::Cluster { hosts: 1024, ..collective::Cluster::hgx() };
    let m = Bytes::mib(192.0);
    let mut total = 0.0;
    for algo in collective::Algo::ALL {
        total += collective::allreduce(&c, m, algo)?.total.0;
    }
    Ok(total + collective::break_even_local(&c, m)?.map_or(0.0, |b| b.0))
}

const TARGET_MS: f64 = 100.0;

/// Runs `f` `reps` times; returns (min, median) in milliseconds.
fn time<T>(reps: usize, mut f: impl FnMut() -> T) -> (f64, f64) {
    let mut v: Vec<Duration> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            black_box(f());
            t.elapsed()
        })
        .collect();
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    (ms(v[0]), ms(v[v.len() / 2]))
}

fn main() -> std::process::ExitCode {
    // Warm-up, and the figures themselves (so a broken model shows here, not just a time).
    let r = match ecmp::ecmp(1024, 64) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bench models: ecmp failed: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let input = scale::ScaleInput::chapter();
    let rows = match scale::sweep(&input, &scale::SWEEP) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bench models: scale sweep failed: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };

    if let Err(e) = allreduce_1024() {
        eprintln!("bench models: allreduce at 1024 hosts failed: {e}");
        return std::process::ExitCode::FAILURE;
    }
    let (e_min, e_med) = time(15, || ecmp::ecmp(1024, 64));
    let (a_min, a_med) = time(15, allreduce_1024);
    let (s_min, s_med) = time(2000, || scale::sweep(&input, &scale::SWEEP));

    println!("ECMP exact distribution, n = 1024 flows on m = 64 uplinks (15 runs)");
    println!("  min {e_min:.3} ms, median {e_med:.3} ms");
    println!(
        "  E[L_max] = {:.4}, p99 = {}, relative group speed = {:.1} %, {} values of L_max computed",
        r.expected_max,
        r.p99,
        r.relative_speed * 100.0,
        r.distribution.len()
    );
    println!("scale --sweep over S = {:?} (2000 runs)", scale::SWEEP);
    println!("  min {s_min:.4} ms, median {s_med:.4} ms");
    for row in &rows {
        println!(
            "  S = {:>3}: T_grad {:.1} ms ({}), step {:.1} ms, {:.3} M tokens/s",
            row.supernode,
            row.t_grad.in_ms(),
            row.grad_algo,
            row.step.in_ms(),
            row.tokens_per_s / 1e6
        );
    }
    println!("allreduce, 1024 hosts × 8 GPUs, four algorithms + break-even (15 runs)");
    println!("  min {a_min:.3} ms, median {a_med:.3} ms");
    let ok = e_med < TARGET_MS && s_med < TARGET_MS && a_med < TARGET_MS;
    println!("bench models: ecmp_1024x64_ms={e_med:.3} scale_sweep_ms={s_med:.4} allreduce_1024_hosts_ms={a_med:.3} target_ms={TARGET_MS:.0} ok={ok}");
    if ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
