//! `history check`'s judgement of every series: its change points (E-divisive), each with
//! its run, magnitude, p-value and what changed in the environment there, and whether the
//! newest runs sit on a level worse than the one before by more than the tolerance. Pure.

use serde::Serialize;

use super::changepoint::{self, Options};
use super::model::{Series, SeriesKey, environment_changes};
use crate::report::metrics::{self, Better};

/// A change point as reported.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    /// The first run of the new level: its number in the store and its label.
    pub run: i64,
    pub label: String,
    /// Its position in the series (0 = the oldest run checked).
    pub position: usize,
    pub before: f64,
    pub after: f64,
    pub change_pct: f64,
    pub p_value: f64,
    /// "regression", "improvement", or "within tolerance".
    pub kind: &'static str,
    /// What else changed at this run: firmware, driver, kernel, rdmabench.
    pub environment: Vec<String>,
}

/// One series' outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeriesReport {
    #[serde(flatten)]
    pub key: SeriesKey,
    /// Which repeat stood for each run.
    pub figure: Figure,
    /// Runs looked at (the newest `--window`).
    pub runs: usize,
    pub tolerance_pct: f64,
    pub changes: Vec<Change>,
    /// The newest runs hold a regression: the last change is a regression that began
    /// within the last `recent` runs.
    pub regressed: bool,
}

/// Which of a run's repeats stands for the run in a series.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Figure {
    /// For latency, the mean of the repeats in the best repeat's mode (within
    /// [`MODE_SPAN`] of it): a run of a two-speed machine has fast repeats, whose mean
    /// moves less than its single best one; on a one-speed machine that is every repeat.
    /// For bandwidth and message rate, the median of the repeats.
    Auto,
    /// The median of the repeats, for every metric.
    Median,
    /// The best repeat (lowest latency, highest bandwidth), for every metric.
    Best,
    /// Every repeat: change points found over all of them (runs shuffled whole), levels
    /// and magnitudes reported as `auto`'s.
    Repeats,
}

/// How far above the best repeat a latency repeat may lie and still count in its mode: the
/// two speeds seen in this project's lab are 75 % apart, a run's spread within one about 10 %.
pub const MODE_SPAN: f64 = 1.25;

impl Figure {
    /// The figure of `p` for `metric`.
    pub fn of(self, metric: &str, p: &super::model::PointRow) -> f64 {
        let better = metrics::better(metric);
        match (self, better) {
            (Figure::Median, _) | (Figure::Auto | Figure::Repeats, Some(Better::Higher) | None) => p.median,
            (Figure::Best, Some(Better::Lower)) => p.min,
            (Figure::Auto | Figure::Repeats, Some(Better::Lower)) => best_mode_mean(p),
            (Figure::Best, _) => p.max,
        }
    }
}

/// The mean of the repeats within [`MODE_SPAN`] of the lowest (the lowest alone when the
/// repeats were not kept).
fn best_mode_mean(p: &super::model::PointRow) -> f64 {
    let near: Vec<f64> = p.values.iter().copied().filter(|v| *v <= p.min * MODE_SPAN).collect();
    if near.is_empty() { p.min } else { near.iter().sum::<f64>() / near.len() as f64 }
}

/// How `check` judges.
#[derive(Debug, Clone, Copy)]
pub struct Judge {
    pub options: Options,
    pub figure: Figure,
    /// Tolerance when the workload states none, percent.
    pub tolerance_pct: f64,
    /// Runs looked at, newest last.
    pub window: usize,
    /// A regression counts as the newest runs' when its level began within this many runs.
    pub recent: usize,
}

/// Defaults of `history check` (and the flags' docs).
pub const DEFAULT_WINDOW: usize = 200;
pub const DEFAULT_RECENT: usize = 10;

