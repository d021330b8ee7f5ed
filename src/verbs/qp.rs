//! Reliable-connection queue pairs: creation (with the device's inline limit probed),
//! the INIT -> RTR -> RTS walk with the peer's endpoint, and the raw post/poll calls of
//! the data path. Work requests are built once and re-posted, so the hot loop neither
//! allocates nor goes through a per-post builder.

use std::ffi::CStr;
use std::ptr::{NonNull, null_mut};
use std::sync::Arc;

use rdma_mummy_sys::{
    ibv_cq, ibv_poll_cq, ibv_post_send, ibv_qp, ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wc, ibv_wc_status_str,
    ibv_wr_opcode,
};
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionQueue};
use sideway::ibverbs::device_context::Mtu;
use sideway::ibverbs::queue_pair::{BasicQueuePair, QueuePair, QueuePairAttribute, QueuePairState, QueuePairType};

use super::buffer::RegisteredBuf;
use super::context::Rdma;
use super::inventory::mtu_enum;
use crate::error::{Error, Result};
use crate::session::Endpoint;

pub type Completion = ibv_wc;

/// Highest inline size probed; no NIC we know of goes beyond it.
const INLINE_PROBE_MAX: u32 = 4096;
/// RoCE v2 packets get this IP TTL.
const HOP_LIMIT: u8 = 64;

pub struct RcQp {
    // Drop order: the QP before the CQ it reports to.
    qp: BasicQueuePair,
    cq: Arc<BasicCompletionQueue>,
    raw_qp: NonNull<ibv_qp>,
    raw_cq: NonNull<ibv_cq>,
    pub psn: u32,
    pub max_inline: u32,
}

impl RcQp {
    /// Creates an RC QP with its own CQ. `inline` must not exceed `probe_max_inline`.
    pub fn create(rdma: &Rdma, sq_depth: u32, rq_depth: u32, inline: u32) -> Result<RcQp> {
        let cq = rdma.ctx.create_cq_builder().setup_cqe(sq_depth + rq_depth + 1).build().map_err(|e| {
            Error::Environment(format!(
                "cannot create a CQ of {} entries on {}: {e:?} (device max_cqe {})",
                sq_depth + rq_depth + 1,
                rdma.name(),
                rdma.max_cqe
            ))
        })?;
        let qp = build_qp(rdma, &cq, sq_depth, rq_depth, inline).map_err(|os| {
            Error::Environment(format!(
                "cannot create an RC QP on {} (send queue {sq_depth}, inline {inline} B): {os}",
                rdma.name()
            ))
        })?;
        // SAFETY: both handles live as long as `self` (the owners are fields).
        let (raw_qp, raw_cq) = unsafe { (qp.qp(), cq.cq()) };
        Ok(RcQp { qp, cq, raw_qp, raw_cq, psn: random_psn(), max_inline: inline })
    }

