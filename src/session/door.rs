//! A server's door: accepts connections and opens each on a thread of its own (greeting,
//! first message, token proof), so a silent, slow or hostile stranger delays no real
//! client; hands out authenticated openings in the order they complete. Connections that
//! end before that are logged with their address and forgotten.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::{Duration, Instant};

use super::auth::Token;
use super::channel::{self, Channel, Listener};
use super::handshake;
use super::proto::Message;
use crate::error::{Error, Result};
use crate::signals;

/// Connections being opened at once at most; more are closed at once (logged), so a flood
/// of idle connections cannot pile up threads.
pub const MAX_OPENING: usize = 64;
const TICK: Duration = Duration::from_millis(20);

type Opened = (Channel, Result<Message>);

pub struct Door {
    listener: Listener,
    token: Option<Token>,
    timeout: Duration,
    opened_tx: Sender<Opened>,
    opened: Receiver<Opened>,
    opening: Arc<AtomicUsize>,
}

impl Door {
    /// Listens on `port` at `bind` (every address when none); `token`, when set, is
    /// required of every client; `timeout` bounds each connection's opening.
    pub fn bind(bind: Option<IpAddr>, port: u16, token: Option<Token>, timeout: Duration) -> Result<Door> {
        let listener = Listener::bind(bind, port)?;
        let (opened_tx, opened) = channel();
        Ok(Door { listener, token, timeout, opened_tx, opened, opening: Arc::new(AtomicUsize::new(0)) })
    }

    /// The next client's channel and first message (a hello or a finish, with its token
    /// proof checked), waiting up to `wait`.
    pub fn next(&self, wait: Duration) -> Result<(Channel, Message)> {
        let deadline = Instant::now() + wait;
        loop {
            signals::check()?;
            while let Some(chan) = self.listener.try_accept(self.timeout)? {
                self.open(chan);
            }
            match self.opened.recv_timeout(TICK) {
                Ok((chan, Ok(msg))) => return Ok((chan, msg)),
                Ok((_, Err(Error::Interrupted(sig)))) => return Err(Error::Interrupted(sig)),
                Ok((chan, Err(e))) => {
                    eprintln!("rdmabench: a connection from {} ended before its test: {e}; still serving", chan.peer())
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => unreachable!("the door holds a sender"),
            }
            if Instant::now() >= deadline {
                return Err(channel::no_client(self.listener.port(), wait));
            }
        }
    }

    fn open(&self, mut chan: Channel) {
        if self.opening.load(Ordering::Relaxed) >= MAX_OPENING {
            eprintln!(
                "rdmabench: a connection from {} was closed at once: {MAX_OPENING} others are still opening",
                chan.peer()
            );
            // A clean end would wait for the stranger to close, holding the door.
            chan.close_at_once();
            return;
        }
        self.opening.fetch_add(1, Ordering::Relaxed);
        let (token, tx, opening) = (self.token.clone(), self.opened_tx.clone(), Arc::clone(&self.opening));
        std::thread::spawn(move || {
            let first = handshake::opening(&mut chan, token.as_ref(), "the client's hello");
            opening.fetch_sub(1, Ordering::Relaxed);
            // The door may be gone (the server ended): then the connection just closes.
            let _ = tx.send((chan, first));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpStream;

    #[test]
    fn a_silent_stranger_delays_no_client_and_a_client_without_the_token_is_refused() {
        let token = Token::new("a shared secret of some length", "test").unwrap();
        let door =
            Door::bind(Some("127.0.0.1".parse().unwrap()), 0, Some(token.clone()), Duration::from_secs(5)).unwrap();
        let port = door.listener.port();
        let silent = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let wait = Duration::from_secs(5);
        let without = std::thread::spawn(move || {
            let mut c = Channel::connect("127.0.0.1", port, wait, wait).unwrap();
            handshake::finish(&mut c, None)
        });
        let with = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let mut c = Channel::connect("127.0.0.1", port, wait, wait).unwrap();
            handshake::finish(&mut c, Some(&token))
        });
        let t = Instant::now();
        let (mut chan, msg) = door.next(Duration::from_secs(10)).unwrap();
        assert!(matches!(msg, Message::Finish { auth: Some(_) }), "{msg:?}");
        assert!(t.elapsed() < Duration::from_secs(3), "waited behind the silent one: {:?}", t.elapsed());
        chan.send(&Message::Bye).unwrap();
        assert!(with.join().unwrap().is_ok());
        let e = without.join().unwrap().unwrap_err();
        assert_eq!(e.exit_code(), 2, "{e}");
        assert!(e.to_string().contains("requires the shared token"), "{e}");
        drop(silent);
    }
}
