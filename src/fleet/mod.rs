//! All-pairs fleet acceptance: which of N nodes, or which link between two of them, is
//! bad. `schedule` pairs every node with every other in rounds (circle method), `node`
//! runs one node (serving its partners, measuring its own pairs), `barrier` keeps the
//! nodes in step (node 0) and schedules retests, `attribution` fits the pairs' figures to
//! nodes and links, `output` writes the matrices, verdict, heat map and summary. The
//! Kubernetes Jobs (`k8s render --fleet all-pairs`) run one node per pod; the lab runs
//! one per simulated node on a bridge.

pub mod attribution;
pub mod barrier;
pub mod config;
pub mod node;
pub mod output;
pub mod schedule;

use std::io::Write;

use crate::bench::runner::RunOptions;
use crate::error::{Error, Result};

/// `rdmabench fleet`: runs this node; node 0 then prints the rows only it has, the nodes
/// that left, and the verdict, and fails (exit 1) when a node or a link is bad.
pub fn command(cfg: &node::NodeConfig, opts: &RunOptions, out: &mut dyn Write) -> Result<()> {
    let outcome = node::run(cfg, opts)?;
    let Some(b) = &outcome.barrier else { return Ok(()) };
    let io = |e: std::io::Error| Error::Environment(format!("cannot write: {e}"));
    for r in node::orphan_rows(b) {
        writeln!(out, "{}", r.line()).map_err(io)?;
    }
    for (n, why) in &b.dead {
        eprintln!("rdmabench: fleet: node {n} {why}");
    }
    let observations: Vec<_> = b.rows.iter().map(barrier::observation).collect();
    let a = attribution::judge(cfg.plan.nodes, &observations, &cfg.thresholds);
    out.write_all(output::summary_md(cfg.plan.nodes, &b.rows, &a, &cfg.thresholds).as_bytes()).map_err(io)?;
    verdict_of(&a)
}

/// Err (exit 1) naming what is bad, when anything is.
pub fn verdict_of(a: &attribution::Attribution) -> Result<()> {
    let (nodes, links) = (a.bad_nodes(), a.bad_links());
    if nodes.is_empty() && links.is_empty() {
        return Ok(());
    }
    Err(Error::Check(format!(
        "the fleet has {} bad node(s) {:?} and {} bad link(s) {:?}",
        nodes.len(),
        nodes,
        links.len(),
        links
    )))
}
