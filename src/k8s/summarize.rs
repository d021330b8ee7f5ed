//! `rdmabench summarize`: the `RDMABENCH_RESULT {...}` lines a fleet's pods print (as
//! collected by `kubectl logs`), one row per measured link: failing and missing pairs
//! first, then the slowest links first (lowest bandwidth, then highest latency).

use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};

use super::fleet::{self, Topology};
use crate::error::{Error, Result};
use crate::fleet::attribution::Thresholds;
use crate::fleet::output;
use crate::fleet::rows::{self, Expected};
use crate::fleet::schedule::Plan;
use crate::report::pairs::{LEFT_MARK, LeftRow, PAIR_MARK, PairError, PairRow, RowSource, SERVED_MARK, ServedRow};
use crate::report::run::RunDocument;
use crate::units::Sig;

/// One pod's line.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodResult {
    pub pod: u32,
    pub peer: u32,
    /// The pod's node name; a log line is foreign text, so it is kept defused.
    #[serde(default, with = "crate::names::wire")]
    pub node: String,
    pub exit: i32,
    pub run: Option<RunDocument>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Link {
    pub pod: u32,
    pub peer: u32,
    pub node: String,
    pub peer_node: String,
    /// The first bandwidth figure of the run (median, Gb/s).
    pub gbps: Option<f64>,
    /// The first latency figure (p50 median, us).
    pub p50_us: Option<f64>,
    pub ok: bool,
    /// Why a link failed: its exit code and failed steps, or "no result".
    pub problem: Option<String>,
    /// With several rails: each rail of the link.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rails: Vec<Rail>,
}

/// One rail of a link: this pod's device against its peer's device of the same index.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rail {
    pub pod: u32,
    pub peer: u32,
    pub node: String,
    pub rail: u32,
    pub device: String,
    pub peer_device: String,
    /// The rail's first bandwidth figure (median, Gb/s).
    pub gbps: Option<f64>,
    /// The rail's first latency figure (p50 median, us).
    pub p50_us: Option<f64>,
    pub ok: bool,
    /// The steps where this rail failed or missed a threshold, and why.
    pub problem: Option<String>,
}

const MARK: &str = "RDMABENCH_RESULT ";

/// The record a fleet pod prints for `summarize` (`rdmabench k8s result`): its index, its
/// peer's, this host's node name (defused, whatever the kernel calls it: a hostNetwork
/// pod has the node's own name), the workload's exit code and its run document, as one
/// line of JSON that no name or document can break.
pub fn result_line(pod: u32, peer: u32, exit: i32, run: Option<serde_json::Value>) -> String {
    let record = serde_json::json!({
        "pod": pod,
        "peer": peer,
        "node": crate::names::this_host(),
        "exit": exit,
        "run": run,
    });
    format!("{MARK}{record}")
}

/// Whether `prefix` is what `kubectl logs` may put before a pod's line: nothing, a
/// `--timestamps` time, a `--prefix` `[pod/NAME/CONTAINER]`. A marker after anything else
/// is text some program printed (a peer's message quoted in a log), not a result record.
fn log_prefix(prefix: &str) -> bool {
    prefix.split_whitespace().all(|t| {
        (t.starts_with('[') && t.ends_with(']'))
            || (t.starts_with(|c: char| c.is_ascii_digit()) && t.contains('T') && t.contains(':'))
    })
}

/// Every result record in the logs: a line that is the marker and one whole JSON record,
/// after at most a `kubectl logs` prefix. A marker elsewhere in a line is refused, and so
/// is a second record for the same (pod, peer): logs collected twice, or a forged line.
pub fn parse(reader: impl BufRead) -> Result<Vec<PodResult>> {
    records(reader, MARK, |r: &PodResult| (r.pod, r.peer, 0, false), "result for pod {0} -> pod {1}")
}

/// A line of a log that carries one of the marks: a record (which mark, and the JSON text
/// after it), or why it is not one.
enum Marked<'a> {
    Record {
        mark: usize,
        json: &'a str,
    },
    /// The mark after other text than a `kubectl logs` prefix: a program's message quoting
    /// a record (a peer's error), not a record.
    Quoted {
        mark: usize,
        before: String,
    },
}

