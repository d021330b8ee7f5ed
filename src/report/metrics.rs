//! The figures thresholds and comparisons judge: extracted from a size's result, gathered
//! over a step's repeats (median, min, max), and checked against limits. Pure.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::SizeResult;
use crate::units::Sig;
use crate::verbs::counters;

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
    /// The port counters that moved in any repeat: this side's by name, the peer's as
    /// `peer:<name>`; a repeat where one did not move counts 0, so `values` line up with
    /// the repeats. Not metrics: comparisons leave them out unless asked (`--counters`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counters: BTreeMap<String, Stats>,
}

/// The prefix of the peer's counters in [`SizeStats::counters`].
pub const PEER: &str = "peer:";

/// Every repeat's counter deltas of one size, both sides, aligned by repeat.
fn counter_stats(results: &[&SizeResult]) -> BTreeMap<String, Stats> {
    let sides = |r: &SizeResult| -> Vec<(String, u64)> {
        let ours = r.counters.iter().flatten().map(|(k, v)| (k.clone(), *v));
        let theirs = r.peer_counters.iter().flatten().map(|(k, v)| (format!("{PEER}{k}"), *v));
        ours.chain(theirs).collect()
    };
    let mut names: Vec<String> = results.iter().flat_map(|r| sides(r)).map(|(k, _)| k).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter_map(|name| {
            let values =
                results.iter().map(|r| sides(r).iter().find(|(k, _)| *k == name).map_or(0.0, |(_, v)| *v as f64));
            Stats::of(values.collect()).map(|s| (name, s))
        })
        .collect()
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
            let results: Vec<&SizeResult> = runs.iter().flatten().filter(|r| r.size == size).collect();
            SizeStats { size, metrics, counters: counter_stats(&results) }
        })
        .collect()
}

/// Thresholds over rails rather than one metric of one result: the slowest rail within a
/// percentage of the fastest (`max_rail_spread`, on gbps, or p50_us for latency tests),
/// and each rail's bandwidth as a percentage of its port's active rate (`min_line_rate`).
pub const RAIL_THRESHOLDS: &[(&str, &str, &str)] = &[
    ("max_rail_spread", "rail_spread_pct", "slowest rail's shortfall from the fastest, % (gbps; p50_us for latency)"),
    ("min_line_rate", "line_rate_pct", "a rail's average bandwidth, % of its port's active rate"),
];

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
        if let Some(&(_, metric, _)) = RAIL_THRESHOLDS.iter().find(|t| t.0 == key) {
            if !(limit.is_finite() && limit > 0.0 && limit <= 100.0) {
                return Err(format!("threshold `{key}` = {limit} is a percentage; use a number in (0, 100], like 90"));
            }
            return Ok(Threshold { key: key.into(), metric: metric.into(), limit, at_least: key.starts_with("min_") });
        }
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

    /// `[step.max_counters]`'s `name = limit`: at most `limit` events of a port counter
    /// (or an alias such as `retransmissions`) per size, on either side, in any repeat.
    pub fn counter(name: &str, limit: f64) -> Result<Threshold, String> {
        // Any driver's counter, as rdmabench shows it (`names`: an odd file name defused).
        let shown = !name.is_empty() && name.len() <= crate::names::MAX_NAME && crate::names::from_peer(name) == name;
        if !shown {
            return Err(format!(
                "`{name}` is not a counter name; use a file name of the port's counters/ or hw_counters/ as \
                 --counters prints it (e.g. completer_retry_err, rx_icrc_encapsulated) or one of {}",
                counters::ALIASES.iter().map(|a| a.0).collect::<Vec<_>>().join(", ")
            ));
        }
        if !(limit.is_finite() && limit >= 0.0 && limit.fract() == 0.0) {
            return Err(format!("counter limit {name} = {limit} is no count; use a whole number >= 0, like 0"));
        }
        Ok(Threshold {
            key: format!("max_counters.{name}"),
            metric: format!("{COUNTER}{name}"),
            limit,
            at_least: false,
        })
    }

    /// The counter a `max_counters` threshold limits.
    pub fn counter_name(&self) -> Option<&str> {
        self.metric.strip_prefix(COUNTER)
    }

    pub fn passes(&self, value: f64) -> bool {
        if self.at_least { value >= self.limit } else { value <= self.limit }
    }

    /// Whether this threshold is judged over rails (spread, line rate) rather than per result.
    pub fn over_rails(&self) -> bool {
        RAIL_THRESHOLDS.iter().any(|t| t.0 == self.key)
    }
}

