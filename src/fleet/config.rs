//! What an all-pairs fleet measures per pair and how it judges: a fleet workload file
//! (`workloads/fleet/all-pairs.toml`), `[measure]` and `[thresholds]`, each key with its
//! default here and nowhere else.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::attribution::Thresholds;
use crate::report::pairs::Phase;
use crate::spec::{Measure, Operation, TestSpec};

/// A fleet's ACK timeout exponent: 20 (4.096 us x 2^20 = 4.3 s), NCCL's default
/// (`NCCL_IB_TIMEOUT`), so a fleet's QPs retransmit when the cluster's jobs would, not
/// earlier. The verbs default of two-host runs (14: 67 ms) resends a whole window whenever
/// a busy host is late with its ACKs: pairs that measure at once on a node's shared CPUs
/// then retransmit with no packet lost, and on the lab's rxe such retransmissions now and
/// then end a bandwidth run with "remote invalid request" (lab notes). A packet really
/// lost costs a pair 4.3 s, which its deadlines (`--timeout`) allow for.
pub const FLEET_QP_TIMEOUT: u32 = 20;

/// What each pair runs: RDMA WRITE bandwidth (large messages, several QPs) and latency
/// (small messages), each `repeats` times after a warm-up; the medians are the pair's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Measurement {
    pub bw_size: u64,
    pub bw_qps: u32,
    pub bw_iterations: u64,
    pub lat_size: u64,
    pub lat_iterations: u64,
    pub warmup: u64,
    pub repeats: u32,
    /// The RC ACK timeout exponent of every pair's QPs (4.096 us x 2^N before RC
    /// retransmits): [`FLEET_QP_TIMEOUT`] unless the file sets it.
    pub qp_timeout: Option<u32>,
}

impl Default for Measurement {
    fn default() -> Self {
        Measurement {
            bw_size: 1 << 20,
            bw_qps: 4,
            bw_iterations: 2000,
            lat_size: 2,
            lat_iterations: 1000,
            warmup: 100,
            repeats: 3,
            qp_timeout: Some(FLEET_QP_TIMEOUT),
        }
    }
}

impl Measurement {
    pub fn check(&self) -> Result<(), String> {
        if self.repeats < 3 || self.repeats > 100 {
            return Err(format!("repeats = {}: a pair's median needs 3 to 100 repeats", self.repeats));
        }
        if !(1..=64).contains(&self.bw_qps) {
            return Err(format!("bw_qps = {}: use 1 to 64 QPs", self.bw_qps));
        }
        if self.bw_size == 0 || self.lat_size == 0 || self.bw_iterations == 0 || self.lat_iterations == 0 {
            return Err("bw_size, lat_size, bw_iterations and lat_iterations must be at least 1".into());
        }
        let fabric = self.fabric();
        fabric.check(crate::spec::options::Field::key).map_err(|r| r.message)?;
        Ok(())
    }

    /// The path every pair's QPs take: the defaults, with `qp_timeout` when given.
    pub fn fabric(&self) -> crate::spec::Fabric {
        let d = crate::spec::Fabric::default();
        crate::spec::Fabric { qp_timeout: self.qp_timeout.unwrap_or(d.qp_timeout), ..d }
    }

    /// The test a pair runs in `phase`.
    pub fn spec(&self, phase: Phase) -> TestSpec {
        match phase {
            Phase::Bandwidth => TestSpec {
                sizes: vec![self.bw_size],
                iterations: self.bw_iterations,
                num_qps: self.bw_qps,
                warmup: self.warmup,
                fabric: self.fabric(),
                ..TestSpec::new(Operation::Write, Measure::Bandwidth)
            },
            Phase::Latency => TestSpec {
                sizes: vec![self.lat_size],
                iterations: self.lat_iterations,
                warmup: self.warmup.min(self.lat_iterations),
                fabric: self.fabric(),
                ..TestSpec::new(Operation::Write, Measure::Latency)
            },
        }
    }

