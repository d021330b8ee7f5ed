//! The verbs side of the ring: posts the writes the core decides on, reads and publishes
//! credit words, reposts receives for `Imm`, and waits with the session's deadline and an
//! eye on the control channel. `Sender` and `Receiver` work on a connected `Link` (one RC
//! QP and one registered buffer laid out by `RingLayout`) and take the control channel per
//! blocking call, so one process can drive both directions (the latency test's echo);
//! `Producer` and `Consumer` (in `session`) own their link and channel for the library.

use std::borrow::Borrow;
use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use super::core::{Arrival, ConsumerCore, NoRoom, ProducerCore, RecordRef, Reserved, RingMem};
use super::layout::{Notify, RingConfig, RingLayout, Wait};
use crate::error::{Error, Result};
use crate::link::Link;
use crate::link::wait::{SendWindow, Woke, spin_then_sleep, spin_until};
use crate::session::Channel;
use crate::spec::ring::{WAKE_RECEIVES, receive_scratch};
use crate::stats::Clock;
use crate::verbs::cq::{Completion, CqKind, check_completion, completions, imm_of};
use crate::verbs::{RecvRequest, SendRequest};

fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

fn buffer_mem(link: &Link) -> RingMem {
    // SAFETY: the registered buffer lives as long as the link.
    unsafe { RingMem::new(link.buf.addr() as *mut u8, link.buf.len() as u64) }
}

/// A view of one region of the link's buffer.
fn region(link: &Link, offset: u64, len: u64) -> RingMem {
    let all = buffer_mem(link);
    // SAFETY: inside the buffer (checked by `ptr`).
    unsafe { RingMem::new(all.ptr(offset, len), len) }
}

fn check_link(link: &Link, layout: &RingLayout) -> Result<()> {
    if (link.buf.len() as u64) < layout.total || link.remote.buf_len < layout.total {
        return Err(Error::Usage(format!(
            "a ring of {} B needs {} B registered on each side; the link has {} here and {} at the peer",
            layout.capacity,
            layout.total,
            link.buf.len(),
            link.remote.buf_len
        )));
    }
    Ok(())
}

/// Posts an 8-byte write of `value` to `remote` (an offset in the peer's buffer) from
/// small-write slot `n`, inline where the device allows; with `imm`, as a write with
/// immediate, which wakes a peer sleeping on its receive completions.
/// `force` asks for a completion regardless of the window's rhythm.
fn post_small(
    link: &Link,
    window: &mut SendWindow,
    small: &mut SmallWrite,
    (remote, value): (u64, u64),
    imm: Option<u32>,
    force: bool,
) -> Result<()> {
    small.count += 1;
    let slot = small.layout.slot(small.count);
    buffer_mem(link).store_u64(slot, value);
    let mut req = SendRequest::write(&link.buf, slot as usize, 8, link.remote.addr + remote, link.remote.rkey, imm);
    let (signaled, wr_id) = window.on_post(force);
    req.set_flags(signaled, link.inline_size >= 8);
    req.set_wr_id(wr_id);
    link.qp.post(&mut req)
}

/// Where the small writes (credit words, requests) come from: a slot per send queue
/// entry, cycling, so none is rewritten while a write from it may be in flight.
struct SmallWrite {
    layout: RingLayout,
    count: u64,
}

/// Waits until every write this side posted has completed: the window's unsignalled tail
/// is retired by `resend`, one more signalled write of a value the peer already has.
/// Afterwards nothing of this side's is in flight, so the peer may reuse its memory.
fn settle(
    link: &Link,
    window: &mut SendWindow,
    clock: &Clock,
    chan: &mut Channel,
    timeout_ns: u64,
    resend: impl FnOnce(&mut SendWindow) -> Result<()>,
) -> Result<()> {
    if window.unsignaled() > 0 {
        window.wait_for_room(link, clock, chan, timeout_ns)?;
        resend(window)?;
    }
    window.wait_until_empty(link, clock, chan, timeout_ns)
}

