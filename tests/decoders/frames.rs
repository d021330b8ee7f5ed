//! Control frames: the 4-byte length and the JSON message behind it, then what each side
//! checks of a message it received (the hello's spec, the welcome, counters, fleet rows).

use std::collections::BTreeMap;

use proptest::prelude::*;
use rdmabench::report::pairs::{PairRow, Phase, ServedRow};
use rdmabench::session::frame::{self, MAX_FRAME};
use rdmabench::session::proto::{self, Message, RailHello, Task, Work};
use rdmabench::spec::{Measure, Operation, TestSpec};
use rdmabench::verbs::endpoint::{Endpoint, NicIdentity};

use super::harness::*;

/// One message of every kind a peer sends, as rdmabench encodes it (the JSON body).
fn seeds() -> Vec<Vec<u8>> {
    let spec = |op, m| Box::new(TestSpec::new(op, m));
    let hello = |op, m| Message::Hello {
        magic: proto::MAGIC.into(),
        version: proto::PROTOCOL_VERSION,
        tool_version: "0.1.0".into(),
        node: "node-a".into(),
        spec: spec(op, m),
        rail: Some(RailHello { index: 1, devices: vec!["mlx5_0".into(), "mlx5_1".into()] }),
        auth: Some("a".repeat(64)),
    };
    let endpoint = Endpoint {
        node: "node-b".into(),
        device: "mlx5_0".into(),
        port: 1,
        link_layer: "Ethernet".into(),
        lid: 0,
        gid_index: 3,
        gid: "::ffff:10.0.0.2".into(),
        gid_type: "RoCEv2".into(),
        gid_family: "ipv4".into(),
        usable_gids: vec!["3: ::ffff:10.0.0.2 RoCEv2".into()],
        qpn: 0x11,
        psn: 0x123456,
        active_mtu: 4096,
        addr: 0x7f00_0000_1000,
        rkey: 0x1234,
        buf_len: 65536,
        max_inline: 220,
        nic: NicIdentity {
            node_guid: "b8ce:f603:0001:1234".into(),
            sys_image_guid: "b8ce".into(),
            pci: None,
            numa_node: Some(0),
            firmware: Some("28.39.1002".into()),
            driver: Some("mlx5_core".into()),
        },
        cm_addr: Some("10.0.0.2:18515".into()),
    };
    let mut row = PairRow::blank(3, 1, None, 0, 2);
    (row.gbps, row.p50_us, row.p99_us, row.size, row.qps, row.lat_size) =
        (Some(97.5), Some(2.5), Some(3.1), 65536, 4, 8);
    row.counters = BTreeMap::from([("rx_write_requests".into(), 1000), ("out_of_sequence".into(), 2)]);
    let messages = vec![
        Message::Greeting { magic: proto::MAGIC.into(), version: proto::PROTOCOL_VERSION, nonce: "0".repeat(32) },
        hello(Operation::Write, Measure::Latency),
        hello(Operation::Read, Measure::Bandwidth),
        hello(Operation::Ring, Measure::Bandwidth),
        Message::Welcome {
            version: proto::PROTOCOL_VERSION,
            tool_version: "0.1.0".into(),
            node: "node-b".into(),
            devices: vec!["mlx5_0".into()],
        },
        Message::Refuse { code: 2, message: "--size 4096 is above the device's limit".into() },
        Message::Endpoint(Box::new(endpoint)),
        Message::Start { size: 65536, warmup: true },
        Message::Ready { size: 65536 },
        Message::Heartbeat { doing: "waiting for the size's start".into(), still_ms: 1500 },
        Message::Done { size: 65536, iterations: 5000, per_qp: vec![2500, 2500] },
        Message::Verdict {
            size: 65536,
            iterations: 5000,
            data_error: None,
            reverse: None,
            counters: Some(BTreeMap::from([("rcv_pkts".into(), 5000)])),
            cpu_pct: Some(99.5),
        },
        Message::Bye,
        Message::Finish { auth: None },
        Message::Abort { code: 4, reason: "the peer went silent".into() },
        Message::Join { node: 3, nodes: 8, plan: "f00d".into(), auth: None },
        Message::Arrive {
            step: 4,
            rows: vec![row],
            served: vec![ServedRow { step: 4, client: 1, server: 3, counters: BTreeMap::new(), error: None }],
        },
        Message::Task(Task {
            step: 5,
            work: Work::Measure {
                server: 2,
                round: 1,
                phases: vec![Phase::Bandwidth, Phase::Latency],
                retest: None,
                report: true,
            },
        }),
        Message::Task(Task { step: 6, work: Work::Serve { client: 0, report: false } }),
    ];
    messages.iter().map(|m| serde_json::to_vec(m).unwrap()).collect()
}

