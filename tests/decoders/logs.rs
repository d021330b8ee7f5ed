//! The pods' logs `summarize` reads: `RDMABENCH_RESULT` lines of pair and ring Jobs, and an
//! all-pairs fleet's `RDMABENCH_PAIR`, `RDMABENCH_SERVED` and `RDMABENCH_LEFT` lines, with
//! `kubectl logs` prefixes, among any other text a pod printed.

use std::collections::BTreeMap;
use std::path::PathBuf;

use rdmabench::fleet::attribution::Thresholds;
use rdmabench::fleet::schedule::{Directions, Plan};
use rdmabench::k8s::fleet::Topology;
use rdmabench::k8s::summarize;
use rdmabench::report::pairs::{LeftRow, PairError, PairRow, ServedRow};

use super::harness::*;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const NODES: u32 = 4;

fn plan() -> Plan {
    Plan { nodes: NODES, directions: Directions::One, max_pairs_per_round: None }
}

/// A whole fleet's log (every pair of 4 nodes, a failed one, what a server saw, a node
/// that left), and a pair Job's two pods' logs with their run document.
fn seeds() -> Vec<Vec<u8>> {
    let mut fleet = vec!["rdmabench fleet: node 0 of 4".to_string()];
    for step in plan().steps() {
        for p in &step.pairs {
            let mut r = PairRow::blank(step.index, step.round, None, p.client, p.server);
            (r.gbps, r.p50_us, r.p99_us, r.size, r.qps, r.lat_size) = (Some(95.0), Some(2.4), Some(3.0), 65536, 4, 8);
            r.gbps_repeats = vec![94.0, 95.0, 96.0];
            (r.client_node, r.server_node) = (format!("node-{}", p.client), format!("node-{}", p.server));
            r.devices = vec!["mlx5_0".into()];
            r.counters = BTreeMap::from([("packet_seq_err".into(), 1)]);
            fleet.push(format!("[pod/fleet-{}/rdmabench] {}", p.client, r.line()));
            fleet.push(
                ServedRow {
                    step: step.index,
                    client: p.client,
                    server: p.server,
                    counters: r.counters.clone(),
                    error: None,
                }
                .line(),
            );
        }
    }
    let why = PairError::node_left(3, "node 3 left the fleet at step 2: the connection closed".into());
    fleet.push(PairRow::failed(2, 1, None, 1, 3, why).line());
    fleet.push(LeftRow { node: 3, why: "the connection closed".into() }.line());
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{ROOT}/results/baseline-rxe.json")).unwrap()).unwrap();
    let pair = [
        "2026-12-07T10:00:00.000000000Z PASS  exclusive-nic".to_string(),
        summarize::result_line(1, 0, 0, Some(run)),
        summarize::result_line(0, 1, 0, None),
    ];
    vec![fleet.join("\n").into_bytes(), pair.join("\n").into_bytes()]
}

/// Every reader over the log in `path`: each passes, gives its verdict (exit 1) or
/// refuses (the refusals, one a line).
fn summarize_log(path: &PathBuf, bytes: &[u8]) -> Result<(), String> {
    std::fs::write(path, bytes).unwrap();
    let paths = [path.display().to_string()];
    let mut sink = Vec::new();
    let outcomes = [
        summarize::command(&paths, Some((2, Topology::Ring)), true, &mut sink),
        summarize::command(&paths, None, false, &mut sink),
        summarize::all_pairs(&paths, &plan(), &Thresholds::default(), None, true, &mut sink),
    ];
    let readers = outcomes.len();
    let refusals: Vec<String> =
        outcomes.into_iter().filter_map(|o| o.err()).filter(|e| e.exit_code() != 1).map(|e| e.message()).collect();
    // A log is for one of the readers: accepted when one of them reads it, and every
    // other reader's refusal must be as clear.
    for r in &refusals {
        clear_error("summarize logs", r).unwrap_or_else(|e| panic!("{e}"));
    }
    if refusals.len() < readers { Ok(()) } else { Err(refusals.join("\n")) }
}

fn log_file() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pods.log");
    (dir, path)
}

#[test]
fn the_seed_logs_summarize() {
    let (_dir, path) = log_file();
    for s in seeds() {
        assert_eq!(summarize_log(&path, &s), Ok(()), "{}", String::from_utf8_lossy(&s));
    }
}

#[test]
fn mutated_logs_summarize_or_are_refused_clearly() {
    let (_dir, path) = log_file();
    property("summarize logs", mutated(seeds(), 8), |bytes| (bytes.len(), summarize_log(&path, bytes)));
}

#[test]
fn logs_of_noise_are_refused_clearly() {
    let (_dir, path) = log_file();
    property("summarize logs (noise)", noise(), |bytes| (bytes.len(), summarize_log(&path, bytes)));
}
