//! The TCP side of the session: connect with retries, accept with a deadline, send and
//! receive frames with a deadline on every wait, and a non-blocking peek used by the
//! measurement loops to notice a dead peer or an abort without slowing the hot path.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::frame::{self, FrameError};
use super::proto::Message;
use crate::error::{Error, Result};
use crate::signals;

/// How often blocking waits wake up to look at signals and deadlines.
const TICK: Duration = Duration::from_millis(50);
/// A running client tells the server it is alive at least this often.
pub const HEARTBEAT_EVERY: Duration = Duration::from_millis(500);

pub struct Channel {
    stream: TcpStream,
    peer: String,
    timeout: Duration,
    rbuf: Vec<u8>,
    /// A message read early (while waiting on something else), returned by the next read.
    kept: Option<Message>,
    last_sent: Instant,
}

/// A listening control port: one session per client connection (a test with several
/// rails opens one per rail on the same port).
pub struct Listener {
    listener: TcpListener,
    port: u16,
}

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
        let _ = stream.set_nodelay(true);
        stream.set_write_timeout(Some(timeout)).map_err(|e| Error::Environment(format!("socket: {e}")))?;
        Ok(Channel { stream, peer, timeout, rbuf: Vec::with_capacity(4096), kept: None, last_sent: Instant::now() })
    }

    /// How the peer is named in messages: its node name once known, and its address.
    /// The longest wait for the peer (`--timeout`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The one wording of "the peer sent X where Y was due" (exit 4: a peer that breaks the
    /// protocol is as good as lost).
    pub fn unexpected(&self, got: &Message, wanted: &str) -> Error {
        Error::Peer(format!("{} sent {} instead of {wanted}", self.peer(), got.kind()))
    }

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
        self.stream.write_all(&bytes).map_err(|e| {
            Error::Peer(format!("lost the connection to {} while sending {}: {e}", self.peer, msg.kind()))
        })?;
        self.last_sent = Instant::now();
        Ok(())
    }

    /// Sends a heartbeat when one is due; cheap to call from a measurement loop.
    pub fn heartbeat_if_due(&mut self) -> Result<()> {
        if self.last_sent.elapsed() >= HEARTBEAT_EVERY {
            self.send(&Message::Heartbeat)?;
        }
        Ok(())
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

    /// A message of the handshake (greeting, hello, welcome, endpoints): heartbeats do not
    /// extend the wait, so a connection that sends only heartbeats cannot hold a server past
    /// the session timeout; they extend only the waits inside a running measurement.
    pub fn recv_handshake(&mut self, waiting_for: &str) -> Result<Message> {
        self.recv_until(waiting_for, self.timeout, false)
    }

    fn recv_until(&mut self, waiting_for: &str, wait: Duration, heartbeats_extend: bool) -> Result<Message> {
        if let Some(msg) = self.kept.take() {
            return Ok(msg);
        }
        let mut deadline = Instant::now() + wait;
        loop {
            if let Some(msg) = self.take_frame()? {
                match msg {
                    Message::Heartbeat => {
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
                return Err(Error::Peer(format!(
                    "{} sent nothing for {:.1} s while this side waited for {waiting_for} (--timeout); it hung or died",
                    self.peer,
                    wait.as_secs_f64()
                )));
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
        if let Some(msg) = self.kept.take() {
            return Ok(PeerPoll::Message(msg));
        }
        while let Some(msg) = self.take_frame()? {
            if msg != Message::Heartbeat {
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
                Some(Message::Heartbeat) => continue,
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
                Err(match code {
                    1..=3 => Error::from_code(code, text),
                    _ => Error::Peer(text),
                })
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn heartbeats_do_not_hold_the_wait_for_a_sessions_first_message() {
        let (mut c, mut s) = pair(Duration::from_millis(600));
        let beats = std::thread::spawn(move || {
            for _ in 0..20 {
                if s.write_all(&frame::encode(&Message::Heartbeat).unwrap()).is_err() {
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

    fn pair(timeout: Duration) -> (Channel, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let c = Channel::connect("127.0.0.1", port, Duration::from_secs(2), timeout).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
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
        s.write_all(&frame::encode(&Message::Heartbeat).unwrap()).unwrap();
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