/// Every line of `reader` that carries one of `marks` (the first of them on the line), with
/// its line number (from 1).
fn each_marked(reader: &mut dyn BufRead, marks: &[&str], mut f: impl FnMut(usize, Marked) -> Result<()>) -> Result<()> {
    let mut line = String::new();
    for n in 1usize.. {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => return Err(Error::Usage(format!("cannot read the logs: {e}"))),
        }
        let text = line.trim_end_matches(['\n', '\r']);
        let found = marks.iter().enumerate().filter_map(|(k, m)| text.find(m).map(|at| (at, k))).min();
        let Some((at, mark)) = found else { continue };
        let prefix = &text[..at];
        let marked = if log_prefix(prefix) {
            Marked::Record { mark, json: &text[at + marks[mark].len()..] }
        } else {
            Marked::Quoted { mark, before: prefix.chars().take(60).collect() }
        };
        f(n, marked)?;
    }
    Ok(())
}

/// Records whose keys no two may share: a second one means logs collected twice or a
/// forged line. `what` names a record, with {0} and {1} the key's first two parts.
struct Unique {
    seen: std::collections::HashMap<(u32, u32, u32, bool), String>,
}

impl Unique {
    fn new() -> Unique {
        Unique { seen: std::collections::HashMap::new() }
    }

    fn insert(&mut self, key: (u32, u32, u32, bool), at: String, what: &str) -> Result<()> {
        match self.seen.insert(key, at.clone()) {
            None => Ok(()),
            Some(first) => {
                let what = what.replace("{0}", &key.0.to_string()).replace("{1}", &key.1.to_string());
                Err(Error::Usage(format!(
                    "{at}: a second {what} (the first is on {first}): the logs hold it twice (collected twice?) or a \
                     line is forged"
                )))
            }
        }
    }
}

/// The records after `mark` in the logs, each with a `key` that no two may share (the
/// message names it by `what`, with {0} and {1} its first two parts). Strict: a line with
/// the mark that is not a whole record is an error.
fn records<T: serde::de::DeserializeOwned>(
    mut reader: impl BufRead,
    mark: &str,
    key: impl Fn(&T) -> (u32, u32, u32, bool),
    what: &str,
) -> Result<Vec<T>> {
    let mut out: Vec<T> = Vec::new();
    let mut unique = Unique::new();
    each_marked(&mut reader, &[mark], |n, marked| match marked {
        Marked::Quoted { before, .. } => Err(Error::Usage(format!(
            "line {n}: {mark}after other text ({before:?}): not a result record of a pod; summarize reads `kubectl \
             logs` output, optionally with --timestamps or --prefix"
        ))),
        Marked::Record { json, .. } => {
            let r: T = serde_json::from_str(json)
                .map_err(|e| Error::Usage(format!("line {n}: a malformed {mark}line: {e}")).quoting())?;
            unique.insert(key(&r), format!("line {n}"), what)?;
            out.push(r);
            Ok(())
        }
    })?;
    Ok(out)
}

/// Reads every log of `paths` (`-`: stdin) with `parse`.
fn read_logs<T>(paths: &[String], parse: impl Fn(&mut dyn BufRead) -> Result<Vec<T>>) -> Result<Vec<T>> {
    let mut all = Vec::new();
    each_log(paths, |_, r| {
        all.extend(parse(r)?);
        Ok(())
    })?;
    Ok(all)
}

/// Opens each of `paths` (`-`: stdin, which can be read once) and hands it to `f` with the
/// name messages give it.
fn each_log(paths: &[String], mut f: impl FnMut(&str, &mut dyn BufRead) -> Result<()>) -> Result<()> {
    if paths.iter().filter(|p| *p == "-").count() > 1 {
        return Err(Error::Usage("`-` (stdin) is given twice; a pipe can be read only once: give it once".into()));
    }
    for p in paths {
        if p == "-" {
            f("stdin", &mut std::io::stdin().lock())?;
        } else {
            let file = std::fs::File::open(p).map_err(|e| Error::Usage(format!("cannot read {p}: {e}")))?;
            f(p, &mut std::io::BufReader::new(file))?;
        }
    }
    Ok(())
}

/// A fleet's records in its logs, read once (a pipe gives its text once): every pair's
/// row and every server's record. A line with a mark that cannot be read (cut short,
/// garbled, quoted inside another message, or naming a node outside the plan) is skipped
/// and said why, with its file and line; the same record twice is an error.
#[derive(Default)]
struct FleetLogs {
    rows: Vec<PairRow>,
    served: Vec<ServedRow>,
    left: Vec<LeftRow>,
    /// One line per skipped line: where, and why.
    skipped: Vec<String>,
}