/// How a counter threshold's metric is named: `counter:<name>`.
pub const COUNTER: &str = "counter:";

/// The threshold keys a workload accepts.
pub fn threshold_keys() -> Vec<String> {
    METRICS
        .iter()
        .map(|(m, _, b)| match b {
            Better::Higher => format!("min_{m}"),
            Better::Lower => format!("max_{m}"),
        })
        .chain(RAIL_THRESHOLDS.iter().map(|t| t.0.to_string()))
        .collect()
}

/// The verdict of one threshold at one size, judged on the median of the repeats.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThresholdVerdict {
    #[serde(flatten)]
    pub threshold: Threshold,
    pub size: u64,
    /// The rail judged (a step with several rails judges each); None: the whole step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rail: Option<u32>,
    /// Which rails a spread was measured between, or why a figure is missing.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    /// The median over the repeats; None when the step did not produce the metric.
    pub value: Option<f64>,
    pub pass: bool,
}

impl ThresholdVerdict {
    pub fn describe(&self) -> String {
        let op = if self.threshold.at_least { ">=" } else { "<=" };
        let rail = self.rail.map_or(String::new(), |r| format!(" on rail {r}"));
        let detail = if self.detail.is_empty() { String::new() } else { format!(" ({})", self.detail) };
        // Counts are whole: 336, not 336.0.
        let shown = |v: f64| if self.threshold.counter_name().is_some() { format!("{v}") } else { Sig(v).to_string() };
        match self.value {
            Some(v) => format!(
                "{}{rail} at {} B: {} {op} {} {}{detail}",
                self.threshold.metric,
                self.size,
                shown(v),
                self.threshold.limit,
                if self.pass { "pass" } else { "FAIL" }
            ),
            None => format!("{}{rail} at {} B: not measured FAIL{detail}", self.threshold.metric, self.size),
        }
    }
}

/// One rail's figures as thresholds see them.
pub struct RailFigures<'a> {
    pub rail: u32,
    pub device: &'a str,
    pub stats: &'a [SizeStats],
    /// The port's active rate, Gb/s, when the device reports one.
    pub link_rate_gbps: Option<f64>,
    /// The counters this rail's port has (`Environment::counters`).
    pub counters: &'a [String],
}

fn verdict(t: &Threshold, size: u64, rail: Option<u32>, value: Option<f64>, detail: String) -> ThresholdVerdict {
    ThresholdVerdict { threshold: t.clone(), size, rail, detail, value, pass: value.is_some_and(|v| t.passes(v)) }
}

/// Judges a step: with one rail (`rails` holds it), every threshold on its figures; with
/// several, each per-result threshold on every rail, the line rate per rail, and the
/// spread between the rails per size.
pub fn judge(thresholds: &[Threshold], rails: &[RailFigures]) -> Vec<ThresholdVerdict> {
    let many = rails.len() > 1;
    let mut out = Vec::new();
    for t in thresholds {
        if t.metric == "rail_spread_pct" {
            out.extend(spread_verdicts(t, rails));
            continue;
        }
        if let Some(name) = t.counter_name() {
            for r in rails {
                for s in r.stats {
                    let (value, detail) = counter_figure(name, r, s);
                    out.push(verdict(t, s.size, many.then_some(r.rail), value, detail));
                }
            }
            continue;
        }
        for r in rails {
            let rail = many.then_some(r.rail);
            for s in r.stats {
                let gbps = s.metrics.get("gbps").map(|m| m.median);
                let (value, detail) = match t.metric.as_str() {
                    "line_rate_pct" => match (gbps, r.link_rate_gbps) {
                        (Some(g), Some(rate)) if rate > 0.0 => {
                            (Some(g / rate * 100.0), format!("{} of {rate} Gb/s on {}", Sig(g), r.device))
                        }
                        (None, _) => (None, "a bandwidth test has a line rate; this is not one".into()),
                        _ => (None, format!("{} reports no link rate", r.device)),
                    },
                    m => (s.metrics.get(m).map(|x| x.median), String::new()),
                };
                out.push(verdict(t, s.size, rail, value, detail));
            }
        }
    }
    out
}

