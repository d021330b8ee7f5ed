//! The connected pair of resources a test runs on: device, registered buffer, QP, and
//! both endpoints, agreed over the session. Both sides derive the buffer layout from
//! the spec alone, so nothing else needs negotiating.
//!
//! Buffer layout (`Layout`): `[send region | receive region]`. A side writes (or sends)
//! from its send region into the peer's receive region; RDMA READ fetches the peer's
//! send region into the local receive region; atomics target the first 8 bytes of the
//! peer's receive region and return the old value into the local send region.
//!
//! Also the waits on the pair (`wait`): spinning with a deadline, the send window, posted
//! receives. Beneath both the benchmark kernels (`bench`) and the ring library (`ring`).

pub mod wait;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::report::{Environment, MemoryReport, PeerEnvironment};
use crate::session::{Channel, Message, proto};
use crate::spec::ring::{self, Notify};
use crate::spec::{Fabric, Measure, Operation, TestSpec, check_against_device};
use crate::stats::Clock;
use crate::verbs::buffer::MemoryOptions;
use crate::verbs::cm::{self, CmConnection, CmListener};
use crate::verbs::counters;
use crate::verbs::gid::{self, Family, GidKind, LinkLayer, SideChoice};
use crate::verbs::inventory;
use crate::verbs::qp::{GRH_BYTES, PathParams};
use crate::verbs::{DeviceSelection, Qp, QpCaps, Rdma, RecvRequest, RegisteredBuf, Transport};
use crate::verbs::{Endpoint, NicIdentity};
use wait::{RecvRing, SendWindow};

/// Validated bandwidth runs cycle over this much memory per region at most, so each
/// in-flight message has its own slot and can be checked where it lands.
const VALIDATE_BW_BYTES: u64 = 64 << 20;
const ALIGN: u64 = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

/// Where messages live in the registered buffer. Both sides compute it from the spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub send_slot: u64,
    pub send_slots: u64,
    /// Offset of the receive region.
    pub recv_offset: u64,
    pub recv_slot: u64,
    pub recv_slots: u64,
    /// Receives kept posted (send and write-with-immediate tests).
    pub rx_depth: u32,
    /// Where a received payload starts inside its slot (after the GRH on UD).
    pub recv_payload: u64,
}

impl Layout {
    pub fn new(spec: &TestSpec) -> Layout {
        if let Some(ring) = spec.ring_layout() {
            // The ring lays out the whole buffer itself; receives only announce writes.
            let rx_depth = match spec.ring.map(|r| (r.notify, r.wait)) {
                Some((Notify::Imm, _)) => spec.rx_depth,
                Some((Notify::Poll, ring::Wait::Sleep | ring::Wait::Adaptive)) => ring::WAKE_RECEIVES,
                _ => 0,
            };
            return Layout {
                send_slot: ring.total,
                send_slots: 1,
                recv_offset: ring.total,
                recv_slot: 0,
                recv_slots: 0,
                rx_depth,
                recv_payload: 0,
            };
        }
        let max = spec.max_size().max(1);
        let validate_bw = spec.measure == Measure::Bandwidth && spec.validate_data;
        let slots_for = |slot: u64, cap: u32| (VALIDATE_BW_BYTES / slot).clamp(1, cap.max(1) as u64);
        let send_slot = max.next_multiple_of(8);
        let send_slots = if validate_bw || (spec.operation == Operation::Atomic && spec.measure == Measure::Bandwidth) {
            slots_for(send_slot, spec.tx_depth)
        } else {
            1
        };
        let grh = if spec.transport == Transport::Ud { GRH_BYTES } else { 0 };
        let recv_slot = (max + grh).next_multiple_of(8);
        let (recv_slots, rx_depth) = if spec.uses_receives() {
            if validate_bw {
                // Every posted receive needs its own slot until it is checked.
                let n = slots_for(recv_slot, spec.rx_depth);
                (n, n as u32)
            } else {
                (1, spec.rx_depth)
            }
        } else {
            (send_slots, 0)
        };
        let recv_offset = (send_slot * send_slots).next_multiple_of(ALIGN);
        Layout { send_slot, send_slots, recv_offset, recv_slot, recv_slots, rx_depth, recv_payload: grh }
    }

