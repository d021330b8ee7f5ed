//! The TCP side of the session: connect with retries, accept with a deadline, send and
//! receive frames with a deadline on every wait, and a non-blocking peek used by the
//! measurement loops to notice a dead peer or an abort without slowing the hot path.
//!
//! Liveness has two parts. A keepalive thread sends heartbeats for the whole session, so a
//! silent peer (dead process, host down, link cut) is named within `--timeout`. Each
//! heartbeat also says how long the sender's session thread has not moved and what it was
//! doing: a peer whose process answers but whose session is stuck (a driver call that
//! never returns, a deadlock) is named within [`stuck_after`]. A session ends with a
//! half-close and a drain ([`Channel`]'s `Drop`), never a close over unread input, which
//! Linux answers with a reset that can lose the last message.

use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::frame::{self, FrameError};
use super::proto::Message;
use crate::error::{Error, Result};
use crate::signals;

/// How often blocking waits wake up to look at signals and deadlines.
const TICK: Duration = Duration::from_millis(50);
/// A side in a session tells its peer it is alive at least this often (more often under a
/// short `--timeout`: four times within it).
pub const HEARTBEAT_EVERY: Duration = Duration::from_millis(500);

/// How often a session's keepalive speaks, for `--timeout` `timeout`.
pub fn heartbeat_every(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(10), HEARTBEAT_EVERY)
}

/// A peer whose heartbeats say its session has not moved for this many `--timeout`s is
/// named stuck.
pub const STUCK_TIMEOUTS: u32 = 12;

/// How long a peer's session may stand still while its process still answers (120 s at
/// the default `--timeout` of 10 s). Generous: a session moves whenever its thread sends,
/// reads or looks at the channel, which every wait does at least every 10 ms, and every
/// bandwidth or latency loop every 1024 waits; what stands still is a thread inside a
/// call: registering a very large buffer, or rxe's post of a large window, which runs
/// the transmission in the posting call (50 QPs of 4 MiB stood still 30 s under the lab's
/// emulation), or a driver call that never returns.
pub fn stuck_after(timeout: Duration) -> Duration {
    timeout * STUCK_TIMEOUTS
}

/// The longest a closing side waits for its peer to close too (see `Drop for Channel`).
const LINGER: Duration = Duration::from_secs(2);

/// What this side's session thread is doing and when it last moved; the keepalive reads
/// it into every heartbeat.
struct Motion {
    epoch: Instant,
    /// Milliseconds after `epoch` of the last move.
    moved_ms: AtomicU64,
    doing: Mutex<String>,
}

impl Motion {
    fn new() -> Motion {
        Motion { epoch: Instant::now(), moved_ms: AtomicU64::new(0), doing: Mutex::new("starting".into()) }
    }

    fn mark(&self, doing: &str) {
        self.moved_ms.store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        if let Ok(mut d) = self.doing.lock()
            && *d != doing
        {
            d.clear();
            d.push_str(doing);
        }
    }

    fn still(&self) -> Duration {
        self.epoch.elapsed().saturating_sub(Duration::from_millis(self.moved_ms.load(Ordering::Relaxed)))
    }

    fn heartbeat(&self) -> Message {
        let doing = self.doing.lock().map(|d| d.clone()).unwrap_or_default();
        Message::Heartbeat { doing, still_ms: self.still().as_millis() as u64 }
    }
}

/// What the peer's last heartbeat said of its session.
#[derive(Debug, Clone)]
struct PeerMotion {
    /// How long it had stood still when it sent the heartbeat.
    still: Duration,
    doing: String,
    /// When the heartbeat arrived.
    at: Instant,
}

impl PeerMotion {
    /// How long it has stood still by now, as far as this side knows.
    fn still_now(&self) -> Duration {
        self.still + self.at.elapsed()
    }
}

/// The longest text of a peer's `doing` kept (a peer may send anything).
const DOING_MAX: usize = 160;

pub struct Channel {
    /// Read by this side's waits; written only through `writer`.
    stream: TcpStream,
    /// The socket's write side, shared with the keepalive thread: a frame is written
    /// whole under the lock, so a heartbeat never lands inside another message.
    writer: Arc<Mutex<TcpStream>>,
    peer: String,
    timeout: Duration,
    rbuf: Vec<u8>,
    /// A message read early (while waiting on something else), returned by the next read.
    kept: Option<Message>,
    /// When the peer's last frame (a heartbeat included) arrived: its liveness.
    last_heard: Instant,
    keepalive: Option<Keepalive>,
    /// Waits of a hot loop since the channel opened (see `note_wait`).
    waits: u32,
    /// This side's session thread: when it last moved, and what it does.
    motion: Arc<Motion>,
    /// What the peer's last heartbeat said.
    peer_motion: Option<PeerMotion>,
    /// Set when a frame was cut short on the wire: nothing more may be written.
    broken: Arc<AtomicBool>,
    /// Why this side's keepalive stopped, if it did.
    keepalive_stopped: Arc<Mutex<Option<String>>>,
}

