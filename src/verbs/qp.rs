//! Queue pairs of every transport we measure (RC, UC, UD): creation with separate send
//! and receive CQs (the device's inline limit probed), the state walk to RTS with the
//! peer's endpoint, UD address handles, and the raw post/poll calls of the data path.
//! Work requests are built once and re-posted, so the hot loops neither allocate nor go
//! through a per-post builder.

use std::ptr::{NonNull, null_mut};
use std::sync::Arc;

use rdma_mummy_sys::ibv_access_flags as access;
use rdma_mummy_sys::{
    ibv_ah, ibv_ah_attr, ibv_cq, ibv_create_ah, ibv_destroy_ah, ibv_gid, ibv_global_route, ibv_modify_qp,
    ibv_post_recv, ibv_post_send, ibv_qp, ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_state, ibv_recv_wr, ibv_req_notify_cq,
    ibv_send_wr,
};
use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionChannel, CompletionQueue};
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{BasicQueuePair, QueuePair, QueuePairType};

use super::context::Rdma;
use super::endpoint::Endpoint;
use super::inventory::mtu_enum;
use crate::error::{Error, Result};
pub use crate::spec::Transport;

use super::cq::{Completion, CqKind, cq, poll, wait_any_event};
use super::wr::{RecvRequest, SendRequest, chain};

/// Highest inline size probed; no NIC we know of goes beyond it.
const INLINE_PROBE_MAX: u32 = 4096;
/// The Q_Key both sides of a UD test use.
pub const UD_QKEY: u32 = 0x1111_1111;
/// A UD receive buffer starts with room for the 40-byte GRH.
pub const GRH_BYTES: u64 = 40;

/// Where a QP's packets go and how RC retransmits them: the GRH's traffic class, flow
/// label and hop limit, the service level, the local ACK timeout exponent and the retry
/// counts. The caller (the link, from the spec) chooses them; ranges are checked there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathParams {
    pub traffic_class: u8,
    pub service_level: u8,
    pub flow_label: u32,
    pub hop_limit: u8,
    pub ack_timeout: u8,
    pub retry_count: u8,
    pub rnr_retry: u8,
}
/// The wait this side asks an RNR sender to back off: code 12 = 0.64 ms.
pub const MIN_RNR_TIMER: u8 = 12;

/// The verbs QP type of a transport.
fn qp_type(t: Transport) -> QueuePairType {
    match t {
        Transport::Rc => QueuePairType::ReliableConnection,
        Transport::Uc => QueuePairType::UnreliableConnection,
        Transport::Ud => QueuePairType::UnreliableDatagram,
    }
}

/// The sizes a QP is created with.
#[derive(Debug, Clone, Copy)]
pub struct QpCaps {
    pub send_depth: u32,
    pub recv_depth: u32,
    pub inline: u32,
    /// Attach both CQs to a completion channel, so waits can sleep until a completion.
    pub events: bool,
}

pub struct Qp {
    // Drop order: the QP before the CQs it reports to. The CQ owners are held only so the
    // raw handles below stay valid.
    qp: BasicQueuePair,
    _send_cq: Arc<BasicCompletionQueue>,
    _recv_cq: Arc<BasicCompletionQueue>,
    raw_qp: NonNull<ibv_qp>,
    raw_send_cq: NonNull<ibv_cq>,
    raw_recv_cq: NonNull<ibv_cq>,
    ah: Option<AddressHandle>,
    // The CQs hold it too; kept here for its file descriptor.
    pub(super) channel: Option<Arc<CompletionChannel>>,
    pub transport: Transport,
    pub psn: u32,
    /// Set with [`Qp::set_path`] before connecting.
    path: Option<PathParams>,
}