    pub fn total_len(&self) -> usize {
        (self.recv_offset + self.recv_slot * self.recv_slots).next_multiple_of(ALIGN) as usize
    }

    pub fn send_at(&self, slot: u64) -> u64 {
        slot * self.send_slot
    }

    pub fn recv_at(&self, slot: u64) -> u64 {
        self.recv_offset + slot * self.recv_slot
    }
}

/// The registered memory a spec makes one side take: every lane's buffer, page-rounded
/// as `RegisteredBuf` maps it (rings included: their layout is the buffer). Computed from
/// the spec alone, before anything is allocated, for `--max-memory`. Saturates instead of
/// wrapping on a spec `TestSpec::check` would refuse.
pub fn memory_need(spec: &TestSpec) -> u64 {
    let page = RegisteredBuf::page_bytes(memory_options(spec));
    let per_lane = RegisteredBuf::mapped_len(Layout::new(spec).total_len(), page) as u64;
    per_lane.saturating_mul(spec.lanes() as u64)
}

/// Whether the QPs need a completion channel: `-e`, or a ring whose waits may sleep.
fn sleeps(spec: &TestSpec) -> bool {
    spec.events || spec.ring.is_some_and(|r| r.wait != ring::Wait::Spin)
}

/// How the spec wants this side's buffers backed and registered.
pub fn memory_options(spec: &TestSpec) -> MemoryOptions {
    MemoryOptions { relaxed_ordering: spec.relaxed_ordering, huge_pages: spec.hugepages, on_demand: spec.odp }
}

/// The verbs' path parameters of a spec's fabric fields (checked to fit by `TestSpec::check`).
fn path_params(f: &Fabric) -> PathParams {
    let byte = |v: u32| u8::try_from(v).unwrap_or(u8::MAX);
    PathParams {
        traffic_class: byte(f.traffic_class),
        service_level: byte(f.service_level),
        flow_label: f.flow_label,
        hop_limit: byte(f.hop_limit),
        ack_timeout: byte(f.qp_timeout),
        retry_count: byte(f.retry_count),
        rnr_retry: byte(f.rnr_retry),
    }
}

pub struct Link {
    // Drop order: QP, then buffer, then device (PD before context).
    pub qp: Qp,
    pub buf: RegisteredBuf,
    pub rdma: Arc<Rdma>,
    pub local: Endpoint,
    pub remote: Endpoint,
    pub layout: Layout,
    pub inline_size: u32,
    pub mtu: u32,
    /// The posted receives of send and write-with-immediate tests; they live across sizes.
    pub receives: Mutex<Option<RecvRing>>,
    /// The ping-pong's send window: what is still in the QP's send queue lives across
    /// sizes and passes too. A pass ends when the last reply arrived, which can be before
    /// this side's last message is acknowledged (an ACK delayed or lost and resent): a
    /// fresh window for the next pass would take that queue for empty and post beyond it
    /// (rxe: ibv_post_send fails with ENOMEM at tx depth 1).
    pub sends: Mutex<Option<SendWindow>>,
    /// With `-R`: the rdma_cm connection, disconnected when the link goes.
    _cm: Option<CmConnection>,
}

/// Local resources, ready to be connected: opened and checked before any peer is
/// involved, so bad flags fail at once, without a server. One lane (QP, buffer, endpoint)
/// per `-q` QP, all on one device and protection domain.
pub struct Prepared {
    lanes: Vec<(Qp, RegisteredBuf, Endpoint)>,
    rdma: Arc<Rdma>,
    layout: Layout,
    inline_size: u32,
    rd_atomic: u32,
}

