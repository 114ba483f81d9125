//! Rails and Clos fabrics (docs/models.md §1.10, §1.11).

use serde::Serialize;

use super::{at_least, non_negative, positive, ModelError};
use crate::units::{Bytes, BytesPerSecond, Seconds};

// ---------------------------------------------------------------------------------------
// §1.10 Rails: NIC i of every server sits on leaf i. A cross-server pair (i, j) stays on one
// rail iff i mod g == j mod g; otherwise its bytes go leaf → spine → other leaf.

/// Rank `i` of server A pairs with rank `(i + shift) mod g` of server B; 0 is rail-aligned.
pub fn shifted_pairing(gpus_per_host: usize, shift: usize) -> Vec<usize> {
    (0..gpus_per_host).map(|i| (i + shift) % gpus_per_host.max(1)).collect()
}

/// Bytes per cross-host pair per direction and rounds of the hierarchical cross-host stage
/// (§1.5): a ring over `hosts` on a shard `M/g`: `2(H−1)/H · M/g` in `2(H−1)` rounds.
pub fn hierarchical_pair_bytes(hosts: usize, gpus_per_host: usize, m: Bytes) -> Result<(Bytes, usize), ModelError> {
    at_least("hosts", hosts, 2)?;
    at_least("GPUs per host", gpus_per_host, 1)?;
    let h = hosts as f64;
    Ok((m / gpus_per_host as f64 * (2.0 * (h - 1.0) / h), 2 * (hosts - 1)))
}

#[derive(Clone, Debug, Serialize)]
pub struct RailsInput {
    pub gpus_per_host: usize,
    /// `pairing[i]` = local index on server B of the partner of rank `i` on server A.
    pub pairing: Vec<usize>,
    /// Per pair, per direction.
    pub bytes_per_pair: Bytes,
    pub rounds: usize,
    pub nic: BytesPerSecond,
    pub alpha: Seconds,
    /// Failed NICs on server A; their GPUs relay over NVLink to the surviving NICs evenly.
    pub failed: Vec<usize>,
}

#[derive(Clone, Debug, Serialize)]
pub struct RailRow {
    pub rail: usize,
    pub failed: bool,
    /// Bytes per direction through server A's NIC on this rail.
    pub a_nic_bytes: Bytes,
    /// Bytes per direction through server B's NIC on this rail.
    pub b_nic_bytes: Bytes,
}

#[derive(Clone, Debug, Serialize)]
pub struct RailsReport {
    pub rails: Vec<RailRow>,
    pub aligned_pairs: usize,
    /// Bytes per direction that leave their rail through the spine.
    pub spine_bytes: Bytes,
    pub max_nic_bytes: Bytes,
    /// `rounds · α + max NIC bytes / B_NIC`
    pub time: Seconds,
}

pub fn rails(input: &RailsInput) -> Result<RailsReport, ModelError> {
    let g = at_least("GPUs per host", input.gpus_per_host, 1)?;
    super::at_most("GPUs per host", g, super::collective::MAX_PER_HOST)?;
    non_negative("bytes per pair", input.bytes_per_pair.0)?;
    positive("NIC bandwidth", input.nic.0)?;
    non_negative("α", input.alpha.0)?;
    let mut seen = vec![false; g];
    for &j in &input.pairing {
        if j >= g || std::mem::replace(&mut seen[j], true) {
            return Err(ModelError::Inconsistent {
                what: "pairing",
                detail: format!("must pair every rank of server A with a distinct rank 0..{g} of server B"),
            });
        }
    }
    if input.pairing.len() != g {
        return Err(ModelError::Inconsistent { what: "pairing", detail: format!("has {} entries for {g} GPUs per host", input.pairing.len()) });
    }
    let mut failed = vec![false; g];
    for &f in &input.failed {
        if f >= g {
            return Err(ModelError::Inconsistent { what: "failed NIC", detail: format!("{f} is not a NIC of 0..{g}") });
        }
        failed[f] = true;
    }
    let survivors: Vec<usize> = (0..g).filter(|&i| !failed[i]).collect();
    if survivors.is_empty() {
        return Err(ModelError::Inconsistent { what: "failed NICs", detail: "every NIC of server A failed".into() });
    }
    let b = input.bytes_per_pair;
    let mut a = vec![Bytes(0.0); g];
    let mut bside = vec![Bytes(0.0); g];
    let mut spine = Bytes(0.0);
    let mut aligned_pairs = 0;
    for (i, &j) in input.pairing.iter().enumerate() {
        bside[j] += b;
        if i == j {
            aligned_pairs += 1;
        }
        if !failed[i] {
            a[i] += b;
            if i != j {
                spine += b;
            }
        } else {
            let share = b / survivors.len() as f64;
            for &s in &survivors {
                a[s] += share;
                if s != j {
                    spine += share;
                }
            }
        }
    }
    let max_nic_bytes = a.iter().chain(&bside).copied().fold(Bytes(0.0), Bytes::max);
    let time = input.alpha * input.rounds as f64 + max_nic_bytes / input.nic;
    let rails = (0..g).map(|r| RailRow { rail: r, failed: failed[r], a_nic_bytes: a[r], b_nic_bytes: bside[r] }).collect();
    Ok(RailsReport { rails, aligned_pairs, spine_bytes: spine, max_nic_bytes, time })
}

