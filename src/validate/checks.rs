//! The checks of `rdmabench validate`: what a profile expects against what the tree
//! shows. Pure: the one check that needs the device (registering memory) is done by the
//! caller and handed in as its outcome.

use std::collections::BTreeSet;

use super::profiles::{GidFamily, NicCount, Profile, Sharing};
use super::sysfs::{Gid, Port, RdmaDevice, Tree};
use crate::verbs::memlock::human_bytes;

const CAP_IPC_LOCK: u32 = 14;
const CAP_SYS_RESOURCE: u32 = 24;
/// Container runtimes mount /dev/shm with 64 MiB unless told otherwise.
const DEFAULT_SHM: u64 = 64 << 20;

pub use crate::report::check::{Check, Status};

/// The outcome of registering `--mr-size` bytes, done by the caller on a live system.
#[derive(Debug, Clone, PartialEq)]
pub enum Registration {
    Registered { device: String },
    Failed(String),
    Skipped(String),
}

pub struct Inputs<'a> {
    pub tree: &'a Tree,
    pub profile: &'static Profile,
    pub expect_nics: Option<u32>,
    pub expect_gpus: Option<u32>,
    pub mr_size: u64,
    pub registration: Registration,
}

pub struct Outcome {
    pub checks: Vec<Check>,
    /// Nothing RDMA at all: no device in the tree (exit 3).
    pub no_rdma: bool,
    /// The GID index every selected device shares, when there is one.
    pub gid_index: Option<u32>,
}

impl Outcome {
    pub fn worst(&self) -> Status {
        self.checks.iter().map(|c| c.status).filter(|s| *s != Status::Skip).max().unwrap_or(Status::Pass)
    }
}

struct Checks {
    list: Vec<Check>,
}

impl Checks {
    fn add_status(&mut self, status: Status, id: &str, subject: &str, seen: String, expected: &str, fix: &str) {
        self.add(id, subject, status, seen, expected, fix);
    }

    fn add(&mut self, id: &str, subject: &str, status: Status, seen: String, expected: &str, fix: &str) {
        self.list.push(Check {
            id: id.into(),
            subject: subject.into(),
            status,
            seen,
            expected: expected.into(),
            fix: (status != Status::Pass && !fix.is_empty()).then(|| fix.into()),
        });
    }
}

/// Pass when `ok`, else `bad`.
fn pick(ok: bool, bad: Status) -> Status {
    if ok { Status::Pass } else { bad }
}

/// Runs every check of the profile.
pub fn run(inp: &Inputs) -> Outcome {
    let mut c = Checks { list: Vec::new() };
    let p = inp.profile;
    let all = inp.tree.rdma_devices();
    if all.is_empty() {
        c.add(
            "rdma-present",
            "node",
            Status::Fail,
            format!("no device under {}", inp.tree.sys.join("class/infiniband").display()),
            "at least one RDMA device",
            "request the RDMA resource in the pod spec (see `rdmabench k8s render`), or load the driver",
        );
        return Outcome { checks: c.list, no_rdma: true, gid_index: None };
    }
    let usable: Vec<&RdmaDevice> =
        all.iter().filter(|d| d.uverbs.as_deref().is_some_and(|u| inp.tree.char_device_present(u))).collect();
    device_count(&mut c, inp, &all, &usable);
    abi(&mut c, inp.tree, !usable.is_empty());
    let mut per_port_indexes = Vec::new();
    for d in &usable {
        for port in &d.ports {
            let subject = format!("{}/{}", d.name, port.num);
            let chosen = port_checks(&mut c, inp, &subject, port);
            per_port_indexes.push((subject, chosen));
        }
    }
    let gid_index = shared_gid_index(&mut c, &per_port_indexes);
    rates(&mut c, &usable);
    sharing(&mut c, inp, &usable);
    process_checks(&mut c, inp);
    numa(&mut c, inp, &usable);
    if p.topology_file {
        let f = inp.tree.topology_file();
        c.add_status(
            pick(f.is_file(), Status::Warn),
            "topology-file",
            "pod",
            if f.is_file() { format!("{} present", f.display()) } else { format!("{} missing", f.display()) },
            "present on non-bare-metal instances (NCCL reads virtualTopology.xml)",
            "mount hostPath /var/run/nvidia-topologyd (DirectoryOrCreate) read-only; bare-metal nodes do not need it",
        );
    }
    Outcome { checks: c.list, no_rdma: false, gid_index }
}

