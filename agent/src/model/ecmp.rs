//! ECMP hash collisions (docs/models.md §1.12): `n` equal flows hashed uniformly onto `m`
//! uplinks; `L_max` is the number of flows on the busiest uplink and
//! `P(L_max ≤ t) = n!/mⁿ · [xⁿ] (Σ_{i=0..t} xⁱ/i!)^m`, exactly.
//!
//! Numerics. The raw coefficients underflow f64 long before n = 1024 (m^n/n! ≈ 1e−790), and
//! the recurrence that powers a series in O(n·t) mixes signs and cancels. So the power is
//! taken by binary exponentiation on *scaled* coefficients
//! `c_b[s] = s!/bˢ · [xˢ] e_t(x)^b = P(s flows on b uplinks all have ≤ t)`, which lie in
//! [0, 1]. Multiplying the `a`-uplink and `b`-uplink factors is then a binomial mixture,
//! `c_{a+b}[s] = Σ_j Bin(s, a/(a+b))(j) · c_a[j] · c_b[s−j]`, a sum of non-negative terms
//! (no cancellation). Only the coefficients that can still reach `s = n` are kept
//! (`n − (m−b)t ≤ s ≤ bt`), and each binomial sum starts at its mode and stops once the
//! remaining weight cannot change the result in the 17th digit.

use serde::Serialize;

use super::{at_least, ModelError};

/// Most flows of the exact distribution: n = 1024 (the chapter's) takes under 100 ms
/// (`cargo xtask bench models`; at most 0.3 s on a debug build for any m from 1 to 65536), but
/// the cost jumps past ~1200 flows: n = 1500 took 8.8 s and n = 4096, m = 8 over 60 s (debug).
pub const MAX_FLOWS: usize = 1024;
/// Most uplinks.
pub const MAX_UPLINKS: usize = 1 << 16;
/// Most hashings a Monte-Carlo estimate does in all (trials × (flows + uplinks)).
pub const MAX_TRIAL_WORK: usize = 1 << 25;

