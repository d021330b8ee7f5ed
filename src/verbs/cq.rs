//! Completion queues: creating them (optionally on a completion channel), polling them,
//! sleeping on their events, and what a completion's status means.

use std::ffi::CStr;
use std::os::fd::AsRawFd;
use std::ptr::{NonNull, null_mut};
use std::sync::Arc;

use rdma_mummy_sys::{
    ibv_ack_cq_events, ibv_cq, ibv_get_cq_event, ibv_poll_cq, ibv_wc, ibv_wc_status, ibv_wc_status_str,
};
use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionChannel};

use super::context::Rdma;
use super::qp::{Qp, os_text};
use crate::error::{Error, Result};

/// One work completion, as libibverbs fills it.
pub type Completion = ibv_wc;

/// Which of a QP's completion queues a wait is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CqKind {
    Send,
    Recv,
}

pub(super) fn cq(
    rdma: &Rdma,
    entries: u32,
    channel: Option<&Arc<CompletionChannel>>,
) -> Result<Arc<BasicCompletionQueue>> {
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

#[inline(always)]
pub(super) fn poll(cq: NonNull<ibv_cq>, wcs: &mut [Completion]) -> Result<usize> {
    // SAFETY: the CQ is alive and `wcs` is writable for its length.
    let n = unsafe { ibv_poll_cq(cq.as_ptr(), wcs.len() as i32, wcs.as_mut_ptr()) };
    if n < 0 {
        return Err(Error::Environment(format!("ibv_poll_cq failed ({n})")));
    }
    Ok(n as usize)
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

/// A zeroed completion array for polling.
pub fn completions<const N: usize>() -> [Completion; N] {
    // SAFETY: ibv_wc is a C struct for which all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// Ok(wr_id) for a successful completion; otherwise the error it means. A transport retry
/// failure means the peer stopped acknowledging: it died or its QP is gone.
pub fn check_completion(wc: &Completion, peer: &str) -> Result<u64> {
    if wc.status == ibv_wc_status::IBV_WC_SUCCESS {
        return Ok(wc.wr_id);
    }
    // SAFETY: returns a static string for any status value.
    let text = unsafe { CStr::from_ptr(ibv_wc_status_str(wc.status)) }.to_string_lossy().into_owned();
    match wc.status {
        // The peer stopped acknowledging (retries exhausted), and what was queued behind it.
        ibv_wc_status::IBV_WC_RETRY_EXC_ERR
        | ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR
        | ibv_wc_status::IBV_WC_WR_FLUSH_ERR => Err(Error::Peer(format!(
            "{peer} stopped responding on the RDMA path: completion status {text} ({}); the link is down, or its \
             QP or host is gone",
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
