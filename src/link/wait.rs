//! Waiting in the hot loops without losing the deadline: spin on memory or the CQ, and
//! only when a wait runs long (over `IDLE_CHECK`) look at the deadline and the control
//! channel. The common fast path costs a look at the stop flag per wait and one clock read
//! per `SPINS_PER_CHECK` spins.

use crate::error::{Error, Result};
use crate::link::Link;
use crate::session::{Channel, Message, PeerPoll};
use crate::signals;
use crate::stats::Clock;
use crate::verbs::cq::{Completion, CqKind, check_completion, completions};
use crate::verbs::{Qp, RecvRequest};

const SPINS_PER_CHECK: u32 = 256;
/// A wait this long (ns) starts checking the peer and the deadline.
const IDLE_CHECK_NS: u64 = 1_000_000;
/// An event-driven wait sleeps at most this long between looks at the peer.
pub const EVENT_SLICE: std::time::Duration = std::time::Duration::from_millis(20);

pub enum Woke {
    Ready,
    /// The peer sent a control message while we waited (e.g. the client's `Done`).
    Peer(Message),
}

/// Waits until `ready()` is true: by spinning, or, when `cq` names a queue whose QP has a
/// completion channel (`-e`), by sleeping until that queue reports a completion. Fails
/// with a peer error after `timeout_ns` without it.
#[inline(always)]
pub fn spin_until(
    clock: &Clock,
    chan: &mut Channel,
    timeout_ns: u64,
    waiting_for: &str,
    cq: Option<(&Qp, CqKind)>,
    mut ready: impl FnMut() -> bool,
) -> Result<Woke> {
    // A stop signal must end a run whose waits are all short: on a fast day every wait of
    // a ping-pong ends before IDLE_CHECK_NS, so the checks below never ran and a SIGTERM
    // went unseen until some wait happened to run long (seconds). One relaxed load a wait.
    signals::check()?;
    chan.note_wait()?;
    if ready() {
        return Ok(Woke::Ready);
    }
    if let Some((qp, kind)) = cq.filter(|(qp, _)| qp.has_events()) {
        return sleep_until(qp, kind, clock, chan, timeout_ns, waiting_for, ready);
    }
    let start = clock.now();
    let mut next_peer_check = IDLE_CHECK_NS;
    loop {
        for _ in 0..SPINS_PER_CHECK {
            // No PAUSE hint between polls: it delays noticing an arrival (~40 ns on
            // recent x86, far more under emulation, where it leaves the translated code),
            // and perftest, the reference, polls back to back too.
            if ready() {
                return Ok(Woke::Ready);
            }
        }
        let waited = clock.nanos(start, clock.now());
        if waited >= next_peer_check {
            next_peer_check = waited + IDLE_CHECK_NS;
            if let Some(w) = check_peer(chan, waited, timeout_ns, waiting_for)? {
                return Ok(w);
            }
        }
    }
}

/// Waits until `ready()`: spins for `spin_ns`, then sleeps on `qp`'s `kind` completion
/// channel (a QP without one keeps spinning). The deadline, signals and the peer are
/// watched throughout, as in [`spin_until`].
pub fn spin_then_sleep(
    clock: &Clock,
    chan: &mut Channel,
    timeout_ns: u64,
    waiting_for: &str,
    sleep_on: (&Qp, CqKind),
    spin_ns: u64,
    mut ready: impl FnMut() -> bool,
) -> Result<Woke> {
    let start = clock.now();
    if spin_ns > 0 {
        let mut spun_out = false;
        let woke = spin_until(clock, chan, timeout_ns, waiting_for, None, || {
            if ready() {
                return true;
            }
            spun_out = clock.nanos(start, clock.now()) >= spin_ns;
            spun_out
        })?;
        if !spun_out {
            return Ok(woke);
        }
    }
    let (qp, kind) = sleep_on;
    if !qp.has_events() {
        return spin_until(clock, chan, timeout_ns, waiting_for, None, ready);
    }
    let spent = clock.nanos(start, clock.now());
    sleep_until(qp, kind, clock, chan, timeout_ns.saturating_sub(spent), waiting_for, ready)
}

