//! The connected pair of resources a test runs on: device, registered buffer, QP, and
//! both endpoints, agreed over the session. Both sides derive the buffer layout from
//! the spec alone, so nothing else needs negotiating.
//!
//! Buffer layout: `[send region | receive region]`, each `region_len(spec)` bytes. A side
//! writes from its send region into the peer's receive region.

use crate::bench::spec::{Measure, TestSpec, check_against_device};
use crate::error::{Error, Result};
use crate::report::{Environment, PeerEnvironment};
use crate::session::{Channel, Endpoint, Message};
use crate::stats::Clock;
use crate::verbs::gid::{self, Family, GidKind, LinkLayer, SideChoice};
use crate::verbs::{DeviceSelection, RcQp, Rdma, RegisteredBuf};

/// Validated bandwidth runs cycle over this much memory per side at most, so each
/// in-flight message has its own slot and can be checked where it lands.
const VALIDATE_BW_BYTES: u64 = 64 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

pub struct Link {
    // Drop order: QP, then buffer, then device (PD before context).
    pub qp: RcQp,
    pub buf: RegisteredBuf,
    pub rdma: Rdma,
    pub local: Endpoint,
    pub remote: Endpoint,
    pub region: usize,
    pub slots: u64,
    pub inline_size: u32,
    pub mtu: u32,
}

/// Slots per region: one, except for validated bandwidth runs (one per in-flight message).
pub fn slots(spec: &TestSpec) -> u64 {
    if spec.measure == Measure::Bandwidth && spec.validate_data {
        (VALIDATE_BW_BYTES / spec.max_size().max(1)).clamp(1, spec.tx_depth.max(1) as u64)
    } else {
        1
    }
}

