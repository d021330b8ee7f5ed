//! `rdmabench history add|list|show|export|check|plot`: the store at the edge, the
//! judgement (`check`) and the drawing pure.

use std::io::Write;

use super::changepoint::Options;
use super::check::{Figure, Judge, SeriesReport, judge_series};
use super::model::{self, PointRow, RunRow, Series, or_unknown};
use super::store;
use crate::error::{Error, Result};
use crate::report::plot;

fn io(e: std::io::Error) -> Error {
    Error::Environment(format!("cannot write the output: {e}"))
}

/// Which series a command looks at: every filter given must match.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub workload: Option<String>,
    pub step: Option<String>,
    pub metric: Option<String>,
    pub size: Option<u64>,
    pub setup: Option<String>,
}

impl Filter {
    fn keeps(&self, s: &Series) -> bool {
        let k = &s.key;
        self.workload.as_ref().is_none_or(|w| *w == k.workload)
            && self.step.as_ref().is_none_or(|w| *w == k.step)
            && self.metric.as_ref().is_none_or(|w| *w == k.metric)
            && self.size.is_none_or(|w| w as i64 == k.size)
            && self.setup.as_ref().is_none_or(|w| k.setup.contains(w.as_str()))
    }
}

fn load(location: &str) -> Result<(Vec<RunRow>, Vec<PointRow>)> {
    let mut st = store::open(location)?;
    Ok((st.runs()?, st.points()?))
}

fn selected<'a>(runs: &'a [RunRow], points: &'a [PointRow], filter: &Filter) -> Result<Vec<Series<'a>>> {
    let all = model::series(runs, points);
    let total = all.len();
    let kept: Vec<Series> = all.into_iter().filter(|s| filter.keeps(s)).collect();
    if kept.is_empty() {
        return Err(Error::Usage(if total == 0 {
            "the history holds no runs yet: add some with `rdmabench history add RUN.json`".to_string()
        } else {
            format!("none of the history's {total} series matches the filters; `rdmabench history list` shows them")
        }));
    }
    Ok(kept)
}

/// `history add`: one run document into the store.
pub fn add(location: &str, path: &str, label: &str, setup: Option<&str>, out: &mut dyn Write) -> Result<()> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::Usage(format!("cannot read {path}: {e}")))?;
    let doc = crate::report::run::parse(path, &text)?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let run = model::from_document(&doc, &text, label, setup, now);
    if run.points.is_empty() {
        return Err(Error::Usage(format!(
            "{path} holds no measured figures (validate steps only, or every step failed): nothing to keep"
        )));
    }
    let mut st = store::open(location)?;
    let id = st.add(&run)?;
    writeln!(out, "history: added run {id} ({} points, setup {}) to {}", run.points.len(), run.row.setup, st.name())
        .map_err(io)
}

/// `history list`: one line per series.
pub fn list(location: &str, filter: &Filter, out: &mut dyn Write) -> Result<()> {
    let (runs, points) = load(location)?;
    let series = selected(&runs, &points, filter)?;
    let mut setup = "";
    for s in &series {
        if s.key.setup != setup {
            setup = &s.key.setup;
            writeln!(out, "setup: {setup}").map_err(io)?;
        }
        let newest = s.points.last().map(|(r, p)| format!("{} (run {})", crate::units::Sig(p.median), r.id));
        writeln!(
            out,
            "  {:<12} {:<44} {:>4} runs  newest {}",
            s.key.workload,
            s.key.label(),
            s.points.len(),
            newest.unwrap_or_default()
        )
        .map_err(io)?;
    }
    Ok(())
}

/// `history show`: every point of the matching series, with the environment that changed.
pub fn show(location: &str, filter: &Filter, out: &mut dyn Write) -> Result<()> {
    let (runs, points) = load(location)?;
    for s in selected(&runs, &points, filter)? {
        writeln!(out, "{} {} ({})", s.key.workload, s.key.label(), s.key.setup).map_err(io)?;
        writeln!(out, "  {:>5} {:<20} {:>12} {:>25}  environment", "run", "label", "median", "repeats (min..max)")
            .map_err(io)?;
        let mut prev: Option<&RunRow> = None;
        for (r, p) in &s.points {
            let env = match prev {
                None => format!(
                    "firmware {}, driver {}, kernel {}",
                    or_unknown(&r.firmware),
                    or_unknown(&r.driver),
                    or_unknown(&r.kernel)
                ),
                Some(before) => model::environment_changes(before, r).join(", "),
            };
            writeln!(
                out,
                "  {:>5} {:<20} {:>12} {:>25}  {env}",
                r.id,
                r.label,
                crate::units::Sig(p.median).to_string(),
                format!("{} ({}..{})", p.repeats, crate::units::Sig(p.min), crate::units::Sig(p.max))
            )
            .map_err(io)?;
            prev = Some(r);
        }
    }
    Ok(())
}