/// A hot loop reads its channel at least once every this many waits.
const DRAIN_EVERY: u32 = 1024;

/// A thread that sends a heartbeat every `heartbeat_every(--timeout)` for the whole
/// session, apart from the data path: the peer hears this side while it posts, waits for
/// completions, registers a large buffer or writes its results, so `--timeout` bounds how
/// long a side may be silent, never how long a run may be. A beat is written only whole
/// ([`write_beat`]); stops when dropped.
struct Keepalive {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Keepalive {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A listening control port: one session per client connection (a test with several
/// rails opens one per rail on the same port).
pub struct Listener {
    listener: TcpListener,
    port: u16,
}

/// How many connections the kernel may queue for a listener before it accepts them.
const LISTEN_BACKLOG: libc::c_int = 4096;

impl Listener {
    /// Listens on `port` at `bind`, or on every address (IPv6 and IPv4 through one
    /// dual-stack socket; IPv4 alone where the kernel has no IPv6).
    pub fn bind(bind: Option<IpAddr>, port: u16) -> Result<Listener> {
        let fail = |at: String, e: std::io::Error| {
            Error::Environment(format!(
                "cannot listen on {at} port {port}: {e}; pick another port with -p, or an address of this host \
                 with --bind"
            ))
        };
        let listener = match bind {
            Some(ip) => TcpListener::bind(SocketAddr::new(ip, port)).map_err(|e| fail(ip.to_string(), e))?,
            None => match TcpListener::bind(SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port)) {
                Ok(l) => l,
                Err(e) if e.kind() == ErrorKind::AddrInUse => return Err(fail("every address".into(), e)),
                Err(_) => TcpListener::bind(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port))
                    .map_err(|e| fail("every IPv4 address".into(), e))?,
            },
        };
        // A longer queue of connections not yet accepted than std's 128: a fleet's nodes
        // all connect to node 0 at once (the kernel caps it at net.core.somaxconn).
        // SAFETY: listen on the socket this listener owns; it only resizes the queue.
        unsafe { libc::listen(listener.as_raw_fd(), LISTEN_BACKLOG) };
        listener.set_nonblocking(true).map_err(|e| Error::Environment(format!("listener: {e}")))?;
        // Port 0 asks the kernel for one: keep the one it gave.
        let port = listener.local_addr().map_or(port, |a| a.port());
        Ok(Listener { listener, port })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The listening socket, for a caller that waits on several at once (poll).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self.listener.as_raw_fd()
    }

    /// The next connection if one is waiting.
    pub fn try_accept(&self, timeout: Duration) -> Result<Option<Channel>> {
        match self.listener.accept() {
            Ok((stream, addr)) => {
                stream.set_nonblocking(false).map_err(|e| Error::Environment(format!("socket: {e}")))?;
                Channel::new(stream, peer_address(addr), timeout).map(Some)
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::ConnectionAborted) => Ok(None),
            Err(e) => Err(Error::Environment(format!("accept on port {}: {e}", self.port))),
        }
    }

    /// Waits up to `wait` for the next client.
    pub fn accept(&self, wait: Duration, timeout: Duration) -> Result<Channel> {
        let deadline = Instant::now() + wait;
        loop {
            signals::check()?;
            if let Some(chan) = self.try_accept(timeout)? {
                return Ok(chan);
            }
            if Instant::now() >= deadline {
                return Err(no_client(self.port, wait));
            }
            std::thread::sleep(TICK);
        }
    }
}

/// The one wording of "nobody came".
pub fn no_client(port: u16, wait: Duration) -> Error {
    Error::Peer(format!("no client connected to port {port} within {} s (--connect-timeout)", wait.as_secs_f64()))
}

/// A peer's address as logs show it: an IPv4 client of the dual-stack socket as plain
/// IPv4 (not ::ffff:a.b.c.d).
fn peer_address(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), v6.port()).to_string(),
            None => addr.to_string(),
        },
        SocketAddr::V4(_) => addr.to_string(),
    }
}

/// What a non-blocking look at the channel found.
#[derive(Debug)]
pub enum PeerPoll {
    Quiet,
    Message(Message),
}

