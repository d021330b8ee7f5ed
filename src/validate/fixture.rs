//! Builds sysfs/procfs/dev trees in a directory, shaped like what a pod of each platform
//! mode sees, for the tests of `validate` and `nccl-env`. Not used at run time.

use std::fs;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use super::sysfs::Tree;

/// One RDMA NIC with one port and its netdev.
#[derive(Debug, Clone)]
pub struct Nic {
    pub name: String,
    pub netdev: String,
    pub ipv4: Option<Ipv4Addr>,
    pub ipv6: Option<Ipv6Addr>,
    /// Extra IPv4 addresses (more qualifying GIDs on the same port).
    pub more_ipv4: Vec<Ipv4Addr>,
    /// Where the IPv4-mapped RoCE v2 GID sits; the others follow the usual layout.
    pub first_index: u32,
    pub rate: String,
    pub state: String,
    pub phys_state: String,
    pub link_layer: String,
    pub mtu: u32,
    pub carrier: bool,
    pub dev_id: bool,
    /// The netdev is a sub-interface (iflink differs from ifindex).
    pub sub_interface: bool,
    /// The netdev is in this namespace.
    pub netdev_present: bool,
    pub uverbs: bool,
    pub sys_image_guid: String,
    pub pci: String,
    pub numa: i32,
    pub vf: bool,
}

impl Nic {
    /// A healthy 200 Gb/s RoCE NIC with an IPv4 address, index `n` of the node.
    pub fn roce(n: u32) -> Nic {
        Nic {
            name: format!("mlx5_{n}"),
            netdev: format!("eth{}", n + 1),
            ipv4: Some(Ipv4Addr::new(10, 0, n as u8, 2)),
            ipv6: None,
            more_ipv4: Vec::new(),
            first_index: 3,
            rate: "200 Gb/sec (2X HDR)".into(),
            state: "4: ACTIVE".into(),
            phys_state: "5: LinkUp".into(),
            link_layer: "Ethernet".into(),
            mtu: 4200,
            carrier: true,
            dev_id: true,
            sub_interface: false,
            netdev_present: true,
            uverbs: true,
            sys_image_guid: format!("b8ce:f603:00{n:02x}:1234"),
            pci: format!("0000:{:02x}:00.0", 0x1a + n),
            numa: (n / 2) as i32,
            vf: false,
        }
    }
}

/// The process side of the tree.
#[derive(Debug, Clone)]
pub struct Process {
    pub cap_eff: u64,
    /// None = unlimited.
    pub memlock: Option<u64>,
    /// The /dev/shm mount's size option; None = not mounted.
    pub shm: Option<String>,
    pub netns_shared: Option<bool>,
    pub abi: Option<u32>,
    pub topology_file: bool,
    /// NUMA nodes of the GPUs given (`/dev/nvidiaN`).
    pub gpus: Vec<i32>,
}

impl Default for Process {
    fn default() -> Self {
        Process {
            // CAP_IPC_LOCK and CAP_SYS_RESOURCE among the default set.
            cap_eff: 0x00000000a80425fb | (1 << 14) | (1 << 24),
            memlock: Some(64 << 10),
            shm: Some("8388608k".into()),
            netns_shared: Some(true),
            abi: Some(1),
            topology_file: true,
            gpus: Vec::new(),
        }
    }
}

fn put(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
    fs::write(path, format!("{text}\n")).expect("write");
}

fn gid_text(a: Ipv6Addr) -> String {
    a.segments().iter().map(|s| format!("{s:04x}")).collect::<Vec<_>>().join(":")
}

