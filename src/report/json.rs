//! The JSON document: one per run, every size of a sweep in `results`, versioned by
//! `schema_version`. The schema is results/schema/result-v2.schema.json; a test keeps the
//! two in step.

use std::io::Write;

use serde::{Deserialize, Serialize};

use super::RunResult;
use crate::error::{Error, Result};

pub const SCHEMA: &str = "rdmabench/result";
pub const SCHEMA_VERSION: u32 = 2;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Document {
    pub schema: String,
    pub schema_version: u32,
    /// "client" or "server": whose view the environment is.
    pub role: String,
    /// Seconds since the Unix epoch when the run ended.
    pub finished_unix_s: f64,
    #[serde(flatten)]
    pub run: RunResult,
}

impl Document {
    pub fn new(role: &str, run: RunResult) -> Document {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        Document { schema: SCHEMA.into(), schema_version: SCHEMA_VERSION, role: role.into(), finished_unix_s: now, run }
    }
}

/// Writes a document (this one, or a workload run's) to `target`: a path, or `-` for stdout. A file is written to a
/// temporary name and renamed, so a reader never sees half a document.
pub fn write<T: Serialize>(doc: &T, target: &str) -> Result<()> {
    let text = serde_json::to_string_pretty(doc).map_err(|e| Error::Check(format!("cannot encode JSON: {e}")))?;
    if target == "-" {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{text}").map_err(|e| Error::Environment(format!("cannot write JSON to stdout: {e}")))?;
        return Ok(());
    }
    super::file::write(target, (text + "\n").as_bytes(), "the JSON document")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Environment, LatencyResult, PeerEnvironment, SizeResult};
    use crate::spec::{Measure, Operation, TestSpec};
    use crate::stats::{LatencyRecorder, Peak, ThroughputSummary};

    fn schema() -> jsonschema::Validator {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/results/schema/result-v2.schema.json");
        let schema: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        jsonschema::validator_for(&schema).unwrap()
    }

    use crate::verbs::NicIdentity;

    fn env() -> Environment {
        Environment {
            tool_version: "0.1.0".into(),
            host: "a".into(),
            device: "rxe0".into(),
            port: 1,
            link_layer: "Ethernet".into(),
            gid_index: 1,
            gid: "::ffff:10.0.0.1".into(),
            gid_type: "RoCEv2".into(),
            mtu: 4096,
            active_mtu: 4096,
            inline_size: 220,
            max_inline: 416,
            link_rate_gbps: Some(100.0),
            kernel: Some("6.1.0-57-amd64".into()),
            nic: NicIdentity {
                node_guid: "1".into(),
                sys_image_guid: "2".into(),
                pci: Some("0000:3b:00.0".into()),
                numa_node: None,
                firmware: Some("28.39.1002".into()),
                driver: Some("mlx5_core".into()),
            },
            counters: vec!["completer_retry_err".into(), "sent_pkts".into()],
            memory: crate::report::MemoryReport {
                page_bytes: 2 << 20,
                relaxed_ordering: true,
                pcie_relaxed_ordering: Some(true),
                on_demand: false,
            },
            peer: PeerEnvironment {
                host: "b".into(),
                address: "10.0.0.2:18515".into(),
                device: "rxe0".into(),
                port: 1,
                gid_index: 1,
                gid: "::ffff:10.0.0.2".into(),
                nic: NicIdentity::default(),
                same_physical_nic: false,
            },
        }
    }

    fn spec(measure: Measure, sizes: Vec<u64>) -> TestSpec {
        TestSpec { sizes, iterations: 10, ..TestSpec::new(Operation::Write, measure) }
    }

    fn errors(v: &serde_json::Value) -> Vec<String> {
        schema().iter_errors(v).map(|e| format!("{e} at {}", e.instance_path())).collect()
    }

    #[test]
    fn a_latency_sweep_document_matches_the_schema_with_every_size() {
        let sizes = TestSpec::sweep_sizes();
        let mut rec = LatencyRecorder::new();
        for v in [1000, 2000, 3000] {
            rec.record(v);
        }
        let results = sizes
            .iter()
            .map(|&size| SizeResult {
                size,
                iterations: 3,
                bytes: size * 3,
                duration_ns: 9000,
                latency: Some(LatencyResult { kind: "one_way".into(), unit: "ns".into(), summary: rec.summary(0.5) }),
                intervals: vec![crate::report::IntervalResult {
                    size,
                    start_s: 0.0,
                    end_s: 1.0,
                    iterations: 3,
                    latency: Some(rec.summary(0.5)),
                    ..Default::default()
                }],
                bandwidth: None,
                data_validated: false,
                ..Default::default()
            })
            .collect();
        let mut spec = spec(Measure::Latency, sizes.clone());
        (spec.warmup, spec.duration_secs, spec.interval_secs) = (100, Some(2.0), Some(1.0));
        let run = RunResult {
            test: "write_lat".into(),
            spec,
            environment: env(),
            results,
            rails: Vec::new(),
            rail_mode: None,
        };
        let v = serde_json::to_value(Document::new("client", run)).unwrap();
        assert_eq!(errors(&v), Vec::<String>::new());
        assert_eq!(v["results"].as_array().unwrap().len(), sizes.len());
        // Node names are defused (`names`): a raw one is no document of ours.
        let mut raw = v.clone();
        raw["environment"]["peer"]["host"] = "a b".into();
        assert_eq!(errors(&raw).len(), 1, "{:?}", errors(&raw));
        raw["environment"]["peer"]["host"] = crate::names::defuse(b"a b").into();
        raw["environment"]["host"] = "(none)".into();
        assert_eq!(errors(&raw), Vec::<String>::new());
    }

    #[test]
    fn a_bandwidth_document_matches_and_a_broken_one_does_not() {
        let results = vec![SizeResult {
            size: 65536,
            iterations: 10,
            bytes: 655360,
            duration_ns: 1000,
            latency: None,
            bandwidth: Some(ThroughputSummary::new(65536, 10, 1000, Peak { msgs_per_sec: None, window_msgs: 10 })),
            data_validated: true,
            counters: Some([("completer_retry_err".to_string(), 41), ("sent_pkts".to_string(), 10)].into()),
            intervals: vec![crate::report::IntervalResult {
                size: 65536,
                rail: Some(1),
                start_s: 0.0,
                end_s: 5.0,
                iterations: 10,
                gbps: Some(0.001),
                mpps: Some(0.000002),
                latency: None,
            }],
            peer_counters: Some(Default::default()),
            ..Default::default()
        }];
        let run = RunResult {
            test: "write_bw".into(),
            spec: spec(Measure::Bandwidth, vec![65536]),
            environment: env(),
            results,
            rails: Vec::new(),
            rail_mode: None,
        };
        let mut v = serde_json::to_value(Document::new("server", run)).unwrap();
        assert_eq!(errors(&v), Vec::<String>::new());
        v["results"][0]["counters"]["sent_pkts"] = (-1).into();
        assert!(!errors(&v).is_empty(), "a counter delta is a count");
        v["results"][0]["counters"]["sent_pkts"] = 10.into();
        v["results"][0]["latency"] = v["results"][0]["bandwidth"].clone();
        assert!(!errors(&v).is_empty(), "a result with both latency and bandwidth is invalid");
        v["results"] = serde_json::json!([]);
        assert!(!errors(&v).is_empty(), "an empty result list is invalid");
    }

    #[test]
    fn a_two_rail_document_has_each_rail_and_the_aggregate() {
        let result = SizeResult {
            size: 65536,
            iterations: 10,
            bytes: 655360,
            duration_ns: 1000,
            bandwidth: Some(ThroughputSummary::new(65536, 10, 1000, Peak { msgs_per_sec: None, window_msgs: 10 })),
            ..Default::default()
        };
        let rail = |i: u32, error: Option<&str>| crate::report::RailResult {
            rail: i,
            device: format!("mlx5_{i}"),
            peer_device: format!("mlx5_{i}"),
            numa_node: Some(0),
            cpus: vec![2],
            environment: Some(env()),
            results: if error.is_some() { Vec::new() } else { vec![result.clone()] },
            error: error.map(str::to_string),
        };
        let run = RunResult {
            test: "write_bw".into(),
            spec: spec(Measure::Bandwidth, vec![65536]),
            environment: env(),
            results: vec![result.clone()],
            rails: vec![rail(0, None), rail(1, Some("retry exceeded"))],
            rail_mode: Some(crate::spec::rails::RailMode::Concurrent),
        };
        let mut v = serde_json::to_value(Document::new("client", run)).unwrap();
        assert_eq!(errors(&v), Vec::<String>::new());
        assert_eq!(v["schema_version"], 2);
        assert_eq!(v["rails"][1]["error"], "retry exceeded");
        // Every rail failed before measuring: the rails say why, no size result is required.
        v["results"] = serde_json::json!([]);
        assert_eq!(errors(&v), Vec::<String>::new());
        v["rails"][0]["rail"] = "zero".into();
        assert!(!errors(&v).is_empty());
    }

    #[test]
    fn write_to_a_file_is_whole_and_parses_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        let run = RunResult {
            test: "write_bw".into(),
            spec: spec(Measure::Bandwidth, vec![8]),
            environment: env(),
            results: vec![],
            rails: Vec::new(),
            rail_mode: None,
        };
        let doc = Document::new("client", run);
        write(&doc, path.to_str().unwrap()).unwrap();
        let back: Document = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(back, doc);
        let e = write(&doc, "/nonexistent-dir/r.json").unwrap_err();
        assert_eq!(e.exit_code(), 3);
    }
}