impl Channel {
    /// Connects to `host:port`, retrying until `connect_timeout` so the client may start
    /// before its server. `timeout` bounds every later wait.
    pub fn connect(host: &str, port: u16, connect_timeout: Duration, timeout: Duration) -> Result<Channel> {
        let deadline = Instant::now() + connect_timeout;
        // An IPv6 literal may come bare (::1) or bracketed ([::1]).
        let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        let target = match host.parse::<IpAddr>() {
            Ok(IpAddr::V6(_)) => format!("[{host}]:{port}"),
            _ => format!("{host}:{port}"),
        };
        let mut last_err = String::from("no attempt made");
        loop {
            signals::check()?;
            // Resolve on every attempt: in Kubernetes the server's DNS name appears late.
            match (host, port).to_socket_addrs() {
                Ok(addrs) => {
                    for addr in addrs {
                        let left = deadline.saturating_duration_since(Instant::now()).max(TICK);
                        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(2))) {
                            Ok(stream) => return Channel::new(stream, target, timeout),
                            Err(e) => last_err = e.to_string(),
                        }
                    }
                }
                Err(e) => last_err = format!("cannot resolve {host}: {e}"),
            }
            if Instant::now() >= deadline {
                return Err(Error::Peer(format!(
                    "could not reach server {target} within {} s (--connect-timeout): {last_err}",
                    connect_timeout.as_secs_f64()
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Listens on `port` (every address) and waits up to `wait` for one client.
    pub fn accept(port: u16, wait: Duration, timeout: Duration) -> Result<Channel> {
        Listener::bind(None, port)?.accept(wait, timeout)
    }

    fn new(stream: TcpStream, peer: String, timeout: Duration) -> Result<Channel> {
        let socket = |e: std::io::Error| Error::Environment(format!("socket: {e}"));
        let _ = stream.set_nodelay(true);
        stream.set_write_timeout(Some(timeout)).map_err(socket)?;
        let writer = Arc::new(Mutex::new(stream.try_clone().map_err(socket)?));
        Ok(Channel {
            stream,
            writer,
            peer,
            timeout,
            rbuf: Vec::with_capacity(4096),
            kept: None,
            last_heard: Instant::now(),
            keepalive: None,
            waits: 0,
            motion: Arc::new(Motion::new()),
            peer_motion: None,
            broken: Arc::default(),
            keepalive_stopped: Arc::default(),
        })
    }

    /// Notes that this side's session moved, doing `doing`: what its heartbeats report
    /// while it stands still (a long local step says what it is before it begins).
    pub fn doing(&self, doing: &str) {
        self.motion.mark(doing);
    }

    /// One heartbeat, now, if the socket has room for it whole (a caller without a
    /// keepalive thread, such as a fleet's coordinator, beats from its own loop). Err only
    /// when the connection is lost.
    pub fn beat(&self) -> Result<()> {
        beat_now(&self.writer, &self.motion, &self.broken)
            .map(|_| ())
            .map_err(|e| Error::Peer(format!("lost the connection to {} while sending a heartbeat: {e}", self.peer)))
    }

    /// Starts this side's keepalive (once the session is authenticated: a stranger must
    /// not hold a server with heartbeats); it runs until the channel is dropped.
    pub fn keep_alive(&mut self) {
        if self.keepalive.is_some() {
            return;
        }
        let every = heartbeat_every(self.timeout);
        let writer = Arc::clone(&self.writer);
        let (motion, broken, why) =
            (Arc::clone(&self.motion), Arc::clone(&self.broken), Arc::clone(&self.keepalive_stopped));
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new().name("keepalive".into()).spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                // A lost connection ends the keepalive, saying why; this side's own waits
                // report the loss. A full socket only skips the beat.
                if let Err(e) = beat_now(&writer, &motion, &broken) {
                    if let Ok(mut why) = why.lock() {
                        *why = Some(e.to_string());
                    }
                    return;
                }
            }
        });
        // Without a thread (none to spare) the session runs as before: the peer's waits
        // still end at --timeout.
        if let Ok(thread) = thread {
            self.keepalive = Some(Keepalive { stop: Some(stop), thread: Some(thread) });
        }
    }

    /// Counts one wait of a hot loop; every `DRAIN_EVERY` waits, reads what the peer sent
    /// (a message is kept for the next read). Loops whose waits are all short never reach
    /// the waits' own looks at the channel, and the peer's heartbeats would pile up until
    /// its keepalive could not write. One add and one compare a wait.
    #[inline(always)]
    pub fn note_wait(&mut self) -> Result<()> {
        self.waits = self.waits.wrapping_add(1);
        if self.waits.is_multiple_of(DRAIN_EVERY) {
            self.keep_early("the run")?;
        }
        Ok(())
    }

    /// Reads what the peer has sent: heartbeats (its liveness), and a message that came
    /// early (the peer went on ahead), kept for the next read; a peer that aborted or
    /// went is an error.
    #[cold]
    pub fn keep_early(&mut self, during: &str) -> Result<()> {
        if let PeerPoll::Message(m) = self.poll_peer(during)? {
            self.keep(m);
        }
        Ok(())
    }

    /// [`Channel::keep_early`], then the peer's silence is an error: a look at the peer
    /// from a wait that does not read the channel otherwise.
    #[cold]
    pub fn watch(&mut self, during: &str) -> Result<()> {
        self.keep_early(during)?;
        self.check_alive(during)
    }

    /// How long the peer has sent nothing (not even a heartbeat).
    pub fn silent_for(&self) -> Duration {
        self.last_heard.elapsed()
    }

    /// Err when the peer has been silent for `--timeout` while this side waited for
    /// `waiting_for`, or its heartbeats say its session has stood still for
    /// [`stuck_after`].
    pub fn check_alive(&self, waiting_for: &str) -> Result<()> {
        let silent = self.silent_for();
        if silent >= self.timeout {
            return Err(self.silent(waiting_for, silent));
        }
        self.check_moving(waiting_for)
    }

    /// Err when the peer's last heartbeat says its session has not moved for
    /// [`stuck_after`]: alive but stuck, named with what it was doing.
    pub fn check_moving(&self, waiting_for: &str) -> Result<()> {
        let bound = stuck_after(self.timeout);
        match &self.peer_motion {
            Some(m) if m.still_now() >= bound => Err(Error::Peer(format!(
                "{} is alive but stuck: its heartbeats say its session has not moved for {:.1} s (it was {}), \
                 over the {:.0} s allowed ({STUCK_TIMEOUTS} x --timeout), while this side waited for {waiting_for}",
                self.peer,
                m.still_now().as_secs_f64(),
                m.doing,
                bound.as_secs_f64()
            ))),
            _ => Ok(()),
        }
    }

    /// Err-worthy when the peer's heartbeats say its session has stood still for at least
    /// `waited` (all of a wait of this side's that ran out): the peer is alive but stuck.
    pub fn standing_still(&self, waited: Duration, waiting_for: &str) -> Option<Error> {
        // The freshest heartbeat read may be up to one period old when it is read.
        let period = heartbeat_every(self.timeout);
        let m = self.peer_motion.as_ref().filter(|m| m.still_now() + period >= waited)?;
        Some(Error::Peer(format!(
            "{} is alive but stuck: nothing came for {:.1} s while this side waited for {waiting_for}, and its \
             heartbeats say its session has not moved for {:.1} s (it was {})",
            self.peer,
            waited.as_secs_f64(),
            m.still_now().as_secs_f64(),
            m.doing
        )))
    }

    /// Why this side's keepalive stopped, if it did (the connection was lost).
    pub fn keepalive_stopped(&self) -> Option<String> {
        self.keepalive_stopped.lock().ok().and_then(|w| w.clone())
    }

    /// Whether the peer has missed two heartbeats: a wait that ran out while the peer is
    /// quiet is its silence, not a stalled RDMA path.
    pub fn quiet(&self) -> bool {
        self.silent_for() >= 2 * heartbeat_every(self.timeout)
    }

    /// The peer's silence so far, worded as [`Channel::check_alive`] words it.
    pub fn silence(&self, waiting_for: &str) -> Error {
        self.silent(waiting_for, self.silent_for())
    }

    /// The one wording of a silent peer: whether its host still acknowledges this side's
    /// messages (TCP, which the kernel answers even for a stopped process) tells a stopped
    /// or hung process from a host that is down or a network that is cut.
    fn silent(&self, waiting_for: &str, silent: Duration) -> Error {
        // Only while this side's keepalive speaks does the peer's host have something to
        // acknowledge; a host that answered within half the silence is up.
        let acked = self.keepalive.as_ref().and_then(|_| self.last_ack_age());
        let why = match acked {
            Some(ack) if ack < silent / 2 => format!(
                "its host still acknowledges this side's messages (TCP, {:.1} s ago), so its process is stopped or hung",
                ack.as_secs_f64()
            ),
            Some(ack) => format!(
                "its host has acknowledged nothing for {:.1} s either: the host is down or the network to it is cut",
                ack.as_secs_f64()
            ),
            None => "it hung or died".to_string(),
        };
        // This side's own keepalive stopped only on a lost connection: say so.
        let why = match self.keepalive_stopped() {
            Some(e) => format!("{why}; this side's heartbeats stopped too: {e}"),
            None => why,
        };
        Error::Peer(format!(
            "{} sent nothing, not even a heartbeat, for {:.1} s while this side waited for {waiting_for} (--timeout); \
             {why}",
            self.peer,
            silent.as_secs_f64()
        ))
    }

    /// How long ago the peer's host last acknowledged anything on this connection.
    fn last_ack_age(&self) -> Option<Duration> {
        // SAFETY: tcp_info is plain data; getsockopt writes at most `len` bytes into it.
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let rc = unsafe {
            libc::getsockopt(
                self.stream.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&mut info as *mut libc::tcp_info).cast(),
                &mut len,
            )
        };
        (rc == 0).then(|| Duration::from_millis(info.tcpi_last_ack_recv.into()))
    }

