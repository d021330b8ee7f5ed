//! GID choice: which entry of a port's GID table a test uses, and whether two sides'
//! choices can talk to each other. Pure functions over plain data, tested on fixtures.
//!
//! Rule without `-x`: on Ethernet (RoCE), a RoCE v2 GID whose netdev is up, IPv4-mapped
//! preferred over IPv6, global IPv6 over link-local, lowest index first. On InfiniBand,
//! LID addressing without a GRH. Both sides must land on the same GID type and family;
//! a mismatch is an error naming both choices and the valid `-x` values.

use std::net::{Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum GidKind {
    #[serde(rename = "IB")]
    Ib,
    #[serde(rename = "RoCEv1")]
    RoceV1,
    #[serde(rename = "RoCEv2")]
    RoceV2,
}

impl GidKind {
    pub fn label(self) -> &'static str {
        match self {
            GidKind::Ib => "IB",
            GidKind::RoceV1 => "RoCEv1",
            GidKind::RoceV2 => "RoCEv2",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    Ipv4,
    Ipv6,
}

impl Family {
    pub fn label(self) -> &'static str {
        match self {
            Family::Ipv4 => "ipv4",
            Family::Ipv6 => "ipv6",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LinkLayer {
    InfiniBand,
    Ethernet,
}

impl LinkLayer {
    pub fn label(self) -> &'static str {
        match self {
            LinkLayer::InfiniBand => "InfiniBand",
            LinkLayer::Ethernet => "Ethernet",
        }
    }
}

/// One non-zero entry of a port's GID table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GidInfo {
    pub index: u32,
    pub gid: Ipv6Addr,
    pub kind: GidKind,
    pub netdev: Option<String>,
    pub netdev_up: bool,
}

impl GidInfo {
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        self.gid.to_ipv4_mapped()
    }

    pub fn family(&self) -> Family {
        if self.ipv4().is_some() { Family::Ipv4 } else { Family::Ipv6 }
    }

    fn is_link_local(&self) -> bool {
        self.gid.segments()[0] & 0xffc0 == 0xfe80
    }

    /// "-x 1 (RoCEv2 ipv4 10.77.0.1 on va)", for error messages.
    pub fn describe(&self) -> String {
        let addr = match self.ipv4() {
            Some(v4) => v4.to_string(),
            None => self.gid.to_string(),
        };
        let dev = self.netdev.as_deref().map(|d| format!(" on {d}")).unwrap_or_default();
        let down = if self.netdev_up { "" } else { ", netdev down" };
        format!("-x {} ({} {} {addr}{dev}{down})", self.index, self.kind.label(), self.family().label())
    }
}

/// The GID (or LID addressing) a side will use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidChoice {
    pub index: u32,
    pub gid: Ipv6Addr,
    pub kind: GidKind,
    /// False on InfiniBand without `-x`: address by LID, no GRH.
    pub use_grh: bool,
}

/// The GIDs a user could pass with `-x` on this port.
pub fn usable(link: LinkLayer, gids: &[GidInfo]) -> Vec<&GidInfo> {
    gids.iter()
        .filter(|g| match link {
            LinkLayer::Ethernet => g.kind == GidKind::RoceV2,
            LinkLayer::InfiniBand => true,
        })
        .collect()
}

fn list(gids: &[&GidInfo]) -> String {
    if gids.is_empty() {
        return "none".into();
    }
    gids.iter().map(|g| g.describe()).collect::<Vec<_>>().join(", ")
}