fn device_count(c: &mut Checks, inp: &Inputs, all: &[RdmaDevice], usable: &[&RdmaDevice]) {
    let names = |v: &mut dyn Iterator<Item = &str>| v.collect::<Vec<_>>().join(", ");
    let seen = format!(
        "{} usable ({}) of {} visible",
        usable.len(),
        names(&mut usable.iter().map(|d| d.name.as_str())),
        all.len()
    );
    let fix_none = "the device plugin did not mount /dev/infiniband/uverbs* for these devices: check the resource \
                    request and the plugin's logs";
    if usable.is_empty() {
        c.add("usable-devices", "pod", Status::Fail, seen, "at least 1 with /dev/infiniband/uverbsN", fix_none);
        return;
    }
    let n = usable.len() as u32;
    match (inp.expect_nics, inp.profile.nics) {
        (None, _) => c.add("usable-devices", "pod", Status::Pass, seen, "at least 1", ""),
        (Some(want), NicCount::Requested) => c.add_status(
            pick(n == want, Status::Fail),
            "usable-devices",
            "pod",
            seen,
            &format!("exactly {want} (--expect-nics)"),
            "request that many RDMA NICs (vke.volcengine.com/rdma / rdma/hca) or fix --expect-nics",
        ),
        (Some(want), NicCount::WholeNode) => c.add_status(
            pick(n >= want, Status::Fail),
            "usable-devices",
            "pod",
            seen,
            &format!("at least {want}: this mode shows every NIC of the node, whatever was requested"),
            "check that the node has the NICs and the plugin is in this mode",
        ),
    }
}

fn abi(c: &mut Checks, tree: &Tree, usable: bool) {
    match tree.abi_version() {
        Some(v) => c.add("uverbs-abi", "node", Status::Pass, format!("ABI version {v}"), "present", ""),
        None => c.add(
            "uverbs-abi",
            "node",
            if usable { Status::Warn } else { Status::Fail },
            "class/infiniband_verbs/abi_version missing".into(),
            "present",
            "the ib_uverbs module is not loaded on the node",
        ),
    }
}

/// Link-local GIDs never qualify: they do not route beyond the link, and NCCL must not
/// pick them.
fn family_ok(family: GidFamily, g: &Gid) -> bool {
    let routable = g.addr.is_some_and(|a| !a.is_unicast_link_local());
    routable
        && match family {
            GidFamily::Ipv4 => g.ipv4_mapped(),
            GidFamily::Ipv6 => !g.ipv4_mapped(),
            GidFamily::Any => true,
        }
}

fn family_label(f: GidFamily) -> &'static str {
    match f {
        GidFamily::Ipv4 => "IPv4-mapped",
        GidFamily::Ipv6 => "global IPv6",
        GidFamily::Any => "IPv4-mapped or global IPv6",
    }
}

