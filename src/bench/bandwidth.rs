//! Windowed bandwidth, as perftest measures it: keep up to `tx_depth` writes in flight,
//! request a completion every `cq_mod` writes, and time from the first post to the last
//! completion. The peak is the best rate over a window of at least one queue's worth of
//! messages (see `stats::throughput`). The passive side only waits for the client's
//! `Done` and, when validating, checks what landed.

use crate::bench::link::{Link, SizeRun};
use crate::bench::pattern;
use crate::bench::spec::TestSpec;
use crate::bench::wait::SendWindow;
use crate::error::{Error, Result};
use crate::session::{Channel, Message, PeerPoll};
use crate::signals;
use crate::stats::{PeakMeter, ThroughputSummary};
use crate::verbs::WriteRequest;

/// Empty polls between looks at the deadline, signals and the control channel.
const IDLE_POLLS_PER_CHECK: u32 = 1024;
/// Completion events between heartbeat checks while data flows.
const EVENTS_PER_HEARTBEAT_CHECK: u32 = 64;

pub struct BandwidthRun {
    pub summary: ThroughputSummary,
    pub iterations: u64,
}

pub fn client(run: &SizeRun, chan: &mut Channel) -> Result<BandwidthRun> {
    let SizeRun { link, spec, size, clock, timeout_ns } = *run;
    let validate = spec.validate_data;
    let depth = if validate { spec.tx_depth.min(link.slots as u32) } else { spec.tx_depth };
    let cq_mod = spec.effective_cq_mod().min(depth);
    let mut window = SendWindow::new(depth, cq_mod);
    // Ten completion batches per window bounds a batch's effect on the peak to 10 %.
    let mut peak = PeakMeter::new((depth as u64).max(10 * cq_mod as u64));
    // One pre-built request per queue slot: whatever room the window has is posted as
    // one chain, with one doorbell, instead of one call per message.
    let mut reqs: Vec<WriteRequest> = (0..depth)
        .map(|_| WriteRequest::rdma_write(&link.buf, 0, size as u32, link.remote_recv_addr(), link.remote.rkey))
        .collect();
    let inline = size <= link.inline_size as u64;
    let total = if spec.duration_secs.is_some() { u64::MAX } else { spec.iterations };
    let limit_ns = spec.duration_secs.map(|d| (d * 1e9) as u64);
    let peer = chan.peer().to_string();

    let (mut posted, mut completed) = (0u64, 0u64);
    let mut time_up = false;
    let mut posting_done = false;
    let mut idle = 0u32;
    let mut events = 0u32;
    let start = clock.now();
    let mut last_progress = start;
    loop {
        let mut batch = 0;
        while !posting_done && window.has_room() {
            let last = posted + 1 == total || time_up;
            let req = &mut reqs[batch];
            if validate {
                let slot = posted % link.slots;
                let off = (slot * size) as usize;
                // SAFETY: this slot's previous write completed: the window is at most `slots` deep.
                let body = unsafe { link.buf.bytes_mut(off, size as usize) };
                pattern::fill(body, posted);
                if spec.corrupt_at == Some(posted) {
                    body[0] ^= 0xff;
                }
                req.set_local(link.buf.addr() + off as u64, size as u32);
                req.set_remote(link.remote_recv_addr() + off as u64);
            }
            let (signaled, id) = window.on_post(last);
            req.set_flags(signaled, inline);
            req.set_wr_id(id);
            batch += 1;
            posted += 1;
            posting_done = last;
        }
        link.qp.post_batch(&mut reqs[..batch])?;

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
                // The next post is the last and is signalled; none needed if nothing is unsignalled.
                posting_done = window.outstanding() == 0 || posting_done;
            }
            events += 1;
            if events.is_multiple_of(EVENTS_PER_HEARTBEAT_CHECK) {
                chan.heartbeat_if_due()?;
            }
            if posting_done && completed == posted {
                break;
            }
            continue;
        }
        idle += 1;
        if idle.is_multiple_of(IDLE_POLLS_PER_CHECK) {
            signals::check()?;
            chan.heartbeat_if_due()?;
            if let PeerPoll::Message(m) = chan.poll_peer("the bandwidth run")? {
                return Err(Error::Peer(format!("{peer} sent {} in the middle of the run", m.kind())));
            }
            if clock.nanos(last_progress, clock.now()) >= timeout_ns {
                return Err(Error::Peer(format!(
                    "no write completed for {:.1} s ({completed} of {posted} done; --timeout): {peer} hung or died",
                    timeout_ns as f64 / 1e9
                )));
            }
        }
    }
    let elapsed = clock.nanos(start, last_progress);
    Ok(BandwidthRun {
        summary: ThroughputSummary::new(size, completed, elapsed, peak.peak_msgs_per_sec()),
        iterations: completed,
    })
}

/// The passive side: waits for the client's `Done` (heartbeats keep the wait alive) and,
/// when validating, checks the last message that landed in every slot.
pub fn server(link: &Link, spec: &TestSpec, size: u64, chan: &mut Channel) -> Result<(u64, Option<String>)> {
    let iterations = match chan.recv("the end of the bandwidth run")? {
        Message::Done { size: s, iterations } if s == size => iterations,
        other => {
            return Err(Error::Peer(format!("{} sent {} instead of done", chan.peer(), other.kind())));
        }
    };
    let mut data_error = None;
    if spec.validate_data {
        for slot in 0..link.slots.min(iterations) {
            let last = slot + ((iterations - 1 - slot) / link.slots) * link.slots;
            let off = link.recv_offset() + (slot * size) as usize;
            // SAFETY: the client finished: nothing writes this memory any more.
            let body = unsafe { link.buf.bytes(off, size as usize) };
            if let Some(b) = pattern::first_mismatch(body, last) {
                data_error =
                    Some(format!("data mismatch in message {last} (slot {slot}), byte {b} of a {size}-byte message"));
                break;
            }
        }
    }
    Ok((iterations, data_error))
}