/// xorshift64* (Vigna): a tiny deterministic generator for Monte-Carlo cross-checks.
pub fn xorshift(state: &mut u64) -> u64 {
    let mut x = if *state == 0 { 0x9e37_79b9_7f4a_7c15 } else { *state };
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    x.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// Uniform integer in `0..m` (multiply-high, no modulo bias worth the name).
fn below(state: &mut u64, m: usize) -> usize {
    ((xorshift(state) as u128 * m as u128) >> 64) as usize
}

/// Scaled coefficients of `e_t(x)^bins` for `s` in `lo..lo + c.len()`.
#[derive(Clone)]
struct Poly {
    bins: usize,
    lo: usize,
    c: Vec<f64>,
}

impl Poly {
    fn hi(&self) -> Option<usize> {
        (!self.c.is_empty()).then(|| self.lo + self.c.len() - 1)
    }
    fn at(&self, s: usize) -> f64 {
        s.checked_sub(self.lo).and_then(|i| self.c.get(i)).copied().unwrap_or(0.0)
    }
}

/// Precomputed tables for one `(n, m)`.
struct Tables {
    n: usize,
    m: usize,
    ln_fact: Vec<f64>,
    inv: Vec<f64>,
}

impl Tables {
    fn new(n: usize, m: usize) -> Tables {
        let mut ln_fact = vec![0.0; n + 1];
        let mut inv = vec![0.0; n + 2];
        for k in 1..=n + 1 {
            inv[k] = 1.0 / k as f64;
            if k <= n {
                ln_fact[k] = ln_fact[k - 1] + (k as f64).ln();
            }
        }
        Tables { n, m, ln_fact, inv }
    }

    /// Range of `s` a factor with `bins` uplinks must keep to reach `s = n` with cap `t`.
    fn range(&self, bins: usize, t: usize) -> (usize, usize) {
        let lo = self.n.saturating_sub((self.m - bins).saturating_mul(t));
        let hi = self.n.min(bins.saturating_mul(t));
        (lo, hi)
    }

    /// Coefficients of one uplink on `lo..=hi`: P(s flows all ≤ t) is 1 for s ≤ t.
    fn base(&self, lo: usize, hi: usize) -> Poly {
        let c = if lo <= hi { vec![1.0; hi - lo + 1] } else { Vec::new() };
        Poly { bins: 1, lo, c }
    }

    /// The `(a+b)`-uplink coefficients on `lo..=hi` from the `a`- and `b`-uplink factors.
    fn mul(&self, a: &Poly, b: &Poly, square: bool, lo: usize, hi: usize) -> Poly {
        let bins = a.bins + b.bins;
        let (Some(a_hi), Some(b_hi)) = (a.hi(), b.hi()) else {
            return Poly { bins, lo, c: Vec::new() };
        };
        if lo > hi {
            return Poly { bins, lo, c: Vec::new() };
        }
        let p = a.bins as f64 / bins as f64;
        let q = 1.0 - p;
        let (ln_p, ln_q, ratio) = (p.ln(), q.ln(), p / q);
        let lf = &self.ln_fact;
        let mut c = Vec::with_capacity(hi - lo + 1);
        for s in lo..=hi {
            // j flows on the `a` side, s − j on the `b` side.
            let jl = a.lo.max(s.saturating_sub(b_hi));
            let Some(jh) = s.checked_sub(b.lo).map(|x| x.min(a_hi)) else {
                c.push(0.0);
                continue;
            };
            if jl > jh {
                c.push(0.0);
                continue;
            }
            let j0 = (((s + 1) as f64 * p).floor() as usize).clamp(jl, jh);
            let w0 = (lf[s] - lf[j0] - lf[s - j0] + j0 as f64 * ln_p + (s - j0) as f64 * ln_q).exp();
            // Squaring: terms j and s − j are equal (p = ½, same factor on both sides), so sum
            // the upper half twice. j0 = ⌈s/2⌉ is then the mode; an odd s has no middle term.
            let (twice, first) = if square { (2.0, if s % 2 == 0 { 1.0 } else { 2.0 }) } else { (1.0, 1.0) };
            let mut sum = first * w0 * a.at(j0) * b.at(s - j0);
            // Away from the mode the weights only fall; c values are ≤ 1, so once the
            // weight times the terms left is below 1e−17 of the sum, stop.
            let mut w = w0;
            for j in j0 + 1..=jh {
                w *= (s - j + 1) as f64 * self.inv[j] * ratio;
                sum += twice * w * a.c[j - a.lo] * b.c[s - j - b.lo];
                if w * ((jh - j) as f64) <= sum * 1e-17 {
                    break;
                }
            }
            if square {
                c.push(sum);
                continue;
            }
            let mut w = w0;
            for j in (jl..j0).rev() {
                w *= (j + 1) as f64 * self.inv[s - j] / ratio;
                sum += w * a.c[j - a.lo] * b.c[s - j - b.lo];
                if w * ((j - jl) as f64) <= sum * 1e-17 {
                    break;
                }
            }
            c.push(sum);
        }
        Poly { bins, lo, c }
    }

    /// `P(L_max ≤ t)`.
    fn cdf(&self, plan: &Plan, t: usize) -> f64 {
        let n = self.n;
        if t >= n {
            return 1.0;
        }
        if t.saturating_mul(self.m) < n {
            return 0.0;
        }
        // Top-down: which coefficients each factor must supply. Besides the static bounds,
        // a binomial weight more than WINDOW standard deviations from its mean is below
        // e^−72 and the c values there are no larger than at the mean (the even split is the
        // likeliest), so those coefficients are never computed.
        const WINDOW: f64 = 12.0;
        let mut need: Vec<Option<(usize, usize)>> = vec![None; plan.nodes.len()];
        need[plan.root] = Some((n, n));
        for i in (0..plan.nodes.len()).rev() {
            let (Step::Mul(a, b), Some((cl, ch))) = (plan.nodes[i].0, need[i]) else { continue };
            let bins = plan.nodes[i].1;
            for (child, share) in [(a, plan.nodes[a].1), (b, plan.nodes[b].1)] {
                let p = share as f64 / bins as f64;
                let sd = |s: usize| WINDOW * (s as f64 * p * (1.0 - p)).sqrt() + 1.0;
                let lo = (cl as f64 * p - sd(cl)).floor().max(0.0) as usize;
                let hi = (ch as f64 * p + sd(ch)).ceil() as usize;
                let (slo, shi) = self.range(share, t);
                let (lo, hi) = (lo.max(slo), hi.min(shi));
                need[child] = Some(match need[child] {
                    None => (lo, hi),
                    Some((l, h)) => (l.min(lo), h.max(hi)),
                });
            }
        }
        let mut polys: Vec<Poly> = Vec::with_capacity(plan.nodes.len());
        for (i, &(step, bins)) in plan.nodes.iter().enumerate() {
            let (lo, hi) = need[i].unwrap_or((1, 0));
            let p = match step {
                Step::Base => {
                    let (slo, shi) = self.range(1, t);
                    self.base(lo.max(slo), hi.min(shi))
                }
                Step::Mul(a, b) => {
                    let (slo, shi) = self.range(bins, t);
                    self.mul(&polys[a], &polys[b], a == b, lo.max(slo), hi.min(shi))
                }
            };
            polys.push(p);
        }
        polys[plan.root].at(n).clamp(0.0, 1.0)
    }
}

#[derive(Clone, Copy)]
enum Step {
    /// One uplink.
    Base,
    /// The product of two earlier factors.
    Mul(usize, usize),
}

/// Binary exponentiation of the one-uplink series to the m-th power, as a list of products
/// (each `(step, uplinks)`; children come before parents).
struct Plan {
    nodes: Vec<(Step, usize)>,
    root: usize,
}

impl Plan {
    fn new(m: usize) -> Plan {
        let mut nodes = vec![(Step::Base, 1)];
        let mut base = 0;
        let mut acc: Option<usize> = None;
        let mut k = m;
        loop {
            if k & 1 == 1 {
                acc = Some(match acc {
                    None => base,
                    Some(r) => {
                        nodes.push((Step::Mul(r, base), nodes[r].1 + nodes[base].1));
                        nodes.len() - 1
                    }
                });
            }
            k >>= 1;
            if k == 0 {
                break;
            }
            nodes.push((Step::Mul(base, base), 2 * nodes[base].1));
            base = nodes.len() - 1;
        }
        Plan { nodes, root: acc.unwrap_or(0) }
    }
}

/// `P(L_max ≤ t)` for `n` flows on `m` uplinks (exact up to f64 rounding).
pub fn lmax_cdf(n: usize, m: usize, t: usize) -> Result<f64, ModelError> {
    at_least("flows", n, 1)?;
    at_least("uplinks", m, 1)?;
    Ok(Tables::new(n, m).cdf(&Plan::new(m), t))
}

/// One value of the busiest uplink's load.
#[derive(Clone, Debug, Serialize)]
pub struct LmaxPoint {
    pub flows: usize,
    /// `P(L_max = flows)`
    pub p: f64,
    /// `P(L_max ≤ flows)`
    pub cdf: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct EcmpReport {
    pub flows: usize,
    pub uplinks: usize,
    /// `⌈n/m⌉`: the busiest uplink with a perfect spread.
    pub ideal: usize,
    /// From `L_max = ⌈n/m⌉` until the remaining tail is below 1e−15.
    pub distribution: Vec<LmaxPoint>,
    pub expected_max: f64,
    pub p99: usize,
    /// `P(L_max ≤ 1)`: no two flows share an uplink (0 when n > m).
    pub p_no_collision: f64,
    /// `P(L_max = ⌈n/m⌉)`: the spread is as even as it can be.
    pub p_balanced: f64,
    /// `⌈n/m⌉ / E[L_max]`: group speed relative to no collision.
    pub relative_speed: f64,
}

/// The exact distribution of `L_max` and its summaries (§1.12).
pub fn ecmp(n: usize, m: usize) -> Result<EcmpReport, ModelError> {
    at_least("flows", n, 1)?;
    at_least("uplinks", m, 1)?;
    super::at_most("flows", n, MAX_FLOWS)?;
    super::at_most("uplinks", m, MAX_UPLINKS)?;
    let tables = Tables::new(n, m);
    let plan = Plan::new(m);
    let ideal = n.div_ceil(m);
    let mut distribution = Vec::new();
    let mut prev = 0.0;
    // E[L_max] = Σ_{t ≥ 0} P(L_max > t); every t below ⌈n/m⌉ contributes 1.
    let mut expected_max = ideal as f64;
    let mut p99 = None;
    for t in ideal..=n {
        let cdf = tables.cdf(&plan, t).max(prev);
        distribution.push(LmaxPoint { flows: t, p: cdf - prev, cdf });
        if p99.is_none() && cdf >= 0.99 - 1e-12 {
            p99 = Some(t);
        }
        prev = cdf;
        if 1.0 - cdf <= 1e-15 {
            break;
        }
        expected_max += 1.0 - cdf;
    }
    let p_no_collision = if n <= m { tables.cdf(&plan, 1) } else { 0.0 };
    let p_balanced = distribution.first().map_or(0.0, |p| p.cdf);
    Ok(EcmpReport {
        flows: n,
        uplinks: m,
        ideal,
        distribution,
        expected_max,
        p99: p99.unwrap_or(n),
        p_no_collision,
        p_balanced,
        relative_speed: ideal as f64 / expected_max,
    })
}

/// Monte-Carlo estimate of `P(L_max ≤ t)` for `t = 0..=n` from `trials` seeded throws.
pub fn monte_carlo_cdf(n: usize, m: usize, trials: usize, seed: u64) -> Result<Vec<f64>, ModelError> {
    at_least("flows", n, 1)?;
    at_least("uplinks", m, 1)?;
    at_least("trials", trials, 1)?;
    super::at_most("trials × (flows + uplinks)", trials.saturating_mul(n.saturating_add(m)), MAX_TRIAL_WORK)?;
    let mut state = seed;
    let mut hist = vec![0usize; n + 1];
    let mut load = vec![0usize; m];
    for _ in 0..trials {
        load.iter_mut().for_each(|l| *l = 0);
        for _ in 0..n {
            load[below(&mut state, m)] += 1;
        }
        hist[load.iter().copied().max().unwrap_or(0)] += 1;
    }
    let mut acc = 0usize;
    Ok(hist
        .into_iter()
        .map(|h| {
            acc += h;
            acc as f64 / trials as f64
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Enumerate all mⁿ assignments (tiny n, m only).
    fn brute_force(n: usize, m: usize) -> Vec<f64> {
        let total = m.pow(n as u32);
        let mut hist = vec![0usize; n + 1];
        for mut code in 0..total {
            let mut load = vec![0usize; m];
            for _ in 0..n {
                load[code % m] += 1;
                code /= m;
            }
            hist[*load.iter().max().unwrap()] += 1;
        }
        let mut acc = 0;
        hist.into_iter()
            .map(|h| {
                acc += h;
                acc as f64 / total as f64
            })
            .collect()
    }

    #[test]
    fn exact_matches_enumeration() {
        for (n, m) in [(1, 1), (3, 1), (1, 4), (5, 3), (6, 4), (7, 2), (4, 6), (8, 5)] {
            let bf = brute_force(n, m);
            for (t, want) in bf.iter().enumerate() {
                let got = lmax_cdf(n, m, t).unwrap();
                assert!((got - want).abs() < 1e-12, "n={n} m={m} t={t}: {got} vs {want}");
            }
        }
    }

    #[test]
    fn property_distribution_sums_to_one() {
        for (n, m) in [(16, 16), (8, 8), (100, 7), (1024, 64), (2, 1000)] {
            let r = ecmp(n, m).unwrap();
            let s: f64 = r.distribution.iter().map(|p| p.p).sum();
            assert!((s - 1.0).abs() < 1e-12, "n={n} m={m}: Σp = {s}");
            assert!(r.distribution.iter().all(|p| p.p >= 0.0 && p.cdf <= 1.0));
            assert!(r.expected_max >= r.ideal as f64 && r.expected_max <= n as f64);
            assert!(r.relative_speed > 0.0 && r.relative_speed <= 1.0);
        }
    }

    #[test]
    fn property_matches_monte_carlo() {
        let (n, m, trials) = (64, 16, 20_000);
        let exact = ecmp(n, m).unwrap();
        let mc = monte_carlo_cdf(n, m, trials, 42).unwrap();
        for p in &exact.distribution {
            // Binomial standard error of a frequency is ≤ 0.5/√trials ≈ 0.0035; allow 5σ.
            assert!((p.cdf - mc[p.flows]).abs() < 0.018, "t={}: exact {} vs MC {}", p.flows, p.cdf, mc[p.flows]);
        }
        let mc_mean: f64 = (0..n).map(|t| 1.0 - mc[t]).sum();
        assert!((mc_mean - exact.expected_max).abs() < 0.05, "E: exact {} vs MC {mc_mean}", exact.expected_max);
    }

    #[test]
    fn birthday_problem() {
        // n ≤ m: P(no collision) = m!/(m−n)!/mⁿ.
        let r = ecmp(8, 8).unwrap();
        let want: f64 = (0..8).map(|i| (8 - i) as f64 / 8.0).product();
        assert!((r.p_no_collision - want).abs() < 1e-14);
        let r = ecmp(4, 16).unwrap();
        let want: f64 = (0..4).map(|i| (16 - i) as f64 / 16.0).product();
        assert!((r.p_no_collision - want).abs() < 1e-14);
        assert_eq!(ecmp(1, 5).unwrap().expected_max, 1.0);
        assert_eq!(ecmp(7, 1).unwrap().expected_max, 7.0);
    }

    #[test]
    fn large_case_is_finite_and_plausible() {
        let r = ecmp(1024, 64).unwrap();
        assert!(r.expected_max > 20.0 && r.expected_max < 35.0, "E = {}", r.expected_max);
        assert!(r.p99 > r.ideal);
        assert!(r.distribution.iter().all(|p| p.cdf.is_finite()));
    }

    #[test]
    fn zero_flows_is_an_error() {
        assert_eq!(ecmp(0, 4).unwrap_err(), ModelError::TooFew { what: "flows", min: 1, got: 0 });
        assert!(ecmp(4, 0).is_err());
    }
}
