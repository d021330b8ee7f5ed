//! Runs a workload from the client side: every step in order (validate steps here,
//! measurements through the session against a `run --serve` peer, repeated as asked),
//! thresholds judged on the median of the repeats, one document for the whole run,
//! JUnit, and the comparison with a baseline when given.

use std::io::Write;
use std::time::Instant;

use super::file::{Measurement, StepKind, Workload};
use crate::bench::runner::{self, RunOptions};
use crate::error::{Error, Result};
use crate::regress;
use crate::report::junit;
use crate::report::metrics;
use crate::report::run::{self as doc, RunDocument, StepRecord};
use crate::validate::{self, Request, sysfs::Tree};

/// How to reach the peer and where the outputs go.
pub struct Plan {
    pub workload: Workload,
    pub peer: String,
    /// The connection flags (devices, ports, deadlines, token, memory budget, units); each
    /// step's options start from these.
    pub session: RunOptions,
    pub json: Option<String>,
    pub junit: Option<String>,
    pub baseline: Option<String>,
    pub tolerance_pct: f64,
    pub allow_env_mismatch: bool,
}

impl Plan {
    fn options(&self, cpu_util: bool) -> RunOptions {
        RunOptions {
            json: None,
            cpu_util,
            histogram: None,
            tables_on_stderr: self.json.as_deref() == Some("-"),
            ..self.session.clone()
        }
    }
}

fn io(e: std::io::Error) -> Error {
    Error::Environment(format!("cannot write the output: {e}"))
}

/// Runs the workload; Err(Check) when a step, threshold or comparison failed (exit 1).
/// A lost peer (exit 4) or a signal (128 + N) ends the run early: later steps are recorded
/// as not run, and the documents are still written.
pub fn client(plan: &Plan, out: &mut dyn Write) -> Result<RunDocument> {
    let w = &plan.workload;
    let n = w.steps.len();
    // Everything that could fail at the end is tried before step 1.
    crate::report::file::check_outputs(&[(&plan.json, "--json"), (&plan.junit, "--junit")])?;
    let baseline = plan.baseline.as_deref().map(|path| doc::read(path).map(|d| (path, d))).transpose()?;
    let mut steps = Vec::with_capacity(n);
    let mut environment = None;
    let mut peer_lost: Option<String> = None;
    let mut stop: Option<Error> = None;
    for (i, step) in w.steps.iter().enumerate() {
        writeln!(out, "\n=== step {}/{n}: {} ===", i + 1, step.name).map_err(io)?;
        let t = Instant::now();
        let mut record = match (&step.kind, &peer_lost) {
            (_, Some(why)) => skipped(&step.name, why),
            (StepKind::Validate { profile, expect_nics, expect_gpus }, _) => {
                let req = Request {
                    tree: Tree::default(),
                    profile: profile.profile(),
                    expect_nics: *expect_nics,
                    expect_gpus: *expect_gpus,
                    mr_size: 64 << 20,
                    json: None,
                    junit: None,
                };
                let outcome = validate::evaluate(&req);
                validate::print_lines(req.profile, &outcome, out)?;
                let failed = validate::verdict(&outcome) == "FAIL";
                StepRecord {
                    kind: "validate".into(),
                    checks: outcome.checks,
                    verdict: if failed { "fail" } else { "pass" }.into(),
                    ..skipped(&step.name, "")
                }
            }
            (StepKind::Measure(m), _) => {
                let r = measure(plan, &step.name, m, out)?;
                match &r.1 {
                    Some(Error::Peer(why)) => {
                        peer_lost = Some(format!("not run: the peer was lost in step \"{}\" ({why})", step.name));
                    }
                    Some(e @ Error::Interrupted(_)) => {
                        peer_lost = Some(format!("not run: {} in step \"{}\"", e.message(), step.name));
                        stop = Some(e.clone());
                    }
                    _ => {}
                }
                if environment.is_none() {
                    environment = r.2;
                }
                r.0
            }
        };
        record.duration_s = t.elapsed().as_secs_f64();
        steps.push(record);
    }
    // A serving peer that cannot be told the run is over is lost too (exit 4), but what
    // was measured is still written.
    if peer_lost.is_none()
        && let Err(e) = runner::finish_workload(&plan.peer, &plan.options(false))
    {
        writeln!(out, "rdmabench: could not tell the serving peer that the run is over: {e}").map_err(io)?;
        match e {
            Error::Interrupted(_) => stop = Some(e),
            e => peer_lost = Some(format!("the serving peer could not be told the run is over ({e})")),
        }
    }
    let verdict = if steps.iter().all(StepRecord::passed) { "pass" } else { "fail" };
    let doc = RunDocument {
        schema: doc::SCHEMA.into(),
        schema_version: doc::SCHEMA_VERSION,
        tool_version: env!("CARGO_PKG_VERSION").into(),
        workload: w.name.clone(),
        workload_file: w.file.clone(),
        finished_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
        environment,
        steps,
        verdict: verdict.into(),
    };
    summary(&doc, out)?;
    let comparison = match &baseline {
        Some((path, base)) => {
            let c = regress::compare(base, &doc, plan.tolerance_pct, plan.allow_env_mismatch)?;
            writeln!(out, "\n=== compared with {path} ===").map_err(io)?;
            regress::print(&c, out)?;
            Some(c)
        }
        None => None,
    };
    if let Some(target) = &plan.json {
        crate::report::json::write(&doc, target)?;
    }
    if let Some(path) = &plan.junit {
        let mut cases = junit_cases(&doc);
        if let Some(c) = &comparison {
            cases.extend(regress::junit_cases(c));
        }
        let text = junit::render(&format!("rdmabench run {}", doc.workload), &cases);
        crate::report::file::write(path, text.as_bytes(), "the JUnit report")?;
    }
    let failed: Vec<&str> = doc.steps.iter().filter(|s| !s.passed()).map(|s| s.name.as_str()).collect();
    if let Some(e @ Error::Interrupted(_)) = stop {
        return Err(e);
    }
    // A lost peer is exit 4 (design.md), whatever else failed: the steps after it never ran.
    if let Some(lost) = &peer_lost {
        let failed = if failed.is_empty() { String::new() } else { format!("; step(s) failed: {}", failed.join(", ")) };
        return Err(Error::Peer(format!(
            "workload {}: {}{failed}",
            doc.workload,
            lost.trim_start_matches("not run: ")
        )));
    }
    if !failed.is_empty() {
        return Err(Error::Check(format!("workload {}: step(s) failed: {}", doc.workload, failed.join(", "))));
    }
    if let Some(why) = comparison.as_ref().and_then(regress::Comparison::failure) {
        return Err(Error::Check(format!("workload {} against the baseline: {why}", doc.workload)));
    }
    Ok(doc)
}

