//! How well `history check` finds a step, and how often it cries wolf, on synthetic series
//! with this lab's measured noise: `cargo bench --bench history_detection`.
//!
//! Noise models (each run has 5 repeats, as a workload with `repeat = 5` records them; the
//! run's figure is `--figure auto`'s: the median for bandwidth, the best repeat for latency):
//! - bandwidth: repeats spread 3-5 % (normal, sd 1.75 %), plus a per-run offset (sd 1 %:
//!   the day's drift);
//! - latency, two speeds: each repeat is fast (20 us, sd 3 %) or, with probability 0.3,
//!   slow (35 us, sd 5 %), as this lab's guest flips from minute to minute.
//!
//! A trial: 30 steady runs, then the step (worse by 3, 5 or 10 %) and up to 10 runs after
//! it, `check` run after each. Found: a change point within 2 runs of the step, in the
//! worse direction. Alarm: `check`'s exit 1 (regression beyond a 3 % tolerance in the last
//! 10 runs). False alarms: `check` after every run of a steady series of 1,000 runs (after
//! 30 to start), counted per run that would fail its CI job.
//!
//! A 0 % step is a steady series: "found" there is a false change point near run 30.
//! With `HISTORY_CSV_DIR=DIR`, writes each case's first 20 final series as CSV, with this
//! judge's change points, for `lab/history-vs-otava` (Apache Otava on the same series).

use rdmabench::history::changepoint::Options;
use rdmabench::history::check::{Figure, Judge, judge_series};
use rdmabench::history::model::{PointRow, RunRow, series};
use rdmabench::report::metrics::Stats;
use rdmabench::stats::rng::SplitMix as Rng;

#[derive(Clone, Copy)]
enum Model {
    Bandwidth,
    TwoSpeedLatency,
}

impl Model {
    fn metric(self) -> &'static str {
        match self {
            Model::Bandwidth => "gbps",
            Model::TwoSpeedLatency => "p50_us",
        }
    }
    /// One run's 5 repeats; `worse` = 0.05 makes them 5 % worse.
    fn run(self, rng: &mut Rng, worse: f64) -> Vec<f64> {
        match self {
            Model::Bandwidth => {
                let day = 1.0 + 0.01 * rng.normal();
                (0..5).map(|_| 100.0 * day * (1.0 + 0.0175 * rng.normal()) * (1.0 - worse)).collect()
            }
            Model::TwoSpeedLatency => {
                let repeat = |rng: &mut Rng| {
                    if rng.uniform() < 0.3 {
                        35.0 * (1.0 + 0.05 * rng.normal())
                    } else {
                        20.0 * (1.0 + 0.03 * rng.normal())
                    }
                };
                (0..5).map(|_| repeat(rng) * (1.0 + worse)).collect()
            }
        }
    }
}

fn rows(values: &[Vec<f64>], metric: &str) -> (Vec<RunRow>, Vec<PointRow>) {
    let runs = (1..=values.len() as i64)
        .map(|id| RunRow {
            id,
            added_unix_s: id as f64,
            finished_unix_s: id as f64,
            label: String::new(),
            workload: "w".into(),
            setup: "s".into(),
            host: "h".into(),
            tool_version: "0".into(),
            firmware: String::new(),
            driver: String::new(),
            kernel: String::new(),
            verdict: "pass".into(),
        })
        .collect();
    let points = values
        .iter()
        .enumerate()
        .map(|(i, v)| (i, v, Stats::of(v.clone()).expect("5 repeats")))
        .map(|(i, v, st)| PointRow {
            run_id: i as i64 + 1,
            step: "s".into(),
            rail: String::new(),
            size: 65536,
            metric: metric.into(),
            median: st.median,
            min: st.min,
            max: st.max,
            repeats: 5,
            values: v.clone(),
            tolerance_pct: None,
        })
        .collect();
    (runs, points)
}

fn judge(figure: Figure) -> Judge {
    Judge { options: Options::default(), figure, tolerance_pct: 3.0, window: 200, recent: 10 }
}

