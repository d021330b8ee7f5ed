//! One measured pair of an all-pairs fleet, as a JSON line (`RDMABENCH_PAIR {...}` in a
//! pod's log, `pairs.jsonl` from `summarize`): plain data, written by exactly one process
//! (the measuring node, or the fleet's coordinator for a pair its client could not
//! report), carried to the coordinator, read back by `summarize`. Also the plain words
//! the coordinator and its nodes share about a pair: which phase of it, whether it is a
//! retest and of what, and why it failed.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// The marker of a pair's line in a pod's log.
pub const PAIR_MARK: &str = "RDMABENCH_PAIR ";
/// The marker of a server's line for a pair it served.
pub const SERVED_MARK: &str = "RDMABENCH_SERVED ";
/// The marker of node 0's line for a node that left the fleet.
pub const LEFT_MARK: &str = "RDMABENCH_LEFT ";
/// The most counter names a row carries for one side.
pub const MAX_ROW_COUNTERS: usize = 1024;

/// One measurement of a pair: its bandwidth test or its latency test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Bandwidth,
    Latency,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Bandwidth => "bandwidth",
            Phase::Latency => "latency",
        })
    }
}

/// What a retest after the planned steps checks again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "of")]
pub enum Retest {
    /// A node suspected of slowness, measured against a known-good peer.
    Node { node: u32 },
    /// A link suspected of slowness (its nodes are not), measured again.
    Link { a: u32, b: u32 },
    /// A pair that failed in its planned step, measured again: passing makes it flaky.
    Failed,
}

impl fmt::Display for Retest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Retest::Node { node } => write!(f, "a retest of node {node}"),
            Retest::Link { a, b } => write!(f, "a retest of link {a} - {b}"),
            Retest::Failed => f.write_str("a retest of a failed pair"),
        }
    }
}

/// Why a pair failed, by class: what the measuring side's error was, or why it never
/// reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The peer was lost, timed out or refused the protocol (exit 4).
    Peer,
    /// A check of the run failed (data, counts; exit 1).
    Check,
    /// The measuring side's environment (devices, memory; exit 3).
    Environment,
    /// A usage error (a spec the peer refused; exit 2).
    Usage,
    /// The measuring node was stopped by a signal.
    Interrupted,
    /// A node of the pair left the fleet before or while it ran.
    NodeLeft,
}

impl FailureKind {
    pub fn of(e: &Error) -> FailureKind {
        match e {
            Error::Peer(_) => FailureKind::Peer,
            Error::Check(_) => FailureKind::Check,
            Error::Environment(_) => FailureKind::Environment,
            Error::Usage(_) => FailureKind::Usage,
            Error::Interrupted(_) => FailureKind::Interrupted,
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FailureKind::Peer => "peer lost",
            FailureKind::Check => "check failed",
            FailureKind::Environment => "environment",
            FailureKind::Usage => "usage",
            FailureKind::Interrupted => "interrupted",
            FailureKind::NodeLeft => "node left the fleet",
        })
    }
}

/// A failed pair's error: its class, the phase that failed (none: nothing was measured),
/// the node that left when that is why, and the measuring side's message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairError {
    pub kind: FailureKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// With `node_left`: which node of the pair left (the failure is its, not its partner's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<u32>,
    pub message: String,
}

impl PairError {
    /// The error of `phase` (None: before any) from a run's error.
    pub fn of(e: &Error, phase: Option<Phase>) -> PairError {
        PairError { kind: FailureKind::of(e), phase, node: None, message: bounded(e.message()) }
    }

    /// A pair that never ran, or never reported, because `node` of it left the fleet.
    pub fn node_left(node: u32, message: String) -> PairError {
        PairError { kind: FailureKind::NodeLeft, phase: None, node: Some(node), message: bounded(message) }
    }
}

