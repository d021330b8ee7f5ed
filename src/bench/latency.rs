//! Latency kernels, in the two shapes perftest uses.
//!
//! Ping-pong (write, send, and both with immediate data): the client sends message `i`,
//! the server waits for it and answers with message `i`, the client waits for the answer.
//! Arrival is seen by spinning on the message's last byte (plain write) or on the receive
//! CQ (send, write with immediate). One sample is one round trip, reported halved.
//!
//! Round trip (read, atomic): the client posts the operation and spins on its own send
//! CQ; the server is passive. One sample is one whole round trip, reported as such.
//!
//! The hot loops post pre-built requests, spin and read the clock: no allocation, no
//! formatting, no locks.

use crate::bench::pattern;
use crate::bench::soak::Soak;
use crate::error::{Error, Result};
use crate::link::wait::{PeerWatch, RecvRing, SendWindow, Woke, spin_until};
use crate::link::{Link, SizeRun};
use crate::session::{Channel, Message};
use crate::signals;
use crate::spec::{AtomicOp, Operation, TestSpec};
use crate::stats::{Clock, LatencyRecorder};
use crate::verbs::cq::{CqKind, check_completion, completions, imm_of};
use crate::verbs::{SendRequest, Transport};

/// Tag of iteration `i`: never 0 (the cleared value) and different from its neighbours.
#[inline(always)]
fn tag(i: u64) -> u8 {
    (i % 255) as u8 + 1
}

/// Whether samples are halved round trips (ping-pong, and the ring's echo) or whole ones.
pub fn is_ping_pong(spec: &TestSpec) -> bool {
    matches!(spec.operation, Operation::Write | Operation::Send | Operation::Ring)
}

/// Gets this side's memory ready for a size, before the peer may touch it: clears the
/// byte a plain write's arrival is seen on, fills what reads fetch, zeroes the counter
/// atomics work on.
pub fn prepare(link: &Link, spec: &TestSpec, size: u64) {
    let l = &link.layout;
    match spec.operation {
        Operation::Write if !spec.with_imm => link.buf.store(l.recv_at(0) as usize + size as usize - 1, 0),
        Operation::Read => {
            for slot in 0..l.send_slots {
                // SAFETY: the peer reads this memory only after we answer `Start`.
                pattern::fill(unsafe { link.buf.bytes_mut(l.send_at(slot) as usize, size as usize) }, slot);
            }
        }
        Operation::Atomic => {
            // SAFETY: as above; the counter is 8 aligned bytes.
            unsafe { link.buf.bytes_mut(l.recv_at(0) as usize, 8) }.fill(0);
        }
        Operation::Ring => crate::bench::ring::prepare(link, spec),
        _ => {}
    }
}

/// The value of the 8-byte atomic counter this side holds.
pub fn counter(link: &Link) -> u64 {
    // SAFETY: read after the peer finished; 8 bytes in bounds.
    let b = unsafe { link.buf.bytes(link.layout.recv_at(0) as usize, 8) };
    u64::from_le_bytes(b.try_into().expect("8 bytes"))
}

pub struct LatencyRun {
    pub recorder: LatencyRecorder,
    pub iterations: u64,
    pub elapsed_ns: u64,
}

/// What the passive side saw of one size.
pub struct EchoOutcome {
    pub iterations: u64,
    pub data_error: Option<String>,
}

struct PingPong<'a> {
    link: &'a Link,
    spec: &'a TestSpec,
    req: SendRequest,
    window: SendWindow,
    inline: bool,
    size: usize,
    /// Byte whose tag marks a plain write's arrival; None when arrival is a receive.
    tag_offset: Option<usize>,
}

/// The window goes back to the link for the next pass, however this one ended.
impl Drop for PingPong<'_> {
    fn drop(&mut self) {
        let window = std::mem::replace(&mut self.window, SendWindow::new(1, 1));
        if let Ok(mut slot) = self.link.sends.lock() {
            *slot = Some(window);
        }
    }
}

