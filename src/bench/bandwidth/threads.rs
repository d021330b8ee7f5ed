//! `--threads`: lanes spread over pinned worker threads, each polling only its own QPs'
//! CQs; this thread keeps the control channel (heartbeats, the peer's `Done`, deadlines)
//! and tells the workers through shared state.

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
    // The rail's CPUs (near its NIC), else any this process may use.
    let cpus = if runs[0].cpus.is_empty() { crate::bench::cpus::allowed() } else { runs[0].cpus.to_vec() };
    let start = clock.now();
    let outcomes = std::thread::scope(|scope| -> Result<Vec<LaneOutcome>> {
        let handles: Vec<_> = groups
            .iter()
            .enumerate()
            .map(|(t, lanes)| {
                let my_runs: Vec<SizeRun> = lanes.iter().map(|&i| runs[i]).collect();
                let (shared, peer, cpus) = (&shared, peer.clone(), &cpus);
                let my_peer_share = lanes.clone();
                scope.spawn(move || -> Result<LaneOutcome> {
                    if !cpus.is_empty() {
                        crate::bench::cpus::pin(cpus[t % cpus.len()]);
                    }
                    let mut set = LaneSet::new(&my_runs, send, receive, start);
                    let mut reported = false;
                    loop {
                        if shared.abort.load(Ordering::Relaxed) {
                            return Err(Error::Peer("stopped: another thread or the control channel failed".into()));
                        }
                        let moved = set.step(&peer)?;
                        if moved > 0 {
                            shared.progress.fetch_add(moved, Ordering::Relaxed);
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
        let coordinated =
            coordinate(chan, &shared, n, announce, peer_sends, (spec, size), runs.len(), &groups, timeout_ns);
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
        let summary = ThroughputSummary::side_by_side(size, &per_thread);
        BandwidthRun { iterations: summary.messages, summary }
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

/// The coordinator: the peer's `Done`, our own `Done` once every worker's sends
/// completed, signals, the peer's silence and the deadline. Returns when the workers are
/// done.
#[allow(clippy::too_many_arguments)]
fn coordinate(
    chan: &mut Channel,
    shared: &Shared,
    threads: usize,
    announce: bool,
    peer_sends: bool,
    (spec, size): (&TestSpec, u64),
    qps: usize,
    groups: &[Vec<usize>],
    timeout_ns: u64,
) -> Result<()> {
    let mut announced = !announce;
    let mut seen = shared.progress.load(Ordering::Relaxed);
    let start = std::time::Instant::now();
    let mut quiet_since = start;
    loop {
        std::thread::sleep(Duration::from_millis(1));
        signals::check()?;
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
        // The channel is read on every turn: the peer's heartbeats are its liveness.
        if shared.peer_per_qp.get().is_none() {
            if let Some(per) = peer_done(chan, peer_sends, size, qps)? {
                let _ = shared.peer_per_qp.set(per);
                quiet_since = std::time::Instant::now();
            }
        } else {
            peer_done(chan, false, size, qps)?;
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
        let elapsed = start.elapsed().as_nanos() as u64;
        let patience = patience_ns(spec, size, qps, now * size, elapsed, timeout_ns);
        wait::check_waited(chan, quiet_since.elapsed().as_nanos() as u64, patience, COMPLETIONS)?;
    }
}
