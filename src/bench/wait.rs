//! Waiting in the hot loops without losing the deadline: spin on memory or the CQ, and
//! only when a wait runs long (over `IDLE_CHECK`) look at signals, the deadline and the
//! control channel. The common fast path costs one clock read per `SPINS_PER_CHECK` spins.

use crate::bench::link::Link;
use crate::error::{Error, Result};
use crate::session::{Channel, Message, PeerPoll};
use crate::signals;
use crate::stats::Clock;
use crate::verbs::qp::{Completion, check_completion, completions};

const SPINS_PER_CHECK: u32 = 256;
/// A wait this long (ns) starts checking the peer and the deadline.
const IDLE_CHECK_NS: u64 = 1_000_000;

pub enum Woke {
    Ready,
    /// The peer sent a control message while we waited (e.g. the client's `Done`).
    Peer(Message),
}

/// Spins until `ready()` is true. Fails with a peer error after `timeout_ns` without it.
#[inline(always)]
pub fn spin_until(
    clock: &Clock,
    chan: &mut Channel,
    timeout_ns: u64,
    waiting_for: &str,
    mut ready: impl FnMut() -> bool,
) -> Result<Woke> {
    if ready() {
        return Ok(Woke::Ready);
    }
    let start = clock.now();
    let mut next_peer_check = IDLE_CHECK_NS;
    loop {
        for _ in 0..SPINS_PER_CHECK {
            if ready() {
                return Ok(Woke::Ready);
            }
            std::hint::spin_loop();
        }
        let waited = clock.nanos(start, clock.now());
        if waited >= next_peer_check {
            next_peer_check = waited + IDLE_CHECK_NS;
            signals::check()?;
            if let PeerPoll::Message(m) = chan.poll_peer(waiting_for)? {
                return Ok(Woke::Peer(m));
            }
            if waited >= timeout_ns {
                return Err(Error::Peer(format!(
                    "{} made no progress for {:.1} s while this side waited for {waiting_for} (--timeout); it hung or died",
                    chan.peer(),
                    timeout_ns as f64 / 1e9
                )));
            }
        }
    }
}

/// Tracks outstanding send work requests with selective signalling: every
/// `signal_every`-th request is signalled and carries in its wr_id how many requests its
/// completion retires. `signal_every <= depth` guarantees a full queue always holds a
/// signalled request, so waiting for room never deadlocks.
pub struct SendWindow {
    depth: u32,
    signal_every: u32,
    outstanding: u32,
    unsignaled: u32,
    wcs: [Completion; 16],
}

impl SendWindow {
    pub fn new(depth: u32, signal_every: u32) -> SendWindow {
        let depth = depth.max(1);
        SendWindow {
            depth,
            signal_every: signal_every.clamp(1, depth),
            outstanding: 0,
            unsignaled: 0,
            wcs: completions(),
        }
    }

    pub fn outstanding(&self) -> u32 {
        self.outstanding
    }

    pub fn has_room(&self) -> bool {
        self.outstanding < self.depth
    }

    /// Accounts for one post; returns (signalled, wr_id). `force` signals regardless,
    /// for the last request of a run.
    #[inline(always)]
    pub fn on_post(&mut self, force: bool) -> (bool, u64) {
        self.outstanding += 1;
        self.unsignaled += 1;
        if force || self.unsignaled >= self.signal_every {
            let retires = self.unsignaled as u64;
            self.unsignaled = 0;
            (true, retires)
        } else {
            (false, 0)
        }
    }

    /// Polls once; returns how many requests completed.
    #[inline(always)]
    pub fn reap(&mut self, link: &Link, peer: &str) -> Result<u64> {
        let n = link.qp.poll(&mut self.wcs)?;
        let mut retired = 0;
        for wc in &self.wcs[..n] {
            retired += check_completion(wc, peer)?;
        }
        self.outstanding -= retired as u32;
        Ok(retired)
    }

    /// Waits until there is room for one more request.
    pub fn wait_for_room(&mut self, link: &Link, clock: &Clock, chan: &mut Channel, timeout_ns: u64) -> Result<()> {
        while !self.has_room() {
            let mut err = None;
            let peer = chan.peer().to_string();
            let woke = spin_until(clock, chan, timeout_ns, "send completions", || match self.reap(link, &peer) {
                Ok(n) => n > 0,
                Err(e) => {
                    err = Some(e);
                    true
                }
            })?;
            if let Some(e) = err {
                return Err(e);
            }
            if let Woke::Peer(m) = woke {
                return Err(Error::Peer(format!("{} sent {} in the middle of the run", chan.peer(), m.kind())));
            }
        }
        Ok(())
    }
}