impl<'a> PingPong<'a> {
    fn new(link: &'a Link, spec: &'a TestSpec, size: u64) -> PingPong<'a> {
        let imm = spec.with_imm.then_some(0);
        let req = match spec.operation {
            Operation::Write => {
                SendRequest::write(&link.buf, 0, size as u32, link.remote_recv_addr(0), link.remote.rkey, imm)
            }
            _ => {
                let r = SendRequest::send(&link.buf, 0, size as u32, imm);
                if spec.transport == Transport::Ud { r.to_ud(link.qp.ah(), link.remote.qpn) } else { r }
            }
        };
        let plain_write = spec.operation == Operation::Write && !spec.with_imm;
        PingPong {
            link,
            spec,
            req,
            // The link's window, as the last pass left it (see `Link::sends`).
            window: link
                .sends
                .lock()
                .expect("no poisoning")
                .take()
                .unwrap_or_else(|| SendWindow::new(spec.tx_depth, spec.effective_cq_mod())),
            inline: size <= link.inline_size as u64,
            size: size as usize,
            tag_offset: plain_write.then(|| link.layout.recv_at(0) as usize + size as usize - 1),
        }
    }

    /// Puts message `i` in the send slot (pattern when validating, then the tag or imm).
    #[inline(always)]
    fn prepare(&mut self, i: u64, corrupt: bool) {
        let validate = self.spec.validate_data;
        if validate {
            // SAFETY: the previous message from this slot completed (the peer answered it).
            let body = unsafe { self.link.buf.bytes_mut(0, self.size) };
            if self.spec.operation == Operation::Send {
                pattern::fill_stamped(body, i);
            } else {
                pattern::fill(body, i);
            }
            if corrupt {
                let at = if self.spec.operation == Operation::Send && self.size > 8 { 8 } else { 0 };
                body[at] ^= 0xff;
            }
        }
        match self.tag_offset {
            Some(_) => self.link.buf.store(self.size - 1, tag(i)),
            None => self.req.set_imm(i as u32),
        }
    }

    #[inline(always)]
    fn post(&mut self, clock: &Clock, chan: &mut Channel, timeout_ns: u64) -> Result<()> {
        if !self.window.has_room() {
            self.window.wait_for_room(self.link, clock, chan, timeout_ns)?;
        }
        let (signaled, id) = self.window.on_post(false);
        self.req.set_flags(signaled, self.inline);
        self.req.set_wr_id(id);
        self.link.qp.post(&mut self.req)
    }

    /// Waits for message `i` from the peer. Returns the receive slot it landed in, or
    /// the control message that arrived instead.
    #[inline(always)]
    fn wait(
        &mut self,
        i: u64,
        ring: Option<&mut RecvRing>,
        clock: &Clock,
        chan: &mut Channel,
        timeout_ns: u64,
        waiting_for: &str,
    ) -> Result<std::result::Result<u64, Message>> {
        let link = self.link;
        if let Some(off) = self.tag_offset {
            let expected = tag(i);
            let arrived = || link.buf.load_volatile(off) == expected;
            return Ok(match spin_until(clock, chan, timeout_ns, waiting_for, None, arrived)? {
                Woke::Ready => Ok(0),
                Woke::Peer(m) => Err(m),
            });
        }
        let ring = ring.expect("receive-based tests have a receive ring");
        let mut polled = Ok(0);
        let woke = spin_until(clock, chan, timeout_ns, waiting_for, Some((&link.qp, CqKind::Recv)), || {
            polled = ring.poll(link);
            !matches!(polled, Ok(0))
        })?;
        if let Woke::Peer(m) = woke {
            return Ok(Err(m));
        }
        polled?;
        let wc = *ring.completion(0);
        check_completion(&wc, chan.peer())?;
        if self.spec.with_imm && imm_of(&wc) != i as u32 {
            return Err(Error::Check(format!("immediate data {} arrived where {} was due", imm_of(&wc), i as u32)));
        }
        let slot = ring.slot_of(link, &wc);
        ring.release(link, 1)?;
        Ok(Ok(slot))
    }

    /// Checks what the peer sent as message `i` (everything but the tag).
    fn check(&self, i: u64, slot: u64) -> Option<String> {
        let l = &self.link.layout;
        let at = (l.recv_at(slot) + l.recv_payload) as usize;
        let len = if self.tag_offset.is_some() { self.size - 1 } else { self.size };
        // SAFETY: the peer wrote this message and waits for our reply before writing again.
        let body = unsafe { self.link.buf.bytes(at, len) };
        if self.spec.operation == Operation::Send {
            return pattern::check_stamped(body, i).err().map(|e| format!("{e} (iteration {i})"));
        }
        pattern::first_mismatch(body, i)
            .map(|off| format!("data mismatch at iteration {i}, byte {off} of a {}-byte message", self.size))
    }
}