    /// How long one pair may take before its step's barrier gives up on a node: every
    /// run's own deadline (`--timeout`) and a generous allowance for connecting and for
    /// this day's speed. The barrier waits only as long as the slowest pair needs.
    pub fn pair_budget(&self, timeout: Duration) -> Duration {
        (timeout + Duration::from_secs(60)) * (2 * self.repeats + 2)
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetFile {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub measure: Measurement,
    #[serde(default)]
    pub thresholds: Thresholds,
}

impl FleetFile {
    pub fn parse(text: &str, path: &str) -> Result<FleetFile, String> {
        // The parser's message shows the file's line: made safe to print, bounded.
        let f: FleetFile = toml::from_str(text).map_err(|e| crate::names::quoting_error(&format!("{path}: {e}")))?;
        f.measure.check().map_err(|e| format!("{path}: [measure] {e}"))?;
        f.thresholds.check().map_err(|e| format!("{path}: [thresholds] {e}"))?;
        Ok(f)
    }

    pub fn load(path: &str) -> Result<FleetFile, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
        Self::parse(&text, path)
    }

    /// [`FleetFile::parse`] with the command line's `--measure` and `--threshold`
    /// NAME=VALUEs set over the file's `[measure]` and `[thresholds]` (the command line
    /// wins), each checked as the file's own would be.
    pub fn parse_with(text: &str, path: &str, over: &Overrides) -> Result<FleetFile, String> {
        if over.is_empty() {
            return Self::parse(text, path);
        }
        let mut doc: toml::Table = toml::from_str(text).map_err(|e| format!("{path}: {e}"))?;
        set_over(&mut doc, path, "measure", "--measure", &measure_keys(), &over.measure)?;
        set_over(&mut doc, path, "thresholds", "--threshold", &threshold_keys(), &over.thresholds)?;
        let merged = toml::to_string(&doc).map_err(|e| format!("{path}: {e}"))?;
        Self::parse(&merged, &format!("{path} with {}", over.flags()))
    }

    /// The file at `path` (or the shipped one) with `over` set over it.
    pub fn load_with(path: Option<&str>, over: &Overrides) -> Result<FleetFile, String> {
        match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| format!("cannot read {p}: {e}"))?;
                Self::parse_with(&text, p, over)
            }
            None => Self::parse_with(SHIPPED, SHIPPED_NAME, over),
        }
    }
}

/// What the command line sets over a fleet workload: `--measure NAME=VALUE` over its
/// `[measure]`, `--threshold NAME=VALUE` over its `[thresholds]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    pub measure: Vec<(String, f64)>,
    pub thresholds: Vec<(String, f64)>,
}

impl Overrides {
    pub fn is_empty(&self) -> bool {
        self.measure.is_empty() && self.thresholds.is_empty()
    }

    /// The flags as a command line gives them (`--measure bw_size=65536 --threshold ...`).
    pub fn flags(&self) -> String {
        let measure = self.measure.iter().map(|(k, v)| format!("--measure {k}={v}"));
        let thresholds = self.thresholds.iter().map(|(k, v)| format!("--threshold {k}={v}"));
        measure.chain(thresholds).collect::<Vec<_>>().join(" ")
    }
}