fn fleet_logs(paths: &[String], nodes: u32) -> Result<FleetLogs> {
    let mut logs = FleetLogs::default();
    let (mut rows, mut served) = (Unique::new(), Unique::new());
    let marks = [PAIR_MARK, SERVED_MARK, LEFT_MARK];
    each_log(paths, |name, reader| {
        each_marked(reader, &marks, |n, marked| {
            let at = format!("{name} line {n}");
            let json = match marked {
                Marked::Quoted { mark, before } => {
                    let mark = marks[mark].trim_end();
                    logs.skipped.push(format!("{at}: {mark} after other text ({before:?}), not a record"));
                    return Ok(());
                }
                Marked::Record { mark, json } => (mark, json),
            };
            // The decoder's message can quote the line: bounded and escaped.
            let skip = |why: String| crate::names::quoting_error(&format!("{at}: {why}"));
            match json {
                (0, text) => match serde_json::from_str::<PairRow>(text).map_err(|e| e.to_string()).and_then(|r| {
                    r.check(nodes)?;
                    Ok(r)
                }) {
                    Ok(r) => {
                        let key = (r.client, r.server, r.step, r.source == RowSource::Coordinator);
                        rows.insert(key, at, "pair {0} -> {1} of one step")?;
                        logs.rows.push(r);
                    }
                    Err(e) => logs.skipped.push(skip(format!("an unreadable {PAIR_MARK}line: {e}"))),
                },
                (2, text) => match serde_json::from_str::<LeftRow>(text).map_err(|e| e.to_string()).and_then(|l| {
                    l.check(nodes)?;
                    Ok(l)
                }) {
                    Ok(l) if logs.left.iter().any(|x| x.node == l.node) => {
                        return Err(Error::Usage(format!("{at}: a second departure of node {}", l.node)));
                    }
                    Ok(l) => logs.left.push(l),
                    Err(e) => logs.skipped.push(skip(format!("an unreadable {LEFT_MARK}line: {e}"))),
                },
                (_, text) => match serde_json::from_str::<ServedRow>(text).map_err(|e| e.to_string()).and_then(|s| {
                    s.check(nodes)?;
                    Ok(s)
                }) {
                    Ok(s) => {
                        served.insert((s.client, s.server, s.step, false), at, "served pair {0} -> {1} of one step")?;
                        logs.served.push(s);
                    }
                    Err(e) => logs.skipped.push(skip(format!("an unreadable {SERVED_MARK}line: {e}"))),
                },
            }
            Ok(())
        })
    })?;
    Ok(logs)
}

/// `summarize --fleet all-pairs`: every pair's `RDMABENCH_PAIR` line from the pods' logs
/// (a pair the plan has and no log does is a failed pair), the bad nodes and links named,
/// and with `out` the matrices, verdict, heat map and summary written there. Err (exit 1)
/// when anything is bad.
pub fn all_pairs(
    paths: &[String],
    plan: &Plan,
    t: &Thresholds,
    out_dir: Option<&std::path::Path>,
    json: bool,
    out: &mut dyn Write,
) -> Result<()> {
    plan.check().map_err(Error::Usage)?;
    let logs = fleet_logs(paths, plan.nodes)?;
    for why in &logs.skipped {
        eprintln!("rdmabench: skipped {why}");
    }
    let skipped = logs.skipped.len();
    let mut rows = logs.rows;
    if rows.is_empty() {
        return Err(Error::Usage(format!(
            "no {PAIR_MARK}lines in {}; pass every pod's log (kubectl logs -l batch.kubernetes.io/job-name=JOB --tail=-1)",
            paths.join(", ")
        )));
    }
    rows::join_served(&mut rows, logs.served);
    let replaced = rows::prefer_measured(&mut rows);
    if replaced > 0 {
        eprintln!(
            "rdmabench: {replaced} pair(s) have the measuring node's own row and the coordinator's failed one (the node \
             left before reporting it): the node's own is kept"
        );
    }
    let expected: Vec<Expected> = plan
        .steps()
        .iter()
        .flat_map(|s| s.pairs.iter().map(|&pair| Expected { step: s.index, round: s.round, retest: None, pair }))
        .collect();
    let why = "no result in the logs (the pod was lost, or its log was not collected)";
    let missing =
        rows::missing(rows.iter().map(rows::key), &expected, |e| PairError::node_left(e.pair.client, why.to_string()));
    rows.extend(missing);
    let a = rows::judge_with_departures(plan.nodes, &rows, &logs.left, t);
    if let Some(dir) = out_dir {
        for f in output::write_all(dir, plan.nodes, &rows, &a, t, skipped)? {
            eprintln!("rdmabench: wrote {f}");
        }
    }
    let text = if json {
        output::verdict_json(plan.nodes, &rows, &a, t, skipped)
    } else {
        output::summary_md(plan.nodes, &rows, &a, t, skipped)
    };
    out.write_all(text.as_bytes()).map_err(|e| Error::Environment(format!("cannot write: {e}")))?;
    crate::fleet::verdict_of(&a)
}

