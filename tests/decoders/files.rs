//! Workload and fleet files (TOML), as `run`, `fleet` and `k8s render` read them, and what
//! is derived from an accepted one before anything runs.

use std::collections::BTreeMap;
use std::time::Duration;

use rdmabench::fleet::config::FleetFile;
use rdmabench::report::pairs::Phase;
use rdmabench::workload::file::{self, StepKind};

use super::harness::*;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Every workload the project ships, and a step with every key (docs/workloads.md).
fn workload_seeds() -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = ["smoke", "acceptance", "sweep", "regression"]
        .iter()
        .map(|w| std::fs::read(format!("{ROOT}/workloads/{w}.toml")).unwrap())
        .collect();
    seeds.push(
        br#"name = "every-key"
[params]
min_bw = 10.0
[[step]]
name = "all"
test = "write-bw"
sizes = ["64", "4K", "1M"]
iterations = 1000
warmup = 100
qps = 2
transport = "RC"
mtu = 1024
tx_depth = 128
inline = 64
repeat = 3
cpu_util = true
thresholds = { min_gbps = "$min_bw", max_rail_spread = "90%", max_p99_us = 100 }
tolerance = { gbps = 5.0, p50_us = 10 }
[[step]]
name = "soak"
test = "send-bw"
duration = 2
interval = 1
[[step]]
name = "check"
validate = "generic"
expect_nics = 2
expect_gpus = 8
"#
        .to_vec(),
    );
    seeds
}

fn parse_workload(text: &str, overrides: &BTreeMap<String, f64>) -> Result<(), String> {
    let w = file::parse(text, "fuzz.toml", overrides).map_err(|e| e.message())?;
    for step in &w.steps {
        if let StepKind::Measure(m) = &step.kind {
            // What `run` derives from an accepted step before it connects.
            m.spec.check().map_err(|e| e.message())?;
            let _ = (m.spec.name(), m.spec.max_size(), m.spec.lanes(), m.spec.effective_cq_mod());
            let _ = m.spec.warmup_pass();
            for size in &m.spec.sizes {
                let _ = m.spec.signal_every(*size);
            }
        }
    }
    Ok(())
}

#[test]
fn every_workload_seed_parses() {
    for s in workload_seeds() {
        let text = String::from_utf8(s).unwrap();
        let overrides = BTreeMap::new();
        assert_eq!(parse_workload(&text, &overrides), Ok(()), "{text}");
    }
}

#[test]
fn mutated_workload_files_parse_or_are_refused_clearly() {
    let overrides = proptest::option::of(proptest::sample::select(&[-1.0, 0.0, 1e308, f64::INFINITY, 5.0][..]));
    let strategy = (mutated(workload_seeds(), 8), overrides);
    property("workload TOML", strategy, |(bytes, over)| {
        let text = String::from_utf8_lossy(bytes);
        let overrides = over.map(|v| BTreeMap::from([("min_bw".to_string(), v)])).unwrap_or_default();
        (bytes.len(), parse_workload(&text, &overrides))
    });
}

#[test]
fn workload_files_of_noise_are_refused_clearly() {
    property("workload TOML (noise)", noise(), |bytes| {
        (bytes.len(), parse_workload(&String::from_utf8_lossy(bytes), &BTreeMap::new()))
    });
}

fn fleet_seeds() -> Vec<Vec<u8>> {
    vec![
        std::fs::read(format!("{ROOT}/workloads/fleet/all-pairs.toml")).unwrap(),
        b"name = \"x\"\n[measure]\nbw_size = 65536\nbw_qps = 4\nbw_iterations = 1000\nlat_size = 8\n\
          lat_iterations = 1000\nwarmup = 10\nrepeats = 3\nqp_timeout = 14\n[thresholds]\nnode_min_ratio = 0.8\n\
          max_flaky_pairs = 0\n"
            .to_vec(),
    ]
}

fn parse_fleet(text: &str) -> Result<(), String> {
    let f = FleetFile::parse(text, "fuzz.toml")?;
    // What `fleet` derives before the first pair: the pairs' specs and time budget.
    let _ = (f.measure.spec(Phase::Bandwidth), f.measure.spec(Phase::Latency), f.measure.fabric());
    let _ = f.measure.pair_budget(Duration::from_secs(3600));
    Ok(())
}

#[test]
fn mutated_fleet_files_parse_or_are_refused_clearly() {
    for s in fleet_seeds() {
        assert_eq!(parse_fleet(&String::from_utf8(s).unwrap()), Ok(()));
    }
    property("fleet TOML", mutated(fleet_seeds(), 8), |bytes| {
        (bytes.len(), parse_fleet(&String::from_utf8_lossy(bytes)))
    });
}
