//! One node of an all-pairs fleet (one pod, or one process of the lab's switch): it
//! serves every test its partners start, and keeps step with the others through node 0's
//! coordinator: arrive (with the rows of the step before), take its task, do it. Node 0
//! also runs the coordinator and, at the end, prints the fleet's verdict.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::attribution::{self, Thresholds};
use super::barrier::{Barrier, Outcome};
use super::config::Measurement;
use super::coordinator::Coordinator;
use super::schedule::Plan;
use crate::bench::runner::{self, RunOptions};
use crate::error::{Error, Result};
use crate::report::RunResult;
use crate::report::pairs::{PairError, PairRow, Phase, Retest, ServedRow};
use crate::session::proto::{Task, Work};
use crate::session::{Channel, Listener, Message, handshake};
use crate::verbs::counters;

/// How a step of pairs is run: every pair's bandwidth at once (that loads the fabric),
/// a barrier, then every pair's latency at once, so that no latency is measured beside
/// another pair's stream (in the lab a bandwidth pair beside a latency pair raised its
/// p99 from about 0.2 ms to 8 ms; on a cluster they share the fabric).
pub const PHASES: [&[Phase]; 2] = [&[Phase::Bandwidth], &[Phase::Latency]];

/// The messages of the serving thread's failed sessions since the pair being served began.
type Failures = Arc<Mutex<Vec<String>>>;

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
    /// What the pairs run on.
    pub measuring: Measuring,
}

/// What a node's pairs run on: the verbs (every real fleet), or a synthetic figure with no
/// RDMA and no server, for the fleet simulator (`benches/fleet_sim.rs`): the real
/// coordinator, barrier and node loop over real sockets, at a thousand nodes on one host.
#[derive(Debug, Clone, Copy)]
pub enum Measuring {
    Verbs,
    Synthetic {
        /// Bandwidth of client -> server, Gb/s.
        gbps: fn(u32, u32) -> f64,
        /// How long each phase of a pair takes.
        takes: Duration,
    },
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

    fn check(&self) -> Result<()> {
        self.plan.check().map_err(Error::Usage)?;
        let n = self.plan.nodes;
        if self.index >= n || self.peers.len() != n as usize {
            return Err(Error::Usage(format!(
                "node {} of {n} with {} peer addresses: give --index below --pods and one address per node",
                self.index,
                self.peers.len()
            )));
        }
        if u32::from(self.port) + n > u32::from(u16::MAX) {
            return Err(Error::Usage(format!(
                "-p {}: the fleet uses ports {}..={} (one per node and the barrier's); give a lower port",
                self.port,
                self.port,
                u32::from(self.port) + n
            )));
        }
        Ok(())
    }
}

/// What node 0 knows at the end (other nodes: their own rows only).
pub struct NodeOutcome {
    pub rows: Vec<PairRow>,
    pub barrier: Option<Outcome>,
    /// When this node's first task came: once every node had joined.
    pub first_task: Option<Instant>,
}