    /// The largest inline size the device accepts for an RC QP (binary search over QP creation).
    pub fn probe_max_inline(rdma: &Rdma) -> Result<u32> {
        let cq = rdma
            .ctx
            .create_cq_builder()
            .setup_cqe(2)
            .build()
            .map_err(|e| Error::Environment(format!("cannot create a CQ on {}: {e:?}", rdma.name())))?;
        let (mut lo, mut hi) = (0u32, INLINE_PROBE_MAX);
        if build_qp(rdma, &cq, 1, 1, 0).is_err() {
            return Err(Error::Environment(format!("cannot create any RC QP on {}", rdma.name())));
        }
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if build_qp(rdma, &cq, 1, 1, mid).is_ok() {
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

    /// INIT -> RTR -> RTS against the peer's endpoint at path MTU `mtu` bytes.
    pub fn connect(&mut self, rdma: &Rdma, remote: &Endpoint, mtu: u32) -> Result<()> {
        let access =
            AccessFlags::LocalWrite | AccessFlags::RemoteWrite | AccessFlags::RemoteRead | AccessFlags::RemoteAtomic;
        let mut init = QueuePairAttribute::new();
        init.setup_state(QueuePairState::Init)
            .setup_pkey_index(0)
            .setup_port(rdma.port.port)
            .setup_access_flags(access);
        self.qp.modify(&init).map_err(|e| Error::Environment(format!("cannot move the QP to INIT: {e:?}")))?;

        let mut av = AddressHandleAttribute::new();
        av.setup_port(rdma.port.port).setup_dest_lid(remote.lid).setup_service_level(0);
        if rdma.gid.use_grh {
            let dgid: std::net::Ipv6Addr = remote
                .gid
                .parse()
                .map_err(|_| Error::Peer(format!("the peer sent an invalid GID {:?}", remote.gid)))?;
            av.setup_grh(&Gid::from(dgid), 0, rdma.gid.index as u8, HOP_LIMIT, 0);
        }
        let mut rtr = QueuePairAttribute::new();
        rtr.setup_state(QueuePairState::ReadyToReceive)
            .setup_path_mtu(Mtu::from(mtu_enum(mtu)))
            .setup_dest_qp_num(remote.qpn)
            .setup_rq_psn(remote.psn)
            .setup_max_dest_read_atomic(1)
            .setup_min_rnr_timer(12)
            .setup_address_vector(&av);
        self.qp.modify(&rtr).map_err(|e| {
            Error::Environment(format!(
                "cannot move the QP to RTR (local GID index {}, remote GID {} on {} port {}): {e:?}; \
                 both GIDs must be reachable on the same network: check -x on both sides",
                rdma.gid.index, remote.gid, remote.device, remote.port
            ))
        })?;

        let mut rts = QueuePairAttribute::new();
        rts.setup_state(QueuePairState::ReadyToSend)
            .setup_sq_psn(self.psn)
            .setup_timeout(14)
            .setup_retry_cnt(7)
            .setup_rnr_retry(7)
            .setup_max_read_atomic(1);
        self.qp.modify(&rts).map_err(|e| Error::Environment(format!("cannot move the QP to RTS: {e:?}")))?;
        Ok(())
    }

    /// Posts one pre-built work request.
    #[inline(always)]
    pub fn post(&self, req: &mut WriteRequest) -> Result<()> {
        self.post_batch(std::slice::from_mut(req))
    }

    /// Posts `reqs` as one chain with a single doorbell (one `ibv_post_send`). The
    /// requests are copied into the send queue by the call, so the slice may be reused
    /// right after it returns; the payload memory must stay until completion.
    #[inline(always)]
    pub fn post_batch(&self, reqs: &mut [WriteRequest]) -> Result<()> {
        let n = reqs.len();
        if n == 0 {
            return Ok(());
        }
        for i in 0..n {
            let next: *mut ibv_send_wr = if i + 1 < n { &mut reqs[i + 1].wr } else { null_mut() };
            let r = &mut reqs[i];
            r.wr.sg_list = &mut r.sge;
            r.wr.next = next;
        }
        let mut bad: *mut ibv_send_wr = null_mut();
        // SAFETY: the QP is alive (owned by self); the chain and its SGEs outlive the call.
        let rc = unsafe { ibv_post_send(self.raw_qp.as_ptr(), &mut reqs[0].wr, &mut bad) };
        if rc != 0 {
            return Err(Error::Environment(format!(
                "ibv_post_send failed: {} (send queue full or work request rejected)",
                std::io::Error::from_raw_os_error(rc)
            )));
        }
        Ok(())
    }

    /// Polls up to `wcs.len()` completions; returns how many arrived.
    #[inline(always)]
    pub fn poll(&self, wcs: &mut [Completion]) -> Result<usize> {
        // SAFETY: the CQ is alive and `wcs` is writable for its length.
        let n = unsafe { ibv_poll_cq(self.raw_cq.as_ptr(), wcs.len() as i32, wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(Error::Environment(format!("ibv_poll_cq failed ({n})")));
        }
        Ok(n as usize)
    }

    /// Keeps the CQ handle reachable for code that needs it (completion channels later).
    pub fn cq(&self) -> &Arc<BasicCompletionQueue> {
        &self.cq
    }
}

fn build_qp(
    rdma: &Rdma,
    cq: &Arc<BasicCompletionQueue>,
    sq: u32,
    rq: u32,
    inline: u32,
) -> std::result::Result<BasicQueuePair, String> {
    rdma.pd
        .create_qp_builder()
        .setup_qp_type(QueuePairType::ReliableConnection)
        .setup_max_send_wr(sq)
        .setup_max_recv_wr(rq.max(1))
        .setup_max_send_sge(1)
        .setup_max_recv_sge(1)
        .setup_max_inline_data(inline)
        .setup_send_cq(Arc::clone(cq))
        .setup_recv_cq(Arc::clone(cq))
        .build()
        .map_err(|e| std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_else(|| format!("{e:?}")))
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

/// A work request and its one scatter/gather entry, built once and re-posted.
#[repr(C)]
pub struct WriteRequest {
    pub wr: ibv_send_wr,
    pub sge: ibv_sge,
}

impl WriteRequest {
    /// An RDMA WRITE of `len` bytes at `offset` of `local` to `remote_addr`/`rkey`.
    pub fn rdma_write(local: &RegisteredBuf, offset: usize, len: u32, remote_addr: u64, rkey: u32) -> WriteRequest {
        // SAFETY: ibv_send_wr is a C struct for which all-zero is a valid value.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
        wr.num_sge = 1;
        wr.wr.rdma.remote_addr = remote_addr;
        wr.wr.rdma.rkey = rkey;
        WriteRequest { wr, sge: ibv_sge { addr: local.addr() + offset as u64, length: len, lkey: local.lkey() } }
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

    #[inline(always)]
    pub fn set_remote(&mut self, addr: u64) {
        // Writing a union field is safe; this request was built with the rdma member.
        self.wr.wr.rdma.remote_addr = addr;
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