// SAFETY: the raw pointers are libibverbs handles owned by the sideway objects held
// beside them (dropped after the QP), and libibverbs allows a QP and its CQs to be used
// from any thread. Posting and polling are not synchronised by libibverbs for one QP, so
// rdmabench gives each QP (with its CQs) to one thread at a time: the lanes of a
// bandwidth test are split between threads, never shared.
unsafe impl Send for Qp {}
// SAFETY: as for Send; the `&self` methods that post or poll are called by the one
// thread that drives this QP (see above), the others only read immutable handles.
unsafe impl Sync for Qp {}
pub(super) fn os_text<E: std::error::Error>(e: &E) -> String {
    std::error::Error::source(e).map(|s| s.to_string()).unwrap_or_else(|| e.to_string())
}

impl Qp {
    /// Creates a QP of `transport` with its own send and receive CQs.
    pub fn create(rdma: &Rdma, transport: Transport, caps: QpCaps) -> Result<Qp> {
        let channel = if caps.events {
            Some(rdma.ctx.create_comp_channel().map_err(|e| {
                Error::Environment(format!("cannot create a completion channel on {}: {}", rdma.name(), os_text(&e)))
            })?)
        } else {
            None
        };
        let send_cq = cq(rdma, caps.send_depth + 1, channel.as_ref())?;
        let recv_cq = cq(rdma, caps.recv_depth + 1, channel.as_ref())?;
        let qp = build_qp(&rdma.pd, transport, &send_cq, &recv_cq, caps).map_err(|os| {
            Error::Environment(format!(
                "cannot create a {} QP on {} (send queue {}, receive queue {}, inline {} B): {os}",
                transport.label(),
                rdma.name(),
                caps.send_depth,
                caps.recv_depth,
                caps.inline
            ))
        })?;
        // SAFETY: the handles live as long as `self` (their owners are fields).
        let (raw_qp, raw_send_cq, raw_recv_cq) = unsafe { (qp.qp(), send_cq.cq(), recv_cq.cq()) };
        Ok(Qp {
            path: None,
            qp,
            _send_cq: send_cq,
            _recv_cq: recv_cq,
            raw_qp,
            raw_send_cq,
            raw_recv_cq,
            ah: None,
            channel,
            transport,
            psn: random_psn(),
        })
    }

