//! The two roles of a test. The client owns the spec and drives every size over the
//! session; the server needs only device flags and follows. Both print the table; the
//! client's results travel to the server in the final report so its log shows them too.

use std::io::Write;
use std::time::Duration;

use crate::bench::{bandwidth, latency, ring};
use crate::error::{Error, Result};
use crate::link::{Prepared, Role, SizeRun};
use crate::report;
use crate::report::histogram::SizeHistogram;
use crate::report::json::{self, Document};
use crate::report::table::{self, Units};
use crate::report::{LatencyResult, RunResult, SizeResult};
use crate::session::{Channel, Message, handshake};
use crate::spec::{Measure, Operation, TestSpec, Transport};
use crate::stats::Clock;
use crate::stats::cpu::CpuMeter;
use crate::validate::profiles::{self, Sharing};
use crate::verbs::DeviceSelection;
use crate::verbs::Endpoint;
use hdrhistogram::Histogram;

pub struct RunOptions {
    pub selection: DeviceSelection,
    pub tcp_port: u16,
    pub connect_timeout: Duration,
    pub timeout: Duration,
    pub json: Option<String>,
    pub cpu_util: bool,
    pub histogram: Option<String>,
    pub units: Units,
    /// Tables go to stderr (a workload run writing its JSON to stdout).
    pub tables_on_stderr: bool,
}

impl RunOptions {
    /// Tables go to stdout, unless the JSON document does.
    fn table_out(&self) -> Box<dyn Write> {
        if self.tables_on_stderr || self.json.as_deref() == Some("-") {
            Box::new(std::io::stderr())
        } else {
            Box::new(std::io::stdout())
        }
    }

    fn timeout_ns(&self) -> u64 {
        self.timeout.as_nanos() as u64
    }
}

fn io_err(e: std::io::Error) -> Error {
    Error::Environment(format!("cannot write the report: {e}"))
}