impl fmt::Display for PairError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.phase {
            Some(p) => write!(f, "{p} failed ({}): {}", self.kind, self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// Who wrote a row: the measuring node, or the coordinator for a pair whose measuring
/// node could not report it (it left the fleet). A pair has one row from one of them; a
/// node that printed its row and then died leaves both in the logs, and its own wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RowSource {
    #[default]
    Client,
    Coordinator,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairRow {
    /// The step of the fleet (retests come after the last planned step).
    pub step: u32,
    pub round: u32,
    /// A retest after the planned rounds, and of what.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retest: Option<Retest>,
    /// Node (pod index) that measured, and the one it measured against.
    pub client: u32,
    pub server: u32,
    #[serde(default)]
    pub source: RowSource,
    #[serde(with = "crate::names::wire")]
    pub client_node: String,
    #[serde(with = "crate::names::wire")]
    pub server_node: String,
    pub client_addr: String,
    pub server_addr: String,
    #[serde(with = "crate::names::wire_list")]
    pub devices: Vec<String>,
    #[serde(with = "crate::names::wire_list")]
    pub peer_devices: Vec<String>,
    /// "write" (RDMA WRITE bandwidth and latency).
    pub op: String,
    /// Bandwidth test message size and QPs.
    pub size: u64,
    pub qps: u32,
    /// Median over the repeats, all rails together, Gb/s.
    pub gbps: Option<f64>,
    #[serde(default)]
    pub gbps_repeats: Vec<f64>,
    /// Latency test message size; p50 and p99 medians over the repeats, us.
    pub lat_size: u64,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    /// Why the pair failed; none when it passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<PairError>,
    /// The measuring side's port counters that moved while it measured the pair (every
    /// rail summed): retransmissions, sequence errors, RNR NAKs say whether the link
    /// dropped packets or a process stalled.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counters: BTreeMap<String, u64>,
    /// The server's side, from its `RDMABENCH_SERVED` line (`summarize` joins it): its
    /// ports' counters while it served the pair, and its own error, if it had one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub peer_counters: BTreeMap<String, u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_error: Option<String>,
}

/// What a node saw while it served a pair: printed once, by the server, as a
/// `RDMABENCH_SERVED` line; `summarize` joins it to the pair's row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServedRow {
    /// The step whose row reports the pair (its last phase).
    pub step: u32,
    pub client: u32,
    pub server: u32,
    /// The server's ports' counters that moved while it served the pair.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counters: BTreeMap<String, u64>,
    /// The server's own error in a session of the pair, if it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ServedRow {
    pub fn line(&self) -> String {
        format!("{SERVED_MARK}{}", serde_json::to_string(self).expect("a record serialises"))
    }

    /// Bounds a record from a log.
    pub fn check(&self, nodes: u32) -> Result<(), String> {
        if self.client >= nodes || self.server >= nodes || self.client == self.server {
            return Err(format!("a pair {} -> {} is no pair of a fleet of {nodes}", self.client, self.server));
        }
        check_counters(&self.counters)?;
        if self.error.as_ref().is_some_and(|e| e.len() > MAX_ERROR_LEN) {
            return Err(format!(
                "served pair {} -> {} has an error over {MAX_ERROR_LEN} bytes",
                self.client, self.server
            ));
        }
        Ok(())
    }
}

/// A node that left the fleet, in the barrier's words (when, and why): printed once, by
/// node 0, as a `RDMABENCH_LEFT` line, so that `summarize` names it as node 0 does, even
/// when it left after its last pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeftRow {
    pub node: u32,
    pub why: String,
}

impl LeftRow {
    pub fn line(&self) -> String {
        format!("{LEFT_MARK}{}", serde_json::to_string(self).expect("a record serialises"))
    }

    /// Bounds a record from a log.
    pub fn check(&self, nodes: u32) -> Result<(), String> {
        if self.node >= nodes {
            return Err(format!("node {} is no node of a fleet of {nodes}", self.node));
        }
        if self.why.len() > MAX_ERROR_LEN {
            return Err(format!("node {}'s departure is over {MAX_ERROR_LEN} bytes", self.node));
        }
        Ok(())
    }
}