impl Prepared {
    /// Opens the device, checks the spec against its limits, registers the buffers and
    /// creates the QPs.
    pub fn new(spec: &TestSpec, sel: &DeviceSelection) -> Result<Prepared> {
        let rdma = Rdma::open(sel)?;
        let max_inline = Qp::probe_max_inline(&rdma, spec.transport)?;
        check_against_device(spec, &rdma.limits(max_inline))?;
        let inline_size = spec.requested_inline().min(max_inline);
        let layout = Layout::new(spec);
        let caps = QpCaps {
            send_depth: spec.tx_depth,
            recv_depth: layout.rx_depth,
            inline: inline_size,
            events: sleeps(spec),
        };
        let rd_atomic = match spec.operation {
            Operation::Read | Operation::Atomic => spec.effective_outstanding_reads(rdma.max_qp_rd_atom),
            _ => 1,
        }
        .min(255);
        let mut lanes = Vec::with_capacity(spec.lanes() as usize);
        for _ in 0..spec.lanes() {
            let buf = RegisteredBuf::new(&rdma.pd, layout.total_len(), memory_options(spec))?;
            let mut qp = Qp::create(&rdma, spec.transport, caps)?;
            qp.set_path(path_params(&spec.fabric));
            let local = Endpoint {
                node: crate::names::this_host(),
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
                nic: nic_identity(&rdma),
                cm_addr: None,
            };
            lanes.push((qp, buf, local));
        }
        Ok(Prepared { lanes, rdma: Arc::new(rdma), layout, inline_size, rd_atomic })
    }

    /// Swaps endpoints with the peer (one per QP), checks the pair and connects the QPs.
    /// Any failure is sent to the peer as an abort, so both sides end with the same reason.
    pub fn connect(self, role: Role, spec: &TestSpec, chan: &mut Channel) -> Result<Vec<Link>> {
        self.try_connect(role, spec, chan).inspect_err(|e| {
            if !matches!(e, Error::Peer(_)) {
                chan.abort(e);
            }
        })
    }