    /// The longest the peer may stay silent (`--timeout`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The one wording of "the peer sent X where Y was due" (exit 4: a peer that breaks the
    /// protocol is as good as lost).
    pub fn unexpected(&self, got: &Message, wanted: &str) -> Error {
        Error::Peer(format!("{} sent {} instead of {wanted}", self.peer(), got.kind()))
    }

    /// How the peer is named in messages: its node name once known, and its address.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// The connection's socket, for a caller that waits on several at once (poll).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self.stream.as_raw_fd()
    }

    pub fn name_peer(&mut self, node: &str) {
        if !self.peer.starts_with("peer ") {
            self.peer = format!("peer {node} ({})", self.peer);
        }
    }

    pub fn send(&mut self, msg: &Message) -> Result<()> {
        let bytes = frame::encode(msg).map_err(|e| Error::Check(format!("cannot encode {}: {e}", msg.kind())))?;
        self.motion.mark(msg.kind());
        let mut w = self.writer.lock().map_err(|_| Error::Check("the keepalive thread panicked".into()))?;
        if self.broken.load(Ordering::Relaxed) {
            return Err(Error::Peer(format!(
                "cannot send {} to {}: an earlier message was cut short on the wire",
                msg.kind(),
                self.peer
            )));
        }
        w.write_all(&bytes).map_err(|e| {
            // Part of the frame may be out: the stream's framing is lost for good.
            self.broken.store(true, Ordering::Relaxed);
            Error::Peer(format!("lost the connection to {} while sending {}: {e}", self.peer, msg.kind()))
        })
    }

    /// Tells the peer why this side is giving up. Best effort: the peer may be gone.
    pub fn abort(&mut self, err: &Error) {
        let _ = self.send(&Message::Abort { code: err.exit_code(), reason: err.message() });
    }

    /// Waits up to the session timeout for the next message. Heartbeats reset the wait.
    pub fn recv(&mut self, waiting_for: &str) -> Result<Message> {
        self.recv_within(waiting_for, self.timeout)
    }

    pub fn recv_within(&mut self, waiting_for: &str, wait: Duration) -> Result<Message> {
        self.recv_until(waiting_for, wait, true)
    }

    /// A message of the handshake (greeting, hello, welcome, finish): heartbeats do not
    /// extend the wait, so a connection that sends only heartbeats cannot hold a server past
    /// the session timeout; they extend only the waits of a session, once it is on.
    pub fn recv_handshake(&mut self, waiting_for: &str) -> Result<Message> {
        self.recv_until(waiting_for, self.timeout, false)
    }

    fn recv_until(&mut self, waiting_for: &str, wait: Duration, heartbeats_extend: bool) -> Result<Message> {
        if let Some(msg) = self.kept.take() {
            return Ok(msg);
        }
        let mut deadline = Instant::now() + wait;
        let doing = format!("waiting for {waiting_for}");
        loop {
            self.motion.mark(&doing);
            if let Some(msg) = self.take_frame()? {
                match msg {
                    Message::Heartbeat { .. } => {
                        // Alive extends the wait; alive but stuck ends it.
                        self.check_moving(waiting_for)?;
                        if heartbeats_extend {
                            deadline = Instant::now() + wait;
                        }
                        continue;
                    }
                    other => return self.unless_abort(other),
                }
            }
            signals::check()?;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.silent(waiting_for, wait));
            }
            self.stream
                .set_read_timeout(Some(left.min(TICK)))
                .map_err(|e| Error::Environment(format!("socket: {e}")))?;
            let mut tmp = [0u8; 4096];
            match self.stream.read(&mut tmp) {
                Ok(0) => return Err(self.closed(waiting_for)),
                Ok(n) => self.rbuf.extend_from_slice(&tmp[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
                Err(e) => {
                    return Err(Error::Peer(format!(
                        "lost the connection to {} while waiting for {waiting_for}: {e}",
                        self.peer
                    )));
                }
            }
        }
    }

    /// Non-blocking: reads whatever has arrived. Err when the peer closed the connection
    /// or aborted; `Message` for anything but a heartbeat. A whole message already read is
    /// returned first, even when the peer has closed the connection since.
    pub fn poll_peer(&mut self, during: &str) -> Result<PeerPoll> {
        self.motion.mark(during);
        if let Some(msg) = self.kept.take() {
            return Ok(PeerPoll::Message(msg));
        }
        while let Some(msg) = self.take_frame()? {
            if !matches!(msg, Message::Heartbeat { .. }) {
                return self.unless_abort(msg).map(PeerPoll::Message);
            }
        }
        let mut tmp = [0u8; 4096];
        // SAFETY: `tmp` is a valid writable buffer of the given length; MSG_DONTWAIT never blocks.
        let n = unsafe { libc::recv(self.stream.as_raw_fd(), tmp.as_mut_ptr().cast(), tmp.len(), libc::MSG_DONTWAIT) };
        if n == 0 {
            return Err(self.closed(during));
        }
        if n > 0 {
            self.rbuf.extend_from_slice(&tmp[..n as usize]);
        } else {
            let e = std::io::Error::last_os_error();
            if !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) {
                return Err(Error::Peer(format!("lost the connection to {} during {during}: {e}", self.peer)));
            }
        }
        loop {
            match self.take_frame()? {
                Some(Message::Heartbeat { .. }) => continue,
                Some(msg) => return self.unless_abort(msg).map(PeerPoll::Message),
                None => return Ok(PeerPoll::Quiet),
            }
        }
    }

    /// Puts back a message that `poll_peer` returned early, for the next read.
    pub fn keep(&mut self, msg: Message) {
        debug_assert!(self.kept.is_none(), "one message kept at a time");
        self.kept = Some(msg);
    }

    fn take_frame(&mut self) -> Result<Option<Message>> {
        match frame::decode::<Message>(&self.rbuf) {
            Ok(Some((msg, used))) => {
                self.rbuf.drain(..used);
                self.last_heard = Instant::now();
                if let Message::Heartbeat { doing, still_ms } = &msg {
                    let doing: String = doing.chars().take(DOING_MAX).collect();
                    let still = Duration::from_millis(*still_ms);
                    self.peer_motion = Some(PeerMotion { still, doing, at: Instant::now() });
                }
                Ok(Some(msg))
            }
            Ok(None) => Ok(None),
            Err(e @ (FrameError::Oversized { .. } | FrameError::Malformed(_))) => {
                Err(Error::Peer(format!("{} sent a bad frame: {e}", self.peer)))
            }
        }
    }

    fn unless_abort(&self, msg: Message) -> Result<Message> {
        match msg {
            Message::Abort { code, reason } => {
                // The peer's own failure (usage, check...) keeps its class; anything else means we lost it.
                let text = format!("{} gave up: {reason}", self.peer);
                // The peer's words, bounded and made safe to print.
                Err(match code {
                    1..=3 => Error::from_code(code, text),
                    _ => Error::Peer(text),
                }
                .quoting())
            }
            other => Ok(other),
        }
    }

    fn closed(&self, waiting_for: &str) -> Error {
        Error::Peer(format!(
            "{} closed the connection while this side waited for {waiting_for}; it exited or was killed",
            self.peer
        ))
    }
}

