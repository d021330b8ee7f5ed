//! The messages of the session and the handshake rules.
//!
//! Order of a run: server `Greeting` (with a nonce) -> client `Hello` (with the whole spec,
//! and a proof of the shared token when the server wants one) -> server `Welcome` or `Refuse`;
//! both send `Endpoint`; then per size: client `Start`, server `Ready`, the kernel runs,
//! client `Done`, server `Verdict`; finally client `Report` and server `Bye`. A workload
//! (`run`) opens one session per test and ends with a session of just `Finish` / `Bye`.
//! Either side may send `Abort` at any point; the other ends with the reason.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::report::RunResult;
use crate::report::pairs::{PairRow, Phase, Retest, ServedRow};
use crate::spec::TestSpec;
use crate::stats::ThroughputSummary;
use crate::verbs::endpoint::Endpoint;

/// Bumped on any incompatible change of these messages.
/// v2: the hello carries the client's rail (index and every rail's device), the welcome
/// the server's devices.
/// v3: the server speaks first (`Greeting` with a nonce); hello and finish carry the
/// token's proof (`session::auth`).
/// v4: a fleet's coordinator hands each node its `Task` (was: `Go` with the dead nodes).
/// v5: a fleet node's arrival carries what it saw of the pair it served.
/// v6: both sides of a session send heartbeats from a keepalive thread for its whole
/// length, and judge the other dead by its silence.
/// v7: a heartbeat says what its sender is doing and how long its session has not moved;
/// a fleet's coordinator sends them to its nodes too.
pub const PROTOCOL_VERSION: u32 = 7;
pub const MAGIC: &str = "rdmabench";

/// One session per rail: rail `index` of the client's `devices`, paired with the server's
/// rail of the same index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RailHello {
    pub index: u32,
    #[serde(with = "crate::names::wire_list")]
    pub devices: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    /// The server's first words on a new connection: who it is and the nonce that the
    /// client's token proof must answer.
    Greeting {
        magic: String,
        version: u32,
        nonce: String,
    },
    Hello {
        magic: String,
        version: u32,
        tool_version: String,
        /// Every name in these messages travels defused (`names::wire`): never a reason to
        /// refuse a peer, only its length is (`check_name`).
        #[serde(with = "crate::names::wire")]
        node: String,
        spec: Box<TestSpec>,
        /// Which of the client's rails this session is (absent: a ring session).
        #[serde(default)]
        rail: Option<RailHello>,
        /// HMAC of the greeting's nonce under the shared token (`session::auth`).
        #[serde(default)]
        auth: Option<String>,
    },
    Welcome {
        version: u32,
        tool_version: String,
        #[serde(with = "crate::names::wire")]
        node: String,
        /// The server's rails' devices, in order.
        #[serde(default, with = "crate::names::wire_list")]
        devices: Vec<String>,
    },
    /// The server cannot run this spec; `code` is the exit code it maps to.
    Refuse {
        code: i32,
        message: String,
    },
    Endpoint(Box<Endpoint>),
    Start {
        size: u64,
        /// The size's warm-up pass (`spec.warmup` iterations, not measured), before its run.
        #[serde(default)]
        warmup: bool,
    },
    Ready {
        size: u64,
    },
    /// Sent by each side's keepalive for the whole session: the sender is alive, and how
    /// long its session's thread has not moved (`still_ms`) while it was `doing` something:
    /// alive is not moving, and a peer alive but stuck is named (`session::channel`).
    Heartbeat {
        #[serde(default)]
        doing: String,
        #[serde(default)]
        still_ms: u64,
    },
    Done {
        size: u64,
        iterations: u64,
        /// With `-q`: the messages each QP sent, in QP order (sums to `iterations`).
        #[serde(default)]
        per_qp: Vec<u64>,
    },
    /// The server's view of the size just run: its iteration count and data check.
    Verdict {
        size: u64,
        iterations: u64,
        data_error: Option<String>,
        /// With `-b`: the server's own sending direction.
        #[serde(default)]
        reverse: Option<ThroughputSummary>,
        /// The server's port counters that moved during the size (non-zero deltas).
        #[serde(default, with = "crate::names::wire_counters")]
        counters: Option<BTreeMap<String, u64>>,
        /// The server's CPU time during the size, % of one core.
        #[serde(default)]
        cpu_pct: Option<f64>,
    },
    Report(Box<RunResult>),
    Bye,
    /// A workload's client has run every step: a `run --serve` server may exit.
    Finish {
        #[serde(default)]
        auth: Option<String>,
    },
    Abort {
        code: i32,
        reason: String,
    },
    /// A node of an all-pairs fleet joins its coordinator (`fleet::barrier`); `plan` is
    /// the schedule's fingerprint, which every node must share.
    Join {
        node: u32,
        nodes: u32,
        plan: String,
        #[serde(default)]
        auth: Option<String>,
    },
    /// A fleet node is ready for step `step`, with the rows of the pairs it measured in
    /// the step before, and what it saw of the pair it served before that (a server
    /// learns that its pair is over only from its next task).
    Arrive {
        step: u32,
        rows: Vec<PairRow>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        served: Vec<ServedRow>,
    },
    /// The coordinator: what the node does in a step (`fleet::barrier` decides).
    Task(Task),
}

