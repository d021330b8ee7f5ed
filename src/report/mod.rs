//! What a run produced and how it is shown: the result types shared by the table, the
//! JSON document (schema in results/schema/) and the session's final report.

pub mod check;
pub mod devices;
pub mod file;
pub mod histogram;
pub mod json;
pub mod junit;
pub mod markers;
pub mod metrics;
pub mod pairs;
pub mod plot;
pub mod run;
pub mod table;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::verbs::NicIdentity;

use crate::spec::TestSpec;
use crate::spec::rails::RailMode;
use crate::stats::{LatencySummary, ThroughputSummary};

/// The environment of a run, as seen from the side that writes the document.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    pub tool_version: String,
    pub host: String,
    pub device: String,
    pub port: u8,
    pub link_layer: String,
    pub gid_index: u32,
    pub gid: String,
    pub gid_type: String,
    /// Path MTU used by the QP, bytes.
    pub mtu: u32,
    pub active_mtu: u32,
    /// Inline threshold in force, bytes (messages up to this size are posted inline).
    pub inline_size: u32,
    pub max_inline: u32,
    /// The port's signalling rate in Gb/s, when the device reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_rate_gbps: Option<f64>,
    /// The running kernel's release (`uname -r`): with the NIC's firmware and driver,
    /// what a perf history names beside a change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// The physical NIC behind the device.
    #[serde(default)]
    pub nic: NicIdentity,
    /// The event counters this side's port has (sysfs counters and hw_counters): the names
    /// a size's `counters` may hold and a counter threshold may name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub counters: Vec<String>,
    /// How this side's buffers were backed and registered.
    #[serde(default)]
    pub memory: MemoryReport,
    pub peer: PeerEnvironment,
}

/// This side's registered memory: its pages, and what the registration asked for.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryReport {
    pub page_bytes: u64,
    /// PCIe relaxed ordering was requested (an optional flag: the device applies it where
    /// its PCIe function allows).
    pub relaxed_ordering: bool,
    /// Whether the NIC's PCIe function allows relaxed ordering (Device Control); absent
    /// when there is none (soft-RoCE) or its config space was not readable (needs root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_relaxed_ordering: Option<bool>,
    pub on_demand: bool,
}

impl MemoryReport {
    /// The table header's words.
    pub fn describe(&self) -> String {
        let pages = if self.page_bytes > 4096 {
            format!("{} KiB huge pages", self.page_bytes / 1024)
        } else {
            "4 KiB pages".into()
        };
        let ro = match (self.relaxed_ordering, self.pcie_relaxed_ordering) {
            (false, _) => "relaxed ordering off".to_string(),
            (true, Some(true)) => "relaxed ordering requested (the PCIe function allows it)".into(),
            (true, Some(false)) => "relaxed ordering requested, but the PCIe function has it disabled".into(),
            (true, None) => {
                "relaxed ordering requested (no PCIe function state readable: soft-RoCE, or not root)".into()
            }
        };
        let odp = if self.on_demand { ", on-demand paging" } else { ", pinned" };
        format!("{pages}{odp}, {ro}")
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerEnvironment {
    pub host: String,
    pub address: String,
    pub device: String,
    pub port: u8,
    pub gid_index: u32,
    pub gid: String,
    #[serde(default)]
    pub nic: NicIdentity,
    /// Both sides hold the same physical NIC (shared modes; a fault in exclusive ones).
    #[serde(default)]
    pub same_physical_nic: bool,
}

/// Latency figures of one size. `kind` says what a sample is: "one_way" figures are half
/// a measured round trip (write), "round_trip" figures are whole ones.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencyResult {
    pub kind: String,
    pub unit: String,
    #[serde(flatten)]
    pub summary: LatencySummary,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SizeResult {
    pub size: u64,
    pub iterations: u64,
    /// Payload bytes moved by the measured side (size x iterations).
    pub bytes: u64,
    pub duration_ns: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency: Option<LatencyResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<ThroughputSummary>,
    /// With `--threads`: each client thread's part of `bandwidth`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_thread: Vec<ThroughputSummary>,
    /// With `-b`: the server-to-client direction (`bandwidth` is client to server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reverse_bandwidth: Option<ThroughputSummary>,
    /// Whether payloads were checked where they landed (and passed: a failure ends the run).
    pub data_validated: bool,
    /// With --cpu-util: CPU time this process used during the measurement, % of one core.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_util_pct: Option<f64>,
    /// With --cpu-util: the peer's CPU time during the measurement, % of one core.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_cpu_util_pct: Option<f64>,
    /// On UC and UD, how many messages the receiver got (lost ones are not retransmitted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered: Option<u64>,
    /// This side's port counters that moved during the size (after minus before, only
    /// the non-zero ones); absent when the port has none. Port-wide: other traffic on the
    /// device counts too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<BTreeMap<String, u64>>,
    /// The same for the peer's port, as the peer read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_counters: Option<BTreeMap<String, u64>>,
    /// With `--interval` (a soak): every interval's figures, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub intervals: Vec<IntervalResult>,
}

/// One interval of a soak: what the size's run did between `start_s` and `end_s` (seconds
/// from its start). Bandwidth tests give `gbps` and `mpps`, latency tests the interval's
/// percentiles (the same kind and scale as the size's `latency`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IntervalResult {
    pub size: u64,
    /// The rail, in a run of several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rail: Option<u32>,
    pub start_s: f64,
    pub end_s: f64,
    /// Messages (bandwidth) or samples (latency) of the interval.
    pub iterations: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gbps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mpps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<LatencySummary>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    pub test: String,
    pub spec: TestSpec,
    /// Rail 0's view (the only rail's in a one-device run).
    pub environment: Environment,
    /// Every size; with several rails, the aggregate over them (see `rails`).
    pub results: Vec<SizeResult>,
    /// With several rails (`-d a,b` or `-d all`): each rail's own results.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rails: Vec<RailResult>,
    /// With several rails: "concurrent" (all at once) or "sequential" (one after another).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rail_mode: Option<RailMode>,
}

impl SizeResult {
    /// CPU time per message (record, for ring tests) of a side that used `pct` % of a
    /// core over the size's run, ns.
    pub fn cpu_ns_per_message(&self, pct: f64) -> Option<f64> {
        (self.iterations > 0).then(|| pct / 100.0 * self.duration_ns as f64 / self.iterations as f64)
    }
}

impl RunResult {
    /// The rail that failed first, with its error, if one did.
    pub fn failed_rail(&self) -> Option<&RailResult> {
        self.rails.iter().find(|r| r.error.is_some())
    }
}

/// One rail of a multi-NIC run: a device of this side paired with the peer's device of
/// the same index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RailResult {
    pub rail: u32,
    pub device: String,
    pub peer_device: String,
    /// The NUMA node of this side's device, when sysfs says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<i32>,
    /// The CPUs this rail's threads were pinned to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpus: Vec<usize>,
    /// Absent when the rail failed before it was connected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<Environment>,
    /// The sizes this rail measured (all of them, unless it failed).
    pub results: Vec<SizeResult>,
    /// Why this rail stopped, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl RailResult {
    /// "rail 1 (mlx5_1 -> mlx5_1)": how messages and tables name a rail.
    pub fn label(&self) -> String {
        rail_label(self.rail, &self.device, &self.peer_device)
    }
}

pub fn rail_label(rail: u32, device: &str, peer_device: &str) -> String {
    format!("rail {rail} ({device} -> {})", if peer_device.is_empty() { "?" } else { peer_device })
}