/// The producing end on a link.
pub struct Sender<L: Borrow<Link>> {
    link: L,
    core: ProducerCore,
    layout: RingLayout,
    notify: Notify,
    batch: u64,
    /// Unsent bytes that make a write on their own (an eighth of the ring).
    flush_bytes: u64,
    /// The data writes, built once: a flush sets addresses, length and flags.
    write_req: SendRequest,
    imm_req: SendRequest,
    /// Where the staging ring is (local address) and the consumer's ring (remote).
    staging_addr: u64,
    remote_rx: u64,
    rx_depth: u32,
    window: SendWindow,
    staging: RingMem,
    credit_in: RingMem,
    /// Writes with immediate posted, modulo 2^32.
    imm_sent: u32,
    /// The credit word as `read_credit` last took it: the consumer's released position
    /// and the receives it has reposted (modulo 2^32).
    credit_seen: (u32, u32),
    requests: u32,
    /// The request word last written (the counter, with `WAKE` when this side may sleep).
    request_word: u32,
    /// What the credit word said when the last request went out: ask again only after it
    /// changed (each request is answered by one publication).
    asked_at: Option<(u64, u32)>,
    small: SmallWrite,
    records: u64,
    wait: Wait,
    /// The receives a sleeping producer is woken through (absent when it spins).
    wakes: Option<Wakes>,
    clock: Clock,
    timeout_ns: u64,
}

/// The request word's flag for "answer with a write with immediate: I may be asleep".
const WAKE: u32 = 1 << 31;

/// A producer that may sleep takes the consumer's wake-up writes on the receives the
/// connection posted (`rx_depth` with `Imm`, `WAKE_RECEIVES` with `Poll`: the link's
/// layout) and reposts them.
struct Wakes {
    repost: Vec<RecvRequest>,
    wcs: [Completion; 16],
}

impl Wakes {
    fn new(link: &Link, layout: &RingLayout) -> Wakes {
        let (at, len) = receive_scratch(layout);
        let repost = (0..WAKE_RECEIVES).map(|i| RecvRequest::new(&link.buf, at, len, u64::from(i))).collect();
        Wakes { repost, wcs: completions() }
    }

    /// Takes the wake-ups that arrived and posts their receives again.
    fn take(&mut self, link: &Link, peer: &str) -> Result<()> {
        let n = link.qp.poll_recv(&mut self.wcs)?;
        for wc in &self.wcs[..n] {
            check_completion(wc, peer)?;
        }
        if n > 0 {
            link.qp.post_recv_batch(&mut self.repost[..n])?;
        }
        Ok(())
    }
}

/// Space for one record in the staging ring: write the record into it, then `commit`.
/// Dropped without committing, it is given back.
pub struct Reservation<'p, L: Borrow<Link>> {
    tx: &'p mut Sender<L>,
    chan: &'p mut Channel,
    ptr: *mut u8,
    len: usize,
    committed: bool,
}

impl<L: Borrow<Link>> Sender<L> {
    pub fn new(link: L, config: &RingConfig, timeout: Duration) -> Result<Self> {
        config.check().map_err(Error::Usage)?;
        let layout = RingLayout::new(config.capacity, config.tx_depth);
        let l: &Link = link.borrow();
        check_link(l, &layout)?;
        let (staging, credit_in) = (region(l, layout.tx, layout.capacity), region(l, layout.credit_in, 8));
        let write_req = SendRequest::write(&l.buf, layout.tx as usize, 0, 0, l.remote.rkey, None);
        let imm_req = SendRequest::write(&l.buf, layout.tx as usize, 0, 0, l.remote.rkey, Some(0));
        let (staging_addr, remote_rx) = (l.buf.addr() + layout.tx, l.remote.addr + layout.rx);
        let wakes = match config.wait {
            Wait::Spin => None,
            _ => Some(Wakes::new(l, &layout)),
        };
        Ok(Sender {
            link,
            core: ProducerCore::new(config.capacity),
            layout,
            notify: config.notify,
            batch: u64::from(config.batch.max(1)),
            flush_bytes: config.capacity / 8,
            write_req,
            imm_req,
            staging_addr,
            remote_rx,
            rx_depth: config.rx_depth,
            window: SendWindow::new(config.tx_depth, (config.tx_depth / 2).max(1)),
            staging,
            credit_in,
            imm_sent: 0,
            credit_seen: (0, 0),
            requests: 0,
            request_word: 0,
            asked_at: None,
            small: SmallWrite { layout, count: 0 },
            records: 0,
            wait: config.wait,
            wakes,
            clock: Clock::new(),
            timeout_ns: nanos(timeout),
        })
    }