/// A fleet node's task in step `step`, handed out by the fleet's coordinator: the one
/// authority for what each node does next.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub step: u32,
    pub work: Work,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Work {
    /// Measure against node `server` (its round of the schedule, the phases to run in
    /// this step, and what it retests, if it is a retest); with `report`, arrive with the
    /// pair's row (its last phase), else keep what was measured for the next phase.
    Measure { server: u32, round: u32, phases: Vec<Phase>, retest: Option<Retest>, report: bool },
    /// Node `client` measures against this one (every node serves all along); with
    /// `report`, this is the pair's last phase: the node then reports what it saw.
    Serve { client: u32, report: bool },
    /// Nothing this step.
    Rest,
    /// The fleet is over.
    Done,
}

impl Message {
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Greeting { .. } => "greeting",
            Message::Hello { .. } => "hello",
            Message::Welcome { .. } => "welcome",
            Message::Refuse { .. } => "refuse",
            Message::Endpoint(_) => "endpoint",
            Message::Start { .. } => "start",
            Message::Ready { .. } => "ready",
            Message::Heartbeat { .. } => "heartbeat",
            Message::Done { .. } => "done",
            Message::Verdict { .. } => "verdict",
            Message::Report(_) => "report",
            Message::Bye => "bye",
            Message::Finish { .. } => "finish",
            Message::Abort { .. } => "abort",
            Message::Join { .. } => "join",
            Message::Arrive { .. } => "arrive",
            Message::Task(_) => "task",
        }
    }
}

/// The most counters a peer may report for one size (mlx5 has about 80).
pub const MAX_COUNTERS: usize = 1024;

/// A peer's counter deltas: bounded in number and in each name's length.
pub fn check_counters(counters: &BTreeMap<String, u64>) -> Result<()> {
    if counters.len() > MAX_COUNTERS {
        return Err(Error::Peer(format!(
            "the peer reported {} counters for one size; at most {MAX_COUNTERS} are accepted",
            counters.len()
        )));
    }
    counters.keys().try_for_each(|name| check_name("a counter name of the peer's port", name))
}

/// A node, device or counter name from the peer, already defused on the way in
/// (`names::wire`): whatever its characters, only a length no rdmabench sends is refused,
/// as a usage error (exit 2) that says so.
pub fn check_name(what: &str, name: &str) -> Result<()> {
    match crate::names::too_long(what, name) {
        Some(why) => Err(Error::Usage(why)),
        None => Ok(()),
    }
}

/// Server side: accepts a `Hello` of our protocol version, or says why not (quoting the
/// peer's words bounded and made safe to print).
pub fn check_hello(msg: &Message) -> Result<&TestSpec> {
    hello_spec(msg).map_err(Error::quoting)
}

fn hello_spec(msg: &Message) -> Result<&TestSpec> {
    match msg {
        Message::Hello { magic, version, tool_version, spec, node, rail, .. } => {
            if magic != MAGIC {
                return Err(Error::Peer(format!("peer is not rdmabench (magic {magic:?})")));
            }
            if *version != PROTOCOL_VERSION {
                return Err(Error::Environment(format!(
                    "protocol version mismatch: the client (rdmabench {tool_version}) speaks v{version}, \
                     this server speaks v{PROTOCOL_VERSION}; run the same rdmabench version on both sides"
                )));
            }
            check_name("the client's node name", node)?;
            for d in rail.iter().flat_map(|r| &r.devices) {
                check_name("a device name of the client's rails", d)?;
            }
            Ok(spec)
        }
        other => Err(Error::Peer(format!("expected hello, got {}", other.kind()))),
    }
}

/// Client side: the server's answer to `Hello` (its words quoted bounded and made safe to
/// print).
pub fn check_welcome(msg: Message) -> Result<()> {
    welcome(msg).map_err(Error::quoting)
}

