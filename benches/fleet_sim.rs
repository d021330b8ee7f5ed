//! The fleet simulator: the real coordinator, barrier and node loop over loopback TCP, with
//! every node started at once and the RDMA measurement replaced by a synthetic figure
//! (`Measuring::Synthetic`, each phase taking no time: the whole run is coordination).
//! Node 0 is a process of its own (this program again, `--node0`), so its peak memory and
//! descriptors are its own; the other nodes are threads of a second process (`--nodes`).
//! For each size it prints the time until every node had its first task (all joined), the
//! coordination per step, node 0's peak resident memory and its most open descriptors.
//! Run with `cargo bench --bench fleet_sim` (optionally the sizes: `-- 64 256 1024`).

use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdmabench::fleet::attribution::Thresholds;
use rdmabench::fleet::node::{self, PHASES};
use rdmabench::fleet::simulate;

fn unix_ms(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis()
}

/// `--node0 N PORT`: node 0, coordinator and all; says how many rows, departures, and its
/// verdict.
fn node0(nodes: u32, port: u16) {
    let out = node::run(&simulate::config(0, nodes, port), &simulate::options()).expect("node 0 ran");
    let b = out.barrier.expect("node 0 has the barrier");
    let a = rdmabench::fleet::rows::judge_observations(nodes, b.observations(), &[], &Thresholds::default());
    eprintln!("SIM node 0: rows={} left={} verdict={:?}", b.row_count(), b.dead.len(), a.verdict());
}

/// `--nodes N PORT`: nodes 1..N as threads, released together; says when the last of
/// them had its first task, and which failed.
fn nodes_process(nodes: u32, port: u16) {
    let outcomes = simulate::run_nodes(1, nodes, port);
    let joined = simulate::all_joined(&outcomes).map_or(0, |t| unix_ms(SystemTime::now() - t.elapsed()));
    let failed: Vec<String> = outcomes
        .iter()
        .enumerate()
        .filter_map(|(k, o)| o.as_ref().err().map(|e| format!("node {}: {e}", k + 1)))
        .collect();
    eprintln!("SIM nodes: joined_unix_ms={joined} failed={}", failed.len());
    for f in failed.iter().take(5) {
        eprintln!("SIM failed {f}");
    }
}

/// Node 0's resident peak (VmHWM, KiB) and open descriptors now.
fn sample(pid: u32) -> Option<(u64, usize)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let hwm = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.split_whitespace().next()?.parse().ok()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
    Some((hwm, fds))
}

fn lines_of(child: &mut std::process::Child) -> Vec<String> {
    let err = child.stderr.take().unwrap();
    std::io::BufReader::new(err).lines().map_while(Result::ok).filter(|l| l.starts_with("SIM ")).collect()
}

fn simulate(nodes: u32, port: u16) {
    let me = std::env::current_exe().unwrap();
    let start = SystemTime::now();
    let t = Instant::now();
    let spawn = |role: &str| {
        Command::new(&me)
            .args([role, &nodes.to_string(), &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut zero = spawn("--node0");
    let mut others = spawn("--nodes");
    let pid = zero.id();
    let (mut hwm, mut fds) = (0u64, 0usize);
    // Both children's stderr read as it comes (a full pipe would stall their nodes).
    let (zero_lines, other_lines) = std::thread::scope(|s| {
        let zero_reader = s.spawn(|| lines_of(&mut zero));
        let other_reader = s.spawn(|| lines_of(&mut others));
        while !zero_reader.is_finished() {
            if let Some((h, f)) = sample(pid) {
                (hwm, fds) = (hwm.max(h), fds.max(f));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        (zero_reader.join().unwrap(), other_reader.join().unwrap())
    });
    let zero_ok = zero.wait().unwrap().success();
    let others_ok = others.wait().unwrap().success();
    let total = t.elapsed();
    let joined_ms: u128 = other_lines
        .iter()
        .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("joined_unix_ms=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let joined = Duration::from_millis(joined_ms.saturating_sub(unix_ms(start)) as u64);
    let steps = simulate::config(0, nodes, port).plan.step_count() * PHASES.len();
    let per_step = total.saturating_sub(joined).as_secs_f64() * 1e3 / steps as f64;
    println!(
        "{nodes:>5} nodes: all joined after {:>6.2} s; {steps:>5} steps in {:>7.1} s: {per_step:>6.2} ms of coordination a \
         step; node 0: peak {:>6.1} MiB resident, {fds:>5} descriptors at most{}",
        joined.as_secs_f64(),
        total.saturating_sub(joined).as_secs_f64(),
        hwm as f64 / 1024.0,
        if zero_ok && others_ok { String::new() } else { " (FAILED)".into() }
    );
    for l in zero_lines.iter().chain(&other_lines) {
        println!("       {l}");
    }
    std::io::stdout().flush().unwrap();
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let num = |k: usize| args[k].parse::<u32>().expect("a number");
    match args.first().map(String::as_str) {
        Some("--node0") => return node0(num(1), num(2) as u16),
        Some("--nodes") => return nodes_process(num(1), num(2) as u16),
        _ => {}
    }
    let sizes: Vec<u32> = if args.is_empty() { vec![64, 256, 1024] } else { (0..args.len()).map(num).collect() };
    println!("fleet simulator: real coordinator, barrier and node loop over loopback; synthetic pairs");
    for (k, n) in sizes.into_iter().enumerate() {
        // A fresh barrier port for each size (the last size's may linger in TIME_WAIT).
        simulate(n, 40000 + 2000 * k as u16);
    }
}
