//! The platform modes `validate` knows, as one table: what a pod of each mode must see.
//! A new platform or mode is a new row.

use clap::ValueEnum;
use serde::Serialize;

/// How many usable devices a pod should see, given `--expect-nics N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum NicCount {
    /// Exactly the N requested.
    Requested,
    /// Every device of the node, whatever was requested: at least N.
    WholeNode,
}

/// Which RoCE v2 GID family the mode gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum GidFamily {
    /// IPv4-mapped (`::ffff:a.b.c.d`).
    Ipv4,
    /// A global IPv6 address.
    Ipv6,
    /// Either.
    Any,
}

/// What a pod can see of how its NIC is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Sharing {
    /// The physical NIC is the pod's alone: two pods never hold the same one.
    Exclusive,
    /// Virtual NICs of a physical NIC other pods use too.
    Shared,
    /// All of the node's NICs, as IPVLAN sub-interfaces of the host's.
    HostIpvlan,
    /// No expectation.
    Any,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Profile {
    pub name: &'static str,
    pub platform: &'static str,
    pub nics: NicCount,
    pub family: GidFamily,
    pub sharing: Sharing,
    /// CAP_IPC_LOCK must be effective (else only warned about).
    pub needs_ipc_lock: bool,
    pub needs_sys_resource: bool,
    /// /dev/shm must be larger than the container default (64 MiB): NCCL's shared-memory
    /// transport needs it. Else only warned about.
    pub needs_large_shm: bool,
    /// The NCCL topology file is expected (VKE, on non-bare-metal machines: a warning).
    pub topology_file: bool,
    /// Where the rules come from, quoted in messages.
    pub source: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProfileName {
    VkeExclusive,
    VkeShared,
    VkeSharedMulti,
    VkeSharedHost,
    AckSharedHostnet,
    AckSharedPodnet,
    AckExclusive,
    Generic,
}

const VKE: &str = "VKE RDMA (RoCE) documentation";
const ACK: &str = "ACK Lingjun RDMA shared-mode documentation";

/// Every profile. VKE pods use the VPC network with IPv4; ACK hostNetwork pods use the
/// node's (IPv4); ACK pod-network RDMA needs the IPv6 compute network.
pub const PROFILES: &[Profile] = &[
    Profile {
        name: "vke-exclusive",
        platform: "VKE",
        nics: NicCount::Requested,
        family: GidFamily::Ipv4,
        sharing: Sharing::Exclusive,
        needs_ipc_lock: true,
        needs_sys_resource: false,
        needs_large_shm: true,
        topology_file: true,
        source: VKE,
    },
    Profile {
        name: "vke-shared",
        platform: "VKE",
        nics: NicCount::Requested,
        family: GidFamily::Ipv4,
        sharing: Sharing::Shared,
        needs_ipc_lock: true,
        needs_sys_resource: false,
        needs_large_shm: true,
        topology_file: true,
        source: VKE,
    },
    Profile {
        name: "vke-shared-multi",
        platform: "VKE",
        nics: NicCount::Requested,
        family: GidFamily::Ipv4,
        sharing: Sharing::Shared,
        needs_ipc_lock: true,
        needs_sys_resource: false,
        needs_large_shm: true,
        topology_file: true,
        source: VKE,
    },
    Profile {
        name: "vke-shared-host",
        platform: "VKE",
        nics: NicCount::WholeNode,
        family: GidFamily::Ipv4,
        sharing: Sharing::HostIpvlan,
        needs_ipc_lock: true,
        needs_sys_resource: false,
        needs_large_shm: true,
        topology_file: true,
        source: VKE,
    },
    Profile {
        name: "ack-shared-hostnet",
        platform: "ACK",
        nics: NicCount::WholeNode,
        family: GidFamily::Ipv4,
        sharing: Sharing::Shared,
        needs_ipc_lock: true,
        needs_sys_resource: true,
        needs_large_shm: true,
        topology_file: false,
        source: ACK,
    },
    Profile {
        name: "ack-shared-podnet",
        platform: "ACK",
        nics: NicCount::WholeNode,
        family: GidFamily::Ipv6,
        sharing: Sharing::Shared,
        needs_ipc_lock: true,
        needs_sys_resource: true,
        needs_large_shm: true,
        topology_file: false,
        source: ACK,
    },
    Profile {
        name: "ack-exclusive",
        platform: "ACK",
        nics: NicCount::Requested,
        family: GidFamily::Any,
        sharing: Sharing::Exclusive,
        needs_ipc_lock: true,
        needs_sys_resource: true,
        needs_large_shm: true,
        topology_file: false,
        source: ACK,
    },
    Profile {
        name: "generic",
        platform: "any",
        nics: NicCount::Requested,
        family: GidFamily::Any,
        sharing: Sharing::Any,
        needs_ipc_lock: false,
        needs_sys_resource: false,
        needs_large_shm: false,
        topology_file: false,
        source: "rdmabench's defaults for any RoCE or InfiniBand host",
    },
];

impl ProfileName {
    pub fn profile(self) -> &'static Profile {
        let name = self.to_possible_value().expect("no skipped variants").get_name().to_string();
        PROFILES.iter().find(|p| p.name == name).expect("every profile name has a row")
    }
}

/// The profile of a name, for names that travel in a spec.
pub fn by_name(name: &str) -> Option<&'static Profile> {
    PROFILES.iter().find(|p| p.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_has_exactly_one_row() {
        for v in ProfileName::value_variants() {
            let name = v.to_possible_value().unwrap().get_name().to_string();
            assert_eq!(PROFILES.iter().filter(|p| p.name == name).count(), 1, "{name}");
            assert_eq!(v.profile().name, name);
        }
        assert_eq!(PROFILES.len(), ProfileName::value_variants().len());
    }
}
