//! Queue pairs of every transport we measure (RC, UC, UD): creation with separate send
//! and receive CQs (the device's inline limit probed), the state walk to RTS with the
//! peer's endpoint, UD address handles, and the raw post/poll calls of the data path.
//! Work requests are built once and re-posted, so the hot loops neither allocate nor go
//! through a per-post builder.

use std::ffi::CStr;
use std::os::fd::AsRawFd;
use std::ptr::{NonNull, null_mut};
use std::sync::Arc;

use rdma_mummy_sys::{
    ibv_ack_cq_events, ibv_ah, ibv_ah_attr, ibv_cq, ibv_create_ah, ibv_destroy_ah, ibv_get_cq_event, ibv_gid,
    ibv_global_route, ibv_modify_qp, ibv_poll_cq, ibv_post_recv, ibv_post_send, ibv_qp, ibv_qp_attr, ibv_qp_attr_mask,
    ibv_qp_state, ibv_recv_wr, ibv_req_notify_cq, ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wc, ibv_wc_status_str,
    ibv_wr_opcode,
};
use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionChannel, CompletionQueue};
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{BasicQueuePair, QueuePair, QueuePairType};

use super::buffer::RegisteredBuf;
use super::context::Rdma;
use super::endpoint::Endpoint;
use super::inventory::mtu_enum;
use crate::error::{Error, Result};
pub use crate::spec::Transport;

pub type Completion = ibv_wc;

/// Highest inline size probed; no NIC we know of goes beyond it.
const INLINE_PROBE_MAX: u32 = 4096;
/// RoCE v2 packets get this IP TTL.
const HOP_LIMIT: u8 = 64;
/// The Q_Key both sides of a UD test use.
pub const UD_QKEY: u32 = 0x1111_1111;
/// A UD receive buffer starts with room for the 40-byte GRH.
pub const GRH_BYTES: u64 = 40;

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

/// Which of a QP's completion queues a wait is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CqKind {
    Send,
    Recv,
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
    channel: Option<Arc<CompletionChannel>>,
    pub transport: Transport,
    pub psn: u32,
}

// libibverbs objects may be used from any thread; rdmabench gives each QP (and its CQs
// and requests) to one thread at a time.
unsafe impl Send for Qp {}
unsafe impl Sync for Qp {}
unsafe impl Send for RecvRequest {}

fn os_text<E: std::error::Error>(e: &E) -> String {
    std::error::Error::source(e).map(|s| s.to_string()).unwrap_or_else(|| e.to_string())
}

