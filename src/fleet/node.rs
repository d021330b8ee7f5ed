//! One node of an all-pairs fleet (one pod, or one process of the lab's switch): it
//! serves every test its partners start, measures against its own partner in each step
//! the schedule gives it, and keeps step with the others through node 0's barrier.
//! Node 0 also keeps the barrier and, at the end, prints the fleet's verdict.

use std::time::Duration;

use super::attribution::Thresholds;
use super::barrier::{Coordinator, Outcome};
use super::config::Measurement;
use super::schedule::{Pair, Plan};
use crate::bench::runner::{self, RunOptions};
use crate::error::{Error, Result};
use crate::report::RunResult;
use crate::report::pairs::PairRow;
use crate::session::{Channel, Door, Message, handshake};
use crate::spec::{Measure, Operation, TestSpec};

pub struct NodeConfig {
    pub index: u32,
    pub plan: Plan,
    /// Every node's control address, by index.
    pub peers: Vec<String>,
    /// Node i serves on `port + i`; the barrier listens on `port + nodes`.
    pub port: u16,
    pub measure: Measurement,
    pub thresholds: Thresholds,
    /// How long the nodes have to start and join.
    pub join_timeout: Duration,
}

impl NodeConfig {
    /// The barrier's port: after every node's own.
    pub fn barrier_port(&self) -> u16 {
        self.port + self.plan.nodes as u16
    }

    /// How long one step may take: the measurements of one pair, with room for slow days.
    pub fn step_timeout(&self, opts: &RunOptions) -> Duration {
        self.measure.pair_budget(opts.timeout)
    }
}

/// What node 0 knows at the end (other nodes: their own rows only).
pub struct NodeOutcome {
    pub rows: Vec<PairRow>,
    pub barrier: Option<Outcome>,
}

pub fn run(cfg: &NodeConfig, opts: &RunOptions) -> Result<NodeOutcome> {
    cfg.plan.check().map_err(Error::Usage)?;
    let n = cfg.plan.nodes;
    if cfg.index >= n || cfg.peers.len() != n as usize {
        return Err(Error::Usage(format!(
            "node {} of {n} with {} peer addresses: give --index below --pods and one address per node",
            cfg.index,
            cfg.peers.len()
        )));
    }
    let steps = cfg.plan.steps();
    let fingerprint = serde_json::to_string(&cfg.plan).expect("a plan serialises");
    let step_timeout = cfg.step_timeout(opts);
    let whole = cfg.join_timeout + step_timeout * (steps.len() as u32 + 2 * n + 2);
    let coordinator = if cfg.index == 0 {
        let door = Door::bind(opts.bind, cfg.barrier_port(), opts.token.clone(), opts.timeout)?;
        let c = Coordinator {
            door,
            nodes: n,
            fingerprint: fingerprint.clone(),
            steps: steps.clone(),
            join_timeout: cfg.join_timeout,
            step_timeout,
            thresholds: cfg.thresholds,
        };
        Some(std::thread::spawn(move || c.run()))
    } else {
        None
    };
    let mut serving = opts.clone();
    serving.tcp_port = cfg.port + cfg.index as u16;
    serving.connect_timeout = whole;
    let server = {
        let o = serving.clone();
        std::thread::spawn(move || runner::serve_workload(&o))
    };
    let mut chan = Channel::connect(&cfg.peers[0], cfg.barrier_port(), cfg.join_timeout, opts.timeout)?;
    handshake::join(&mut chan, cfg.index, n, &fingerprint, opts.token.as_ref())?;
    let mut mine = Vec::new();
    let mut last = Vec::new();
    let mut step = 0u32;
    let outcome = loop {
        chan.send(&Message::Arrive { step, rows: std::mem::take(&mut last) })?;
        let (dead, retest, done) = match chan.recv_within("the fleet's next step", whole)? {
            Message::Go { step: s, dead, retest, done } if s == step => (dead, retest, done),
            Message::Refuse { code, message } => {
                break Err(Error::from_code(code, format!("the fleet's barrier refused this node: {message}")));
            }
            other => break Err(chan.unexpected(&other, "the fleet's next step")),
        };
        if done {
            break Ok(());
        }
        let (round, pairs): (u32, Vec<Pair>) = match steps.get(step as usize) {
            Some(s) => (s.round, s.pairs.clone()),
            None => (0, retest.iter().map(|p| Pair { client: p[0], server: p[1] }).collect()),
        };
        if let Some(p) = pairs.iter().find(|p| p.client == cfg.index) {
            let row = if dead.contains(&p.server) {
                PairRow::failed(
                    step,
                    round,
                    step as usize >= steps.len(),
                    p.client,
                    p.server,
                    format!("node {} left the fleet", p.server),
                )
            } else {
                measure_pair(cfg, opts, step, round, step as usize >= steps.len(), *p)
            };
            println!("{}", row.line());
            mine.push(row.clone());
            last.push(row);
        }
        step += 1;
    };
    drop(chan);
    // This node's server ends with a finish from this node, as a workload's would.
    let mut finishing = serving.clone();
    finishing.connect_timeout = Duration::from_secs(5);
    let _ = runner::finish_workload(&cfg.peers[cfg.index as usize], &finishing);
    let _ = server.join();
    outcome?;
    let barrier = match coordinator {
        Some(h) => Some(h.join().map_err(|_| Error::Check("the fleet's barrier thread panicked".into()))??),
        None => None,
    };
    Ok(NodeOutcome { rows: mine, barrier })
}