/// Picks the GID for `port` of `device` from its table. `requested` is `-x`.
pub fn choose(
    device: &str,
    port: u8,
    link: LinkLayer,
    table_len: u32,
    gids: &[GidInfo],
    requested: Option<u32>,
) -> Result<GidChoice> {
    let valid = usable(link, gids);
    if let Some(index) = requested {
        if index >= table_len {
            return Err(Error::Usage(format!(
                "GID index {index} is out of range for {device} port {port} (table of {table_len} entries); valid: {}",
                list(&valid)
            )));
        }
        let Some(entry) = gids.iter().find(|g| g.index == index) else {
            return Err(Error::Usage(format!(
                "GID index {index} of {device} port {port} is empty; valid: {}",
                list(&valid)
            )));
        };
        if link == LinkLayer::Ethernet && entry.kind != GidKind::RoceV2 {
            return Err(Error::Usage(format!(
                "GID index {index} of {device} port {port} is {}, rdmabench needs RoCE v2 on Ethernet; valid: {}",
                entry.kind.label(),
                list(&valid)
            )));
        }
        return Ok(GidChoice { index, gid: entry.gid, kind: entry.kind, use_grh: true });
    }

    if link == LinkLayer::InfiniBand {
        let gid = gids.iter().find(|g| g.index == 0).map_or(Ipv6Addr::UNSPECIFIED, |g| g.gid);
        return Ok(GidChoice { index: 0, gid, kind: GidKind::Ib, use_grh: false });
    }

    let rank = |g: &GidInfo| match (g.family(), g.is_link_local()) {
        (Family::Ipv4, _) => 0,
        (Family::Ipv6, false) => 1,
        (Family::Ipv6, true) => 2,
    };
    valid
        .iter()
        .filter(|g| g.netdev_up)
        .min_by_key(|g| (rank(g), g.index))
        .map(|g| GidChoice { index: g.index, gid: g.gid, kind: g.kind, use_grh: true })
        .ok_or_else(|| {
            Error::Environment(format!(
                "no RoCE v2 GID with an up netdev on {device} port {port} (GIDs: {}); \
                 bring the netdev up and give it an IP address, or pass -x",
                list(&gids.iter().collect::<Vec<_>>())
            ))
        })
}

/// One side's choice as the other side sees it, for the pair check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SideChoice {
    pub who: String,
    pub link: LinkLayer,
    pub kind: GidKind,
    pub family: Family,
    pub index: u32,
    pub gid: String,
    pub usable: Vec<String>,
}

