//! Frames: a 4-byte big-endian length, then that many bytes of JSON.
//! A frame longer than `MAX_FRAME` or that does not decode is an error with a message;
//! decoding never panics, whatever bytes arrive. Every string a peer sends is defused on
//! the way in: control, line-separator and bidi characters become visible escapes, so a
//! peer's text printed in a log can never start a line of its own (a forged
//! `RDMABENCH_RESULT` record) or restyle a terminal.

use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;

/// No control message comes near this; anything larger is garbage or an attack.
pub const MAX_FRAME: usize = 1 << 20;
const HEADER: usize = 4;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// The header announced more than `MAX_FRAME` bytes.
    Oversized { len: usize, max: usize },
    /// The payload is not a message of this protocol.
    Malformed(String),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Oversized { len, max } => write!(
                f,
                "frame of {len} bytes exceeds the {max}-byte limit (not an rdmabench peer, or a corrupted stream)"
            ),
            FrameError::Malformed(why) => write!(f, "malformed frame: {why}"),
        }
    }
}

pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let body = serde_json::to_vec(msg).map_err(|e| FrameError::Malformed(e.to_string()))?;
    if body.len() > MAX_FRAME {
        return Err(FrameError::Oversized { len: body.len(), max: MAX_FRAME });
    }
    let mut out = Vec::with_capacity(HEADER + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Decodes the first frame in `buf`. `Ok(None)` means more bytes are needed; on success
/// returns the message and how many bytes it used. The length is checked before waiting
/// for the body, so an oversized header is rejected at once.
pub fn decode<T: DeserializeOwned>(buf: &[u8]) -> Result<Option<(T, usize)>, FrameError> {
    if buf.len() < HEADER {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > MAX_FRAME {
        return Err(FrameError::Oversized { len, max: MAX_FRAME });
    }
    if buf.len() < HEADER + len {
        return Ok(None);
    }
    // A decoder's message can quote the peer's text (an unknown variant): bounded.
    let malformed = |e: serde_json::Error| FrameError::Malformed(crate::names::quoting_error(&e.to_string()));
    let mut value: Value = serde_json::from_slice(&buf[HEADER..HEADER + len]).map_err(malformed)?;
    // Every string escaped; a key that needed it is no field of ours.
    if let Some(k) = crate::names::escape_json(&mut value) {
        let k = crate::names::quoting_error(&k);
        return Err(FrameError::Malformed(format!("field name {k:?} has control characters")));
    }
    let msg = serde_json::from_value(value).map_err(malformed)?;
    Ok(Some((msg, HEADER + len)))
}
