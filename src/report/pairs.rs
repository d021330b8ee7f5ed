//! One measured pair of an all-pairs fleet, as a JSON line (`RDMABENCH_PAIR {...}` in a
//! pod's log, `pairs.jsonl` from `summarize`): plain data, written by the measuring node,
//! carried to the fleet's coordinator, read back by `summarize`.

use serde::{Deserialize, Serialize};

/// The marker of a pair's line in a pod's log.
pub const PAIR_MARK: &str = "RDMABENCH_PAIR ";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairRow {
    /// The step of the schedule (retests come after the last planned step).
    pub step: u32,
    pub round: u32,
    /// A retest of a suspect against a known-good peer, after the planned rounds.
    #[serde(default)]
    pub retest: bool,
    /// Node (pod index) that measured, and the one it measured against.
    pub client: u32,
    pub server: u32,
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
    /// "ok" or "failed".
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The most pairs one message or one log may carry (1000 nodes, both directions, retests).
pub const MAX_PAIRS: usize = 2_000_000;

impl PairRow {
    /// A pair that measured nothing (its error says why); the sizes are 0: not measured.
    pub fn failed(step: u32, round: u32, retest: bool, client: u32, server: u32, error: String) -> PairRow {
        PairRow {
            step,
            round,
            retest,
            client,
            server,
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
            status: "failed".into(),
            error: Some(error),
        }
    }

    pub fn ok(&self) -> bool {
        self.status == "ok" && self.error.is_none()
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
        Ok(())
    }
}