/// One heartbeat saying what `motion` says, written whole or skipped ([`write_beat`]).
fn beat_now(writer: &Mutex<TcpStream>, motion: &Motion, broken: &AtomicBool) -> std::io::Result<bool> {
    let beat = frame::encode(&motion.heartbeat()).expect("a heartbeat encodes");
    let mut w = writer.lock().map_err(|_| std::io::Error::other("a writer of this channel panicked"))?;
    write_beat(&mut w, &beat, broken)
}

/// Writes one heartbeat frame whole, or not at all when the socket has no room for it now
/// (the peer is not reading: a beat more would only wait in its buffer). Ok(false): skipped.
/// A frame cut short (a write that failed part way) marks the stream `broken`.
fn write_beat(w: &mut TcpStream, beat: &[u8], broken: &AtomicBool) -> std::io::Result<bool> {
    if broken.load(Ordering::Relaxed) {
        return Err(std::io::Error::other("an earlier message was cut short on the wire"));
    }
    let mut pfd = libc::pollfd { fd: w.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
    // SAFETY: one valid pollfd; a zero timeout never blocks.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    if n <= 0 || pfd.revents & libc::POLLOUT == 0 {
        if pfd.revents & (libc::POLLERR | libc::POLLHUP) != 0 {
            return Err(std::io::Error::from(ErrorKind::ConnectionReset));
        }
        return Ok(false);
    }
    // POLLOUT on TCP means room for far more than a heartbeat: the write is whole.
    w.write_all(beat).inspect_err(|_| broken.store(true, Ordering::Relaxed))?;
    Ok(true)
}

