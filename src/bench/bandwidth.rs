//! Windowed bandwidth, as perftest measures it: keep up to `tx_depth` operations in
//! flight, request a completion every `cq_mod`, and time from the first post to the last
//! completion. Whatever room the window has is posted as one chain (one doorbell). The
//! peak is the best rate over a window of many completion batches (`stats::throughput`).
//!
//! The server is passive for write, read and atomics (it waits for `Done`, then checks
//! what landed); for send and write with immediate it keeps its receive queue stocked,
//! counts and checks every arrival.

use crate::bench::link::{Link, SizeRun};
use crate::bench::pattern;
use crate::bench::spec::{AtomicOp, Operation, TestSpec};
use crate::bench::wait::{EVENT_SLICE, SendWindow};
use crate::error::{Error, Result};
use crate::session::{Channel, Message, PeerPoll};
use crate::signals;
use crate::stats::{PeakMeter, ThroughputSummary};
use crate::verbs::qp::{CqKind, check_completion, imm_of};
use crate::verbs::{SendRequest, Transport};

/// Empty polls between looks at the deadline, signals and the control channel.
const IDLE_POLLS_PER_CHECK: u32 = 1024;
/// Polls that found completions between heartbeat checks while data flows.
const POLLS_PER_HEARTBEAT_CHECK: u32 = 64;
/// On lossy transports the receiver stops counting this long after the last arrival.
const LOSSY_DRAIN_NS: u64 = 200_000_000;

pub struct BandwidthRun {
    pub summary: ThroughputSummary,
    pub iterations: u64,
}

/// One pre-built request of the test's operation, aimed at slot 0.
fn request(link: &Link, spec: &TestSpec, size: u64) -> SendRequest {
    let l = &link.layout;
    let rkey = link.remote.rkey;
    let imm = spec.with_imm.then_some(0);
    match spec.operation {
        Operation::Write => SendRequest::write(&link.buf, 0, size as u32, link.remote_recv_addr(0), rkey, imm),
        Operation::Read => {
            SendRequest::read(&link.buf, l.recv_at(0) as usize, size as u32, link.remote_send_addr(0), rkey)
        }
        Operation::Send => {
            let r = SendRequest::send(&link.buf, 0, size as u32, imm);
            if spec.transport == Transport::Ud { r.to_ud(link.qp.ah(), link.remote.qpn) } else { r }
        }
        Operation::Atomic => match spec.atomic_op {
            AtomicOp::FetchAndAdd => SendRequest::fetch_add(&link.buf, 0, link.remote_recv_addr(0), rkey, 1),
            AtomicOp::CmpAndSwp => SendRequest::cmp_swap(&link.buf, 0, link.remote_recv_addr(0), rkey, 0, 1),
        },
    }
}

/// Sets up request `req` as message `m`: its slots, payload and per-message fields.
#[inline(always)]
fn aim(req: &mut SendRequest, link: &Link, spec: &TestSpec, size: u64, m: u64) {
    let l = &link.layout;
    if spec.with_imm {
        req.set_imm(m as u32);
    }
    match spec.operation {
        Operation::Atomic => {
            req.set_local(link.buf.addr() + l.send_at(m % l.send_slots), 8);
            if spec.atomic_op == AtomicOp::CmpAndSwp {
                req.set_atomic(m, m + 1);
            }
        }
        _ if !spec.validate_data => {}
        Operation::Read => {
            let slot = m % l.recv_slots;
            req.set_local(link.buf.addr() + l.recv_at(slot), size as u32);
            req.set_remote(link.remote_send_addr(slot % l.send_slots));
        }
        Operation::Write | Operation::Send => {
            let src = l.send_at(m % l.send_slots);
            // SAFETY: this slot's previous message completed: the window is at most `send_slots` deep.
            let body = unsafe { link.buf.bytes_mut(src as usize, size as usize) };
            if spec.operation == Operation::Send {
                pattern::fill_stamped(body, m);
            } else {
                pattern::fill(body, m);
            }
            if spec.corrupt_at == Some(m) {
                let at = if spec.operation == Operation::Send && size > 8 { 8 } else { 0 };
                body[at] ^= 0xff;
            }
            req.set_local(link.buf.addr() + src, size as u32);
            if spec.operation == Operation::Write {
                req.set_remote(link.remote_recv_addr(m % l.recv_slots));
            }
        }
    }
}

