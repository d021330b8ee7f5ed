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
use crate::bench::wait::{EVENT_SLICE, RecvRing, SendWindow};
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
            let (compare_add, swap) = crate::bench::latency::atomic_operands(spec, m);
            req.set_atomic(compare_add, swap);
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

/// This side's sending half: posts operations through the window and times them.
struct Sender<'a> {
    run: SizeRun<'a>,
    window: SendWindow,
    reqs: Vec<SendRequest>,
    depth: u32,
    chain: u64,
    inline: bool,
    total: u64,
    limit_ns: Option<u64>,
    posted: u64,
    completed: u64,
    time_up: bool,
    posting_done: bool,
    start: u64,
    last_completion: u64,
}

impl<'a> Sender<'a> {
    fn new(run: &SizeRun<'a>, start: u64) -> Sender<'a> {
        let SizeRun { link, spec, size, .. } = *run;
        let l = &link.layout;
        // A validated payload's source slot is reused only after its message completed.
        let reuses_sources = spec.validate_data && matches!(spec.operation, Operation::Write | Operation::Send);
        let depth = if reuses_sources { spec.tx_depth.min(l.send_slots as u32) } else { spec.tx_depth };
        let cq_mod = spec.effective_cq_mod().min(depth);
        Sender {
            run: *run,
            window: SendWindow::new(depth, cq_mod),
            reqs: (0..depth).map(|_| request(link, spec, size)).collect(),
            depth,
            // With -l, post only whole chains of `post_list` (the last one may be shorter).
            chain: spec.post_list.unwrap_or(1) as u64,
            inline: size <= link.inline_size as u64 && spec.has_payload() && spec.operation != Operation::Read,
            total: if spec.duration_secs.is_some() { u64::MAX } else { spec.iterations },
            limit_ns: spec.duration_secs.map(|d| (d * 1e9) as u64),
            posted: 0,
            completed: 0,
            time_up: false,
            posting_done: false,
            start,
            last_completion: start,
        }
    }

    /// Posts whatever the window (and the post-list length) allows.
    #[inline(always)]
    fn post(&mut self) -> Result<()> {
        let SizeRun { link, spec, size, .. } = self.run;
        let (chain, depth) = (self.chain, self.depth as u64);
        let room = depth - self.window.outstanding() as u64;
        let remaining = self.total.saturating_sub(self.posted);
        let wanted = if self.time_up { 1 } else { chain.min(remaining) };
        let postable = if room >= wanted { room - room % chain.min(wanted).max(1) } else { 0 };
        let mut batch = 0;
        while !self.posting_done && (batch as u64) < postable {
            let last = self.posted + 1 == self.total || self.time_up;
            // A chain that leaves no room for the next one must ask for a completion, or
            // the window could wait for completions nobody requested.
            let ends_chain = (batch as u64 + 1).is_multiple_of(chain);
            let starves = ends_chain && (self.window.outstanding() as u64 + 1 + chain) > depth;
            let req = &mut self.reqs[batch];
            aim(req, link, spec, size, self.posted);
            let (signaled, id) = self.window.on_post(last || starves);
            req.set_flags(signaled, self.inline);
            req.set_wr_id(id);
            batch += 1;
            self.posted += 1;
            self.posting_done = last;
        }
        if spec.post_list.is_some() {
            for chunk in self.reqs[..batch].chunks_mut(chain as usize) {
                link.qp.post_batch(chunk)?;
            }
            Ok(())
        } else {
            link.qp.post_batch(&mut self.reqs[..batch])
        }
    }

    /// Takes the completions that arrived; returns how many operations completed.
    #[inline(always)]
    fn reap(&mut self, peer: &str) -> Result<u64> {
        let n = self.window.reap(self.run.link, peer)?;
        if n > 0 {
            let clock = self.run.clock;
            self.completed += n;
            self.last_completion = clock.now();
            let t = clock.nanos(self.start, self.last_completion);
            if let Some(limit) = self.limit_ns
                && !self.time_up
                && t >= limit
            {
                self.time_up = true;
                // The next post is the last and is signalled; none is needed if nothing is unsignalled.
                self.posting_done = self.posting_done || self.window.unsignaled() == 0;
            }
        }
        Ok(n)
    }

    fn finished(&self) -> bool {
        self.posting_done && self.completed == self.posted
    }

    /// The completion window a peak is measured over: ten completion batches bound a
    /// batch's effect on the peak to 10 %.
    fn peak_window(&self) -> u64 {
        (self.depth as u64).max(10 * self.window.signal_every() as u64)
    }
}

/// This side's receiving half (send and write-with-immediate tests): counts and checks
/// every arrival and keeps the receive queue stocked.
struct Receiver<'a> {
    run: SizeRun<'a>,
    ring: std::cell::RefMut<'a, Option<RecvRing>>,
    lossy: bool,
    received: u64,
    next_index: u64,
    data_error: Option<String>,
    last_arrival: u64,
}

