//! The two roles of a test. The client owns the spec and drives every size over the
//! session; the server needs only device flags and follows. Both print the table; the
//! client's results travel to the server in the final report so its log shows them too.

use std::io::Write;
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::SyncSender;
use std::time::Duration;

use super::rails::{self, Conductor};
use crate::bench::soak::{self, Soak};
use crate::bench::{bandwidth, cpus, latency, memory, ring};
use crate::error::{Error, Result};
use crate::link::{Prepared, Role, SizeRun};
use crate::report;
use crate::report::file;
use crate::report::histogram::SizeHistogram;
use crate::report::json::{self, Document};
use crate::report::table::{self, Units};
use crate::report::{Environment, IntervalResult, LatencyResult, RailResult, RunResult, SizeResult, rail_label};
use crate::session::auth::Token;
use crate::session::{Channel, Door, Message, RailHello, handshake, proto};
use crate::spec::rails::{Devices, RailMode};
use crate::spec::{Measure, Operation, TestSpec, Transport};
use crate::stats::cpu::CpuMeter;
use crate::stats::{Clock, LatencyRecorder};
use crate::validate::profiles::{self, Sharing};
use crate::verbs::{DeviceSelection, Endpoint, inventory};

/// Which devices the run's rails use, and the port and GID index on each.
#[derive(Debug, Clone, Default)]
pub struct RailOptions {
    pub devices: Devices,
    pub ib_port: u8,
    pub gid_index: Option<u32>,
    pub mode: RailMode,
}

impl RailOptions {
    fn selection(&self, device: &str) -> DeviceSelection {
        DeviceSelection { device: Some(device.to_string()), port: self.ib_port, gid_index: self.gid_index }
    }

    /// This side's rails' devices, checked against what this process can open.
    pub fn resolve(&self) -> Result<Vec<String>> {
        self.devices.resolve(&inventory::device_names()?)
    }
}

#[derive(Clone)]
pub struct RunOptions {
    pub rails: RailOptions,
    pub tcp_port: u16,
    /// The address a server listens on (`--bind`); every address when none.
    pub bind: Option<IpAddr>,
    /// The shared secret (`--token-file`, `$RDMABENCH_TOKEN`): a server refuses clients
    /// without its proof; a client proves it.
    pub token: Option<Token>,
    /// Registered memory one test may take on this side (`--max-memory`), all rails together.
    pub max_memory: u64,
    pub connect_timeout: Duration,
    pub timeout: Duration,
    pub json: Option<String>,
    pub cpu_util: bool,
    /// Print each size's port counter deltas under its row (`--counters`).
    pub counters: bool,
    /// `--interval-log`: every soak interval as a JSON line, to this file or stdout (`-`).
    pub interval_log: Option<String>,
    /// Where a soak's kernels send each interval as it ends (set by the client run).
    pub intervals: Option<SyncSender<IntervalResult>>,
    pub histogram: Option<String>,
    pub units: Units,
    /// Tables go to stderr (a workload run writing its JSON to stdout).
    pub tables_on_stderr: bool,
}

impl RunOptions {
    /// Tables go to stdout, unless the JSON document (or the interval log) does.
    fn tables_to_stderr(&self) -> bool {
        self.tables_on_stderr || self.json.as_deref() == Some("-") || self.interval_log.as_deref() == Some("-")
    }

    fn table_out(&self) -> Box<dyn Write> {
        if self.tables_to_stderr() { Box::new(std::io::stderr()) } else { Box::new(std::io::stdout()) }
    }

    /// The server's door on `--bind`/`-p`, requiring the token when one is set.
    /// This side's control port, listening (a port in use fails here, exit 3).
    pub fn door(&self) -> Result<Door> {
        Door::bind(self.bind, self.tcp_port, self.token.clone(), self.timeout)
    }

    /// The output files can be written: checked before anything is measured.
    fn check_outputs(&self) -> Result<()> {
        let log = self.interval_log.clone().filter(|p| p != "-");
        file::check_outputs(&[(&self.json, "--json"), (&self.histogram, "--histogram"), (&log, "--interval-log")])
    }

    fn timeout_ns(&self) -> u64 {
        self.timeout.as_nanos() as u64
    }
}

fn io_err(e: std::io::Error) -> Error {
    Error::Environment(format!("cannot write the report: {e}"))
}

/// CPUs for each rail's threads, near its NIC. A rail whose NIC's NUMA node sysfs does not
/// give (soft-RoCE, many VMs) gets none and is not pinned: there is no locality to gain,
/// and two processes on one host (a loopback check, the lab) would stack on the same CPUs.
fn cpu_plan(devices: &[String], threads: u32) -> Vec<Vec<usize>> {
    let nodes: Vec<Option<i32>> = devices.iter().map(|d| inventory::numa_node(d)).collect();
    let plan = cpus::plan(&nodes, threads as usize, &cpus::allowed(), cpus::of_numa_node);
    plan.into_iter().zip(&nodes).map(|(c, n)| if n.is_some() { c } else { Vec::new() }).collect()
}