pub fn client(run: &SizeRun, chan: &mut Channel) -> Result<BandwidthRun> {
    let SizeRun { link, spec, size, clock, timeout_ns } = *run;
    let l = &link.layout;
    // A validated payload's source slot is reused only after its message completed.
    let reuses_sources = spec.validate_data && matches!(spec.operation, Operation::Write | Operation::Send);
    let depth = if reuses_sources { spec.tx_depth.min(l.send_slots as u32) } else { spec.tx_depth };
    let cq_mod = spec.effective_cq_mod().min(depth);
    let mut window = SendWindow::new(depth, cq_mod);
    // Ten completion batches per window bounds a batch's effect on the peak to 10 %.
    let mut peak = PeakMeter::new((depth as u64).max(10 * cq_mod as u64));
    let mut reqs: Vec<SendRequest> = (0..depth).map(|_| request(link, spec, size)).collect();
    let inline = size <= link.inline_size as u64 && spec.has_payload() && spec.operation != Operation::Read;
    let total = if spec.duration_secs.is_some() { u64::MAX } else { spec.iterations };
    let limit_ns = spec.duration_secs.map(|d| (d * 1e9) as u64);
    let peer = chan.peer().to_string();
    let events = link.qp.has_events();

    let (mut posted, mut completed) = (0u64, 0u64);
    let mut time_up = false;
    let mut posting_done = false;
    let mut idle = 0u32;
    let mut completion_polls = 0u32;
    let start = clock.now();
    let mut last_progress = start;
    // With -l, post only whole chains of `post_list` (the last one may be shorter).
    let chain = spec.post_list.unwrap_or(1) as u64;
    loop {
        let mut batch = 0;
        let room = (depth - window.outstanding()) as u64;
        let remaining = total.saturating_sub(posted);
        let wanted = if time_up { 1 } else { chain.min(remaining) };
        let postable = if room >= wanted { room - room % chain.min(wanted).max(1) } else { 0 };
        while !posting_done && (batch as u64) < postable {
            let last = posted + 1 == total || time_up;
            // A chain that leaves no room for the next one must ask for a completion, or
            // the window could wait for completions nobody requested.
            let ends_chain = (batch as u64 + 1).is_multiple_of(chain);
            let starves = ends_chain && (window.outstanding() as u64 + 1 + chain) > depth as u64;
            let req = &mut reqs[batch];
            aim(req, link, spec, size, posted);
            let (signaled, id) = window.on_post(last || starves);
            req.set_flags(signaled, inline);
            req.set_wr_id(id);
            batch += 1;
            posted += 1;
            posting_done = last;
        }
        if spec.post_list.is_some() {
            for chunk in reqs[..batch].chunks_mut(chain as usize) {
                link.qp.post_batch(chunk)?;
            }
        } else {
            link.qp.post_batch(&mut reqs[..batch])?;
        }

        if events {
            link.qp.arm(CqKind::Send)?;
        }
        let n = window.reap(link, &peer)?;
        if n > 0 {
            completed += n;
            last_progress = clock.now();
            let t = clock.nanos(start, last_progress);
            peak.observe(t, completed);
            if let Some(limit) = limit_ns
                && !time_up
                && t >= limit
            {
                time_up = true;
                // The next post is the last and is signalled; none is needed if nothing is unsignalled.
                posting_done = posting_done || window.unsignaled() == 0;
            }
            completion_polls += 1;
            if completion_polls.is_multiple_of(POLLS_PER_HEARTBEAT_CHECK) {
                chan.heartbeat_if_due()?;
            }
            if posting_done && completed == posted {
                break;
            }
            continue;
        }
        idle += 1;
        if events && window.outstanding() > 0 {
            // -e: the CQ was armed before the poll that found nothing, so sleeping is safe.
            link.qp.wait_event(EVENT_SLICE)?;
            idle = IDLE_POLLS_PER_CHECK;
        }
        if idle.is_multiple_of(IDLE_POLLS_PER_CHECK) {
            signals::check()?;
            chan.heartbeat_if_due()?;
            if let PeerPoll::Message(m) = chan.poll_peer("the bandwidth run")? {
                return Err(Error::Peer(format!("{peer} sent {} in the middle of the run", m.kind())));
            }
            if clock.nanos(last_progress, clock.now()) >= timeout_ns {
                return Err(Error::Peer(format!(
                    "no operation completed for {:.1} s ({completed} of {posted} done; --timeout): {peer} hung or died",
                    timeout_ns as f64 / 1e9
                )));
            }
        }
    }
    if spec.operation == Operation::Read && spec.validate_data {
        // Every landing slot holds the pattern of the remote slot it was read from.
        for slot in 0..l.recv_slots.min(completed) {
            // SAFETY: all reads completed.
            let got = unsafe { link.buf.bytes(l.recv_at(slot) as usize, size as usize) };
            if let Some(off) = pattern::first_mismatch(got, slot % l.send_slots) {
                return Err(Error::Check(format!("read data from {peer} is wrong in slot {slot}, byte {off}")));
            }
        }
    }
    let elapsed = clock.nanos(start, last_progress);
    Ok(BandwidthRun {
        summary: ThroughputSummary::new(size, completed, elapsed, peak.peak_msgs_per_sec()),
        iterations: completed,
    })
}

