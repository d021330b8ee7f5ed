//! Names that cross the control channel and end up in tables, JSON, logs and summaries:
//! this host's node name, device names, counter names.
//!
//! None of them is a reason to refuse a test. The kernel lets a host be called anything of
//! up to 64 bytes (a bare VM is `(none)`; spaces, UTF-8 and bytes that are no UTF-8 at all
//! are allowed), a device may be renamed to anything without `/` or `%`, and a peer may
//! send whatever it likes. So a name is *defused* instead: every byte outside a small plain
//! set is written as `%XX`, which no terminal, log parser, shell word split, CSV or markdown
//! table can mistake for anything but text. Only a length past [`MAX_NAME`] is refused
//! (by the session, with the fix), as no rdmabench sends one.

/// The longest name a peer may send, in bytes (a DNS name's limit). Ours never reach it:
/// the kernel's longest host or device name (64 bytes) is at most 192 once defused.
pub const MAX_NAME: usize = 253;

/// Bytes shown as they are: what host and device names are made of, and the parentheses
/// of a bare VM's `(none)`.
fn plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':' | b'(' | b')')
}

fn write_defused(raw: &[u8], keep: impl Fn(u8) -> bool) -> String {
    let mut out = String::with_capacity(raw.len());
    for &b in raw {
        if keep(b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The form this side sends and shows of one of its own names, `raw` as the kernel has it:
/// plain bytes as they are, every other byte as `%XX`, `%` itself too, so the form is
/// unambiguous (`a b` is `a%20b`, `a%20b` is `a%2520b`).
pub fn defuse(raw: &[u8]) -> String {
    write_defused(raw, plain)
}

/// A name from the peer as this side keeps and shows it: a name [`defuse`] made arrives
/// unchanged; anything else (an older rdmabench, a hand-made client, a log line) is
/// defused the same way, except that a `%` is kept, so no name is ever escaped twice.
pub fn from_peer(name: &str) -> String {
    if name.bytes().all(|b| plain(b) || b == b'%') {
        return name.to_string();
    }
    write_defused(name.as_bytes(), |b| plain(b) || b == b'%')
}

/// Why a peer's name is refused, if it is: only its length, which no rdmabench exceeds.
pub fn too_long(what: &str, name: &str) -> Option<String> {
    (name.len() > MAX_NAME).then(|| {
        let start: String = name.chars().take(40).collect();
        format!(
            "{what} is {} bytes (\"{start}...\"); at most {MAX_NAME} are accepted from a peer, and no rdmabench \
             sends more: run the same rdmabench version on both sides",
            name.len()
        )
    })
}

/// The longest message rdmabench makes of text it read from a file or a peer.
pub const MAX_QUOTING_ERROR: usize = 4096;

/// Characters that text read from outside may not carry to a terminal or a log as they are:
/// controls, line and paragraph separators, bidi overrides.
pub fn unsafe_char(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// The text with every unsafe character written as a visible escape (`\u{1b}`).
pub fn escape(s: &str) -> String {
    s.chars().map(|c| if unsafe_char(c) { c.escape_unicode().to_string() } else { c.to_string() }).collect()
}

/// Every string of a JSON value escaped in place ([`escape`]), object keys too: text read
/// from a peer or a file reaches logs and tables only so. Returns the first key that needed
/// it (escaped), which a decoder that knows every field of its messages refuses.
pub fn escape_json(v: &mut serde_json::Value) -> Option<String> {
    use serde_json::Value;
    match v {
        Value::String(s) if s.chars().any(unsafe_char) => {
            *s = escape(s);
            None
        }
        // `or` takes its argument eagerly: every item is escaped, whichever came first.
        Value::Array(items) => items.iter_mut().fold(None, |first, item| first.or(escape_json(item))),
        Value::Object(fields) => {
            let first = fields.keys().find(|k| k.chars().any(unsafe_char)).map(|k| escape(k));
            if first.is_some() {
                *fields = std::mem::take(fields).into_iter().map(|(k, v)| (escape(&k), v)).collect();
            }
            fields.values_mut().fold(first, |first, value| first.or(escape_json(value)))
        }
        _ => None,
    }
}

/// An error message that quotes what was read (a parser's message showing the file's
/// line, a peer's unknown value), made safe to print: unsafe characters escaped but the
/// message's own newlines and tabs (a parser's excerpt and caret), and at most
/// [`MAX_QUOTING_ERROR`] bytes, with a marker saying how much was cut. A file or a peer
/// can then make an error long or odd, but never a flood or a forged line.
pub fn quoting_error(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(MAX_QUOTING_ERROR));
    for (at, c) in message.char_indices() {
        let piece =
            if unsafe_char(c) && c != '\n' && c != '\t' { c.escape_unicode().to_string() } else { c.to_string() };
        if out.len() + piece.len() > MAX_QUOTING_ERROR - 48 {
            out.push_str(&format!(" [... {} bytes cut]", message.len() - at));
            return out;
        }
        out.push_str(&piece);
    }
    out
}

/// This host's node name, defused: what the peer, the tables and the JSON show. `(none)`
/// in a VM whose kernel was never given one; `unknown` when it cannot be read or is empty.
pub fn this_host() -> String {
    let raw = std::fs::read("/proc/sys/kernel/hostname").unwrap_or_default();
    let raw = raw.strip_suffix(b"\n").unwrap_or(&raw);
    if raw.is_empty() { "unknown".into() } else { defuse(raw) }
}

/// `#[serde(with = "crate::names::wire")]` on a name field of a message or a document: the
/// name is written and read in the [`from_peer`] form, so it is safe on the wire and in a
/// file whoever built the value (this side's raw device name, a peer's name already kept).
pub mod wire {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(name: &str, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::from_peer(name))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        String::deserialize(d).map(|s| super::from_peer(&s))
    }
}

/// [`wire`] for a list of names (a side's rails' devices).
pub mod wire_list {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(names: &[String], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(names.iter().map(|n| super::from_peer(n)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
        Vec::<String>::deserialize(d).map(|v| v.iter().map(|n| super::from_peer(n)).collect())
    }
}

/// [`wire`] for counters by name (a side's port counter deltas).
pub mod wire_counters {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::collections::BTreeMap;

    type Counters = Option<BTreeMap<String, u64>>;

    pub fn serialize<S: Serializer>(counters: &Counters, s: S) -> Result<S::Ok, S::Error> {
        match counters {
            Some(m) => s.collect_map(m.iter().map(|(k, v)| (super::from_peer(k), v))),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Counters, D::Error> {
        let map = Counters::deserialize(d)?;
        Ok(map.map(|m| m.into_iter().map(|(k, v)| (super::from_peer(&k), v)).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_device_names_stay_as_they_are() {
        for name in ["rdmabench-lab", "job-1.svc.cluster.local", "mlx5_0", "rocep94s0f0", "fe80::1", "(none)"] {
            assert_eq!(defuse(name.as_bytes()), name);
            assert_eq!(from_peer(name), name);
        }
    }

    #[test]
    fn anything_else_is_written_as_percent_escapes_of_its_bytes() {
        assert_eq!(defuse(b"node 1"), "node%201");
        assert_eq!(defuse("knoten-ü".as_bytes()), "knoten-%C3%BC");
        assert_eq!(defuse(b"a\nRDMABENCH_RESULT {\"pod\":9}"), "a%0ARDMABENCH_RESULT%20%7B%22pod%22:9%7D");
        assert_eq!(defuse(b"\xff\x00/x"), "%FF%00%2Fx");
        assert_eq!(defuse(b"50%"), "50%25", "a % of the name itself is escaped: the form is unambiguous");
        let long = "n".repeat(64);
        assert_eq!(defuse(long.as_bytes()), long, "the kernel's longest host name travels whole");
        assert!(defuse(&[0xc3; 64]).len() <= MAX_NAME, "and so does the worst one, defused");
    }

    #[test]
    fn what_the_peer_sends_is_defused_once_and_never_twice() {
        for raw in [&b"node 1"[..], "ü".as_bytes(), b"50%", b"x\x1b[2J"] {
            let sent = defuse(raw);
            assert_eq!(from_peer(&sent), sent, "{sent}");
        }
        assert_eq!(from_peer("a b\u{202e}"), "a%20b%E2%80%AE");
        assert_eq!(from_peer(&from_peer("a b")), "a%20b");
        assert_eq!(from_peer("50%"), "50%");
    }

    #[test]
    fn only_a_length_no_rdmabench_sends_is_refused() {
        assert_eq!(too_long("a node name", &"n".repeat(MAX_NAME)), None);
        let e = too_long("a node name", &"n".repeat(MAX_NAME + 1)).unwrap();
        assert!(e.contains("254 bytes") && e.contains("at most 253") && e.contains("same rdmabench version"), "{e}");
    }

    #[test]
    fn names_in_json_are_defused_both_ways() {
        use serde::{Deserialize, Serialize};
        use std::collections::BTreeMap;
        #[derive(Serialize, Deserialize)]
        struct T {
            #[serde(with = "wire")]
            node: String,
            #[serde(with = "wire_list")]
            devices: Vec<String>,
            #[serde(default, with = "wire_counters")]
            counters: Option<BTreeMap<String, u64>>,
        }
        let t: T =
            serde_json::from_str(r#"{"node":"(none)","devices":["rxe 0","mlx5_0"],"counters":{"a b":1}}"#).unwrap();
        assert_eq!((t.node.as_str(), &t.devices[..]), ("(none)", &["rxe%200".to_string(), "mlx5_0".to_string()][..]));
        assert_eq!(t.counters.as_ref().unwrap().keys().collect::<Vec<_>>(), ["a%20b"]);
        let raw = T { node: "a b".into(), devices: vec!["x\ny".into()], counters: None };
        let text = serde_json::to_string(&raw).unwrap();
        assert_eq!(text, r#"{"node":"a%20b","devices":["x%0Ay"],"counters":null}"#);
        let back: T = serde_json::from_str(&text).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), text, "read back and written again: unchanged");
        let none: T = serde_json::from_str(r#"{"node":"n","devices":[]}"#).unwrap();
        assert!(none.counters.is_none());
    }
}