/// Both sides must use the same link layer, GID type and address family.
pub fn check_pair(local: &SideChoice, remote: &SideChoice) -> Result<()> {
    if local.link != remote.link {
        return Err(Error::Usage(format!(
            "link layers differ: {} is {} but {} is {}; both ports must be on the same fabric",
            local.who,
            local.link.label(),
            remote.who,
            remote.link.label()
        )));
    }
    if local.link == LinkLayer::InfiniBand && local.kind == GidKind::Ib && remote.kind == GidKind::Ib {
        return Ok(());
    }
    if local.kind != remote.kind || local.family != remote.family {
        return Err(Error::Usage(format!(
            "GID mismatch: {} uses GID index {} ({} {} {}) but {} uses GID index {} ({} {} {}); \
             both sides must use the same GID type and family. Valid -x values on {}: [{}]; on {}: [{}]",
            local.who,
            local.index,
            local.kind.label(),
            local.family.label(),
            local.gid,
            remote.who,
            remote.index,
            remote.kind.label(),
            remote.family.label(),
            remote.gid,
            local.who,
            local.usable.join(", "),
            remote.who,
            remote.usable.join(", ")
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid(index: u32, addr: &str, kind: GidKind, up: bool) -> GidInfo {
        GidInfo { index, gid: addr.parse().unwrap(), kind, netdev: Some("eth0".into()), netdev_up: up }
    }

    /// A typical RoCE port: v1 and v2 for link-local, then v1 and v2 for an IPv4 address,
    /// then v1 and v2 for a global IPv6 address (mlx5 layout).
    fn roce_table() -> Vec<GidInfo> {
        vec![
            gid(0, "fe80::1", GidKind::RoceV1, true),
            gid(1, "fe80::1", GidKind::RoceV2, true),
            gid(2, "::ffff:10.0.0.5", GidKind::RoceV1, true),
            gid(3, "::ffff:10.0.0.5", GidKind::RoceV2, true),
            gid(4, "2001:db8::5", GidKind::RoceV1, true),
            gid(5, "2001:db8::5", GidKind::RoceV2, true),
        ]
    }

    #[test]
    fn prefers_ipv4_mapped_roce_v2() {
        let c = choose("mlx5_0", 1, LinkLayer::Ethernet, 256, &roce_table(), None).unwrap();
        assert_eq!((c.index, c.kind, c.use_grh), (3, GidKind::RoceV2, true));
    }

    #[test]
    fn rxe_layout_picks_index_1() {
        let t = vec![
            gid(0, "fe80::a8f5:7aff:fe62:1", GidKind::RoceV2, true),
            gid(1, "::ffff:10.77.0.1", GidKind::RoceV2, true),
        ];
        assert_eq!(choose("rxe0", 1, LinkLayer::Ethernet, 1024, &t, None).unwrap().index, 1);
    }

    #[test]
    fn skips_gids_whose_netdev_is_down() {
        let mut t = roce_table();
        t[3].netdev_up = false;
        let c = choose("mlx5_0", 1, LinkLayer::Ethernet, 256, &t, None).unwrap();
        assert_eq!(c.index, 5, "global IPv6 RoCE v2 is next best");
    }

    #[test]
    fn global_ipv6_beats_link_local() {
        let t: Vec<_> = roce_table().into_iter().filter(|g| g.family() == Family::Ipv6).collect();
        assert_eq!(choose("mlx5_0", 1, LinkLayer::Ethernet, 256, &t, None).unwrap().index, 5);
    }

    #[test]
    fn no_usable_gid_is_an_environment_error_listing_the_table() {
        let t = vec![gid(0, "fe80::1", GidKind::RoceV1, true), gid(1, "::ffff:10.0.0.5", GidKind::RoceV2, false)];
        let e = choose("mlx5_0", 1, LinkLayer::Ethernet, 256, &t, None).unwrap_err();
        assert_eq!(e.exit_code(), 3);
        assert!(e.to_string().contains("netdev down"), "{e}");
    }

    #[test]
    fn explicit_index_out_of_range_empty_or_v1_is_a_usage_error_with_valid_values() {
        let t = roce_table();
        let e = choose("mlx5_0", 1, LinkLayer::Ethernet, 256, &t, Some(300)).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("out of range") && e.to_string().contains("-x 3"), "{e}");
        let e = choose("mlx5_0", 1, LinkLayer::Ethernet, 256, &t, Some(9)).unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
        let e = choose("mlx5_0", 1, LinkLayer::Ethernet, 256, &t, Some(2)).unwrap_err();
        let m = e.to_string();
        assert!(m.contains("RoCEv1") && m.contains("-x 1") && m.contains("-x 3") && m.contains("-x 5"), "{m}");
        assert!(!m.contains("-x 0 "), "v1 entries are not offered: {m}");
        assert_eq!(choose("mlx5_0", 1, LinkLayer::Ethernet, 256, &t, Some(5)).unwrap().index, 5);
    }

    #[test]
    fn infiniband_uses_lid_addressing_unless_x_is_given() {
        let t = vec![gid(0, "fe80::2:c903:1", GidKind::Ib, true)];
        let c = choose("mlx4_0", 1, LinkLayer::InfiniBand, 128, &t, None).unwrap();
        assert!(!c.use_grh);
        let c = choose("mlx4_0", 1, LinkLayer::InfiniBand, 128, &t, Some(0)).unwrap();
        assert!(c.use_grh);
    }

    fn side(who: &str, kind: GidKind, family: Family, index: u32) -> SideChoice {
        SideChoice {
            who: who.into(),
            link: LinkLayer::Ethernet,
            kind,
            family,
            index,
            gid: "x".into(),
            usable: vec!["-x 1 (RoCEv2 ipv4 10.0.0.1)".into(), "-x 0 (RoCEv2 ipv6 fe80::1)".into()],
        }
    }

    #[test]
    fn pair_mismatch_names_both_sides_and_valid_indexes() {
        let a = side("this side (node a)", GidKind::RoceV2, Family::Ipv4, 3);
        let b = side("peer b", GidKind::RoceV2, Family::Ipv6, 1);
        let e = check_pair(&a, &b).unwrap_err();
        let m = e.to_string();
        assert_eq!(e.exit_code(), 2);
        for part in ["node a", "peer b", "index 3", "index 1", "ipv4", "ipv6", "-x 1 (RoCEv2 ipv4"] {
            assert!(m.contains(part), "missing {part:?} in {m}");
        }
        check_pair(&a, &side("peer b", GidKind::RoceV2, Family::Ipv4, 7)).unwrap();
    }

    #[test]
    fn pair_of_different_link_layers_is_refused() {
        let a = side("a", GidKind::RoceV2, Family::Ipv4, 1);
        let mut b = side("b", GidKind::Ib, Family::Ipv6, 0);
        b.link = LinkLayer::InfiniBand;
        assert!(check_pair(&a, &b).unwrap_err().to_string().contains("link layers differ"));
    }
}
