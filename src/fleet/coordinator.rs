//! The barrier's socket layer, on node 0: one thread that waits on readiness (poll(2) on
//! the listening socket and every connection) until something arrives or the barrier's
//! next deadline, feeds what arrived to the [`Barrier`] and sends what it decides. While
//! nothing arrives it sleeps in the kernel, waking only to look at signals.
//!
//! New connections are greeted and must join with the token's proof; a node that joins
//! is the barrier's to judge (its plan, its index, whether the fleet began without it).
//!
//! Liveness both ways: the coordinator sends every joined node a heartbeat from this loop
//! (no thread per node), and each node's keepalive speaks to it; a node silent for
//! `--timeout` has left, named as a two-host session names a silent peer (a stopped
//! process whose host still answers, or a host down or cut off).

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use super::barrier::{Action, Barrier, Outcome};
use crate::error::{Error, Result};
use crate::session::auth::Token;
use crate::session::channel::heartbeat_every;
use crate::session::{Channel, Listener, Message, PeerPoll, handshake};
use crate::signals;

/// The longest the coordinator sleeps without looking at signals.
const SIGNAL_CHECK: Duration = Duration::from_millis(250);
/// Connections still joining at most, for a fleet of `nodes`: every node twice over (each
/// may retry while its first connection is still counted) and 64 more. Each holds two
/// descriptors and a 4 KiB buffer for at most `--timeout`, so a flood of strangers holds
/// under 10 MiB of node 0's memory at 1,024 nodes; a connection beyond it is closed at
/// once, and an honest node whose join was cut joins again.
pub fn max_opening(nodes: u32) -> usize {
    2 * nodes as usize + 64
}

/// The descriptors node 0 needs for a fleet of `nodes`: two per node's connection and per
/// joining one (a channel keeps a second handle for its writer), and room for the node's
/// own sessions and files.
pub fn open_files_needed(nodes: u32) -> u64 {
    2 * (nodes as u64 + max_opening(nodes) as u64) + 256
}

/// A connection greeted and not yet joined.
struct Opening {
    chan: Channel,
    nonce: String,
    until: Instant,
}

pub struct Coordinator {
    pub listener: Listener,
    pub token: Option<Token>,
    /// How long a connection may take to join, and to take a message (`--timeout`).
    pub timeout: Duration,
    pub barrier: Barrier,
}