/// Checks one port; returns the GID indexes that qualify on it.
fn port_checks(c: &mut Checks, inp: &Inputs, subject: &str, port: &Port) -> BTreeSet<u32> {
    let p = inp.profile;
    c.add_status(
        pick(port.is_active() && port.is_link_up(), Status::Fail),
        "port-state",
        subject,
        format!("{}, {}", port.state, port.phys_state),
        "4: ACTIVE, 5: LinkUp",
        "check the cable/switch port and the netdev (ip link); on VKE exclusive the NIC shows Down on the host",
    );
    let roce = port.link_layer == "Ethernet";
    if p.platform != "any" || !roce {
        c.add_status(
            pick(roce || p.platform == "any", Status::Fail),
            "link-layer",
            subject,
            port.link_layer.clone(),
            "Ethernet (RoCE)",
            "this platform mode runs RoCE; an InfiniBand port belongs to another profile (generic)",
        );
    }
    if !roce {
        return BTreeSet::new();
    }
    let v2: Vec<&Gid> = port.gids.iter().filter(|g| g.is_roce_v2() && !g.is_zero()).collect();
    let fitting: Vec<&Gid> = v2.iter().copied().filter(|g| family_ok(p.family, g)).collect();
    let listed = |v: &[&Gid]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.iter()
                .map(|g| format!("{}={}", g.index, g.addr.map_or(g.text.clone(), |a| a.to_string())))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let family_fix = match p.family {
        GidFamily::Ipv6 => {
            "ACK pod-network RDMA needs the IPv6 compute network and the plugin's non-hostNetwork switch"
        }
        _ => "the pod's RDMA netdev has no address of that family: check the CNI (VPC-CNI on VKE) or hostNetwork",
    };
    c.add_status(
        pick(!fitting.is_empty(), Status::Fail),
        "gid",
        subject,
        format!("RoCE v2 GIDs: {}", listed(&v2)),
        &format!("a RoCE v2 GID, {}", family_label(p.family)),
        family_fix,
    );
    let mut qualifying = BTreeSet::new();
    let mut netdev_seen = Vec::new();
    let mut netdev_problem = None;
    for g in &fitting {
        let Some(nd) = g.ndev.as_deref() else {
            netdev_problem.get_or_insert(format!("GID {} has no netdev", g.index));
            continue;
        };
        match inp.tree.netdev(nd) {
            None => {
                netdev_problem.get_or_insert(format!("GID {}'s netdev {nd} is not in this network namespace", g.index));
            }
            Some(n) => {
                let carrier = n.carrier == Some(true);
                let mtu = n.mtu.unwrap_or(0);
                netdev_seen.push(format!("{nd} carrier {} mtu {mtu}", if carrier { 1 } else { 0 }));
                if !carrier {
                    netdev_problem.get_or_insert(format!("{nd} has no carrier"));
                } else if mtu <= 1500 {
                    netdev_problem.get_or_insert(format!("{nd} MTU {mtu} <= 1500"));
                } else {
                    qualifying.insert(g.index);
                }
            }
        }
    }
    if !fitting.is_empty() {
        let seen = match (&netdev_problem, netdev_seen.is_empty()) {
            (Some(problem), true) => problem.clone(),
            (Some(problem), false) => format!("{}; {problem}", netdev_seen.join(", ")),
            (None, _) => netdev_seen.join(", "),
        };
        c.add_status(pick(!qualifying.is_empty(), Status::Fail),
            "netdev",
            subject,
            seen,
            "the GID's netdev present, carrier 1, MTU > 1500",
            "bring the link up with a jumbo MTU (ip link set DEV mtu 4200 up); RoCE at MTU 1500 loses most of its speed",
        );
    }
    qualifying
}

/// NCCL takes one GID index for every device: there must be one they all have.
fn shared_gid_index(c: &mut Checks, ports: &[(String, BTreeSet<u32>)]) -> Option<u32> {
    let with: Vec<&(String, BTreeSet<u32>)> = ports.iter().filter(|(_, s)| !s.is_empty()).collect();
    if with.is_empty() {
        return None;
    }
    let mut common = with[0].1.clone();
    for (_, s) in &with[1..] {
        common = common.intersection(s).copied().collect();
    }
    let listing = with
        .iter()
        .map(|(p, s)| format!("{p}: {}", s.iter().map(u32::to_string).collect::<Vec<_>>().join("/")))
        .collect::<Vec<_>>()
        .join(", ");
    let index = common.first().copied();
    c.add_status(
        pick(index.is_some(), Status::Fail),
        "gid-index",
        "pod",
        match index {
            Some(i) => format!("index {i} on every device ({listing})"),
            None => format!("no common index ({listing})"),
        },
        "one GID index shared by every device (NCCL_IB_GID_INDEX)",
        "the indexes differ between devices (a force-deleted pod can leak a NIC and shift them): recreate the pod \
         or use only the devices that agree (NCCL_IB_HCA)",
    );
    index
}

fn rates(c: &mut Checks, usable: &[&RdmaDevice]) {
    let rates: Vec<String> = usable
        .iter()
        .flat_map(|d| d.ports.iter().map(move |p| format!("{}/{} {}", d.name, p.num, p.rate_text)))
        .collect();
    let distinct: BTreeSet<String> =
        usable.iter().flat_map(|d| d.ports.iter().map(|p| p.rate_gbps.map_or("?".into(), |r| r.to_string()))).collect();
    c.add_status(
        pick(distinct.len() <= 1, Status::Warn),
        "rate",
        "pod",
        rates.join(", "),
        "the same rate on every device",
        "NCCL (and nccl-env) use only the fastest devices; check the slower ports' cabling and speed",
    );
}