/// Runs the test against the server at `host` on every rail (one session each); returns
/// the results of every size, per rail and in total. A rail that fails does not stop the
/// others: the run reports what every rail measured, then fails naming the rail.
pub fn client(host: &str, spec: &TestSpec, opts: &RunOptions) -> Result<RunResult> {
    match client_keeping(host, spec, opts) {
        (Some(run), None) => Ok(run),
        (_, Some(e)) => Err(e),
        (None, None) => unreachable!("a run without results failed"),
    }
}

/// [`client`], keeping what the rails measured when one of them failed (a workload step
/// records the other rails' figures).
pub fn client_keeping(host: &str, spec: &TestSpec, opts: &RunOptions) -> (Option<RunResult>, Option<Error>) {
    match client_run(host, spec, opts) {
        Ok((run, error)) => (Some(run), error),
        Err(e) => (None, Some(e)),
    }
}

fn client_run(host: &str, spec: &TestSpec, opts: &RunOptions) -> Result<(RunResult, Option<Error>)> {
    spec.check()?;
    if opts.histogram.is_some() && spec.measure != Measure::Latency {
        return Err(Error::Usage("--histogram applies to latency tests".into()));
    }
    opts.check_outputs()?;
    let devices = opts.rails.resolve()?;
    memory::check(spec, devices.len(), opts.max_memory, "this client")?;
    if spec.interval_secs.is_none() {
        return client_rails(host, spec, opts, devices);
    }
    let printer = soak::Printer::start(opts.interval_log.as_deref(), opts.tables_to_stderr(), opts.units)?;
    let opts = RunOptions { intervals: Some(printer.sender()), ..opts.clone() };
    let outcome = client_rails(host, spec, &opts, devices);
    // The kernels' senders go with the options; the printer then ends once it has
    // written every interval.
    drop(opts);
    printer.finish();
    outcome
}

/// The rails of a client run, each on its thread (a lone one on this thread), and the
/// printer of their table.
fn client_rails(
    host: &str,
    spec: &TestSpec,
    opts: &RunOptions,
    devices: Vec<String>,
) -> Result<(RunResult, Option<Error>)> {
    let cpus = cpu_plan(&devices, spec.threads);
    let conductor = Conductor::new(&devices, &cpus, opts.rails.mode);
    let clock = Clock::new();
    let many = devices.len() > 1;
    let rail = |i: usize| {
        if let Err(e) = client_rail(i, host, spec, opts, &devices, &conductor, &clock) {
            conductor.fail(i, e);
        }
    };
    let run = std::thread::scope(|scope| -> Result<RunResult> {
        // The printer waits on the rails. A lone rail measures on this thread, as a
        // one-device run always did (measured: its latency 2-3 % lower than on a thread of
        // its own in the lab); several get a thread each.
        let printer = scope.spawn(|| {
            let run = print_as_measured(spec, opts, &conductor, many).inspect_err(|e| conductor.halt(e.clone()))?;
            if let Some(path) = &opts.histogram {
                report::histogram::write(path, &spec.name(), &merged_histograms(&conductor))?;
            }
            Ok(run)
        });
        if many {
            for i in 0..devices.len() {
                scope.spawn(move || rail(i));
            }
        } else {
            rail(0);
        }
        printer.join().unwrap_or_else(|_| Err(Error::Environment("the report printer failed".into())))
    })?;
    if let Some(target) = &opts.json
        && (!run.results.is_empty() || !run.rails.is_empty())
    {
        json::write(&Document::new("client", run.clone()), target)?;
    }
    let error = conductor.lock().first_error();
    Ok((run, error))
}

/// A rail whose link went down mid-run: a work request fails (rxe: a local QP error), or
/// nothing moves until the deadline. Either way the path is lost (exit 4), and the error
/// says the port is down; other failures stay as they are.
fn link_loss(e: Error, device: &str, port: u8) -> Error {
    let lost = match &e {
        Error::Check(m) if m.contains("completion status") => Some(m),
        Error::Peer(m) => Some(m),
        _ => None,
    };
    match (lost, inventory::port_state_now(device, port)) {
        (Some(m), Some(state)) if state != "ACTIVE" => Error::Peer(format!(
            "{m}: {device} port {port} is now {state}: the link went down during the run; check the cable/netdev \
             (ip link) and `rdma link`"
        )),
        _ => e,
    }
}

