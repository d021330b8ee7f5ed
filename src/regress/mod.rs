//! Compares two run documents step by step and metric by metric: a change beyond the
//! metric's tolerance in the worse direction is a regression, unless both sides carry
//! repeats whose ranges overlap, which is noise. Results from different environments are
//! refused (or, when allowed, compared and flagged).

pub mod command;

use std::io::Write;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::report::junit;
use crate::report::metrics::{self, Better, Stats};
use crate::report::run::RunDocument;
use crate::units::Sig;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Within the tolerance.
    Same,
    Improved,
    Regressed,
    /// Beyond the tolerance, but the repeats' ranges overlap.
    WithinNoise,
}

impl Verdict {
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Same => "same",
            Verdict::Improved => "improved",
            Verdict::Regressed => "REGRESSED",
            Verdict::WithinNoise => "within noise",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub step: String,
    /// The rail compared ("rail 1 (mlx5_1 -> mlx5_1)"); None: the step's total.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rail: Option<String>,
    pub size: u64,
    pub metric: String,
    pub baseline: Stats,
    pub current: Stats,
    /// Relative change of the medians, percent (positive: the value grew).
    pub change_pct: f64,
    pub tolerance_pct: f64,
    pub verdict: Verdict,
}

impl Row {
    /// The step, and the rail when the row is one rail's.
    pub fn label(&self) -> String {
        match &self.rail {
            Some(r) => format!("{} [{r}]", self.step),
            None => self.step.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub rows: Vec<Row>,
    /// Steps or sizes of the baseline the current run lacks.
    pub missing: Vec<String>,
    /// Environment differences (only when comparing them was allowed).
    pub environment_differences: Vec<String>,
}

impl Comparison {
    /// Metrics beyond their tolerance in the worse direction.
    pub fn regressed(&self) -> usize {
        self.rows.iter().filter(|r| r.verdict == Verdict::Regressed).count()
    }

    /// Whether the comparison fails: a regression, or a step or size of the baseline that
    /// this run lacks (what was not measured cannot be shown not to have regressed).
    pub fn failed(&self) -> bool {
        self.regressed() > 0 || !self.missing.is_empty()
    }

    /// Why the comparison failed, in one line: "2 regressed and 1 missing (step ...)".
    /// None when it passed.
    pub fn failure(&self) -> Option<String> {
        let mut parts = Vec::new();
        if self.regressed() > 0 {
            parts.push(format!("{} metric(s) regressed", self.regressed()));
        }
        if !self.missing.is_empty() {
            parts.push(format!(
                "{} missing from this run ({}; a missing step or size fails the comparison)",
                self.missing.len(),
                self.missing.join(", ")
            ));
        }
        (!parts.is_empty()).then(|| parts.join(" and "))
    }
}

/// What makes two runs incomparable: device, link layer, MTU, link rate, schema.
pub fn environment_differences(base: &RunDocument, cur: &RunDocument) -> Vec<String> {
    let mut d = Vec::new();
    if base.schema_version != cur.schema_version {
        d.push(format!("schema version {} vs {}", base.schema_version, cur.schema_version));
    }
    let (Some(b), Some(c)) = (&base.environment, &cur.environment) else {
        return d;
    };
    let mut diff = |what: &str, x: String, y: String| {
        if x != y {
            d.push(format!("{what}: baseline {x}, current {y}"));
        }
    };
    diff("device", b.device.clone(), c.device.clone());
    diff("link layer", b.link_layer.clone(), c.link_layer.clone());
    diff("path MTU", b.mtu.to_string(), c.mtu.to_string());
    let rate = |r: Option<f64>| r.map_or("unknown".into(), |r| format!("{r} Gb/s"));
    diff("link rate", rate(b.link_rate_gbps), rate(c.link_rate_gbps));
    d
}

/// Judges one metric's change.
pub fn judge(metric: &str, base: &Stats, cur: &Stats, tolerance_pct: f64) -> (f64, Verdict) {
    let change = if base.median == 0.0 { 0.0 } else { (cur.median - base.median) / base.median * 100.0 };
    let higher_better = metrics::better(metric) == Some(Better::Higher);
    let worse = if higher_better { -change } else { change };
    if worse.abs() <= tolerance_pct {
        return (change, Verdict::Same);
    }
    // Both sides repeated and their ranges overlap: the runs cannot tell them apart.
    let repeated = base.values.len() > 1 && cur.values.len() > 1;
    if repeated && cur.min <= base.max && base.min <= cur.max {
        return (change, Verdict::WithinNoise);
    }
    (change, if worse > 0.0 { Verdict::Regressed } else { Verdict::Improved })
}

pub fn compare(
    base: &RunDocument,
    cur: &RunDocument,
    tolerance_pct: f64,
    allow_env_mismatch: bool,
) -> Result<Comparison> {
    compare_counting(base, cur, tolerance_pct, allow_env_mismatch, false)
}

/// [`compare`], and with `counters` the port counter deltas too: a counter regresses when
/// the current run's median exceeds every baseline repeat (more retransmissions, say, than
/// the baseline ever had), whatever the tolerance; it improves below all of them.
pub fn compare_counting(
    base: &RunDocument,
    cur: &RunDocument,
    tolerance_pct: f64,
    allow_env_mismatch: bool,
    counters: bool,
) -> Result<Comparison> {
    // Its errors quote the documents (devices, steps): bounded and made safe to print.
    comparison(base, cur, tolerance_pct, allow_env_mismatch, counters).map_err(Error::quoting)
}

fn comparison(
    base: &RunDocument,
    cur: &RunDocument,
    tolerance_pct: f64,
    allow_env_mismatch: bool,
    counters: bool,
) -> Result<Comparison> {
    let environment_differences = environment_differences(base, cur);
    if !environment_differences.is_empty() && !allow_env_mismatch {
        return Err(Error::Usage(format!(
            "the runs come from different environments ({}); a comparison would be meaningless. Compare runs of \
             the same setup, or pass --allow-env-mismatch to compare anyway (the differences are then reported)",
            environment_differences.join("; ")
        )));
    }
    let mut rows = Vec::new();
    let mut missing = Vec::new();
    for bs in base.steps.iter().filter(|s| s.kind == "measure") {
        let Some(cs) = cur.steps.iter().find(|s| s.name == bs.name) else {
            missing.push(format!("step \"{}\"", bs.name));
            continue;
        };
        let tolerance = |metric: &str| cs.tolerance.get(metric).copied().unwrap_or(tolerance_pct);
        let step = Figures { step: &bs.name, rail: None, tolerance: &tolerance, counters };
        step.compare(&bs.stats, &cs.stats, &mut rows, &mut missing);
        // Rails match by position and device: rail i of the baseline is rail i here, on
        // the same device, or it is missing.
        for br in &bs.rails {
            let same = cs.rails.iter().find(|cr| cr.rail == br.rail && cr.device == br.device);
            let Some(cr) = same else {
                let here = cs.rails.iter().find(|cr| cr.rail == br.rail).map_or("no such rail".into(), |c| c.label());
                missing.push(format!("step \"{}\" {} (this run: {here})", bs.name, br.label()));
                continue;
            };
            let rail = Figures { step: &bs.name, rail: Some(br.label()), tolerance: &tolerance, counters };
            rail.compare(&br.stats, &cr.stats, &mut rows, &mut missing);
        }
    }
    Ok(Comparison { rows, missing, environment_differences })
}

/// The figures of one step, or of one rail of it, compared size by size.
struct Figures<'a> {
    step: &'a str,
    rail: Option<String>,
    tolerance: &'a dyn Fn(&str) -> f64,
    /// Compare the port counters as well.
    counters: bool,
}

impl Figures<'_> {
    fn compare(
        &self,
        base: &[metrics::SizeStats],
        cur: &[metrics::SizeStats],
        rows: &mut Vec<Row>,
        missing: &mut Vec<String>,
    ) {
        let whose = match &self.rail {
            Some(r) => format!("step \"{}\" {r}", self.step),
            None => format!("step \"{}\"", self.step),
        };
        for bsize in base {
            let Some(csize) = cur.iter().find(|s| s.size == bsize.size) else {
                missing.push(format!("{whose} size {}", bsize.size));
                continue;
            };
            for (metric, b) in &bsize.metrics {
                let Some(c) = csize.metrics.get(metric) else { continue };
                let tol = (self.tolerance)(metric);
                let (change_pct, verdict) = judge(metric, b, c, tol);
                rows.push(Row {
                    step: self.step.to_string(),
                    rail: self.rail.clone(),
                    size: bsize.size,
                    metric: metric.clone(),
                    baseline: b.clone(),
                    current: c.clone(),
                    change_pct,
                    tolerance_pct: tol,
                    verdict,
                });
            }
            if self.counters {
                self.compare_counters(bsize, csize, rows);
            }
        }
    }
}