pub fn run(cfg: &NodeConfig, opts: &RunOptions) -> Result<NodeOutcome> {
    cfg.check()?;
    let n = cfg.plan.nodes;
    let fingerprint = serde_json::to_string(&cfg.plan).expect("a plan serialises");
    let step_timeout = cfg.step_timeout(opts);
    // The longest a node may wait for its next task: every step, the retests and the join.
    let whole = cfg.join_timeout + step_timeout * (cfg.plan.step_count() as u32 + 2 * n + 2);
    let mut serving = opts.clone();
    serving.tcp_port = cfg.port + cfg.index as u16;
    serving.connect_timeout = whole;
    // Both ports are taken before joining: a node that cannot serve stops here (exit 3)
    // with the reason, instead of being judged later for failing against its partners.
    // A simulated node serves nothing.
    let door = match cfg.measuring {
        Measuring::Verbs => Some(serving.door()?),
        Measuring::Synthetic { .. } => None,
    };
    let coordinator = if cfg.index == 0 {
        let who = format!("node 0 of a fleet of {n} (its coordinator holds every node's connection)");
        crate::session::open_files::ensure(super::coordinator::open_files_needed(n), &who)?;
        let listener = Listener::bind(opts.bind, cfg.barrier_port())?;
        let barrier = Barrier::new(
            n,
            fingerprint.clone(),
            &cfg.plan.steps(),
            &PHASES.map(<[Phase]>::to_vec),
            cfg.thresholds,
            cfg.join_timeout,
            step_timeout,
            Duration::ZERO,
        );
        let c = Coordinator { listener, token: opts.token.clone(), timeout: opts.timeout, barrier };
        Some(std::thread::spawn(move || c.run(Instant::now())))
    } else {
        None
    };
    // The serving thread's failed sessions, for the pair being served.
    let failures: Failures = Arc::default();
    let server = door.map(|door| {
        let o = serving.clone();
        let failures = Arc::clone(&failures);
        let failed = move |e: &Error| failures.lock().expect("no poisoning").push(e.message());
        std::thread::spawn(move || runner::serve_workload_at(door, &o, &failed))
    });
    let outcome = take_tasks(cfg, opts, &fingerprint, &failures);
    // Node 0's verdict first: the coordinator ends with the barrier, whatever this node's
    // own server is doing (a stuck one must not hold the fleet's verdict).
    let barrier = match coordinator {
        Some(h) => Some(h.join().map_err(|_| Error::Check("the fleet's barrier panicked".into()))??),
        None => None,
    };
    let (mine, first_task) = outcome?;
    if let Some(server) = server {
        // This node's server ends with a finish from this node, as a workload's would; one
        // that does not stop within SERVER_STOP is left behind and said so.
        let mut finishing = serving.clone();
        finishing.connect_timeout = FINISH_CONNECT;
        let _ = runner::finish_workload(&cfg.peers[cfg.index as usize], &finishing);
        let served = join_within(server, opts.timeout + SERVER_STOP);
        match (served, &barrier) {
            (Ok(()), _) => {}
            // Node 0 still gives the verdict: its partners' rows already judge its server.
            (Err(e), Some(_)) => eprintln!("rdmabench: fleet: {}", e.context("this node's server stopped")),
            (Err(e), None) => return Err(e.context("this node's server stopped")),
        }
    }
    Ok(NodeOutcome { rows: mine, barrier, first_task })
}

/// How long a node tries to reach its own server to tell it the fleet is over.
const FINISH_CONNECT: Duration = Duration::from_secs(5);
/// How long a node's server may take to stop after the finish, beyond `--timeout`.
const SERVER_STOP: Duration = Duration::from_secs(3);

/// The longest node 0 takes, after the fleet's last step ends, to print its verdict:
/// reaching its own server, its greeting (`--timeout`), and the server's stop.
pub fn verdict_within(timeout: Duration) -> Duration {
    FINISH_CONNECT + 2 * timeout + SERVER_STOP
}