/// The server side of one size: (messages it saw, first data error).
pub fn server(run: &SizeRun, chan: &mut Channel) -> Result<(u64, Option<String>)> {
    let SizeRun { link, spec, size, .. } = *run;
    let (iterations, mut data_error) = if spec.uses_receives() {
        receive(run, chan)?
    } else {
        match chan.recv("the end of the bandwidth run")? {
            Message::Done { size: s, iterations } if s == size => (iterations, None),
            other => return Err(Error::Peer(format!("{} sent {} instead of done", chan.peer(), other.kind()))),
        }
    };
    if data_error.is_none() {
        data_error = crate::bench::latency::atomic_counter_error(run, iterations);
    }
    if data_error.is_none() && spec.validate_data && spec.operation == Operation::Write {
        data_error = check_write_slots(link, size, iterations);
    }
    Ok((iterations, data_error))
}

/// The last message written to every receive slot must be intact.
fn check_write_slots(link: &Link, size: u64, iterations: u64) -> Option<String> {
    let l = &link.layout;
    for slot in 0..l.recv_slots.min(iterations) {
        let last = slot + ((iterations - 1 - slot) / l.recv_slots) * l.recv_slots;
        // SAFETY: the client finished: nothing writes this memory any more.
        let body = unsafe { link.buf.bytes(l.recv_at(slot) as usize, size as usize) };
        if let Some(b) = pattern::first_mismatch(body, last) {
            return Some(format!("data mismatch in message {last} (slot {slot}), byte {b} of a {size}-byte message"));
        }
    }
    None
}

/// Counts and checks arrivals until the client's `Done` and its last message. On UC and
/// UD messages may be lost: then the count is what arrived before the line went quiet.
fn receive(run: &SizeRun, chan: &mut Channel) -> Result<(u64, Option<String>)> {
    let SizeRun { link, spec, size, clock, timeout_ns } = *run;
    let lossy = spec.transport != Transport::Rc;
    let mut ring_ref = link.receives.borrow_mut();
    let ring = ring_ref.as_mut().expect("receive-based tests have a receive ring");
    let peer = chan.peer().to_string();
    let (mut received, mut next_index) = (0u64, 0u64);
    let mut data_error: Option<String> = None;
    let mut total: Option<u64> = None;
    let mut last_progress = clock.now();
    let mut idle = 0u32;
    loop {
        if link.qp.has_events() {
            link.qp.arm(CqKind::Recv)?;
        }
        let n = ring.poll(link)?;
        for k in 0..n {
            let wc = *ring.completion(k);
            check_completion(&wc, &peer)?;
            let index = if spec.with_imm { imm_of(&wc) as u64 } else { next_index };
            if data_error.is_none() && spec.with_imm && !lossy && index != next_index {
                data_error = Some(format!("immediate {index} arrived where {next_index} was due"));
            }
            if data_error.is_none() && spec.validate_data && spec.operation == Operation::Send {
                let at = (link.layout.recv_at(ring.slot_of(link, &wc)) + link.layout.recv_payload) as usize;
                // SAFETY: this receive completed and is reposted only after the check.
                let body = unsafe { link.buf.bytes(at, size as usize) };
                match pattern::check_stamped(body, next_index) {
                    Ok(i) => next_index = i,
                    Err(e) => data_error = Some(e),
                }
            } else {
                next_index = index;
            }
            next_index += 1;
            received += 1;
        }
        if n > 0 {
            ring.release(link, n)?;
            last_progress = clock.now();
        } else {
            idle += 1;
            if link.qp.has_events() {
                // Armed before the empty poll: sleeping until the next event is safe.
                link.qp.wait_event(EVENT_SLICE)?;
                idle = IDLE_POLLS_PER_CHECK;
            }
        }
        if let Some(t) = total
            && (received >= t || (lossy && clock.nanos(last_progress, clock.now()) >= LOSSY_DRAIN_NS))
        {
            return Ok((received, data_error));
        }
        if n == 0 && idle.is_multiple_of(IDLE_POLLS_PER_CHECK) {
            signals::check()?;
            if total.is_none() {
                match chan.poll_peer("the bandwidth run")? {
                    PeerPoll::Message(Message::Done { size: s, iterations }) if s == size => {
                        total = Some(iterations);
                        last_progress = clock.now();
                    }
                    PeerPoll::Message(m) => {
                        return Err(Error::Peer(format!("{peer} sent {} in the middle of the run", m.kind())));
                    }
                    PeerPoll::Quiet => {}
                }
            }
            if clock.nanos(last_progress, clock.now()) >= timeout_ns {
                return Err(Error::Peer(format!(
                    "nothing arrived for {:.1} s ({received} messages so far; --timeout): {peer} hung or died",
                    timeout_ns as f64 / 1e9
                )));
            }
        }
    }
}
