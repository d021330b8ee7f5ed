//! What each platform mode requires of a pod, as the VKE and ACK documents state it: one
//! row per mode. The manifests are built from these rows; a new mode is a new row.

use clap::ValueEnum;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Platform {
    Vke,
    Ack,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    pub platform: Platform,
    /// `--mode` value.
    pub name: &'static str,
    /// The `rdmabench validate` profile of this mode.
    pub profile: &'static str,
    /// The extended resource a pod requests.
    pub resource: &'static str,
    /// The quantity is the NIC count (`vke.volcengine.com/rdma: N`); otherwise always 1.
    pub quantity_is_nics: bool,
    /// VKE: one `{"cniConf":{"name":"rdma"}}` block per NIC in `k8s.volcengine.com/pod-networks`.
    pub pod_networks: bool,
    /// The pod sees every NIC of the node whatever it requested.
    pub whole_node: bool,
    pub host_network: bool,
    pub sys_resource: bool,
    /// `sizeLimit` of the in-memory /dev/shm, when the document gives one.
    pub shm_size_limit: Option<&'static str>,
    /// VKE non-bare-metal: the NCCL topology hostPath, read-only.
    pub topology_hostpath: bool,
    /// ACK's example Job tolerates every taint.
    pub tolerate_all: bool,
    /// Shown in k8s-jobs/README.md.
    pub summary: &'static str,
}

const VKE_RDMA: &str = "vke.volcengine.com/rdma";

pub const MODES: &[Mode] = &[
    Mode {
        platform: Platform::Vke,
        name: "exclusive",
        profile: "vke-exclusive",
        resource: VKE_RDMA,
        quantity_is_nics: true,
        pod_networks: true,
        whole_node: false,
        host_network: false,
        sys_resource: false,
        shm_size_limit: None,
        topology_hostpath: true,
        tolerate_all: false,
        summary: "physical NICs passed through, one pod each",
    },
    Mode {
        platform: Platform::Vke,
        name: "shared",
        profile: "vke-shared",
        resource: VKE_RDMA,
        quantity_is_nics: true,
        pod_networks: true,
        whole_node: false,
        host_network: false,
        sys_resource: false,
        shm_size_limit: None,
        topology_hostpath: true,
        tolerate_all: false,
        summary: "one shared virtual NIC per physical NIC",
    },
    Mode {
        platform: Platform::Vke,
        name: "shared-multi",
        profile: "vke-shared-multi",
        resource: VKE_RDMA,
        quantity_is_nics: true,
        pod_networks: true,
        whole_node: false,
        host_network: false,
        sys_resource: false,
        shm_size_limit: None,
        topology_hostpath: true,
        tolerate_all: false,
        summary: "several shared virtual NICs (1:N), as many as requested",
    },
    Mode {
        platform: Platform::Vke,
        name: "shared-host",
        profile: "vke-shared-host",
        resource: "vke.volcengine.com/rdma-host",
        quantity_is_nics: false,
        pod_networks: true,
        whole_node: true,
        host_network: false,
        sys_resource: false,
        shm_size_limit: None,
        topology_hostpath: true,
        tolerate_all: false,
        summary: "every NIC of the node as an IPVLAN sub-interface",
    },
    Mode {
        platform: Platform::Ack,
        name: "shared-hostnet",
        profile: "ack-shared-hostnet",
        resource: "rdma/hca",
        quantity_is_nics: false,
        pod_networks: false,
        whole_node: true,
        host_network: true,
        sys_resource: true,
        shm_size_limit: Some("8Gi"),
        topology_hostpath: false,
        tolerate_all: true,
        summary: "shared rdma/hca on the node's network (hostNetwork)",
    },
    Mode {
        platform: Platform::Ack,
        name: "shared-podnet",
        profile: "ack-shared-podnet",
        resource: "rdma/hca",
        quantity_is_nics: false,
        pod_networks: false,
        whole_node: true,
        host_network: false,
        sys_resource: true,
        shm_size_limit: Some("8Gi"),
        topology_hostpath: false,
        tolerate_all: true,
        summary: "shared rdma/hca on the pod network (IPv6 compute network, plugin switch on)",
    },
    Mode {
        platform: Platform::Ack,
        name: "exclusive",
        profile: "ack-exclusive",
        resource: "rdma/hca",
        quantity_is_nics: false,
        pod_networks: false,
        whole_node: false,
        host_network: false,
        sys_resource: true,
        shm_size_limit: Some("8Gi"),
        topology_hostpath: false,
        tolerate_all: true,
        summary: "exclusive node pool: a NIC of its own with NUMA affinity",
    },
];