    fn try_connect(self, role: Role, spec: &TestSpec, chan: &mut Channel) -> Result<Vec<Link>> {
        let Prepared { lanes, rdma, layout, inline_size, rd_atomic } = self;
        let listener = match role {
            Role::Server if spec.rdma_cm => Some(CmListener::listen(&rdma, spec.fabric.traffic_class as u8)?),
            _ => None,
        };
        let mut links = Vec::with_capacity(lanes.len());
        for (mut qp, buf, mut local) in lanes {
            local.cm_addr = listener.as_ref().map(|l| l.address.to_string());
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
            if remote.buf_len < layout.total_len() as u64 {
                return Err(Error::Peer(format!(
                    "{} registered {} bytes but this test needs {}; the two sides disagree on the spec",
                    chan.peer(),
                    remote.buf_len,
                    layout.total_len()
                )));
            }
            // Every remote address is `addr + offset` with offset < buf_len: it cannot wrap.
            if remote.addr.checked_add(remote.buf_len).is_none() {
                return Err(Error::Peer(format!(
                    "{} sent a buffer of {} bytes at {:#x}, which wraps the address space",
                    chan.peer(),
                    remote.buf_len,
                    remote.addr
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
            let rd_atomic = rd_atomic as u8;
            let timeout = chan.timeout();
            let cm = match (&listener, role) {
                (Some(l), _) => {
                    let mut wait = cm::CmWait { timeout, watch: &mut |w: &str| chan.keep_early(w) };
                    Some(l.accept(&rdma, &qp, remote.qpn, rd_atomic, spec.mtu, &mut wait)?)
                }
                (None, Role::Client) if spec.rdma_cm => {
                    let announced = remote
                        .cm_addr
                        .as_deref()
                        .ok_or_else(|| Error::Peer(format!("{} offered no rdma_cm address for -R", chan.peer())))?;
                    let dst = cm::target(announced, &rdma)?;
                    let mut wait = cm::CmWait { timeout, watch: &mut |w: &str| chan.keep_early(w) };
                    Some(cm::connect(&rdma, &qp, dst, rd_atomic, spec.mtu, &mut wait)?)
                }
                _ => {
                    qp.connect(&rdma, &remote, mtu, rd_atomic)?;
                    None
                }
            };
            let link = Link {
                qp,
                buf,
                rdma: Arc::clone(&rdma),
                local,
                remote,
                layout,
                inline_size,
                mtu,
                receives: Mutex::new(None),
                sends: Mutex::new(None),
                _cm: cm,
            };
            if let Some(ring) = spec.ring_layout() {
                // A ring's writes with immediate (records with `Imm`, wake-ups of a producer
                // that may sleep) each consume a receive: as many as the layout gives, posted
                // once, now, before the peer may write, and kept stocked by whoever takes them.
                let (at, len) = ring::receive_scratch(&ring);
                let mut recvs: Vec<_> =
                    (0..link.layout.rx_depth).map(|i| RecvRequest::new(&link.buf, at, len, u64::from(i))).collect();
                link.qp.post_recv_batch(&mut recvs)?;
            }
            if spec.uses_receives() {
                // Posted now, before either side may send. Latency reposts each receive at
                // once; bandwidth reposts in batches of an eighth of the queue.
                let batch = if spec.measure == Measure::Latency { 1 } else { (layout.rx_depth as usize / 8).max(1) };
                *link.receives.lock().expect("no poisoning") = Some(RecvRing::new(&link, batch)?);
            }
            links.push(link);
        }
        Ok(links)
    }
}

impl Link {
    /// Address of receive slot `slot` in the peer's buffer (where writes land).
    pub fn remote_recv_addr(&self, slot: u64) -> u64 {
        self.remote.addr + self.layout.recv_at(slot)
    }

    /// Address of send slot `slot` in the peer's buffer (what reads fetch).
    pub fn remote_send_addr(&self, slot: u64) -> u64 {
        self.remote.addr + self.layout.send_at(slot)
    }

    /// This side's port counters now (see `verbs::counters`).
    pub fn counters(&self) -> counters::Reading {
        counters::read_now(&self.local.device, self.local.port)
    }

    /// What moved since `before` (non-zero deltas); None when the port has no counters.
    pub fn counters_since(&self, before: &counters::Reading) -> Option<BTreeMap<String, u64>> {
        (!before.0.is_empty()).then(|| self.counters().since(before))
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
            link_rate_gbps: self.rdma.port.rate_gbps,
            kernel: inventory::kernel_release(Path::new("/")),
            nic: self.local.nic.clone(),
            counters: self.counters().names(),
            memory: {
                let (opts, page) = self.buf.backing();
                MemoryReport {
                    page_bytes: page as u64,
                    relaxed_ordering: opts.relaxed_ordering,
                    pcie_relaxed_ordering: opts
                        .relaxed_ordering
                        .then(|| inventory::pcie_relaxed_ordering(Path::new("/"), &self.local.device))
                        .flatten(),
                    on_demand: opts.on_demand,
                }
            },
            peer: PeerEnvironment {
                host: self.remote.node.clone(),
                address: peer_address.into(),
                device: self.remote.device.clone(),
                port: self.remote.port,
                gid_index: self.remote.gid_index,
                gid: self.remote.gid.clone(),
                nic: self.remote.nic.clone(),
                same_physical_nic: self.local.nic.same_physical_nic(&self.remote.nic),
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
    /// CPUs for this rail's worker threads (`--threads`), near its NIC; empty: any allowed.
    pub cpus: &'a [usize],
}

/// The identity of the opened device's NIC, from verbs and sysfs.
fn nic_identity(rdma: &Rdma) -> NicIdentity {
    let pci = std::fs::read_link(format!("/sys/class/infiniband/{}/device", rdma.name()))
        .ok()
        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
        .filter(|n| n.contains(':'));
    let numa_node = crate::verbs::inventory::numa_node(rdma.name());
    NicIdentity {
        node_guid: rdma.info.node_guid.clone(),
        sys_image_guid: rdma.info.sys_image_guid.clone(),
        pci,
        numa_node,
        firmware: crate::verbs::inventory::firmware_version(Path::new("/"), rdma.name()),
        driver: crate::verbs::inventory::driver(Path::new("/"), rdma.name()),
    }
}

fn expect_endpoint(chan: &mut Channel) -> Result<Endpoint> {
    // After the hello: the peer's keepalive extends this wait while it registers memory.
    match chan.recv("the peer's endpoint")? {
        Message::Endpoint(e) => {
            proto::check_name("the peer's node name", &e.node)?;
            proto::check_name("the peer's device name", &e.device)?;
            Ok(*e)
        }
        other => Err(chan.unexpected(&other, "its endpoint")),
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
