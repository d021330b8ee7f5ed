//! A fleet's join storm on the host: the real coordinator, barrier and node loop over
//! loopback, every pair synthetic (`fleet::simulate`). Well above the 64 joins node 0
//! once held at a time, every node starts at the same instant and every one joins.

use std::time::Instant;

use rdmabench::fleet::node;
use rdmabench::fleet::simulate;

const NODES: u32 = 200;

/// A base port whose fleet's barrier port (base + NODES) was free a moment ago.
fn free_base() -> u16 {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    free - NODES as u16
}

#[test]
fn two_hundred_nodes_started_at_once_all_join_and_the_fleet_passes() {
    let port = free_base();
    let t = Instant::now();
    let zero = std::thread::spawn(move || node::run(&simulate::config(0, NODES, port), &simulate::options()));
    let outcomes = simulate::run_nodes(1, NODES, port);
    let failed: Vec<String> = outcomes.iter().filter_map(|o| o.as_ref().err().map(|e| e.to_string())).collect();
    assert!(failed.is_empty(), "{} node(s) failed, first: {:?}", failed.len(), failed.first());
    let joined = simulate::all_joined(&outcomes).unwrap().duration_since(t);
    let zero = zero.join().unwrap().unwrap();
    let b = zero.barrier.unwrap();
    assert!(b.dead.is_empty(), "{:?}", b.dead.iter().take(3).collect::<Vec<_>>());
    let planned = simulate::config(0, NODES, port).plan.steps().iter().map(|s| s.pairs.len()).sum::<usize>();
    assert_eq!(b.row_count(), planned, "every planned pair has its row");
    assert_eq!(b.records, planned, "and its server's record");
    eprintln!("{NODES} nodes joined within {joined:?}; the fleet took {:?}", t.elapsed());
}