/// The measuring side.
pub fn client(run: &SizeRun, chan: &mut Channel, soak: Option<&mut Soak>) -> Result<LatencyRun> {
    if is_ping_pong(run.spec) { ping_pong_client(run, chan, soak) } else { round_trip_client(run, chan, soak) }
}

/// Ends the loop at `-n` iterations or after `-D` seconds.
pub struct Limit {
    iterations: u64,
    limit_ns: Option<u64>,
    pub start: u64,
}

impl Limit {
    pub fn new(spec: &TestSpec, clock: &Clock) -> Limit {
        Limit {
            iterations: spec.iterations,
            limit_ns: spec.duration_secs.map(|d| (d * 1e9) as u64),
            start: clock.now(),
        }
    }

    /// A timed run also ends early when a Ctrl-C winds a soak down.
    #[inline(always)]
    pub fn done(&self, i: u64, clock: &Clock) -> bool {
        match self.limit_ns {
            Some(limit) => {
                i > 0 && (clock.nanos(self.start, clock.now()) >= limit || signals::winding_down().is_some())
            }
            None => i == self.iterations,
        }
    }
}

fn ping_pong_client(run: &SizeRun, chan: &mut Channel, mut soak: Option<&mut Soak>) -> Result<LatencyRun> {
    let SizeRun { link, spec, size, clock, timeout_ns, .. } = *run;
    let mut p = PingPong::new(link, spec, size);
    let mut ring = link.receives.lock().expect("no poisoning");
    let mut recorder = LatencyRecorder::new();
    let peer = chan.peer().to_string();
    let limit = Limit::new(spec, clock);
    let mut i = 0u64;
    while !limit.done(i, clock) {
        p.prepare(i, spec.corrupt_at == Some(i));
        let t0 = clock.now();
        p.post(clock, chan, timeout_ns)?;
        let arrived = p.wait(i, ring.as_mut(), clock, chan, timeout_ns, "the reply to a ping")?;
        let t1 = clock.now();
        let slot = arrived.map_err(|m| Error::Peer(format!("{peer} sent {} in the middle of the run", m.kind())))?;
        let ns = clock.nanos(t0, t1);
        recorder.record(ns);
        if let Some(s) = soak.as_deref_mut() {
            s.sample(ns, clock.nanos(limit.start, t1));
        }
        if spec.validate_data
            && let Some(e) = p.check(i, slot)
        {
            return Err(Error::Check(format!("{e} (written by {peer})")));
        }
        if p.window.outstanding() > 0 {
            p.window.reap(link, &peer)?;
        }
        i += 1;
    }
    Ok(LatencyRun { recorder, iterations: i, elapsed_ns: clock.nanos(limit.start, clock.now()) })
}

fn round_trip_client(run: &SizeRun, chan: &mut Channel, mut soak: Option<&mut Soak>) -> Result<LatencyRun> {
    let SizeRun { link, spec, size, clock, timeout_ns, .. } = *run;
    let l = &link.layout;
    let mut req = match spec.operation {
        Operation::Read => {
            SendRequest::read(&link.buf, l.recv_at(0) as usize, size as u32, link.remote_send_addr(0), link.remote.rkey)
        }
        _ => match spec.atomic_op {
            AtomicOp::FetchAndAdd => {
                SendRequest::fetch_add(&link.buf, 0, link.remote_recv_addr(0), link.remote.rkey, 1)
            }
            AtomicOp::CmpAndSwp => {
                SendRequest::cmp_swap(&link.buf, 0, link.remote_recv_addr(0), link.remote.rkey, 0, 1)
            }
        },
    };
    req.set_flags(true, false);
    let mut wcs = completions::<1>();
    let mut recorder = LatencyRecorder::new();
    let peer = chan.peer().to_string();
    let limit = Limit::new(spec, clock);
    // The server is passive: a stopped one's NIC still answers every read and atomic.
    let mut watch = PeerWatch::new(clock);
    let mut i = 0u64;
    while !limit.done(i, clock) {
        if spec.operation == Operation::Atomic {
            let (compare_add, swap) = atomic_operands(spec, i);
            req.set_atomic(compare_add, swap);
        }
        let t0 = clock.now();
        link.qp.post(&mut req)?;
        let mut polled = Ok(0);
        let cq = Some((&link.qp, CqKind::Send));
        let woke = spin_until(clock, chan, timeout_ns, "an RDMA read or atomic to complete", cq, || {
            polled = link.qp.poll_send(&mut wcs);
            !matches!(polled, Ok(0))
        })?;
        let t1 = clock.now();
        if let Woke::Peer(m) = woke {
            return Err(Error::Peer(format!("{peer} sent {} in the middle of the run", m.kind())));
        }
        polled?;
        check_completion(&wcs[0], &peer)?;
        watch.tick(clock, t1, chan, "the run")?;
        let ns = clock.nanos(t0, t1);
        recorder.record(ns);
        if let Some(s) = soak.as_deref_mut() {
            s.sample(ns, clock.nanos(limit.start, t1));
        }
        match spec.operation {
            Operation::Read if spec.validate_data => {
                // SAFETY: the read completed; nothing else writes this slot.
                let got = unsafe { link.buf.bytes(l.recv_at(0) as usize, size as usize) };
                if let Some(off) = pattern::first_mismatch(got, 0) {
                    return Err(Error::Check(format!("read {i} returned wrong data at byte {off} (from {peer})")));
                }
            }
            Operation::Atomic => {
                // SAFETY: the atomic completed and returned the old value here.
                let old = u64::from_le_bytes(unsafe { link.buf.bytes(0, 8) }.try_into().expect("8 bytes"));
                if old != i {
                    return Err(Error::Check(format!(
                        "atomic {i} returned {old}, expected {i}: the counter on {peer} was changed by someone else"
                    )));
                }
            }
            _ => {}
        }
        i += 1;
    }
    Ok(LatencyRun { recorder, iterations: i, elapsed_ns: clock.nanos(limit.start, clock.now()) })
}

