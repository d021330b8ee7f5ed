//! Comparisons of crafted run documents.

use std::collections::BTreeMap;

use super::*;
use crate::report::metrics::SizeStats;
use crate::report::run::StepRecord;

fn env(device: &str, mtu: u32) -> crate::report::Environment {
    serde_json::from_value(serde_json::json!({
        "tool_version": "0.1.0", "host": "a", "device": device, "port": 1, "link_layer": "Ethernet",
        "gid_index": 1, "gid": "::ffff:10.0.0.1", "gid_type": "RoCEv2", "mtu": mtu, "active_mtu": 4096,
        "inline_size": 0, "max_inline": 0, "link_rate_gbps": 100.0,
        "peer": {"host": "b", "address": "x", "device": device, "port": 1, "gid_index": 1, "gid": "g"}
    }))
    .unwrap()
}

fn doc(device: &str, metric: &str, values: &[f64], tolerance: Option<f64>) -> RunDocument {
    let mut metrics = BTreeMap::new();
    metrics.insert(metric.to_string(), Stats::of(values.to_vec()).unwrap());
    RunDocument {
        schema: "rdmabench/run".into(),
        schema_version: 1,
        tool_version: "0.1.0".into(),
        workload: "w".into(),
        workload_file: "w.toml".into(),
        finished_unix_s: 0.0,
        environment: Some(env(device, 4096)),
        steps: vec![StepRecord {
            name: "bw".into(),
            kind: "measure".into(),
            spec: None,
            repeat: values.len() as u32,
            runs: Vec::new(),
            stats: vec![SizeStats { size: 65536, metrics, counters: BTreeMap::new() }],
            thresholds: Vec::new(),
            tolerance: tolerance.map(|t| BTreeMap::from([(metric.to_string(), t)])).unwrap_or_default(),
            checks: Vec::new(),
            rails: Vec::new(),
            error: None,
            verdict: "pass".into(),
            duration_s: 1.0,
        }],
        verdict: "pass".into(),
    }
}

fn verdict(base: &RunDocument, cur: &RunDocument, tol: f64) -> Verdict {
    let c = compare(base, cur, tol, false).unwrap();
    assert_eq!(c.rows.len(), 1);
    c.rows[0].verdict
}

#[test]
fn bandwidth_drop_beyond_tolerance_is_a_regression() {
    let v = verdict(&doc("mlx5_0", "gbps", &[100.0], None), &doc("mlx5_0", "gbps", &[90.0], None), 5.0);
    assert_eq!(v, Verdict::Regressed);
    let v = verdict(&doc("mlx5_0", "gbps", &[100.0], None), &doc("mlx5_0", "gbps", &[96.0], None), 5.0);
    assert_eq!(v, Verdict::Same);
}

#[test]
fn latency_directions_are_right() {
    let base = doc("mlx5_0", "p50_us", &[2.0], None);
    assert_eq!(verdict(&base, &doc("mlx5_0", "p50_us", &[2.5], None), 5.0), Verdict::Regressed);
    assert_eq!(verdict(&base, &doc("mlx5_0", "p50_us", &[1.5], None), 5.0), Verdict::Improved);
}

#[test]
fn overlapping_repeats_are_noise_and_separate_ones_are_not() {
    let base = doc("rxe0", "gbps", &[0.40, 0.50, 0.60], None);
    let noisy = doc("rxe0", "gbps", &[0.35, 0.42, 0.55], None);
    assert_eq!(verdict(&base, &noisy, 5.0), Verdict::WithinNoise);
    let slower = doc("rxe0", "gbps", &[0.20, 0.25, 0.30], None);
    assert_eq!(verdict(&base, &slower, 5.0), Verdict::Regressed);
}

#[test]
fn per_metric_tolerance_from_the_workload_wins() {
    let base = doc("mlx5_0", "gbps", &[100.0], None);
    let cur = doc("mlx5_0", "gbps", &[85.0], Some(20.0));
    let c = compare(&base, &cur, 5.0, false).unwrap();
    assert_eq!(c.rows[0].tolerance_pct, 20.0);
    assert_eq!(c.rows[0].verdict, Verdict::Same);
}

#[test]
fn different_environments_are_refused_unless_allowed() {
    let base = doc("mlx5_0", "gbps", &[100.0], None);
    let cur = doc("rxe0", "gbps", &[100.0], None);
    let e = compare(&base, &cur, 5.0, false).unwrap_err();
    assert!(matches!(e, Error::Usage(_)));
    assert!(e.message().contains("device: baseline mlx5_0, current rxe0"), "{}", e.message());
    let c = compare(&base, &cur, 5.0, true).unwrap();
    assert_eq!(c.environment_differences.len(), 1);
    let mut other_mtu = doc("mlx5_0", "gbps", &[100.0], None);
    other_mtu.environment = Some(env("mlx5_0", 1024));
    assert!(compare(&base, &other_mtu, 5.0, false).unwrap_err().message().contains("path MTU"));
}