fn skipped(name: &str, why: &str) -> StepRecord {
    StepRecord {
        name: name.into(),
        kind: "measure".into(),
        spec: None,
        repeat: 0,
        runs: Vec::new(),
        stats: Vec::new(),
        thresholds: Vec::new(),
        tolerance: Default::default(),
        checks: Vec::new(),
        rails: Vec::new(),
        error: (!why.is_empty()).then(|| why.into()),
        verdict: "fail".into(),
        duration_s: 0.0,
    }
}

/// Runs one measurement `repeat` times; returns its record, the error that stopped it,
/// and the environment of its first run.
fn measure(
    plan: &Plan,
    name: &str,
    m: &Measurement,
    out: &mut dyn Write,
) -> Result<(StepRecord, Option<Error>, Option<crate::report::Environment>)> {
    let mut runs = Vec::new();
    // Per rail, every repeat's results; the last repeat's rail records name the rails.
    let mut rail_runs: Vec<Vec<Vec<crate::report::SizeResult>>> = Vec::new();
    let mut rails: Vec<crate::report::RailResult> = Vec::new();
    let mut environment = None;
    let mut failure = None;
    for r in 0..m.repeat {
        if m.repeat > 1 {
            writeln!(out, "--- {name}: run {}/{} ---", r + 1, m.repeat).map_err(io)?;
            out.flush().map_err(io)?;
        }
        // A failed rail still brings the other rails' figures; an interrupted run, what it
        // measured before the signal.
        let (result, error) = runner::client_keeping(&plan.peer, &m.spec, &plan.options(m.cpu_util));
        if let Some(result) = result {
            environment.get_or_insert(result.environment.clone());
            if !result.results.is_empty() {
                runs.push(result.results);
            }
            rail_runs.resize(result.rails.len(), Vec::new());
            for (i, rail) in result.rails.iter().enumerate() {
                rail_runs[i].push(rail.results.clone());
            }
            if !result.rails.is_empty() {
                rails = result.rails;
            }
        }
        if let Some(e) = error {
            writeln!(out, "rdmabench: step \"{name}\" failed: {e}").map_err(io)?;
            failure = Some(e);
            break;
        }
    }
    let stats = metrics::gather(&runs);
    let rail_steps: Vec<doc::RailStep> = rails.iter().zip(rail_runs).map(|(r, runs)| doc::rail_step(r, runs)).collect();
    let figures: Vec<metrics::RailFigures> = if rail_steps.is_empty() {
        vec![metrics::RailFigures {
            rail: 0,
            device: environment.as_ref().map_or("", |e| e.device.as_str()),
            stats: &stats,
            link_rate_gbps: environment.as_ref().and_then(|e| e.link_rate_gbps),
            counters: environment.as_ref().map_or(&[], |e| e.counters.as_slice()),
        }]
    } else {
        rail_steps
            .iter()
            .map(|r| metrics::RailFigures {
                rail: r.rail,
                device: &r.device,
                stats: &r.stats,
                link_rate_gbps: r.link_rate_gbps,
                counters: &r.counters,
            })
            .collect()
    };
    let thresholds = metrics::judge(&m.thresholds, &figures);
    for t in &thresholds {
        writeln!(out, "  threshold {}: {}", t.threshold.key, t.describe()).map_err(io)?;
    }
    let ok = failure.is_none() && thresholds.iter().all(|t| t.pass);
    let record = StepRecord {
        name: name.into(),
        kind: "measure".into(),
        spec: Some(m.spec.clone()),
        repeat: m.repeat,
        runs,
        stats,
        thresholds,
        tolerance: m.tolerance.clone(),
        checks: Vec::new(),
        rails: rail_steps,
        error: failure.as_ref().map(|e| e.message()),
        verdict: if ok { "pass" } else { "fail" }.into(),
        duration_s: 0.0,
    };
    Ok((record, failure, environment))
}