fn cq(rdma: &Rdma, entries: u32, channel: Option<&Arc<CompletionChannel>>) -> Result<Arc<BasicCompletionQueue>> {
    let mut builder = rdma.ctx.create_cq_builder();
    builder.setup_cqe(entries);
    if let Some(ch) = channel {
        builder.setup_comp_channel(ch, 0);
    }
    builder.build().map_err(|e| {
        Error::Environment(format!(
            "cannot create a CQ of {entries} entries on {}: {} (device max_cqe {})",
            rdma.name(),
            os_text(&e),
            rdma.max_cqe
        ))
    })
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

    /// Walks the QP to RTS against the peer's endpoint, at path MTU `mtu` bytes, allowing
    /// `rd_atomic` outstanding reads and atomics (RC only).
    pub fn connect(&mut self, rdma: &Rdma, remote: &Endpoint, mtu: u32, rd_atomic: u8) -> Result<()> {
        use ibv_qp_attr_mask as m;
        let av = address_vector(rdma, remote)?;
        self.init(rdma)?;
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
                a.min_rnr_timer = 12;
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

        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = self.psn;
        let mut mask = m::IBV_QP_STATE.0 | m::IBV_QP_SQ_PSN.0;
        if self.transport == Transport::Rc {
            a.timeout = 14;
            a.retry_cnt = 7;
            a.rnr_retry = 7;
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
                a.qp_access_flags = 1 | 2 | 4 | if self.transport == Transport::Rc { 8 } else { 0 };
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

/// Sleeps until any of `qps`' completion channels has an event, or `wait` passes; takes
/// and acknowledges every event that arrived. True when at least one did.
pub fn wait_any_event(qps: &[&Qp], wait: std::time::Duration) -> Result<bool> {
    let channels: Vec<&Arc<CompletionChannel>> = qps.iter().filter_map(|q| q.channel.as_ref()).collect();
    if channels.is_empty() {
        return Ok(false);
    }
    let mut fds: Vec<libc::pollfd> =
        channels.iter().map(|ch| libc::pollfd { fd: ch.as_raw_fd(), events: libc::POLLIN, revents: 0 }).collect();
    // SAFETY: `fds` is a valid array of pollfd for its length.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as _, wait.as_millis().min(i32::MAX as u128) as i32) };
    if n <= 0 {
        return Ok(false);
    }
    for (ch, fd) in channels.iter().zip(&fds) {
        if fd.revents & libc::POLLIN == 0 {
            continue;
        }
        let mut cq: *mut ibv_cq = null_mut();
        let mut ctx: *mut std::ffi::c_void = null_mut();
        // SAFETY: the channel is alive and readable, so this does not block.
        if unsafe { ibv_get_cq_event(ch.comp_channel().as_ptr(), &mut cq, &mut ctx) } == 0 {
            // SAFETY: acknowledging the one event just taken from this CQ.
            unsafe { ibv_ack_cq_events(cq, 1) };
        }
    }
    Ok(true)
}

/// A work request with one scatter/gather entry, linkable into a chain.
trait Chainable {
    type Wr;
    /// Points the request at its own SGE and at `next` (null ends the chain).
    fn link(&mut self, next: *mut Self::Wr);
    fn wr(&mut self) -> *mut Self::Wr;
}

impl Chainable for SendRequest {
    type Wr = ibv_send_wr;
    fn link(&mut self, next: *mut ibv_send_wr) {
        self.wr.sg_list = &mut self.sge;
        self.wr.next = next;
    }
    fn wr(&mut self) -> *mut ibv_send_wr {
        &mut self.wr
    }
}

impl Chainable for RecvRequest {
    type Wr = ibv_recv_wr;
    fn link(&mut self, next: *mut ibv_recv_wr) {
        self.wr.sg_list = &mut self.sge;
        self.wr.next = next;
    }
    fn wr(&mut self) -> *mut ibv_recv_wr {
        &mut self.wr
    }
}

/// Links `reqs` in order and returns the head of the chain (None when empty).
#[inline(always)]
fn chain<T: Chainable>(reqs: &mut [T]) -> Option<*mut T::Wr> {
    let n = reqs.len();
    for i in 0..n {
        let next = if i + 1 < n { reqs[i + 1].wr() } else { null_mut() };
        reqs[i].link(next);
    }
    reqs.first_mut().map(|r| r.wr())
}

fn posted(rc: i32, verb: &str, likely: &str) -> Result<()> {
    if rc != 0 {
        return Err(Error::Environment(format!("{verb} failed: {} ({likely})", std::io::Error::from_raw_os_error(rc))));
    }
    Ok(())
}

#[inline(always)]
fn poll(cq: NonNull<ibv_cq>, wcs: &mut [Completion]) -> Result<usize> {
    // SAFETY: the CQ is alive and `wcs` is writable for its length.
    let n = unsafe { ibv_poll_cq(cq.as_ptr(), wcs.len() as i32, wcs.as_mut_ptr()) };
    if n < 0 {
        return Err(Error::Environment(format!("ibv_poll_cq failed ({n})")));
    }
    Ok(n as usize)
}

fn address_vector(rdma: &Rdma, remote: &Endpoint) -> Result<ibv_ah_attr> {
    // SAFETY: all-zero is a valid ibv_ah_attr.
    let mut av: ibv_ah_attr = unsafe { std::mem::zeroed() };
    av.port_num = rdma.port.port;
    av.dlid = remote.lid;
    if rdma.gid.use_grh {
        let dgid: std::net::Ipv6Addr =
            remote.gid.parse().map_err(|_| Error::Peer(format!("the peer sent an invalid GID {:?}", remote.gid)))?;
        av.is_global = 1;
        av.grh = ibv_global_route {
            dgid: ibv_gid { raw: dgid.octets() },
            flow_label: 0,
            sgid_index: rdma.gid.index as u8,
            hop_limit: HOP_LIMIT,
            traffic_class: 0,
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

/// A send-queue work request and its one scatter/gather entry, built once, re-posted.
#[repr(C)]
pub struct SendRequest {
    pub wr: ibv_send_wr,
    pub sge: ibv_sge,
}

impl SendRequest {
    fn new(opcode: u32, local: &RegisteredBuf, offset: usize, len: u32) -> SendRequest {
        // SAFETY: ibv_send_wr is a C struct for which all-zero is a valid value.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.opcode = opcode;
        wr.num_sge = 1;
        SendRequest { wr, sge: ibv_sge { addr: local.addr() + offset as u64, length: len, lkey: local.lkey() } }
    }

    /// RDMA WRITE (with immediate data when `imm` is set) of `len` bytes at `offset`.
    pub fn write(
        local: &RegisteredBuf,
        offset: usize,
        len: u32,
        remote_addr: u64,
        rkey: u32,
        imm: Option<u32>,
    ) -> Self {
        let op =
            if imm.is_some() { ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM } else { ibv_wr_opcode::IBV_WR_RDMA_WRITE };
        let mut r = SendRequest::new(op, local, offset, len);
        r.wr.wr.rdma.remote_addr = remote_addr;
        r.wr.wr.rdma.rkey = rkey;
        r.wr.imm_data_invalidated_rkey_union.imm_data = imm.unwrap_or(0).to_be();
        r
    }

    /// RDMA READ of `len` bytes from `remote_addr` into `offset`.
    pub fn read(local: &RegisteredBuf, offset: usize, len: u32, remote_addr: u64, rkey: u32) -> Self {
        let mut r = SendRequest::new(ibv_wr_opcode::IBV_WR_RDMA_READ, local, offset, len);
        r.wr.wr.rdma.remote_addr = remote_addr;
        r.wr.wr.rdma.rkey = rkey;
        r
    }

    /// SEND (with immediate data when `imm` is set).
    pub fn send(local: &RegisteredBuf, offset: usize, len: u32, imm: Option<u32>) -> Self {
        let op = if imm.is_some() { ibv_wr_opcode::IBV_WR_SEND_WITH_IMM } else { ibv_wr_opcode::IBV_WR_SEND };
        let mut r = SendRequest::new(op, local, offset, len);
        r.wr.imm_data_invalidated_rkey_union.imm_data = imm.unwrap_or(0).to_be();
        r
    }

    /// Fetch-and-add of `add` on the 8 bytes at `remote_addr`; the old value lands at `offset`.
    pub fn fetch_add(local: &RegisteredBuf, offset: usize, remote_addr: u64, rkey: u32, add: u64) -> Self {
        let mut r = SendRequest::new(ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD, local, offset, 8);
        r.wr.wr.atomic.remote_addr = remote_addr;
        r.wr.wr.atomic.rkey = rkey;
        r.wr.wr.atomic.compare_add = add;
        r
    }

    /// Compare-and-swap on the 8 bytes at `remote_addr`; the old value lands at `offset`.
    pub fn cmp_swap(
        local: &RegisteredBuf,
        offset: usize,
        remote_addr: u64,
        rkey: u32,
        compare: u64,
        swap: u64,
    ) -> Self {
        let mut r = SendRequest::new(ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP, local, offset, 8);
        r.wr.wr.atomic.remote_addr = remote_addr;
        r.wr.wr.atomic.rkey = rkey;
        r.wr.wr.atomic.compare_add = compare;
        r.wr.wr.atomic.swap = swap;
        r
    }

    /// Addresses a UD request to the peer.
    pub fn to_ud(mut self, ah: *mut ibv_ah, remote_qpn: u32) -> Self {
        self.wr.wr.ud.ah = ah;
        self.wr.wr.ud.remote_qpn = remote_qpn;
        self.wr.wr.ud.remote_qkey = UD_QKEY;
        self
    }

    #[inline(always)]
    pub fn set_flags(&mut self, signaled: bool, inline: bool) {
        let mut f = 0;
        if signaled {
            f |= ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if inline {
            f |= ibv_send_flags::IBV_SEND_INLINE.0;
        }
        self.wr.send_flags = f;
    }

    #[inline(always)]
    pub fn set_wr_id(&mut self, id: u64) {
        self.wr.wr_id = id;
    }

    #[inline(always)]
    pub fn set_local(&mut self, addr: u64, len: u32) {
        self.sge.addr = addr;
        self.sge.length = len;
    }

    /// Sets the remote address of an RDMA request (the `rdma` member of the union).
    #[inline(always)]
    pub fn set_remote(&mut self, addr: u64) {
        self.wr.wr.rdma.remote_addr = addr;
    }

    /// Sets compare/add and swap of an atomic request.
    #[inline(always)]
    pub fn set_atomic(&mut self, compare_add: u64, swap: u64) {
        self.wr.wr.atomic.compare_add = compare_add;
        self.wr.wr.atomic.swap = swap;
    }

    #[inline(always)]
    pub fn set_imm(&mut self, imm: u32) {
        self.wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
    }
}

/// A receive work request and its one scatter/gather entry.
#[repr(C)]
pub struct RecvRequest {
    pub wr: ibv_recv_wr,
    pub sge: ibv_sge,
}

impl RecvRequest {
    pub fn new(local: &RegisteredBuf, offset: usize, len: u32, wr_id: u64) -> RecvRequest {
        RecvRequest {
            wr: ibv_recv_wr { wr_id, next: null_mut(), sg_list: null_mut(), num_sge: 1 },
            sge: ibv_sge { addr: local.addr() + offset as u64, length: len, lkey: local.lkey() },
        }
    }
}

/// A zeroed completion array for polling.
pub fn completions<const N: usize>() -> [Completion; N] {
    // SAFETY: ibv_wc is a C struct for which all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// Ok(wr_id) for a successful completion; otherwise the error it means. A transport retry
/// failure means the peer stopped acknowledging: it died or its QP is gone.
pub fn check_completion(wc: &Completion, peer: &str) -> Result<u64> {
    if wc.status == 0 {
        return Ok(wc.wr_id);
    }
    // SAFETY: returns a static string for any status value.
    let text = unsafe { CStr::from_ptr(ibv_wc_status_str(wc.status)) }.to_string_lossy().into_owned();
    match wc.status {
        12 | 13 | 5 => Err(Error::Peer(format!(
            "{peer} stopped responding on the RDMA path: completion status {text} ({}); it died, hung or its QP is gone",
            wc.status
        ))),
        _ => Err(Error::Check(format!(
            "work request failed with completion status {text} ({}, vendor error {:#x})",
            wc.status, wc.vendor_err
        ))),
    }
}

/// The immediate data of a receive completion, in host order.
pub fn imm_of(wc: &Completion) -> u32 {
    // SAFETY: reading the imm member of a plain-data union.
    u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data })
}