/// One rail of the client: prepare, connect, every size in its turn, then the report.
fn client_rail(
    i: usize,
    host: &str,
    spec: &TestSpec,
    opts: &RunOptions,
    devices: &[String],
    conductor: &Conductor,
    clock: &Clock,
) -> Result<()> {
    let cpus = conductor.lock().rails[i].cpus.clone();
    if let Some(&cpu) = cpus.first() {
        cpus::pin(cpu);
    }
    // Local resources first, so bad flags fail at once, without a server.
    let prepared = Prepared::new(spec, &opts.rails.selection(&devices[i]));
    let prepared = match prepared {
        Err(e) if devices.len() == 1 || matches!(e, Error::Usage(_)) => return Err(e),
        other => other,
    };
    conductor.complete(i, |_| {});
    conductor.wait_turn(i, rails::CONNECT, None)?;
    let mut chan = Channel::connect(host, opts.tcp_port, opts.connect_timeout, opts.timeout)?;
    let rail = RailHello { index: i as u32, devices: devices.to_vec() };
    let theirs = handshake::open(&mut chan, spec, Some(rail), opts.token.as_ref())?;
    conductor.lock().rails[i].peer_device = theirs.get(i).cloned().unwrap_or_default();
    // A rail whose device failed still opens its session, so the server's rail ends
    // at once with the reason instead of waiting for it.
    let prepared = prepared.inspect_err(|e| chan.abort(e))?;
    let links = prepared.connect(Role::Client, spec, &mut chan)?;
    check_sharing(spec, &links[0].local, &links[0].remote, chan.peer()).inspect_err(|e| chan.abort(e))?;
    let env = links[0].environment(&format!("{host}:{}", opts.tcp_port));
    conductor.complete(i, |r| r.environment = Some(env));
    let keep_samples = opts.histogram.is_some() || devices.len() > 1;
    let warmup_spec = spec.warmup_pass();
    for (k, &size) in spec.sizes.iter().enumerate() {
        conductor.wait_turn(i, rails::size_step(k), Some(&mut chan))?;
        let runs_of = |spec| -> Vec<SizeRun> {
            links
                .iter()
                .map(|link| SizeRun { link, spec, size, clock, timeout_ns: opts.timeout_ns(), cpus: &cpus })
                .collect()
        };
        let warmed = match &warmup_spec {
            Some(w) => measure_size(&runs_of(w), &mut chan, opts, false, Pass::Warmup).map(|_| ()),
            None => Ok(()),
        };
        let (r, samples) = warmed
            .and_then(|()| {
                let pass = Pass::Measured { rail: (devices.len() > 1).then_some(i as u32) };
                measure_size(&runs_of(spec), &mut chan, opts, keep_samples, pass)
            })
            .map_err(|e| link_loss(e, &devices[i], opts.rails.ib_port))
            .inspect_err(|e| {
                if !matches!(e, Error::Peer(_)) {
                    chan.abort(e);
                }
            })?;
        conductor.complete(i, |rail| {
            rail.results.push(r);
            rail.samples.push(samples);
        });
        if crate::signals::winding_down().is_some() {
            break;
        }
    }
    // A soak wound down by Ctrl-C: the sizes measured so far are the run's (written by
    // the caller); the server hears why the rest will not come.
    if let Some(sig) = crate::signals::winding_down() {
        let e = Error::Interrupted(sig);
        chan.abort(&e);
        return Err(e);
    }
    // Every rail's results travel to the server on every rail, once all are in.
    let run = conductor.wait_report(&mut chan)?;
    chan.send(&Message::Report(Box::new(run)))?;
    match chan.recv("the server's goodbye")? {
        Message::Bye => Ok(()),
        other => Err(chan.unexpected(&other, "bye")),
    }
}

/// The client's table, printed size by size as every rail finishes it; returns the run.
fn print_as_measured(spec: &TestSpec, opts: &RunOptions, conductor: &Conductor, many: bool) -> Result<RunResult> {
    let mut out = opts.table_out();
    let progress = Progress::new(if many { 0 } else { spec.sizes.len() }, opts.json.as_deref() != Some("-"));
    {
        let s = conductor.wait_all(rails::CONNECT);
        if let Some(e) = &s.stop {
            return Err(e.clone());
        }
        if let Some(env) = s.rails.iter().find_map(|r| r.environment.as_ref()) {
            table::banner(&mut out, spec, env, "client").map_err(io_err)?;
            if many {
                for r in s.rail_results() {
                    rail_line(&mut out, &r).map_err(io_err)?;
                }
            }
            table::header(&mut out, spec, opts.units, opts.cpu_util, many).map_err(io_err)?;
        }
    }
    for (k, &size) in spec.sizes.iter().enumerate() {
        progress.show(k, size);
        let s = conductor.wait_all(rails::size_step(k));
        progress.clear();
        if many {
            for (i, r) in s.rails.iter().enumerate() {
                if let Some(row) = r.results.get(k) {
                    table::rail_row(&mut out, &i.to_string(), row, opts.units).map_err(io_err)?;
                    table::row_notes(&mut out, row, opts.counters, false).map_err(io_err)?;
                }
            }
            if let Some(total) = total_of(&s, k) {
                table::rail_row(&mut out, "all", &total, opts.units).map_err(io_err)?;
            }
        } else if let Some(row) = s.rails[0].results.get(k) {
            table::row(&mut out, row, opts.units).map_err(io_err)?;
            table::row_notes(&mut out, row, opts.counters, opts.cpu_util).map_err(io_err)?;
        }
        out.flush().map_err(io_err)?;
    }
    let s = conductor.wait_all(rails::size_step(spec.sizes.len().saturating_sub(1)));
    if s.rails.iter().any(|r| r.environment.is_some()) {
        table::footer(&mut out).map_err(io_err)?;
        if many && opts.rails.mode == RailMode::Sequential {
            writeln!(out, " rails ran one after another: \"all\" adds up figures not measured at once")
                .map_err(io_err)?;
        }
    }
    let run = assemble(spec, opts.rails.mode, &s, many);
    drop(s);
    conductor.publish(run.clone());
    Ok(run)
}