    pub fn max_record(&self) -> usize {
        super::core::max_record(self.core.capacity()) as usize
    }

    /// Records committed so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Reserves `len` bytes, waiting for credit up to the session deadline.
    pub fn reserve<'p>(&'p mut self, chan: &'p mut Channel, len: usize) -> Result<Reservation<'p, L>> {
        let r = self.find_room(chan, len, None)?.expect("an unbounded wait finds room or fails");
        Ok(self.reservation(chan, r))
    }

    /// Reserves `len` bytes if there is room within `wait` (zero: now); `None` if not.
    pub fn reserve_within<'p>(
        &'p mut self,
        chan: &'p mut Channel,
        len: usize,
        wait: Duration,
    ) -> Result<Option<Reservation<'p, L>>> {
        Ok(self.find_room(chan, len, Some(nanos(wait)))?.map(|r| self.reservation(chan, r)))
    }

    fn reservation<'p>(&'p mut self, chan: &'p mut Channel, r: Reserved) -> Reservation<'p, L> {
        let ptr = self.staging.ptr(r.offset, r.len);
        Reservation { tx: self, chan, ptr, len: r.len as usize, committed: false }
    }

    /// Finds room for `len` (the core holds the reservation until commit or cancel).
    /// `wait`: `None` blocks up to the session deadline (running out is the peer's fault:
    /// an error); `Some` gives up quietly after that long.
    fn find_room(&mut self, chan: &mut Channel, len: usize, wait: Option<u64>) -> Result<Option<Reserved>> {
        // The clock is read only once the ring is full: the common path costs no read.
        let mut start = None;
        loop {
            self.read_credit(chan)?;
            match self.core.reserve(len as u64, &self.staging) {
                Ok(r) => return Ok(Some(r)),
                Err(NoRoom::TooLarge { len, max }) => {
                    return Err(Error::Usage(format!(
                        "a record of {len} B does not fit this ring of {} B (at most {max} B per record); use a \
                         larger capacity",
                        self.core.capacity()
                    )));
                }
                Err(NoRoom::Full { .. }) => {}
            }
            // What is committed must be on its way, or the consumer could never release
            // it; and the consumer publishes early only when asked.
            self.flush(chan)?;
            self.ask_for_credit(chan)?;
            let left = match wait {
                None => None,
                Some(w) => {
                    match w.checked_sub(self.clock.nanos(*start.get_or_insert(self.clock.now()), self.clock.now())) {
                        Some(l) if l > 0 => Some(l),
                        _ => return Ok(None),
                    }
                }
            };
            if !self.wait_for_credit(chan, left)? {
                return Ok(None);
            }
        }
    }

    /// Takes the consumer's credit word (released position, receives reposted).
    fn read_credit(&mut self, chan: &Channel) -> Result<()> {
        let pos = self.credit_in.load_u32(0);
        self.credit_seen = (pos, self.credit_in.load_u32(4));
        self.core.on_credit(pos).map(|_| ()).map_err(|e| Error::Peer(format!("{}: {e}", chan.peer())))
    }

    fn ask_for_credit(&mut self, chan: &mut Channel) -> Result<()> {
        let now = (self.core.released(), self.credit_seen.1);
        if self.asked_at == Some(now) {
            return Ok(());
        }
        self.asked_at = Some(now);
        self.requests = self.requests.wrapping_add(1) & !WAKE;
        let link: &Link = self.link.borrow();
        self.window.wait_for_room(link, &self.clock, chan, self.timeout_ns)?;
        // A producer that may sleep asks to be woken: the consumer then answers with a
        // write with immediate. With `Imm`, the request itself carries one too (the end
        // of what was sent, news to nobody), so that a consumer asleep on its receives
        // wakes to answer; without a receive to spare the consumer has arrivals to wake
        // it anyway.
        let (word, imm) = match self.wait.spin_ns() {
            None => (self.requests, None),
            Some(_) => {
                let spare = self.imm_sent.wrapping_sub(self.credit_seen.1) < self.rx_depth;
                let imm = (self.notify == Notify::Imm && spare).then_some(self.core.sent() as u32);
                (self.requests | WAKE, imm)
            }
        };
        if imm.is_some() {
            self.imm_sent = self.imm_sent.wrapping_add(1);
        }
        self.request_word = word;
        post_small(link, &mut self.window, &mut self.small, (self.layout.request_in, u64::from(word)), imm, false)
    }

    /// Waits until the credit word differs from what `read_credit` last took (not from
    /// what it says now: a word that changed in between is news already). `wait`: `None`
    /// up to the session deadline (an error after it), `Some` that long (false after it).
    fn wait_for_credit(&mut self, chan: &mut Channel, wait: Option<u64>) -> Result<bool> {
        let credit_in = self.credit_in;
        let before = self.credit_seen;
        let clock = self.clock;
        let start = clock.now();
        let link: &Link = self.link.borrow();
        let window = &mut self.window;
        let peer = chan.peer().to_string();
        let (mut err, mut timed_out) = (None, false);
        let deadline = if wait.is_some() { u64::MAX } else { self.timeout_ns };
        let wakes = &mut self.wakes;
        let ready = || {
            // A wake-up's completion is taken whatever woke us, so receives never run out.
            if let Some(w) = wakes.as_mut()
                && let Err(e) = w.take(link, &peer)
            {
                err = Some(e);
                return true;
            }
            if (credit_in.load_u32(0), credit_in.load_u32(4)) != before {
                return true;
            }
            // Completions of our writes free the send queue meanwhile.
            if let Err(e) = window.reap(link, &peer) {
                err = Some(e);
                return true;
            }
            timed_out = wait.is_some_and(|w| clock.nanos(start, clock.now()) >= w);
            timed_out
        };
        let waiting_for = "credit from the consumer";
        let woke = match self.wait.spin_ns() {
            None => spin_until(&clock, chan, deadline, waiting_for, None, ready)?,
            Some(spin) => spin_then_sleep(&clock, chan, deadline, waiting_for, (&link.qp, CqKind::Recv), spin, ready)?,
        };
        if let Some(e) = err {
            return Err(e);
        }
        if let Woke::Peer(m) = woke {
            return Err(Error::Peer(format!("{peer} sent {} while this side waited for credit", m.kind())));
        }
        Ok(!timed_out)
    }

    fn commit_reserved(&mut self, chan: &mut Channel) -> Result<u64> {
        let seq = self.core.commit(&self.staging);
        self.records += 1;
        // Large records go out before `batch` of them gather: a write waits for all of
        // its bytes, and the consumer can release nothing of it meanwhile.
        let unsent_bytes = self.core.committed() - self.core.sent();
        if self.core.unsent_records() >= self.batch || unsent_bytes >= self.flush_bytes {
            self.flush(chan)?;
        }
        Ok(seq)
    }

    /// Sends every committed record now: one write (two where they wrap), the last with
    /// the notification.
    pub fn flush(&mut self, chan: &mut Channel) -> Result<()> {
        if self.core.sent() == self.core.committed() {
            return Ok(());
        }
        if self.notify == Notify::Imm {
            // A write with immediate needs a receive posted at the consumer.
            self.wait_for(chan, |tx| tx.imm_sent.wrapping_sub(tx.credit_seen.1) < tx.rx_depth)?;
        }
        let (ranges, end) = self.core.take_unsent();
        let link: &Link = self.link.borrow();
        let last = if ranges[1].is_some() { 1 } else { 0 };
        for (k, r) in ranges.iter().enumerate().filter_map(|(k, r)| r.map(|r| (k, r))) {
            if !self.window.has_room() {
                self.window.wait_for_room(link, &self.clock, chan, self.timeout_ns)?;
            }
            let with_imm = k == last && self.notify == Notify::Imm;
            let req = if with_imm { &mut self.imm_req } else { &mut self.write_req };
            if with_imm {
                req.set_imm(end as u32);
            }
            req.set_local(self.staging_addr + r.offset, r.len as u32);
            req.set_remote(self.remote_rx + r.offset);
            let (signaled, wr_id) = self.window.on_post(false);
            req.set_flags(signaled, r.len <= u64::from(link.inline_size));
            req.set_wr_id(wr_id);
            link.qp.post(req)?;
            if with_imm {
                self.imm_sent = self.imm_sent.wrapping_add(1);
            }
        }
        Ok(())
    }

    /// Flushes and waits until the consumer has released everything committed.
    pub fn drain(&mut self, chan: &mut Channel) -> Result<()> {
        self.flush(chan)?;
        self.wait_for(chan, |tx| tx.core.released() == tx.core.committed())
    }

    /// Waits, asking the consumer, until the credit word gives `enough` (an error after
    /// the session deadline).
    fn wait_for(&mut self, chan: &mut Channel, enough: impl Fn(&Self) -> bool) -> Result<()> {
        loop {
            self.read_credit(chan)?;
            if enough(self) {
                return Ok(());
            }
            self.ask_for_credit(chan)?;
            self.wait_for_credit(chan, None)?;
        }
    }

    /// Waits until every write this side posted has completed (after `drain`, before the
    /// peer is told the stream ended, so nothing of this stream lands later).
    pub fn settle(&mut self, chan: &mut Channel) -> Result<()> {
        let link: &Link = self.link.borrow();
        let (request_in, value) = (self.layout.request_in, u64::from(self.request_word));
        let small = &mut self.small;
        settle(link, &mut self.window, &self.clock, chan, self.timeout_ns, |w| {
            // The request word as it stands: a request the consumer has seen already.
            post_small(link, w, small, (request_in, value), None, true)
        })
    }
}