pub fn platform_name(p: Platform) -> &'static str {
    match p {
        Platform::Vke => "vke",
        Platform::Ack => "ack",
    }
}

/// The mode of `platform` called `name`, or the list of valid ones.
pub fn find(platform: Platform, name: &str) -> Result<&'static Mode, String> {
    MODES.iter().find(|m| m.platform == platform && m.name == name).ok_or_else(|| {
        let valid: Vec<&str> = MODES.iter().filter(|m| m.platform == platform).map(|m| m.name).collect();
        format!("{} has no mode {name:?}; use one of {}", platform_name(platform), valid.join(", "))
    })
}

/// The documents' NIC-count rules. Err: refused (with the rule quoted); Ok(Some): a warning.
pub fn check_nics(mode: &Mode, nics: u32, machine_nics: Option<u32>) -> Result<Option<String>, String> {
    if nics == 0 {
        return Err("--nics 0: a pair test needs at least one RDMA NIC per pod".into());
    }
    if mode.platform == Platform::Vke && mode.name == "shared-host" && nics != 1 {
        return Err(format!(
            "--nics {nics} with vke shared-host: the VKE document allows exactly one \
             {{\"cniConf\":{{\"name\":\"rdma\"}}}} block in k8s.volcengine.com/pod-networks in shared-host mode \
             (requests = limits = vke.volcengine.com/rdma-host: 1), and the pod then sees every NIC of the node; \
             use --nics 1"
        ));
    }
    if let Some(m) = machine_nics
        && mode.quantity_is_nics
        && nics != m
        && nics * 2 != m
    {
        if nics > m {
            return Err(format!("--nics {nics} is more than the machine's {m} NICs"));
        }
        return Ok(Some(format!(
            "--nics {nics} on a {m}-NIC machine: the VKE document recommends the whole machine or half of it \
             (4-NIC machine: 2 or 4; 8-NIC machine: 4 or 8), i.e. --nics {m} or {}",
            m / 2
        )));
    }
    Ok(None)
}

/// Thresholds a rendered Job runs its workload with on this platform, unless `--param`
/// says otherwise (only those the workload declares apply). The workload files' own
/// values only ask "does it work" in the soft-RoCE lab; these ask whether a real rail
/// performs: bandwidth relative to each port's active rate, so one Job fits a 25 Gb/s and a
/// 400 Gb/s NIC. Both platforms run RoCE v2 on ConnectX-class NICs, hence one set of values.
pub fn default_params(platform: Platform) -> &'static [(&'static str, f64, &'static str)] {
    const ROCE: &[(&str, f64, &str)] = &[
        (
            "min_line_rate_pct",
            80.0,
            "each rail's WRITE, READ and SEND bandwidth at 64 KiB, % of its port's active rate",
        ),
        ("max_rail_spread_pct", 10.0, "the slowest rail at most this % below the fastest (bandwidth; p50 for latency)"),
        ("max_write_p50_us", 10.0, "one-way WRITE latency p50 at 2 B, us (RoCE v2 across one switch: 2-5 us)"),
        ("max_write_p99_us", 50.0, "its p99, us"),
        ("max_read_p50_us", 15.0, "READ round trip p50 at 2 B, us"),
        ("max_send_p50_us", 10.0, "one-way SEND latency p50 at 2 B, us"),
    ];
    match platform {
        Platform::Vke | Platform::Ack => ROCE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_validates_with_a_known_profile() {
        for m in MODES {
            assert!(crate::validate::profiles::by_name(m.profile).is_some(), "{}", m.profile);
            assert_eq!(find(m.platform, m.name).unwrap(), m);
        }
        assert!(find(Platform::Ack, "shared-host").unwrap_err().contains("shared-hostnet"));
    }

    #[test]
    fn nic_count_rules_quote_the_documents() {
        let host = find(Platform::Vke, "shared-host").unwrap();
        let e = check_nics(host, 2, None).unwrap_err();
        assert!(e.contains("exactly one") && e.contains("--nics 1"), "{e}");
        let excl = find(Platform::Vke, "exclusive").unwrap();
        assert_eq!(check_nics(excl, 4, Some(8)), Ok(None));
        assert_eq!(check_nics(excl, 8, Some(8)), Ok(None));
        let w = check_nics(excl, 3, Some(8)).unwrap().unwrap();
        assert!(w.contains("whole machine or half") && w.contains("--nics 8 or 4"), "{w}");
        assert!(check_nics(excl, 9, Some(8)).is_err());
        let ack = find(Platform::Ack, "shared-hostnet").unwrap();
        assert_eq!(check_nics(ack, 3, Some(8)), Ok(None), "ACK requests rdma/hca: 1 whatever the count");
    }
}
