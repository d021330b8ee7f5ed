//! What RDMA the process can see: devices, ports and GID tables, read through libibverbs,
//! plus each GID's netdev state from sysfs. Used by `rdmabench devices` and by the
//! device setup of every test.

use std::net::Ipv6Addr;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sideway::ibverbs::address::GidType;
use sideway::ibverbs::device::{DeviceInfo as _, DeviceList};
use sideway::ibverbs::device_context::DeviceContext;

use super::gid::{GidInfo, GidKind, LinkLayer};
use crate::error::{Error, Result};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub name: String,
    pub node_guid: String,
    pub sys_image_guid: String,
    pub ports: Vec<PortInfo>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PortInfo {
    pub port: u8,
    pub state: String,
    pub phys_state: String,
    pub link_layer: LinkLayer,
    pub active_mtu: u32,
    pub max_mtu: u32,
    pub lid: u16,
    /// Signalling rate in Gb/s (width x lane speed), when the device reports one.
    pub rate_gbps: Option<f64>,
    pub max_msg_size: u64,
    pub gid_table_len: u32,
    pub gids: Vec<GidInfo>,
}

impl PortInfo {
    pub fn is_active(&self) -> bool {
        self.state == "ACTIVE"
    }
}

/// Opens the device list, turning "this kernel has no RDMA" into a one-line error.
pub fn device_list() -> Result<DeviceList> {
    let list = DeviceList::new().map_err(|e| {
        let io = std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_else(|| e.to_string());
        Error::no_rdma(format!(
            "listing devices failed ({io}): this kernel has no RDMA support or libibverbs is missing"
        ))
    })?;
    if list.is_empty() {
        return Err(Error::no_rdma("libibverbs lists no device (ibv_get_device_list returned none)"));
    }
    Ok(list)
}

/// The names of the devices this process can open (libibverbs lists only those whose
/// verbs node it can reach: a pod sees only what its plugin gave it).
pub fn device_names() -> Result<Vec<String>> {
    Ok(device_list()?.iter().map(|d| d.name()).collect())
}

/// The NUMA node `device` hangs off, when sysfs says.
pub fn numa_node(device: &str) -> Option<i32> {
    std::fs::read_to_string(format!("/sys/class/infiniband/{device}/device/numa_node"))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .filter(|&n| n >= 0)
}

/// The device's firmware version as its driver reports it (sysfs `fw_ver`); None when it
/// reports none (soft-RoCE's is empty).
pub fn firmware_version(sysfs_root: &Path, device: &str) -> Option<String> {
    let text = std::fs::read_to_string(sysfs_root.join("sys/class/infiniband").join(device).join("fw_ver")).ok()?;
    let v = text.trim();
    (!v.is_empty()).then(|| v.to_string())
}

/// The kernel driver behind the device: its PCI function's driver (`mlx5_core`, `bnxt_en`)
/// with the module's version when the module states one (out-of-tree drivers such as
/// MLNX_OFED's do); for a software device, which has no function, the software driver
/// whose sysfs marks it (`rdma_rxe`: rxe devices alone have a `parent` netdev attribute).
pub fn driver(sysfs_root: &Path, device: &str) -> Option<String> {
    let dev = sysfs_root.join("sys/class/infiniband").join(device);
    let name = match std::fs::read_link(dev.join("device/driver")) {
        Ok(target) => target.file_name()?.to_string_lossy().into_owned(),
        Err(_) if dev.join("parent").exists() => "rdma_rxe".to_string(),
        Err(_) => return None,
    };
    let version = std::fs::read_to_string(sysfs_root.join("sys/module").join(&name).join("version")).ok();
    Some(match version.as_deref().map(str::trim) {
        Some(v) if !v.is_empty() => format!("{name} {v}"),
        _ => name,
    })
}

/// The running kernel's release (`uname -r`), from procfs.
pub fn kernel_release(root: &Path) -> Option<String> {
    let text = std::fs::read_to_string(root.join("proc/sys/kernel/osrelease")).ok()?;
    let v = text.trim();
    (!v.is_empty()).then(|| v.to_string())
}

/// A port's state as sysfs shows it ("4: ACTIVE" reads as "ACTIVE"), without opening the
/// device: for telling a link that went down from other failures.
/// Whether the PCIe function behind `device` lets the device use relaxed ordering (the
/// Device Control register's "Enable Relaxed Ordering" bit): what a relaxed-ordering
/// registration can achieve. None when there is no PCIe function (soft-RoCE) or its
/// config space is not readable past the first 64 bytes (that needs root).
pub fn pcie_relaxed_ordering(sysfs_root: &Path, device: &str) -> Option<bool> {
    let config = std::fs::read(sysfs_root.join("sys/class/infiniband").join(device).join("device/config")).ok()?;
    relaxed_ordering_enabled(&config)
}

