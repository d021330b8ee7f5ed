//! Parses the command line, runs the command, maps the outcome to an exit code.

use clap::Parser;

use rdmabench::bench::runner;
use rdmabench::bench::spec::{Measure, Operation};
use rdmabench::cli::{Cli, Command, RunArgs, TestArgs};
use rdmabench::{Result, devices, regress, report, signals, validate, verbs, workload};

fn run_test(operation: Operation, measure: Measure, args: &TestArgs) -> Result<()> {
    let opts = args.options()?;
    match &args.host {
        Some(host) => runner::client(host, &args.spec(operation, measure), &opts).map(|_| ()),
        None => runner::server(&opts, &args.test_flags_given()).map(|_| ()),
    }
}

fn run_workload(args: &RunArgs, out: &mut dyn std::io::Write) -> Result<()> {
    let opts = args.options()?;
    if args.serve {
        return runner::serve_workload(&opts);
    }
    let path = args.workload.as_deref().expect("clap requires it without --serve");
    let workload = workload::file::load(path, &args.params.iter().cloned().collect())?;
    let plan = workload::run::Plan {
        workload,
        peer: args.peer.clone().expect("clap requires it without --serve"),
        selection: opts.selection,
        tcp_port: opts.tcp_port,
        connect_timeout: opts.connect_timeout,
        timeout: opts.timeout,
        units: opts.units,
        json: args.json.clone(),
        junit: args.junit.clone(),
        baseline: args.baseline.clone(),
        tolerance_pct: args.tolerance,
        allow_env_mismatch: args.allow_env_mismatch,
    };
    workload::run::client(&plan, out).map(drop)
}

fn run(cli: Cli) -> Result<()> {
    if let Some((operation, measure, args)) = cli.command.test() {
        return run_test(operation, measure, args);
    }
    let out = &mut std::io::stdout().lock();
    match cli.command {
        Command::Devices { json } => devices::print(&verbs::inventory::inventory()?, json, out),
        Command::Validate(args) => validate::validate(&args.request(), out),
        Command::NcclEnv(args) => validate::nccl_env(&args.tree.tree(), args.format, out),
        Command::Run(args) if args.json.as_deref() == Some("-") => run_workload(&args, &mut std::io::stderr()),
        Command::Run(args) => run_workload(&args, out),
        Command::Compare(args) => regress::command::compare(&args, out),
        Command::Plot(args) => report::plot::command(&args),
        _ => unreachable!("every other command is a test"),
    }
}

fn main() {
    let cli = Cli::parse();
    signals::install();
    if let Err(e) = run(cli) {
        eprintln!("rdmabench: error: {e}");
        std::process::exit(e.exit_code());
    }
}