/// Sets `pairs` in `doc`'s table `section`, each a key of `keys` (whose default's type
/// says whether it takes a whole number).
fn set_over(
    doc: &mut toml::Table,
    path: &str,
    section: &str,
    flag: &str,
    keys: &toml::Table,
    pairs: &[(String, f64)],
) -> Result<(), String> {
    if pairs.is_empty() {
        return Ok(());
    }
    let table = doc.entry(section).or_insert_with(|| toml::Value::Table(toml::Table::new()));
    let toml::Value::Table(table) = table else {
        return Err(format!("{path}: [{section}] must be a table"));
    };
    for (name, value) in pairs {
        let Some(default) = keys.get(name) else {
            return Err(format!(
                "{flag} {name}: a fleet's [{section}] keys are {}",
                keys.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
        };
        let v = match default {
            // A count or a size: a whole number, 0 or more (the file's checks give the range).
            toml::Value::Integer(_) if value.fract() == 0.0 && *value >= 0.0 && *value <= 2f64.powi(53) => {
                toml::Value::Integer(*value as i64)
            }
            toml::Value::Integer(_) => return Err(format!("{flag} {name}={value}: use a whole number, 0 or more")),
            _ => toml::Value::Float(*value),
        };
        table.insert(name.clone(), v);
    }
    Ok(())
}

/// Every `[thresholds]` key with its default: the struct's own fields, so the list cannot
/// drift from what the parser takes.
pub fn threshold_keys() -> toml::Table {
    toml::Table::try_from(Thresholds::default()).expect("the thresholds serialise to a table")
}

/// Every `[measure]` key with its default.
pub fn measure_keys() -> toml::Table {
    toml::Table::try_from(Measurement::default()).expect("the measurement serialises to a table")
}

/// The shipped fleet workload's file name, as messages name it.
pub const SHIPPED_NAME: &str = "all-pairs.toml";

/// The fleet workload the image ships.
pub const SHIPPED: &str = include_str!("../../workloads/fleet/all-pairs.toml");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_file_holds_the_defaults() {
        let f = FleetFile::parse(SHIPPED, "all-pairs.toml").unwrap();
        assert_eq!((f.measure, f.thresholds), (Measurement::default(), Thresholds::default()));
    }

    #[test]
    fn thresholds_from_the_command_line_win_and_are_checked() {
        let t = thresholds(&[("max_flaky_pairs", 2.0), ("node_min_ratio", 0.9)]);
        let f = FleetFile::parse_with(SHIPPED, "all-pairs.toml", &t).unwrap();
        assert_eq!((f.thresholds.max_flaky_pairs, f.thresholds.node_min_ratio), (2, 0.9));
        assert_eq!(f.measure, Measurement::default(), "the measurement is the file's");
        // A file without [thresholds] takes them too.
        let bare = FleetFile::parse_with("name = \"x\"\n", "f", &t).unwrap();
        assert_eq!(bare.thresholds.max_flaky_pairs, 2);
        let e = FleetFile::parse_with(SHIPPED, "f", &thresholds(&[("min_gbps", 1.0)])).unwrap_err();
        assert!(
            e.contains("--threshold min_gbps: a fleet's [thresholds] keys are") && e.contains("max_flaky_pairs"),
            "{e}"
        );
        let e = FleetFile::parse_with(SHIPPED, "f", &thresholds(&[("max_flaky_pairs", 1.5)])).unwrap_err();
        assert!(e.contains("whole number"), "{e}");
        let e = FleetFile::parse_with(SHIPPED, "f", &thresholds(&[("node_min_ratio", 1.5)])).unwrap_err();
        assert!(e.contains("(0, 1]") && e.contains("with --threshold node_min_ratio=1.5"), "{e}");
    }

    fn thresholds(pairs: &[(&str, f64)]) -> Overrides {
        Overrides { thresholds: pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect(), ..Overrides::default() }
    }

    #[test]
    fn the_measurement_from_the_command_line_wins_and_is_checked() {
        let over = |pairs: &[(&str, f64)]| Overrides {
            measure: pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            ..Overrides::default()
        };
        let f =
            FleetFile::parse_with(SHIPPED, "all-pairs.toml", &over(&[("bw_size", 65536.0), ("repeats", 5.0)])).unwrap();
        assert_eq!((f.measure.bw_size, f.measure.repeats, f.measure.bw_qps), (65536, 5, 4));
        assert_eq!(f.thresholds, Thresholds::default(), "the thresholds are the file's");
        let e = FleetFile::parse_with(SHIPPED, "f", &over(&[("size", 1.0)])).unwrap_err();
        assert!(e.contains("--measure size: a fleet's [measure] keys are") && e.contains("bw_iterations"), "{e}");
        let e = FleetFile::parse_with(SHIPPED, "f", &over(&[("bw_size", 0.5)])).unwrap_err();
        assert!(e.contains("--measure bw_size=0.5: use a whole number"), "{e}");
        let e = FleetFile::parse_with(SHIPPED, "f", &over(&[("repeats", 2.0)])).unwrap_err();
        assert!(e.contains("3 to 100") && e.contains("with --measure repeats=2"), "{e}");
    }

    #[test]
    fn bad_keys_and_values_are_refused_with_the_range() {
        assert!(FleetFile::parse("name = \"x\"\n[measure]\nrepeats = 2\n", "f").unwrap_err().contains("3 to 100"));
        assert!(
            FleetFile::parse("name = \"x\"\n[thresholds]\nnode_min_ratio = 2.0\n", "f").unwrap_err().contains("(0, 1]")
        );
        assert!(FleetFile::parse("name = \"x\"\n[measure]\nsize = 2\n", "f").unwrap_err().contains("unknown field"));
        let slow = FleetFile::parse("name = \"x\"\n[measure]\nqp_timeout = 19\n", "f").unwrap();
        assert_eq!(slow.measure.fabric().qp_timeout, 19);
        let e = FleetFile::parse("name = \"x\"\n[measure]\nqp_timeout = 40\n", "f").unwrap_err();
        assert!(e.contains("qp_timeout 40 is out of range; use qp_timeout 0..=31"), "{e}");
    }
}