/// The aggregate of size index `k` over the rails that measured it.
fn total_of(s: &rails::State, k: usize) -> Option<SizeResult> {
    let measured: Vec<&rails::RailState> = s.rails.iter().filter(|r| r.results.len() > k).collect();
    let results: Vec<&SizeResult> = measured.iter().map(|r| &r.results[k]).collect();
    let samples: Vec<Option<&LatencyRecorder>> = measured.iter().map(|r| r.samples[k].as_ref()).collect();
    rails::aggregate(&results, &samples)
}

/// The run's result: with one rail, that rail's; with several, the aggregate plus each
/// rail's own.
fn assemble(spec: &TestSpec, mode: RailMode, s: &rails::State, many: bool) -> RunResult {
    let environment = s.rails.iter().find_map(|r| r.environment.clone()).unwrap_or_else(|| Environment {
        tool_version: env!("CARGO_PKG_VERSION").into(),
        host: crate::names::this_host(),
        device: s.rails[0].device.clone(),
        ..Default::default()
    });
    let results =
        if many { (0..spec.sizes.len()).map_while(|k| total_of(s, k)).collect() } else { s.rails[0].results.clone() };
    RunResult {
        test: spec.name(),
        spec: spec.clone(),
        environment,
        results,
        rails: if many { s.rail_results() } else { Vec::new() },
        rail_mode: many.then_some(mode),
    }
}

/// `--histogram` with several rails: every rail's samples of a size in one histogram.
fn merged_histograms(conductor: &Conductor) -> Vec<SizeHistogram> {
    let s = conductor.lock();
    let sizes = s.rails.iter().map(|r| r.results.len()).max().unwrap_or(0);
    (0..sizes)
        .filter_map(|k| {
            let mut merged = LatencyRecorder::new();
            let mut duration_ns = 0;
            let mut size = 0;
            for r in s.rails.iter().filter(|r| r.results.len() > k) {
                if let Some(rec) = &r.samples[k] {
                    merged.merge(rec);
                }
                duration_ns = duration_ns.max(r.results[k].duration_ns);
                size = r.results[k].size;
            }
            (merged.count() > 0).then(|| SizeHistogram { size, histogram: merged.histogram().clone(), duration_ns })
        })
        .collect()
}

/// A one-line progress indicator on stderr for sweeps, only when stdout is a terminal.
struct Progress {
    total: usize,
    on: bool,
}

impl Progress {
    fn new(total: usize, table_on_stdout: bool) -> Progress {
        // SAFETY: isatty only inspects the descriptor.
        let tty = unsafe { libc::isatty(1) == 1 && libc::isatty(2) == 1 };
        Progress { total, on: total > 1 && table_on_stdout && tty }
    }

    fn show(&self, done: usize, size: u64) {
        if self.on {
            eprint!("\r\x1b[K [{}/{}] measuring {size} B ...", done + 1, self.total);
        }
    }

    fn clear(&self) {
        if self.on {
            eprint!("\r\x1b[K");
        }
    }
}

/// Which pass of a size `measure_size` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// `--warmup`: run, then forget.
    Warmup,
    /// The measurement; `rail` names the rail in a run of several (for soak intervals).
    Measured { rail: Option<u32> },
}