/// A file name from a series' key: letters, digits, '.', '-' and '_' kept, the rest '_'.
fn file_safe(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') { c } else { '_' }).collect()
}

/// A CSV field, quoted when it must be.
fn csv(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() }
}

/// `history export --csv`: one row per run, one column per series, in the shape Apache
/// Otava reads (a time column, attribute columns, metric columns). With `setup` unset and
/// several setups stored, it refuses: one file must be one setup's series.
pub fn export_csv(location: &str, filter: &Filter, out: &mut dyn Write) -> Result<()> {
    let (runs, points) = load(location)?;
    let series = selected(&runs, &points, filter)?;
    let mut setups: Vec<&str> = series.iter().map(|s| s.key.setup.as_str()).collect();
    setups.sort_unstable();
    setups.dedup();
    if setups.len() > 1 {
        return Err(Error::Usage(format!(
            "the history holds {} setups ({}); export one at a time with --setup (a CSV's rows must be comparable)",
            setups.len(),
            setups.join("; ")
        )));
    }
    let columns: Vec<String> = series.iter().map(|s| format!("{}/{}", s.key.workload, s.key.label())).collect();
    let mut header = vec!["time".to_string(), "run".into(), "label".into(), "firmware".into(), "driver".into()];
    header.extend(["kernel".to_string(), "rdmabench".into()]);
    header.extend(columns.iter().cloned());
    writeln!(out, "{}", header.iter().map(|h| csv(h)).collect::<Vec<_>>().join(",")).map_err(io)?;
    let mut ids: Vec<&RunRow> = series.iter().flat_map(|s| s.points.iter().map(|(r, _)| *r)).collect();
    ids.sort_by_key(|r| r.id);
    ids.dedup_by_key(|r| r.id);
    for r in ids {
        let time = chrono_like(r.finished_unix_s);
        let mut row = vec![time, r.id.to_string(), csv(&r.label), csv(&r.firmware), csv(&r.driver)];
        row.extend([csv(&r.kernel), csv(&r.tool_version)]);
        for s in &series {
            row.push(s.points.iter().find(|(x, _)| x.id == r.id).map_or(String::new(), |(_, p)| p.median.to_string()));
        }
        writeln!(out, "{}", row.join(",")).map_err(io)?;
    }
    Ok(())
}