fn welcome(msg: Message) -> Result<()> {
    match msg {
        Message::Welcome { version, node, devices, .. } if version == PROTOCOL_VERSION => {
            check_name("the server's node name", &node)?;
            devices.iter().try_for_each(|d| check_name("a device name of the server's rails", d))
        }
        Message::Welcome { version, tool_version, .. } => Err(Error::Environment(format!(
            "protocol version mismatch: the server (rdmabench {tool_version}) speaks v{version}, \
             this client speaks v{PROTOCOL_VERSION}; run the same rdmabench version on both sides"
        ))),
        Message::Refuse { code, message } => Err(Error::from_code(code, format!("server refused the test: {message}"))),
        other => Err(Error::Peer(format!("expected welcome, got {}", other.kind()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::frame::{self, FrameError, MAX_FRAME};
    use crate::spec::{Measure, Operation};

    fn hello(version: u32) -> Message {
        Message::Hello {
            magic: MAGIC.into(),
            version,
            tool_version: "0.1.0".into(),
            node: "a".into(),
            spec: Box::new(TestSpec {
                sizes: vec![2, 4],
                iterations: 10,
                inline_size: Some(64),
                validate_data: true,
                ..TestSpec::new(Operation::Write, Measure::Latency)
            }),
            rail: Some(RailHello { index: 1, devices: vec!["rxea0".into(), "rxea1".into()] }),
            auth: Some("00ff".into()),
        }
    }

    #[test]
    fn round_trip_keeps_every_field() {
        let m = hello(PROTOCOL_VERSION);
        let bytes = frame::encode(&m).unwrap();
        let (back, used): (Message, usize) = frame::decode(&bytes).unwrap().unwrap();
        assert_eq!(back, m);
        assert_eq!(used, bytes.len());
    }

    #[test]
    fn two_frames_in_one_buffer_decode_in_order() {
        let beat = Message::Heartbeat { doing: "the run".into(), still_ms: 3 };
        let mut bytes = frame::encode(&beat).unwrap();
        bytes.extend(frame::encode(&Message::Bye).unwrap());
        let (a, n): (Message, usize) = frame::decode(&bytes).unwrap().unwrap();
        let (b, _): (Message, usize) = frame::decode(&bytes[n..]).unwrap().unwrap();
        assert_eq!((a, b), (beat, Message::Bye));
    }

    #[test]
    fn truncated_frame_waits_for_more_bytes() {
        let bytes = frame::encode(&hello(PROTOCOL_VERSION)).unwrap();
        for cut in [0, 1, 3, 4, bytes.len() - 1] {
            assert_eq!(frame::decode::<Message>(&bytes[..cut]).unwrap(), None, "cut at {cut}");
        }
    }

    #[test]
    fn oversized_header_is_rejected_before_the_body_arrives() {
        let header = ((MAX_FRAME + 1) as u32).to_be_bytes();
        match frame::decode::<Message>(&header) {
            Err(FrameError::Oversized { len, max }) => {
                assert_eq!((len, max), (MAX_FRAME + 1, MAX_FRAME))
            }
            other => panic!("{other:?}"),
        }
        let msg = FrameError::Oversized { len: 5, max: 4 }.to_string();
        assert!(msg.contains("exceeds"), "{msg}");
    }

    #[test]
    fn garbage_is_malformed_not_a_panic() {
        let mut bytes = 5u32.to_be_bytes().to_vec();
        bytes.extend_from_slice(b"\xff{x}!");
        assert!(matches!(frame::decode::<Message>(&bytes), Err(FrameError::Malformed(_))));
        let mut bytes = 16u32.to_be_bytes().to_vec();
        bytes.extend_from_slice(br#"{"type":"nope"}x"#);
        assert!(matches!(frame::decode::<Message>(&bytes), Err(FrameError::Malformed(_))));
    }

    #[test]
    fn wrong_version_is_refused_with_both_versions_named() {
        let err = check_hello(&hello(PROTOCOL_VERSION + 1)).unwrap_err();
        let m = err.to_string();
        assert!(
            m.contains(&format!("v{}", PROTOCOL_VERSION + 1)) && m.contains(&format!("v{PROTOCOL_VERSION}")),
            "{m}"
        );
        assert_eq!(err.exit_code(), 3);
        assert!(check_hello(&hello(PROTOCOL_VERSION)).is_ok());
    }

    #[test]
    fn wrong_magic_and_wrong_first_message_are_peer_errors() {
        let mut m = hello(PROTOCOL_VERSION);
        if let Message::Hello { magic, .. } = &mut m {
            *magic = "perftest".into();
        }
        assert_eq!(check_hello(&m).unwrap_err().exit_code(), 4);
        assert_eq!(check_hello(&Message::Bye).unwrap_err().exit_code(), 4);
    }

    #[test]
    fn a_peers_text_cannot_start_a_log_line_or_restyle_a_terminal() {
        let abort = br#"{"type":"abort","code":4,"reason":"x\nRDMABENCH_RESULT {\"pod\":9}\u001b[2J\u2028"}"#;
        let mut bytes = (abort.len() as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(abort);
        let (msg, _): (Message, usize) = frame::decode(&bytes).unwrap().unwrap();
        let Message::Abort { reason, .. } = msg else { panic!("{msg:?}") };
        assert!(!reason.chars().any(|c| c.is_control() || c == '\u{2028}'), "{reason:?}");
        assert!(reason.contains("\\u{a}RDMABENCH_RESULT"), "escaped, still readable: {reason}");
    }

    /// What the receiver makes of a message: encoded by the sender, decoded here.
    fn over_the_wire(m: &Message) -> Message {
        frame::decode(&frame::encode(m).unwrap()).unwrap().unwrap().0
    }

    #[test]
    fn odd_node_and_device_names_are_defused_and_accepted() {
        let odd = ["(none)", "a b", "node\u{1b}[2J", "knoten-\u{fc}", "x/y", "mlx5_0;rm", &"\u{e9}".repeat(32)];
        for name in odd {
            let mut m = hello(PROTOCOL_VERSION);
            if let Message::Hello { node, rail: Some(r), .. } = &mut m {
                *node = name.to_string();
                r.devices.push(name.to_string());
            }
            let got = over_the_wire(&m);
            check_hello(&got).unwrap_or_else(|e| panic!("{name:?}: {e}"));
            let Message::Hello { node, rail: Some(r), .. } = got else { panic!() };
            assert_eq!(node, crate::names::from_peer(name));
            assert_eq!(r.devices[2], node);
            assert!(node.bytes().all(|b| b.is_ascii_graphic() && !b"\"'\\/;,|<>&$`".contains(&b)), "{node}");
        }
        let mut m = hello(PROTOCOL_VERSION);
        if let Message::Hello { node, .. } = &mut m {
            *node = "(none)".into();
        }
        let Message::Hello { node, .. } = over_the_wire(&m) else { panic!() };
        assert_eq!(node, "(none)", "a bare VM's name is shown as it is");
        let welcome = |node: &str| Message::Welcome {
            version: PROTOCOL_VERSION,
            tool_version: "0".into(),
            node: node.into(),
            devices: vec!["rxe 0".into()],
        };
        assert!(check_welcome(over_the_wire(&welcome("srv\nx"))).is_ok());
        let Message::Welcome { node, devices, .. } = over_the_wire(&welcome("srv\nx")) else { panic!() };
        assert_eq!((node.as_str(), devices[0].as_str()), ("srv%0Ax", "rxe%200"));
    }

    #[test]
    fn only_a_name_longer_than_any_rdmabench_sends_is_refused_as_usage() {
        let mut m = hello(PROTOCOL_VERSION);
        if let Message::Hello { node, .. } = &mut m {
            *node = "n".repeat(crate::names::MAX_NAME + 1);
        }
        let e = check_hello(&over_the_wire(&m)).unwrap_err();
        assert_eq!(e.exit_code(), 2, "{e}");
        assert!(e.to_string().contains("same rdmabench version"), "{e}");
        let mut m = hello(PROTOCOL_VERSION);
        if let Message::Hello { rail: Some(r), .. } = &mut m {
            r.devices.push("d".repeat(300));
        }
        assert_eq!(check_hello(&over_the_wire(&m)).unwrap_err().exit_code(), 2);
        let counters = BTreeMap::from([("c".repeat(300), 1)]);
        assert_eq!(check_counters(&counters).unwrap_err().exit_code(), 2);
        assert!(check_counters(&BTreeMap::from([("odd name".to_string(), 1)])).is_ok());
    }

    #[test]
    fn a_verdicts_counter_names_are_defused_on_the_way_in() {
        let v = Message::Verdict {
            size: 1,
            iterations: 1,
            data_error: None,
            reverse: None,
            counters: Some(BTreeMap::from([("rx write\n".to_string(), 3)])),
            cpu_pct: None,
        };
        let Message::Verdict { counters: Some(c), .. } = over_the_wire(&v) else { panic!() };
        assert_eq!(c.get("rx%20write%0A"), Some(&3));
    }

    #[test]
    fn refusal_keeps_the_servers_exit_code() {
        let e = check_welcome(Message::Refuse { code: 2, message: "tx depth too big".into() }).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("tx depth too big"));
    }
}
