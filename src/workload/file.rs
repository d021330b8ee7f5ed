//! Workload files (`workloads/*.toml`): a name, optional `[params]` that thresholds refer
//! to as `"$name"`, and `[[step]]`s, each a `validate` step (a profile) or a measurement
//! (any test, with the flags' workload names) with optional `[step.thresholds]`,
//! `repeat` and per-metric `[step.tolerance]` for comparisons.
//!
//! Every error names the file, the line and the key: unknown keys and wrong types come
//! from the TOML decoder (its span gives the line), impossible values from our checks (the
//! key's line is found in the step's text).

use std::collections::BTreeMap;
use std::ops::Range;

use clap::ValueEnum;
use serde::Deserialize;
use toml::Spanned;

use crate::error::{Error, Result};
use crate::report::metrics::{self, Threshold};
use crate::spec::{AtomicOp, FabricOptions, Field, Notify, Options, TESTS, TestSpec, Transport};
use crate::units::Bytes;
use crate::validate::profiles::ProfileName;

#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub name: String,
    pub description: String,
    pub file: String,
    pub steps: Vec<Step>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub name: String,
    pub kind: StepKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum StepKind {
    Validate { profile: ProfileName, expect_nics: Option<u32>, expect_gpus: Option<u32> },
    Measure(Box<Measurement>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    pub spec: TestSpec,
    pub repeat: u32,
    pub cpu_util: bool,
    pub thresholds: Vec<Threshold>,
    /// Per-metric tolerance for comparisons, in percent.
    pub tolerance: BTreeMap<String, f64>,
}

/// A threshold's value: a number, a percentage (`"90%"`, for the rail thresholds), or
/// `"$param"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Limit {
    Number(f64),
    Param(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorkload {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    params: BTreeMap<String, f64>,
    #[serde(default)]
    step: Vec<Spanned<RawStep>>,
}

/// Every key a step takes, as `RawStep` names them (a unit test holds the two together):
/// docs/workloads.md's generated table lists each.
pub const STEP_KEYS: &[&str] = &[
    "name",
    "validate",
    "expect_nics",
    "expect_gpus",
    "test",
    "size",
    "sizes",
    "all",
    "iterations",
    "duration",
    "transport",
    "qps",
    "threads",
    "tx_depth",
    "rx_depth",
    "cq_mod",
    "post_list",
    "inline",
    "mtu",
    "bidirectional",
    "events",
    "with_imm",
    "atomic_op",
    "outstanding_reads",
    "validate_data",
    "rdma_cm",
    "cpu_util",
    "capacity",
    "batch",
    "notify",
    "tclass",
    "sl",
    "flow_label",
    "hop_limit",
    "qp_timeout",
    "retry_count",
    "rnr_retry",
    "warmup",
    "interval",
    "relaxed_ordering",
    "hugepages",
    "odp",
    "wait",
    "repeat",
    "thresholds",
    "max_counters",
    "tolerance",
];

/// The step keys a test flag does not mirror one to one, with what each means (the others
/// mean what their flag's help says).
pub const OWN_STEP_KEYS: &[(&str, &str)] = &[
    ("name", "the step's name in reports and JUnit (required)"),
    ("validate", "makes the step a validation: the profile to check, as `validate --profile`"),
    ("expect_nics", "with `validate`: the RDMA devices the pod must have, as `validate --expect-nics`"),
    ("expect_gpus", "with `validate`: the GPUs the pod must have, as `validate --expect-gpus`"),
    ("test", "makes the step a measurement: the test, as its command is named (`write-bw`, `ring-lat`, ...)"),
    ("sizes", "several message sizes, each measured in turn: a list of `size` values (`-s` takes one)"),
    ("all", "every size from 2 B to 8 MiB, as `-a`"),
    ("relaxed_ordering", "`false` registers the buffers without relaxed ordering, as `--no-relaxed-ordering`"),
    ("repeat", "runs the step N times, 1 to 100; its thresholds judge the median of the runs"),
    ("thresholds", "a table: the limits the step is judged by (below)"),
    ("max_counters", "a table: the most events of a port counter a size may have (below)"),
    ("tolerance", "a table: percent per metric that `compare` allows (below)"),
];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStep {
    name: String,
    validate: Option<String>,
    expect_nics: Option<u32>,
    expect_gpus: Option<u32>,
    test: Option<String>,
    size: Option<Bytes>,
    sizes: Option<Vec<Bytes>>,
    all: Option<bool>,
    iterations: Option<u64>,
    duration: Option<f64>,
    transport: Option<Transport>,
    qps: Option<u32>,
    threads: Option<u32>,
    tx_depth: Option<u32>,
    rx_depth: Option<u32>,
    cq_mod: Option<u32>,
    post_list: Option<u32>,
    inline: Option<Bytes>,
    mtu: Option<Bytes>,
    bidirectional: Option<bool>,
    events: Option<bool>,
    with_imm: Option<bool>,
    atomic_op: Option<AtomicOp>,
    outstanding_reads: Option<u32>,
    validate_data: Option<bool>,
    rdma_cm: Option<bool>,
    cpu_util: Option<bool>,
    capacity: Option<Bytes>,
    batch: Option<u32>,
    notify: Option<Notify>,
    tclass: Option<u32>,
    sl: Option<u32>,
    flow_label: Option<u32>,
    hop_limit: Option<u32>,
    qp_timeout: Option<u32>,
    retry_count: Option<u32>,
    rnr_retry: Option<u32>,
    warmup: Option<u64>,
    interval: Option<f64>,
    relaxed_ordering: Option<bool>,
    hugepages: Option<bool>,
    odp: Option<bool>,
    wait: Option<crate::spec::ring::Wait>,
    repeat: Option<u32>,
    thresholds: Option<BTreeMap<String, Limit>>,
    max_counters: Option<BTreeMap<String, f64>>,
    tolerance: Option<BTreeMap<String, f64>>,
}

struct Source<'a> {
    file: &'a str,
    text: &'a str,
}

impl Source<'_> {
    fn line_of(&self, offset: usize) -> usize {
        self.text[..offset.min(self.text.len())].matches('\n').count() + 1
    }

    /// The line of `key = ...` inside `span` (a step's text), or the step's first line.
    fn key_line(&self, span: &Range<usize>, key: &str) -> usize {
        let region = &self.text[span.start.min(self.text.len())..span.end.min(self.text.len())];
        let mut offset = span.start;
        for line in region.split_inclusive('\n') {
            let t = line.trim_start();
            if t.strip_prefix(key).is_some_and(|rest| rest.trim_start().starts_with('=')) {
                return self.line_of(offset);
            }
            offset += line.len();
        }
        self.line_of(span.start)
    }

    fn error(&self, line: usize, key: &str, step: &str, msg: &str) -> Error {
        Error::Usage(format!("{}:{line}: key `{key}` in step \"{step}\": {msg}", self.file))
    }
}

