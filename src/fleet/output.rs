//! What `summarize --fleet all-pairs` writes for a fleet: every pair as JSON lines, an
//! N x N matrix per metric as CSV (row: the measuring node, column: the node measured
//! against, both labelled by node name), the verdict as JSON (bad nodes and links with
//! their evidence), an SVG heat map of the bandwidth matrix and a markdown summary.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::attribution::{Attribution, Thresholds, Verdict};
use super::barrier::Outcome;
use super::rows::PairTable;
use crate::error::{Error, Result};
use crate::report::pairs::PairRow;

/// A node's label: its node name when a row gives one, else `node-<i>`; with the index
/// when two nodes share a name (pods of one node, hostNetwork).
pub fn labels(nodes: u32, rows: &[PairRow]) -> Vec<String> {
    let mut names: Vec<Option<String>> = vec![None; nodes as usize];
    for r in rows {
        note_names(&mut names, r);
    }
    labels_from(&names)
}

/// The names `r` gives its two nodes, where none is known yet.
pub fn note_names(names: &mut [Option<String>], r: &PairRow) {
    for (i, name) in [(r.client, &r.client_node), (r.server, &r.server_node)] {
        if let Some(slot) = names.get_mut(i as usize).filter(|n| n.is_none() && !name.is_empty()) {
            *slot = Some(name.clone());
        }
    }
}

/// Each node's label from its name, if one is known: `node-<i>` without one, and
/// `<name>#<i>` for a name two nodes share.
pub fn labels_from(names: &[Option<String>]) -> Vec<String> {
    let plain: Vec<String> =
        names.iter().enumerate().map(|(i, n)| n.clone().unwrap_or_else(|| format!("node-{i}"))).collect();
    let mut uses: HashMap<&str, u32> = HashMap::new();
    for n in &plain {
        *uses.entry(n).or_default() += 1;
    }
    plain.iter().enumerate().map(|(i, n)| if uses[n.as_str()] > 1 { format!("{n}#{i}") } else { n.clone() }).collect()
}

/// The metrics a matrix is written for.
pub const METRICS: [&str; 3] = ["gbps", "p50_us", "p99_us"];

fn figure(r: &PairRow, metric: &str) -> Option<f64> {
    match metric {
        "gbps" => r.gbps,
        "p50_us" => r.p50_us,
        _ => r.p99_us,
    }
}

/// The planned pairs' `metric` as a CSV matrix; a failed pair is `failed`, an unmeasured
/// one empty. Names are defused, so no label can break a cell.
pub fn matrix_csv(nodes: u32, rows: &[PairRow], metric: &str) -> String {
    let label = labels(nodes, rows);
    let table = PairTable::planned(nodes, rows);
    let mut out = format!("client/server,{}\n", label.join(","));
    for i in 0..nodes {
        out.push_str(&label[i as usize]);
        for j in 0..nodes {
            out.push(',');
            match table.get(i, j).map(|k| &rows[k]) {
                Some(r) if !r.ok() => out.push_str("failed"),
                Some(r) => {
                    if let Some(v) = figure(r, metric) {
                        let _ = write!(out, "{v:.3}");
                    }
                }
                None => {}
            }
        }
        out.push('\n');
    }
    out
}

