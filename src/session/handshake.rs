//! The opening of a session once the TCP channel is up: the client's hello (carrying its
//! whole test spec), the server's welcome or refusal, and each side naming the other in
//! its messages from then on. Tests and ring sessions open the same way.

use super::Channel;
use super::proto::{self, MAGIC, Message, PROTOCOL_VERSION};
use crate::error::Result;
use crate::session::hostname;
use crate::spec::TestSpec;

/// Client side: sends `spec` and takes the server's welcome (or its refusal, as an error).
pub fn open(chan: &mut Channel, spec: &TestSpec) -> Result<()> {
    chan.send(&Message::Hello {
        magic: MAGIC.into(),
        version: PROTOCOL_VERSION,
        tool_version: env!("CARGO_PKG_VERSION").into(),
        node: hostname(),
        spec: Box::new(spec.clone()),
    })?;
    let welcome = chan.recv("the server's welcome")?;
    if let Message::Welcome { node, .. } = &welcome {
        let node = node.clone();
        chan.name_peer(&node);
    }
    proto::check_welcome(welcome)
}

/// Server side: checks the client's `hello` with `accept` (which sees its spec); refuses
/// the test with the reason when that fails, welcomes the client otherwise.
pub fn answer<T>(chan: &mut Channel, hello: &Message, accept: impl FnOnce(&TestSpec) -> Result<T>) -> Result<T> {
    let accepted = match proto::check_hello(hello).and_then(accept) {
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
    })?;
    Ok(accepted)
}
