//! Where things live in sysfs and what the static files say (docs/platform-facts.md §1 layout):
//! PCI functions under `devices/pci0000:XX/<root port>/<switch up>/<switch down>/<fn>`,
//! `bus/pci/devices/<addr>` links for every function, and class links for `infiniband` and
//! `net` pointing into the function's directory, as the kernel's device model makes them.

use std::collections::BTreeMap;

use super::{
    fsio::Entry,
    nic::{Fault, Nic, PmaTable},
};

/// A PCI function that is not a NIC (GPU, bridge).
#[derive(Clone, Debug)]
pub struct PciFn {
    pub addr: String,
    pub numa_node: i32,
    pub vendor: &'static str,
    pub device: &'static str,
    pub class: &'static str,
    /// Directory relative to the sysfs root (`devices/pci0000:00/…/<addr>`).
    pub dir: String,
}

/// Everything at fixed positions on the host.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    pub hostname: String,
    pub gpus: Vec<PciFn>,
    pub bridges: Vec<PciFn>,
    /// Per NIC (same order as the NICs): its PCI directory and PCI bus number.
    pub nic_dirs: Vec<String>,
}

fn addr(bus: u32, dev: u32) -> String {
    format!("0000:{bus:02x}:{dev:02x}.0")
}

/// A DGX-like host: 8 PCIe switches (4 per NUMA node / root complex), one NVIDIA GPU under
/// each, and `n_nics` ConnectX-7 functions spread over the switches in PCI order (so
/// `mlx5_<i>` numbering follows PCI order, as the driver's probe order does).
pub(crate) fn dgx(n_nics: usize, hostname: &str) -> (Layout, Vec<Nic>) {
    const SWITCHES: u32 = 8;
    let per_switch = (n_nics as u32).div_ceil(SWITCHES).max(1);
    let mut layout = Layout { hostname: hostname.to_string(), ..Layout::default() };
    let mut nics = Vec::new();
    for k in 0..SWITCHES {
        let numa = if k < SWITCHES / 2 { 0 } else { 1 };
        let r: u32 = if numa == 0 { 0x00 } else { 0x80 };
        let j = k % (SWITCHES / 2);
        let domain = format!("devices/pci0000:{r:02x}");
        let root_port = addr(r, 1 + j);
        let up_bus = r + 0x10 + 0x20 * j;
        let up = addr(up_bus, 0);
        let down_bus = up_bus + 1;
        let base = format!("{domain}/{root_port}/{up}");
        let bridge = |a: &str, dir: String, vendor, device| PciFn { addr: a.to_string(), numa_node: numa, vendor, device, class: "0x060400", dir };
        layout.bridges.push(bridge(&root_port, format!("{domain}/{root_port}"), "0x8086", "0x352a"));
        layout.bridges.push(bridge(&up, base.clone(), "0x1000", "0xc030"));
        let down_gpu = addr(down_bus, 0);
        layout.bridges.push(bridge(&down_gpu, format!("{base}/{down_gpu}"), "0x1000", "0xc030"));
        let gpu = addr(up_bus + 2, 0);
        layout.gpus.push(PciFn {
            addr: gpu.clone(),
            numa_node: numa,
            vendor: "0x10de",
            device: "0x2330",
            class: "0x030200",
            dir: format!("{base}/{down_gpu}/{gpu}"),
        });
        for s in 0..per_switch {
            let i = (k * per_switch + s) as usize;
            if i >= n_nics {
                break;
            }
            let down = addr(down_bus, 0x08 * (s + 1));
            layout.bridges.push(bridge(&down, format!("{base}/{down}"), "0x1000", "0xc030"));
            let bus = up_bus + 3 + s;
            let a = addr(bus, 0);
            layout.nic_dirs.push(format!("{base}/{down}/{a}"));
            nics.push(Nic::new(i, a, numa, bus as u8));
        }
    }
    (layout, nics)
}

/// Renders the whole tree for the current state.
pub(crate) fn render(layout: &Layout, nics: &[Nic]) -> BTreeMap<String, Entry> {
    let mut t = BTreeMap::new();
    let file = |t: &mut BTreeMap<String, Entry>, p: String, s: String| {
        t.insert(p, Entry::File(s));
    };
    for f in layout.bridges.iter().chain(&layout.gpus) {
        pci_function(&mut t, &f.dir, &f.addr, f.vendor, f.device, f.class, f.numa_node);
    }
    for (nic, dir) in nics.iter().zip(&layout.nic_dirs) {
        pci_function(&mut t, dir, &nic.pci, "0x15b3", "0x1021", "0x020000", nic.numa_node);
        // The netdev (it stays when the RDMA device vanishes).
        let nd = format!("{dir}/net/{}", nic.netdev);
        let up = nic.is_link_up();
        file(&mut t, format!("{nd}/address"), format!("{}\n", mac(nic)));
        file(&mut t, format!("{nd}/mtu"), "9000\n".into());
        file(&mut t, format!("{nd}/type"), "1\n".into());
        file(&mut t, format!("{nd}/ifindex"), format!("{}\n", nic.index + 2));
        file(&mut t, format!("{nd}/operstate"), if up { "up\n" } else { "down\n" }.into());
        file(&mut t, format!("{nd}/carrier"), if up { "1\n" } else { "0\n" }.into());
        file(&mut t, format!("{nd}/speed"), if up { format!("{}\n", nic.rate_gbps * 1000) } else { "-1\n".into() });
        t.insert(format!("{nd}/device"), Entry::Link(format!("../../../{}", nic.pci)));
        t.insert(format!("class/net/{}", nic.netdev), Entry::Link(format!("../../{nd}")));
        if nic.is_present() {
            ib_device(&mut t, layout, nic, dir);
        }
    }
    t.insert(super::fsio::MARKER.to_string(), Entry::File("written by the stepwise scenario writer (tests/src/scenario.rs)\n".into()));
    t
}