/// What the receiving side does with a message after decoding it; Err: refused.
fn receive(msg: &Message) -> Result<(), String> {
    let said = |e: rdmabench::error::Error| e.message();
    match msg {
        Message::Hello { .. } => {
            let spec = proto::check_hello(msg).map_err(said)?;
            spec.check().map_err(said)?;
            // What a server derives from an accepted spec before it allocates anything.
            let _ = (spec.name(), spec.max_size(), spec.lanes(), spec.effective_cq_mod(), spec.requested_inline());
            let _ = spec.warmup_pass();
            Ok(())
        }
        Message::Welcome { .. } | Message::Refuse { .. } => proto::check_welcome(msg.clone()).map_err(said),
        Message::Verdict { counters: Some(c), .. } => proto::check_counters(c).map_err(said),
        Message::Arrive { rows, served, .. } => {
            rows.iter().try_for_each(|r| r.check(1024))?;
            served.iter().try_for_each(|s| s.check(1024))
        }
        _ => Ok(()),
    }
}

/// Decodes `bytes` as a stream's next frame and receives the message.
fn decode(bytes: &[u8]) -> (usize, Result<(), String>) {
    let outcome = match frame::decode::<Message>(bytes) {
        Ok(None) => Ok(()),
        Err(e) => Err(e.to_string()),
        Ok(Some((msg, used))) => {
            assert!(used <= bytes.len() && used <= MAX_FRAME + 4, "used {used} of {}", bytes.len());
            // What was accepted encodes again, and decodes to itself: nothing a peer sent
            // changes meaning when it is logged, forwarded or stored.
            let again = frame::encode(&msg).expect("an accepted message encodes");
            let (back, _) = frame::decode::<Message>(&again).expect("decodes").expect("whole");
            assert_eq!(back, msg, "a message changed on its way round");
            receive(&msg)
        }
    };
    (bytes.len(), outcome)
}

/// A body behind a length: the right one, one from nowhere, or the body as it is.
fn framed(body: Vec<u8>, header: u8, len: u32) -> Vec<u8> {
    let mut out = match header % 4 {
        0 | 1 => (body.len() as u32).to_be_bytes().to_vec(),
        2 => len.to_be_bytes().to_vec(),
        _ => Vec::new(),
    };
    out.extend(body);
    out
}

#[test]
fn every_seed_is_a_message_rdmabench_accepts() {
    for s in seeds() {
        let (_, outcome) = decode(&framed(s.clone(), 0, 0));
        // A refusal is the client's error to report, by design.
        let refusal = s.starts_with(br#"{"type":"refuse""#);
        assert_eq!(outcome.is_ok(), !refusal, "{}: {outcome:?}", String::from_utf8_lossy(&s));
    }
}

#[test]
fn mutated_frames_decode_or_are_refused_clearly() {
    let strategy = (mutated(seeds(), 6), any::<u8>(), any::<u32>()).prop_map(|(b, h, l)| framed(b, h, l));
    property("frames (mutated messages)", strategy, |bytes| decode(bytes));
}

#[test]
fn frames_of_noise_are_refused_clearly() {
    property("frames (noise)", noise(), |bytes| decode(bytes));
}

/// Regression cases: inputs a property once found or that sit on a limit.
#[test]
fn frames_on_the_limits() {
    let huge = (MAX_FRAME as u32 + 1).to_be_bytes();
    assert!(decode(&huge).1.unwrap_err().contains("exceeds"));
    assert_eq!(decode(&(MAX_FRAME as u32).to_be_bytes()).1, Ok(()), "waits for the body");
    let deep = framed(format!("{}{}", "[".repeat(5000), "]".repeat(5000)).into_bytes(), 0, 0);
    assert!(decode(&deep).1.is_err());
    // Found by the million-case run: a server's refusal of 70,000 bytes became an error of
    // 70,000 bytes. The peer's words are now cut at 4 KiB, with a marker.
    let refusal = Message::Refuse { code: 2, message: format!("\u{1b}[31m{}", "a".repeat(70_000)) };
    let why = decode(&frame::encode(&refusal).unwrap()).1.unwrap_err();
    assert!(why.len() <= 4096 && why.ends_with("bytes cut]") && !why.contains('\u{1b}'), "{why}");
    // And a hello whose magic is 70,000 bytes.
    let Message::Hello { spec, .. } = serde_json::from_slice::<Message>(&seeds()[1]).unwrap() else { unreachable!() };
    let hello = Message::Hello {
        magic: "a".repeat(70_000),
        version: proto::PROTOCOL_VERSION,
        tool_version: String::new(),
        node: String::new(),
        spec,
        rail: None,
        auth: None,
    };
    let why = decode(&frame::encode(&hello).unwrap()).1.unwrap_err();
    assert!(why.starts_with("peer is not rdmabench") && why.len() <= 4096, "{why}");
    // A field name with a control character is no field of ours: refused, shown escaped;
    // the same character in a value is escaped and the message taken.
    let bad_key = framed(br#"{"type":"bye","a\u001bb":1}"#.to_vec(), 0, 0);
    let why = decode(&bad_key).1.unwrap_err();
    assert!(why.contains("field name") && why.contains("\\u{1b}") && !why.contains('\u{1b}'), "{why}");
    let bad_value = framed(br#"{"type":"abort","code":4,"reason":"a\u001b[31mb"}"#.to_vec(), 0, 0);
    let Ok(Some((Message::Abort { reason, .. }, _))) = frame::decode::<Message>(&bad_value) else { panic!() };
    assert_eq!(reason, "a\\u{1b}[31mb");
}