/// The event-driven wait: arm, look once more (a completion that raced the arming is not
/// announced), then sleep on the channel in short slices that keep the peer checks.
fn sleep_until(
    qp: &Qp,
    kind: CqKind,
    clock: &Clock,
    chan: &mut Channel,
    timeout_ns: u64,
    waiting_for: &str,
    mut ready: impl FnMut() -> bool,
) -> Result<Woke> {
    let start = clock.now();
    loop {
        qp.arm(kind)?;
        if ready() {
            return Ok(Woke::Ready);
        }
        if qp.wait_event(EVENT_SLICE)? && ready() {
            return Ok(Woke::Ready);
        }
        if let Some(w) = check_peer(chan, clock.nanos(start, clock.now()), timeout_ns, waiting_for)? {
            return Ok(w);
        }
    }
}

/// Signals, a message or loss of the peer, its silence, and the deadline, for a wait that
/// ran `waited` ns.
fn check_peer(chan: &mut Channel, waited: u64, timeout_ns: u64, waiting_for: &str) -> Result<Option<Woke>> {
    signals::check()?;
    if let PeerPoll::Message(m) = chan.poll_peer(waiting_for)? {
        return Ok(Some(Woke::Peer(m)));
    }
    check_waited(chan, waited, timeout_ns, waiting_for)?;
    Ok(None)
}

/// The one verdict on a wait that ran `waited_ns` with the channel just read: the peer's
/// silence is an error at once; a wait past `patience_ns` is the peer's silence if it has
/// missed heartbeats too, else a stalled RDMA path.
pub fn check_waited(chan: &Channel, waited_ns: u64, patience_ns: u64, waiting_for: &str) -> Result<()> {
    chan.check_alive(waiting_for)?;
    if waited_ns >= patience_ns {
        let patience = std::time::Duration::from_nanos(patience_ns);
        return Err(if chan.quiet() {
            chan.silence(waiting_for)
        } else if let Some(stuck) = chan.standing_still(patience, waiting_for) {
            // The peer's process lives but its session stood still all along: it, not the
            // RDMA path, is what stopped.
            stuck
        } else {
            stalled(chan, patience_ns, waiting_for)
        });
    }
    Ok(())
}

/// The one wording of an RDMA path that stopped while the peer's process lives (its
/// keepalive still speaks): one message was awaited for `patience_ns`.
fn stalled(chan: &Channel, patience_ns: u64, waiting_for: &str) -> Error {
    Error::Peer(format!(
        "nothing completed for {:.1} s while this side waited for {waiting_for}, though {} is alive (heard {:.1} s \
         ago): the RDMA path stalled (a QP in error, a packet RC did not recover, or a link down)",
        patience_ns as f64 / 1e9,
        chan.peer(),
        chan.silent_for().as_secs_f64()
    ))
}

/// While completions flow, a loop looks at its peer this often (ns): a stopped peer's NIC
/// still answers RDMA, and only its silence on the control channel tells.
pub const WATCH_EVERY_NS: u64 = 10_000_000;

/// The peer, looked at every `WATCH_EVERY_NS` by a loop whose waits are all short (they
/// never reach the checks of [`spin_until`]): one clock comparison a turn.
pub struct PeerWatch {
    last: u64,
}

impl PeerWatch {
    pub fn new(clock: &Clock) -> PeerWatch {
        PeerWatch { last: clock.now() }
    }