    /// The largest inline size the device accepts for this transport (binary search over
    /// QP creation; the C API offers no query for it).
    pub fn probe_max_inline(rdma: &Rdma, transport: Transport) -> Result<u32> {
        let send_cq = cq(rdma, 2, None)?;
        let recv_cq = cq(rdma, 2, None)?;
        let caps = |inline| QpCaps { send_depth: 1, recv_depth: 1, inline, events: false };
        if let Err(os) = build_qp(&rdma.pd, transport, &send_cq, &recv_cq, caps(0)) {
            return Err(Error::Environment(format!(
                "cannot create any {} QP on {}: {os}",
                transport.label(),
                rdma.name()
            )));
        }
        let (mut lo, mut hi) = (0u32, INLINE_PROBE_MAX);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if build_qp(&rdma.pd, transport, &send_cq, &recv_cq, caps(mid)).is_ok() {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        Ok(lo)
    }

    pub fn qpn(&self) -> u32 {
        self.qp.qp_number()
    }

    fn modify(&self, attr: &mut ibv_qp_attr, mask: u32, step: &str) -> Result<()> {
        // SAFETY: the QP is alive; attr is a valid, fully initialised struct.
        let rc = unsafe { ibv_modify_qp(self.raw_qp.as_ptr(), attr, mask as i32) };
        if rc != 0 {
            return Err(Error::Environment(format!(
                "cannot move the {} QP to {step}: {}",
                self.transport.label(),
                std::io::Error::from_raw_os_error(rc)
            )));
        }
        Ok(())
    }

    /// The path and retransmission the QP is connected with.
    pub fn set_path(&mut self, path: PathParams) {
        self.path = Some(path);
    }

    pub fn path(&self) -> PathParams {
        self.path.expect("set_path comes before connecting")
    }

    /// Walks the QP to RTS against the peer's endpoint, at path MTU `mtu` bytes, allowing
    /// `rd_atomic` outstanding reads and atomics (RC only).
    pub fn connect(&mut self, rdma: &Rdma, remote: &Endpoint, mtu: u32, rd_atomic: u8) -> Result<()> {
        use ibv_qp_attr_mask as m;
        let path = self.path();
        let av = address_vector(rdma, remote, &path)?;
        self.init(rdma)?;
        // SAFETY: ibv_qp_attr is a C struct for which all-zero is a valid value.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        let mut mask = m::IBV_QP_STATE.0;
        if self.transport != Transport::Ud {
            a.path_mtu = mtu_enum(mtu);
            a.dest_qp_num = remote.qpn;
            a.rq_psn = remote.psn;
            a.ah_attr = av;
            mask |= m::IBV_QP_PATH_MTU.0 | m::IBV_QP_DEST_QPN.0 | m::IBV_QP_RQ_PSN.0 | m::IBV_QP_AV.0;
            if self.transport == Transport::Rc {
                a.max_dest_rd_atomic = rd_atomic;
                a.min_rnr_timer = MIN_RNR_TIMER;
                mask |= m::IBV_QP_MAX_DEST_RD_ATOMIC.0 | m::IBV_QP_MIN_RNR_TIMER.0;
            }
        }
        self.modify(&mut a, mask, "RTR").map_err(|e| {
            e.context(&format!(
                "local GID index {}, remote GID {} on {} port {}; both GIDs must be reachable on the same \
                 network: check -x on both sides",
                rdma.gid.index, remote.gid, remote.device, remote.port
            ))
        })?;

        // SAFETY: ibv_qp_attr is a C struct for which all-zero is a valid value.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = self.psn;
        let mut mask = m::IBV_QP_STATE.0 | m::IBV_QP_SQ_PSN.0;
        if self.transport == Transport::Rc {
            a.timeout = path.ack_timeout;
            a.retry_cnt = path.retry_count;
            a.rnr_retry = path.rnr_retry;
            a.max_rd_atomic = rd_atomic;
            mask |= m::IBV_QP_TIMEOUT.0 | m::IBV_QP_RETRY_CNT.0 | m::IBV_QP_RNR_RETRY.0 | m::IBV_QP_MAX_QP_RD_ATOMIC.0;
        }
        self.modify(&mut a, mask, "RTS")?;

        if self.transport == Transport::Ud {
            let mut av = av;
            self.ah = Some(AddressHandle::new(&rdma.pd, &mut av)?);
        }
        Ok(())
    }

    /// RESET -> INIT on this side's port, with the access the test's operations need.
    pub fn init(&self, rdma: &Rdma) -> Result<()> {
        use ibv_qp_attr_mask as m;
        // SAFETY: all-zero is a valid ibv_qp_attr.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = rdma.port.port;
        let mut mask = m::IBV_QP_STATE.0 | m::IBV_QP_PKEY_INDEX.0 | m::IBV_QP_PORT.0;
        match self.transport {
            Transport::Ud => {
                a.qkey = UD_QKEY;
                mask |= m::IBV_QP_QKEY.0;
            }
            Transport::Rc | Transport::Uc => {
                // Remote reads and atomics need RC's responder resources; UC takes writes only.
                let rc_only = if self.transport == Transport::Rc { access::IBV_ACCESS_REMOTE_ATOMIC.0 } else { 0 };
                a.qp_access_flags =
                    (access::IBV_ACCESS_LOCAL_WRITE | access::IBV_ACCESS_REMOTE_WRITE | access::IBV_ACCESS_REMOTE_READ)
                        .0
                        | rc_only;
                mask |= m::IBV_QP_ACCESS_FLAGS.0;
            }
        }
        self.modify(&mut a, mask, "INIT")
    }

    /// Applies attributes rdma_cm computed for `step` (RTR or RTS), with the test's
    /// own read/atomic depth and, when given, path MTU in place of the CM's.
    pub fn apply_cm(
        &self,
        mut attr: ibv_qp_attr,
        mask: i32,
        step: &str,
        rd_atomic: u8,
        mtu: Option<u32>,
    ) -> Result<()> {
        use ibv_qp_attr_mask as m;
        let mut mask = mask as u32;
        if mask & m::IBV_QP_MAX_DEST_RD_ATOMIC.0 != 0 {
            attr.max_dest_rd_atomic = rd_atomic;
        }
        if mask & m::IBV_QP_MAX_QP_RD_ATOMIC.0 != 0 {
            attr.max_rd_atomic = rd_atomic;
        }
        // rdma_cm's route gives the address and defaults; the spec's path wins.
        let path = self.path();
        if mask & m::IBV_QP_AV.0 != 0 {
            attr.ah_attr.sl = path.service_level;
            attr.ah_attr.grh.traffic_class = path.traffic_class;
            attr.ah_attr.grh.flow_label = path.flow_label;
            attr.ah_attr.grh.hop_limit = path.hop_limit;
        }
        if mask & m::IBV_QP_TIMEOUT.0 != 0 {
            attr.timeout = path.ack_timeout;
        }
        if mask & m::IBV_QP_RETRY_CNT.0 != 0 {
            attr.retry_cnt = path.retry_count;
        }
        if mask & m::IBV_QP_RNR_RETRY.0 != 0 {
            attr.rnr_retry = path.rnr_retry;
        }
        if let Some(mtu) = mtu
            && attr.qp_state == ibv_qp_state::IBV_QPS_RTR
        {
            attr.path_mtu = mtu_enum(mtu);
            mask |= m::IBV_QP_PATH_MTU.0;
        }
        self.modify(&mut attr, mask, step)
    }

    /// The address handle of the peer (UD only).
    pub fn ah(&self) -> *mut ibv_ah {
        self.ah.as_ref().map_or(null_mut(), |a| a.raw.as_ptr())
    }

    /// Posts one pre-built work request.
    #[inline(always)]
    pub fn post(&self, req: &mut SendRequest) -> Result<()> {
        self.post_batch(std::slice::from_mut(req))
    }

    /// Posts `reqs` as one chain with a single doorbell (one `ibv_post_send`). The
    /// requests are copied into the send queue by the call, so the slice may be reused
    /// right after it returns; the payload memory must stay until completion.
    #[inline(always)]
    pub fn post_batch(&self, reqs: &mut [SendRequest]) -> Result<()> {
        let Some(head) = chain(reqs) else { return Ok(()) };
        let mut bad: *mut ibv_send_wr = null_mut();
        // SAFETY: the QP is alive (owned by self); the chain and its SGEs outlive the call.
        let rc = unsafe { ibv_post_send(self.raw_qp.as_ptr(), head, &mut bad) };
        posted(rc, "ibv_post_send", "send queue full or work request rejected")
    }

    /// Posts receives as one chain.
    #[inline(always)]
    pub fn post_recv_batch(&self, reqs: &mut [RecvRequest]) -> Result<()> {
        let Some(head) = chain(reqs) else { return Ok(()) };
        let mut bad: *mut ibv_recv_wr = null_mut();
        // SAFETY: as for post_batch.
        let rc = unsafe { ibv_post_recv(self.raw_qp.as_ptr(), head, &mut bad) };
        posted(rc, "ibv_post_recv", "receive queue full")
    }

    /// Polls up to `wcs.len()` send completions; returns how many arrived.
    #[inline(always)]
    pub fn poll_send(&self, wcs: &mut [Completion]) -> Result<usize> {
        poll(self.raw_send_cq, wcs)
    }

    /// Polls up to `wcs.len()` receive completions; returns how many arrived.
    #[inline(always)]
    pub fn poll_recv(&self, wcs: &mut [Completion]) -> Result<usize> {
        poll(self.raw_recv_cq, wcs)
    }

    /// Whether the CQs report to a completion channel (`-e`).
    pub fn has_events(&self) -> bool {
        self.channel.is_some()
    }

    /// Asks for an event at the next completion on `kind`'s CQ. Poll once more after
    /// arming: a completion that arrived just before is not announced.
    pub fn arm(&self, kind: CqKind) -> Result<()> {
        let cq = match kind {
            CqKind::Send => self.raw_send_cq,
            CqKind::Recv => self.raw_recv_cq,
        };
        // SAFETY: the CQ is alive and attached to our channel.
        let rc = unsafe { ibv_req_notify_cq(cq.as_ptr(), 0) };
        if rc != 0 {
            return Err(Error::Environment(format!(
                "ibv_req_notify_cq failed: {}",
                std::io::Error::from_raw_os_error(rc)
            )));
        }
        Ok(())
    }

    /// Sleeps until a completion event arrives or `wait` passes; true when one arrived
    /// (it is acknowledged at once).
    pub fn wait_event(&self, wait: std::time::Duration) -> Result<bool> {
        wait_any_event(&[self], wait)
    }
}

fn posted(rc: i32, verb: &str, likely: &str) -> Result<()> {
    if rc != 0 {
        return Err(Error::Environment(format!("{verb} failed: {} ({likely})", std::io::Error::from_raw_os_error(rc))));
    }
    Ok(())
}

fn address_vector(rdma: &Rdma, remote: &Endpoint, path: &PathParams) -> Result<ibv_ah_attr> {
    // SAFETY: all-zero is a valid ibv_ah_attr.
    let mut av: ibv_ah_attr = unsafe { std::mem::zeroed() };
    av.port_num = rdma.port.port;
    av.dlid = remote.lid;
    av.sl = path.service_level;
    if rdma.gid.use_grh {
        let dgid: std::net::Ipv6Addr =
            remote.gid.parse().map_err(|_| Error::Peer(format!("the peer sent an invalid GID {:?}", remote.gid)))?;
        av.is_global = 1;
        av.grh = ibv_global_route {
            dgid: ibv_gid { raw: dgid.octets() },
            flow_label: path.flow_label,
            sgid_index: rdma.gid.index as u8,
            hop_limit: path.hop_limit,
            traffic_class: path.traffic_class,
        };
    }
    Ok(av)
}

struct AddressHandle {
    raw: NonNull<ibv_ah>,
}

impl AddressHandle {
    fn new(pd: &Arc<ProtectionDomain>, attr: &mut ibv_ah_attr) -> Result<AddressHandle> {
        // SAFETY: the PD is alive; attr is initialised.
        let ah = unsafe { ibv_create_ah(pd.pd().as_ptr(), attr) };
        NonNull::new(ah).map(|raw| AddressHandle { raw }).ok_or_else(|| {
            Error::Environment(format!("cannot create an address handle: {}", std::io::Error::last_os_error()))
        })
    }
}

impl Drop for AddressHandle {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_ah and destroyed once.
        unsafe { ibv_destroy_ah(self.raw.as_ptr()) };
    }
}

fn build_qp(
    pd: &Arc<ProtectionDomain>,
    transport: Transport,
    send_cq: &Arc<BasicCompletionQueue>,
    recv_cq: &Arc<BasicCompletionQueue>,
    caps: QpCaps,
) -> std::result::Result<BasicQueuePair, String> {
    pd.create_qp_builder()
        .setup_qp_type(qp_type(transport))
        .setup_max_send_wr(caps.send_depth.max(1))
        .setup_max_recv_wr(caps.recv_depth.max(1))
        .setup_max_send_sge(1)
        .setup_max_recv_sge(1)
        .setup_max_inline_data(caps.inline)
        .setup_send_cq(Arc::clone(send_cq))
        .setup_recv_cq(Arc::clone(recv_cq))
        .build()
        .map_err(|e| os_text(&e))
}

fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: getrandom fills the 4 bytes we own; on failure the time is good enough.
    let got = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 4, 0) };
    let v = if got == 4 {
        u32::from_ne_bytes(b)
    } else {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(7, |d| d.subsec_nanos())
    };
    v & 0x00ff_ffff
}
