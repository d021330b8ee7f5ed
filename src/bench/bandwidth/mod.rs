//! Windowed bandwidth, as perftest measures it: keep up to `tx_depth` operations in
//! flight, request a completion every `cq_mod`, and time from the first post to the last
//! completion. Whatever room the window has is posted as one chain (one doorbell). The
//! peak is the best rate over a window of many completion batches (`stats::throughput`).
//!
//! The server is passive for write, read and atomics (it waits for `Done`, then checks
//! what landed); for send and write with immediate it keeps its receive queue stocked,
//! counts and checks every arrival.

use crate::bench::pattern;
use crate::bench::soak::Soak;
use crate::error::{Error, Result};
use crate::link::wait;
use crate::link::{Link, SizeRun};
use crate::session::{Channel, Message, PeerPoll};
use crate::signals;
use crate::spec::{Operation, TestSpec};
use crate::stats::ThroughputSummary;

mod lanes;
mod threads;

use lanes::{LaneOutcome, LaneSet};

/// Empty polls between looks at the deadline, signals and the control channel.
const IDLE_POLLS_PER_CHECK: u32 = 1024;

pub struct BandwidthRun {
    pub summary: ThroughputSummary,
    pub iterations: u64,
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

/// Runs this side's halves until both are finished: its own sends all completed (then,
/// when `announce`, it tells the peer with `Done`), and, when the peer sends too, the
/// peer's `Done` has come and its messages have arrived. With `--threads`, the lanes are
/// spread over pinned worker threads and this thread keeps the control channel.
fn drive(
    runs: &[SizeRun],
    chan: &mut Channel,
    send: bool,
    peer_sends: bool,
    announce: bool,
    mut soak: Option<&mut Soak>,
) -> Result<SideOutcome> {
    let SizeRun { spec, size, clock, timeout_ns, .. } = runs[0];
    let receive = peer_sends && spec.uses_receives();
    if spec.threads > 1 {
        // The spec's check keeps --interval to one thread.
        debug_assert!(soak.is_none());
        return threads::drive(runs, chan, send, receive, peer_sends, announce);
    }
    let peer = chan.peer().to_string();
    let start = clock.now();
    let mut lanes = LaneSet::new(runs, send, receive, start);
    let mut peer_per_qp: Option<Vec<u64>> = None;
    let mut announced = !announce;
    let mut idle = 0u32;
    let (mut last_progress, mut last_check) = (start, start);
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
        let checked_due = if progress > 0 {
            // A poll that reaped completions (a batch of --cq-mod messages): cheap enough
            // to read the clock each time. The peer is looked at every WATCH_EVERY_NS even
            // while completions flow: a stopped peer's NIC still answers RDMA, and only
            // its silence on the control channel tells.
            last_progress = clock.now();
            if let Some(s) = soak.as_deref_mut() {
                s.progress(lanes.completed(), clock.nanos(start, last_progress));
            }
            clock.nanos(last_check, last_progress) >= wait::WATCH_EVERY_NS
        } else {
            idle += 1;
            if lanes.idle_wait()? {
                idle = IDLE_POLLS_PER_CHECK;
            }
            idle.is_multiple_of(IDLE_POLLS_PER_CHECK)
        };
        if checked_due {
            last_check = clock.now();
            signals::check()?;
            if let Some(per) = peer_done(chan, peer_sends, size, runs.len())? {
                peer_per_qp = Some(per);
                last_progress = clock.now();
            }
            let now = clock.now();
            let moved = (lanes.completed() + lanes.received()) * size;
            let patience = patience_ns(runs[0].spec, size, runs.len(), moved, clock.nanos(start, now), timeout_ns);
            wait::check_waited(chan, clock.nanos(last_progress, now), patience, COMPLETIONS)?;
        }
    }
    let outcome = lanes.finish(&peer)?;
    let peer_per_qp = peer_per_qp.unwrap_or_default();
    Ok(SideOutcome {
        sent: outcome.sent.map(|summary| BandwidthRun { iterations: summary.messages, summary }),
        peer_total: peer_sends.then(|| peer_per_qp.iter().sum()), // checked by split_per_qp
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
            split_per_qp(iterations, per_qp, qps, chan.peer()).map(Some)
        }
        PeerPoll::Message(m) => Err(Error::Peer(format!("{} sent {} in the middle of the run", chan.peer(), m.kind()))),
    }
}

/// The slowest rate a run is assumed to move at before its first completion tells the
/// real one: 100 Mb/s, below any link worth measuring.
const FLOOR_BYTES_PER_SEC: f64 = 12.5e6;