    /// `now` is a reading the loop already took.
    #[inline(always)]
    pub fn tick(&mut self, clock: &Clock, now: u64, chan: &mut Channel, during: &str) -> Result<()> {
        if clock.nanos(self.last, now) < WATCH_EVERY_NS {
            return Ok(());
        }
        self.last = now;
        signals::check()?;
        chan.watch(during)
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

    pub fn signal_every(&self) -> u32 {
        self.signal_every
    }

    pub fn unsignaled(&self) -> u32 {
        self.unsignaled
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
        let n = link.qp.poll_send(&mut self.wcs)?;
        let mut retired = 0;
        for wc in &self.wcs[..n] {
            retired += check_completion(wc, peer)?;
        }
        // A completion that retires more than is outstanding belongs to requests this
        // window never posted (a window started over a queue that was not empty): left to
        // wrap, the count would say "full" forever and the side would wait for send
        // completions that never come.
        self.outstanding = self.outstanding.checked_sub(retired as u32).ok_or_else(|| {
            Error::Check(format!(
                "send completions retired {retired} requests where {} were outstanding (against {peer}): \
                 the queue held requests this window did not post",
                self.outstanding
            ))
        })?;
        Ok(retired)
    }

    /// Waits until there is room for one more request.
    pub fn wait_for_room(&mut self, link: &Link, clock: &Clock, chan: &mut Channel, timeout_ns: u64) -> Result<()> {
        self.reap_while(link, clock, chan, timeout_ns, |w| !w.has_room())
    }

    /// Waits until every request posted has completed (the last one must be signalled).
    pub fn wait_until_empty(&mut self, link: &Link, clock: &Clock, chan: &mut Channel, timeout_ns: u64) -> Result<()> {
        self.reap_while(link, clock, chan, timeout_ns, |w| w.outstanding > 0)
    }

    /// Reaps completions while `busy` holds, up to the deadline and watching the peer.
    fn reap_while(
        &mut self,
        link: &Link,
        clock: &Clock,
        chan: &mut Channel,
        timeout_ns: u64,
        busy: impl Fn(&SendWindow) -> bool,
    ) -> Result<()> {
        while busy(self) {
            let mut err = None;
            let peer = chan.peer().to_string();
            let cq = Some((&link.qp, CqKind::Send));
            let woke = spin_until(clock, chan, timeout_ns, "send completions", cq, || match self.reap(link, &peer) {
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

/// Keeps the receive queue stocked: `rx_depth` receives, each aimed at its slot of the
/// receive region, reposted in the order they complete (a receive queue is FIFO).
pub struct RecvRing {
    reqs: Vec<RecvRequest>,
    next_repost: usize,
    consumed: usize,
    batch: usize,
    wcs: [Completion; 16],
}

impl RecvRing {
    /// Builds and posts every receive. `batch` is how many consumed receives are reposted
    /// together (1 for latency, more for bandwidth).
    pub fn new(link: &Link, batch: usize) -> Result<RecvRing> {
        let l = &link.layout;
        let reqs: Vec<RecvRequest> = (0..l.rx_depth as u64)
            .map(|i| RecvRequest::new(&link.buf, l.recv_at(i % l.recv_slots) as usize, l.recv_slot as u32, i))
            .collect();
        let mut ring = RecvRing { reqs, next_repost: 0, consumed: 0, batch: batch.max(1), wcs: completions() };
        link.qp.post_recv_batch(&mut ring.reqs)?;
        Ok(ring)
    }

    /// Polls the receive CQ once; the completions are then `self.completion(i)` for i < n.
    #[inline(always)]
    pub fn poll(&mut self, link: &Link) -> Result<usize> {
        link.qp.poll_recv(&mut self.wcs)
    }

    #[inline(always)]
    pub fn completion(&self, i: usize) -> &Completion {
        &self.wcs[i]
    }

    /// The receive slot a completion's data landed in.
    pub fn slot_of(&self, link: &Link, wc: &Completion) -> u64 {
        wc.wr_id % link.layout.recv_slots
    }

    /// Marks `n` receives as consumed and reposts them once a batch has gathered.
    #[inline(always)]
    pub fn release(&mut self, link: &Link, n: usize) -> Result<()> {
        self.consumed += n;
        if self.consumed < self.batch {
            return Ok(());
        }
        let len = self.reqs.len();
        let mut left = self.consumed;
        while left > 0 {
            let take = left.min(len - self.next_repost);
            link.qp.post_recv_batch(&mut self.reqs[self.next_repost..self.next_repost + take])?;
            self.next_repost = (self.next_repost + take) % len;
            left -= take;
        }
        self.consumed = 0;
        Ok(())
    }
}