/// Runs the test against the server at `host`; returns the results of every size.
pub fn client(host: &str, spec: &TestSpec, opts: &RunOptions) -> Result<RunResult> {
    spec.check()?;
    if opts.histogram.is_some() && spec.measure != Measure::Latency {
        return Err(Error::Usage("--histogram applies to latency tests".into()));
    }
    let prepared = Prepared::new(spec, &opts.selection)?;
    let mut chan = Channel::connect(host, opts.tcp_port, opts.connect_timeout, opts.timeout)?;
    handshake::open(&mut chan, spec)?;
    let address = format!("{host}:{}", opts.tcp_port);
    let links = prepared.connect(Role::Client, spec, &mut chan)?;
    check_sharing(spec, &links[0].local, &links[0].remote, chan.peer())?;
    let env = links[0].environment(&address);

    let mut out = opts.table_out();
    table::banner(&mut out, spec, &env, "client").map_err(io_err)?;
    table::header(&mut out, spec, opts.units, opts.cpu_util).map_err(io_err)?;
    let clock = Clock::new();
    let progress = Progress::new(spec.sizes.len(), opts.json.as_deref() != Some("-"));
    let mut results = Vec::with_capacity(spec.sizes.len());
    let mut histograms = Vec::new();
    for (k, &size) in spec.sizes.iter().enumerate() {
        progress.show(k, size);
        let runs: Vec<SizeRun> = links
            .iter()
            .map(|link| SizeRun { link, spec, size, clock: &clock, timeout_ns: opts.timeout_ns() })
            .collect();
        let (r, hist) = measure_size(&runs, &mut chan, opts).inspect_err(|e| {
            progress.clear();
            if !matches!(e, Error::Peer(_)) {
                chan.abort(e);
            }
        })?;
        progress.clear();
        table::row(&mut out, &r, opts.units).map_err(io_err)?;
        out.flush().map_err(io_err)?;
        if let Some(h) = hist {
            histograms.push(SizeHistogram { size, histogram: h, duration_ns: r.duration_ns });
        }
        results.push(r);
    }
    table::footer(&mut out).map_err(io_err)?;
    if let Some(path) = &opts.histogram {
        report::histogram::write(path, &spec.name(), &histograms)?;
    }

    let run = RunResult { test: spec.name(), spec: spec.clone(), environment: env, results };
    chan.send(&Message::Report(Box::new(run.clone())))?;
    match chan.recv("the server's goodbye")? {
        Message::Bye => {}
        other => {
            return Err(chan.unexpected(&other, "bye"));
        }
    }
    if let Some(target) = &opts.json {
        json::write(&Document::new("client", run.clone()), target)?;
    }
    Ok(run)
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

/// Runs one size on every QP (`runs`, one per QP; latency uses the first).
fn measure_size(
    runs: &[SizeRun],
    chan: &mut Channel,
    opts: &RunOptions,
) -> Result<(SizeResult, Option<Histogram<u64>>)> {
    let run = &runs[0];
    let SizeRun { spec, size, .. } = *run;
    for r in runs {
        latency::prepare(r.link, spec, size);
    }
    chan.send(&Message::Start { size })?;
    match chan.recv("the server to get ready")? {
        Message::Ready { size: s } if s == size => {}
        other => {
            return Err(chan.unexpected(&other, "ready"));
        }
    }
    let cpu = CpuMeter::start();
    let mut histogram = None;
    let mut per_qp = Vec::new();
    let mut per_thread = Vec::new();
    let kernel = Kernel::of(spec);
    let (iterations, duration_ns, latency, bandwidth) = match kernel {
        Kernel::Latency | Kernel::RingLatency => {
            let lat = if kernel == Kernel::RingLatency {
                ring::latency_client(runs, chan)?
            } else {
                latency::client(run, chan)?
            };
            if opts.histogram.is_some() {
                histogram = Some(lat.recorder.histogram().clone());
            }
            let (kind, scale) = if latency::is_ping_pong(spec) { ("one_way", 0.5) } else { ("round_trip", 1.0) };
            let summary = lat.recorder.summary(scale);
            let result = LatencyResult { kind: kind.into(), unit: "ns".into(), summary };
            (lat.iterations, lat.elapsed_ns, Some(result), None)
        }
        Kernel::RingBandwidth => {
            let bw = ring::bandwidth_client(run, chan)?;
            (bw.iterations, bw.summary.elapsed_ns, None, Some(bw.summary))
        }
        Kernel::Bandwidth => {
            let side = bandwidth::client(runs, chan)?;
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
            (bw.iterations, bw.summary.elapsed_ns, None, Some(bw.summary))
        }
    };
    let cpu_util_pct = opts.cpu_util.then(|| cpu.percent());
    if !(spec.bidirectional && spec.measure == Measure::Bandwidth) {
        chan.send(&Message::Done { size, iterations, per_qp })?;
    }
    let mut delivered = None;
    let reverse_bandwidth = match chan.recv("the server's verdict")? {
        Message::Verdict { size: s, iterations: theirs, data_error, reverse } if s == size => {
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
            reverse
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
        delivered,
    };
    Ok((result, histogram))
}

/// Serves one test: learns the spec from the client, follows it, prints the results.
pub fn server(opts: &RunOptions, local_test_flags: &[&str]) -> Result<RunResult> {
    let mut chan = Channel::accept(opts.tcp_port, opts.connect_timeout, opts.timeout)?;
    let hello = chan.recv("the client's hello")?;
    serve(chan, hello, opts, local_test_flags)
}

/// Serves every session a workload's client opens (`rdmabench run --serve`), until the
/// client says it has finished. A failed session is reported and the next awaited: the
/// client owns the verdict.
pub fn serve_workload(opts: &RunOptions) -> Result<()> {
    loop {
        let mut chan = Channel::accept(opts.tcp_port, opts.connect_timeout, opts.timeout)?;
        match chan.recv("the client's hello")? {
            Message::Finish => {
                chan.send(&Message::Bye)?;
                return Ok(());
            }
            hello => match serve(chan, hello, opts, &[]) {
                Ok(_) => {}
                Err(e @ Error::Interrupted(_)) => return Err(e),
                Err(e) => eprintln!("rdmabench: this session failed: {e}; waiting for the next"),
            },
        }
    }
}

/// Tells a serving peer that the workload is over, so it exits.
pub fn finish_workload(host: &str, opts: &RunOptions) -> Result<()> {
    let mut chan = Channel::connect(host, opts.tcp_port, opts.connect_timeout, opts.timeout)?;
    chan.send(&Message::Finish)?;
    match chan.recv("the server's goodbye")? {
        Message::Bye => Ok(()),
        other => Err(chan.unexpected(&other, "bye")),
    }
}

fn serve(mut chan: Channel, hello: Message, opts: &RunOptions, local_test_flags: &[&str]) -> Result<RunResult> {
    let spec = handshake::answer(&mut chan, &hello, |s| s.check().map(|_| s.clone()))?;
    let mut out = opts.table_out();
    if !local_test_flags.is_empty() {
        writeln!(
            out,
            " note: {} given on the server are ignored: the server runs the client's spec ({})",
            local_test_flags.join(" "),
            spec.name()
        )
        .map_err(io_err)?;
    }
    let links = Prepared::new(&spec, &opts.selection).inspect_err(|e| chan.abort(e))?.connect(
        Role::Server,
        &spec,
        &mut chan,
    )?;
    check_sharing(&spec, &links[0].local, &links[0].remote, chan.peer())?;
    let address = chan.peer().to_string();
    let env = links[0].environment(&address);
    table::banner(&mut out, &spec, &env, "server").map_err(io_err)?;
    let clock = Clock::new();
    loop {
        match chan.recv("the next size or the final report")? {
            Message::Start { size } => {
                if !spec.sizes.contains(&size) {
                    let e = Error::Peer(format!("{} asked for size {size}, which is not in its spec", chan.peer()));
                    chan.abort(&e);
                    return Err(e);
                }
                for link in &links {
                    latency::prepare(link, &spec, size);
                }
                chan.send(&Message::Ready { size })?;
                let runs: Vec<SizeRun> = links
                    .iter()
                    .map(|link| SizeRun { link, spec: &spec, size, clock: &clock, timeout_ns: opts.timeout_ns() })
                    .collect();
                let (iterations, data_error, reverse) = match Kernel::of(&spec) {
                    Kernel::Latency => {
                        let o = latency::server(&runs[0], &mut chan)?;
                        (o.iterations, o.data_error, None)
                    }
                    Kernel::RingLatency => {
                        let o = ring::latency_server(&runs, &mut chan)?;
                        (o.iterations, o.data_error, None)
                    }
                    Kernel::RingBandwidth => ring::bandwidth_server(&runs[0], &mut chan)?,
                    Kernel::Bandwidth => bandwidth::server(&runs, &mut chan)?,
                };
                chan.send(&Message::Verdict { size, iterations, data_error: data_error.clone(), reverse })?;
                if let Some(e) = data_error {
                    return Err(Error::Check(format!("corrupted data from {}: {e}", chan.peer())));
                }
            }
            Message::Report(run) => {
                table::header(&mut out, &spec, opts.units, run.results.iter().any(|r| r.cpu_util_pct.is_some()))
                    .map_err(io_err)?;
                for r in &run.results {
                    table::row(&mut out, r, opts.units).map_err(io_err)?;
                }
                table::footer(&mut out).map_err(io_err)?;
                chan.send(&Message::Bye)?;
                let mine = RunResult { environment: env, ..*run };
                if let Some(target) = &opts.json {
                    json::write(&Document::new("server", mine.clone()), target)?;
                }
                return Ok(mine);
            }
            other => {
                return Err(Error::Peer(format!("{} sent {} out of order", chan.peer(), other.kind())));
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
