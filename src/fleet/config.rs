//! What an all-pairs fleet measures per pair and how it judges: a fleet workload file
//! (`workloads/fleet/all-pairs.toml`), `[measure]` and `[thresholds]`, each key with its
//! default here and nowhere else.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::attribution::Thresholds;

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
        let f: FleetFile = toml::from_str(text).map_err(|e| format!("{path}: {e}"))?;
        f.measure.check().map_err(|e| format!("{path}: [measure] {e}"))?;
        f.thresholds.check().map_err(|e| format!("{path}: [thresholds] {e}"))?;
        Ok(f)
    }

    pub fn load(path: &str) -> Result<FleetFile, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
        Self::parse(&text, path)
    }
}

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