fn first_metric(run: &RunDocument, metric: &str) -> Option<f64> {
    run.steps.iter().flat_map(|s| s.stats.iter()).find_map(|s| s.metrics.get(metric).map(|m| m.median))
}

/// Every rail of a pod's run: its figures from the first step that measured each, and the
/// steps where it stopped or missed one of its thresholds.
fn rails_of(r: &PodResult) -> Vec<Rail> {
    let Some(run) = &r.run else { return Vec::new() };
    let steps: Vec<_> = run.steps.iter().filter(|s| s.kind == "measure").collect();
    let count = steps.iter().map(|s| s.rails.len()).max().unwrap_or(0);
    (0..count as u32)
        .map(|i| {
            let mine: Vec<_> =
                steps.iter().filter_map(|s| s.rails.iter().find(|x| x.rail == i).map(|x| (*s, x))).collect();
            let figure = |metric: &str| {
                mine.iter().flat_map(|(_, x)| x.stats.iter()).find_map(|st| st.metrics.get(metric).map(|m| m.median))
            };
            let mut problems = Vec::new();
            for (step, x) in &mine {
                if let Some(e) = &x.error {
                    problems.push(format!("{}: {e}", step.name));
                }
                for t in step.thresholds.iter().filter(|t| t.rail == Some(i) && !t.pass) {
                    problems.push(format!("{}: {}", step.name, t.describe()));
                }
            }
            let (device, peer_device) =
                mine.first().map_or((String::new(), String::new()), |(_, x)| (x.device.clone(), x.peer_device.clone()));
            Rail {
                pod: r.pod,
                peer: r.peer,
                node: r.node.clone(),
                rail: i,
                device,
                peer_device,
                gbps: figure("gbps"),
                p50_us: figure("p50_us"),
                ok: problems.is_empty(),
                problem: (!problems.is_empty()).then(|| problems.join("; ")),
            }
        })
        .collect()
}

/// Every rail of every link, failing first, then slowest first.
pub fn ranked_rails(rows: &[Link]) -> Vec<&Rail> {
    let mut rails: Vec<&Rail> = rows.iter().flat_map(|l| l.rails.iter()).collect();
    rails.sort_by(|a, b| {
        a.ok.cmp(&b.ok)
            .then(a.gbps.unwrap_or(f64::MAX).total_cmp(&b.gbps.unwrap_or(f64::MAX)))
            .then(b.p50_us.unwrap_or(0.0).total_cmp(&a.p50_us.unwrap_or(0.0)))
            .then((a.pod, a.rail).cmp(&(b.pod, b.rail)))
    });
    rails
}

/// The links, failing first, then slowest first. With `expected` pairs, missing ones
/// are failing rows too.
pub fn links(results: &[PodResult], expected: Option<&[(u32, u32)]>) -> Vec<Link> {
    let mut rows: Vec<Link> = results
        .iter()
        .map(|r| {
            let failed_steps: Vec<&str> =
                r.run.iter().flat_map(|d| d.steps.iter().filter(|s| !s.passed()).map(|s| s.name.as_str())).collect();
            let ok = r.exit == 0 && r.run.is_some();
            let problem = (!ok).then(|| {
                let steps = if failed_steps.is_empty() {
                    String::new()
                } else {
                    format!(", failed: {}", failed_steps.join(", "))
                };
                format!("exit {}{steps}", r.exit)
            });
            Link {
                pod: r.pod,
                peer: r.peer,
                node: r.node.clone(),
                peer_node: r
                    .run
                    .as_ref()
                    .and_then(|d| d.environment.as_ref())
                    .map_or(String::new(), |e| e.peer.host.clone()),
                gbps: r.run.as_ref().and_then(|d| first_metric(d, "gbps")),
                p50_us: r.run.as_ref().and_then(|d| first_metric(d, "p50_us")),
                ok,
                problem,
                rails: rails_of(r),
            }
        })
        .collect();
    for &(pod, peer) in expected.unwrap_or(&[]) {
        if !rows.iter().any(|l| l.pod == pod && l.peer == peer) {
            rows.push(Link {
                pod,
                peer,
                node: String::new(),
                peer_node: String::new(),
                gbps: None,
                p50_us: None,
                ok: false,
                problem: Some("no result: the pod never printed one (not scheduled, killed, or logs lost)".into()),
                rails: Vec::new(),
            });
        }
    }
    rows.sort_by(|a, b| {
        a.ok.cmp(&b.ok)
            .then(a.gbps.unwrap_or(f64::MAX).total_cmp(&b.gbps.unwrap_or(f64::MAX)))
            .then(b.p50_us.unwrap_or(0.0).total_cmp(&a.p50_us.unwrap_or(0.0)))
            .then(a.pod.cmp(&b.pod))
    });
    rows
}