#[test]
fn a_missing_step_is_reported_as_missing_and_fails_the_comparison() {
    let base = doc("mlx5_0", "gbps", &[100.0], None);
    let mut cur = doc("mlx5_0", "gbps", &[100.0], None);
    cur.steps[0].name = "renamed".into();
    let c = compare(&base, &cur, 5.0, false).unwrap();
    assert_eq!(c.missing, ["step \"bw\""]);
    assert_eq!(c.regressed(), 0, "missing is not regressed");
    assert!(c.failed());
    let why = c.failure().unwrap();
    assert!(why.contains("1 missing") && why.contains("step \"bw\"") && !why.contains("regress"), "{why}");
    let mut out = Vec::new();
    print(&c, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("MISSING step \"bw\"") && text.contains("fails the comparison"), "{text}");
    assert!(text.contains("0 regressed") && text.contains("1 missing"), "{text}");
    // A regression and a missing step: both named, each as what it is.
    let mut cur = doc("mlx5_0", "gbps", &[50.0], None);
    cur.steps.push(cur.steps[0].clone());
    cur.steps[1].name = "extra".into();
    let mut base2 = base.clone();
    base2.steps.push(base.steps[0].clone());
    base2.steps[1].name = "gone".into();
    let why = compare(&base2, &cur, 5.0, false).unwrap().failure().unwrap();
    assert!(why.starts_with("1 metric(s) regressed and 1 missing"), "{why}");
    // Nothing regressed, nothing missing: passes.
    assert_eq!(compare(&base, &base, 5.0, false).unwrap().failure(), None);
}

#[test]
fn figures_keep_significant_digits_at_any_magnitude() {
    // A message rate of 0.000938 Mpps against 0.000469: "0.000" on both sides would hide it.
    let base = doc("mlx5_0", "mpps", &[0.000938], None);
    let cur = doc("mlx5_0", "mpps", &[0.000469], None);
    let c = compare(&base, &cur, 5.0, false).unwrap();
    let mut out = Vec::new();
    print(&c, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("0.0009380") && text.contains("0.0004690"), "{text}");
    assert!(text.contains("-50.0%") && text.contains("REGRESSED"), "{text}");
}

fn with_rails(mut d: RunDocument, rails: &[(&str, f64)]) -> RunDocument {
    let step = &mut d.steps[0];
    step.rails = rails
        .iter()
        .enumerate()
        .map(|(i, (device, gbps))| crate::report::run::RailStep {
            rail: i as u32,
            device: device.to_string(),
            peer_device: format!("peer_{device}"),
            link_rate_gbps: Some(100.0),
            counters: Vec::new(),
            runs: Vec::new(),
            stats: vec![SizeStats {
                size: 65536,
                metrics: BTreeMap::from([("gbps".to_string(), Stats::of(vec![*gbps]).unwrap())]),
                counters: BTreeMap::new(),
            }],
            error: None,
        })
        .collect();
    d
}

#[test]
fn rails_match_by_position_and_device_and_a_weak_rail_shows() {
    let base = with_rails(doc("mlx5_0", "gbps", &[200.0], None), &[("mlx5_0", 100.0), ("mlx5_1", 100.0)]);
    let cur = with_rails(doc("mlx5_0", "gbps", &[190.0], None), &[("mlx5_0", 100.0), ("mlx5_1", 90.0)]);
    let c = compare(&base, &cur, 5.0, false).unwrap();
    assert_eq!(c.rows.len(), 3, "the total and each rail: {:?}", c.rows);
    let weak = c.rows.iter().find(|r| r.rail.as_deref() == Some("rail 1 (mlx5_1 -> peer_mlx5_1)")).unwrap();
    assert_eq!(weak.verdict, Verdict::Regressed);
    assert!(weak.label().starts_with("bw [rail 1 (mlx5_1"), "{}", weak.label());
    // A rail on another device is not the same rail: it is missing, and says what is there.
    let moved = with_rails(doc("mlx5_0", "gbps", &[200.0], None), &[("mlx5_0", 100.0), ("mlx5_3", 100.0)]);
    let c = compare(&base, &moved, 5.0, false).unwrap();
    assert!(c.failed());
    assert!(
        c.missing[0].contains("rail 1 (mlx5_1") && c.missing[0].contains("this run: rail 1 (mlx5_3"),
        "{:?}",
        c.missing
    );
    // A version-1 baseline (no rails) still compares the step's figures.
    let c = compare(&doc("mlx5_0", "gbps", &[200.0], None), &cur, 5.0, false).unwrap();
    assert_eq!((c.rows.len(), c.missing.len()), (1, 0));
}

#[test]
fn counters_are_compared_only_when_asked_and_regress_above_every_baseline_repeat() {
    let with_counters = |values: &[f64]| {
        let mut d = doc("rxe0", "gbps", &[10.0], None);
        d.steps[0].stats[0].counters =
            BTreeMap::from([("completer_retry_err".to_string(), Stats::of(values.to_vec()).unwrap())]);
        d
    };
    let (base, cur) = (with_counters(&[0.0, 2.0]), with_counters(&[40.0]));
    assert_eq!(compare(&base, &cur, 5.0, false).unwrap().rows.len(), 1, "speed only by default");
    let c = crate::regress::compare_counting(&base, &cur, 5.0, false, true).unwrap();
    let row = c.rows.iter().find(|r| r.metric == "counter:completer_retry_err").unwrap();
    assert_eq!(row.verdict, Verdict::Regressed, "40 is above every baseline repeat");
    let same = crate::regress::compare_counting(&base, &with_counters(&[1.0]), 5.0, false, true).unwrap();
    assert!(same.rows.iter().all(|r| r.verdict == Verdict::Same), "{:?}", same.rows);
    // A counter the current run never moved counts 0 there.
    let quiet = doc("rxe0", "gbps", &[10.0], None);
    let better = crate::regress::compare_counting(&with_counters(&[3.0]), &quiet, 5.0, false, true).unwrap();
    assert_eq!(better.rows.iter().find(|r| r.metric.starts_with("counter:")).unwrap().verdict, Verdict::Improved);
}