fn pci_function(t: &mut BTreeMap<String, Entry>, dir: &str, addr: &str, vendor: &str, device: &str, class: &str, numa: i32) {
    for (f, v) in [("vendor", vendor), ("device", device), ("class", class), ("numa_node", &numa.to_string())] {
        t.insert(format!("{dir}/{f}"), Entry::File(format!("{v}\n")));
    }
    t.insert(format!("bus/pci/devices/{addr}"), Entry::Link(format!("../../../{dir}")));
}

fn mac(nic: &Nic) -> String {
    format!("b8:3f:d2:a1:b2:{:02x}", nic.index)
}

fn guid(nic: &Nic) -> String {
    format!("b83f:d203:00a1:{:04x}", 0xb200 + nic.index)
}

/// Applies a fault (if any) to a file's normal content (which ends in a newline).
fn faulted(nic: &Nic, key: &str, normal: String) -> Entry {
    match nic.faults.get(key) {
        None => Entry::File(normal),
        Some(Fault::Content(s)) => Entry::File(s.clone()),
        Some(Fault::NotAvailable) => Entry::File("N/A (no PMA)\n".into()),
        Some(Fault::NoNewline) => Entry::File(normal.trim_end_matches('\n').to_string()),
        Some(Fault::Unreadable) => Entry::Link("restricted-function-EIO".into()),
    }
}

fn ib_device(t: &mut BTreeMap<String, Entry>, layout: &Layout, nic: &Nic, dir: &str) {
    let ib = format!("{dir}/infiniband/{}", nic.dev);
    let node = [
        ("node_type", "1: CA".to_string()),
        ("node_guid", guid(nic)),
        ("sys_image_guid", guid(nic)),
        ("fw_ver", "28.39.1002".to_string()),
        ("node_desc", format!("{} {}", layout.hostname, nic.dev)),
        ("board_id", "MT_0000000838".to_string()),
        ("hca_type", "MT4129".to_string()),
        ("hw_rev", "0x0".to_string()),
    ];
    for (f, v) in node {
        t.insert(format!("{ib}/{f}"), faulted(nic, &format!("../../{f}"), format!("{v}\n")));
    }
    t.insert(format!("{ib}/device"), Entry::Link(format!("../../../{}", nic.pci)));
    let p = format!("{ib}/ports/1");
    let up = nic.is_link_up();
    // Link-local GID: the EUI-64 of the MAC (U/L bit flipped), printed `%pI6` style.
    let gid = format!("fe80:0000:0000:0000:ba3f:d2ff:fea1:b2{:02x}", nic.index);
    let port_files = [
        ("state", if up { "4: ACTIVE" } else { "1: DOWN" }.to_string()),
        ("phys_state", if up { "5: LinkUp" } else { "3: Disabled" }.to_string()),
        ("rate", format!("{} Gb/sec ({})", nic.rate_gbps, nic.rate_name)),
        ("link_layer", "Ethernet".to_string()),
        ("lid", "0x0".to_string()),
        ("sm_lid", "0x0".to_string()),
        ("sm_sl", "0".to_string()),
        ("lid_mask_count", "0".to_string()),
        ("cap_mask", "0x04010000".to_string()),
        // RoCE: GID 0 is the RoCE v1 and GID 1 the RoCE v2 copy of the link-local address.
        ("gids/0", gid.clone()),
        ("gids/1", gid),
        ("gid_attrs/ndevs/0", nic.netdev.clone()),
        ("gid_attrs/ndevs/1", nic.netdev.clone()),
        ("gid_attrs/types/0", "IB/RoCE v1".to_string()),
        ("gid_attrs/types/1", "RoCE v2".to_string()),
        ("pkeys/0", "0xffff".to_string()),
    ];
    for (f, v) in port_files {
        t.insert(format!("{p}/{f}"), faulted(nic, f, format!("{v}\n")));
    }
    for (name, _) in nic.pma_files() {
        let key = format!("counters/{name}");
        t.insert(format!("{p}/{key}"), faulted(nic, &key, format!("{}\n", nic.pma_value(name))));
    }
    debug_assert!(nic.table == PmaTable::Ext || !nic.pma_files().any(|(n, _)| n.starts_with("unicast_")));
    t.insert(format!("{p}/hw_counters/lifespan"), faulted(nic, "hw_counters/lifespan", format!("{}\n", nic.lifespan_ms)));
    for (name, v) in &nic.hw {
        let key = format!("hw_counters/{name}");
        t.insert(format!("{p}/{key}"), faulted(nic, &key, format!("{v}\n")));
    }
    t.insert(format!("class/infiniband/{}", nic.dev), Entry::Link(format!("../../{ib}")));
}
