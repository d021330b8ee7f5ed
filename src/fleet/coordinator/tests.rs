//! The coordinator over real sockets on loopback, with nodes that measure nothing: each
//! joins, arrives with a made-up row for every pair it is told to measure, and leaves or
//! misbehaves where a test says so.

use std::sync::mpsc;
use std::thread::JoinHandle;

use super::*;
use crate::fleet::attribution::Thresholds;
use crate::fleet::schedule::{Directions, Plan};
use crate::report::pairs::{PairRow, Phase, ServedRow};
use crate::session::proto::{Task, Work};

const WAIT: Duration = Duration::from_secs(20);

/// Bandwidth in one step, latency in the next, as a fleet runs.
fn phases() -> Vec<Vec<Phase>> {
    crate::fleet::node::PHASES.iter().map(|g| g.to_vec()).collect()
}

fn token() -> Token {
    Token::new("a fleet's shared secret", "test").unwrap()
}

/// A coordinator of `plan` on a free loopback port, on a thread that first says its
/// thread id; returns the port.
fn coordinator(plan: Plan, join: Duration) -> (u16, i32, JoinHandle<Result<Outcome>>) {
    let listener = Listener::bind(Some("127.0.0.1".parse().unwrap()), 0).unwrap();
    let port = listener.port();
    let barrier = Barrier::new(
        plan.nodes,
        "fp".into(),
        &plan.steps(),
        &phases(),
        Thresholds::default(),
        join,
        WAIT,
        Duration::ZERO,
    );
    let c = Coordinator { listener, token: Some(token()), timeout: Duration::from_secs(5), barrier };
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        tx.send(unsafe { libc::gettid() }).unwrap();
        c.run(Instant::now())
    });
    (port, rx.recv().unwrap(), h)
}

/// A node that measures nothing: every task's pair gets a row of 100 Gb/s. It stops
/// (closing its connection) before step `stop_at`, if given. Returns the tasks it had.
fn node(port: u16, i: u32, n: u32, stop_at: Option<u32>) -> JoinHandle<Result<Vec<Task>>> {
    std::thread::spawn(move || {
        let mut chan = Channel::connect("127.0.0.1", port, WAIT, WAIT)?;
        handshake::join(&mut chan, i, n, "fp", Some(&token()))?;
        let (mut step, mut last, mut tasks) = (0, Vec::new(), Vec::new());
        // The pair served in the last step, reporting: its record goes with the arrival
        // after the next, as a real node's does.
        let (mut serving, mut records) = (None, Vec::new());
        loop {
            if stop_at == Some(step) {
                return Ok(tasks);
            }
            let served = std::mem::take(&mut records);
            chan.send(&Message::Arrive { step, rows: std::mem::take(&mut last), served })?;
            let task = match chan.recv_within("a task", WAIT)? {
                Message::Task(t) => t,
                other => return Err(chan.unexpected(&other, "a task")),
            };
            if let Work::Measure { server, round, retest, report: true, .. } = task.work {
                let mut r = PairRow::blank(step, round, retest, i, server);
                (r.gbps, r.p50_us) = (Some(100.0), Some(5.0));
                last.push(r);
            }
            if let Some((step, client)) = serving.take() {
                records.push(ServedRow { step, client, server: i, counters: Default::default(), error: None });
            }
            if let Work::Serve { client, report: true } = task.work {
                serving = Some((step, client));
            }
            let done = task.work == Work::Done;
            tasks.push(task);
            if done {
                return Ok(tasks);
            }
            step += 1;
        }
    })
}

#[test]
fn a_fleet_runs_over_sockets_and_every_node_hears_the_end() {
    let plan = Plan { nodes: 6, directions: Directions::Both, max_pairs_per_round: None };
    let (port, _, c) = coordinator(plan, WAIT);
    let nodes: Vec<_> = (0..6).map(|i| node(port, i, 6, None)).collect();
    for (i, h) in nodes.into_iter().enumerate() {
        let tasks = h.join().unwrap().unwrap();
        assert_eq!(
            tasks.len(),
            2 * plan.steps().len() + 2,
            "node {i}: a task per step and phase, one where the last servers send their records, and the end"
        );
        assert_eq!(tasks.last().unwrap().work, Work::Done);
    }
    let o = c.join().unwrap().unwrap();
    assert!(o.dead.is_empty(), "{:?}", o.dead);
    assert_eq!(o.row_count(), 30, "every ordered pair of 6 nodes once");
    assert!(o.all_rows().iter().all(PairRow::ok));
    assert_eq!(o.records, 30, "every pair's server sent its record");
}