pub fn judge_series(s: &Series, j: &Judge) -> SeriesReport {
    let start = s.points.len().saturating_sub(j.window);
    let points = &s.points[start..];
    let values: Vec<f64> = points.iter().map(|(_, p)| j.figure.of(&s.key.metric, p)).collect();
    // The newest run's stated tolerance wins (a workload may have been retuned).
    let tolerance_pct = points.last().and_then(|(_, p)| p.tolerance_pct).unwrap_or(j.tolerance_pct);
    let higher_better = metrics::better(&s.key.metric) == Some(Better::Higher);
    let found: Vec<changepoint::ChangePoint> = if j.figure == Figure::Repeats {
        let runs: Vec<Vec<f64>> = points
            .iter()
            .zip(&values)
            .map(|((_, p), v)| if p.values.is_empty() { vec![*v] } else { p.values.clone() })
            .collect();
        changepoint::with_means(&changepoint::find_in_runs(&runs, &j.options), &values)
    } else {
        changepoint::find(&values, &j.options)
    };
    let changes: Vec<Change> = found
        .into_iter()
        .map(|cp| {
            let (run, _) = points[cp.index];
            let (prev, _) = points[cp.index - 1];
            let change_pct = cp.change_pct();
            let worse = if higher_better { -change_pct } else { change_pct };
            let kind = if worse.abs() <= tolerance_pct {
                "within tolerance"
            } else if worse > 0.0 {
                "regression"
            } else {
                "improvement"
            };
            Change {
                run: run.id,
                label: run.label.clone(),
                position: cp.index,
                before: cp.mean_before,
                after: cp.mean_after,
                change_pct,
                p_value: cp.p_value,
                kind,
                environment: environment_changes(prev, run),
            }
        })
        .collect();
    let regressed = changes
        .iter()
        .rev()
        .find(|c| c.kind != "within tolerance")
        .is_some_and(|c| c.kind == "regression" && values.len() - c.position <= j.recent);
    SeriesReport { key: s.key.clone(), figure: j.figure, runs: values.len(), tolerance_pct, changes, regressed }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::model::{PointRow, RunRow, series};

    fn run(id: i64, firmware: &str) -> RunRow {
        RunRow {
            id,
            added_unix_s: id as f64,
            finished_unix_s: id as f64,
            label: format!("c{id}"),
            workload: "w".into(),
            setup: "s".into(),
            host: "h".into(),
            tool_version: "0.1.0".into(),
            firmware: firmware.into(),
            driver: "mlx5_core".into(),
            kernel: "6.1".into(),
            verdict: "pass".into(),
        }
    }

    fn point(id: i64, v: f64) -> PointRow {
        PointRow {
            run_id: id,
            step: "bw".into(),
            rail: String::new(),
            size: 65536,
            metric: "gbps".into(),
            median: v,
            min: v,
            max: v,
            repeats: 1,
            values: vec![v],
            tolerance_pct: Some(3.0),
        }
    }

    fn judge() -> Judge {
        Judge {
            options: Options::default(),
            figure: Figure::Auto,
            tolerance_pct: 5.0,
            window: DEFAULT_WINDOW,
            recent: DEFAULT_RECENT,
        }
    }

    /// 30 runs at ~100 Gb/s, then `after` runs at ~`level` on new firmware.
    fn history(after: usize, level: f64) -> (Vec<RunRow>, Vec<PointRow>) {
        let wobble = [0.4, -0.3, 0.1, -0.5, 0.2, 0.0, -0.2, 0.5, -0.1, 0.3];
        let n = 30 + after;
        let runs = (1..=n as i64).map(|i| run(i, if i > 30 { "28.40" } else { "28.39" })).collect();
        let points = (1..=n as i64)
            .map(|i| point(i, if i > 30 { level } else { 100.0 } + wobble[i as usize % wobble.len()]))
            .collect();
        (runs, points)
    }

    #[test]
    fn a_drop_on_new_firmware_is_a_regression_named_with_the_firmware() {
        let (runs, points) = history(5, 90.0);
        let all = series(&runs, &points);
        let r = judge_series(&all[0], &judge());
        assert_eq!(r.changes.len(), 1, "{r:?}");
        let c = &r.changes[0];
        assert_eq!((c.run, c.kind), (31, "regression"));
        assert_eq!(c.environment, vec!["firmware 28.39 -> 28.40".to_string()]);
        assert!(r.regressed);
        assert_eq!(r.tolerance_pct, 3.0, "the workload's tolerance");
    }

    #[test]
    fn a_rise_is_an_improvement_and_an_old_regression_is_history() {
        let (runs, points) = history(5, 110.0);
        let r = judge_series(&series(&runs, &points)[0], &judge());
        assert_eq!(r.changes[0].kind, "improvement");
        assert!(!r.regressed);
        let (runs, points) = history(25, 90.0);
        let r = judge_series(&series(&runs, &points)[0], &judge());
        assert_eq!(r.changes[0].kind, "regression");
        assert!(!r.regressed, "began 25 runs ago, past --recent 10: the new level is the accepted one");
    }

    #[test]
    fn a_change_within_tolerance_does_not_fail() {
        let (runs, points) = history(8, 98.0);
        let r = judge_series(&series(&runs, &points)[0], &judge());
        assert!(r.changes.iter().all(|c| c.kind == "within tolerance"), "{r:?}");
        assert!(!r.regressed);
    }

    #[test]
    fn latency_runs_are_judged_by_their_fast_mode() {
        let mut p = point(1, 20.0);
        p.metric = "p50_us".into();
        (p.values, p.min, p.median) = (vec![35.0, 20.0, 22.0, 36.0, 21.0], 20.0, 22.0);
        assert_eq!(Figure::Auto.of("p50_us", &p), 21.0, "35 and 36 are the slow mode");
        assert_eq!(Figure::Best.of("p50_us", &p), 20.0);
        assert_eq!(Figure::Auto.of("gbps", &p), 22.0, "bandwidth: the median");
        p.values.clear();
        assert_eq!(Figure::Auto.of("p50_us", &p), 20.0, "no repeats kept: the best");
    }

    #[test]
    fn setups_never_share_a_series() {
        let (mut runs, points) = history(5, 90.0);
        for r in runs.iter_mut().skip(30) {
            r.setup = "another host".into();
        }
        let all = series(&runs, &points);
        assert_eq!(all.len(), 2);
        assert!(all.iter().all(|s| judge_series(s, &judge()).changes.is_empty()));
    }
}