impl Coordinator {
    /// Runs the fleet until the barrier says it is over; `start` is the barrier's time 0.
    pub fn run(mut self, start: Instant) -> Result<Outcome> {
        let mut links = Links { nodes: (0..self.barrier.nodes()).map(|_| None).collect(), start };
        let beat_every = heartbeat_every(self.timeout);
        let mut last_beat = Instant::now();
        let mut openings: Vec<Opening> = Vec::new();
        while !self.barrier.is_done() {
            if let Err(e) = signals::check() {
                links.abort_all(&e);
                return Err(e);
            }
            let acts = self.barrier.tick(links.now());
            links.perform(&mut self.barrier, acts);
            if last_beat.elapsed() >= beat_every {
                last_beat = Instant::now();
                links.beat(&mut self.barrier, self.timeout);
            }
            if self.barrier.is_done() {
                break;
            }
            let now = Instant::now();
            let (open, expired): (Vec<Opening>, Vec<Opening>) = openings.drain(..).partition(|o| o.until > now);
            openings = open;
            for o in expired {
                eprintln!(
                    "rdmabench: fleet: {} did not join within {:.0} s",
                    o.chan.peer(),
                    self.timeout.as_secs_f64()
                );
                close_aside(o.chan, "a connection that did not join");
            }
            let wait = self.next_wake(&links, &openings);
            let mut fds: Vec<libc::pollfd> = Vec::with_capacity(1 + openings.len() + links.nodes.len());
            fds.push(readable(self.listener.raw_fd()));
            fds.extend(openings.iter().map(|o| readable(o.chan.raw_fd())));
            let node_fds: Vec<(u32, RawFd)> = links.live_fds();
            fds.extend(node_fds.iter().map(|&(_, fd)| readable(fd)));
            // SAFETY: `fds` is a valid array of `fds.len()` pollfd entries for the call.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait.as_millis() as libc::c_int) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(Error::Environment(format!("the fleet's barrier cannot wait on its connections: {e}")));
            }
            if n == 0 {
                continue;
            }
            let fired = |k: usize| fds[k].revents != 0;
            let opened: Vec<usize> = (0..openings.len()).filter(|&k| fired(1 + k)).collect();
            for (k, &(node, _)) in node_fds.iter().enumerate() {
                if fired(1 + openings.len() + k) {
                    links.drain(&mut self.barrier, node);
                }
            }
            // Highest first, so the indexes left to take stay valid.
            for k in opened.into_iter().rev() {
                let o = openings.swap_remove(k);
                self.opened(o, &mut links, &mut openings);
            }
            if fired(0) {
                self.accept(&mut openings);
            }
        }
        drop(links);
        Ok(self.barrier.into_outcome())
    }

    /// How long poll may sleep: until the barrier's deadline or an opening's, and no
    /// longer than a signal may wait to be seen.
    fn next_wake(&self, links: &Links, openings: &[Opening]) -> Duration {
        let mut wait = SIGNAL_CHECK.min(heartbeat_every(self.timeout));
        if let Some(d) = self.barrier.next_deadline() {
            wait = wait.min(d.saturating_sub(links.now()));
        }
        let now = Instant::now();
        for o in openings {
            wait = wait.min(o.until.saturating_duration_since(now));
        }
        // Round up to the next millisecond, so a deadline is never polled as 0 again and again.
        wait + Duration::from_micros(999)
    }

    /// Greets every waiting connection.
    fn accept(&self, openings: &mut Vec<Opening>) {
        loop {
            let mut chan = match self.listener.try_accept(self.timeout) {
                Ok(Some(c)) => c,
                Ok(None) => return,
                Err(e) => {
                    eprintln!("rdmabench: fleet: {e}");
                    return;
                }
            };
            if openings.len() >= max_opening(self.barrier.nodes()) {
                eprintln!(
                    "rdmabench: fleet: a connection from {} was closed at once: {} others are still joining",
                    chan.peer(),
                    openings.len()
                );
                // Not aside: a flood would cost a thread each.
                chan.close_at_once();
                continue;
            }
            match handshake::greet(&mut chan) {
                Ok(nonce) => openings.push(Opening { chan, nonce, until: Instant::now() + self.timeout }),
                Err(e) => {
                    eprintln!("rdmabench: fleet: a connection ended before it joined: {e}");
                    close_aside(chan, "a connection that ended");
                }
            }
        }
    }

    /// A connection that is joining has something to say.
    fn opened(&mut self, mut o: Opening, links: &mut Links, openings: &mut Vec<Opening>) {
        let msg = match o.chan.poll_peer("its join") {
            Ok(PeerPoll::Quiet) => return openings.push(o),
            Ok(PeerPoll::Message(m)) => m,
            Err(e) => {
                eprintln!("rdmabench: fleet: a connection ended before it joined: {e}");
                return close_aside(o.chan, "a connection that ended");
            }
        };
        let msg = match handshake::verify_opening(&mut o.chan, msg, &o.nonce, self.token.as_ref()) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("rdmabench: fleet: refused a join from {}: {e}", o.chan.peer());
                return close_aside(o.chan, "a refused connection");
            }
        };
        match msg {
            Message::Join { node, nodes, plan, .. } => {
                // A node that joins again (its first connection cut) replaces a connection
                // that is gone; the barrier hears of the loss first.
                if links.nodes.get(node as usize).is_some_and(Option::is_some) {
                    links.drain(&mut self.barrier, node);
                }
                match self.barrier.join(node, nodes, &plan) {
                    Ok(()) => {
                        o.chan.name_peer(&format!("node-{node}"));
                        links.nodes[node as usize] = Some(o.chan);
                        // Its arrival may have come with its join.
                        links.drain(&mut self.barrier, node);
                    }
                    Err(why) => refuse(o.chan, why),
                }
            }
            other => refuse(o.chan, format!("this is a fleet's barrier; a {} has no place here", other.kind())),
        }
    }
}

/// Tells a connection why it may not join, and closes it aside.
fn refuse(mut chan: Channel, why: String) {
    eprintln!("rdmabench: fleet: refused a join from {}: {why}", chan.peer());
    let _ = chan.send(&Message::Refuse { code: 2, message: why });
    close_aside(chan, "a refused connection");
}