/// Runs one size on every QP (`runs`, one per QP; latency uses the first).
fn measure_size(
    runs: &[SizeRun],
    chan: &mut Channel,
    opts: &RunOptions,
    keep_samples: bool,
    pass: Pass,
) -> Result<(SizeResult, Option<LatencyRecorder>)> {
    let warmup = pass == Pass::Warmup;
    let run = &runs[0];
    let SizeRun { spec, size, .. } = *run;
    for r in runs {
        latency::prepare(r.link, spec, size);
    }
    // Every QP of a rail is on one port: one reading covers them. A warm-up's are not kept.
    let counters_before = (!warmup).then(|| run.link.counters());
    chan.send(&Message::Start { size, warmup })?;
    // The server answers once it has reset its buffers; its keepalive speaks meanwhile.
    match chan.recv("the server to get ready")? {
        Message::Ready { size: s } if s == size => {}
        other => {
            return Err(chan.unexpected(&other, "ready"));
        }
    }
    let cpu = CpuMeter::start();
    let mut samples = None;
    let mut per_qp = Vec::new();
    let mut per_thread = Vec::new();
    let kernel = Kernel::of(spec);
    let (kind, scale) = if latency::is_ping_pong(spec) { ("one_way", 0.5) } else { ("round_trip", 1.0) };
    let mut soak = match (spec.interval_secs, spec.duration_secs, pass) {
        (Some(every), Some(d), Pass::Measured { rail }) => {
            Some(Soak::new(every, d, size, rail, scale, opts.intervals.clone()))
        }
        _ => None,
    };
    let mut intervals = Vec::new();
    let (iterations, duration_ns, latency, bandwidth) = match kernel {
        Kernel::Latency | Kernel::RingLatency => {
            let lat = if kernel == Kernel::RingLatency {
                ring::latency_client(runs, chan)?
            } else {
                latency::client(run, chan, soak.as_mut())?
            };
            if let Some(s) = soak.take() {
                intervals = s.finish(lat.elapsed_ns, None);
            }
            let summary = lat.recorder.summary(scale);
            if keep_samples {
                samples = Some(lat.recorder);
            }
            let result = LatencyResult { kind: kind.into(), unit: "ns".into(), summary };
            (lat.iterations, lat.elapsed_ns, Some(result), None)
        }
        Kernel::RingBandwidth => {
            let bw = ring::bandwidth_client(run, chan)?;
            (bw.iterations, bw.summary.elapsed_ns, None, Some(bw.summary))
        }
        Kernel::Bandwidth => {
            let side = bandwidth::client(runs, chan, soak.as_mut())?;
            if spec.bidirectional {
                // The server's traffic landed here: check it like the server checks ours.
                let theirs = &side.peer_per_qp;
                if let Some(e) = side.data_error.or_else(|| bandwidth::landed_data_error(runs, theirs)) {
                    return Err(Error::Check(format!("corrupted data from {}: {e}", chan.peer())));
                }
            }
            per_qp = side.sent_per_qp;
            per_thread = side.per_thread;
            let bw = side.sent.expect("the client always sends");
            if let Some(s) = soak.take() {
                intervals = s.finish(bw.summary.elapsed_ns, Some(bw.iterations));
            }
            (bw.iterations, bw.summary.elapsed_ns, None, Some(bw.summary))
        }
    };
    let cpu_util_pct = opts.cpu_util.then(|| cpu.percent());
    let counters = counters_before.and_then(|before| run.link.counters_since(&before));
    if !(spec.bidirectional && spec.measure == Measure::Bandwidth) {
        chan.send(&Message::Done { size, iterations, per_qp })?;
    }
    let mut delivered = None;
    let peer_cpu_util_pct;
    let (reverse_bandwidth, peer_counters) = match chan.recv("the server's verdict")? {
        Message::Verdict { size: s, iterations: theirs, data_error, reverse, counters, cpu_pct } if s == size => {
            peer_cpu_util_pct = cpu_pct.filter(|c| opts.cpu_util && c.is_finite() && *c >= 0.0);
            if let Some(c) = &counters {
                proto::check_counters(c)?;
            }
            if let Some(e) = data_error {
                return Err(Error::Check(format!("{} found corrupted data: {e}", chan.peer())));
            }
            let lossy = spec.transport != Transport::Rc && spec.uses_receives();
            if lossy && theirs <= iterations {
                delivered = Some(theirs);
            } else if theirs != iterations {
                return Err(Error::Check(format!(
                    "iteration counts disagree at {size} B: this side {iterations}, {} {theirs}",
                    chan.peer()
                )));
            }
            (reverse, counters)
        }
        other => {
            return Err(chan.unexpected(&other, "a verdict"));
        }
    };
    let result = SizeResult {
        size,
        iterations,
        bytes: size * iterations,
        duration_ns,
        latency,
        bandwidth,
        reverse_bandwidth,
        per_thread,
        data_validated: spec.validate_data,
        cpu_util_pct,
        peer_cpu_util_pct,
        delivered,
        counters,
        peer_counters,
        intervals,
    };
    Ok((result, samples))
}

/// Serves one test: learns the spec from the client, follows it on every rail the client
/// opens (one session each), prints the results. A connection that is no client, fails
/// the token, or whose own spec is refused (an invalid spec, over the memory budget) is
/// logged and the next one awaited: a stranger cannot end it. Once a hello has passed
/// those checks, what fails may be this side's own setup (its rails, device, GID), so
/// that test's outcome is the server's, as in perftest.
pub fn server(opts: &RunOptions, local_test_flags: &[&str]) -> Result<RunResult> {
    opts.check_outputs()?;
    let door = opts.door()?;
    loop {
        match door.next(opts.connect_timeout)? {
            (chan, Message::Finish { .. }) => {
                eprintln!("rdmabench: {} sent a finish: this server runs one test; still serving", chan.peer());
            }
            (chan, hello) => match serve(&door, chan, hello, opts, local_test_flags) {
                (Err(e), false) if !matches!(e, Error::Interrupted(_)) => {
                    eprintln!("rdmabench: a session was refused before its test began: {e}; still serving");
                }
                (result, _) => return result,
            },
        }
    }
}

/// Serves every session a workload's client opens (`rdmabench run --serve`), until an
/// authenticated client says it has finished, or a signal. A failed or hostile session is
/// logged and the next awaited: the client owns the verdict.
pub fn serve_workload(opts: &RunOptions) -> Result<()> {
    serve_workload_at(opts.door()?, opts, &|_| {})
}

