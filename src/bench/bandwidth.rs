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
use crate::stats::{Clock, PeakMeter, ThroughputSummary};
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
    /// With `--threads`: each thread's sending direction.
    pub per_thread: Vec<ThroughputSummary>,
    /// Messages that arrived here (send and write-with-immediate tests).
    pub received: Option<u64>,
    pub data_error: Option<String>,
}

/// The lanes one thread drives: their sending and receiving halves and the combined
/// peak of their sends.
struct LaneSet<'a> {
    senders: Vec<Sender<'a>>,
    receivers: Vec<Receiver<'a>>,
    peak: PeakMeter,
    start: u64,
    clock: &'a Clock,
    events: bool,
}

impl<'a> LaneSet<'a> {
    fn new(runs: &[SizeRun<'a>], send: bool, receive: bool, start: u64) -> LaneSet<'a> {
        let senders: Vec<Sender> = if send { runs.iter().map(|r| Sender::new(r, start)).collect() } else { Vec::new() };
        let receivers = if receive { runs.iter().map(Receiver::new).collect() } else { Vec::new() };
        let peak = PeakMeter::new(senders.iter().map(Sender::peak_window).sum::<u64>().max(1));
        LaneSet { senders, receivers, peak, start, clock: runs[0].clock, events: runs[0].link.qp.has_events() }
    }

    /// One round over every lane: post, reap, take arrivals. Returns how much moved.
    #[inline(always)]
    fn step(&mut self, peer: &str) -> Result<u64> {
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

    /// Sleeps on the completion channel when there is exactly one lane (its CQs were armed
    /// before the polls that found nothing). With several lanes their channels differ, so
    /// they are polled instead.
    fn idle_wait(&self) -> Result<bool> {
        let lanes = self.senders.len().max(self.receivers.len());
        if self.events && lanes == 1 {
            let link = self.senders.first().map(|s| s.run.link).or(self.receivers.first().map(|r| r.run.link));
            if let Some(link) = link {
                link.qp.wait_event(EVENT_SLICE)?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn sending_finished(&self) -> bool {
        self.senders.iter().all(Sender::finished)
    }

    fn sent_per_qp(&self) -> Vec<u64> {
        self.senders.iter().map(|s| s.completed).collect()
    }

    /// Every lane has what the peer sent on it (`peer_per_qp` is this set's share).
    fn receiving_finished(&self, peer_per_qp: &[u64]) -> bool {
        self.receivers.iter().zip(peer_per_qp).all(|(r, &t)| r.finished(t))
    }

    /// This set's sending direction, its reads checked.
    fn finish(self, peer: &str) -> Result<LaneOutcome> {
        for s in &self.senders {
            check_read_slots(&s.run, s.completed, peer)?;
        }
        let sent = (!self.senders.is_empty()).then(|| {
            let completed: u64 = self.senders.iter().map(|s| s.completed).sum();
            let last = self.senders.iter().map(|s| s.last_completion).max().unwrap_or(self.start);
            let size = self.senders[0].run.size;
            ThroughputSummary::new(size, completed, self.clock.nanos(self.start, last), self.peak.peak_msgs_per_sec())
        });
        let received = (!self.receivers.is_empty()).then(|| self.receivers.iter().map(|r| r.received).sum());
        let sent_per_qp = self.sent_per_qp();
        let data_error = self.receivers.into_iter().find_map(|r| r.data_error);
        Ok(LaneOutcome { sent, sent_per_qp, received, data_error })
    }
}

struct LaneOutcome {
    sent: Option<ThroughputSummary>,
    sent_per_qp: Vec<u64>,
    received: Option<u64>,
    data_error: Option<String>,
}

/// Runs this side's halves until both are finished: its own sends all completed (then,
/// when `announce`, it tells the peer with `Done`), and, when the peer sends too, the
/// peer's `Done` has come and its messages have arrived. With `--threads`, the lanes are
/// spread over pinned worker threads and this thread keeps the control channel.
fn drive(runs: &[SizeRun], chan: &mut Channel, send: bool, peer_sends: bool, announce: bool) -> Result<SideOutcome> {
    let SizeRun { spec, size, clock, timeout_ns, .. } = runs[0];
    let receive = peer_sends && spec.uses_receives();
    if spec.threads > 1 {
        return threads::drive(runs, chan, send, receive, peer_sends, announce);
    }
    let peer = chan.peer().to_string();
    let start = clock.now();
    let mut lanes = LaneSet::new(runs, send, receive, start);
    let mut peer_per_qp: Option<Vec<u64>> = None;
    let mut announced = !announce;
    let mut idle = 0u32;
    let mut busy = 0u32;
    let mut last_progress = start;
    loop {
        let progress = lanes.step(&peer)?;
        let mine_finished = lanes.sending_finished();
        if !announced && mine_finished {
            let per_qp = lanes.sent_per_qp();
            chan.send(&Message::Done { size, iterations: per_qp.iter().sum(), per_qp })?;
            announced = true;
        }
        let theirs_done = !peer_sends || peer_per_qp.as_ref().is_some_and(|per| lanes.receiving_finished(per));
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
        if lanes.idle_wait()? {
            idle = IDLE_POLLS_PER_CHECK;
        }
        if idle.is_multiple_of(IDLE_POLLS_PER_CHECK) {
            signals::check()?;
            chan.heartbeat_if_due()?;
            if let Some(per) = peer_done(chan, peer_sends, size, runs.len())? {
                peer_per_qp = Some(per);
                last_progress = clock.now();
            }
            if clock.nanos(last_progress, clock.now()) >= timeout_ns {
                return Err(stalled(&peer, timeout_ns));
            }
        }
    }
    let outcome = lanes.finish(&peer)?;
    let peer_per_qp = peer_per_qp.unwrap_or_default();
    Ok(SideOutcome {
        sent: outcome.sent.map(|summary| BandwidthRun { iterations: summary.messages, summary }),
        peer_total: peer_sends.then(|| peer_per_qp.iter().sum()),
        peer_per_qp,
        sent_per_qp: outcome.sent_per_qp,
        received: outcome.received,
        data_error: outcome.data_error,
        per_thread: Vec::new(),
    })
}

/// Looks for the peer's `Done` (returns its per-QP counts); any other message is an error.
fn peer_done(chan: &mut Channel, peer_sends: bool, size: u64, qps: usize) -> Result<Option<Vec<u64>>> {
    match chan.poll_peer("the bandwidth run")? {
        PeerPoll::Quiet => Ok(None),
        PeerPoll::Message(Message::Done { size: s, iterations, per_qp }) if peer_sends && s == size => {
            Ok(Some(split_per_qp(iterations, per_qp, qps)))
        }
        PeerPoll::Message(m) => Err(Error::Peer(format!("{} sent {} in the middle of the run", chan.peer(), m.kind()))),
    }
}

fn stalled(peer: &str, timeout_ns: u64) -> Error {
    Error::Peer(format!(
        "nothing moved for {:.1} s (--timeout): {peer} hung or died, or the link stalled",
        timeout_ns as f64 / 1e9
    ))
}

/// The peer's per-QP counts; a peer with one QP may leave `per_qp` empty.
fn split_per_qp(total: u64, per_qp: Vec<u64>, qps: usize) -> Vec<u64> {
    if per_qp.len() == qps {
        per_qp
    } else {
        std::iter::once(total).chain(std::iter::repeat_n(0, qps.saturating_sub(1))).collect()
    }
}

/// `--threads`: lanes spread over pinned worker threads, each polling only its own QPs'
/// CQs; this thread keeps the control channel (heartbeats, the peer's `Done`, deadlines)
/// and tells the workers through shared state.
mod threads {
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    use std::sync::{Mutex, OnceLock};
    use std::time::Duration;

    use super::*;

    struct Shared {
        /// Set by the coordinator on error or interruption; workers stop at once.
        abort: AtomicBool,
        /// Bumped by workers whenever anything moves, for the coordinator's deadline.
        progress: AtomicU64,
        /// Workers whose own sends are all complete.
        sent: AtomicUsize,
        /// Per-thread sent counts, per QP of that thread, filled when its sends complete.
        sent_per_qp: Mutex<Vec<Option<Vec<u64>>>>,
        /// The peer's per-QP counts, once its `Done` arrived.
        peer_per_qp: OnceLock<Vec<u64>>,
    }

    fn pin(cpu: usize) {
        // SAFETY: a zeroed cpu_set_t is valid; we set one bit and apply it to this thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }

    pub(super) fn drive(
        runs: &[SizeRun],
        chan: &mut Channel,
        send: bool,
        receive: bool,
        peer_sends: bool,
        announce: bool,
    ) -> Result<SideOutcome> {
        let SizeRun { spec, size, clock, timeout_ns, .. } = runs[0];
        let n = spec.threads as usize;
        let peer = chan.peer().to_string();
        // Lane i goes to thread i % n; each thread's per-QP results come back in that order.
        let groups: Vec<Vec<usize>> = (0..n).map(|t| (t..runs.len()).step_by(n).collect()).collect();
        let shared = Shared {
            abort: AtomicBool::new(false),
            progress: AtomicU64::new(0),
            sent: AtomicUsize::new(0),
            sent_per_qp: Mutex::new(vec![None; n]),
            peer_per_qp: OnceLock::new(),
        };
        let ncpu = std::thread::available_parallelism().map_or(1, |c| c.get());
        let start = clock.now();
        let outcomes = std::thread::scope(|scope| -> Result<Vec<LaneOutcome>> {
            let handles: Vec<_> = groups
                .iter()
                .enumerate()
                .map(|(t, lanes)| {
                    let my_runs: Vec<SizeRun> = lanes.iter().map(|&i| runs[i]).collect();
                    let (shared, peer) = (&shared, peer.clone());
                    let my_peer_share = lanes.clone();
                    scope.spawn(move || -> Result<LaneOutcome> {
                        pin(t % ncpu);
                        let mut set = LaneSet::new(&my_runs, send, receive, start);
                        let mut reported = false;
                        loop {
                            if shared.abort.load(Ordering::Relaxed) {
                                return Err(Error::Peer(
                                    "stopped: another thread or the control channel failed".into(),
                                ));
                            }
                            if set.step(&peer)? > 0 {
                                shared.progress.fetch_add(1, Ordering::Relaxed);
                            }
                            if !reported && set.sending_finished() {
                                shared.sent_per_qp.lock().expect("no poisoning")[t] = Some(set.sent_per_qp());
                                shared.sent.fetch_add(1, Ordering::Release);
                                reported = true;
                            }
                            let theirs = !peer_sends
                                || shared.peer_per_qp.get().is_some_and(|all| {
                                    let mine: Vec<u64> = my_peer_share.iter().map(|&i| all[i]).collect();
                                    set.receiving_finished(&mine)
                                });
                            if reported && theirs {
                                return set.finish(&peer);
                            }
                        }
                    })
                })
                .collect();
            let coordinated = coordinate(chan, &shared, n, announce, peer_sends, size, runs.len(), &groups, timeout_ns);
            if coordinated.is_err() {
                shared.abort.store(true, Ordering::Relaxed);
            }
            let mut outcomes = Vec::with_capacity(n);
            let mut first_err = coordinated.err();
            for h in handles {
                match h.join().expect("worker threads do not panic") {
                    Ok(o) => outcomes.push(o),
                    Err(e) => {
                        shared.abort.store(true, Ordering::Relaxed);
                        if first_err.is_none() {
                            first_err = Some(e);
                        }
                    }
                }
            }
            match first_err {
                Some(e) => Err(e),
                None => Ok(outcomes),
            }
        })?;
        // Combine: per-QP counts back in lane order, rates summed over threads.
        let mut sent_per_qp = vec![0; runs.len()];
        for (lanes, o) in groups.iter().zip(&outcomes) {
            for (&i, &c) in lanes.iter().zip(&o.sent_per_qp) {
                sent_per_qp[i] = c;
            }
        }
        let per_thread: Vec<ThroughputSummary> = outcomes.iter().filter_map(|o| o.sent.clone()).collect();
        let sent = send.then(|| {
            let messages: u64 = per_thread.iter().map(|t| t.messages).sum();
            let elapsed = per_thread.iter().map(|t| t.elapsed_ns).max().unwrap_or(0);
            let peak: f64 = per_thread.iter().map(|t| t.peak_bytes_per_sec).sum::<f64>() / size.max(1) as f64;
            let summary = ThroughputSummary::new(size, messages, elapsed, Some(peak));
            BandwidthRun { iterations: messages, summary }
        });
        let received = outcomes.iter().filter_map(|o| o.received).reduce(|a, b| a + b);
        let data_error = outcomes.into_iter().find_map(|o| o.data_error);
        let peer_per_qp = shared.peer_per_qp.get().cloned().unwrap_or_default();
        Ok(SideOutcome {
            sent,
            peer_total: peer_sends.then(|| peer_per_qp.iter().sum()),
            peer_per_qp,
            sent_per_qp,
            received,
            data_error,
            per_thread,
        })
    }

    /// The coordinator: heartbeats, the peer's `Done`, our own `Done` once every worker's
    /// sends completed, signals and the deadline. Returns when the workers are done.
    #[allow(clippy::too_many_arguments)]
    fn coordinate(
        chan: &mut Channel,
        shared: &Shared,
        threads: usize,
        announce: bool,
        peer_sends: bool,
        size: u64,
        qps: usize,
        groups: &[Vec<usize>],
        timeout_ns: u64,
    ) -> Result<()> {
        let mut announced = !announce;
        let mut seen = shared.progress.load(Ordering::Relaxed);
        let mut quiet_since = std::time::Instant::now();
        let timeout = Duration::from_nanos(timeout_ns);
        loop {
            std::thread::sleep(Duration::from_millis(1));
            signals::check()?;
            chan.heartbeat_if_due()?;
            let sent = shared.sent.load(Ordering::Acquire);
            if !announced && sent == threads {
                let mut per_qp = vec![0; qps];
                for (lanes, counts) in groups.iter().zip(shared.sent_per_qp.lock().expect("no poisoning").iter()) {
                    for (&i, &c) in lanes.iter().zip(counts.iter().flatten()) {
                        per_qp[i] = c;
                    }
                }
                chan.send(&Message::Done { size, iterations: per_qp.iter().sum(), per_qp })?;
                announced = true;
            }
            if peer_sends
                && shared.peer_per_qp.get().is_none()
                && let Some(per) = peer_done(chan, peer_sends, size, qps)?
            {
                let _ = shared.peer_per_qp.set(per);
                quiet_since = std::time::Instant::now();
            }
            let now = shared.progress.load(Ordering::Relaxed);
            if now != seen {
                seen = now;
                quiet_since = std::time::Instant::now();
            }
            let workers_done = sent == threads && (!peer_sends || shared.peer_per_qp.get().is_some());
            if announced && workers_done {
                return Ok(());
            }
            if quiet_since.elapsed() >= timeout {
                return Err(stalled(chan.peer(), timeout_ns));
            }
        }
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
                per_thread: Vec::new(),
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