/// Closes `chan` on a thread of its own: a clean close waits for the peer's own
/// (`Drop for Channel`), which a lost, stuck or hostile peer may never send, and the
/// barrier's loop must not wait on it.
fn close_aside(chan: Channel, what: &str) {
    let closing = std::thread::Builder::new().name("closing".into()).spawn(move || drop(chan));
    // No thread to spare: the closure, and the channel with it, is dropped here, within
    // the close's own bound.
    if let Err(e) = closing {
        eprintln!("rdmabench: fleet: closing {what} in the barrier's loop: {e}");
    }
}

fn readable(fd: RawFd) -> libc::pollfd {
    libc::pollfd { fd, events: libc::POLLIN, revents: 0 }
}

/// The joined nodes' connections, by index (None: not joined, or out).
struct Links {
    nodes: Vec<Option<Channel>>,
    start: Instant,
}

impl Links {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// Closes node `node`'s connection aside ([`close_aside`]).
    fn close(&mut self, node: u32) {
        if let Some(chan) = self.nodes[node as usize].take() {
            close_aside(chan, &format!("node {node}'s connection"));
        }
    }

    fn live_fds(&self) -> Vec<(u32, RawFd)> {
        self.nodes.iter().enumerate().filter_map(|(i, c)| c.as_ref().map(|c| (i as u32, c.raw_fd()))).collect()
    }

    /// Feeds every whole message node `node` has sent to the barrier.
    fn drain(&mut self, barrier: &mut Barrier, node: u32) {
        while let Some(chan) = self.nodes[node as usize].as_mut() {
            let acts = match chan.poll_peer("its arrival") {
                Ok(PeerPoll::Quiet) => return,
                Ok(PeerPoll::Message(Message::Arrive { step, rows, served })) => {
                    barrier.arrive(node, step, rows, served, self.now())
                }
                Ok(PeerPoll::Message(other)) => barrier.out_of_turn(node, other.kind(), self.now()),
                Err(e) => {
                    self.close(node);
                    barrier.lost(node, e.message(), self.now())
                }
            };
            self.perform(barrier, acts);
        }
    }

    /// A heartbeat to every joined node; a node silent for `timeout` (not even its
    /// keepalive) or whose connection is gone has left, and the barrier hears why.
    fn beat(&mut self, barrier: &mut Barrier, timeout: Duration) {
        for node in 0..self.nodes.len() {
            let Some(chan) = self.nodes[node].as_mut() else { continue };
            chan.doing("coordinating the fleet");
            let why = match chan.beat() {
                Err(e) => Some(e.message()),
                // Only silence: a node's session with the coordinator stands still while it
                // measures, which its partners' sessions and the step's deadline judge.
                Ok(()) if chan.silent_for() >= timeout => Some(chan.silence("its arrival or a heartbeat").message()),
                Ok(()) => None,
            };
            if let Some(why) = why {
                self.close(node as u32);
                let acts = barrier.lost(node as u32, why, self.now());
                self.perform(barrier, acts);
            }
        }
    }

    /// Does what the barrier decided; a send that fails is the node's loss, which the
    /// barrier hears in turn.
    fn perform(&mut self, barrier: &mut Barrier, mut acts: Vec<Action>) {
        while !acts.is_empty() {
            let mut more = Vec::new();
            for a in acts {
                match a {
                    Action::Send { node, task } => {
                        let Some(chan) = self.nodes[node as usize].as_mut() else { continue };
                        if let Err(e) = chan.send(&Message::Task(task)) {
                            self.close(node);
                            more.extend(barrier.lost(node, e.message(), self.now()));
                        }
                    }
                    Action::Dismiss { node, why } => {
                        if let Some(chan) = self.nodes[node as usize].as_mut() {
                            eprintln!("rdmabench: fleet: node {node} {why}");
                            chan.abort(&Error::Peer(format!("the fleet's barrier dismissed node {node}: it {why}")));
                            self.close(node);
                        }
                    }
                    Action::Done => {}
                }
            }
            acts = more;
        }
    }

    /// Tells every node why the barrier stops.
    fn abort_all(&mut self, e: &Error) {
        for chan in self.nodes.iter_mut().flatten() {
            chan.abort(e);
        }
    }
}

#[cfg(test)]
mod tests;
