//! The document of a whole workload run: every step with its spec, every repeat's
//! results, the statistics thresholds and comparisons use, and the verdicts. Schema
//! `rdmabench/run` version 2 (results/schema/run-v2.schema.json); `compare` reads it back.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::check::Check;
use super::metrics::{SizeStats, ThresholdVerdict};
use super::{Environment, SizeResult};
use crate::error::{Error, Result};
use crate::spec::TestSpec;

pub const SCHEMA: &str = "rdmabench/run";
/// Version 2 added per-rail records (`rails` in a step, `rail` in a threshold verdict); a
/// version 1 document reads as a run of one rail.
pub const SCHEMA_VERSION: u32 = 2;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunDocument {
    pub schema: String,
    pub schema_version: u32,
    pub tool_version: String,
    pub workload: String,
    pub workload_file: String,
    pub finished_unix_s: f64,
    /// The client's view of the first measurement (device, MTU, rate, peer).
    pub environment: Option<Environment>,
    pub steps: Vec<StepRecord>,
    /// "pass" or "fail".
    pub verdict: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub name: String,
    /// "validate" or "measure".
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<TestSpec>,
    #[serde(default)]
    pub repeat: u32,
    /// Every repeat's results, each with every size.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<Vec<SizeResult>>,
    /// Per size: each metric's median, min, max and values over the repeats.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stats: Vec<SizeStats>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub thresholds: Vec<ThresholdVerdict>,
    /// Per-metric tolerance (percent) for comparisons, from the workload.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tolerance: BTreeMap<String, f64>,
    /// A validate step's checks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<Check>,
    /// With several rails: each rail's repeats and statistics (`runs` and `stats` above
    /// are then the aggregate over the rails).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rails: Vec<RailStep>,
    /// Why the step could not finish.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// "pass" or "fail".
    pub verdict: String,
    pub duration_s: f64,
}

/// One rail of a measurement step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RailStep {
    pub rail: u32,
    pub device: String,
    pub peer_device: String,
    /// The port's active rate, Gb/s, when the device reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_rate_gbps: Option<f64>,
    /// The counters this rail's port has.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub counters: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<Vec<SizeResult>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stats: Vec<SizeStats>,
    /// Why this rail stopped, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl RailStep {
    /// "rail 1 (mlx5_1 -> mlx5_1)".
    pub fn label(&self) -> String {
        super::rail_label(self.rail, &self.device, &self.peer_device)
    }
}

impl StepRecord {
    pub fn passed(&self) -> bool {
        self.verdict == "pass"
    }
}

/// Reads a run document, or a single test's result document (as a one-step run). Its
/// errors can quote the document (a schema name, a value): bounded and made safe to print.
pub fn read(path: &str) -> Result<RunDocument> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::Usage(format!("cannot read {path}: {e}")))?;
    parse(path, &text)
}

/// [`read`] of a document already read from `path` (for a caller that keeps its text too).
pub fn parse(path: &str, text: &str) -> Result<RunDocument> {
    parse_quoting(path, text).map_err(Error::quoting)
}

fn parse_quoting(path: &str, text: &str) -> Result<RunDocument> {
    let mut v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| Error::Usage(format!("{path} is not JSON: {e}")))?;
    // A baseline may come from anywhere: its text reaches tables, errors and JUnit only
    // with unsafe characters written as visible escapes.
    crate::names::escape_json(&mut v);
    let bad = |e: serde_json::Error| Error::Usage(format!("{path} is not a valid rdmabench document: {e}"));
    match v.get("schema").and_then(|s| s.as_str()) {
        Some(SCHEMA) => {
            let version = v.get("schema_version").and_then(|s| s.as_u64()).unwrap_or(0);
            if !(1..=SCHEMA_VERSION as u64).contains(&version) {
                return Err(Error::Usage(format!(
                    "{path} has {SCHEMA} version {version}; this rdmabench reads versions 1 to {SCHEMA_VERSION}: rerun \
                     the baseline with this version"
                )));
            }
            let mut doc: RunDocument = serde_json::from_value(v).map_err(bad)?;
            // Version 1 is version 2 without rails.
            doc.schema_version = SCHEMA_VERSION;
            Ok(doc)
        }
        Some(super::json::SCHEMA) => {
            // Versions 1 and 2 both read: version 1 is a one-rail run.
            let doc: super::json::Document = serde_json::from_value(v).map_err(bad)?;
            Ok(from_result(doc, path))
        }
        other => Err(Error::Usage(format!(
            "{path} is a {other:?} document; compare reads rdmabench/run (from `rdmabench run --json`) or \
             rdmabench/result (a test's --json)"
        ))),
    }
}

/// A single test's document seen as a run of one step named after the test.
fn from_result(doc: super::json::Document, path: &str) -> RunDocument {
    let run = doc.run;
    let runs = vec![run.results.clone()];
    RunDocument {
        schema: SCHEMA.into(),
        schema_version: SCHEMA_VERSION,
        tool_version: run.environment.tool_version.clone(),
        workload: run.test.clone(),
        workload_file: path.into(),
        finished_unix_s: doc.finished_unix_s,
        environment: Some(run.environment.clone()),
        steps: vec![StepRecord {
            name: run.test.clone(),
            kind: "measure".into(),
            spec: Some(run.spec.clone()),
            repeat: 1,
            stats: super::metrics::gather(&runs),
            runs,
            thresholds: Vec::new(),
            tolerance: BTreeMap::new(),
            checks: Vec::new(),
            rails: run.rails.iter().map(|r| rail_step(r, vec![r.results.clone()])).collect(),
            error: None,
            verdict: "pass".into(),
            duration_s: 0.0,
        }],
        verdict: "pass".into(),
    }
}

/// A rail's record in a step, from its result and its repeats' results.
pub fn rail_step(r: &super::RailResult, runs: Vec<Vec<SizeResult>>) -> RailStep {
    RailStep {
        rail: r.rail,
        device: r.device.clone(),
        peer_device: r.peer_device.clone(),
        link_rate_gbps: r.environment.as_ref().and_then(|e| e.link_rate_gbps),
        counters: r.environment.as_ref().map_or_else(Vec::new, |e| e.counters.clone()),
        stats: super::metrics::gather(&runs),
        runs,
        error: r.error.clone(),
    }
}