/// A counter (or alias) at one size: the most events in any repeat on either side, and
/// where it was seen. None when neither port has such a counter.
fn counter_figure(name: &str, r: &RailFigures, s: &SizeStats) -> (Option<f64>, String) {
    let repeats = s.counters.values().map(|c| c.values.len()).max().unwrap_or(1);
    let side = |prefix: &str| -> Option<f64> {
        let members = counters::members(name);
        let has = |m: &str| r.counters.iter().any(|a| a == m) || s.counters.contains_key(&format!("{prefix}{m}"));
        if !members.iter().any(|m| has(m)) {
            return None;
        }
        let in_repeat = |i: usize| -> f64 {
            members.iter().filter_map(|m| s.counters.get(&format!("{prefix}{m}"))).map(|c| c.values[i]).sum()
        };
        Some((0..repeats).map(in_repeat).fold(0.0, f64::max))
    };
    match (side(""), side(PEER)) {
        (None, None) => (None, format!("{} has no counter {name}", r.device)),
        (ours, theirs) => {
            let show = |v: Option<f64>| v.map_or("no such counter".into(), |v| v.to_string());
            let detail = format!("this side {}, peer {}, most in a repeat", show(ours), show(theirs));
            (Some(ours.unwrap_or(0.0).max(theirs.unwrap_or(0.0))), detail)
        }
    }
}