/// The server side: echoes every ping (ping-pong) or waits (round trip) until `Done`.
pub fn server(run: &SizeRun, chan: &mut Channel) -> Result<EchoOutcome> {
    if !is_ping_pong(run.spec) {
        return passive_server(run, chan);
    }
    let SizeRun { link, spec, size, clock, timeout_ns, .. } = *run;
    let mut p = PingPong::new(link, spec, size);
    let mut ring = link.receives.lock().expect("no poisoning");
    let peer = chan.peer().to_string();
    let mut data_error = None;
    let mut i = 0u64;
    loop {
        let slot = match p.wait(i, ring.as_mut(), clock, chan, timeout_ns, "the next ping")? {
            Ok(slot) => slot,
            Err(Message::Done { size: s, iterations, .. }) if s == size => {
                if iterations != i {
                    return Err(Error::Check(format!(
                        "the client reports {iterations} iterations at {size} B but this side answered {i}"
                    )));
                }
                return Ok(EchoOutcome { iterations: i, data_error });
            }
            Err(m) => return Err(Error::Peer(format!("{peer} sent {} in the middle of the run", m.kind()))),
        };
        if spec.validate_data && data_error.is_none() {
            data_error = p.check(i, slot);
        }
        p.prepare(i, false);
        p.post(clock, chan, timeout_ns)?;
        if p.window.outstanding() > 0 {
            p.window.reap(link, &peer)?;
        }
        i += 1;
    }
}

/// Round-trip tests need nothing from the server but its memory: wait for `Done`, then
/// check the atomic counter against the number of operations.
fn passive_server(run: &SizeRun, chan: &mut Channel) -> Result<EchoOutcome> {
    let iterations = match chan.recv("the end of the run")? {
        Message::Done { size, iterations, .. } if size == run.size => iterations,
        other => return Err(chan.unexpected(&other, "done")),
    };
    Ok(EchoOutcome { iterations, data_error: atomic_counter_error(run, iterations) })
}

/// The operands of atomic operation `m`: fetch-and-add adds 1, compare-and-swap moves the
/// counter from m to m + 1. Fault injection (`--inject-corruption m`) makes operation m
/// step by 2, which the returned values and the final counter check must catch.
#[inline(always)]
pub fn atomic_operands(spec: &TestSpec, m: u64) -> (u64, u64) {
    let step = if spec.corrupt_at == Some(m) { 2 } else { 1 };
    match spec.atomic_op {
        AtomicOp::FetchAndAdd => (step, 0),
        AtomicOp::CmpAndSwp => (m, m + step),
    }
}

/// For atomic tests: the counter must equal the number of operations (each fetch-and-add
/// adds 1; each compare-and-swap moves it from i to i + 1).
pub fn atomic_counter_error(run: &SizeRun, iterations: u64) -> Option<String> {
    if run.spec.operation != Operation::Atomic {
        return None;
    }
    let c = counter(run.link);
    (c != iterations).then(|| format!("the atomic counter is {c} after {iterations} operations"))
}