/// How long a bandwidth run may go without a completion before its RDMA path counts as
/// stalled: `--timeout`, or longer where the volume in flight needs it. A run's window
/// (`qps` x its depth x `size`) may complete only as a whole, as when many QPs share a
/// link: at the rate measured so far (`moved` bytes in `elapsed_ns`; the floor before any)
/// it needs `window / rate`, and four times that is allowed. So `-q 50 -s 4M` on a slow
/// link waits for its sparse completions, while a path that stopped is caught.
pub fn patience_ns(spec: &TestSpec, size: u64, qps: usize, moved: u64, elapsed_ns: u64, timeout_ns: u64) -> u64 {
    let depth = u64::from(spec.tx_depth).min(spec.iterations.max(1));
    let window = (qps as u64).saturating_mul(depth).saturating_mul(size) as f64;
    let rate = if moved > 0 && elapsed_ns > 0 { moved as f64 * 1e9 / elapsed_ns as f64 } else { FLOOR_BYTES_PER_SEC };
    let needed = 4.0 * window / rate.max(FLOOR_BYTES_PER_SEC) * 1e9;
    timeout_ns.max(needed.min(u64::MAX as f64) as u64)
}

/// What a bandwidth run's checks say it waited for.
const COMPLETIONS: &str = "the bandwidth run's completions";

/// The peer's per-QP counts, checked: one per QP adding up to its total without
/// overflow (a peer with one QP may leave `per_qp` empty).
fn split_per_qp(total: u64, per_qp: Vec<u64>, qps: usize, peer: &str) -> Result<Vec<u64>> {
    if per_qp.is_empty() && qps == 1 {
        return Ok(vec![total]);
    }
    let sum = per_qp.iter().try_fold(0u64, |a, &n| a.checked_add(n));
    if per_qp.len() != qps || sum != Some(total) {
        return Err(Error::Peer(format!(
            "{peer} sent {} per-QP counts adding up to {}, for {qps} QPs and {total} messages; the two sides \
             disagree on the spec, or the peer is not rdmabench",
            per_qp.len(),
            sum.map_or("more than 2^64".to_string(), |s| s.to_string())
        )));
    }
    Ok(per_qp)
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
pub fn client(runs: &[SizeRun], chan: &mut Channel, soak: Option<&mut Soak>) -> Result<SideOutcome> {
    let both = runs[0].spec.bidirectional;
    drive(runs, chan, true, both, both, soak)
}

/// The server side of one size: (messages it saw, first data error, its own direction
/// with `-b`).
pub fn server(runs: &[SizeRun], chan: &mut Channel) -> Result<(u64, Option<String>, Option<ThroughputSummary>)> {
    let SizeRun { spec, size, .. } = runs[0];
    let outcome = if spec.bidirectional || spec.uses_receives() {
        drive(runs, chan, spec.bidirectional, true, spec.bidirectional, None)?
    } else {
        // Passive: nothing to poll, so sleep in the channel until the client's `Done`.
        match chan.recv("the end of the bandwidth run")? {
            Message::Done { size: s, iterations, per_qp } if s == size => SideOutcome {
                sent: None,
                peer_total: Some(iterations),
                peer_per_qp: split_per_qp(iterations, per_qp, runs.len(), chan.peer())?,
                sent_per_qp: Vec::new(),
                received: None,
                data_error: None,
                per_thread: Vec::new(),
            },
            other => return Err(chan.unexpected(&other, "done")),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Measure;

    const S: u64 = 1_000_000_000;

    fn spec(iterations: u64) -> TestSpec {
        let mut s = TestSpec::new(Operation::Write, Measure::Bandwidth);
        s.iterations = iterations;
        s
    }

    #[test]
    fn a_small_window_waits_the_timeout_and_a_large_one_what_its_volume_needs() {
        // 64 KiB x 128 on 1 QP: 8 MiB, 0.7 s at the floor (four times 2.7 s): --timeout rules.
        assert_eq!(patience_ns(&spec(5000), 65536, 1, 0, 0, 5 * S), 5 * S);
        // The run: 50 QPs x 10 x 4 MiB = 2000 MiB in flight. Before any completion,
        // at the 100 Mb/s floor: four times 168 s.
        let before = patience_ns(&spec(10), 4 << 20, 50, 0, 0, 5 * S);
        assert!((670 * S..675 * S).contains(&before), "{before}");
        // Once 200 MiB moved in 3 s (70 MB/s): four times 30 s.
        let measured = patience_ns(&spec(10), 4 << 20, 50, 200 << 20, 3 * S, 5 * S);
        assert!((119 * S..121 * S).contains(&measured), "{measured}");
        // A fast link's own rate shortens it, down to --timeout: 12.5 GB/s.
        assert_eq!(patience_ns(&spec(10), 4 << 20, 50, 25_000_000_000, 2 * S, 5 * S), 5 * S);
    }
}