/// Reads and checks a workload file. `overrides` replace `[params]` values (`--param`).
pub fn load(path: &str, overrides: &BTreeMap<String, f64>) -> Result<Workload> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Usage(format!("cannot read workload {path}: {e}; see workloads/ for the shipped ones")))?;
    parse(&text, path, overrides)
}

/// Reads and checks a workload's text; its errors quote the file, made safe to print.
pub fn parse(text: &str, file: &str, overrides: &BTreeMap<String, f64>) -> Result<Workload> {
    parse_quoting(text, file, overrides).map_err(Error::quoting)
}

fn parse_quoting(text: &str, file: &str, overrides: &BTreeMap<String, f64>) -> Result<Workload> {
    let src = Source { file, text };
    let raw: RawWorkload = toml::from_str(text).map_err(|e| decode_error(&src, &e))?;
    let mut params = raw.params.clone();
    for (k, v) in overrides {
        if !params.contains_key(k) {
            let known = raw.params.keys().cloned().collect::<Vec<_>>().join(", ");
            return Err(Error::Usage(format!(
                "--param {k}: {file} has no such parameter; its [params] are: {}",
                if known.is_empty() { "none".into() } else { known }
            )));
        }
        params.insert(k.clone(), *v);
    }
    if raw.step.is_empty() {
        return Err(Error::Usage(format!("{file}: no [[step]]; a workload needs at least one step")));
    }
    let mut steps = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    for (i, spanned) in raw.step.iter().enumerate() {
        // A step's text runs from its `[[step]]` header to the next one.
        let end = raw.step.get(i + 1).map_or(text.len(), |next| next.span().start);
        let span = spanned.span().start..end;
        let s = spanned.get_ref();
        if !names.insert(s.name.clone()) {
            let line = src.key_line(&span, "name");
            return Err(src.error(
                line,
                "name",
                &s.name,
                "two steps share this name; names identify steps in comparisons",
            ));
        }
        steps.push(step(&src, &span, s, &params)?);
    }
    Ok(Workload { name: raw.name, description: raw.description, file: file.into(), steps })
}