pub fn print(rows: &[Link], out: &mut dyn Write) -> Result<()> {
    let io = |e: std::io::Error| Error::Environment(format!("cannot write: {e}"));
    writeln!(out, "{:<14} {:<24} {:<24} {:>10} {:>10}  result", "link", "node", "peer node", "Gb/s", "p50 us")
        .map_err(io)?;
    for l in rows {
        let f = |v: Option<f64>| v.map_or("-".to_string(), |v| Sig(v).to_string());
        writeln!(
            out,
            "{:<14} {:<24} {:<24} {:>10} {:>10}  {}",
            format!("{} -> {}", l.pod, l.peer),
            l.node,
            l.peer_node,
            f(l.gbps),
            f(l.p50_us),
            l.problem.as_deref().map_or("ok".to_string(), |p| format!("FAILED: {p}"))
        )
        .map_err(io)?;
    }
    let rails = ranked_rails(rows);
    if !rails.is_empty() {
        writeln!(out, "\nrails, failing and slowest first:").map_err(io)?;
        writeln!(
            out,
            "{:<14} {:<24} {:<6} {:<16} {:<16} {:>10} {:>10}  result",
            "link", "node", "rail", "device", "peer device", "Gb/s", "p50 us"
        )
        .map_err(io)?;
        for r in &rails {
            let f = |v: Option<f64>| v.map_or("-".to_string(), |v| Sig(v).to_string());
            writeln!(
                out,
                "{:<14} {:<24} {:<6} {:<16} {:<16} {:>10} {:>10}  {}",
                format!("{} -> {}", r.pod, r.peer),
                r.node,
                r.rail,
                r.device,
                r.peer_device,
                f(r.gbps),
                f(r.p50_us),
                r.problem.as_deref().map_or("ok".to_string(), |p| format!("FAILED: {p}"))
            )
            .map_err(io)?;
        }
    }
    let failed = rows.iter().filter(|l| !l.ok).count();
    let failed_rails = rails.iter().filter(|r| !r.ok).count();
    if rails.is_empty() {
        writeln!(out, "{} link(s), {failed} failed", rows.len()).map_err(io)
    } else {
        writeln!(out, "{} link(s), {failed} failed; {} rail(s), {failed_rails} failed", rows.len(), rails.len())
            .map_err(io)
    }
}

/// The command: reads `paths` (`-` for stdin), prints the table (or JSON), Err when a
/// link failed or is missing.
pub fn command(paths: &[String], expect: Option<(u32, Topology)>, json: bool, out: &mut dyn Write) -> Result<()> {
    let results = read_logs(paths, |r| parse(r))?;
    let expected = match expect {
        Some((pods, topology)) => Some(fleet::links(pods, topology).map_err(Error::Usage)?),
        None => None,
    };
    if results.is_empty() && expected.is_none() {
        return Err(Error::Usage(format!(
            "no {MARK}lines in {}; pass the pods' logs (kubectl logs -l batch.kubernetes.io/job-name=JOB --tail=-1)",
            paths.join(", ")
        )));
    }
    let rows = links(&results, expected.as_deref());
    if json {
        let text = serde_json::to_string_pretty(&rows).expect("serialisable") + "\n";
        out.write_all(text.as_bytes()).map_err(|e| Error::Environment(format!("cannot write: {e}")))?;
    } else {
        print(&rows, out)?;
    }
    command_on(&rows)
}