/// [`serve_workload`] at a door already open (a fleet node binds before it joins, so a
/// port in use stops it at once); each failed session is also told to `failed`.
pub fn serve_workload_at(door: Door, opts: &RunOptions, failed: &dyn Fn(&Error)) -> Result<()> {
    loop {
        match door.next(opts.connect_timeout)? {
            (mut chan, Message::Finish { .. }) => {
                chan.send(&Message::Bye)?;
                return Ok(());
            }
            (chan, hello) => match serve(&door, chan, hello, opts, &[]) {
                (Err(e @ Error::Interrupted(_)), _) => return Err(e),
                (Err(e), _) => {
                    eprintln!("rdmabench: this session failed: {e}; waiting for the next");
                    failed(&e);
                }
                (Ok(_), _) => {}
            },
        }
    }
}

/// Tells a serving peer that the workload is over, so it exits.
pub fn finish_workload(host: &str, opts: &RunOptions) -> Result<()> {
    let mut chan = Channel::connect(host, opts.tcp_port, opts.connect_timeout, opts.timeout)?;
    handshake::finish(&mut chan, opts.token.as_ref())
}

/// The rails a client's first hello announces: every device it has, in order.
fn announced_rails(hello: &Message) -> Vec<String> {
    match hello {
        Message::Hello { rail: Some(r), .. } => r.devices.clone(),
        _ => Vec::new(),
    }
}

/// Serves one test on every rail: the first session's hello says how many rails the
/// client has; the others are accepted on the same port, each checked (a known, unused
/// rail index and the same rails), and served side by side.
/// Returns the outcome and whether the test began (see [`server`]).
fn serve(
    door: &Door,
    mut first: Channel,
    hello: Message,
    opts: &RunOptions,
    local_test_flags: &[&str],
) -> (Result<RunResult>, bool) {
    let ours = match opts.rails.resolve() {
        Ok(d) => d,
        Err(e) => {
            let _ = handshake::answer(&mut first, &hello, &[], |_, _| Err::<(), _>(e.clone()));
            // This side's devices: no client can cure that.
            return (Err(e), true);
        }
    };
    let began = AtomicBool::new(false);
    let result = serve_rails(door, first, hello, opts, local_test_flags, &ours, &began);
    (result, began.load(Ordering::Relaxed))
}

