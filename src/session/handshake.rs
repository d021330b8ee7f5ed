//! The opening of a session once the TCP channel is up: the server's greeting (with a
//! nonce), the client's hello (carrying its whole test spec, which of its rails this
//! session is for a test, and its token proof), the server's welcome (with its own rails'
//! devices) or refusal, and each side naming the other in its messages from then on.
//! Tests, ring sessions and a workload's finish open the same way.

use super::Channel;
use super::auth::{self, Token};
use super::proto::{self, MAGIC, Message, PROTOCOL_VERSION, RailHello};
use crate::error::{Error, Result};
use crate::names::this_host;
use crate::spec::TestSpec;

/// Client side: takes the server's greeting and returns its nonce.
fn greeting(chan: &mut Channel) -> Result<String> {
    match chan.recv_handshake("the server's greeting")? {
        Message::Greeting { magic, version, nonce } => {
            if magic != MAGIC {
                return Err(Error::Peer(format!("{} is not rdmabench (magic {magic:?})", chan.peer())));
            }
            if version != PROTOCOL_VERSION {
                return Err(Error::Environment(format!(
                    "protocol version mismatch: the server speaks v{version}, this client speaks \
                     v{PROTOCOL_VERSION}; run the same rdmabench version on both sides"
                )));
            }
            Ok(nonce)
        }
        other => Err(chan.unexpected(&other, "a greeting")),
    }
}

/// Client side: sends `spec` (and `rail`, for one rail of a test) with the proof of
/// `token`, and takes the server's welcome, returning the server's rails' devices, or its
/// refusal, as an error.
pub fn open(
    chan: &mut Channel,
    spec: &TestSpec,
    rail: Option<RailHello>,
    token: Option<&Token>,
) -> Result<Vec<String>> {
    let nonce = greeting(chan)?;
    chan.send(&Message::Hello {
        magic: MAGIC.into(),
        version: PROTOCOL_VERSION,
        tool_version: env!("CARGO_PKG_VERSION").into(),
        node: this_host(),
        spec: Box::new(spec.clone()),
        rail,
        auth: token.map(|t| t.proof(&nonce, "hello")),
    })?;
    let welcome = chan.recv_handshake("the server's welcome")?;
    let (node, devices) = match &welcome {
        Message::Welcome { node, devices, .. } => (node.clone(), devices.clone()),
        _ => (String::new(), Vec::new()),
    };
    proto::check_welcome(welcome)?;
    chan.name_peer(&node);
    // The session is on: from here each side hears the other's keepalive.
    chan.keep_alive();
    Ok(devices)
}

/// Client side: tells a serving peer that the workload is over (it exits), with the
/// proof of `token`.
pub fn finish(chan: &mut Channel, token: Option<&Token>) -> Result<()> {
    let nonce = greeting(chan)?;
    chan.send(&Message::Finish { auth: token.map(|t| t.proof(&nonce, "finish")) })?;
    match chan.recv_handshake("the server's goodbye")? {
        Message::Bye => Ok(()),
        Message::Refuse { code, message } => {
            Err(Error::from_code(code, format!("server refused the finish: {message}")).quoting())
        }
        other => Err(chan.unexpected(&other, "bye")),
    }
}

/// A fleet node's side: joins the coordinator of its fleet as `node` of `nodes`, sharing
/// the schedule's fingerprint `plan`, with the proof of `token`. The node then arrives at
/// step 0; the coordinator answers with its first task once every node has.
pub fn join(chan: &mut Channel, node: u32, nodes: u32, plan: &str, token: Option<&Token>) -> Result<()> {
    let nonce = greeting(chan)?;
    chan.send(&Message::Join { node, nodes, plan: plan.into(), auth: token.map(|t| t.proof(&nonce, "join")) })
}

/// Server side: greets a new connection and takes its first message, a hello or a
/// finish. With a `token`, one without the right proof is refused (the client hears why)
/// before anything is allocated; the caller logs it and serves the next connection.
/// Heartbeats do not extend this wait.
pub fn opening(chan: &mut Channel, token: Option<&Token>, waiting_for: &str) -> Result<Message> {
    let nonce = greet(chan)?;
    let msg = chan.recv_handshake(waiting_for)?;
    verify_opening(chan, msg, &nonce, token)
}

/// Server side: the greeting, with a fresh nonce (returned) for the client's proof.
pub fn greet(chan: &mut Channel) -> Result<String> {
    let nonce = auth::nonce()?;
    chan.send(&Message::Greeting { magic: MAGIC.into(), version: PROTOCOL_VERSION, nonce: nonce.clone() })?;
    Ok(nonce)
}

/// Server side: a connection's first message `msg` after the greeting with `nonce`: a
/// hello, finish or join, with the right proof of `token` when there is one (else the
/// client is refused and hears why).
pub fn verify_opening(chan: &mut Channel, msg: Message, nonce: &str, token: Option<&Token>) -> Result<Message> {
    let proof = match &msg {
        Message::Hello { auth, .. } | Message::Finish { auth } | Message::Join { auth, .. } => auth.as_deref(),
        other => return Err(chan.unexpected(other, "a hello")),
    };
    if let Some(token) = token {
        let why = match proof {
            None => "it sent no token proof",
            Some(p) if !token.verify(nonce, msg.kind(), p) => "its token proof is wrong",
            Some(_) => return Ok(msg),
        };
        let e = Error::Usage(format!(
            "this server requires the shared token and {} was refused: {why}; give the client the server's token \
             (--token-file FILE or ${})",
            chan.peer(),
            auth::TOKEN_ENV
        ));
        let _ = chan.send(&Message::Refuse { code: e.exit_code(), message: e.message() });
        return Err(e);
    }
    Ok(msg)
}

/// Server side: checks the client's `hello` with `accept` (which sees its spec and rail);
/// refuses the test with the reason when that fails, welcomes the client otherwise,
/// telling it this side's rails (`devices`).
pub fn answer<T>(
    chan: &mut Channel,
    hello: &Message,
    devices: &[String],
    accept: impl FnOnce(&TestSpec, Option<&RailHello>) -> Result<T>,
) -> Result<T> {
    let rail = match hello {
        Message::Hello { rail, .. } => rail.as_ref(),
        _ => None,
    };
    let accepted = match proto::check_hello(hello).and_then(|spec| accept(spec, rail)) {
        Ok(a) => a,
        Err(e) => {
            let _ = chan.send(&Message::Refuse { code: e.exit_code(), message: e.message() });
            return Err(e);
        }
    };
    if let Message::Hello { node, .. } = hello {
        let node = node.clone();
        chan.name_peer(&node);
    }
    chan.send(&Message::Welcome {
        version: PROTOCOL_VERSION,
        tool_version: env!("CARGO_PKG_VERSION").into(),
        node: this_host(),
        devices: devices.to_vec(),
    })?;
    // The session is on: from here each side hears the other's keepalive.
    chan.keep_alive();
    Ok(accepted)
}
