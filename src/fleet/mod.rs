//! All-pairs fleet acceptance: which of N nodes, or which link between two of them, is
//! bad. `schedule` pairs every node with every other in rounds (circle method), `node`
//! runs one node (serving its partners, measuring the pairs it is told to), `barrier` is
//! the one authority for what each node does next (a state machine, with retests after
//! the plan) and `coordinator` runs it over sockets on node 0, `rows` indexes the pairs'
//! rows and completes them, `attribution` fits the pairs' figures to nodes and links,
//! `output` writes the matrices, verdict, heat map and summary. On Kubernetes one pod
//! per node runs `rdmabench fleet` (`k8s render` does not render its Job yet); the lab
//! runs one per simulated node on a bridge.

pub mod attribution;
pub mod barrier;
pub mod config;
pub mod coordinator;
pub mod node;
pub mod output;
pub mod rows;
pub mod schedule;
pub mod simulate;

use std::io::Write;

use crate::bench::runner::RunOptions;
use crate::error::{Error, Result};

/// `rdmabench fleet`: runs this node; node 0 then prints the rows only it has, the nodes
/// that left, and the verdict, and fails (exit 1) when a node or a link is bad.
pub fn command(cfg: &node::NodeConfig, opts: &RunOptions, out: &mut dyn Write) -> Result<()> {
    let outcome = node::run(cfg, opts)?;
    let Some(mut b) = outcome.barrier else { return Ok(()) };
    // Each failed pair seen from both ends: the servers' records joined to the rows.
    rows::join_served(&mut b.rows, std::mem::take(&mut b.served));
    let io = |e: std::io::Error| Error::Environment(format!("cannot write: {e}"));
    for r in b.coordinator_rows() {
        writeln!(out, "{}", r.line()).map_err(io)?;
    }
    let mut left = Vec::new();
    for (&n, why) in &b.dead {
        eprintln!("rdmabench: fleet: node {n} {why}");
        let record = crate::report::pairs::LeftRow { node: n, why: format!("node {n} {why}") };
        writeln!(out, "{}", record.line()).map_err(io)?;
        left.push(record);
    }
    let a = rows::judge_observations(cfg.plan.nodes, b.observations(), &left, &cfg.thresholds);
    let summary = output::summary_md_tallied(&output::Tally::of_outcome(&b), &b.rows, &a, &cfg.thresholds, 0);
    out.write_all(summary.as_bytes()).map_err(io)?;
    verdict_of(&a)
}

/// Err (exit 1) naming what is bad, when anything is.
pub fn verdict_of(a: &attribution::Attribution) -> Result<()> {
    if a.verdict() == attribution::Verdict::Pass {
        return Ok(());
    }
    let (nodes, links) = (a.bad_nodes(), a.bad_links());
    let flaky: Vec<(u32, u32)> = a.flaky.iter().map(|f| (f.client, f.server)).collect();
    Err(Error::Check(format!(
        "the fleet has {} bad node(s) {:?}, {} bad link(s) {:?} and {} flaky pair(s) {:?} (max_flaky_pairs {})",
        nodes.len(),
        nodes,
        links.len(),
        links,
        flaky.len(),
        flaky,
        a.flaky_allowed
    )))
}