impl Channel {
    /// Closes at once, without the clean end's wait for the peer: for a connection this
    /// side turns away before any session (one beyond a bound on connections still
    /// opening), where nothing of this side's is in flight and a flood's peers never close.
    pub fn close_at_once(self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

impl Drop for Channel {
    /// Ends the session cleanly: the keepalive stops, this side half-closes (its last
    /// message goes out ahead of the FIN), then reads and discards what the peer still
    /// sends until the peer closes too, for at most `LINGER`. A close over unread input
    /// would make Linux answer with a reset, discarding what this side had not yet sent
    /// (a server's goodbye, an abort's reason).
    fn drop(&mut self) {
        let had_keepalive = self.keepalive.is_some();
        drop(self.keepalive.take());
        if self.stream.shutdown(Shutdown::Write).is_err() {
            return;
        }
        // A peer already silent (stopped, gone, cut off) will not close: nothing to wait for.
        if had_keepalive && self.quiet() {
            return;
        }
        let deadline = Instant::now() + LINGER.min(self.timeout.max(Duration::from_millis(100)));
        let mut tmp = [0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.stream.set_read_timeout(Some(left.min(TICK))).is_err() {
                return;
            }
            match self.stream.read(&mut tmp) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
                Err(_) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn heartbeats_do_not_hold_the_wait_for_a_sessions_first_message() {
        let (mut c, mut s) = pair(Duration::from_millis(600));
        let beats = std::thread::spawn(move || {
            for _ in 0..20 {
                if s.write_all(&frame::encode(&Message::Heartbeat { doing: String::new(), still_ms: 0 }).unwrap())
                    .is_err()
                {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let t = Instant::now();
        let e = c.recv_handshake("the client's hello").unwrap_err();
        assert_eq!(e.exit_code(), 4);
        assert!(t.elapsed() < Duration::from_millis(1500), "ended at the timeout: {:?}", t.elapsed());
        drop(c);
        beats.join().unwrap();
    }

    /// Two ends of one session over loopback.
    fn channels(timeout: Duration) -> (Channel, Channel) {
        let l = Listener::bind(Some("127.0.0.1".parse().unwrap()), 0).unwrap();
        let c = Channel::connect("127.0.0.1", l.port(), Duration::from_secs(2), timeout).unwrap();
        let s = l.accept(Duration::from_secs(2), timeout).unwrap();
        (c, s)
    }

    #[test]
    fn a_busy_side_is_heard_through_its_keepalive_and_a_silent_one_is_named() {
        let (mut busy, mut waiting) = channels(Duration::from_millis(400));
        busy.keep_alive();
        waiting.keep_alive();
        // `busy` never reads nor sends by itself (a long registration, a sparse run) for
        // three timeouts: its keepalive speaks for it.
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(1200) {
            assert!(matches!(waiting.poll_peer("the run").unwrap(), PeerPoll::Quiet));
            waiting.check_alive("the run").unwrap();
            std::thread::sleep(Duration::from_millis(20));
        }
        // Its keepalive stops while its host still acknowledges, as a stopped process's.
        busy.keepalive = None;
        let t = Instant::now();
        let e = loop {
            let _ = waiting.poll_peer("the run").unwrap();
            if let Err(e) = waiting.check_alive("the run") {
                break e;
            }
            assert!(t.elapsed() < Duration::from_secs(2), "never named");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(t.elapsed() < Duration::from_millis(700), "within the timeout: {:?}", t.elapsed());
        assert_eq!(e.exit_code(), 4);
        let m = e.to_string();
        assert!(m.contains("not even a heartbeat") && m.contains("so its process is stopped or hung"), "{m}");
        drop(busy);
    }

    #[test]
    fn a_session_ends_cleanly_though_the_peers_heartbeats_are_unread() {
        // The shortest heartbeat period (10 ms): the closing side has read none of them
        // when it sends its last message and closes, as a server's goodbye is sent.
        for round in 0..200 {
            let (mut closing, mut reading) = channels(Duration::from_millis(40));
            closing.keep_alive();
            reading.keep_alive();
            std::thread::sleep(Duration::from_millis(25));
            let closer = std::thread::spawn(move || {
                closing.send(&Message::Bye).unwrap();
                drop(closing);
            });
            // The reader takes its time, as a busy client does, and its keepalive goes on.
            std::thread::sleep(Duration::from_millis(15));
            match reading.recv_within("the server's goodbye", Duration::from_secs(5)) {
                Ok(Message::Bye) => {}
                other => panic!("round {round}: {other:?}"),
            }
            let after = reading.recv_within("nothing more", Duration::from_secs(5)).unwrap_err().to_string();
            assert!(after.contains("closed the connection"), "round {round}: a reset, not a close: {after}");
            drop(reading);
            closer.join().unwrap();
        }
    }

    #[test]
    fn a_peer_alive_but_stuck_is_named_with_what_it_was_doing() {
        // timeout 200 ms: stuck after 2.4 s. The stuck side's keepalive runs; its session
        // thread does nothing after saying what it does.
        let (mut stuck, mut waiting) = channels(Duration::from_millis(200));
        stuck.keep_alive();
        waiting.keep_alive();
        stuck.doing("registering 64 GiB");
        let t = Instant::now();
        let e = waiting.recv("the peer's verdict").unwrap_err();
        let took = t.elapsed();
        assert_eq!(e.exit_code(), 4);
        let m = e.to_string();
        assert!(m.contains("alive but stuck") && m.contains("registering 64 GiB") && m.contains("verdict"), "{m}");
        assert!(took >= Duration::from_millis(2300) && took < Duration::from_millis(3500), "{took:?}");
        // A wait that ran out while the peer stood still names the peer, not the path.
        let e = waiting.standing_still(Duration::from_millis(500), "a completion").unwrap();
        assert!(e.to_string().contains("alive but stuck"), "{e}");
        drop(stuck);
    }

    #[test]
    fn a_moving_peer_is_never_named_stuck() {
        let (mut busy, mut waiting) = channels(Duration::from_millis(200));
        busy.keep_alive();
        waiting.keep_alive();
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(2000) {
            busy.doing("the run");
            waiting.watch("the run").unwrap();
            std::thread::sleep(Duration::from_millis(20));
        }
        drop(busy);
    }

    #[test]
    fn a_heartbeat_is_skipped_whole_when_the_socket_is_full() {
        let (a, _b) = channels(Duration::from_secs(5));
        let mut w = a.writer.lock().unwrap().try_clone().unwrap();
        w.set_nonblocking(true).unwrap();
        // Fill the socket: the peer reads nothing.
        let chunk = vec![0u8; 65536];
        while w.write(&chunk).is_ok() {}
        let beat = frame::encode(&a.motion.heartbeat()).unwrap();
        assert!(!write_beat(&mut w, &beat, &a.broken).unwrap(), "skipped");
        assert!(!a.broken.load(Ordering::Relaxed));
    }

    #[test]
    fn heartbeats_never_land_inside_a_message() {
        // A heartbeat every 25 ms while 50 messages of 200 kB are written.
        let (mut a, mut b) = channels(Duration::from_millis(100));
        a.keep_alive();
        let sender = std::thread::spawn(move || {
            for code in 0..50 {
                a.send(&Message::Refuse { code, message: "x".repeat(200_000) }).unwrap();
                std::thread::sleep(Duration::from_millis(2));
            }
            a
        });
        for i in 0..50 {
            match b.recv_within("a large message", Duration::from_secs(10)).unwrap() {
                Message::Refuse { code, message } => assert_eq!((code, message.len()), (i, 200_000)),
                other => panic!("{other:?}"),
            }
        }
        drop(sender.join().unwrap());
    }

    fn pair(timeout: Duration) -> (Channel, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let c = Channel::connect("127.0.0.1", port, Duration::from_secs(2), timeout).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    #[test]
    fn a_connection_turned_away_closes_at_once_and_a_session_lingers_for_its_peer() {
        // The peer never closes: a clean end waits for it (up to LINGER or --timeout), a
        // connection turned away does not wait at all.
        let (c, _silent) = pair(Duration::from_secs(5));
        let t = Instant::now();
        c.close_at_once();
        assert!(t.elapsed() < Duration::from_millis(200), "{:?}", t.elapsed());
        let (c, _silent) = pair(Duration::from_secs(5));
        let t = Instant::now();
        drop(c);
        assert!(t.elapsed() >= Duration::from_millis(1500), "{:?}", t.elapsed());
    }

    #[test]
    fn recv_times_out_naming_the_peer_and_what_was_awaited() {
        let (mut c, _s) = pair(Duration::from_millis(200));
        let t = Instant::now();
        let e = c.recv("the endpoint").unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(2));
        assert_eq!(e.exit_code(), 4);
        let m = e.to_string();
        assert!(m.contains("127.0.0.1") && m.contains("the endpoint"), "{m}");
    }

    #[test]
    fn closed_peer_is_reported_at_once() {
        let (mut c, s) = pair(Duration::from_secs(30));
        drop(s);
        let t = Instant::now();
        let e = c.recv("ready").unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(5));
        assert!(e.to_string().contains("closed the connection"), "{e}");
    }

    #[test]
    fn oversized_frame_from_the_wire_is_an_error_not_a_panic() {
        let (mut c, mut s) = pair(Duration::from_secs(5));
        s.write_all(&u32::MAX.to_be_bytes()).unwrap();
        let e = c.recv("hello").unwrap_err();
        assert!(e.to_string().contains("bad frame"), "{e}");
    }

    #[test]
    fn poll_peer_is_quiet_then_sees_a_message_then_eof() {
        let (mut c, mut s) = pair(Duration::from_secs(5));
        assert!(matches!(c.poll_peer("test").unwrap(), PeerPoll::Quiet));
        s.write_all(&frame::encode(&Message::Heartbeat { doing: String::new(), still_ms: 0 }).unwrap()).unwrap();
        s.write_all(&frame::encode(&Message::Bye).unwrap()).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(matches!(c.poll_peer("test").unwrap(), PeerPoll::Message(Message::Bye)));
        drop(s);
        std::thread::sleep(Duration::from_millis(50));
        assert!(c.poll_peer("test").is_err());
    }

    #[test]
    fn abort_from_peer_keeps_its_class() {
        let (mut c, mut s) = pair(Duration::from_secs(5));
        let abort = Message::Abort { code: 2, reason: "inline too big".into() };
        s.write_all(&frame::encode(&abort).unwrap()).unwrap();
        let e = c.recv("endpoint").unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("inline too big"));
    }

    #[test]
    fn client_started_before_server_connects_once_it_listens() {
        // Reserve a port, free it, start the client, then listen on it.
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let client = std::thread::spawn(move || {
            Channel::connect("127.0.0.1", port, Duration::from_secs(10), Duration::from_secs(5)).map(|_| ())
        });
        std::thread::sleep(Duration::from_millis(600));
        let server = Channel::accept(port, Duration::from_secs(10), Duration::from_secs(5));
        assert!(server.is_ok());
        assert!(client.join().unwrap().is_ok());
    }

    #[test]
    fn connect_gives_up_after_its_timeout() {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let t = Instant::now();
        let e = Channel::connect("127.0.0.1", port, Duration::from_millis(500), Duration::from_secs(1))
            .map(|_| ())
            .unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(3));
        assert_eq!(e.exit_code(), 4);
        assert!(e.to_string().contains("--connect-timeout"), "{e}");
    }
}
