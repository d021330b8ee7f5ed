//! Parses the command line, runs the command, maps the outcome to an exit code.

use clap::Parser;

use rdmabench::bench::runner;
use rdmabench::bench::spec::{Measure, Operation};
use rdmabench::cli::{Cli, Command, TestArgs};
use rdmabench::{Result, devices, signals, validate, verbs};

fn run_test(operation: Operation, measure: Measure, args: &TestArgs) -> Result<()> {
    let opts = args.options()?;
    match &args.host {
        Some(host) => runner::client(host, &args.spec(operation, measure), &opts).map(|_| ()),
        None => runner::server(&opts, &args.test_flags_given()).map(|_| ()),
    }
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
