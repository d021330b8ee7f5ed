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
    let mut value: Value =
        serde_json::from_slice(&buf[HEADER..HEADER + len]).map_err(|e| FrameError::Malformed(e.to_string()))?;
    defuse(&mut value)?;
    let msg = serde_json::from_value(value).map_err(|e| FrameError::Malformed(e.to_string()))?;
    Ok(Some((msg, HEADER + len)))
}

/// Characters a peer's text may not carry into a log or a terminal as they are.
fn unsafe_char(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// The text with every unsafe character written as a visible escape (`\u{1b}`).
pub fn escape(s: &str) -> String {
    s.chars().map(|c| if unsafe_char(c) { c.escape_unicode().to_string() } else { c.to_string() }).collect()
}

/// Escapes every string value in place; a key with such characters is no field of ours.
fn defuse(v: &mut Value) -> Result<(), FrameError> {
    match v {
        Value::String(s) if s.chars().any(unsafe_char) => *s = escape(s),
        Value::Array(items) => items.iter_mut().try_for_each(defuse)?,
        Value::Object(fields) => {
            if let Some(k) = fields.keys().find(|k| k.chars().any(unsafe_char)) {
                return Err(FrameError::Malformed(format!("field name {:?} has control characters", escape(k))));
            }
            fields.values_mut().try_for_each(defuse)?;
        }
        _ => {}
    }
    Ok(())
}