impl Figures<'_> {
    /// Every counter either run moved; one that did not move in a run counts 0 there.
    fn compare_counters(&self, base: &metrics::SizeStats, cur: &metrics::SizeStats, rows: &mut Vec<Row>) {
        let mut names: Vec<&String> = base.counters.keys().chain(cur.counters.keys()).collect();
        names.sort();
        names.dedup();
        let zero = |like: &metrics::SizeStats| {
            let n = like.counters.values().map(|s| s.values.len()).max().unwrap_or(1);
            Stats::of(vec![0.0; n]).expect("one repeat at least")
        };
        for name in names {
            let b = base.counters.get(name).cloned().unwrap_or_else(|| zero(base));
            let c = cur.counters.get(name).cloned().unwrap_or_else(|| zero(cur));
            let verdict = if c.median > b.max {
                Verdict::Regressed
            } else if c.median < b.min {
                Verdict::Improved
            } else {
                Verdict::Same
            };
            let change_pct = if b.median == 0.0 { 0.0 } else { (c.median - b.median) / b.median * 100.0 };
            rows.push(Row {
                step: self.step.to_string(),
                rail: self.rail.clone(),
                size: base.size,
                metric: format!("{}{name}", metrics::COUNTER),
                baseline: b,
                current: c,
                change_pct,
                tolerance_pct: 0.0,
                verdict,
            });
        }
    }
}

