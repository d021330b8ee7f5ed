//! The opening of a session once the TCP channel is up: the client's hello (carrying its
//! whole test spec and, for a test, which of its rails this session is), the server's
//! welcome (with its own rails' devices) or refusal, and each side naming the other in
//! its messages from then on. Tests and ring sessions open the same way.

use super::Channel;
use super::proto::{self, MAGIC, Message, PROTOCOL_VERSION, RailHello};
use crate::error::Result;
use crate::session::hostname;
use crate::spec::TestSpec;

/// Client side: sends `spec` (and `rail`, for one rail of a test) and takes the server's
/// welcome, returning the server's rails' devices, or its refusal, as an error.
pub fn open(chan: &mut Channel, spec: &TestSpec, rail: Option<RailHello>) -> Result<Vec<String>> {
    chan.send(&Message::Hello {
        magic: MAGIC.into(),
        version: PROTOCOL_VERSION,
        tool_version: env!("CARGO_PKG_VERSION").into(),
        node: hostname(),
        spec: Box::new(spec.clone()),
        rail,
    })?;
    let welcome = chan.recv("the server's welcome")?;
    let devices = match &welcome {
        Message::Welcome { node, devices, .. } => {
            let node = node.clone();
            chan.name_peer(&node);
            devices.clone()
        }
        _ => Vec::new(),
    };
    proto::check_welcome(welcome)?;
    Ok(devices)
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
        node: hostname(),
        devices: devices.to_vec(),
    })?;
    Ok(accepted)
}