pub fn region_len(spec: &TestSpec) -> usize {
    (spec.max_size() * slots(spec)).next_multiple_of(64) as usize
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// Local resources, ready to be connected: opened and checked before any peer is
/// involved, so bad flags fail at once, without a server.
pub struct Prepared {
    qp: RcQp,
    buf: RegisteredBuf,
    rdma: Rdma,
    local: Endpoint,
    region: usize,
    slots: u64,
    inline_size: u32,
}

impl Prepared {
    /// Opens the device, checks the spec against its limits, registers the buffer and
    /// creates the QP.
    pub fn new(spec: &TestSpec, sel: &DeviceSelection) -> Result<Prepared> {
        let rdma = Rdma::open(sel)?;
        let max_inline = RcQp::probe_max_inline(&rdma)?;
        check_against_device(spec, &rdma.limits(max_inline))?;
        let inline_size = spec.requested_inline().min(max_inline);
        let region = region_len(spec);
        let buf = RegisteredBuf::new(&rdma.pd, 2 * region)?;
        let qp = RcQp::create(&rdma, spec.tx_depth, 1, inline_size)?;
        let local = Endpoint {
            node: hostname(),
            device: rdma.name().to_string(),
            port: rdma.port.port,
            link_layer: rdma.port.link_layer.label().into(),
            lid: rdma.port.lid,
            gid_index: rdma.gid.index,
            gid: rdma.gid.gid.to_string(),
            gid_type: rdma.gid.kind.label().into(),
            gid_family: rdma.gid_family().label().into(),
            usable_gids: rdma.usable_gids(),
            qpn: qp.qpn(),
            psn: qp.psn,
            active_mtu: rdma.port.active_mtu,
            addr: buf.addr(),
            rkey: buf.rkey(),
            buf_len: buf.len() as u64,
            max_inline,
        };
        Ok(Prepared { qp, buf, rdma, local, region, slots: slots(spec), inline_size })
    }

    /// Swaps endpoints with the peer, checks the pair and connects the QP. Any failure
    /// is sent to the peer as an abort, so both sides end with the same reason.
    pub fn connect(self, role: Role, spec: &TestSpec, chan: &mut Channel) -> Result<Link> {
        self.try_connect(role, spec, chan).inspect_err(|e| {
            if !matches!(e, Error::Peer(_)) {
                chan.abort(e);
            }
        })
    }

    fn try_connect(self, role: Role, spec: &TestSpec, chan: &mut Channel) -> Result<Link> {
        let Prepared { mut qp, buf, rdma, local, region, slots, inline_size } = self;
        let remote = match role {
            Role::Client => {
                chan.send(&Message::Endpoint(Box::new(local.clone())))?;
                expect_endpoint(chan)?
            }
            Role::Server => {
                let r = expect_endpoint(chan)?;
                chan.send(&Message::Endpoint(Box::new(local.clone())))?;
                r
            }
        };
        if remote.buf_len < 2 * region as u64 {
            return Err(Error::Peer(format!(
                "{} registered {} bytes but this test needs {}; the two sides disagree on the spec",
                chan.peer(),
                remote.buf_len,
                2 * region
            )));
        }
        let me = format!("this side ({}, {} port {})", local.node, local.device, local.port);
        let them = format!("{} ({} port {})", chan.peer(), remote.device, remote.port);
        gid::check_pair(&rdma.side_choice(me), &side_of(&remote, them)?)?;

        let mtu = match spec.mtu {
            Some(m) if m > remote.active_mtu => {
                return Err(Error::Usage(format!(
                    "MTU {m} exceeds the peer's active MTU {} ({} port {}); use -m {} or less",
                    remote.active_mtu, remote.device, remote.port, remote.active_mtu
                )));
            }
            Some(m) => m,
            None => local.active_mtu.min(remote.active_mtu),
        };
        qp.connect(&rdma, &remote, mtu)?;
        Ok(Link { qp, buf, rdma, local, remote, region, slots, inline_size, mtu })
    }
}

impl Link {
    /// Offset in the local buffer where the peer's writes land.
    pub fn recv_offset(&self) -> usize {
        self.region
    }

    /// Address in the peer's buffer where this side's writes land.
    pub fn remote_recv_addr(&self) -> u64 {
        self.remote.addr + self.region as u64
    }

    pub fn environment(&self, peer_address: &str) -> Environment {
        Environment {
            tool_version: env!("CARGO_PKG_VERSION").into(),
            host: self.local.node.clone(),
            device: self.local.device.clone(),
            port: self.local.port,
            link_layer: self.local.link_layer.clone(),
            gid_index: self.local.gid_index,
            gid: self.local.gid.clone(),
            gid_type: self.local.gid_type.clone(),
            mtu: self.mtu,
            active_mtu: self.local.active_mtu,
            inline_size: self.inline_size,
            max_inline: self.local.max_inline,
            peer: PeerEnvironment {
                host: self.remote.node.clone(),
                address: peer_address.into(),
                device: self.remote.device.clone(),
                port: self.remote.port,
                gid_index: self.remote.gid_index,
                gid: self.remote.gid.clone(),
            },
        }
    }
}

/// What a measurement kernel needs for one message size. The control channel is passed
/// beside it, since the kernels need it mutably.
#[derive(Clone, Copy)]
pub struct SizeRun<'a> {
    pub link: &'a Link,
    pub spec: &'a TestSpec,
    pub size: u64,
    pub clock: &'a Clock,
    /// Longest wait for the peer, in nanoseconds.
    pub timeout_ns: u64,
}

fn expect_endpoint(chan: &mut Channel) -> Result<Endpoint> {
    match chan.recv("the peer's endpoint")? {
        Message::Endpoint(e) => Ok(*e),
        other => Err(Error::Peer(format!("{} sent {} instead of its endpoint", chan.peer(), other.kind()))),
    }
}

fn side_of(e: &Endpoint, who: String) -> Result<SideChoice> {
    let bad = |what: &str| Error::Peer(format!("the peer sent an unknown {what} in its endpoint"));
    Ok(SideChoice {
        who,
        link: match e.link_layer.as_str() {
            "Ethernet" => LinkLayer::Ethernet,
            "InfiniBand" => LinkLayer::InfiniBand,
            _ => return Err(bad("link layer")),
        },
        kind: match e.gid_type.as_str() {
            "RoCEv2" => GidKind::RoceV2,
            "RoCEv1" => GidKind::RoceV1,
            "IB" => GidKind::Ib,
            _ => return Err(bad("GID type")),
        },
        family: if e.gid_family == "ipv4" { Family::Ipv4 } else { Family::Ipv6 },
        index: e.gid_index,
        gid: e.gid.clone(),
        usable: e.usable_gids.clone(),
    })
}