/// One line per step, then the verdict as the closing line (what a user or a log scraper
/// reads last).
fn summary(doc: &RunDocument, out: &mut dyn Write) -> Result<()> {
    writeln!(out, "\n=== workload {}: every step ===", doc.workload).map_err(io)?;
    for s in &doc.steps {
        let thresholds = s.thresholds.len();
        let failed = s.thresholds.iter().filter(|t| !t.pass).count();
        let detail = match (&s.error, thresholds) {
            (Some(e), _) => format!("error: {e}"),
            (None, 0) if s.kind == "validate" => format!("{} checks", s.checks.len()),
            (None, 0) => "no thresholds".into(),
            (None, n) => format!("{}/{n} thresholds met", n - failed),
        };
        writeln!(out, "{:<5} {:<40} {detail} ({:.1} s)", s.verdict.to_uppercase(), s.name, s.duration_s).map_err(io)?;
    }
    writeln!(out, "=== workload {}: {} ===", doc.workload, doc.verdict.to_uppercase()).map_err(io)
}

/// One test case per step and one per threshold.
pub fn junit_cases(doc: &RunDocument) -> Vec<junit::Case> {
    let mut cases = Vec::new();
    for s in &doc.steps {
        let outcome = match (&s.error, s.passed()) {
            (Some(e), _) => junit::Outcome::Failed(e.clone()),
            (None, true) => junit::Outcome::Passed,
            (None, false) if s.kind == "validate" => junit::Outcome::Failed(
                s.checks
                    .iter()
                    .filter(|c| c.status == crate::validate::checks::Status::Fail)
                    .map(|c| format!("{} {}: {}", c.id, c.subject, c.seen))
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
            (None, false) => junit::Outcome::Failed("a threshold was not met".into()),
        };
        cases.push(junit::Case {
            name: s.name.clone(),
            classname: format!("{}.step", doc.workload),
            outcome,
            output: String::new(),
            seconds: s.duration_s,
        });
        for t in &s.thresholds {
            cases.push(junit::Case {
                name: format!(
                    "{}: {}{} at {} B",
                    s.name,
                    t.threshold.key,
                    t.rail.map_or(String::new(), |r| format!(" on rail {r}")),
                    t.size
                ),
                classname: format!("{}.threshold", doc.workload),
                outcome: if t.pass { junit::Outcome::Passed } else { junit::Outcome::Failed(t.describe()) },
                output: t.describe(),
                seconds: 0.0,
            });
        }
    }
    cases
}