/// The PCI Express capability's Device Control bit 4, found by walking the capability
/// list of a config space dump.
pub fn relaxed_ordering_enabled(config: &[u8]) -> Option<bool> {
    const STATUS_HAS_CAPS: u8 = 0x10;
    const PCI_EXPRESS: u8 = 0x10;
    if config.get(0x06)? & STATUS_HAS_CAPS == 0 {
        return None;
    }
    let mut at = (*config.get(0x34)? & 0xfc) as usize;
    // At most 48 capabilities fit in 256 bytes: a longer walk is a loop.
    for _ in 0..48 {
        if at < 0x40 {
            return None;
        }
        if *config.get(at)? == PCI_EXPRESS {
            let control = u16::from_le_bytes([*config.get(at + 8)?, *config.get(at + 9)?]);
            return Some(control & 0x10 != 0);
        }
        at = (*config.get(at + 1)? & 0xfc) as usize;
    }
    None
}

pub fn port_state_now(device: &str, port: u8) -> Option<String> {
    let text = std::fs::read_to_string(format!("/sys/class/infiniband/{device}/ports/{port}/state")).ok()?;
    Some(text.split(':').next_back().unwrap_or(&text).trim().to_string())
}

/// Every device with its ports and non-zero GIDs.
pub fn inventory() -> Result<Vec<DeviceInfo>> {
    let list = device_list()?;
    let mut out = Vec::new();
    for dev in list.iter() {
        let name = dev.name();
        let ctx = dev.open().map_err(|e| Error::Environment(format!("cannot open {name}: {e:?}")))?;
        out.push(describe(&ctx)?);
    }
    Ok(out)
}

pub fn describe(ctx: &Arc<DeviceContext>) -> Result<DeviceInfo> {
    let name = ctx.name();
    let attr = ctx.query_device().map_err(|e| Error::Environment(format!("cannot query {name}: {e:?}")))?;
    let gids = gid_table(ctx)?;
    let mut ports = Vec::new();
    for port in 1..=attr.phys_port_cnt() {
        let mut p = port_info(ctx, port)?;
        p.gids = gids.iter().filter(|(n, _)| *n == port).map(|(_, g)| g.clone()).collect();
        ports.push(p);
    }
    Ok(DeviceInfo {
        name,
        node_guid: guid_string(attr.attr.orig_attr.node_guid),
        sys_image_guid: guid_string(attr.attr.orig_attr.sys_image_guid),
        ports,
    })
}

/// One port's attributes (its GIDs are filled by `describe`).
pub fn port_info(ctx: &DeviceContext, port: u8) -> Result<PortInfo> {
    let name = ctx.name();
    let pa = ctx.query_port(port).map_err(|_| Error::Environment(format!("{name} has no port {port}")))?;
    let a = &pa.attr;
    Ok(PortInfo {
        port,
        state: port_state(a.state).into(),
        phys_state: phys_state(a.phys_state).into(),
        link_layer: if a.link_layer as u32 == 2 { LinkLayer::Ethernet } else { LinkLayer::InfiniBand },
        active_mtu: mtu_bytes(a.active_mtu),
        max_mtu: mtu_bytes(a.max_mtu),
        lid: a.lid,
        rate_gbps: rate_gbps(
            a.active_width,
            if a.active_speed_ex != 0 { a.active_speed_ex } else { a.active_speed as u32 },
        ),
        max_msg_size: a.max_msg_sz as u64,
        gid_table_len: a.gid_tbl_len.max(0) as u32,
        gids: Vec::new(),
    })
}

/// Non-zero GIDs of every port, as (port, entry).
pub fn gid_table(ctx: &DeviceContext) -> Result<Vec<(u8, GidInfo)>> {
    let name = ctx.name();
    let entries =
        ctx.query_gid_table().map_err(|e| Error::Environment(format!("cannot read the GID table of {name}: {e:?}")))?;
    Ok(entries
        .iter()
        .filter(|e| !e.gid().is_zero())
        .map(|e| {
            let netdev = e.netdev_name().ok().filter(|n| !n.is_empty());
            let netdev_up = netdev.as_deref().is_some_and(|n| netdev_is_up(Path::new("/"), n));
            let kind = match e.gid_type() {
                GidType::InfiniBand => GidKind::Ib,
                GidType::RoceV1 => GidKind::RoceV1,
                GidType::RoceV2 => GidKind::RoceV2,
            };
            (
                e.port_num() as u8,
                GidInfo { index: e.gid_index(), gid: Ipv6Addr::from(e.gid().raw), kind, netdev, netdev_up },
            )
        })
        .collect())
}

