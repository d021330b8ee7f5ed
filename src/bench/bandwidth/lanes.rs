//! The lanes of a bandwidth run: a QP's sending half (`Sender`: window, post lists,
//! timing), its receiving half (`Receiver`: counts and checks arrivals, keeps receives
//! posted), and the set of lanes one thread drives (`LaneSet`).

use crate::bench::pattern;
use crate::error::Result;
use crate::link::wait::{EVENT_SLICE, RecvRing, SendWindow};
use crate::link::{Link, SizeRun};
use crate::signals;
use crate::spec::{AtomicOp, Operation, TestSpec};
use crate::stats::{Clock, PeakMeter, ThroughputSummary};
use crate::verbs::cq::{CqKind, check_completion, imm_of, wait_any_event};
use crate::verbs::{Qp, SendRequest, Transport};

use super::check_read_slots;

/// On lossy transports the receiver stops counting this long after the last arrival.
const LOSSY_DRAIN_NS: u64 = 200_000_000;

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
        Operation::Ring => unreachable!("ring tests run their own kernel (bench::ring)"),
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
        Operation::Ring => unreachable!("ring tests run their own kernel (bench::ring)"),
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
        let cq_mod = spec.signal_every(size).min(depth);
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
            // A Ctrl-C that winds a soak down ends a timed run as its time would.
            if let Some(limit) = self.limit_ns
                && !self.time_up
                && (t >= limit || signals::winding_down().is_some())
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
    ring: std::sync::MutexGuard<'a, Option<RecvRing>>,
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
            ring: run.link.receives.lock().expect("no poisoning"),
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

/// The lanes one thread drives: their sending and receiving halves and the combined
/// peak of their sends.
pub(super) struct LaneSet<'a> {
    senders: Vec<Sender<'a>>,
    receivers: Vec<Receiver<'a>>,
    peak: PeakMeter,
    start: u64,
    clock: &'a Clock,
    events: bool,
    /// Every lane's QP, for sleeping on all their completion channels at once.
    qps: Vec<&'a Qp>,
}

impl<'a> LaneSet<'a> {
    pub(super) fn new(runs: &[SizeRun<'a>], send: bool, receive: bool, start: u64) -> LaneSet<'a> {
        let senders: Vec<Sender> = if send { runs.iter().map(|r| Sender::new(r, start)).collect() } else { Vec::new() };
        let receivers = if receive { runs.iter().map(Receiver::new).collect() } else { Vec::new() };
        let peak = PeakMeter::new(senders.iter().map(Sender::peak_window).sum::<u64>().max(1));
        let qps = runs.iter().map(|r| &r.link.qp).collect();
        LaneSet { senders, receivers, peak, start, clock: runs[0].clock, events: runs[0].link.qp.has_events(), qps }
    }

    /// One round over every lane: post, reap, take arrivals. Returns how much moved.
    #[inline(always)]
    pub(super) fn step(&mut self, peer: &str) -> Result<u64> {
        let mut sent_now = 0;
        for s in self.senders.iter_mut() {
            s.post()?;
            if self.events {
                s.run.link.qp.arm(CqKind::Send)?;
            }
            sent_now += s.reap(peer)?;
        }
        if sent_now > 0 {
            let total: u64 = self.senders.iter().map(|s| s.completed).sum();
            self.peak.observe(self.clock.nanos(self.start, self.clock.now()), total);
        }
        let mut arrived = 0;
        for r in self.receivers.iter_mut() {
            if self.events {
                r.run.link.qp.arm(CqKind::Recv)?;
            }
            arrived += r.poll(peer)? as u64;
        }
        Ok(sent_now + arrived)
    }

    /// With `-e`, sleeps until any lane's completion channel reports (the CQs were armed
    /// before the polls that found nothing). False when events are off.
    pub(super) fn idle_wait(&self) -> Result<bool> {
        if !self.events {
            return Ok(false);
        }
        wait_any_event(&self.qps, EVENT_SLICE)?;
        Ok(true)
    }

    pub(super) fn sending_finished(&self) -> bool {
        self.senders.iter().all(Sender::finished)
    }

    /// Messages every lane has completed so far.
    #[inline(always)]
    pub(super) fn completed(&self) -> u64 {
        self.senders.iter().map(|s| s.completed).sum()
    }

    /// Messages that have arrived on every lane so far.
    pub(super) fn received(&self) -> u64 {
        self.receivers.iter().map(|r| r.received).sum()
    }

    pub(super) fn sent_per_qp(&self) -> Vec<u64> {
        self.senders.iter().map(|s| s.completed).collect()
    }

    /// Every lane has what the peer sent on it (`peer_per_qp` is this set's share).
    pub(super) fn receiving_finished(&self, peer_per_qp: &[u64]) -> bool {
        self.receivers.iter().zip(peer_per_qp).all(|(r, &t)| r.finished(t))
    }

    /// This set's sending direction, its reads checked.
    pub(super) fn finish(self, peer: &str) -> Result<LaneOutcome> {
        for s in &self.senders {
            check_read_slots(&s.run, s.completed, peer)?;
        }
        let sent = (!self.senders.is_empty()).then(|| {
            let completed: u64 = self.senders.iter().map(|s| s.completed).sum();
            let last = self.senders.iter().map(|s| s.last_completion).max().unwrap_or(self.start);
            let size = self.senders[0].run.size;
            ThroughputSummary::new(size, completed, self.clock.nanos(self.start, last), self.peak.peak())
        });
        let received = (!self.receivers.is_empty()).then(|| self.receivers.iter().map(|r| r.received).sum());
        let sent_per_qp = self.sent_per_qp();
        let data_error = self.receivers.into_iter().find_map(|r| r.data_error);
        Ok(LaneOutcome { sent, sent_per_qp, received, data_error })
    }
}

pub(super) struct LaneOutcome {
    pub(super) sent: Option<ThroughputSummary>,
    pub(super) sent_per_qp: Vec<u64>,
    pub(super) received: Option<u64>,
    pub(super) data_error: Option<String>,
}