impl<L: Borrow<Link>> Reservation<'_, L> {
    /// Commits the record. It is sent with the next write: when `batch` records have
    /// gathered, on `flush`, or when the producer waits for room. Returns its sequence
    /// number in the ring.
    pub fn commit(mut self) -> Result<u64> {
        self.committed = true;
        self.tx.commit_reserved(self.chan)
    }
}

impl<L: Borrow<Link>> Deref for Reservation<'_, L> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the reserved bytes are the producer's alone until commit: the consumer
        // released them (so no write reads them any more) and nothing else points there.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl<L: Borrow<Link>> DerefMut for Reservation<'_, L> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as deref; `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl<L: Borrow<Link>> Drop for Reservation<'_, L> {
    fn drop(&mut self) {
        if !self.committed {
            self.tx.core.cancel();
        }
    }
}

/// The consuming end on a link. Records are borrowed slices of the registered ring;
/// several may be held at once and released in any order.
pub struct Receiver<L: Borrow<Link>> {
    link: L,
    state: RefCell<ReceiverState>,
    ring: RingMem,
    request_in: RingMem,
    layout: RingLayout,
    notify: Notify,
    wait: Wait,
    clock: Clock,
    timeout_ns: u64,
    /// The producer, as named in errors.
    peer: String,
    /// An error met while releasing in `Drop`, returned by the next call.
    failed: RefCell<Option<Error>>,
}

