use super::*;
use crate::model::testutil::{close, digit};

fn m() -> Bytes {
    Bytes::mib(192.0)
}

#[test]
fn check_ring_volume() {
    // §1.4 [check]: p = 16, M = 192 MiB: 360 MiB per rank, 5760 MiB total, 30 rounds.
    let v = ring_volume(16, m()).unwrap();
    assert_eq!(v.per_rank, Bytes::mib(360.0));
    assert_eq!(v.total, Bytes::mib(5760.0));
    assert_eq!(v.rounds, 30);
    let r = allreduce(&Cluster::hgx(), m(), Algo::Ring).unwrap();
    close(r.max_rank_bytes.in_mib(), 360.0, 1e-12, "per rank");
    close(r.total_bytes.in_mib(), 5760.0, 1e-12, "total");
}

#[test]
fn check_placements_on_hgx() {
    // §1.5 [check]: flat ≈ 7.6 ms, interleaved ≈ 7.6 ms, hierarchical ≈ 1.3 ms;
    // cross-server bytes 720 / 5760 / 384 MiB; −47 % bytes, −83 % time.
    let c = Cluster::hgx();
    let flat = allreduce(&c, m(), Algo::Ring).unwrap();
    let inter = allreduce(&c, m(), Algo::Interleaved).unwrap();
    let hier = allreduce(&c, m(), Algo::Hierarchical).unwrap();
    digit(flat.total.in_ms(), 7.6, 0.1, "flat");
    digit(inter.total.in_ms(), 7.6, 0.1, "interleaved");
    digit(hier.total.in_ms(), 1.3, 0.1, "hierarchical");
    assert_eq!(flat.rounds, 30);
    assert_eq!(hier.rounds, 16);
    close(flat.cross_host_bytes.in_mib(), 720.0, 1e-12, "flat cross");
    close(inter.cross_host_bytes.in_mib(), 5760.0, 1e-12, "interleaved cross");
    close(hier.cross_host_bytes.in_mib(), 384.0, 1e-12, "hierarchical cross");
    digit((1.0 - hier.cross_host_bytes / flat.cross_host_bytes) * 100.0, 47.0, 1.0, "bytes saved %");
    digit((1.0 - hier.total / flat.total) * 100.0, 83.0, 1.0, "time saved %");
    // The book's closed form: 14·24 MiB/450 GB/s + 2·12 MiB/50 GB/s + 16·α.
    let closed = Bytes::mib(24.0) * 14.0 / c.local + Bytes::mib(12.0) * 2.0 / c.nic + c.alpha * 16.0;
    close(hier.total.0, closed.0, 1e-12, "closed form");
    // Flat ring: one NIC per server carries 12 MiB per round.
    assert!(flat.round_groups[0].bottleneck.contains("nic7"), "{}", flat.round_groups[0].bottleneck);
    close(flat.round_groups[0].bottleneck_bytes.in_mib(), 12.0, 1e-12, "per-round NIC bytes");
}

#[test]
fn check_break_even_local_bandwidth() {
    // §1.5 [check]: break-even local bandwidth ≈ 50 GB/s (= one NIC).
    let b = break_even_local(&Cluster::hgx(), m()).unwrap().unwrap();
    close(b.in_gb_s(), 50.0, 0.01, "break-even");
}

#[test]
fn check_pcie_reference_flips() {
    // §1.5 [check]: on the PCIe box flat ≈ 11.0 ms and hierarchical is larger.
    let c = Cluster::pcie_reference();
    let flat = allreduce(&c, m(), Algo::Ring).unwrap();
    let hier = allreduce(&c, m(), Algo::Hierarchical).unwrap();
    digit(flat.total.in_ms(), 11.0, 0.1, "PCIe flat");
    assert!(hier.total.0 > flat.total.0, "hierarchical {} vs flat {}", hier.total, flat.total);
    let cross = hier.round_groups.iter().find(|r| r.phase.starts_with("cross")).unwrap();
    assert!(cross.bottleneck.contains("slot"), "{}", cross.bottleneck);
    // Hierarchy would need more local bandwidth than the box has.
    let b = break_even_local(&c, m()).unwrap().unwrap();
    assert!(b.0 > c.local.0);
}

#[test]
fn in_network_has_one_cross_round() {
    let c = Cluster::hgx();
    let r = allreduce(&c, m(), Algo::InNetwork).unwrap();
    assert_eq!(r.rounds, 15);
    close(r.max_nic_bytes.in_mib(), 24.0, 1e-12, "each NIC sends its shard once");
    // Across S servers the ring sends 2(S−1)/S shards per NIC: more than one for S > 2.
    let big = Cluster { hosts: 8, ..Cluster::hgx() };
    let ring = allreduce(&big, m(), Algo::Hierarchical).unwrap();
    let inn = allreduce(&big, m(), Algo::InNetwork).unwrap();
    close(ring.max_nic_bytes / inn.max_nic_bytes, 2.0 * 7.0 / 8.0, 1e-12, "shards per NIC");
}

#[test]
fn property_one_resource_rounds_equal_cut_bound() {
    // §1.3 vs §1.1: with α = 0 and one resource per round, Σ rounds = V / B.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..50 {
        let n = 1 + (crate::model::ecmp::xorshift(&mut seed) % 20) as usize;
        let b = BytesPerSecond(1e9 + (crate::model::ecmp::xorshift(&mut seed) % 1000) as f64 * 1e8);
        let res = [Resource { name: "cut".into(), bandwidth: b }];
        let rounds: Vec<Vec<Bytes>> = (0..n).map(|_| vec![Bytes((crate::model::ecmp::xorshift(&mut seed) % 1_000_000) as f64)]).collect();
        let total: Bytes = rounds.iter().map(|r| r[0]).sum();
        close(rounds_time(&res, &rounds, Seconds(0.0)).0, (total / b).0, 1e-12, "cut bound");
    }
    // The flat ring on a single host with α = 0 is pure NVLink: 2(p−1)/p·M / B_L.
    let c = Cluster { hosts: 1, alpha: Seconds(0.0), ..Cluster::hgx() };
    let r = allreduce(&c, m(), Algo::Ring).unwrap();
    close(r.total.0, (ring_volume(8, m()).unwrap().per_rank / c.local).0, 1e-12, "single host ring");
}

#[test]
fn bad_clusters_are_errors() {
    let c = Cluster { nic: BytesPerSecond(0.0), ..Cluster::hgx() };
    assert!(matches!(allreduce(&c, m(), Algo::Ring), Err(ModelError::NotPositive { .. })));
    let c = Cluster { hosts: 0, ..Cluster::hgx() };
    assert!(allreduce(&c, m(), Algo::Ring).is_err());
}