/// Seconds since the epoch as `YYYY-MM-DD HH:MM:SS +0000`, the time format Otava parses.
fn chrono_like(unix_s: f64) -> String {
    let secs = unix_s.max(0.0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} +0000", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// What `history check` was asked.
#[derive(Debug, Clone)]
pub struct CheckRequest {
    pub store: String,
    pub filter: Filter,
    pub judge: Judge,
    pub json: Option<String>,
}

/// `history check`: change points of every series; Err(Check) (exit 1) when the newest
/// runs of any series hold a regression beyond its tolerance.
pub fn check(req: &CheckRequest, out: &mut dyn Write) -> Result<()> {
    crate::report::file::check_outputs(&[(&req.json, "--json")])?;
    let (runs, points) = load(&req.store)?;
    let reports: Vec<SeriesReport> =
        selected(&runs, &points, &req.filter)?.iter().map(|s| judge_series(s, &req.judge)).collect();
    print_check(&reports, &req.judge, out)?;
    if let Some(path) = &req.json {
        let text = serde_json::to_string_pretty(&reports).expect("serialisable") + "\n";
        crate::report::file::write(path, text.as_bytes(), "the history check")?;
    }
    let regressed: Vec<String> =
        reports.iter().filter(|r| r.regressed).map(|r| format!("{} {}", r.key.workload, r.key.label())).collect();
    if regressed.is_empty() {
        Ok(())
    } else {
        Err(Error::Check(format!("{} series regressed in the newest runs: {}", regressed.len(), regressed.join(", "))))
    }
}

fn print_check(reports: &[SeriesReport], j: &Judge, out: &mut dyn Write) -> Result<()> {
    // Fewer runs than two shortest levels: no change point can be found yet, which is not
    // the same as a steady series.
    let enough = j.options.min_runs();
    for r in reports {
        let verdict = if r.regressed {
            "REGRESSED"
        } else if !r.changes.is_empty() {
            "ok"
        } else if r.runs < enough {
            "too few"
        } else {
            "steady"
        };
        writeln!(
            out,
            "{:<10} {} {} ({} runs, tolerance {:.1}%; {})",
            verdict,
            r.key.workload,
            r.key.label(),
            r.runs,
            r.tolerance_pct,
            r.key.setup
        )
        .map_err(io)?;
        for c in &r.changes {
            let env = if c.environment.is_empty() {
                "no firmware, driver, kernel or rdmabench change at this run".to_string()
            } else {
                format!("changed at this run: {}", c.environment.join(", "))
            };
            writeln!(
                out,
                "           change at run {} ({}): {} -> {} ({:+.1}%, p = {:.3}), {}; {env}",
                c.run,
                or_unknown(&c.label),
                crate::units::Sig(c.before),
                crate::units::Sig(c.after),
                c.change_pct,
                c.p_value,
                c.kind
            )
            .map_err(io)?;
        }
    }
    let n = |f: &dyn Fn(&SeriesReport) -> bool| reports.iter().filter(|r| f(r)).count();
    let few = n(&|r| r.runs < enough);
    if few > 0 {
        let side = j.options.segment();
        writeln!(out, "{few} series have fewer than {enough} runs: a change point needs {side} on each side")
            .map_err(io)?;
    }
    writeln!(
        out,
        "history check: {} series, {} with change points, {} regressed in the last {} runs (p <= {}, {} permutations)",
        reports.len(),
        n(&|r| !r.changes.is_empty()),
        n(&|r| r.regressed),
        j.recent,
        j.options.max_p_value,
        j.options.permutations
    )
    .map_err(io)
}

/// `history plot`: each series against its runs, change points marked; one page
/// (`FILE.svg`) or one file per series in a directory (`DIR/`).
pub fn plot(location: &str, filter: &Filter, judge: &Judge, target: &str) -> Result<()> {
    let (runs, points) = load(location)?;
    let charts: Vec<(String, plot::Chart)> = selected(&runs, &points, filter)?
        .iter()
        .map(|s| {
            let report = judge_series(s, judge);
            let chart = plot::Chart {
                title: format!("{} {}", s.key.workload, s.key.label()),
                x_label: "run".into(),
                y_label: s.key.metric.clone(),
                x_log2: false,
                series: vec![plot::Series {
                    name: s.key.metric.clone(),
                    points: s.points.iter().map(|(r, p)| (r.id as f64, judge.figure.of(&s.key.metric, p))).collect(),
                }],
                marks: report
                    .changes
                    .iter()
                    .map(|c| (c.run as f64 - 0.5, format!("{:+.1}% {}", c.change_pct, c.kind)))
                    .collect(),
            };
            let file = format!("{}-{}-{}-{}.svg", s.key.workload, s.key.step, s.key.size, s.key.metric);
            (file_safe(&file), chart)
        })
        .collect();
    if target.ends_with('/') || std::path::Path::new(target).is_dir() {
        std::fs::create_dir_all(target).map_err(|e| Error::Usage(format!("cannot create {target}: {e}")))?;
        for (file, chart) in &charts {
            let path = std::path::Path::new(target).join(file);
            crate::report::file::write(
                &path.to_string_lossy(),
                plot::svg(std::slice::from_ref(chart)).as_bytes(),
                "the plot",
            )?;
        }
        eprintln!("rdmabench: wrote {} plot(s) to {target}", charts.len());
    } else {
        let all: Vec<plot::Chart> = charts.into_iter().map(|(_, c)| c).collect();
        crate::report::file::write(target, plot::svg(&all).as_bytes(), "the plot")?;
        eprintln!("rdmabench: wrote {target} ({} chart(s))", all.len());
    }
    Ok(())
}

/// The judge from `check`'s and `plot`'s flags.
pub fn judge(
    figure: Figure,
    tolerance_pct: f64,
    window: usize,
    recent: usize,
    max_p_value: f64,
    permutations: u32,
) -> Judge {
    Judge {
        options: Options { permutations, max_p_value, ..Options::default() },
        figure,
        tolerance_pct,
        window,
        recent,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn otava_time_format() {
        assert_eq!(super::chrono_like(0.0), "1970-01-01 00:00:00 +0000");
        assert_eq!(super::chrono_like(1_796_688_000.0 + 3_723.0), "2026-12-08 01:02:03 +0000");
        assert_eq!(super::chrono_like(951_782_400.0), "2000-02-29 00:00:00 +0000");
    }

    #[test]
    fn csv_fields_are_quoted_when_needed() {
        assert_eq!(super::csv("a,b"), "\"a,b\"");
        assert_eq!(super::csv("say \"x\""), "\"say \"\"x\"\"\"");
        assert_eq!(super::csv("plain"), "plain");
    }
}