// ---------------------------------------------------------------------------------------
// §1.11 Clos fabrics of k-port switches.

#[derive(Clone, Debug, Serialize)]
pub struct ClosReport {
    pub ports: usize,
    pub tiers: usize,
    /// `r = d/u`
    pub oversubscription: f64,
    pub leaf_down: usize,
    pub leaf_up: usize,
    pub leaves: usize,
    /// Spines (2 tiers) or aggregation switches (3 tiers).
    pub middle: usize,
    /// Core switches (3 tiers only).
    pub core: usize,
    pub switches: usize,
    pub endpoints: usize,
    /// Half the leaf uplinks × port bandwidth (= half the endpoints when non-blocking).
    pub bisection: BytesPerSecond,
    /// Uplinks are no bottleneck iff the fraction of a NIC's bytes leaving its leaf is ≤ 1/r.
    pub max_leaving_fraction: f64,
    pub job: Option<JobCut>,
}

/// A job on whole leaves: its cut is all their uplinks.
#[derive(Clone, Debug, Serialize)]
pub struct JobCut {
    pub gpus: usize,
    pub leaves: usize,
    pub uplinks: usize,
    pub cut: BytesPerSecond,
}

/// Leaves of `k` ports split `d = k·r/(r+1)` down, `u = k/(r+1)` up. A 2-tier fabric has `k`
/// leaves (one port each on `u` spines); a 3-tier fat-tree has `k` pods of `k/2` leaves and
/// `u` aggregation switches, and `u·k/2` cores.
pub fn clos(k: usize, tiers: usize, r: f64, port: BytesPerSecond, job_gpus: Option<usize>) -> Result<ClosReport, ModelError> {
    at_least("switch ports", k, 2)?;
    positive("port bandwidth", port.0)?;
    positive("oversubscription", r)?;
    if tiers != 2 && tiers != 3 {
        return Err(ModelError::Inconsistent { what: "tiers", detail: format!("must be 2 or 3 (got {tiers})") });
    }
    if tiers == 3 && !k.is_multiple_of(2) {
        return Err(ModelError::Inconsistent { what: "switch ports", detail: "a 3-tier fat-tree needs an even k".into() });
    }
    let up = k as f64 / (r + 1.0);
    if (up - up.round()).abs() > 1e-9 || up.round() < 1.0 || up.round() as usize >= k {
        return Err(ModelError::Inconsistent {
            what: "oversubscription",
            detail: format!("k = {k} ports cannot be split down:up = {r}:1 (k/(r+1) must be a whole number of uplinks)"),
        });
    }
    let leaf_up = up.round() as usize;
    let leaf_down = k - leaf_up;
    let (leaves, middle, core) = if tiers == 2 { (k, leaf_up, 0) } else { (k * k / 2, k * leaf_up, leaf_up * k / 2) };
    let uplinks = leaves * leaf_up;
    let job = job_gpus
        .map(|n| {
            at_least("job GPUs", n, 1)?;
            let l = n.div_ceil(leaf_down);
            Ok::<_, ModelError>(JobCut { gpus: n, leaves: l, uplinks: l * leaf_up, cut: port * (l * leaf_up) as f64 })
        })
        .transpose()?;
    Ok(ClosReport {
        ports: k,
        tiers,
        oversubscription: leaf_down as f64 / leaf_up as f64,
        leaf_down,
        leaf_up,
        leaves,
        middle,
        core,
        switches: leaves + middle + core,
        endpoints: leaves * leaf_down,
        bisection: port * (uplinks as f64 / 2.0),
        max_leaving_fraction: leaf_up as f64 / leaf_down as f64,
        job,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testutil::{close, digit};

    fn hgx_rails(shift: usize, failed: Vec<usize>) -> RailsReport {
        let (b, rounds) = hierarchical_pair_bytes(2, 8, Bytes::mib(192.0)).unwrap();
        rails(&RailsInput {
            gpus_per_host: 8,
            pairing: shifted_pairing(8, shift),
            bytes_per_pair: b,
            rounds,
            nic: BytesPerSecond::gb_s(50.0),
            alpha: Seconds::us(0.833),
            failed,
        })
        .unwrap()
    }

    #[test]
    fn check_rails() {
        // §1.10 [check]: aligned pairing (i, i+8): 24 MiB per rail per direction, 0.505 ms;
        // all 192 MiB through one NIC 4.03 ms.
        let r = hgx_rails(0, vec![]);
        assert!(r.rails.iter().all(|x| x.a_nic_bytes == Bytes::mib(24.0)));
        assert_eq!(r.spine_bytes, Bytes(0.0));
        assert_eq!(r.aligned_pairs, 8);
        digit(r.time.in_ms(), 0.505, 0.001, "aligned");
        let one = hgx_rails(0, (1..8).collect());
        close(one.max_nic_bytes.in_mib(), 192.0, 1e-12, "one NIC left");
        digit(one.time.in_ms(), 4.03, 0.01, "one NIC");
        close(one.spine_bytes.in_mib(), 168.0, 1e-12, "relayed bytes leave their rail");
    }

    #[test]
    fn shifted_pairing_uses_the_spine() {
        let r = hgx_rails(1, vec![]);
        assert_eq!(r.aligned_pairs, 0);
        close(r.spine_bytes.in_mib(), 192.0, 1e-12, "all pairs cross rails");
        // One failed NIC: the 7 survivors share its 24 MiB.
        let f = hgx_rails(0, vec![3]);
        close(f.max_nic_bytes.in_mib(), 24.0 * 8.0 / 7.0, 1e-12, "redistribution");
        assert!(rails(&RailsInput { pairing: vec![0; 8], ..sample_input() }).is_err());
        assert!(rails(&RailsInput { failed: (0..8).collect(), ..sample_input() }).is_err());
    }

    fn sample_input() -> RailsInput {
        RailsInput {
            gpus_per_host: 8,
            pairing: shifted_pairing(8, 0),
            bytes_per_pair: Bytes::mib(24.0),
            rounds: 2,
            nic: BytesPerSecond::gb_s(50.0),
            alpha: Seconds(0.0),
            failed: vec![],
        }
    }

    #[test]
    fn check_clos() {
        // §1.11 [check]: k = 64: 2048 endpoints / 96 switches / 51.2 TB/s; 3-tier 65 536 /
        // 5120 / 1638.4 TB/s; r = 3 (48/16): 3072 endpoints / 80 switches / 25.6 TB/s.
        let port = BytesPerSecond::gb_s(50.0);
        let c = clos(64, 2, 1.0, port, None).unwrap();
        assert_eq!((c.endpoints, c.switches), (2048, 96));
        close(c.bisection.0, 51.2e12, 1e-12, "2-tier bisection");
        let c = clos(64, 3, 1.0, port, None).unwrap();
        assert_eq!((c.endpoints, c.switches), (65_536, 5120));
        close(c.bisection.0, 1638.4e12, 1e-12, "3-tier bisection");
        let c = clos(64, 2, 3.0, port, Some(96)).unwrap();
        assert_eq!((c.leaf_down, c.leaf_up), (48, 16));
        assert_eq!((c.endpoints, c.switches), (3072, 80));
        close(c.bisection.0, 25.6e12, 1e-12, "oversubscribed bisection");
        close(c.max_leaving_fraction, 1.0 / 3.0, 1e-12, "f ≤ 1/r");
        let job = c.job.unwrap();
        assert_eq!((job.leaves, job.uplinks), (2, 32));
        close(job.cut.0, 1.6e12, 1e-12, "job cut");
    }

    #[test]
    fn clos_rejects_impossible_splits() {
        let port = BytesPerSecond::gb_s(50.0);
        assert!(clos(64, 2, 2.0, port, None).is_err());
        assert!(clos(64, 4, 1.0, port, None).is_err());
        assert!(clos(64, 2, 1.0, BytesPerSecond(0.0), None).is_err());
    }
}
