//! `NCCL_IB_HCA` and `NCCL_IB_GID_INDEX` chosen exactly as the VKE document's
//! `nccl_env.sh` chooses them: for every device, port and GID (in `ls` order) keep a GID
//! whose first group is `0000` (IPv4-mapped), not all zeros, of type RoCE v2, whose
//! netdev has `dev_id`, carrier 1 and MTU > 1500; among those keep the ports of the
//! highest rate (the rate's first number); they must share one GID index.
//!
//! Where we differ from the script, on purpose:
//! - A port with two qualifying GIDs (two IPv4 addresses on its netdev) is listed once,
//!   not twice, and the index chosen is the smallest one every selected port has; the
//!   script lists `dev:port` twice and calls the indexes inconsistent.
//! - Rates are compared as numbers, so `2.5 Gb/sec` works (bash's `-gt` fails on it).
//! - The failure messages name each device, port and index instead of one line.
//! - Only devices this process can open count: those with a verbs node
//!   (`/dev/infiniband/uverbsN`). A shared-mode pod sees every device of the node in sysfs
//!   but only its own verbs nodes; the script would hand NCCL devices it cannot open. The
//!   others are reported as `skipped`.

use std::collections::BTreeSet;

use serde::Serialize;

use super::sysfs::{Gid, Tree};
use crate::error::{Error, Result};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NcclEnv {
    /// `dev:port` in device order.
    pub hca: Vec<String>,
    pub gid_index: u32,
    pub rate_gbps: f64,
    /// Devices sysfs shows that this process cannot open (no verbs node): not for NCCL.
    pub skipped: Vec<String>,
}

impl NcclEnv {
    pub fn vars(&self) -> [(&'static str, String); 2] {
        [("NCCL_IB_HCA", self.hca.join(",")), ("NCCL_IB_GID_INDEX", self.gid_index.to_string())]
    }
}

/// One port with the GID indexes that qualify on it.
struct Candidate {
    hca: String,
    indexes: BTreeSet<u32>,
    rate: f64,
}

/// The script's filter for one GID.
fn qualifies(tree: &Tree, g: &Gid) -> bool {
    if !g.text.starts_with("0000:") || g.is_zero() || !g.is_roce_v2() {
        return false;
    }
    let Some(nd) = g.ndev.as_deref() else { return false };
    match tree.netdev(nd) {
        Some(n) => n.has_dev_id && n.carrier == Some(true) && n.mtu.is_some_and(|m| m > 1500),
        None => false,
    }
}

pub fn compute(tree: &Tree) -> Result<NcclEnv> {
    let all = tree.rdma_devices();
    if all.is_empty() {
        return Err(Error::no_rdma(format!("no device under {}", tree.sys.join("class/infiniband").display())));
    }
    let openable = |d: &&super::sysfs::RdmaDevice| d.uverbs.as_deref().is_some_and(|u| tree.char_device_present(u));
    let (devices, skipped): (Vec<_>, Vec<_>) = all.iter().partition(openable);
    let skipped: Vec<String> = skipped.iter().map(|d| d.name.clone()).collect();
    if devices.is_empty() {
        return Err(Error::no_rdma(format!(
            "{} device(s) in sysfs ({}) but no verbs node for any under {} (the pod was given none)",
            skipped.len(),
            skipped.join(", "),
            tree.dev.join("infiniband").display()
        )));
    }
    let mut candidates = Vec::new();
    for d in &devices {
        for p in &d.ports {
            let indexes: BTreeSet<u32> = p.gids.iter().filter(|g| qualifies(tree, g)).map(|g| g.index).collect();
            if !indexes.is_empty() {
                // A port without a numeric rate counts as the slowest, as an empty rate
                // never wins the script's comparison.
                let rate = p.rate_gbps.unwrap_or(0.0);
                candidates.push(Candidate { hca: format!("{}:{}", d.name, p.num), indexes, rate });
            }
        }
    }
    if candidates.is_empty() {
        return Err(Error::Environment(format!(
            "Not found RDMA device: none of {} has an IPv4-mapped RoCE v2 GID whose netdev has dev_id, carrier 1 \
             and MTU > 1500; check `rdmabench validate --profile generic` for the reason per device",
            devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join(", ")
        )));
    }
    let top = candidates.iter().map(|c| c.rate).fold(f64::MIN, f64::max);
    let fastest: Vec<&Candidate> = candidates.iter().filter(|c| c.rate == top).collect();
    let common = fastest.iter().skip(1).fold(fastest[0].indexes.clone(), |acc, c| &acc & &c.indexes);
    let Some(&gid_index) = common.first() else {
        let each = fastest
            .iter()
            .map(|c| format!("{} index {}", c.hca, c.indexes.iter().map(u32::to_string).collect::<Vec<_>>().join("/")))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(Error::Check(format!(
            "rdma devs index inconsistent: {each}; NCCL needs one GID index for all of them. Recreate the pod (a \
             leaked NIC shifts indexes) or set NCCL_IB_HCA to the devices that agree"
        )));
    };
    Ok(NcclEnv { hca: fastest.iter().map(|c| c.hca.clone()).collect(), gid_index, rate_gbps: top, skipped })
}
