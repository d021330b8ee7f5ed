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

/// The one line a node leaves as its container's termination message: node 0's verdict,
/// another node's end, or the error that ended it with its exit code; at most 4 KiB, the
/// most a kubelet keeps.
pub fn ending_line(index: u32, nodes: u32, ended: &Result<()>) -> String {
    let line = match (ended, index) {
        (Ok(()), 0) => format!("fleet of {nodes} nodes: PASS (node 0's verdict: no bad node, link or flaky pair)"),
        (Ok(()), _) => format!("node {index} of {nodes}: done (node 0 gives the fleet's verdict)"),
        (Err(e), 0) if e.exit_code() == 1 => format!("fleet of {nodes} nodes: FAIL (exit 1): {e}"),
        (Err(e), _) => format!("node {index} of {nodes}: FAIL (exit {}): {e}", e.exit_code()),
    };
    crate::report::pairs::bounded(line)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_termination_message_says_how_it_ended_in_one_bounded_line() {
        assert_eq!(
            ending_line(0, 6, &Ok(())),
            "fleet of 6 nodes: PASS (node 0's verdict: no bad node, link or flaky pair)"
        );
        assert_eq!(ending_line(3, 6, &Ok(())), "node 3 of 6: done (node 0 gives the fleet's verdict)");
        let bad = Err(Error::Check("the fleet has 1 bad node(s) [4]".into()));
        assert_eq!(ending_line(0, 6, &bad), "fleet of 6 nodes: FAIL (exit 1): the fleet has 1 bad node(s) [4]");
        let lost = Err(Error::Peer("node 0's coordinator went silent".into()));
        assert!(ending_line(2, 6, &lost).starts_with("node 2 of 6: FAIL (exit 4): "), "{}", ending_line(2, 6, &lost));
        let long = Err(Error::Check("x".repeat(100_000)));
        let line = ending_line(0, 1024, &long);
        assert!(line.len() <= 4096 && line.ends_with("bytes cut]") && !line.contains('\n'));
    }
}