/// Joins this node's serving thread, or gives up on it after `within` (a stuck session:
/// the process exits without it).
fn join_within(server: std::thread::JoinHandle<Result<()>>, within: Duration) -> Result<()> {
    let until = Instant::now() + within;
    while !server.is_finished() {
        if Instant::now() >= until {
            return Err(Error::Peer(format!(
                "it did not stop within {:.0} s of the fleet's end (a session stuck in it); left behind",
                within.as_secs_f64()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    server.join().unwrap_or_else(|_| Err(Error::Check("this node's server panicked".into())))
}

/// The node's loop: join, then arrive -> task -> do it, until the coordinator says the
/// fleet is over. Each measured pair's row is printed here, once.
fn take_tasks(
    cfg: &NodeConfig,
    opts: &RunOptions,
    fingerprint: &str,
    failures: &Failures,
) -> Result<(Vec<PairRow>, Option<Instant>)> {
    let n = cfg.plan.nodes;
    let join_until = Instant::now() + cfg.join_timeout;
    let mut chan = join_fleet(cfg, opts, fingerprint, join_until)?;
    let (mut mine, mut last, mut records) = (Vec::new(), Vec::new(), Vec::new());
    // The pair measured in an earlier phase, whose row is not due yet.
    let mut pending: Option<PairRow> = None;
    // The pair this node serves: its client, this side's counters when it began, and
    // whether the step just ended was its last phase.
    let mut serving: Option<(u32, Vec<counters::Reading>, bool)> = None;
    let mut step = 0u32;
    let mut first_task = None;
    loop {
        let (rows, served) = (std::mem::take(&mut last), std::mem::take(&mut records));
        let answer = chan
            .send(&Message::Arrive { step, rows, served })
            .and_then(|()| chan.recv("this node's task from the fleet's coordinator"));
        let answer = match answer {
            // Before its first task a node's join may have been cut (node 0 sheds
            // connections beyond its bound under a storm of joins): it joins again.
            Err(e) if step == 0 && !matches!(e, Error::Interrupted(_)) && Instant::now() < join_until => {
                eprintln!("rdmabench: fleet: the join was cut before the first task ({e}); joining again");
                chan = join_fleet(cfg, opts, fingerprint, join_until)?;
                continue;
            }
            answer => answer?,
        };
        first_task.get_or_insert_with(Instant::now);
        let Task { work, .. } = match answer {
            Message::Task(t) if t.step == step => t,
            Message::Refuse { code, message } => {
                let why = format!("the fleet's barrier refused this node: {message}");
                return Err(Error::from_code(code, why).quoting());
            }
            other => return Err(chan.unexpected(&other, &format!("this node's task for step {step}"))),
        };
        // The step before has ended: what this node saw of the pair it served, if done.
        if let Some((client, before, true)) = serving.take_if(|s| s.2) {
            let errors = std::mem::take(&mut *failures.lock().expect("no poisoning"));
            let served = ServedRow {
                step: step - 1,
                client,
                server: cfg.index,
                counters: counters_since(opts, &before),
                error: (!errors.is_empty()).then(|| crate::report::pairs::bounded(errors.join("; "))),
            };
            println!("{}", served.line());
            // Node 0 joins it to the pair's row too, for its own verdict.
            records.push(served);
        }
        match work {
            Work::Done => return Ok((mine, first_task)),
            Work::Measure { server, round, phases, retest, report } => {
                if server >= n || server == cfg.index || phases.is_empty() {
                    return Err(Error::Peer(format!(
                        "{} gave node {} an impossible task: measure against node {server} of {n} ({} phases); \
                         run the same rdmabench on every node",
                        chan.peer(),
                        cfg.index,
                        phases.len()
                    )));
                }
                // A pair's first phase: say it is a retest, and of what.
                if let (Some(r), None) = (retest, &pending) {
                    eprintln!("rdmabench: fleet: step {step}: {r}: measuring against node {server}");
                }
                let mut row = pending
                    .take()
                    .filter(|r| r.server == server && r.retest == retest)
                    .unwrap_or_else(|| new_row(cfg, opts, (round, retest), server));
                measure_phases(cfg, opts, &mut row, &phases);
                if report {
                    row.step = step;
                    println!("{}", row.line());
                    mine.push(row.clone());
                    last.push(row);
                } else {
                    pending = Some(row);
                }
            }
            Work::Serve { client, report } => {
                eprintln!("rdmabench: fleet: step {step}: node {client} measures against this node");
                match serving.as_mut().filter(|s| s.0 == client) {
                    Some(s) => s.2 = report,
                    None => {
                        failures.lock().expect("no poisoning").clear();
                        let before = match cfg.measuring {
                            Measuring::Verbs => read_counters(opts),
                            Measuring::Synthetic { .. } => Vec::new(),
                        };
                        serving = Some((client, before, report));
                    }
                }
            }
            Work::Rest => {}
        }
        step += 1;
    }
}

/// The first pause before a node tries to join again, doubled after each try up to
/// [`JOIN_RETRY_MAX`].
const JOIN_RETRY_FIRST: Duration = Duration::from_millis(100);
const JOIN_RETRY_MAX: Duration = Duration::from_secs(3);

/// Connects to the fleet's coordinator and joins, trying again with a growing pause (a
/// fleet's nodes start within seconds of each other and node 0 may cut a join under the
/// storm) until `until`, the join timeout; then says why the last try failed.
fn join_fleet(cfg: &NodeConfig, opts: &RunOptions, fingerprint: &str, until: Instant) -> Result<Channel> {
    let mut pause = JOIN_RETRY_FIRST;
    for tries in 1u32.. {
        let left = until.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
        let joined = Channel::connect(&cfg.peers[0], cfg.barrier_port(), left, opts.timeout).and_then(|mut chan| {
            handshake::join(&mut chan, cfg.index, cfg.plan.nodes, fingerprint, opts.token.as_ref())?;
            Ok(chan)
        });
        match joined {
            Ok(mut chan) => {
                chan.name_peer("node-0, the fleet's coordinator");
                // Each side hears the other for the whole fleet: the coordinator beats from
                // its loop, this node from a keepalive, so a coordinator that vanished
                // (killed, host down, link cut) is named within --timeout, not after the
                // plan's length.
                chan.keep_alive();
                return Ok(chan);
            }
            Err(e @ Error::Interrupted(_)) => return Err(e),
            Err(e) if Instant::now() + pause >= until => {
                return Err(e.context(&format!(
                    "node {} could not join the fleet's coordinator in {tries} tries within its join timeout ({:.0} s)",
                    cfg.index,
                    cfg.join_timeout.as_secs_f64()
                )));
            }
            Err(e) => {
                eprintln!("rdmabench: fleet: joining the coordinator failed ({e}); trying again");
                // Nodes that failed together spread out: a pause of 1 to 2 times `pause`.
                let spread = pause.mul_f64(f64::from(cfg.index % 16) / 16.0);
                std::thread::sleep(pause + spread);
                pause = (pause * 2).min(JOIN_RETRY_MAX);
            }
        }
    }
    unreachable!("the loop returns")
}

/// The row of this node's pair against `server`, before anything is measured.
fn new_row(cfg: &NodeConfig, opts: &RunOptions, (round, retest): (u32, Option<Retest>), server: u32) -> PairRow {
    let m = &cfg.measure;
    let mut row = PairRow::blank(0, round, retest, cfg.index, server);
    row.client_node = crate::names::this_host();
    row.client_addr = cfg.peers[cfg.index as usize].clone();
    row.server_addr = cfg.peers[server as usize].clone();
    row.devices = opts.rails.resolve().unwrap_or_default();
    (row.size, row.qps, row.lat_size) = (m.bw_size, m.bw_qps, m.lat_size);
    row
}

/// Measures `phases` of the pair into its row, with this side's port counters that moved
/// meanwhile (added to what earlier phases moved).
fn measure_phases(cfg: &NodeConfig, opts: &RunOptions, row: &mut PairRow, phases: &[Phase]) {
    if let Measuring::Synthetic { gbps, takes } = cfg.measuring {
        for phase in phases {
            std::thread::sleep(takes);
            match phase {
                Phase::Bandwidth => row.gbps = Some(gbps(row.client, row.server)),
                Phase::Latency => (row.p50_us, row.p99_us) = (Some(2.0), Some(3.0)),
            }
        }
        return;
    }
    let before = read_counters(opts);
    measure_each(cfg, opts, row, phases);
    for (name, delta) in counters_since(opts, &before) {
        *row.counters.entry(name).or_default() += delta;
    }
}

/// This node's ports' counters now, one reading per rail.
fn read_counters(opts: &RunOptions) -> Vec<counters::Reading> {
    let devices = opts.rails.resolve().unwrap_or_default();
    devices.iter().map(|d| counters::read_now(d, opts.rails.ib_port)).collect()
}

/// What moved on this node's ports since `before`, every rail summed.
fn counters_since(opts: &RunOptions, before: &[counters::Reading]) -> BTreeMap<String, u64> {
    let mut sum = BTreeMap::new();
    for (now, was) in read_counters(opts).iter().zip(before) {
        for (name, delta) in now.since(was) {
            *sum.entry(name).or_default() += delta;
        }
    }
    sum
}

/// Each of `phases`: bandwidth (warm-up, then the repeats; their median) and latency
/// (p50 and p99 medians), on every rail at once. A failure is the row's error (its kind
/// and the phase that failed), not the fleet's; after one, later phases are not run.
fn measure_each(cfg: &NodeConfig, opts: &RunOptions, row: &mut PairRow, phases: &[Phase]) {
    let m = &cfg.measure;
    let mut o = opts.clone();
    o.tcp_port = cfg.port + row.server as u16;
    o.json = None;
    let host = cfg.peers[row.server as usize].clone();
    for &phase in phases {
        if row.error.is_some() {
            return;
        }
        let spec = m.spec(phase);
        let (mut gbps, mut p50, mut p99) = (Vec::new(), Vec::new(), Vec::new());
        let result = (0..m.repeats).try_for_each(|_| {
            let run = runner::client(&host, &spec, &o)?;
            note_peer(row, &run);
            let first = run.results.first();
            gbps.extend(first.and_then(|r| r.bandwidth.as_ref()).map(|b| b.avg_bytes_per_sec * 8.0 / 1e9));
            if let Some(l) = first.and_then(|r| r.latency.as_ref()) {
                p50.push(l.summary.p50_ns / 1e3);
                p99.push(l.summary.p99_ns / 1e3);
            }
            Ok::<(), Error>(())
        });
        match phase {
            Phase::Bandwidth => {
                row.gbps = attribution::median(&mut gbps.clone());
                row.gbps_repeats = gbps;
            }
            Phase::Latency => {
                row.p50_us = attribution::median(&mut p50);
                row.p99_us = attribution::median(&mut p99);
            }
        }
        if let Err(e) = result {
            row.error = Some(PairError::of(&e, Some(phase)));
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_0_gives_its_verdict_within_the_time_the_fleet_docs_state() {
        assert_eq!(verdict_within(Duration::from_secs(10)), Duration::from_secs(28));
        let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/fleet.md")).unwrap();
        assert!(docs.contains("5 s + 2 x `--timeout` + 3 s (28 s by default)"), "docs/fleet.md states the bound");
    }
}