/// A decoder error as `file:line: key `k`: message`.
fn decode_error(src: &Source, e: &toml::de::Error) -> Error {
    let Some(span) = e.span() else {
        return Error::Usage(format!("{}: {}", src.file, e.message()));
    };
    let line_no = src.line_of(span.start);
    let line = src.text.lines().nth(line_no - 1).unwrap_or("");
    let key = line.split('=').next().map(str::trim).filter(|k| !k.is_empty() && !k.starts_with('['));
    let msg = e.message().trim();
    match key {
        Some(k) if line.contains('=') => Error::Usage(format!("{}:{line_no}: key `{k}`: {msg}", src.file)),
        _ => Error::Usage(format!("{}:{line_no}: {msg}", src.file)),
    }
}

fn step(src: &Source, span: &Range<usize>, s: &RawStep, params: &BTreeMap<String, f64>) -> Result<Step> {
    let err = |key: &str, msg: &str| src.error(src.key_line(span, key), key, &s.name, msg);
    match (&s.validate, &s.test) {
        (Some(_), Some(_)) => {
            return Err(err("validate", "a step either validates or measures: drop `test` or `validate`"));
        }
        (None, None) => {
            return Err(err(
                "name",
                "the step has neither `test = \"write-bw\"` (a measurement) nor `validate = \"PROFILE\"`",
            ));
        }
        (Some(profile), None) => {
            let profile = ProfileName::from_str(profile, false).map_err(|_| {
                let names: Vec<String> = ProfileName::value_variants()
                    .iter()
                    .map(|v| v.to_possible_value().unwrap().get_name().to_string())
                    .collect();
                err("validate", &format!("unknown profile {profile:?}; use one of {}", names.join(", ")))
            })?;
            return Ok(Step {
                name: s.name.clone(),
                kind: StepKind::Validate { profile, expect_nics: s.expect_nics, expect_gpus: s.expect_gpus },
            });
        }
        (None, Some(_)) => {}
    }
    let test = s.test.as_deref().expect("checked above");
    let &(_, operation, measure) = TESTS.iter().find(|t| t.0 == test).ok_or_else(|| {
        err(
            "test",
            &format!("unknown test {test:?}; use one of {}", TESTS.iter().map(|t| t.0).collect::<Vec<_>>().join(", ")),
        )
    })?;
    if s.expect_nics.is_some() || s.expect_gpus.is_some() {
        let key = if s.expect_nics.is_some() { "expect_nics" } else { "expect_gpus" };
        return Err(err(key, "applies to validate steps only"));
    }
    let sizes = match (s.size, &s.sizes, s.all) {
        (Some(_), Some(_), _) | (Some(_), _, Some(true)) | (_, Some(_), Some(true)) => {
            return Err(err("size", "give one of `size`, `sizes` or `all = true`"));
        }
        (Some(x), None, _) => Some(vec![x.0]),
        (None, Some(v), _) if v.is_empty() => return Err(err("sizes", "an empty list; give at least one size")),
        (None, Some(v), _) => Some(v.iter().map(|b| b.0).collect()),
        (None, None, Some(true)) => Some(TestSpec::sweep_sizes()),
        (None, None, _) => None,
    };
    if s.iterations.is_some() && s.duration.is_some() {
        return Err(err("duration", "give `iterations` or `duration`, not both"));
    }
    let options = Options {
        transport: s.transport,
        with_imm: s.with_imm.unwrap_or(false),
        atomic_op: s.atomic_op,
        rx_depth: s.rx_depth,
        outstanding_reads: s.outstanding_reads,
        sizes,
        iterations: s.iterations,
        duration: s.duration,
        tx_depth: s.tx_depth,
        cq_mod: s.cq_mod,
        post_list: s.post_list,
        qps: s.qps,
        threads: s.threads,
        bidirectional: s.bidirectional.unwrap_or(false),
        events: s.events.unwrap_or(false),
        inline_size: s.inline.map(|b| b.to_u32()).transpose().map_err(|m| err("inline", &m))?,
        mtu: s.mtu.map(|b| b.to_u32()).transpose().map_err(|m| err("mtu", &m))?,
        validate_data: s.validate_data.unwrap_or(false),
        rdma_cm: s.rdma_cm.unwrap_or(false),
        profile: None,
        corrupt_at: None,
        capacity: s.capacity.map(|b| b.0),
        batch: s.batch,
        notify: s.notify,
        warmup: s.warmup,
        interval: s.interval,
        no_relaxed_ordering: !s.relaxed_ordering.unwrap_or(true),
        hugepages: s.hugepages.unwrap_or(false),
        odp: s.odp.unwrap_or(false),
        wait: s.wait,
        fabric: FabricOptions {
            traffic_class: s.tclass,
            service_level: s.sl,
            flow_label: s.flow_label,
            hop_limit: s.hop_limit,
            qp_timeout: s.qp_timeout,
            retry_count: s.retry_count,
            rnr_retry: s.rnr_retry,
        },
    };
    let spec = options.spec(operation, measure);
    spec.check_named(Field::key).map_err(|r| err(r.field.key(), &r.message))?;
    let repeat = s.repeat.unwrap_or(1);
    if repeat == 0 || repeat > 100 {
        return Err(err("repeat", &format!("repeat = {repeat} is out of range; use 1..=100")));
    }
    let mut thresholds = Vec::new();
    for (key, limit) in s.thresholds.iter().flatten() {
        let value = match limit {
            Limit::Number(v) => *v,
            Limit::Param(p) if p.ends_with('%') && !p.starts_with('$') => p
                .trim_end_matches('%')
                .trim()
                .parse::<f64>()
                .map_err(|_| err(key, &format!("{p:?} is not a percentage like \"90%\"")))?,
            Limit::Param(p) => {
                let name = p.strip_prefix('$').ok_or_else(|| {
                    err(key, &format!("{p:?} is neither a number, a percentage (\"90%\") nor a parameter reference like \"$min_gbps\""))
                })?;
                *params.get(name).ok_or_else(|| {
                    err(key, &format!("parameter {name:?} is not defined in [params] (nor given with --param)"))
                })?
            }
        };
        thresholds.push(Threshold::parse(key, value).map_err(|m| err(key, &m))?);
    }
    for (name, limit) in s.max_counters.iter().flatten() {
        thresholds.push(Threshold::counter(name, *limit).map_err(|m| err(name, &m))?);
    }
    let mut tolerance = BTreeMap::new();
    for (metric, pct) in s.tolerance.iter().flatten() {
        if metrics::better(metric).is_none() {
            let names: Vec<&str> = metrics::METRICS.iter().map(|m| m.0).collect();
            return Err(err(metric, &format!("unknown metric; tolerances apply to {}", names.join(", "))));
        }
        if !(pct.is_finite() && *pct >= 0.0 && *pct <= 1000.0) {
            return Err(err(metric, &format!("tolerance {pct} % is out of range; use 0..=1000 (percent)")));
        }
        tolerance.insert(metric.clone(), *pct);
    }
    Ok(Step {
        name: s.name.clone(),
        kind: StepKind::Measure(Box::new(Measurement {
            spec,
            repeat,
            cpu_util: s.cpu_util.unwrap_or(false),
            thresholds,
            tolerance,
        })),
    })
}
