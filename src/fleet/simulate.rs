//! Simulated fleet nodes: the real node loop, coordinator and barrier over loopback TCP,
//! with every pair's measurement synthetic (no RDMA, no server): how the fleet's
//! coordination behaves at a thousand nodes on one host. `benches/fleet_sim.rs` measures
//! it; a host test runs a join storm with it.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use super::attribution::Thresholds;
use super::config::Measurement;
use super::node::{self, Measuring, NodeConfig, NodeOutcome};
use super::schedule::{Directions, Plan};
use crate::bench::runner::{RailOptions, RunOptions};
use crate::error::Result;
use crate::report::table::Units;

/// How long simulated nodes have to join.
pub const JOIN: Duration = Duration::from_secs(60);

/// Node `index` of a simulated fleet of `nodes` whose barrier listens on `port + nodes` of
/// 127.0.0.1; every pair alike (100 Gb/s, no time), so no retest adds steps.
pub fn config(index: u32, nodes: u32, port: u16) -> NodeConfig {
    NodeConfig {
        index,
        plan: Plan { nodes, directions: Directions::One, max_pairs_per_round: None },
        peers: vec!["127.0.0.1".into(); nodes as usize],
        port,
        measure: Measurement::default(),
        thresholds: Thresholds::default(),
        join_timeout: JOIN,
        measuring: Measuring::Synthetic { gbps: |_, _| 100.0, takes: Duration::ZERO },
    }
}

/// A simulated node's run options: loopback, no token, a 10 s `--timeout`.
pub fn options() -> RunOptions {
    RunOptions {
        rails: RailOptions::default(),
        tcp_port: 0,
        bind: Some(std::net::Ipv4Addr::LOCALHOST.into()),
        token: None,
        max_memory: 1 << 30,
        connect_timeout: JOIN,
        timeout: Duration::from_secs(10),
        json: None,
        cpu_util: false,
        counters: false,
        interval_log: None,
        intervals: None,
        histogram: None,
        units: Units::GigaBits,
        tables_on_stderr: true,
    }
}

/// Runs nodes `first..nodes` of a simulated fleet as threads of this process, all
/// released at the same instant; each one's outcome, in index order.
pub fn run_nodes(first: u32, nodes: u32, port: u16) -> Vec<Result<NodeOutcome>> {
    crate::session::open_files::ensure(4 * u64::from(nodes) + 256, "simulated fleet nodes")
        .expect("the simulator's descriptors");
    let gate = Arc::new(Barrier::new((nodes - first) as usize));
    let threads: Vec<_> = (first..nodes)
        .map(|k| {
            let gate = Arc::clone(&gate);
            std::thread::Builder::new()
                .name(format!("node-{k}"))
                .stack_size(512 << 10)
                .spawn(move || {
                    gate.wait();
                    node::run(&config(k, nodes, port), &options())
                })
                .expect("a thread per simulated node")
        })
        .collect();
    threads.into_iter().map(|t| t.join().expect("a simulated node panicked")).collect()
}

/// When the last of `outcomes` had its first task: every node had joined by then.
pub fn all_joined(outcomes: &[Result<NodeOutcome>]) -> Option<Instant> {
    outcomes.iter().filter_map(|o| o.as_ref().ok()?.first_task).max()
}