struct ReceiverState {
    core: ConsumerCore,
    window: SendWindow,
    /// `Imm`: data known to have landed up to this position.
    landed: u64,
    repost: Vec<RecvRequest>,
    wcs: [Completion; 16],
    reposted: u32,
    published_recvs: u32,
    rx_depth: u32,
    answered: u32,
    small: SmallWrite,
    /// The credit word last published.
    published: u64,
    records: u64,
}

/// A record in the consumer's ring, borrowed in place. Dropping it releases it.
pub struct Record<'c, L: Borrow<Link>> {
    rx: &'c Receiver<L>,
    rec: RecordRef,
}

impl<L: Borrow<Link>> Receiver<L> {
    /// A receiver on a connected link. Its ring must be all zero (fresh registered memory
    /// is; a reused buffer must be cleared before the peer may write). With `Imm`, the
    /// link's receives must be posted (the connection does it, before the peer may write).
    pub fn new(link: L, config: &RingConfig, timeout: Duration, peer: &str) -> Result<Self> {
        config.check().map_err(Error::Usage)?;
        let layout = RingLayout::new(config.capacity, config.tx_depth);
        let l: &Link = link.borrow();
        check_link(l, &layout)?;
        let (at, len) = receive_scratch(&layout);
        let repost = (0..config.rx_depth.min(16)).map(|i| RecvRequest::new(&l.buf, at, len, u64::from(i))).collect();
        let arrival = if config.notify == Notify::Imm { Arrival::Notified } else { Arrival::Polled };
        let state = ReceiverState {
            core: ConsumerCore::new(config.capacity, arrival),
            window: SendWindow::new(config.tx_depth, (config.tx_depth / 2).max(1)),
            landed: 0,
            repost,
            wcs: completions(),
            reposted: 0,
            published_recvs: 0,
            rx_depth: config.rx_depth,
            answered: 0,
            small: SmallWrite { layout, count: 0 },
            published: 0,
            records: 0,
        };
        Ok(Receiver {
            ring: region(l, layout.rx, layout.capacity),
            request_in: region(l, layout.request_in, 4),
            link,
            state: RefCell::new(state),
            layout,
            notify: config.notify,
            wait: config.wait,
            clock: Clock::new(),
            timeout_ns: nanos(timeout),
            peer: peer.to_string(),
            failed: RefCell::new(None),
        })
    }