fn serve_rails(
    door: &Door,
    first: Channel,
    hello: Message,
    opts: &RunOptions,
    local_test_flags: &[&str],
    ours: &[String],
    began: &AtomicBool,
) -> Result<RunResult> {
    let theirs = announced_rails(&hello);
    let n = theirs.len().max(1);
    let mut out = opts.table_out();
    if !local_test_flags.is_empty() {
        writeln!(
            out,
            " note: {} given on the server are ignored: the server runs the client's spec",
            local_test_flags.join(" ")
        )
        .map_err(io_err)?;
    }
    if n > 1 && ours.len() > n {
        writeln!(out, " note: the client has {n} rails: this server's {} stay idle", ours[n..].join(", "))
            .map_err(io_err)?;
    }
    let clock = Clock::new();
    let seen = Mutex::new(vec![false; n]);
    let server = RailServer { opts, ours, theirs: &theirs, seen: &seen, clock: &clock, began };
    let outcomes: Vec<Result<(RunResult, Environment)>> = std::thread::scope(|scope| {
        let mut handles = Vec::new();
        let mut pending = Some((first, hello));
        for _ in 0..n {
            let (chan, hello) = match pending.take() {
                Some(p) => p,
                None => match next_rail(door, opts) {
                    Ok(p) => p,
                    Err(e) => {
                        handles.push(scope.spawn(move || Err(e)));
                        break;
                    }
                },
            };
            let server = &server;
            if n == 1 {
                // A lone rail is served on this thread, as a one-device run always was.
                return vec![server.serve(chan, hello)];
            }
            handles.push(scope.spawn(move || server.serve(chan, hello)));
        }
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(Error::Peer("a rail's thread failed".into()))))
            .collect()
    });
    let mut reports = Vec::new();
    let mut first_error = None;
    for o in outcomes {
        match o {
            Ok(r) => reports.push(r),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    // Every rail's report carries the whole run; this side's environments replace the client's.
    let rail0 = reports.iter().find(|(_, e)| Some(&e.peer.device) == theirs.first()).or(reports.first()).cloned();
    let Some((mut run, env)) = rail0 else {
        return Err(first_error.unwrap_or_else(|| Error::Peer("the client opened no rail".into())));
    };
    run.environment = env;
    let cpus = cpu_plan(ours, run.spec.threads);
    for rail in run.rails.iter_mut() {
        let mine = reports.iter().find(|(_, e)| e.peer.device == rail.device).map(|(_, e)| e.clone());
        std::mem::swap(&mut rail.device, &mut rail.peer_device);
        rail.environment = mine;
        rail.numa_node = rail.environment.as_ref().and_then(|e| e.nic.numa_node);
        rail.cpus = ours.iter().position(|d| *d == rail.device).map(|p| cpus[p].clone()).unwrap_or_default();
    }
    // The client's "this side" is the peer here.
    for r in run.results.iter_mut().chain(run.rails.iter_mut().flat_map(|rail| rail.results.iter_mut())) {
        std::mem::swap(&mut r.counters, &mut r.peer_counters);
        std::mem::swap(&mut r.cpu_util_pct, &mut r.peer_cpu_util_pct);
    }
    print_run(&mut out, &run, opts, "server").map_err(io_err)?;
    if let Some(target) = &opts.json {
        json::write(&Document::new("server", run.clone()), target)?;
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(run),
    }
}

/// The hello of the client's next rail; anything else meanwhile is logged and skipped.
fn next_rail(door: &Door, opts: &RunOptions) -> Result<(Channel, Message)> {
    loop {
        match door.next(opts.connect_timeout)? {
            (chan, hello @ Message::Hello { .. }) => return Ok((chan, hello)),
            (chan, other) => {
                eprintln!("rdmabench: {} sent a {} while rails were opening; ignored", chan.peer(), other.kind())
            }
        }
    }
}

/// A rail's line above a multi-rail table: its devices and GIDs, or why it never connected.
fn rail_line(out: &mut dyn Write, r: &RailResult) -> std::io::Result<()> {
    match &r.environment {
        Some(env) => table::rail_legend(out, r.rail, env),
        None => writeln!(out, " {}: failed: {}", r.label(), r.error.as_deref().unwrap_or("")),
    }
}

/// The whole table of a finished run, as the server prints it.
fn print_run(out: &mut dyn Write, run: &RunResult, opts: &RunOptions, role: &str) -> std::io::Result<()> {
    let units = opts.units;
    let notes = |out: &mut dyn Write, r: &SizeResult| table::row_notes(out, r, opts.counters, r.cpu_util_pct.is_some());
    let spec = &run.spec;
    table::banner(out, spec, &run.environment, role)?;
    let many = !run.rails.is_empty();
    for r in &run.rails {
        rail_line(out, r)?;
    }
    table::header(out, spec, units, run.results.iter().any(|r| r.cpu_util_pct.is_some()), many)?;
    for (k, total) in run.results.iter().enumerate() {
        if !many {
            table::row(out, total, units)?;
            notes(out, total)?;
            continue;
        }
        for r in &run.rails {
            if let Some(row) = r.results.get(k) {
                table::rail_row(out, &r.rail.to_string(), row, units)?;
                notes(out, row)?;
            }
        }
        table::rail_row(out, "all", total, units)?;
    }
    table::footer(out)
}

/// What every rail of one served test shares.
struct RailServer<'a> {
    opts: &'a RunOptions,
    /// This side's rails' devices.
    ours: &'a [String],
    /// The client's rails' devices, from its first hello.
    theirs: &'a [String],
    /// Which of the client's rails have opened their session.
    seen: &'a Mutex<Vec<bool>>,
    clock: &'a Clock,
    /// Set once a rail's hello passed the checks of the client's own spec: the test began.
    began: &'a AtomicBool,
}