fn sharing(c: &mut Checks, inp: &Inputs, usable: &[&RdmaDevice]) {
    match inp.profile.sharing {
        Sharing::Exclusive => {
            let vfs: Vec<&str> = usable.iter().filter(|d| d.virtual_function).map(|d| d.name.as_str()).collect();
            let mut guids = BTreeSet::new();
            let dup: Vec<&str> = usable
                .iter()
                .filter(|d| d.sys_image_guid.as_ref().is_some_and(|g| !guids.insert(g.clone())))
                .map(|d| d.name.as_str())
                .collect();
            c.add_status(
                pick(vfs.is_empty() && dup.is_empty(), Status::Warn),
                "exclusive-nic",
                "pod",
                if vfs.is_empty() && dup.is_empty() {
                    "each device is its own physical function".into()
                } else {
                    format!(
                        "virtual functions: [{}]; same physical NIC as another device: [{}]",
                        vfs.join(", "),
                        dup.join(", ")
                    )
                },
                "physical functions, one physical NIC each",
                "exclusive mode passes whole NICs through; a VF or a shared system image GUID means a shared mode",
            );
        }
        Sharing::Shared => {
            let seen = usable
                .iter()
                .map(|d| {
                    format!(
                        "{} {} of NIC {}",
                        d.name,
                        if d.virtual_function { "VF" } else { "function" },
                        d.sys_image_guid.as_deref().unwrap_or("?")
                    )
                })
                .collect::<Vec<_>>()
                .join(", ");
            c.add(
                "shared-nic",
                "pod",
                Status::Pass,
                seen,
                "virtual NICs of a shared physical NIC (a pair test shows sharing)",
                "",
            );
        }
        Sharing::HostIpvlan => {
            let mut subs = Vec::new();
            let mut plain = Vec::new();
            for d in usable {
                for g in d.ports.iter().flat_map(|p| p.gids.iter()).filter(|g| g.is_roce_v2()) {
                    if let Some(n) = g.ndev.as_deref().and_then(|nd| inp.tree.netdev(nd)) {
                        let list = if n.sub_interface { &mut subs } else { &mut plain };
                        if !list.contains(&n.name) {
                            list.push(n.name);
                        }
                    }
                }
            }
            c.add_status(pick(plain.is_empty() && !subs.is_empty(), Status::Warn),
                "ipvlan",
                "pod",
                format!("sub-interfaces: [{}]; own links: [{}]", subs.join(", "), plain.join(", ")),
                "IPVLAN sub-interfaces of the host's NICs",
                "shared-host mode inserts every NIC as an IPVLAN sub-interface; check the node label vke.node.rdma.mode",
            );
        }
        Sharing::Any => {}
    }
}

fn cap(status: Option<&str>, bit: u32) -> Option<bool> {
    crate::verbs::memlock::cap_eff(status?).map(|caps| caps & (1 << bit) != 0)
}