fn io(e: std::io::Error) -> Error {
    Error::Environment(format!("cannot write the output: {e}"))
}

/// The median, with the repeats' range: significant digits, so that a change shows at
/// any magnitude (0.0009 Mpps as well as 6000 MB/s).
fn spread(s: &Stats) -> String {
    if s.values.len() > 1 {
        format!("{} ({}..{})", Sig(s.median), Sig(s.min), Sig(s.max))
    } else {
        Sig(s.median).to_string()
    }
}

pub fn print(c: &Comparison, out: &mut dyn Write) -> Result<()> {
    for d in &c.environment_differences {
        writeln!(out, "WARNING environments differ: {d}").map_err(io)?;
    }
    writeln!(
        out,
        "{:<32} {:>8} {:<8} {:>34} {:>34} {:>9} {:>6}  verdict",
        "step", "size", "metric", "baseline", "current", "change", "tol"
    )
    .map_err(io)?;
    for r in &c.rows {
        writeln!(
            out,
            "{:<32} {:>8} {:<8} {:>34} {:>34} {:>+8.1}% {:>5.1}%  {}",
            r.label(),
            r.size,
            r.metric,
            spread(&r.baseline),
            spread(&r.current),
            r.change_pct,
            r.tolerance_pct,
            r.verdict.label()
        )
        .map_err(io)?;
    }
    for m in &c.missing {
        writeln!(out, "MISSING {m}: in the baseline, not in this run (fails the comparison)").map_err(io)?;
    }
    let count = |v: Verdict| c.rows.iter().filter(|r| r.verdict == v).count();
    writeln!(
        out,
        "comparison: {} regressed, {} improved, {} within noise, {} same, {} missing",
        count(Verdict::Regressed),
        count(Verdict::Improved),
        count(Verdict::WithinNoise),
        count(Verdict::Same),
        c.missing.len()
    )
    .map_err(io)
}

pub fn junit_cases(c: &Comparison) -> Vec<junit::Case> {
    let mut cases: Vec<junit::Case> = c
        .rows
        .iter()
        .map(|r| {
            let text = format!(
                "baseline {}, current {}, change {:+.1}% (tolerance {:.1}%): {}",
                spread(&r.baseline),
                spread(&r.current),
                r.change_pct,
                r.tolerance_pct,
                r.verdict.label()
            );
            junit::Case {
                name: format!("{} {} B {}", r.label(), r.size, r.metric),
                classname: "compare".into(),
                outcome: if r.verdict == Verdict::Regressed {
                    junit::Outcome::Failed(text.clone())
                } else {
                    junit::Outcome::Passed
                },
                output: text,
                seconds: 0.0,
            }
        })
        .collect();
    for m in &c.missing {
        cases.push(junit::Case {
            name: format!("{m} present"),
            classname: "compare".into(),
            outcome: junit::Outcome::Failed(format!("{m} is in the baseline but not in this run")),
            output: String::new(),
            seconds: 0.0,
        });
    }
    cases
}

#[cfg(test)]
mod tests;