impl RailServer<'_> {
    /// One rail of the server: checks the client's hello for it, connects this side's
    /// device of the same index and follows the client size by size; returns the client's
    /// report and this side's environment. Errors name the rail when there are several.
    fn serve(&self, mut chan: Channel, hello: Message) -> Result<(RunResult, Environment)> {
        let index = match &hello {
            Message::Hello { rail: Some(r), .. } => r.index as usize,
            _ => 0,
        };
        let label = |e: Error| match (self.theirs.len() > 1, self.ours.get(index), self.theirs.get(index)) {
            (true, Some(mine), Some(peer)) => e.context(&rail_label(index as u32, mine, peer)),
            (true, _, _) => e.context(&format!("rail {index}")),
            _ => e,
        };
        // Whatever ended this rail (a signal, an error in a loop, a refusal), the client
        // hears it; best effort, as the client may be what failed.
        let outcome = self.follow(&mut chan, hello).inspect_err(|e| chan.abort(e));
        outcome.map_err(|e| match self.ours.get(index) {
            Some(device) => label(link_loss(e, device, self.opts.rails.ib_port)),
            None => label(e),
        })
    }

    fn follow(&self, chan: &mut Channel, hello: Message) -> Result<(RunResult, Environment)> {
        let RailServer { opts, ours, theirs, seen, clock, began } = *self;
        let (spec, index) = handshake::answer(chan, &hello, ours, |s, rail| {
            s.check()?;
            memory::check(s, theirs.len().max(1), opts.max_memory, "this server")?;
            began.store(true, Ordering::Relaxed);
            let (index, devices) = match rail {
                Some(r) => (r.index as usize, r.devices.clone()),
                None => (0, ours.iter().take(1).cloned().collect()),
            };
            if devices != theirs && !theirs.is_empty() {
                return Err(Error::Peer(format!("rail {index} announced rails {devices:?}, the first {theirs:?}")));
            }
            crate::spec::rails::pair(ours, &devices)?;
            let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
            match seen.get_mut(index) {
                Some(s) if !*s => *s = true,
                _ => return Err(Error::Peer(format!("rail {index} is not a rail of this run, or was opened twice"))),
            }
            Ok((s.clone(), index))
        })?;
        // This side's rail threads near its NICs, sized to the client's --threads.
        let cpus = cpu_plan(ours, spec.threads);
        if let Some(&cpu) = cpus[index].first() {
            cpus::pin(cpu);
        }
        let links = Prepared::new(&spec, &opts.rails.selection(&ours[index]))?.connect(Role::Server, &spec, chan)?;
        check_sharing(&spec, &links[0].local, &links[0].remote, chan.peer())?;
        let env = links[0].environment(chan.peer());
        let my_cpus = &cpus[index];
        let warmup_spec = spec.warmup_pass();
        loop {
            match chan.recv("the next size or the final report")? {
                Message::Start { size, warmup } => {
                    if !spec.sizes.contains(&size) {
                        return Err(Error::Peer(format!(
                            "{} asked for size {size}, which is not in its spec",
                            chan.peer()
                        )));
                    }
                    let spec = match (warmup, &warmup_spec) {
                        (false, _) => &spec,
                        (true, Some(w)) => w,
                        (true, None) => {
                            return Err(Error::Peer(format!(
                                "{} asked for a warm-up its spec does not have",
                                chan.peer()
                            )));
                        }
                    };
                    for link in &links {
                        latency::prepare(link, spec, size);
                    }
                    let counters_before = (!warmup).then(|| links[0].counters());
                    chan.send(&Message::Ready { size })?;
                    chan.doing(&format!("serving the {} of size {size}", if warmup { "warm-up" } else { "run" }));
                    if !warmup {
                        crate::faults::stall_at(crate::faults::SERVER_RUN);
                    }
                    let cpu = CpuMeter::start();
                    let runs: Vec<SizeRun> = links
                        .iter()
                        .map(|link| SizeRun { link, spec, size, clock, timeout_ns: opts.timeout_ns(), cpus: my_cpus })
                        .collect();
                    let (iterations, data_error, reverse) = match Kernel::of(spec) {
                        Kernel::Latency => {
                            let o = latency::server(&runs[0], chan)?;
                            (o.iterations, o.data_error, None)
                        }
                        Kernel::RingLatency => {
                            let o = ring::latency_server(&runs, chan)?;
                            (o.iterations, o.data_error, None)
                        }
                        Kernel::RingBandwidth => ring::bandwidth_server(&runs[0], chan)?,
                        Kernel::Bandwidth => bandwidth::server(&runs, chan)?,
                    };
                    let counters = counters_before.and_then(|before| links[0].counters_since(&before));
                    let (data, cpu_pct) = (data_error.clone(), Some(cpu.percent()));
                    chan.send(&Message::Verdict { size, iterations, data_error: data, reverse, counters, cpu_pct })?;
                    if let Some(e) = data_error {
                        return Err(Error::Check(format!("corrupted data from {}: {e}", chan.peer())));
                    }
                }
                Message::Report(run) => {
                    chan.send(&Message::Bye)?;
                    return Ok((*run, env));
                }
                other => {
                    return Err(Error::Peer(format!("{} sent {} out of order", chan.peer(), other.kind())));
                }
            }
        }
    }
}

/// Pair validation: with `--profile`, an exclusive mode fails when both sides hold the
/// same physical NIC. (Sharing in shared modes is reported in the header and the JSON.)
fn check_sharing(spec: &TestSpec, local: &Endpoint, remote: &Endpoint, peer: &str) -> Result<()> {
    let Some(profile) = spec.profile.as_deref() else { return Ok(()) };
    let profile = profiles::by_name(profile)
        .ok_or_else(|| Error::Usage(format!("unknown profile {profile:?}; see rdmabench validate --help")))?;
    if profile.sharing == Sharing::Exclusive && local.nic.same_physical_nic(&remote.nic) {
        return Err(Error::Check(format!(
            "profile {}: this side ({} on {}) and {peer} ({} on {}) hold the same physical NIC (system image GUID \
             {}); exclusive mode gives each pod a NIC of its own: the plugin is in a shared mode or gave a NIC twice",
            profile.name, local.device, local.node, remote.device, remote.node, local.nic.sys_image_guid
        )));
    }
    Ok(())
}

/// The measurement loop a test runs, chosen here for both roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernel {
    /// Ping-pong or round trips (`latency`).
    Latency,
    /// Windowed posting (`bandwidth`).
    Bandwidth,
    /// Records echoed over two rings (`ring`).
    RingLatency,
    /// Records through one ring (`ring`).
    RingBandwidth,
}

impl Kernel {
    fn of(spec: &TestSpec) -> Kernel {
        match (spec.operation, spec.measure) {
            (Operation::Ring, Measure::Latency) => Kernel::RingLatency,
            (Operation::Ring, Measure::Bandwidth) => Kernel::RingBandwidth,
            (_, Measure::Latency) => Kernel::Latency,
            (_, Measure::Bandwidth) => Kernel::Bandwidth,
        }
    }
}