/// The verdict over the links: Err naming each failed link and its failed rails.
fn command_on(rows: &[Link]) -> Result<()> {
    let failed: Vec<String> = rows
        .iter()
        .filter(|l| !l.ok)
        .map(|l| {
            let rails: Vec<String> = l
                .rails
                .iter()
                .filter(|r| !r.ok)
                .map(|r| format!("rail {} on {} ({} -> {})", r.rail, r.node, r.device, r.peer_device))
                .collect();
            match rails.is_empty() {
                true => format!("{} -> {}", l.pod, l.peer),
                false => format!("{} -> {} ({})", l.pod, l.peer, rails.join(", ")),
            }
        })
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Error::Check(format!("{} link(s) failed: {}", failed.len(), failed.join(", "))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-step run document whose bandwidth is `g`.
    fn run_doc(exit: i32, g: f64) -> serde_json::Value {
        serde_json::json!({
            "schema": "rdmabench/run", "schema_version": 1, "tool_version": "0.1.0", "workload": "w",
            "workload_file": "w.toml", "finished_unix_s": 0.0, "environment": null, "verdict": "pass",
            "steps": [{"name": "bw", "kind": "measure", "repeat": 1, "verdict": if exit == 0 { "pass" } else { "fail" },
                       "duration_s": 1.0, "stats": [{"size": 65536, "metrics": {"gbps":
                           {"median": g, "min": g, "max": g, "values": [g]}}}]}]
        })
    }

    fn line(pod: u32, peer: u32, exit: i32, gbps: Option<f64>) -> String {
        let run = gbps.map_or("null".to_string(), |g| run_doc(exit, g).to_string());
        format!(
            "2026-12-02T10:00:00Z [pod/x/rdmabench] RDMABENCH_RESULT {{\"pod\":{pod},\"peer\":{peer},\"node\":\"n{pod}\",\"exit\":{exit},\"run\":{run}}}"
        )
    }

    #[test]
    fn a_pods_result_line_reads_back_whatever_its_node_is_called() {
        let text = result_line(3, 4, 1, Some(run_doc(1, 9.0)));
        assert!(!text.contains('\n'), "one line: {text}");
        let back = parse(text.as_bytes()).unwrap();
        assert_eq!((back[0].pod, back[0].peer, back[0].exit), (3, 4, 1));
        assert_eq!(back[0].node, crate::names::this_host());
        assert_eq!(first_metric(back[0].run.as_ref().unwrap(), "gbps"), Some(9.0));
        let none = parse(result_line(0, 1, 3, None).as_bytes()).unwrap();
        assert!(none[0].run.is_none());
        // A line written by hand (an older script) with an odd node name is kept defused.
        let odd = r#"RDMABENCH_RESULT {"pod":0,"peer":1,"node":"a b|c","exit":0,"run":null}"#;
        assert_eq!(parse(odd.as_bytes()).unwrap()[0].node, "a%20b%7Cc");
    }

    #[test]
    fn slowest_first_failures_and_missing_on_top() {
        let logs = [
            "some other log line".to_string(),
            line(0, 1, 0, Some(180.0)),
            line(1, 2, 0, Some(95.5)),
            line(2, 3, 1, Some(40.0)),
            line(4, 0, 0, Some(190.0)),
        ]
        .join("\n");
        let results = parse(logs.as_bytes()).unwrap();
        assert_eq!(results.len(), 4);
        let expected = fleet::links(5, Topology::Ring).unwrap();
        let rows = links(&results, Some(&expected));
        let order: Vec<(u32, u32)> = rows.iter().map(|l| (l.pod, l.peer)).collect();
        assert_eq!(order, [(2, 3), (3, 4), (1, 2), (0, 1), (4, 0)], "failed (slow first), missing, then slowest");
        assert!(rows[0].problem.as_deref().unwrap().contains("exit 1, failed: bw"));
        assert!(rows[1].problem.as_deref().unwrap().contains("no result"));
        let mut out = Vec::new();
        print(&rows, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("2 -> 3") && text.contains("5 link(s), 2 failed"), "{text}");
    }

    #[test]
    fn a_weak_rail_is_named_with_its_node_and_devices_and_ranked_first() {
        let rail = |i: u32, gbps: f64, error: Option<&str>| {
            let mut r = serde_json::json!({"rail": i, "device": format!("mlx5_{i}"), "peer_device": format!("mlx5_{i}"),
                "stats": [{"size": 65536, "metrics": {"gbps": {"median": gbps, "min": gbps, "max": gbps, "values": [gbps]}}}]});
            if let Some(e) = error {
                r["error"] = e.into();
            }
            r
        };
        let run = serde_json::json!({
            "schema": "rdmabench/run", "schema_version": 2, "tool_version": "0.1.0", "workload": "w",
            "workload_file": "w.toml", "finished_unix_s": 0.0, "environment": null, "verdict": "fail",
            "steps": [{"name": "write bandwidth", "kind": "measure", "repeat": 1, "verdict": "fail", "duration_s": 1.0,
                "stats": [{"size": 65536, "metrics": {"gbps": {"median": 300.0, "min": 300.0, "max": 300.0, "values": [300.0]}}}],
                "thresholds": [{"key": "min_line_rate", "metric": "line_rate_pct", "limit": 80.0, "at_least": true,
                    "size": 65536, "rail": 1, "value": 60.0, "pass": false}],
                "rails": [rail(0, 190.0, None), rail(1, 110.0, None), rail(2, 0.0, Some("retry exceeded"))]}]
        });
        let text = format!("RDMABENCH_RESULT {{\"pod\":1,\"peer\":0,\"node\":\"gpu-7\",\"exit\":1,\"run\":{run}}}");
        let rows = links(&parse(text.as_bytes()).unwrap(), None);
        let ranked: Vec<u32> = ranked_rails(&rows).iter().map(|r| r.rail).collect();
        assert_eq!(ranked, [2, 1, 0], "failed rails first (the errored one, then the slow one), then the fast one");
        let mut out = Vec::new();
        print(&rows, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("1 link(s), 1 failed; 3 rail(s), 2 failed"), "{text}");
        assert!(
            text.contains("gpu-7") && text.contains("mlx5_1") && text.contains("line_rate_pct on rail 1"),
            "{text}"
        );
        let e = command_on(&rows).unwrap_err();
        assert!(e.message().contains("rail 1 on gpu-7 (mlx5_1 -> mlx5_1)"), "{}", e.message());
    }

    #[test]
    fn malformed_lines_are_errors_with_the_line_number() {
        let e = parse("ok\nRDMABENCH_RESULT {\"pod\":1".as_bytes()).unwrap_err();
        assert!(e.message().contains("line 2"), "{}", e.message());
        let extra = format!("{} trailing", line(0, 1, 0, None));
        assert!(parse(extra.as_bytes()).unwrap_err().message().contains("line 1"), "not a whole record");
        let unknown = "RDMABENCH_RESULT {\"pod\":0,\"peer\":1,\"exit\":0,\"run\":null,\"verdict\":\"pass\"}";
        assert!(parse(unknown.as_bytes()).is_err(), "a field no pod prints");
    }

    #[test]
    fn duplicates_and_markers_inside_other_text_are_refused() {
        let twice = [line(0, 1, 0, Some(100.0)), line(1, 0, 0, Some(90.0)), line(0, 1, 0, Some(200.0))].join("\n");
        let e = parse(twice.as_bytes()).unwrap_err();
        assert!(e.message().contains("line 3") && e.message().contains("first is on line 1"), "{}", e.message());
        let quoted = format!("rdmabench: peer x gave up: {}", line(5, 6, 0, None).split_once(' ').unwrap().1);
        let e = parse(quoted.as_bytes()).unwrap_err();
        assert!(e.message().contains("after other text"), "{}", e.message());
        let plain = line(0, 1, 0, Some(1.0)).split_once("] ").unwrap().1.to_string();
        assert_eq!(parse(plain.as_bytes()).unwrap().len(), 1, "no prefix at all");
    }

    /// A healthy fleet's row for `client -> server` at `step`, as its node prints it.
    fn pair_line(step: u32, client: u32, server: u32) -> String {
        let mut r = PairRow::blank(step, 0, None, client, server);
        (r.error, r.gbps, r.p50_us, r.p99_us) = (None, Some(100.0), Some(5.0), Some(7.0));
        r.line()
    }

    #[test]
    fn a_fleet_with_a_dead_node_summarizes_with_its_own_rows_first() {
        // The fleet ran with --max-pairs-per-round 1, which summarize is not told.
        let fleet =
            Plan { nodes: 4, directions: crate::fleet::schedule::Directions::Both, max_pairs_per_round: Some(1) };
        let plan = Plan { max_pairs_per_round: None, ..fleet };
        let mut lines = Vec::new();
        for step in fleet.steps() {
            for p in &step.pairs {
                let with_2 = p.client == 2 || p.server == 2;
                if !with_2 || step.index == 0 {
                    lines.push(pair_line(step.index, p.client, p.server));
                }
                // Node 2 printed its step-0 row and died before its next arrival: node 0
                // printed a failed row for that pair too, and for every later pair of node 2.
                if with_2 && (step.index > 0 || p.client == 2) {
                    let why = PairError::node_left(2, "node 2 left the fleet at step 1: killed".into());
                    let mut r = PairRow::failed(step.index, step.round, None, p.client, p.server, why);
                    r.source = RowSource::Coordinator;
                    lines.push(r.line());
                }
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("fleet.log");
        std::fs::write(&log, lines.join("\n")).unwrap();
        let mut out = Vec::new();
        let e =
            all_pairs(&[log.display().to_string()], &plan, &Thresholds::default(), None, true, &mut out).unwrap_err();
        assert_eq!(e.exit_code(), 1, "{e}");
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["bad_nodes"], serde_json::json!(["node-2"]), "{v:#}");
        let failed: Vec<_> =
            v["attribution"]["nodes"].as_array().unwrap().iter().map(|n| n["failed_partners"].clone()).collect();
        assert_eq!(failed, [0, 0, 3, 0], "node 2 failed against all 3 partners; its leaving is not held against them");
        assert!(v["bad_links"].as_array().unwrap().is_empty());
        // The same row twice from one source is still refused.
        let twice = format!("{}\n{}", pair_line(0, 0, 1), pair_line(0, 0, 1));
        std::fs::write(&log, twice).unwrap();
        let e = all_pairs(&[log.display().to_string()], &plan, &Thresholds::default(), None, true, &mut Vec::new());
        assert!(e.unwrap_err().message().contains("a second pair 0 -> 1"));
    }

    #[test]
    fn a_node_that_left_after_its_last_pair_is_named_from_node_0s_line() {
        let plan = Plan { nodes: 3, directions: crate::fleet::schedule::Directions::One, max_pairs_per_round: None };
        let mut lines: Vec<String> =
            plan.steps().iter().flat_map(|s| s.pairs.iter().map(|p| pair_line(s.index, p.client, p.server))).collect();
        let why = "node 2 left the fleet at step 6: the connection closed";
        lines.push(crate::report::pairs::LeftRow { node: 2, why: why.into() }.line());
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("fleet.log");
        std::fs::write(&log, lines.join("\n")).unwrap();
        let mut out = Vec::new();
        let e = all_pairs(&[log.display().to_string()], &plan, &Thresholds::default(), None, true, &mut out);
        assert_eq!(e.unwrap_err().exit_code(), 1);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["bad_nodes"], serde_json::json!(["node-2"]), "{v:#}");
        assert_eq!(v["attribution"]["nodes"][2]["reasons"][0], why);
    }

    #[test]
    fn a_servers_line_joins_its_pairs_row_so_a_failure_is_seen_from_both_ends() {
        let plan = Plan { nodes: 2, directions: crate::fleet::schedule::Directions::One, max_pairs_per_round: None };
        let mut failed = PairRow::failed(
            0,
            0,
            None,
            0,
            1,
            PairError::of(
                &Error::Peer("made no progress for 5.0 s".into()),
                Some(crate::report::pairs::Phase::Latency),
            ),
        );
        failed.counters = [("completer_retry_err".to_string(), 7)].into();
        let served = ServedRow {
            step: 0,
            client: 0,
            server: 1,
            counters: [("duplicate_request".to_string(), 6)].into(),
            error: Some("waited for send completions".into()),
        };
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("fleet.log");
        std::fs::write(&log, format!("{}\n{}\n", failed.line(), served.line())).unwrap();
        let out_dir = dir.path().join("out");
        let e = all_pairs(
            &[log.display().to_string()],
            &plan,
            &Thresholds::default(),
            Some(&out_dir),
            true,
            &mut Vec::new(),
        );
        assert_eq!(e.unwrap_err().exit_code(), 1);
        let pairs = std::fs::read_to_string(out_dir.join("pairs.jsonl")).unwrap();
        let row: PairRow = serde_json::from_str(pairs.lines().next().unwrap()).unwrap();
        assert_eq!(row.counters["completer_retry_err"], 7);
        assert_eq!(row.peer_counters["duplicate_request"], 6);
        assert_eq!(row.peer_error.as_deref(), Some("waited for send completions"));
    }
}