/// One pair: bandwidth (warm-up, then the repeats; their median) and latency (p50 and
/// p99 medians), on every rail at once; a failure is the row's error, not the fleet's.
fn measure_pair(cfg: &NodeConfig, opts: &RunOptions, step: u32, round: u32, retest: bool, p: Pair) -> PairRow {
    let m = &cfg.measure;
    let mut o = opts.clone();
    o.tcp_port = cfg.port + p.server as u16;
    o.json = None;
    let host = &cfg.peers[p.server as usize];
    let mut row = PairRow::failed(step, round, retest, p.client, p.server, String::new());
    row.client_node = crate::names::this_host();
    row.client_addr = cfg.peers[p.client as usize].clone();
    row.server_addr = host.clone();
    row.devices = opts.rails.resolve().unwrap_or_default();
    (row.size, row.qps, row.lat_size) = (m.bw_size, m.bw_qps, m.lat_size);
    let bw = TestSpec {
        sizes: vec![m.bw_size],
        iterations: m.bw_iterations,
        num_qps: m.bw_qps,
        warmup: m.warmup,
        ..TestSpec::new(Operation::Write, Measure::Bandwidth)
    };
    let lat = TestSpec {
        sizes: vec![m.lat_size],
        iterations: m.lat_iterations,
        warmup: m.warmup.min(m.lat_iterations),
        ..TestSpec::new(Operation::Write, Measure::Latency)
    };
    let mut gbps = Vec::new();
    let (mut p50, mut p99) = (Vec::new(), Vec::new());
    let result = (|| -> Result<()> {
        for _ in 0..m.repeats {
            let run = runner::client(host, &bw, &o)?;
            note_peer(&mut row, &run);
            gbps.extend(
                run.results.first().and_then(|r| r.bandwidth.as_ref()).map(|b| b.avg_bytes_per_sec * 8.0 / 1e9),
            );
        }
        for _ in 0..m.repeats {
            let run = runner::client(host, &lat, &o)?;
            if let Some(l) = run.results.first().and_then(|r| r.latency.as_ref()) {
                p50.push(l.summary.p50_ns / 1e3);
                p99.push(l.summary.p99_ns / 1e3);
            }
        }
        Ok(())
    })();
    row.gbps = super::attribution::median(&mut gbps.clone());
    row.gbps_repeats = gbps;
    row.p50_us = super::attribution::median(&mut p50);
    row.p99_us = super::attribution::median(&mut p99);
    match result {
        Ok(()) => {
            row.status = "ok".into();
            row.error = None;
        }
        Err(e) => row.error = Some(e.to_string()),
    }
    row
}

/// The server's node name and devices, from a run's environment.
fn note_peer(row: &mut PairRow, run: &RunResult) {
    row.server_node = run.environment.peer.host.clone();
    row.peer_devices = if run.rails.is_empty() {
        vec![run.environment.peer.device.clone()]
    } else {
        run.rails.iter().map(|r| r.peer_device.clone()).collect()
    };
}

/// Node 0's last words: the rows its barrier recorded for pairs whose client left the
/// fleet before it could report them, so the logs hold every pair.
pub fn orphan_rows(outcome: &Outcome) -> Vec<PairRow> {
    outcome.rows.iter().filter(|r| r.client_node.is_empty()).cloned().collect()
}