fn check_counters(c: &BTreeMap<String, u64>) -> Result<(), String> {
    if c.len() > MAX_ROW_COUNTERS || c.keys().any(|k| k.len() > 253) {
        return Err(format!("{} counters, or a name over 253 bytes: at most {MAX_ROW_COUNTERS}", c.len()));
    }
    Ok(())
}

/// The longest error message a row may carry from a peer.
pub const MAX_ERROR_LEN: usize = 4096;

/// `text` cut to at most [`MAX_ERROR_LEN`] bytes (at a character boundary) with a marker
/// saying how much was cut: what the node that writes a row does with an error, so that
/// no honest row is refused for a long message (a peer's abort can quote a megabyte).
pub fn bounded(text: String) -> String {
    if text.len() <= MAX_ERROR_LEN {
        return text;
    }
    // The marker's own length, with the most digits a cut can have.
    let room = MAX_ERROR_LEN - " [... 18446744073709551615 bytes cut]".len();
    let mut end = room;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{} [... {} bytes cut]", &text[..end], text.len() - end)
}

impl PairRow {
    /// A pair that measured nothing (its error says why); the sizes are 0: not measured.
    pub fn failed(
        step: u32,
        round: u32,
        retest: Option<Retest>,
        client: u32,
        server: u32,
        error: PairError,
    ) -> PairRow {
        PairRow { error: Some(error), ..PairRow::blank(step, round, retest, client, server) }
    }

    /// A pair with nothing measured yet and no error: what a node fills as it measures.
    pub fn blank(step: u32, round: u32, retest: Option<Retest>, client: u32, server: u32) -> PairRow {
        PairRow {
            step,
            round,
            retest,
            client,
            server,
            source: RowSource::Client,
            client_node: String::new(),
            server_node: String::new(),
            client_addr: String::new(),
            server_addr: String::new(),
            devices: Vec::new(),
            peer_devices: Vec::new(),
            op: "write".into(),
            size: 0,
            qps: 0,
            gbps: None,
            gbps_repeats: Vec::new(),
            lat_size: 0,
            p50_us: None,
            p99_us: None,
            error: None,
            counters: BTreeMap::new(),
            peer_counters: BTreeMap::new(),
            peer_error: None,
        }
    }

    pub fn ok(&self) -> bool {
        self.error.is_none()
    }

    /// What node 0 keeps of a healthy pair's row, which its node has printed already: the
    /// verdict's figures and the two nodes' names, not the addresses, devices, repeats or
    /// counters (a thousand nodes' half a million rows must fit node 0's memory). A failed
    /// row is kept whole: the summary shows it from both ends.
    pub fn slim(&mut self) {
        if self.error.is_some() || self.peer_error.is_some() {
            return;
        }
        for s in [&mut self.client_addr, &mut self.server_addr, &mut self.op] {
            *s = String::new();
        }
        (self.devices, self.peer_devices, self.gbps_repeats) = (Vec::new(), Vec::new(), Vec::new());
        (self.counters, self.peer_counters) = (BTreeMap::new(), BTreeMap::new());
        self.client_node.shrink_to_fit();
        self.server_node.shrink_to_fit();
    }

    pub fn is_retest(&self) -> bool {
        self.retest.is_some()
    }

    /// The row as its log line.
    pub fn line(&self) -> String {
        format!("{PAIR_MARK}{}", serde_json::to_string(self).expect("a row serialises"))
    }

