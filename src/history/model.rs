//! What a history holds: a run (its environment, label and document) and its points (one
//! per step, rail, size and metric: the median over the step's repeats), and the series
//! they make. Pure: from a run document in, rows out.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::report::metrics::SizeStats;
use crate::report::run::RunDocument;

/// A run as stored, without its points and document.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunRow {
    pub id: i64,
    pub added_unix_s: f64,
    pub finished_unix_s: f64,
    /// What the CI said this run is: a commit, a pipeline, a tag (`--label`).
    pub label: String,
    pub workload: String,
    /// Which runs are comparable: the hardware path measured (see [`setup_of`]).
    pub setup: String,
    pub host: String,
    pub tool_version: String,
    /// The NICs' firmware, both sides ("this / peer" when they differ).
    pub firmware: String,
    pub driver: String,
    pub kernel: String,
    pub verdict: String,
}

/// One figure of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PointRow {
    pub run_id: i64,
    pub step: String,
    /// "" for the step's total; a rail's label otherwise.
    pub rail: String,
    pub size: i64,
    pub metric: String,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub repeats: i64,
    /// Every repeat's value, in run order.
    pub values: Vec<f64>,
    /// The workload's tolerance for this metric, percent, when it states one.
    pub tolerance_pct: Option<f64>,
}

/// A run on its way into a store.
#[derive(Debug, Clone)]
pub struct NewRun {
    pub row: RunRow,
    pub points: Vec<PointRow>,
    pub document: String,
}

/// The identity of one series: every run's point with this key, in one setup.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct SeriesKey {
    pub setup: String,
    pub workload: String,
    pub step: String,
    pub rail: String,
    pub size: i64,
    pub metric: String,
}

impl SeriesKey {
    /// "write-bw 65536 B gbps" (with the rail when there is one).
    pub fn label(&self) -> String {
        let rail = if self.rail.is_empty() { String::new() } else { format!(" [{}]", self.rail) };
        format!("{}{rail} {} B {}", self.step, self.size, self.metric)
    }
}

/// The setup a run measured: both ends' host, device, link layer, path MTU and rate. Runs
/// of different setups never share a series; firmware, driver, kernel and rdmabench
/// versions are not part of it (a change of them is what a history is to find).
pub fn setup_of(doc: &RunDocument) -> String {
    let Some(e) = &doc.environment else { return "unknown environment".into() };
    let rate = e.link_rate_gbps.map_or("rate unknown".into(), |r| format!("{r} Gb/s"));
    format!("{}/{} -> {}/{}, {}, MTU {}, {rate}", e.host, e.device, e.peer.host, e.peer.device, e.link_layer, e.mtu)
}

/// "a" when both sides say the same, "a / b" when they differ, "" when neither says.
fn both(this: Option<&str>, peer: Option<&str>) -> String {
    match (this.unwrap_or(""), peer.unwrap_or("")) {
        (a, b) if a == b || b.is_empty() => a.to_string(),
        (a, b) => format!("{a} / {b}"),
    }
}

/// The run's row and points from its document.
pub fn from_document(doc: &RunDocument, text: &str, label: &str, setup: Option<&str>, added_unix_s: f64) -> NewRun {
    let env = doc.environment.as_ref();
    let nic = env.map(|e| (&e.nic, &e.peer.nic));
    let row = RunRow {
        id: 0,
        added_unix_s,
        finished_unix_s: doc.finished_unix_s,
        label: label.to_string(),
        workload: doc.workload.clone(),
        setup: setup.map_or_else(|| setup_of(doc), str::to_string),
        host: env.map_or(String::new(), |e| e.host.clone()),
        tool_version: doc.tool_version.clone(),
        firmware: nic.map_or(String::new(), |(a, b)| both(a.firmware.as_deref(), b.firmware.as_deref())),
        driver: nic.map_or(String::new(), |(a, b)| both(a.driver.as_deref(), b.driver.as_deref())),
        kernel: env.and_then(|e| e.kernel.clone()).unwrap_or_default(),
        verdict: doc.verdict.clone(),
    };
    let mut points = Vec::new();
    for step in doc.steps.iter().filter(|s| s.kind == "measure") {
        let mut push = |rail: String, stats: &[SizeStats]| {
            for s in stats {
                for (metric, st) in &s.metrics {
                    points.push(PointRow {
                        run_id: 0,
                        step: step.name.clone(),
                        rail: rail.clone(),
                        size: s.size as i64,
                        metric: metric.clone(),
                        median: st.median,
                        min: st.min,
                        max: st.max,
                        repeats: st.values.len() as i64,
                        values: st.values.clone(),
                        tolerance_pct: step.tolerance.get(metric).copied(),
                    });
                }
            }
        };
        push(String::new(), &step.stats);
        for r in &step.rails {
            push(r.label(), &r.stats);
        }
    }
    NewRun { row, points, document: text.to_string() }
}

/// One series: its key and its points with their runs, oldest first.
#[derive(Debug, Clone)]
pub struct Series<'a> {
    pub key: SeriesKey,
    pub points: Vec<(&'a RunRow, &'a PointRow)>,
}

/// Every series in the store, keyed; each run's points go to its own setup's series.
pub fn series<'a>(runs: &'a [RunRow], points: &'a [PointRow]) -> Vec<Series<'a>> {
    let by_id: BTreeMap<i64, &RunRow> = runs.iter().map(|r| (r.id, r)).collect();
    let mut all: BTreeMap<SeriesKey, Vec<(&RunRow, &PointRow)>> = BTreeMap::new();
    for p in points {
        let Some(run) = by_id.get(&p.run_id) else { continue };
        let key = SeriesKey {
            setup: run.setup.clone(),
            workload: run.workload.clone(),
            step: p.step.clone(),
            rail: p.rail.clone(),
            size: p.size,
            metric: p.metric.clone(),
        };
        all.entry(key).or_default().push((run, p));
    }
    all.into_iter()
        .map(|(key, mut points)| {
            points.sort_by_key(|(r, _)| r.id);
            Series { key, points }
        })
        .collect()
}

/// What differs in the environment between two runs: firmware, driver, kernel, rdmabench,
/// as "firmware 28.39.1002 -> 28.40.1000" phrases.
pub fn environment_changes(before: &RunRow, after: &RunRow) -> Vec<String> {
    let mut out = Vec::new();
    for (what, a, b) in [
        ("firmware", &before.firmware, &after.firmware),
        ("driver", &before.driver, &after.driver),
        ("kernel", &before.kernel, &after.kernel),
        ("rdmabench", &before.tool_version, &after.tool_version),
    ] {
        if a != b {
            out.push(format!("{what} {} -> {}", or_unknown(a), or_unknown(b)));
        }
    }
    out
}

/// An environment field as shown: "unknown" where the run did not record it.
pub fn or_unknown(s: &str) -> &str {
    if s.is_empty() { "unknown" } else { s }
}
