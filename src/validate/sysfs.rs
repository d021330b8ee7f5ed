//! The RDMA view of a process, read from the sysfs, procfs and /dev trees: devices,
//! ports, GIDs with their netdevs, the char devices that make a device usable, limits
//! and capabilities. `validate` and `nccl-env` decide only from this, so tests point it
//! at fixture trees. Read-only; an unreadable entry is absent, never an error (in shared
//! modes a pod sees GIDs of other containers that fail with EINVAL).

use std::collections::BTreeMap;
use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};

/// The roots a view is read from: `/sys`, `/proc`, `/dev` and the NCCL topology directory
/// of the host, or fixture directories standing for them.
#[derive(Debug, Clone)]
pub struct Tree {
    pub sys: PathBuf,
    pub proc: PathBuf,
    pub dev: PathBuf,
    pub topology: PathBuf,
}

/// Where VKE mounts the NCCL topology on non-bare-metal nodes.
pub const TOPOLOGY_DIR: &str = "/var/run/nvidia-topologyd";

impl Default for Tree {
    fn default() -> Self {
        Tree { sys: "/sys".into(), proc: "/proc".into(), dev: "/dev".into(), topology: TOPOLOGY_DIR.into() }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Gid {
    pub index: u32,
    /// As sysfs prints it: eight groups of four hex digits.
    pub text: String,
    pub addr: Option<Ipv6Addr>,
    /// `RoCE v2`, `IB/RoCE v1`, ...; None where the type cannot be read.
    pub kind: Option<String>,
    pub ndev: Option<String>,
}

impl Gid {
    pub fn is_zero(&self) -> bool {
        self.addr.is_some_and(|a| a.is_unspecified())
    }

    pub fn is_roce_v2(&self) -> bool {
        self.kind.as_deref().is_some_and(|k| k.to_ascii_lowercase().ends_with("v2"))
    }

    pub fn ipv4_mapped(&self) -> bool {
        self.addr.is_some_and(|a| a.to_ipv4_mapped().is_some())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Port {
    pub num: u32,
    /// `4: ACTIVE`
    pub state: String,
    /// `5: LinkUp`
    pub phys_state: String,
    pub link_layer: String,
    /// `100 Gb/sec (4X EDR)`
    pub rate_text: String,
    /// The rate's first number, in Gb/s.
    pub rate_gbps: Option<f64>,
    pub gids: Vec<Gid>,
}

impl Port {
    pub fn is_active(&self) -> bool {
        self.state.ends_with("ACTIVE")
    }

    pub fn is_link_up(&self) -> bool {
        self.phys_state.ends_with("LinkUp")
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct RdmaDevice {
    pub name: String,
    pub node_guid: Option<String>,
    pub sys_image_guid: Option<String>,
    /// PCI address of the function behind the device (`0000:3b:00.0`), when it has one.
    pub pci: Option<String>,
    pub numa_node: Option<i32>,
    /// An SR-IOV virtual function (its PCI function has a `physfn`).
    pub virtual_function: bool,
    /// `uverbsN`, when a verbs node is registered for it.
    pub uverbs: Option<String>,
    pub ports: Vec<Port>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Netdev {
    pub name: String,
    pub carrier: Option<bool>,
    pub mtu: Option<u32>,
    pub operstate: Option<String>,
    /// `dev_id` exists (the VKE script requires it).
    pub has_dev_id: bool,
    /// A sub-interface of another link (IPVLAN, MACVLAN, VLAN, veth): its iflink is not
    /// its own ifindex.
    pub sub_interface: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Gpu {
    /// `/dev/nvidiaN` minor.
    pub minor: u32,
    pub pci: Option<String>,
    pub numa_node: Option<i32>,
}

/// The soft limit of `Max locked memory`; None = unlimited.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Memlock(pub Option<u64>);

fn read(p: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

/// Directory entries sorted as `ls` sorts them (byte order), as the VKE script sees them.
fn entries(dir: impl AsRef<Path>) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn link_name(p: impl AsRef<Path>) -> Option<String> {
    std::fs::read_link(p).ok().and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
}

/// The first number of a sysfs rate (`100 Gb/sec (4X EDR)` -> 100).
pub fn rate_number(text: &str) -> Option<f64> {
    text.split_whitespace().next()?.parse().ok()
}

impl Tree {
    /// Whether this is the running system's tree (only then can memory be registered).
    pub fn is_live(&self) -> bool {
        self.sys == Path::new("/sys") && self.proc == Path::new("/proc")
    }

    fn ib(&self) -> PathBuf {
        self.sys.join("class/infiniband")
    }

    /// Every device under `class/infiniband`, in `ls` order.
    pub fn rdma_devices(&self) -> Vec<RdmaDevice> {
        let uverbs = self.uverbs();
        entries(self.ib()).into_iter().map(|name| self.device(&name, uverbs.get(&name).cloned())).collect()
    }

    fn device(&self, name: &str, uverbs: Option<String>) -> RdmaDevice {
        let dir = self.ib().join(name);
        let pci = link_name(dir.join("device")).filter(|n| n.contains(':'));
        RdmaDevice {
            name: name.to_string(),
            node_guid: read(dir.join("node_guid")),
            sys_image_guid: read(dir.join("sys_image_guid")),
            pci,
            numa_node: read(dir.join("device/numa_node")).and_then(|n| n.parse().ok()),
            virtual_function: dir.join("device/physfn").exists(),
            uverbs,
            ports: entries(dir.join("ports"))
                .iter()
                .filter_map(|p| p.parse().ok())
                .map(|p: u32| self.port(&dir.join("ports").join(p.to_string()), p))
                .collect(),
        }
    }

    fn port(&self, dir: &Path, num: u32) -> Port {
        let rate_text = read(dir.join("rate")).unwrap_or_default();
        let mut indexes: Vec<u32> = entries(dir.join("gids")).iter().filter_map(|g| g.parse().ok()).collect();
        indexes.sort_unstable();
        let gids = indexes
            .into_iter()
            .filter_map(|i| {
                let text = read(dir.join("gids").join(i.to_string()))?;
                Some(Gid {
                    index: i,
                    addr: text.parse().ok(),
                    text,
                    kind: read(dir.join("gid_attrs/types").join(i.to_string())),
                    ndev: read(dir.join("gid_attrs/ndevs").join(i.to_string())).filter(|n| !n.is_empty()),
                })
            })
            .collect();
        Port {
            num,
            state: read(dir.join("state")).unwrap_or_default(),
            phys_state: read(dir.join("phys_state")).unwrap_or_default(),
            link_layer: read(dir.join("link_layer")).unwrap_or_default(),
            rate_gbps: rate_number(&rate_text),
            rate_text,
            gids,
        }
    }

    /// ibdev -> uverbsN, from `class/infiniband_verbs`.
    pub fn uverbs(&self) -> BTreeMap<String, String> {
        let base = self.sys.join("class/infiniband_verbs");
        entries(&base)
            .into_iter()
            .filter(|e| e.starts_with("uverbs"))
            .filter_map(|u| read(base.join(&u).join("ibdev")).map(|dev| (dev, u)))
            .collect()
    }

    /// Whether the verbs char device `/dev/infiniband/uverbsN` exists: libibverbs lists a
    /// device only then.
    pub fn char_device_present(&self, uverbs: &str) -> bool {
        self.dev.join("infiniband").join(uverbs).exists()
    }

    pub fn abi_version(&self) -> Option<u32> {
        read(self.sys.join("class/infiniband_verbs/abi_version")).and_then(|v| v.parse().ok())
    }

    /// ib_core's netns mode: Some(true) shared (every namespace sees every device).
    pub fn netns_shared(&self) -> Option<bool> {
        read(self.sys.join("module/ib_core/parameters/netns_mode")).map(|v| v == "Y" || v == "1")
    }

    pub fn netdev(&self, name: &str) -> Option<Netdev> {
        let dir = self.sys.join("class/net").join(name);
        if !dir.exists() {
            return None;
        }
        let ifindex = read(dir.join("ifindex"));
        let iflink = read(dir.join("iflink"));
        Some(Netdev {
            name: name.to_string(),
            carrier: read(dir.join("carrier")).map(|c| c == "1"),
            mtu: read(dir.join("mtu")).and_then(|m| m.parse().ok()),
            operstate: read(dir.join("operstate")),
            has_dev_id: dir.join("dev_id").is_file(),
            sub_interface: ifindex.is_some() && iflink.is_some() && ifindex != iflink,
        })
    }

    /// The GPUs this process was given: `/dev/nvidiaN`, with PCI address and NUMA node
    /// from the driver's per-GPU information file when it is visible.
    pub fn gpus(&self) -> Vec<Gpu> {
        let minors = entries(&self.dev).into_iter().filter_map(|e| e.strip_prefix("nvidia")?.parse::<u32>().ok());
        let info = self.proc.join("driver/nvidia/gpus");
        let by_minor: BTreeMap<u32, String> = entries(&info)
            .into_iter()
            .filter_map(|pci| {
                let text = read(info.join(&pci).join("information"))?;
                let minor = text.lines().find_map(|l| l.strip_prefix("Device Minor:"))?.trim().parse().ok()?;
                Some((minor, pci))
            })
            .collect();
        minors
            .map(|minor| {
                let pci = by_minor.get(&minor).cloned();
                let numa_node = pci.as_ref().and_then(|p| {
                    read(self.sys.join("bus/pci/devices").join(p.to_ascii_lowercase()).join("numa_node"))
                        .and_then(|n| n.parse().ok())
                });
                Gpu { minor, pci, numa_node }
            })
            .collect()
    }

    pub fn status(&self) -> Option<String> {
        read(self.proc.join("self/status"))
    }

    /// RLIMIT_MEMLOCK's soft limit, from `self/limits`.
    pub fn memlock(&self) -> Option<Memlock> {
        let text = read(self.proc.join("self/limits"))?;
        let line = text.lines().find(|l| l.starts_with("Max locked memory"))?;
        let soft = line.trim_start_matches("Max locked memory").split_whitespace().next()?;
        Some(Memlock(if soft == "unlimited" { None } else { Some(soft.parse().ok()?) }))
    }

    /// The size of the tmpfs on /dev/shm, from `self/mounts` (its `size=` option, or the
    /// filesystem's size on the live system). None when /dev/shm is not mounted.
    pub fn shm_size(&self) -> Option<u64> {
        let mounts = read(self.proc.join("self/mounts"))?;
        let line = mounts.lines().find(|l| l.split_whitespace().nth(1) == Some("/dev/shm"))?;
        let opts = line.split_whitespace().nth(3).unwrap_or("");
        if let Some(size) = opts.split(',').find_map(|o| o.strip_prefix("size=")) {
            // tmpfs writes k/m/g suffixes; a percentage (size=50%) is not a byte count.
            return crate::units::parse_bytes(size).ok();
        }
        if self.is_live() { statvfs_size("/dev/shm") } else { None }
    }

    /// The NCCL topology file VKE provides on non-bare-metal nodes.
    pub fn topology_file(&self) -> PathBuf {
        self.topology.join("virtualTopology.xml")
    }
}

fn statvfs_size(path: &str) -> Option<u64> {
    let c = std::ffi::CString::new(path).ok()?;
    // SAFETY: all-zero is a valid statvfs; statvfs writes into it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid path and struct.
    (unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0).then(|| st.f_blocks * st.f_frsize)
}