#[test]
fn a_node_that_leaves_is_named_and_the_others_finish() {
    let plan = Plan { nodes: 5, directions: Directions::One, max_pairs_per_round: None };
    let (port, _, c) = coordinator(plan, WAIT);
    let nodes: Vec<_> = (0..5).map(|i| node(port, i, 5, (i == 2).then_some(2))).collect();
    for h in nodes {
        h.join().unwrap().unwrap();
    }
    let o = c.join().unwrap().unwrap();
    assert_eq!(o.dead.keys().copied().collect::<Vec<_>>(), [2]);
    let why = o.dead[&2].to_string();
    assert!(why.starts_with("left the fleet at step 2: ") && why.contains("closed the connection"), "{why}");
    assert_eq!(o.all_rows().len(), 10, "every pair has its row: {:?}", o.all_rows());
    assert!(o.coordinator_rows().all(|r| r.client == 2 || r.server == 2));
    assert!(o.all_rows().iter().filter(|r| r.client != 2 && r.server != 2).all(PairRow::ok));
}

#[test]
fn strangers_and_late_nodes_are_refused_with_the_reason_and_the_fleet_goes_on() {
    let plan = Plan { nodes: 3, directions: Directions::One, max_pairs_per_round: None };
    let (port, _, c) = coordinator(plan, Duration::from_secs(2));
    // No token proof: refused at the door, as a server refuses such a client.
    let mut chan = Channel::connect("127.0.0.1", port, WAIT, WAIT).unwrap();
    handshake::join(&mut chan, 0, 3, "fp", None).unwrap();
    match chan.recv("a task").unwrap() {
        Message::Refuse { code: 2, message } => assert!(message.contains("requires the shared token"), "{message}"),
        other => panic!("{other:?}"),
    }
    // Another plan.
    let mut chan = Channel::connect("127.0.0.1", port, WAIT, WAIT).unwrap();
    handshake::join(&mut chan, 1, 3, "other", Some(&token())).unwrap();
    match chan.recv("a task").unwrap() {
        Message::Refuse { code: 2, message } => assert!(message.contains("is not this fleet's"), "{message}"),
        other => panic!("{other:?}"),
    }
    let nodes: Vec<_> = (0..2).map(|i| node(port, i, 3, None)).collect();
    for h in nodes {
        h.join().unwrap().unwrap();
    }
    let o = c.join().unwrap().unwrap();
    assert_eq!(o.dead[&2].to_string(), "never joined within 2 s");
    assert_eq!(o.coordinator_rows().count(), 2, "node 2's pairs, filled by the coordinator");
}

/// Voluntary context switches of thread `tid` of this process: how often it slept.
fn sleeps(tid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("voluntary_ctxt_switches:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn the_coordinator_sleeps_while_nothing_arrives() {
    // 32 nodes join; one never arrives, so the barrier waits with 31 quiet connections.
    let n = 32;
    let plan = Plan { nodes: n, directions: Directions::One, max_pairs_per_round: None };
    let (port, tid, c) = coordinator(plan, Duration::from_secs(4));
    let quiet: Vec<Channel> = (1..n)
        .map(|i| {
            let mut chan = Channel::connect("127.0.0.1", port, WAIT, WAIT).unwrap();
            handshake::join(&mut chan, i, n, "fp", Some(&token())).unwrap();
            chan.send(&Message::Arrive { step: 0, rows: Vec::new(), served: Vec::new() }).unwrap();
            chan
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let before = sleeps(tid);
    std::thread::sleep(Duration::from_secs(2));
    let woke = sleeps(tid) - before;
    // It looks at signals 4 times a second; a sweep every 5 ms would be 400 wake-ups.
    eprintln!("the coordinator woke {woke} times in 2 s with 31 quiet connections");
    assert!(woke <= 16, "the coordinator woke {woke} times in 2 s with nothing to do");
    drop(quiet);
    let o = c.join().unwrap().unwrap();
    assert!(o.dead.len() == n as usize, "all left: {:?}", o.dead.keys());
}