fn process_checks(c: &mut Checks, inp: &Inputs) {
    let p = inp.profile;
    let status = inp.tree.status();
    let ipc_lock = cap(status.as_deref(), CAP_IPC_LOCK);
    let yes_no = |v: Option<bool>| match v {
        Some(true) => "effective".to_string(),
        Some(false) => "not effective".to_string(),
        None => "unknown (no CapEff in self/status)".to_string(),
    };
    c.add_status(
        pick(ipc_lock == Some(true), if p.needs_ipc_lock { Status::Fail } else { Status::Warn }),
        "cap-ipc-lock",
        "process",
        yes_no(ipc_lock),
        "CAP_IPC_LOCK effective",
        "add securityContext.capabilities.add: [IPC_LOCK] (added capabilities are effective only for root)",
    );
    if p.needs_sys_resource {
        let sr = cap(status.as_deref(), CAP_SYS_RESOURCE);
        c.add_status(
            pick(sr == Some(true), Status::Fail),
            "cap-sys-resource",
            "process",
            yes_no(sr),
            "CAP_SYS_RESOURCE effective",
            "add securityContext.capabilities.add: [SYS_RESOURCE] (as the ACK document's example Job does)",
        );
    }
    let limit = inp.tree.memlock();
    let enough = match limit {
        Some(m) => m.0.is_none_or(|l| l >= inp.mr_size) || ipc_lock == Some(true),
        None => false,
    };
    c.add_status(
        pick(enough, Status::Fail),
        "memlock",
        "process",
        match limit {
            Some(m) => format!(
                "{}{}",
                m.0.map_or("unlimited".into(), human_bytes),
                if ipc_lock == Some(true) { " (CAP_IPC_LOCK lifts it)" } else { "" }
            ),
            None => "unknown (no self/limits)".into(),
        },
        &format!("unlimited, at least {}, or CAP_IPC_LOCK", human_bytes(inp.mr_size)),
        "add IPC_LOCK, or raise the limit (ulimit -l unlimited; containerd/docker: default ulimits memlock=-1)",
    );
    match &inp.registration {
        Registration::Registered { device } => c.add(
            "register-memory",
            device,
            Status::Pass,
            format!("registered {}", human_bytes(inp.mr_size)),
            "a buffer of --mr-size registers",
            "",
        ),
        Registration::Failed(why) => c.add(
            "register-memory",
            "process",
            Status::Fail,
            why.clone(),
            &format!("{} registers", human_bytes(inp.mr_size)),
            "see the memlock and IPC_LOCK checks above",
        ),
        Registration::Skipped(why) => {
            c.add("register-memory", "process", Status::Skip, why.clone(), "a buffer of --mr-size registers", "")
        }
    }
    let shm = inp.tree.shm_size();
    let big = shm.is_some_and(|s| s > DEFAULT_SHM);
    c.add_status(
        pick(big, if p.needs_large_shm { Status::Fail } else { Status::Warn }),
        "dev-shm",
        "pod",
        shm.map_or("not mounted".into(), human_bytes),
        "more than the 64 MiB container default",
        "mount an emptyDir with medium: Memory on /dev/shm (ACK's example: sizeLimit 8Gi)",
    );
    match inp.tree.netns_shared() {
        Some(shared) => c.add(
            "netns-mode",
            "node",
            Status::Pass,
            if shared { "shared (every namespace sees every device)" } else { "exclusive" }.into(),
            "reported",
            "",
        ),
        None => c.add("netns-mode", "node", Status::Skip, "ib_core netns_mode not readable".into(), "reported", ""),
    }
}

fn numa(c: &mut Checks, inp: &Inputs, usable: &[&RdmaDevice]) {
    let nic_nodes: BTreeSet<i32> = usable.iter().filter_map(|d| d.numa_node).filter(|n| *n >= 0).collect();
    let nics = usable
        .iter()
        .map(|d| format!("{} node {}", d.name, d.numa_node.map_or("?".into(), |n| n.to_string())))
        .collect::<Vec<_>>()
        .join(", ");
    let gpus = inp.tree.gpus();
    if let Some(want) = inp.expect_gpus {
        c.add_status(
            pick(gpus.len() as u32 == want, Status::Fail),
            "gpus",
            "pod",
            format!("{} (/dev/nvidia*)", gpus.len()),
            &format!("{want} (--expect-gpus)"),
            "request that many GPUs (nvidia.com/gpu) or fix --expect-gpus",
        );
    }
    let gpu_nodes: BTreeSet<i32> = gpus.iter().filter_map(|g| g.numa_node).filter(|n| *n >= 0).collect();
    let apart: Vec<i32> = gpu_nodes.difference(&nic_nodes).copied().collect();
    let seen = if gpus.is_empty() {
        format!("NICs: {nics}; no GPU visible")
    } else {
        format!(
            "NICs: {nics}; GPUs: {}",
            gpus.iter()
                .map(|g| format!("nvidia{} node {}", g.minor, g.numa_node.map_or("?".into(), |n| n.to_string())))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    c.add_status(
        pick(apart.is_empty() || nic_nodes.is_empty(), Status::Warn),
        "numa",
        "pod",
        seen,
        "every GPU's NUMA node has a NIC",
        "set the kubelet topologyManagerPolicy to best-effort (VKE exclusive/shared modes) so GPU and NIC share a node",
    );
}