/// (found after k runs, alarm after k runs) for one trial; None when not within 10.
fn trial(
    model: Model,
    figure: Figure,
    step: f64,
    rng: &mut Rng,
    csv: Option<&mut String>,
) -> (Option<usize>, Option<usize>) {
    let mut values: Vec<Vec<f64>> = (0..30).map(|_| model.run(rng, 0.0)).collect();
    let (mut found, mut alarm) = (None, None);
    for k in 1..=10 {
        values.push(model.run(rng, step));
        let (runs, points) = rows(&values, model.metric());
        let report = judge_series(&series(&runs, &points)[0], &judge(figure));
        let worse = |c: &&rdmabench::history::check::Change| match model {
            Model::Bandwidth => c.change_pct < 0.0,
            Model::TwoSpeedLatency => c.change_pct > 0.0,
        };
        if found.is_none() && report.changes.iter().filter(worse).any(|c| c.position.abs_diff(30) <= 2) {
            found = Some(k);
        }
        if alarm.is_none() && report.regressed {
            alarm = Some(k);
        }
    }
    if let Some(out) = csv {
        // The final series, and this judge's change points in it (0-based positions) after
        // a '#' line, for lab/history-vs-otava.
        let (runs, points) = rows(&values, model.metric());
        let s = &series(&runs, &points)[0];
        for (i, p) in s.points.iter().enumerate() {
            let v = Figure::Auto.of(model.metric(), p.1);
            out.push_str(&format!("2026-01-01 {:02}:{:02}:00 +0000,{},{v}\n", i / 60, i % 60, i + 1));
        }
        let found: Vec<String> =
            judge_series(s, &judge(figure)).changes.iter().map(|c| c.position.to_string()).collect();
        out.push_str(&format!("# rdmabench {}\n", found.join(" ")));
    }
    (found, alarm)
}

fn main() {
    let trials: usize = std::env::var("HISTORY_TRIALS").ok().and_then(|s| s.parse().ok()).unwrap_or(400);
    let csv_dir = std::env::var("HISTORY_CSV_DIR").ok();
    println!("history_detection: {trials} trials per case, 30 runs before the step, check after each run");
    println!(
        "{:<26} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "model", "step", "found<=3", "found<=5", "found<=10", "median k", "alarm<=5"
    );
    let cases = [
        (Model::Bandwidth, Figure::Auto, "bandwidth"),
        (Model::Bandwidth, Figure::Repeats, "bandwidth repeats"),
        (Model::TwoSpeedLatency, Figure::Auto, "two-speed latency"),
        (Model::TwoSpeedLatency, Figure::Best, "two-speed latency best"),
        (Model::TwoSpeedLatency, Figure::Repeats, "two-speed latency repeats"),
    ];
    for (model, figure, name) in cases {
        for step in [0.0, 0.03, 0.05, 0.10] {
            let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15 ^ (step * 1000.0) as u64);
            let mut ks = Vec::new();
            let (mut f3, mut f5, mut f10, mut a5) = (0, 0, 0, 0);
            for t in 0..trials {
                let mut text = String::from("time,run,value\n");
                let keep = csv_dir.is_some() && t < 20;
                let (found, alarm) = trial(model, figure, step, &mut rng, keep.then_some(&mut text));
                if let (Some(dir), true) = (&csv_dir, keep) {
                    let file = format!("{dir}/{}-{}pct-{t:02}.csv", name.replace(' ', "-"), (step * 100.0) as u32);
                    std::fs::write(file, &text).expect("writable CSV directory");
                }
                if let Some(k) = found {
                    ks.push(k);
                    f3 += usize::from(k <= 3);
                    f5 += usize::from(k <= 5);
                    f10 += 1;
                }
                a5 += usize::from(alarm.is_some_and(|k| k <= 5));
            }
            ks.sort_unstable();
            let pct = |n: usize| format!("{:.1}%", n as f64 * 100.0 / trials as f64);
            let med = ks.get(ks.len() / 2).map_or("-".into(), |k| k.to_string());
            println!(
                "{name:<26} {:>5.0}% {:>10} {:>10} {:>10} {:>10} {:>10}",
                step * 100.0,
                pct(f3),
                pct(f5),
                pct(f10),
                med,
                pct(a5)
            );
        }
        // False alarms: one long steady series, checked after every run.
        let mut rng = Rng::new(0x2545_f491_4f6c_dd1d);
        let mut values: Vec<Vec<f64>> = (0..30).map(|_| model.run(&mut rng, 0.0)).collect();
        let (mut alarms, mut with_change, runs) = (0, 0, 1000);
        for _ in 0..runs {
            values.push(model.run(&mut rng, 0.0));
            let start = values.len().saturating_sub(200);
            let (r, p) = rows(&values[start..], model.metric());
            let report = judge_series(&series(&r, &p)[0], &judge(figure));
            alarms += usize::from(report.regressed);
            with_change += usize::from(!report.changes.is_empty());
        }
        println!(
            "{name:<26} steady: {alarms} false alarms per {runs} runs (check exits 1); change points shown in {with_change} \
             of the {runs} checks"
        );
    }
}
