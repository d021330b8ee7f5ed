//! The figures thresholds and comparisons judge: extracted from a size's result, gathered
//! over a step's repeats (median, min, max), and checked against limits. Pure.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::SizeResult;
use crate::units::Sig;

/// Which way is better for a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    Higher,
    Lower,
}

/// Every metric a step can be judged on: name, what it means, which way is better.
pub const METRICS: &[(&str, &str, Better)] = &[
    ("gbps", "average bandwidth, Gb/s", Better::Higher),
    ("mpps", "message rate, Mpps", Better::Higher),
    ("p50_us", "p50 latency, us", Better::Lower),
    ("p99_us", "p99 latency, us", Better::Lower),
    ("p999_us", "p99.9 latency, us", Better::Lower),
];

pub fn better(metric: &str) -> Option<Better> {
    METRICS.iter().find(|m| m.0 == metric).map(|m| m.2)
}

/// The metrics one size's result has.
pub fn of(r: &SizeResult) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    if let Some(bw) = &r.bandwidth {
        m.insert("gbps".into(), bw.avg_bytes_per_sec * 8.0 / 1e9);
        m.insert("mpps".into(), bw.msg_rate_mpps);
    }
    if let Some(l) = &r.latency {
        m.insert("p50_us".into(), l.summary.p50_ns / 1e3);
        m.insert("p99_us".into(), l.summary.p99_ns / 1e3);
        m.insert("p999_us".into(), l.summary.p999_ns / 1e3);
    }
    m
}

/// One metric over a step's repeats.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// Every repeat's value, in run order.
    pub values: Vec<f64>,
}

impl Stats {
    pub fn of(values: Vec<f64>) -> Option<Stats> {
        if values.is_empty() {
            return None;
        }
        let mut sorted = values.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 { sorted[n / 2] } else { (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0 };
        Some(Stats { median, min: sorted[0], max: sorted[n - 1], values })
    }
}

/// A size's metrics over the repeats.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SizeStats {
    pub size: u64,
    pub metrics: BTreeMap<String, Stats>,
}

/// Gathers `runs` (one list of size results per repeat) into per-size statistics.
pub fn gather(runs: &[Vec<SizeResult>]) -> Vec<SizeStats> {
    let mut sizes: Vec<u64> = runs.iter().flatten().map(|r| r.size).collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
        .into_iter()
        .map(|size| {
            let mut per_metric: BTreeMap<String, Vec<f64>> = BTreeMap::new();
            for r in runs.iter().flatten().filter(|r| r.size == size) {
                for (k, v) in of(r) {
                    per_metric.entry(k).or_default().push(v);
                }
            }
            let metrics = per_metric.into_iter().filter_map(|(k, v)| Stats::of(v).map(|s| (k, s))).collect();
            SizeStats { size, metrics }
        })
        .collect()
}

/// A threshold: `min_gbps = 10` is (gbps, at least 10).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Threshold {
    /// The workload key, e.g. `max_p99_us`.
    pub key: String,
    pub metric: String,
    pub limit: f64,
    /// True: the value must be at least `limit`; false: at most.
    pub at_least: bool,
}

impl Threshold {
    /// `min_<metric>` or `max_<metric>`, for a known metric whose better direction fits.
    pub fn parse(key: &str, limit: f64) -> Result<Threshold, String> {
        let (at_least, metric) = match (key.strip_prefix("min_"), key.strip_prefix("max_")) {
            (Some(m), _) => (true, m),
            (_, Some(m)) => (false, m),
            _ => return Err(format!("unknown threshold `{key}`; use one of {}", threshold_keys().join(", "))),
        };
        match better(metric) {
            Some(Better::Higher) if at_least => {}
            Some(Better::Lower) if !at_least => {}
            _ => return Err(format!("unknown threshold `{key}`; use one of {}", threshold_keys().join(", "))),
        }
        if !(limit.is_finite() && limit > 0.0) {
            return Err(format!("threshold `{key}` = {limit} is impossible; use a positive number"));
        }
        Ok(Threshold { key: key.into(), metric: metric.into(), limit, at_least })
    }

    pub fn passes(&self, value: f64) -> bool {
        if self.at_least { value >= self.limit } else { value <= self.limit }
    }
}

/// The threshold keys a workload accepts.
pub fn threshold_keys() -> Vec<String> {
    METRICS
        .iter()
        .map(|(m, _, b)| match b {
            Better::Higher => format!("min_{m}"),
            Better::Lower => format!("max_{m}"),
        })
        .collect()
}