impl<'a> Receiver<'a> {
    fn new(run: &SizeRun<'a>) -> Receiver<'a> {
        Receiver {
            run: *run,
            ring: run.link.receives.borrow_mut(),
            lossy: run.spec.transport != Transport::Rc,
            received: 0,
            next_index: 0,
            data_error: None,
            last_arrival: run.clock.now(),
        }
    }

    #[inline(always)]
    fn poll(&mut self, peer: &str) -> Result<usize> {
        let SizeRun { link, spec, size, clock, .. } = self.run;
        let ring = self.ring.as_mut().expect("receive-based tests have a receive ring");
        let n = ring.poll(link)?;
        for k in 0..n {
            let wc = *ring.completion(k);
            check_completion(&wc, peer)?;
            let index = if spec.with_imm { imm_of(&wc) as u64 } else { self.next_index };
            if self.data_error.is_none() && spec.with_imm && !self.lossy && index != self.next_index {
                self.data_error = Some(format!("immediate {index} arrived where {} was due", self.next_index));
            }
            if self.data_error.is_none() && spec.validate_data && spec.operation == Operation::Send {
                let at = (link.layout.recv_at(ring.slot_of(link, &wc)) + link.layout.recv_payload) as usize;
                // SAFETY: this receive completed and is reposted only after the check.
                let body = unsafe { link.buf.bytes(at, size as usize) };
                match pattern::check_stamped(body, self.next_index) {
                    Ok(i) => self.next_index = i,
                    Err(e) => self.data_error = Some(e),
                }
            } else {
                self.next_index = index;
            }
            self.next_index += 1;
            self.received += 1;
        }
        if n > 0 {
            ring.release(link, n)?;
            self.last_arrival = clock.now();
        }
        Ok(n)
    }

    /// Everything the peer sent has arrived; on UC and UD, or the line has gone quiet.
    fn finished(&self, peer_total: u64) -> bool {
        let clock = self.run.clock;
        self.received >= peer_total || (self.lossy && clock.nanos(self.last_arrival, clock.now()) >= LOSSY_DRAIN_NS)
    }
}

/// What one side did in a bandwidth run.
pub struct SideOutcome {
    /// This side's sending direction, when it sent.
    pub sent: Option<BandwidthRun>,
    /// Messages the peer says it sent (from its `Done`), when it sent.
    pub peer_total: Option<u64>,
    /// The same per QP, in QP order.
    pub peer_per_qp: Vec<u64>,
    /// With `-q`: the messages each of this side's QPs sent.
    pub sent_per_qp: Vec<u64>,
    /// Messages that arrived here (send and write-with-immediate tests).
    pub received: Option<u64>,
    pub data_error: Option<String>,
}

/// Runs this side's halves until both are finished: its own sends all completed (then,
/// when `announce`, it tells the peer with `Done`), and, when the peer sends too, the
/// peer's `Done` has come and its messages have arrived.
fn drive(runs: &[SizeRun], chan: &mut Channel, send: bool, peer_sends: bool, announce: bool) -> Result<SideOutcome> {
    let SizeRun { link, spec, size, clock, timeout_ns } = runs[0];
    let peer = chan.peer().to_string();
    let start = clock.now();
    let mut senders: Vec<Sender> = if send { runs.iter().map(|r| Sender::new(r, start)).collect() } else { Vec::new() };
    let mut receivers: Vec<Receiver> =
        if peer_sends && spec.uses_receives() { runs.iter().map(Receiver::new).collect() } else { Vec::new() };
    let mut peak = PeakMeter::new(senders.iter().map(Sender::peak_window).sum::<u64>().max(1));
    let events = link.qp.has_events();
    let mut peer_per_qp: Option<Vec<u64>> = None;
    let mut announced = !announce;
    let mut idle = 0u32;
    let mut busy = 0u32;
    let mut last_progress = start;
    loop {
        let mut progress = 0;
        let mut sent_now = 0;
        for s in senders.iter_mut() {
            s.post()?;
            if events {
                s.run.link.qp.arm(CqKind::Send)?;
            }
            sent_now += s.reap(&peer)?;
        }
        if sent_now > 0 {
            let total: u64 = senders.iter().map(|s| s.completed).sum();
            peak.observe(clock.nanos(start, clock.now()), total);
            progress += sent_now;
        }
        let mine_finished = senders.iter().all(Sender::finished);
        if !announced && mine_finished {
            let per_qp: Vec<u64> = senders.iter().map(|s| s.completed).collect();
            chan.send(&Message::Done { size, iterations: per_qp.iter().sum(), per_qp })?;
            announced = true;
        }
        for r in receivers.iter_mut() {
            if events {
                r.run.link.qp.arm(CqKind::Recv)?;
            }
            progress += r.poll(&peer)? as u64;
        }
        let theirs_done = !peer_sends
            || peer_per_qp.as_ref().is_some_and(|per| receivers.iter().zip(per).all(|(r, &t)| r.finished(t)));
        if mine_finished && announced && theirs_done {
            break;
        }
        if progress > 0 {
            last_progress = clock.now();
            busy += 1;
            if busy.is_multiple_of(POLLS_PER_HEARTBEAT_CHECK) {
                chan.heartbeat_if_due()?;
            }
            continue;
        }
        idle += 1;
        if events && runs.len() == 1 {
            // The CQs were armed before the polls that found nothing: sleeping is safe.
            // (With several QPs their channels differ: poll them instead.)
            link.qp.wait_event(EVENT_SLICE)?;
            idle = IDLE_POLLS_PER_CHECK;
        }
        if idle.is_multiple_of(IDLE_POLLS_PER_CHECK) {
            signals::check()?;
            chan.heartbeat_if_due()?;
            match chan.poll_peer("the bandwidth run")? {
                PeerPoll::Quiet => {}
                PeerPoll::Message(Message::Done { size: s, iterations, per_qp }) if peer_sends && s == size => {
                    peer_per_qp = Some(split_per_qp(iterations, per_qp, runs.len()));
                    last_progress = clock.now();
                }
                PeerPoll::Message(m) => {
                    return Err(Error::Peer(format!("{peer} sent {} in the middle of the run", m.kind())));
                }
            }
            if clock.nanos(last_progress, clock.now()) >= timeout_ns {
                let sent: u64 = senders.iter().map(|s| s.completed).sum();
                let posted: u64 = senders.iter().map(|s| s.posted).sum();
                let so_far = if send { format!("{sent} of {posted} sent; ") } else { String::new() };
                let got = if receivers.is_empty() {
                    String::new()
                } else {
                    format!("{} received; ", receivers.iter().map(|r| r.received).sum::<u64>())
                };
                return Err(Error::Peer(format!(
                    "nothing moved for {:.1} s ({so_far}{got}--timeout): {peer} hung or died",
                    timeout_ns as f64 / 1e9
                )));
            }
        }
    }
    for s in &senders {
        check_read_slots(&s.run, s.completed, &peer)?;
    }
    let sent_per_qp: Vec<u64> = senders.iter().map(|s| s.completed).collect();
    let sent = send.then(|| {
        let completed: u64 = sent_per_qp.iter().sum();
        let last = senders.iter().map(|s| s.last_completion).max().unwrap_or(start);
        let summary = ThroughputSummary::new(size, completed, clock.nanos(start, last), peak.peak_msgs_per_sec());
        BandwidthRun { summary, iterations: completed }
    });
    let received = (!receivers.is_empty()).then(|| receivers.iter().map(|r| r.received).sum());
    let data_error = receivers.into_iter().find_map(|r| r.data_error);
    let peer_per_qp = peer_per_qp.unwrap_or_default();
    Ok(SideOutcome {
        sent,
        peer_total: peer_sends.then(|| peer_per_qp.iter().sum()),
        peer_per_qp,
        sent_per_qp,
        received,
        data_error,
    })
}

/// The peer's per-QP counts; a peer with one QP may leave `per_qp` empty.
fn split_per_qp(total: u64, per_qp: Vec<u64>, qps: usize) -> Vec<u64> {
    if per_qp.len() == qps {
        per_qp
    } else {
        vec![total; 1].into_iter().chain(std::iter::repeat_n(0, qps.saturating_sub(1))).collect()
    }
}

/// After reads: every landing slot holds the pattern of the remote slot it was read from.
fn check_read_slots(run: &SizeRun, completed: u64, peer: &str) -> Result<()> {
    let SizeRun { link, spec, size, .. } = *run;
    if spec.operation != Operation::Read || !spec.validate_data {
        return Ok(());
    }
    let l = &link.layout;
    for slot in 0..l.recv_slots.min(completed) {
        // SAFETY: all reads completed.
        let got = unsafe { link.buf.bytes(l.recv_at(slot) as usize, size as usize) };
        if let Some(off) = pattern::first_mismatch(got, slot % l.send_slots) {
            return Err(Error::Check(format!("read data from {peer} is wrong in slot {slot}, byte {off}")));
        }
    }
    Ok(())
}

/// The client's part: send, and with `-b` also take the server's traffic. Without `-b`
/// the runner sends `Done` afterwards; with it, `drive` does as soon as sending ends.
pub fn client(runs: &[SizeRun], chan: &mut Channel) -> Result<SideOutcome> {
    let both = runs[0].spec.bidirectional;
    drive(runs, chan, true, both, both)
}

/// The server side of one size: (messages it saw, first data error, its own direction
/// with `-b`).
pub fn server(runs: &[SizeRun], chan: &mut Channel) -> Result<(u64, Option<String>, Option<ThroughputSummary>)> {
    let SizeRun { spec, size, .. } = runs[0];
    let outcome = if spec.bidirectional || spec.uses_receives() {
        drive(runs, chan, spec.bidirectional, true, spec.bidirectional)?
    } else {
        // Passive: nothing to poll, so sleep in the channel until the client's `Done`.
        match chan.recv("the end of the bandwidth run")? {
            Message::Done { size: s, iterations, per_qp } if s == size => SideOutcome {
                sent: None,
                peer_total: Some(iterations),
                peer_per_qp: split_per_qp(iterations, per_qp, runs.len()),
                sent_per_qp: Vec::new(),
                received: None,
                data_error: None,
            },
            other => return Err(Error::Peer(format!("{} sent {} instead of done", chan.peer(), other.kind()))),
        }
    };
    let peer_total = outcome.peer_total.unwrap_or(0);
    let seen = outcome.received.unwrap_or(peer_total);
    let data_error = outcome.data_error.or_else(|| landed_data_error(runs, &outcome.peer_per_qp));
    Ok((seen, data_error, outcome.sent.map(|s| s.summary)))
}

/// The last message written to every receive slot must be intact.
fn check_write_slots(link: &Link, size: u64, iterations: u64) -> Option<String> {
    let l = &link.layout;
    for slot in 0..l.recv_slots.min(iterations) {
        let last = slot + ((iterations - 1 - slot) / l.recv_slots) * l.recv_slots;
        // SAFETY: the peer finished: nothing writes this memory any more.
        let body = unsafe { link.buf.bytes(l.recv_at(slot) as usize, size as usize) };
        if let Some(b) = pattern::first_mismatch(body, last) {
            return Some(format!("data mismatch in message {last} (slot {slot}), byte {b} of a {size}-byte message"));
        }
    }
    None
}

/// Checks what the peer's one-sided operations left in this side's memory, QP by QP: the
/// atomic counter, and the last message written to every receive slot.
pub fn landed_data_error(runs: &[SizeRun], peer_per_qp: &[u64]) -> Option<String> {
    runs.iter().zip(peer_per_qp).find_map(|(run, &n)| {
        crate::bench::latency::atomic_counter_error(run, n).or_else(|| {
            (run.spec.validate_data && run.spec.operation == Operation::Write)
                .then(|| check_write_slots(run.link, run.size, n))
                .flatten()
        })
    })
}