#[derive(Serialize)]
struct VerdictDoc<'a> {
    schema: &'static str,
    nodes: u32,
    labels: &'a [String],
    verdict: Verdict,
    bad_nodes: Vec<&'a str>,
    bad_links: Vec<[&'a str; 2]>,
    flaky_pairs: Vec<[&'a str; 2]>,
    /// Lines of the logs with a record's mark that could not be read, skipped (summarize;
    /// node 0 reads none).
    skipped_lines: usize,
    thresholds: &'a Thresholds,
    attribution: &'a Attribution,
}

pub fn verdict_json(nodes: u32, rows: &[PairRow], a: &Attribution, t: &Thresholds, skipped_lines: usize) -> String {
    let label = labels(nodes, rows);
    let v = VerdictDoc {
        schema: "rdmabench/fleet-verdict",
        nodes,
        labels: &label,
        verdict: a.verdict(),
        bad_nodes: a.bad_nodes().iter().map(|&i| label[i as usize].as_str()).collect(),
        bad_links: a
            .bad_links()
            .iter()
            .map(|&(x, y)| [label[x as usize].as_str(), label[y as usize].as_str()])
            .collect(),
        flaky_pairs: a
            .flaky
            .iter()
            .map(|f| [label[f.client as usize].as_str(), label[f.server as usize].as_str()])
            .collect(),
        skipped_lines,
        thresholds: t,
        attribution: a,
    };
    serde_json::to_string_pretty(&v).expect("a verdict serialises") + "\n"
}

/// The most nodes whose heat map cells carry their figure as text; a larger fleet's cells
/// are colour alone (smaller), so the map stays a size a browser opens.
const CELL_TEXT_NODES: u32 = 64;

/// The bandwidth matrix as an SVG heat map: each cell's colour is its bandwidth against
/// the typical pair's (red low, green at or above), failed cells black.
pub fn heatmap_svg(nodes: u32, rows: &[PairRow], a: &Attribution) -> String {
    let label = labels(nodes, rows);
    let text_in_cells = nodes <= CELL_TEXT_NODES;
    let (cell, left, top) = if text_in_cells { (36, 150, 150) } else { (6, 150, 150) };
    let size = |k: u32| k * cell;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"11\">\n",
        left + size(nodes) + 20,
        top + size(nodes) + 40
    );
    let _ = writeln!(
        s,
        "<text x=\"4\" y=\"16\" font-size=\"13\">RDMA WRITE Gb/s, client (row) to server (column); colour: against the typical pair ({}); black failed, orange flaky</text>",
        a.typical_gbps.map_or("none".into(), |g| format!("{g:.2} Gb/s"))
    );
    for (i, l) in label.iter().enumerate() {
        let y = top + size(i as u32) + cell / 2 + 4;
        let x = left + size(i as u32) + cell / 2;
        let _ = writeln!(s, "<text x=\"{}\" y=\"{y}\" text-anchor=\"end\">{l}</text>", left - 6);
        let _ = writeln!(s, "<text x=\"{x}\" y=\"{}\" transform=\"rotate(-60 {x} {})\">{l}</text>", top - 6, top - 6);
    }
    let flaky: std::collections::HashSet<(u32, u32)> = a.flaky.iter().map(|f| (f.client, f.server)).collect();
    for r in rows.iter().filter(|r| !r.is_retest() && r.client < nodes && r.server < nodes) {
        let (x, y) = (left + size(r.server), top + size(r.client));
        let (fill, text) = match (r.ok(), r.gbps, a.typical_gbps) {
            (false, _, _) if flaky.contains(&(r.client, r.server)) => ("#e07000".to_string(), "flaky".to_string()),
            (false, _, _) => ("#000000".to_string(), "fail".to_string()),
            (true, Some(g), Some(t)) => (colour(g / t), format!("{g:.1}")),
            _ => ("#cccccc".to_string(), String::new()),
        };
        let _ = writeln!(
            s,
            "<rect x=\"{x}\" y=\"{y}\" width=\"{cell}\" height=\"{cell}\" fill=\"{fill}\" stroke=\"#ffffff\"/>"
        );
        if !text_in_cells {
            continue;
        }
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"{}\" font-size=\"9\">{text}</text>",
            x + cell / 2,
            y + cell / 2 + 3,
            if r.ok() { "#000000" } else { "#ffffff" }
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Red at half the typical bandwidth or less, yellow at 0.93x, green at 1x and above.
fn colour(ratio: f64) -> String {
    let t = ((ratio - 0.5) / 0.5).clamp(0.0, 1.0);
    let (r, g) =
        if t < 0.86 { (220, (60.0 + 160.0 * t / 0.86) as u8) } else { ((220.0 * (1.0 - t) / 0.14) as u8, 200) };
    format!("#{r:02x}{g:02x}50")
}

/// What the summary says of a fleet's rows besides the verdict: the nodes' labels, and
/// how many pairs were measured (planned), failed, and retested.
pub struct Tally {
    pub labels: Vec<String>,
    pub planned: usize,
    pub failed: usize,
    pub retests: usize,
}

impl Tally {
    pub fn of(nodes: u32, rows: &[PairRow]) -> Tally {
        Tally {
            labels: labels(nodes, rows),
            planned: rows.iter().filter(|r| !r.is_retest()).count(),
            failed: rows.iter().filter(|r| !r.is_retest() && !r.ok()).count(),
            retests: rows.iter().filter(|r| r.is_retest()).count(),
        }
    }

    /// Node 0's, from the barrier's outcome (healthy pairs kept as figures).
    pub fn of_outcome(o: &Outcome) -> Tally {
        let mut t = Tally::of(o.names.len() as u32, &o.rows);
        t.labels = labels_from(&o.names);
        t.planned += o.figures.len();
        t
    }
}

pub fn summary_md(nodes: u32, rows: &[PairRow], a: &Attribution, t: &Thresholds, skipped_lines: usize) -> String {
    summary_md_tallied(&Tally::of(nodes, rows), rows, a, t, skipped_lines)
}

/// The summary from a [`Tally`] and the rows whose failures it lists.
pub fn summary_md_tallied(
    tally: &Tally,
    rows: &[PairRow],
    a: &Attribution,
    t: &Thresholds,
    skipped_lines: usize,
) -> String {
    let nodes = tally.labels.len();
    let (label, planned, failed, retests) = (&tally.labels, tally.planned, tally.failed, tally.retests);
    let mut s = format!(
        "# Fleet: {nodes} nodes, {planned} pairs measured ({failed} failed), {retests} retests\n\n\
         Typical pair: {}, latency p50 {}.\n\n",
        a.typical_gbps.map_or("none".into(), |g| format!("{g:.2} Gb/s")),
        a.typical_p50_us.map_or("none".into(), |p| format!("{p:.2} us"))
    );
    let verdict = match a.verdict() {
        Verdict::Pass => "PASS".to_string(),
        Verdict::Fail => format!(
            "FAIL ({} bad node(s), {} bad link(s), {} flaky pair(s){})",
            a.bad_nodes().len(),
            a.bad_links().len(),
            a.flaky.len(),
            if a.too_flaky() { format!(", more than max_flaky_pairs {}", a.flaky_allowed) } else { String::new() }
        ),
    };
    let _ = writeln!(s, "**Verdict: {verdict}**\n");
    if skipped_lines > 0 {
        let _ = writeln!(
            s,
            "{skipped_lines} line(s) of the logs carried a record that could not be read and were skipped \
             (summarize printed each, with its line number); a pair they held counts as missing.\n"
        );
    }
    s.push_str("| node | bandwidth vs typical | z | failed partners | p50 us | verdict |\n|---|---|---|---|---|---|\n");
    for n in &a.nodes {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {}/{} | {} | {} |",
            label[n.node as usize],
            n.ratio.map_or("-".into(), |r| format!("{r:.3}x")),
            n.z.map_or("-".into(), |z| format!("{z:.1}")),
            n.failed_partners,
            n.partners,
            n.p50_us.map_or("-".into(), |p| format!("{p:.1}")),
            if n.bad {
                format!("**bad**: {}", sentences(&n.reasons))
            } else if n.reasons.is_empty() {
                "ok".into()
            } else {
                format!("ok ({})", sentences(&n.reasons))
            }
        );
    }
    let suspect: Vec<_> = a.links.iter().filter(|l| !l.reasons.is_empty()).collect();
    if !suspect.is_empty() {
        s.push_str("\n| link | bandwidth vs predicted | Gb/s | p50 us | verdict |\n|---|---|---|---|---|\n");
        for l in suspect {
            let _ = writeln!(
                s,
                "| {} - {} | {} | {} | {} | {}: {} |",
                label[l.a as usize],
                label[l.b as usize],
                l.ratio.map_or("-".into(), |r| format!("{r:.3}x")),
                l.gbps.map_or("-".into(), |g| format!("{g:.2}")),
                l.p50_us.map_or("-".into(), |p| format!("{p:.1}")),
                if l.bad { "**bad**" } else { "not the link's fault" },
                sentences(&l.reasons)
            );
        }
    }
    if !a.flaky.is_empty() {
        s.push_str("\n| flaky pair (failed, then passed its retest) | first error |\n|---|---|\n");
        for f in &a.flaky {
            let _ = writeln!(s, "| {} -> {} | {} |", label[f.client as usize], label[f.server as usize], f.error);
        }
    }
    failed_pairs(&mut s, rows, label);
    let _ = writeln!(
        s,
        "\nThresholds: node below {}x or z below {}, failing against {} of its partners; link below {}x with z below {}; \
         latency above {}x the typical pair; at most {} flaky pair(s).",
        t.node_min_ratio,
        t.node_min_z,
        t.fail_share,
        t.link_min_ratio,
        t.link_min_z,
        t.latency_max_ratio,
        t.max_flaky_pairs
    );
    s
}

/// The most failed pairs the summary lists; `pairs.jsonl` has every one.
const LISTED_FAILURES: usize = 50;

/// Each failed pair from both ends: this side's error, the server's own, and the
/// counters each side's ports moved (did the link drop packets, or a process stall?).
fn failed_pairs(s: &mut String, rows: &[PairRow], label: &[String]) {
    let failed: Vec<&PairRow> = rows.iter().filter(|r| !r.ok()).collect();
    if failed.is_empty() {
        return;
    }
    s.push_str("\n| failed pair | error | server's error | counters (client; server) |\n|---|---|---|---|\n");
    let counters = |c: &std::collections::BTreeMap<String, u64>| {
        let moved: Vec<String> = c.iter().filter(|(_, v)| **v > 0).map(|(k, v)| format!("{k} {v}")).collect();
        if moved.is_empty() { "-".to_string() } else { moved.join(", ") }
    };
    let cell = |t: &str| t.replace('|', "/").replace('\n', " ");
    for r in failed.iter().take(LISTED_FAILURES) {
        let _ = writeln!(
            s,
            "| {} -> {}{} | {} | {} | {}; {} |",
            label[r.client as usize],
            label[r.server as usize],
            if r.is_retest() { " (retest)" } else { "" },
            cell(&r.error.as_ref().map_or(String::new(), |e| e.to_string())),
            cell(r.peer_error.as_deref().unwrap_or("-")),
            counters(&r.counters),
            counters(&r.peer_counters),
        );
    }
    if failed.len() > LISTED_FAILURES {
        let _ = writeln!(s, "\n{} more failed pair(s) in pairs.jsonl.", failed.len() - LISTED_FAILURES);
    }
}

/// Every row as a JSON line.
fn pairs_jsonl(rows: &[PairRow]) -> String {
    let mut out = Vec::with_capacity(rows.len() * 512);
    for r in rows {
        serde_json::to_writer(&mut out, r).expect("a row serialises");
        out.push(b'\n');
    }
    String::from_utf8(out).expect("JSON is UTF-8")
}

fn sentences<R: std::fmt::Display>(reasons: &[R]) -> String {
    reasons.iter().map(|r| r.to_string()).collect::<Vec<_>>().join("; ")
}

/// Writes every file into `dir`; returns their paths.
pub fn write_all(
    dir: &Path,
    nodes: u32,
    rows: &[PairRow],
    a: &Attribution,
    t: &Thresholds,
    skipped_lines: usize,
) -> Result<Vec<String>> {
    std::fs::create_dir_all(dir).map_err(|e| Error::Usage(format!("cannot create {}: {e}", dir.display())))?;
    let mut files: Vec<(String, String)> = vec![
        ("pairs.jsonl".into(), pairs_jsonl(rows)),
        ("verdict.json".into(), verdict_json(nodes, rows, a, t, skipped_lines)),
        ("heatmap.svg".into(), heatmap_svg(nodes, rows, a)),
        ("summary.md".into(), summary_md(nodes, rows, a, t, skipped_lines)),
    ];
    for m in METRICS {
        files.push((format!("matrix-{m}.csv"), matrix_csv(nodes, rows, m)));
    }
    let mut written = Vec::new();
    for (name, text) in files {
        let path = dir.join(&name);
        crate::report::file::write(&path.display().to_string(), text.as_bytes(), &name)?;
        written.push(path.display().to_string());
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::rows;
    use crate::report::pairs::PairError;

    fn rows(n: u32) -> Vec<PairRow> {
        let mut v = Vec::new();
        for i in 0..n {
            for j in 0..n {
                if i == j {
                    continue;
                }
                let lost = PairError::of(&crate::Error::Peer("peer lost".into()), None);
                let mut r = PairRow::failed(0, 0, None, i, j, lost);
                (r.client_node, r.server_node) = (format!("n{i}"), format!("n{j}"));
                if (i, j) != (2, 0) {
                    (r.error, r.gbps, r.p50_us, r.p99_us) =
                        (None, Some(if i == 1 || j == 1 { 40.0 } else { 100.0 }), Some(5.0), Some(9.0));
                }
                v.push(r);
            }
        }
        v
    }

    #[test]
    fn matrices_are_labelled_by_node_and_mark_failures() {
        let r = rows(4);
        let csv = matrix_csv(4, &r, "gbps");
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], "client/server,n0,n1,n2,n3");
        assert_eq!(lines[1], "n0,,40.000,100.000,100.000");
        assert!(lines[3].starts_with("n2,failed,40.000,,"), "{csv}");
    }

    #[test]
    fn the_verdict_names_the_slow_node_in_every_output() {
        let r = rows(5);
        let t = Thresholds::default();
        let a = rows::judge(5, &r, &t);
        assert_eq!(a.bad_nodes(), [1]);
        let v: serde_json::Value = serde_json::from_str(&verdict_json(5, &r, &a, &t, 0)).unwrap();
        assert_eq!((v["verdict"].as_str(), v["bad_nodes"][0].as_str()), (Some("fail"), Some("n1")));
        let md = summary_md(5, &r, &a, &t, 0);
        assert!(md.contains("| n1 | 0.400x") && md.contains("**bad**"), "{md}");
        let svg = heatmap_svg(5, &r, &a);
        roxmltree::Document::parse(&svg).unwrap();
        assert!(svg.contains(">fail<") && svg.contains(">n1<"));
    }

    #[test]
    fn the_summary_shows_a_failed_pair_from_both_ends() {
        let mut r = rows(5);
        let failed = r.iter_mut().find(|x| (x.client, x.server) == (2, 0)).unwrap();
        failed.counters = [("completer_retry_err".to_string(), 7), ("rnr_nak_retry_err".to_string(), 0)].into();
        failed.peer_counters = [("duplicate_request".to_string(), 12)].into();
        failed.peer_error = Some("waited for send completions | 5.0 s".into());
        let t = Thresholds::default();
        let md = summary_md(5, &r, &rows::judge(5, &r, &t), &t, 0);
        let line = md.lines().find(|l| l.starts_with("| n2 -> n0 |")).unwrap_or_else(|| panic!("{md}"));
        assert_eq!(
            line,
            "| n2 -> n0 | peer lost | waited for send completions / 5.0 s \
             | completer_retry_err 7; duplicate_request 12 |"
        );
    }

    #[test]
    fn two_nodes_of_one_name_get_their_index() {
        let mut r = rows(3);
        r.iter_mut().for_each(|x| {
            x.client_node = "same".into();
            x.server_node = "same".into();
        });
        assert_eq!(labels(3, &r), ["same#0", "same#1", "same#2"]);
        assert_eq!(labels(2, &[]), ["node-0", "node-1"]);
    }
}