/// The verdict of one threshold at one size, judged on the median of the repeats.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThresholdVerdict {
    #[serde(flatten)]
    pub threshold: Threshold,
    pub size: u64,
    /// The median over the repeats; None when the step did not produce the metric.
    pub value: Option<f64>,
    pub pass: bool,
}

impl ThresholdVerdict {
    pub fn describe(&self) -> String {
        let op = if self.threshold.at_least { ">=" } else { "<=" };
        match self.value {
            Some(v) => format!(
                "{} at {} B: {} {op} {} {}",
                self.threshold.metric,
                self.size,
                Sig(v),
                self.threshold.limit,
                if self.pass { "pass" } else { "FAIL" }
            ),
            None => format!("{} at {} B: not measured by this test FAIL", self.threshold.metric, self.size),
        }
    }
}

pub fn judge(thresholds: &[Threshold], stats: &[SizeStats]) -> Vec<ThresholdVerdict> {
    let mut out = Vec::new();
    for s in stats {
        for t in thresholds {
            let value = s.metrics.get(&t.metric).map(|m| m.median);
            out.push(ThresholdVerdict {
                threshold: t.clone(),
                size: s.size,
                value,
                pass: value.is_some_and(|v| t.passes(v)),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::LatencyResult;
    use crate::stats::{LatencySummary, Peak, ThroughputSummary};

    fn lat(size: u64, p50_us: f64) -> SizeResult {
        SizeResult {
            size,
            latency: Some(LatencyResult {
                kind: "one_way".into(),
                unit: "ns".into(),
                summary: LatencySummary {
                    p50_ns: p50_us * 1e3,
                    p99_ns: p50_us * 2e3,
                    p999_ns: p50_us * 3e3,
                    ..Default::default()
                },
            }),
            ..Default::default()
        }
    }

    fn bw(size: u64, gbps: f64) -> SizeResult {
        SizeResult {
            size,
            bandwidth: Some(ThroughputSummary::new(
                size,
                1000,
                (1000.0 * size as f64 * 8.0 / gbps) as u64,
                Peak { msgs_per_sec: None, window_msgs: 1000 },
            )),
            ..Default::default()
        }
    }

    #[test]
    fn median_of_repeats_and_spread() {
        let runs = vec![vec![lat(2, 10.0)], vec![lat(2, 30.0)], vec![lat(2, 12.0)]];
        let s = gather(&runs);
        let p50 = &s[0].metrics["p50_us"];
        assert_eq!((p50.median, p50.min, p50.max), (12.0, 10.0, 30.0));
        assert_eq!(p50.values, [10.0, 30.0, 12.0]);
        let even = Stats::of(vec![1.0, 4.0, 2.0, 3.0]).unwrap();
        assert_eq!(even.median, 2.5);
    }

    #[test]
    fn thresholds_judge_the_median_per_size() {
        let runs = vec![vec![bw(4096, 9.0), bw(65536, 20.0)], vec![bw(4096, 11.0), bw(65536, 22.0)]];
        let s = gather(&runs);
        let t = [Threshold::parse("min_gbps", 15.0).unwrap(), Threshold::parse("max_p99_us", 5.0).unwrap()];
        let v = judge(&t, &s);
        let find = |size, m: &str| v.iter().find(|x| x.size == size && x.threshold.metric == m).unwrap();
        assert!(!find(4096, "gbps").pass, "median 10 < 15");
        assert!((find(4096, "gbps").value.unwrap() - 10.0).abs() < 1e-3);
        assert!(find(65536, "gbps").pass);
        assert!(!find(65536, "p99_us").pass && find(65536, "p99_us").value.is_none(), "bandwidth has no latency");
    }

    #[test]
    fn threshold_keys_are_checked() {
        assert!(Threshold::parse("min_p50_us", 1.0).is_err(), "a minimum latency makes no sense");
        assert!(Threshold::parse("max_gbps", 1.0).is_err());
        assert!(Threshold::parse("min_speed", 1.0).unwrap_err().contains("min_gbps"));
        assert!(Threshold::parse("max_p50_us", -1.0).unwrap_err().contains("positive"));
        let t = Threshold::parse("max_p999_us", 100.0).unwrap();
        assert!(t.passes(100.0) && !t.passes(100.1));
    }
}