/// Writes the tree under `root` (`sys/`, `proc/`, `dev/`, `topology/`) and returns it.
pub fn write(root: &Path, nics: &[Nic], p: &Process) -> Tree {
    let tree =
        Tree { sys: root.join("sys"), proc: root.join("proc"), dev: root.join("dev"), topology: root.join("topology") };
    fs::create_dir_all(tree.sys.join("class/infiniband")).expect("mkdir");
    fs::create_dir_all(&tree.dev).expect("mkdir");
    for (i, nic) in nics.iter().enumerate() {
        write_nic(&tree, nic, i as u32 + 2);
    }
    if let Some(abi) = p.abi {
        put(&tree.sys.join("class/infiniband_verbs/abi_version"), &abi.to_string());
    }
    if let Some(shared) = p.netns_shared {
        put(&tree.sys.join("module/ib_core/parameters/netns_mode"), if shared { "Y" } else { "N" });
    }
    let memlock = p.memlock.map_or("unlimited".to_string(), |b| b.to_string());
    put(
        &tree.proc.join("self/limits"),
        &format!(
            "Limit                     Soft Limit           Hard Limit           Units\n\
             Max open files            1048576              1048576              files\n\
             Max locked memory         {memlock:<20} {memlock:<20} bytes"
        ),
    );
    put(
        &tree.proc.join("self/status"),
        &format!("Name:\trdmabench\nCapInh:\t0000000000000000\nCapEff:\t{:016x}", p.cap_eff),
    );
    let mut mounts = String::from("overlay / overlay rw 0 0\nproc /proc proc rw 0 0");
    if let Some(size) = &p.shm {
        mounts.push_str(&format!("\nshm /dev/shm tmpfs rw,nosuid,nodev,size={size} 0 0"));
    }
    put(&tree.proc.join("self/mounts"), &mounts);
    if p.topology_file {
        put(&tree.topology.join("virtualTopology.xml"), "<system/>");
    }
    for (minor, numa) in p.gpus.iter().enumerate() {
        let pci = format!("0000:{:02x}:00.0", 0x80 + minor);
        put(&tree.dev.join(format!("nvidia{minor}")), "");
        put(
            &tree.proc.join("driver/nvidia/gpus").join(&pci).join("information"),
            &format!("Model:\tGPU\nDevice Minor:\t{minor}"),
        );
        put(&tree.sys.join("bus/pci/devices").join(&pci).join("numa_node"), &numa.to_string());
    }
    tree
}

fn write_nic(tree: &Tree, nic: &Nic, ifindex: u32) {
    let pci_dir = tree.sys.join("devices/pci0000:00").join(&nic.pci);
    fs::create_dir_all(&pci_dir).expect("mkdir");
    put(&pci_dir.join("numa_node"), &nic.numa.to_string());
    if nic.vf {
        fs::create_dir_all(pci_dir.join("physfn")).expect("mkdir");
    }
    let dev = tree.sys.join("class/infiniband").join(&nic.name);
    fs::create_dir_all(&dev).expect("mkdir");
    symlink(&pci_dir, &dev.join("device"));
    put(&dev.join("node_guid"), &nic.sys_image_guid);
    put(&dev.join("sys_image_guid"), &nic.sys_image_guid);
    let port = dev.join("ports/1");
    put(&port.join("state"), &nic.state);
    put(&port.join("phys_state"), &nic.phys_state);
    put(&port.join("link_layer"), &nic.link_layer);
    put(&port.join("rate"), &nic.rate);
    // The usual RoCE layout: link-local v1/v2 at 0/1, then v1/v2 pairs per address.
    let link_local: Ipv6Addr = format!("fe80::ba59:9fff:fe00:{ifindex:x}").parse().expect("valid");
    let mut entries: Vec<(u32, Ipv6Addr, &str)> = vec![(0, link_local, "IB/RoCE v1"), (1, link_local, "RoCE v2")];
    let mut next = nic.first_index.max(2) - 1;
    for v4 in nic.ipv4.iter().chain(nic.more_ipv4.iter()) {
        entries.push((next, v4.to_ipv6_mapped(), "IB/RoCE v1"));
        entries.push((next + 1, v4.to_ipv6_mapped(), "RoCE v2"));
        next += 2;
    }
    if let Some(v6) = nic.ipv6 {
        entries.push((next, v6, "IB/RoCE v1"));
        entries.push((next + 1, v6, "RoCE v2"));
        next += 2;
    }
    for i in 0..next.max(8) {
        let (addr, kind) =
            entries.iter().find(|e| e.0 == i).map_or((Ipv6Addr::UNSPECIFIED, None), |e| (e.1, Some(e.2)));
        put(&port.join("gids").join(i.to_string()), &gid_text(addr));
        if let Some(kind) = kind {
            put(&port.join("gid_attrs/types").join(i.to_string()), kind);
            put(&port.join("gid_attrs/ndevs").join(i.to_string()), &nic.netdev);
        }
    }
    if nic.uverbs {
        let u = format!("uverbs{}", ifindex - 2);
        put(&tree.sys.join("class/infiniband_verbs").join(&u).join("ibdev"), &nic.name);
        put(&tree.dev.join("infiniband").join(&u), "");
    }
    if nic.netdev_present {
        let net = tree.sys.join("class/net").join(&nic.netdev);
        put(&net.join("carrier"), if nic.carrier { "1" } else { "0" });
        put(&net.join("mtu"), &nic.mtu.to_string());
        put(&net.join("operstate"), if nic.carrier { "up" } else { "down" });
        put(&net.join("ifindex"), &ifindex.to_string());
        put(&net.join("iflink"), &(if nic.sub_interface { 1 } else { ifindex }).to_string());
        if nic.dev_id {
            put(&net.join("dev_id"), "0x0");
        }
    }
}

fn symlink(target: &Path, link: &PathBuf) {
    std::os::unix::fs::symlink(target, link).expect("symlink");
}