/// A netdev is up when it is administratively up (IFF_UP) and has carrier.
pub fn netdev_is_up(sysfs_root: &Path, netdev: &str) -> bool {
    let dir = sysfs_root.join("sys/class/net").join(netdev);
    let flags = std::fs::read_to_string(dir.join("flags"))
        .ok()
        .and_then(|f| u32::from_str_radix(f.trim().trim_start_matches("0x"), 16).ok())
        .unwrap_or(0);
    let carrier = std::fs::read_to_string(dir.join("carrier")).is_ok_and(|c| c.trim() == "1");
    flags & 1 != 0 && carrier
}

pub fn mtu_bytes(ibv_mtu: u32) -> u32 {
    match ibv_mtu {
        1..=5 => 128 << ibv_mtu,
        _ => 0,
    }
}

/// The `ibv_mtu` enum value for an MTU in bytes.
pub fn mtu_enum(bytes: u32) -> u32 {
    match bytes {
        256 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        _ => 5,
    }
}

fn port_state(s: u32) -> &'static str {
    match s {
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        5 => "ACTIVE_DEFER",
        _ => "NOP",
    }
}

fn phys_state(s: u8) -> &'static str {
    match s {
        1 => "SLEEP",
        2 => "POLLING",
        3 => "DISABLED",
        4 => "PORT_CONFIGURATION_TRAINING",
        5 => "LINK_UP",
        6 => "LINK_ERROR_RECOVERY",
        7 => "PHY_TEST",
        _ => "UNKNOWN",
    }
}

/// Width multiplier x per-lane rate, from the IBTA encodings of active_width/active_speed.
pub fn rate_gbps(width: u8, speed: u32) -> Option<f64> {
    let lanes = match width {
        1 => 1.0,
        2 => 4.0,
        4 => 8.0,
        8 => 12.0,
        16 => 2.0,
        _ => return None,
    };
    let lane = match speed {
        1 => 2.5,
        2 => 5.0,
        4 | 8 => 10.0,
        16 => 14.0,
        32 => 25.0,
        64 => 50.0,
        128 => 100.0,
        256 => 200.0,
        _ => return None,
    };
    Some(lanes * lane)
}

/// GUIDs as libibverbs prints them: four groups of four hex digits. The raw value is in
/// network byte order.
pub fn guid_string(raw_be: u64) -> String {
    let v = u64::from_be(raw_be);
    format!("{:04x}:{:04x}:{:04x}:{:04x}", v >> 48, (v >> 32) & 0xffff, (v >> 16) & 0xffff, v & 0xffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netdev_state_comes_from_flags_and_carrier() {
        let root = tempfile::tempdir().unwrap();
        let dev = root.path().join("sys/class/net/eth0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("flags"), "0x1003\n").unwrap();
        std::fs::write(dev.join("carrier"), "1\n").unwrap();
        assert!(netdev_is_up(root.path(), "eth0"));
        std::fs::write(dev.join("carrier"), "0\n").unwrap();
        assert!(!netdev_is_up(root.path(), "eth0"));
        std::fs::write(dev.join("carrier"), "1\n").unwrap();
        std::fs::write(dev.join("flags"), "0x1002\n").unwrap();
        assert!(!netdev_is_up(root.path(), "eth0"));
        assert!(!netdev_is_up(root.path(), "missing0"));
    }

    #[test]
    fn relaxed_ordering_is_read_from_the_pci_express_capability() {
        let mut config = vec![0u8; 256];
        config[0x06] = 0x10; // a capability list
        config[0x34] = 0x40;
        (config[0x40], config[0x41]) = (0x01, 0x60); // power management, then
        (config[0x60], config[0x61]) = (0x10, 0x00); // PCI Express, the last
        config[0x68] = 0x10; // Device Control: relaxed ordering enabled
        assert_eq!(relaxed_ordering_enabled(&config), Some(true));
        config[0x68] = 0x0f;
        assert_eq!(relaxed_ordering_enabled(&config), Some(false));
        assert_eq!(relaxed_ordering_enabled(&config[..64]), None, "a non-root read stops at 64 bytes");
        config[0x41] = 0x40; // a capability that points at itself
        assert_eq!(relaxed_ordering_enabled(&config), None);
        config[0x06] = 0;
        assert_eq!(relaxed_ordering_enabled(&config), None);
    }

    #[test]
    fn encodings() {
        assert_eq!(mtu_bytes(5), 4096);
        assert_eq!(mtu_bytes(1), 256);
        assert_eq!(mtu_enum(1024), 3);
        assert_eq!(rate_gbps(2, 32), Some(100.0));
        assert_eq!(rate_gbps(2, 128), Some(400.0));
        assert_eq!(rate_gbps(1, 1), Some(2.5));
        assert_eq!(guid_string(u64::from_be(0x0855_72ff_fe82_d23f)), "0855:72ff:fe82:d23f");
    }
}
