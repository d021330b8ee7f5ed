//! An opened device and port, checked for use: the port exists and is ACTIVE, a GID is
//! chosen, a protection domain is allocated, and the device limits are at hand.

use std::sync::Arc;

use sideway::ibverbs::device::DeviceInfo as _;
use sideway::ibverbs::device_context::DeviceContext;
use sideway::ibverbs::protection_domain::ProtectionDomain;

use super::gid::{self, GidChoice, SideChoice};
use super::inventory::{self, DeviceInfo, PortInfo};
use crate::error::{Error, Result};
use crate::spec::DeviceLimits;

/// The device flags: `-d`, `-i`, `-x`.
#[derive(Debug, Clone, Default)]
pub struct DeviceSelection {
    pub device: Option<String>,
    pub port: u8,
    pub gid_index: Option<u32>,
}

pub struct Rdma {
    // Field order is drop order: the PD goes before the context it lives in.
    pub pd: Arc<ProtectionDomain>,
    pub ctx: Arc<DeviceContext>,
    pub info: DeviceInfo,
    pub port: PortInfo,
    pub gid: GidChoice,
    pub max_qp_wr: u32,
    pub max_cqe: u32,
    pub max_qp_rd_atom: u32,
    /// atomic_cap is not NONE.
    pub atomics: bool,
}

impl Rdma {
    pub fn open(sel: &DeviceSelection) -> Result<Rdma> {
        let list = inventory::device_list()?;
        let names: Vec<String> = list.iter().map(|d| d.name()).collect();
        let dev = match &sel.device {
            Some(want) => list.iter().find(|d| &d.name() == want).ok_or_else(|| {
                Error::Environment(format!(
                    "no RDMA device named {want}; available: {} (see `rdmabench devices`)",
                    names.join(", ")
                ))
            })?,
            None => list.iter().next().expect("device_list() is never empty"),
        };
        let name = dev.name();
        let ctx = dev.open().map_err(|e| Error::Environment(format!("cannot open {name}: {:?}", e)))?;
        let info = inventory::describe(&ctx)?;
        let attr = ctx.query_device().map_err(|e| Error::Environment(format!("cannot query {name}: {e:?}")))?;
        let ports = attr.phys_port_cnt();
        if sel.port == 0 || sel.port > ports {
            return Err(Error::Usage(format!("{name} has no port {}; use -i 1..={ports}", sel.port)));
        }
        let port = info.ports[sel.port as usize - 1].clone();
        if !port.is_active() {
            return Err(Error::Environment(format!(
                "{name} port {} is {} ({}), not ACTIVE; check the cable/netdev (ip link) and `rdma link`",
                sel.port, port.state, port.phys_state
            )));
        }
        let gid = gid::choose(&name, sel.port, port.link_layer, port.gid_table_len, &port.gids, sel.gid_index)?;
        let pd = ctx
            .alloc_pd()
            .map_err(|e| Error::Environment(format!("cannot allocate a protection domain on {name}: {e:?}")))?;
        Ok(Rdma {
            pd,
            ctx,
            info,
            port,
            gid,
            max_qp_wr: attr.attr.orig_attr.max_qp_wr.max(0) as u32,
            max_cqe: attr.attr.orig_attr.max_cqe.max(0) as u32,
            max_qp_rd_atom: attr.attr.orig_attr.max_qp_rd_atom.max(0) as u32,
            atomics: attr.attr.orig_attr.atomic_cap != 0,
        })
    }

    pub fn name(&self) -> &str {
        &self.info.name
    }

    pub fn limits(&self, max_inline: u32) -> DeviceLimits {
        DeviceLimits {
            device: self.info.name.clone(),
            max_msg_size: self.port.max_msg_size,
            max_qp_wr: self.max_qp_wr,
            max_cqe: self.max_cqe,
            max_inline,
            active_mtu: self.port.active_mtu,
            max_qp_rd_atom: self.max_qp_rd_atom,
            atomics: self.atomics,
        }
    }

    /// The `-x` values a user could pass on this port, described.
    pub fn usable_gids(&self) -> Vec<String> {
        gid::usable(self.port.link_layer, &self.port.gids).iter().map(|g| g.describe()).collect()
    }

    pub fn gid_family(&self) -> gid::Family {
        match self.gid.gid.to_ipv4_mapped() {
            Some(_) => gid::Family::Ipv4,
            None => gid::Family::Ipv6,
        }
    }

    pub fn side_choice(&self, who: String) -> SideChoice {
        SideChoice {
            who,
            link: self.port.link_layer,
            kind: self.gid.kind,
            family: self.gid_family(),
            index: self.gid.index,
            gid: self.gid.gid.to_string(),
            usable: self.usable_gids(),
        }
    }
}

/// Opens `device`, registers `bytes` of memory and frees it again: the proof that this
/// process may register what a test needs (memlock, IPC_LOCK, the device's limits).
pub fn probe_registration(device: &str, bytes: usize) -> Result<()> {
    let list = inventory::device_list()?;
    let dev = list
        .iter()
        .find(|d| d.name() == device)
        .ok_or_else(|| Error::Environment(format!("{device} is not in the verbs device list")))?;
    let ctx = dev.open().map_err(|e| Error::Environment(format!("cannot open {device}: {e:?}")))?;
    let pd = ctx
        .alloc_pd()
        .map_err(|e| Error::Environment(format!("cannot allocate a protection domain on {device}: {e:?}")))?;
    super::RegisteredBuf::new(&pd, bytes, Default::default()).map(drop)
}