    /// Bounds a row that came from a peer or a log: its nodes are nodes of the fleet.
    pub fn check(&self, nodes: u32) -> Result<(), String> {
        if self.client >= nodes || self.server >= nodes || self.client == self.server {
            return Err(format!("a pair {} -> {} is no pair of a fleet of {nodes}", self.client, self.server));
        }
        let bad_figure = |v: Option<f64>| v.is_some_and(|x| !x.is_finite() || x < 0.0);
        if bad_figure(self.gbps) || bad_figure(self.p50_us) || bad_figure(self.p99_us) {
            return Err(format!("pair {} -> {} has a figure that is no measurement", self.client, self.server));
        }
        if self.devices.len() > 64 || self.peer_devices.len() > 64 || self.gbps_repeats.len() > 1000 {
            return Err(format!("pair {} -> {} lists too many devices or repeats", self.client, self.server));
        }
        if self.error.as_ref().is_some_and(|e| e.node.is_some_and(|x| x != self.client && x != self.server)) {
            return Err(format!("pair {} -> {} blames a node of another pair", self.client, self.server));
        }
        check_counters(&self.counters)?;
        check_counters(&self.peer_counters)?;
        if self.error.as_ref().is_some_and(|e| e.message.len() > MAX_ERROR_LEN)
            || self.peer_error.as_ref().is_some_and(|e| e.len() > MAX_ERROR_LEN)
        {
            return Err(format!("pair {} -> {} has an error over {MAX_ERROR_LEN} bytes", self.client, self.server));
        }
        let retest_ok = match self.retest {
            None | Some(Retest::Failed) => true,
            Some(Retest::Node { node }) => node == self.client || node == self.server,
            Some(Retest::Link { a, b }) => {
                (a.min(b), a.max(b)) == (self.client.min(self.server), self.client.max(self.server))
            }
        };
        if !retest_ok {
            return Err(format!(
                "pair {} -> {} says it retests {}, of other nodes",
                self.client,
                self.server,
                self.retest.unwrap()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_megabyte_error_is_cut_by_its_writer_and_the_row_passes_every_check() {
        // A peer's abort text of 1 MiB, with multi-byte characters at the cut.
        let long = "é".repeat(512 * 1024);
        let e = PairError::of(&Error::Peer(long.clone()), Some(Phase::Bandwidth));
        assert!(e.message.len() <= MAX_ERROR_LEN, "{}", e.message.len());
        assert!(e.message.ends_with(&format!("[... {} bytes cut]", long.len() - e.message.find(" [...").unwrap())));
        let row = PairRow::failed(0, 0, None, 0, 1, e);
        row.check(2).unwrap();
        let served = ServedRow { step: 0, client: 0, server: 1, counters: BTreeMap::new(), error: Some(bounded(long)) };
        served.check(2).unwrap();
        assert_eq!(bounded("short".into()), "short");
    }

    #[test]
    fn a_row_reads_back_with_its_error_kind_phase_and_retest() {
        let mut r = PairRow::failed(
            4,
            1,
            Some(Retest::Node { node: 3 }),
            3,
            0,
            PairError::of(&Error::Peer("peer x made no progress".into()), Some(Phase::Latency)),
        );
        r.source = RowSource::Coordinator;
        let line = r.line();
        let back: PairRow = serde_json::from_str(line.strip_prefix(PAIR_MARK).unwrap()).unwrap();
        assert_eq!(back, r);
        assert!(line.contains("\"kind\":\"peer\"") && line.contains("\"phase\":\"latency\""), "{line}");
        assert_eq!(back.error.as_ref().unwrap().to_string(), "latency failed (peer lost): peer x made no progress");
        assert!(back.check(5).is_ok());
    }

    #[test]
    fn forged_rows_are_refused() {
        let ok = PairRow::failed(0, 0, None, 1, 2, PairError::node_left(2, "x".into()));
        assert!(ok.check(3).is_ok());
        assert!(ok.check(2).unwrap_err().contains("no pair of a fleet of 2"));
        let mut r = ok.clone();
        r.retest = Some(Retest::Node { node: 0 });
        assert!(r.check(3).unwrap_err().contains("of other nodes"));
        let mut r = ok.clone();
        // Forged past the writer's cut (`bounded`), which honest rows always pass.
        r.error.as_mut().unwrap().message = "y".repeat(MAX_ERROR_LEN + 1);
        assert!(r.check(3).is_err());
        let mut r = ok;
        r.gbps = Some(f64::NAN);
        assert!(r.check(3).is_err());
    }
}
