//! Work requests: a send or receive request with its one scatter/gather entry, built once
//! and re-posted (no allocation per post), and chains of them for one doorbell.

use std::ptr::null_mut;

use rdma_mummy_sys::{ibv_ah, ibv_recv_wr, ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wr_opcode};

use super::buffer::RegisteredBuf;
use super::qp::UD_QKEY;

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

// SAFETY: a RecvRequest is plain data (a work request and its scatter entry); its
// pointers point into itself or into registered memory that outlives it, and it is moved
// to the thread that posts it, never shared.
unsafe impl Send for RecvRequest {}

/// A work request with one scatter/gather entry, linkable into a chain.
pub(super) trait Chainable {
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
pub(super) fn chain<T: Chainable>(reqs: &mut [T]) -> Option<*mut T::Wr> {
    let n = reqs.len();
    for i in 0..n {
        let next = if i + 1 < n { reqs[i + 1].wr() } else { null_mut() };
        reqs[i].link(next);
    }
    reqs.first_mut().map(|r| r.wr())
}