    /// Records received so far.
    pub fn records(&self) -> u64 {
        self.state.borrow().records
    }

    /// The next record if one has arrived.
    pub fn try_recv(&self) -> Result<Option<Record<'_, L>>> {
        if let Some(e) = self.failed.borrow_mut().take() {
            return Err(e);
        }
        Ok(self.poll_once()?.map(|rec| Record { rx: self, rec }))
    }

    /// The next record. `wait`: `None` up to the session deadline (an error after it),
    /// `Some` that long (`Ready` with no record after it). A control message from the
    /// peer ends the wait too, as `Woke::Peer`.
    pub fn recv(&self, chan: &mut Channel, wait: Option<Duration>) -> Result<(Option<Record<'_, L>>, Woke)> {
        if let Some(r) = self.try_recv()? {
            return Ok((Some(r), Woke::Ready));
        }
        let clock = self.clock;
        let start = clock.now();
        let wait_ns = wait.map(nanos);
        let (mut found, mut err) = (None, None);
        let deadline = if wait.is_some() { u64::MAX } else { self.timeout_ns };
        let ready = || {
            match self.poll_once() {
                Ok(Some(r)) => found = Some(r),
                Ok(None) => return wait_ns.is_some_and(|w| clock.nanos(start, clock.now()) >= w),
                Err(e) => err = Some(e),
            }
            true
        };
        let link: &Link = self.link.borrow();
        let waiting_for = "the next record";
        // Only a write with immediate wakes a sleeper: a polling consumer spins.
        let woke = match (self.notify, self.wait.spin_ns()) {
            (Notify::Imm, Some(spin)) => {
                spin_then_sleep(&clock, chan, deadline, waiting_for, (&link.qp, CqKind::Recv), spin, ready)?
            }
            _ => spin_until(&clock, chan, deadline, waiting_for, None, ready)?,
        };
        if let Some(e) = err {
            return Err(e);
        }
        Ok((found.map(|rec| Record { rx: self, rec }), woke))
    }

    /// One look: notifications (`Imm`), the next record, and credit owed.
    fn poll_once(&self) -> Result<Option<RecordRef>> {
        let link: &Link = self.link.borrow();
        let mut st = self.state.borrow_mut();
        let st = &mut *st;
        if self.notify == Notify::Imm {
            let n = link.qp.poll_recv(&mut st.wcs)?;
            if n > 0 {
                for wc in &st.wcs[..n] {
                    check_completion(wc, &self.peer)?;
                    st.landed = st.landed.max(st.core.widen_landed(imm_of(wc)));
                }
                // Every receive points at the same scratch slot: repost as many as came.
                link.qp.post_recv_batch(&mut st.repost[..n])?;
                st.reposted = st.reposted.wrapping_add(n as u32);
                self.publish_if_due(link, st, false)?;
            }
        }
        let landed = (self.notify == Notify::Imm).then_some(st.landed);
        match st.core.next(&self.ring, landed) {
            Ok(Some(r)) => {
                st.records += 1;
                Ok(Some(r))
            }
            Ok(None) => {
                // Caught up with everything that landed: now a producer's request is
                // answered with whatever was released.
                self.publish_if_due(link, st, true)?;
                Ok(None)
            }
            Err(e) => Err(Error::Check(format!("the ring from {}: {e}", self.peer))),
        }
    }

    /// Publishes credit when a quarter of the ring (or half the receives) waits to be
    /// returned, or when the producer asked, there is something to give and this side is
    /// `caught_up` (nothing more has landed). Answering only then keeps a blocked producer
    /// from being fed one record at a time, a request and an answer per record, while
    /// the records it already sent are still being read.
    fn publish_if_due(&self, link: &Link, st: &mut ReceiverState, caught_up: bool) -> Result<()> {
        let request = self.request_in.load_u32(0);
        let asked = caught_up && request != st.answered;
        if caught_up && !asked {
            // The spinning path: thresholds are met only by releases and reposts, which
            // look themselves; here only a request is news.
            return Ok(());
        }
        self.publish(link, st, request, asked)
    }

    /// Returns all credit held back (released space, reposted receives) now, as when
    /// asked. For a consumer about to stop polling while its producer still drains.
    pub fn publish_now(&self) -> Result<()> {
        let link: &Link = self.link.borrow();
        let mut st = self.state.borrow_mut();
        let request = self.request_in.load_u32(0);
        self.publish(link, &mut st, request, true)
    }

    fn publish(&self, link: &Link, st: &mut ReceiverState, request: u32, asked: bool) -> Result<()> {
        let recvs_waiting = st.reposted.wrapping_sub(st.published_recvs);
        let due = st.core.credit_due(asked) || recvs_waiting >= st.rx_depth / 2 || (asked && recvs_waiting > 0);
        if !due {
            return Ok(());
        }
        // No control channel here (this may run in a record's drop): the session deadline
        // bounds the wait, and a dead peer's QP fails its requests after its retries anyway.
        let start = self.clock.now();
        while !st.window.has_room() {
            st.window.reap(link, &self.peer)?;
            if !st.window.has_room() && self.clock.nanos(start, self.clock.now()) >= self.timeout_ns {
                return Err(Error::Peer(format!(
                    "{}: no credit write completed for {:.1} s (--timeout); it hung or died",
                    self.peer,
                    self.timeout_ns as f64 / 1e9
                )));
            }
        }
        // A producer that may be asleep asked to be woken: whatever publication answers that
        // request first (asked, or due on its own) carries an immediate, once: each wake-up
        // takes one of its receives. (A missed one would cost a 20 ms sleep slice.)
        let imm = (request & WAKE != 0 && request != st.answered).then_some(0);
        st.answered = request;
        let word = u64::from(st.core.publish(&self.ring)) | (u64::from(st.reposted) << 32);
        st.published_recvs = st.reposted;
        st.published = word;
        post_small(link, &mut st.window, &mut st.small, (self.layout.credit_in, word), imm, false)?;
        st.window.reap(link, &self.peer).map(|_| ())
    }

    /// Waits until every credit write this side posted has completed (before it reports
    /// the stream's end, so nothing of this stream lands later).
    pub fn settle(&self, chan: &mut Channel) -> Result<()> {
        let link: &Link = self.link.borrow();
        let mut st = self.state.borrow_mut();
        let st = &mut *st;
        let (credit_in, word) = (self.layout.credit_in, st.published);
        let small = &mut st.small;
        settle(link, &mut st.window, &self.clock, chan, self.timeout_ns, |w| {
            // The word last published: the producer has it (or is about to) already.
            post_small(link, w, small, (credit_in, word), None, true)
        })
    }

    fn release(&self, rec: &RecordRef) -> Result<()> {
        let link: &Link = self.link.borrow();
        let mut st = self.state.borrow_mut();
        st.core.release(rec.pos);
        self.publish_if_due(link, &mut st, false)
    }
}

impl<L: Borrow<Link>> Record<'_, L> {
    /// The record's sequence number in the ring (pads count too, so numbers may skip).
    pub fn seq(&self) -> u64 {
        self.rec.seq
    }

    /// Releases the record now, returning any error in returning credit.
    pub fn release(self) -> Result<()> {
        let r = self.rx.release(&self.rec);
        std::mem::forget(self);
        r
    }
}

impl<L: Borrow<Link>> Deref for Record<'_, L> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let (off, len) = (self.rec.offset, self.rec.len);
        // SAFETY: the record's bytes have landed (the core checked), and the producer
        // writes them again only after this record is released (no credit covers them).
        unsafe { std::slice::from_raw_parts(self.rx.ring.ptr(off, len), len as usize) }
    }
}

impl<L: Borrow<Link>> Drop for Record<'_, L> {
    fn drop(&mut self) {
        if let Err(e) = self.rx.release(&self.rec) {
            self.rx.failed.borrow_mut().get_or_insert(e);
        }
    }
}
