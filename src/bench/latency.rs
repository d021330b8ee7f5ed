//! Ping-pong latency, as perftest measures it: the client writes a message whose last
//! byte carries an iteration tag into the server's receive region; the server spins on
//! that byte, then writes the same-sized message back; the client spins on its own
//! receive region. One sample is one round trip, timed from just before the post to the
//! moment the reply's tag is seen. The hot loop posts a pre-built request, spins on one
//! byte and reads the clock: no allocation, no formatting, no locks.

use crate::bench::link::{Link, SizeRun};
use crate::bench::pattern;
use crate::bench::spec::TestSpec;
use crate::bench::wait::{SendWindow, Woke, spin_until};
use crate::error::{Error, Result};
use crate::session::{Channel, Message};
use crate::stats::{Clock, LatencyRecorder};
use crate::verbs::WriteRequest;

/// Tag of iteration `i`: never 0 (the cleared value) and different from its neighbours.
#[inline(always)]
fn tag(i: u64) -> u8 {
    (i % 255) as u8 + 1
}

/// Clears the byte the peer's first write of `size` will tag. Call before the peer may
/// write: on the server before it answers `Start`, on the client before its first post.
pub fn clear_tag(link: &Link, size: u64) {
    link.buf.store(link.recv_offset() + size as usize - 1, 0);
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

struct Pinger {
    req: WriteRequest,
    window: SendWindow,
    inline: bool,
    size: usize,
    tag_offset: usize,
}

impl Pinger {
    fn new(link: &Link, spec: &TestSpec, size: u64) -> Pinger {
        let req = WriteRequest::rdma_write(&link.buf, 0, size as u32, link.remote_recv_addr(), link.remote.rkey);
        let tag_offset = link.recv_offset() + size as usize - 1;
        Pinger {
            req,
            window: SendWindow::new(spec.tx_depth, spec.effective_cq_mod()),
            inline: size <= link.inline_size as u64,
            size: size as usize,
            tag_offset,
        }
    }

    /// Writes message `i` (pattern when validating, then the tag) to the peer.
    #[inline(always)]
    fn prepare(&mut self, link: &Link, i: u64, validate: bool, corrupt: bool) {
        if validate {
            // SAFETY: the previous write of this region completed (the peer answered it).
            let body = unsafe { link.buf.bytes_mut(0, self.size - 1) };
            pattern::fill(body, i);
            if corrupt && !body.is_empty() {
                body[0] ^= 0xff;
            }
        }
        link.buf.store(self.size - 1, tag(i));
    }

    #[inline(always)]
    fn post(&mut self, link: &Link, clock: &Clock, chan: &mut Channel, timeout_ns: u64) -> Result<()> {
        if !self.window.has_room() {
            self.window.wait_for_room(link, clock, chan, timeout_ns)?;
        }
        let (signaled, id) = self.window.on_post(false);
        self.req.set_flags(signaled, self.inline);
        self.req.set_wr_id(id);
        link.qp.post(&mut self.req)
    }

    /// Checks what the peer wrote for iteration `i` (everything before the tag).
    fn check(&self, link: &Link, i: u64) -> Option<String> {
        // SAFETY: the peer wrote this message and waits for our reply before writing again.
        let body = unsafe { link.buf.bytes(link.recv_offset(), self.size - 1) };
        pattern::first_mismatch(body, i)
            .map(|off| format!("data mismatch at iteration {i}, byte {off} of a {}-byte message", self.size))
    }
}

/// The measuring side: `iterations` round trips, or as many as fit in the duration.
pub fn client(run: &SizeRun, chan: &mut Channel) -> Result<LatencyRun> {
    let SizeRun { link, spec, size, clock, timeout_ns } = *run;
    let mut p = Pinger::new(link, spec, size);
    let mut recorder = LatencyRecorder::new();
    let limit_ns = spec.duration_secs.map(|d| (d * 1e9) as u64);
    let peer = chan.peer().to_string();
    let start = clock.now();
    let mut i = 0u64;
    loop {
        match limit_ns {
            Some(limit) => {
                if i > 0 && clock.nanos(start, clock.now()) >= limit {
                    break;
                }
            }
            None => {
                if i == spec.iterations {
                    break;
                }
            }
        }
        p.prepare(link, i, spec.validate_data, spec.corrupt_at == Some(i));
        let expected = tag(i);
        let t0 = clock.now();
        p.post(link, clock, chan, timeout_ns)?;
        let tag_offset = p.tag_offset;
        let woke = spin_until(clock, chan, timeout_ns, "the reply to a ping", || {
            link.buf.load_volatile(tag_offset) == expected
        })?;
        let t1 = clock.now();
        if let Woke::Peer(m) = woke {
            return Err(Error::Peer(format!("{peer} sent {} in the middle of the run", m.kind())));
        }
        recorder.record(clock.nanos(t0, t1));
        if spec.validate_data
            && let Some(e) = p.check(link, i)
        {
            return Err(Error::Check(format!("{e} (written by {peer})")));
        }
        if p.window.outstanding() > 0 {
            p.window.reap(link, &peer)?;
        }
        i += 1;
    }
    Ok(LatencyRun { recorder, iterations: i, elapsed_ns: clock.nanos(start, clock.now()) })
}

/// The echoing side: answers every ping until the client's `Done` arrives.
pub fn server(run: &SizeRun, chan: &mut Channel) -> Result<EchoOutcome> {
    let SizeRun { link, spec, size, clock, timeout_ns } = *run;
    let mut p = Pinger::new(link, spec, size);
    let peer = chan.peer().to_string();
    let mut data_error = None;
    let mut i = 0u64;
    loop {
        let expected = tag(i);
        let tag_offset = p.tag_offset;
        match spin_until(clock, chan, timeout_ns, "the next ping", || link.buf.load_volatile(tag_offset) == expected)? {
            Woke::Ready => {}
            Woke::Peer(Message::Done { size: s, iterations }) if s == size => {
                if iterations != i {
                    return Err(Error::Check(format!(
                        "the client reports {iterations} iterations at {size} B but this side answered {i}"
                    )));
                }
                return Ok(EchoOutcome { iterations: i, data_error });
            }
            Woke::Peer(m) => {
                return Err(Error::Peer(format!("{peer} sent {} in the middle of the run", m.kind())));
            }
        }
        if spec.validate_data && data_error.is_none() {
            data_error = p.check(link, i);
        }
        p.prepare(link, i, spec.validate_data, false);
        p.post(link, clock, chan, timeout_ns)?;
        if p.window.outstanding() > 0 {
            p.window.reap(link, &peer)?;
        }
        i += 1;
    }
}