/// The slowest rail's shortfall from the fastest, per size: on gbps (higher is better),
/// else p50_us (lower is better). One rail has no spread: the threshold holds.
fn spread_verdicts(t: &Threshold, rails: &[RailFigures]) -> Vec<ThresholdVerdict> {
    let Some(first) = rails.first() else { return Vec::new() };
    first
        .stats
        .iter()
        .map(|s0| {
            let figure = |r: &RailFigures| -> Option<(f64, Better)> {
                let s = r.stats.iter().find(|s| s.size == s0.size)?;
                s.metrics
                    .get("gbps")
                    .map(|m| (m.median, Better::Higher))
                    .or_else(|| s.metrics.get("p50_us").map(|m| (m.median, Better::Lower)))
            };
            let figures: Vec<(u32, f64, Better)> =
                rails.iter().filter_map(|r| figure(r).map(|(v, b)| (r.rail, v, b))).collect();
            if figures.len() < rails.len() {
                return verdict(t, s0.size, None, None, "a rail did not measure this size".into());
            }
            let better = figures[0].2;
            let key = |f: &&(u32, f64, Better)| if better == Better::Higher { f.1 } else { -f.1 };
            let best = figures.iter().max_by(|a, b| key(a).total_cmp(&key(b))).expect("one rail at least");
            let worst = figures.iter().min_by(|a, b| key(a).total_cmp(&key(b))).expect("one rail at least");
            let pct = if best.1 == 0.0 { 0.0 } else { (best.1 - worst.1).abs() / best.1 * 100.0 };
            let unit = if better == Better::Higher { "gbps" } else { "p50_us" };
            let detail =
                format!("{unit}: slowest rail {} {}, fastest rail {} {}", worst.0, Sig(worst.1), best.0, Sig(best.1));
            verdict(t, s0.size, None, Some(pct), detail)
        })
        .collect()
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
        let v = judge(&t, &[RailFigures { rail: 0, device: "d", stats: &s, link_rate_gbps: None, counters: &[] }]);
        let find = |size, m: &str| v.iter().find(|x| x.size == size && x.threshold.metric == m).unwrap();
        assert!(!find(4096, "gbps").pass, "median 10 < 15");
        assert!((find(4096, "gbps").value.unwrap() - 10.0).abs() < 1e-3);
        assert!(find(65536, "gbps").pass);
        assert!(!find(65536, "p99_us").pass && find(65536, "p99_us").value.is_none(), "bandwidth has no latency");
    }

    #[test]
    fn every_rail_meets_the_bar_the_spread_shows_a_weak_rail_and_line_rate_scales_to_the_port() {
        let r0 = gather(&[vec![bw(65536, 180.0)]]);
        let r1 = gather(&[vec![bw(65536, 150.0)]]);
        let rails = [
            RailFigures { rail: 0, device: "mlx5_0", stats: &r0, link_rate_gbps: Some(200.0), counters: &[] },
            RailFigures { rail: 1, device: "mlx5_1", stats: &r1, link_rate_gbps: Some(200.0), counters: &[] },
        ];
        let t = [
            Threshold::parse("min_gbps", 100.0).unwrap(),
            Threshold::parse("max_rail_spread", 10.0).unwrap(),
            Threshold::parse("min_line_rate", 85.0).unwrap(),
        ];
        let v = judge(&t, &rails);
        let find = |m: &str, rail| v.iter().find(|x| x.threshold.metric == m && x.rail == rail).unwrap();
        assert!(find("gbps", Some(0)).pass && find("gbps", Some(1)).pass, "both above the absolute bar");
        let spread = find("rail_spread_pct", None);
        assert!(!spread.pass, "150 is 16.7 % short of 180");
        assert!((spread.value.unwrap() - 16.666).abs() < 0.01);
        assert!(spread.describe().contains("slowest rail 1 150"), "{}", spread.describe());
        assert!(find("line_rate_pct", Some(0)).pass, "180 of 200 = 90 %");
        let weak = find("line_rate_pct", Some(1));
        assert!(!weak.pass && weak.describe().contains("on rail 1") && weak.describe().contains("mlx5_1"));
        // No link rate: the line-rate threshold cannot hold, and says why.
        let unknown = [RailFigures { rail: 0, device: "rxe0", stats: &r0, link_rate_gbps: None, counters: &[] }];
        let v = judge(&t[2..], &unknown);
        assert!(!v[0].pass && v[0].describe().contains("rxe0 reports no link rate"), "{}", v[0].describe());
        // One rail: nothing to spread.
        let v = judge(&t[1..2], &unknown);
        assert!(v[0].pass && v[0].value == Some(0.0));
        assert!(Threshold::parse("min_line_rate", 120.0).unwrap_err().contains("percentage"));
    }

    fn counted(size: u64, ours: &[(&str, u64)], theirs: &[(&str, u64)]) -> SizeResult {
        let map = |v: &[(&str, u64)]| Some(v.iter().map(|(k, v)| (k.to_string(), *v)).collect());
        SizeResult { counters: map(ours), peer_counters: map(theirs), ..bw(size, 10.0) }
    }

    #[test]
    fn counter_thresholds_take_the_worst_repeat_of_either_side_and_name_the_counter() {
        // Repeat 2 retransmitted on this side; the peer saw duplicates in repeat 1.
        let runs = vec![
            vec![counted(4096, &[("sent_pkts", 100)], &[("duplicate_request", 2)])],
            vec![counted(4096, &[("sent_pkts", 100), ("completer_retry_err", 7)], &[])],
        ];
        let s = gather(&runs);
        assert_eq!(s[0].counters["completer_retry_err"].values, [0.0, 7.0], "aligned by repeat");
        assert_eq!(s[0].counters["peer:duplicate_request"].values, [2.0, 0.0]);
        let available: Vec<String> = ["completer_retry_err", "duplicate_request", "sent_pkts"].map(String::from).into();
        let figures = [RailFigures { rail: 0, device: "rxe0", stats: &s, link_rate_gbps: None, counters: &available }];
        let t = [
            Threshold::counter("retransmissions", 0.0).unwrap(),
            Threshold::counter("duplicate_request", 2.0).unwrap(),
            Threshold::counter("rnr_naks", 0.0).unwrap(),
        ];
        let v = judge(&t, &figures);
        assert!(!v[0].pass && v[0].value == Some(7.0), "{}", v[0].describe());
        assert!(v[0].describe().contains("counter:retransmissions") && v[0].describe().contains("this side 7"));
        assert!(v[1].pass && v[1].value == Some(2.0), "the peer's 2 is within 2: {}", v[1].describe());
        assert!(!v[2].pass && v[2].value.is_none() && v[2].describe().contains("rxe0 has no counter rnr_naks"));
        // Nothing moved at all: the device's counters say 0, and a zero limit holds.
        let quiet = gather(&[vec![counted(4096, &[], &[])]]);
        let figures =
            [RailFigures { rail: 0, device: "rxe0", stats: &quiet, link_rate_gbps: None, counters: &available }];
        assert_eq!(judge(&t[..1], &figures)[0].value, Some(0.0));
        assert!(Threshold::counter("retransmissions", -1.0).unwrap_err().contains("whole number"));
        assert!(Threshold::counter("bad name", 0.0).unwrap_err().contains("retransmissions"));
        assert!(Threshold::counter("", 0.0).is_err());
        for other_drivers in ["np_cnp_sent", "ip4InDiscards", "VL15_dropped", "rx-pause.total", "odd%20name"] {
            assert!(Threshold::counter(other_drivers, 0.0).is_ok(), "{other_drivers}");
        }
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
