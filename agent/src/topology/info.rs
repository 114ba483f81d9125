//! `stepwise_nic_info`: one series per NIC port with what joins it to the rest of the node —
//! its RDMA device and port, netdev, rail, PCI address, NUMA node, nearest GPU and link layer
//! (value 1). The link rate is a value, not a label: `stepwise_nic_rate_bytes_per_second{netdev}`
//! (the rate attribution uses) and, per RDMA port, `stepwise_nic_link_rate_bytes_per_second`
//! (issue 33: it was also this series' `rate_bytes_per_second` label). node_exporter's `node_infiniband_info` and DCGM's `pci_bus_id`/`gpu` labels join
//! on `device` and on `gpu` (the GPU's PCI address).

use crate::export::reference::RegisterSampled as _;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};

use super::Topology;

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NicInfoLabels {
    pub device: String,
    pub port: String,
    pub netdev: String,
    pub rail: String,
    pub pci: String,
    pub numa_node: String,
    pub gpu: String,
    pub link_layer: String,
}

/// The info family; [`NicInfo::update`] replaces its series with a topology's NICs.
#[derive(Clone, Default)]
pub struct NicInfo {
    family: Family<NicInfoLabels, Gauge>,
}

impl NicInfo {
    pub fn register(r: &mut Registry) -> NicInfo {
        let m = NicInfo::default();
        r.register_sampled(
            "stepwise_nic_info",
            "A NIC port: RDMA device and port, netdev, rail, PCI address, NUMA node, nearest GPU and link layer (1)",
            m.family.clone(),
        );
        m
    }

    pub fn update(&self, topo: &Topology) {
        self.family.clear();
        for n in &topo.nics {
            let s = |v: &Option<String>| v.clone().unwrap_or_default();
            let l = NicInfoLabels {
                device: s(&n.ib_device),
                port: n.port.map(|p| p.to_string()).unwrap_or_default(),
                netdev: s(&n.netdev),
                rail: n.rail.to_string(),
                pci: s(&n.pci),
                numa_node: n.numa_node.map(|v| v.to_string()).unwrap_or_default(),
                gpu: s(&n.gpu),
                link_layer: s(&n.link_layer),
            };
            self.family.get_or_create(&l).set(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_series_per_port_replaced_on_update() {
        let mut r = Registry::default();
        let info = NicInfo::register(&mut r);
        let d = tempfile::tempdir().expect("tmp");
        let topo = |n: usize| {
            let sys = d.path().join(format!("sys{n}"));
            stepwise_fixture(&sys, n);
            super::super::discover(&sys, &Default::default())
        };
        info.update(&topo(2));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).expect("encode");
        let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("stepwise_nic_info{")).collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines.iter().any(|l| l.contains("device=\"mlx5_1\"") && l.contains("port=\"1\"") && l.contains("rail=\"1\"")), "{lines:?}");
        // The rate is a value elsewhere (stepwise_nic_link_rate_bytes_per_second), not a label.
        assert!(lines.iter().all(|l| !l.contains("rate")), "{lines:?}");
        info.update(&topo(1));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).expect("encode");
        assert_eq!(text.lines().filter(|l| l.starts_with("stepwise_nic_info{")).count(), 1, "a vanished NIC's series is gone: {text}");
    }

    /// `n` RDMA devices `mlx5_i` with one port each, shaped like sysfs.
    fn stepwise_fixture(sys: &std::path::Path, n: usize) {
        for i in 0..n {
            let port = sys.join(format!("class/infiniband/mlx5_{i}/ports/1"));
            std::fs::create_dir_all(port.join("counters")).expect("dirs");
            std::fs::write(port.join("rate"), "400 Gb/sec (4X NDR)\n").expect("rate");
            std::fs::write(port.join("state"), "4: ACTIVE\n").expect("state");
            std::fs::write(port.join("link_layer"), "InfiniBand\n").expect("ll");
        }
    }
}
