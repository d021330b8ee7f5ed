//! What one side of a connection tells the other about itself: its QP, memory and GID
//! (`Endpoint`), and the physical NIC behind its device (`NicIdentity`). Plain data; the
//! session carries it, the binding fills it.

use serde::{Deserialize, Serialize};

/// What one side needs to know to connect its QP to the other's and reach its memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Endpoint {
    /// Names travel defused (`names::wire`): a peer's are never a reason to refuse it.
    #[serde(with = "crate::names::wire")]
    pub node: String,
    #[serde(with = "crate::names::wire")]
    pub device: String,
    pub port: u8,
    pub link_layer: String,
    pub lid: u16,
    pub gid_index: u32,
    /// The GID as an IPv6 address string.
    pub gid: String,
    /// "RoCEv2", "RoCEv1" or "IB".
    pub gid_type: String,
    /// "ipv4" (IPv4-mapped) or "ipv6".
    pub gid_family: String,
    /// The `-x` values this side could use, described, for error messages on the other side.
    pub usable_gids: Vec<String>,
    pub qpn: u32,
    pub psn: u32,
    pub active_mtu: u32,
    pub addr: u64,
    pub rkey: u32,
    pub buf_len: u64,
    pub max_inline: u32,
    /// Which physical NIC this is, so a pair can tell whether it shares one.
    #[serde(default)]
    pub nic: NicIdentity,
    /// With `-R`, the server's rdma_cm listening address (`ip:port`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cm_addr: Option<String>,
}

/// The identity of the NIC behind a device: two devices with one system image GUID are
/// functions (or virtual NICs) of one physical NIC.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NicIdentity {
    pub node_guid: String,
    pub sys_image_guid: String,
    /// PCI address of the device's function, when it has one (soft-RoCE has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci: Option<String>,
    /// The NUMA node the device hangs off, when sysfs says (soft-RoCE and VMs often do not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<i32>,
    /// The firmware version the driver reports, when it reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<String>,
    /// The kernel driver (and its module version, when the module states one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
}

impl NicIdentity {
    /// Whether two identities are the same physical NIC (unknown GUIDs never match).
    pub fn same_physical_nic(&self, other: &NicIdentity) -> bool {
        !self.sys_image_guid.is_empty() && self.sys_image_guid == other.sys_image_guid
    }
}
