//! Parses the command line, runs the command, maps the outcome to an exit code.

use clap::Parser;

use rdmabench::bench::runner;
use rdmabench::bench::spec::{Measure, Operation};
use rdmabench::cli::{Cli, Command, TestArgs};
use rdmabench::{Result, devices, signals, verbs};

fn run_test(args: &TestArgs, measure: Measure) -> Result<()> {
    let opts = args.options()?;
    match &args.host {
        Some(host) => runner::client(host, &args.spec(Operation::Write, measure), &opts).map(|_| ()),
        None => runner::server(&opts, &args.test_flags_given()).map(|_| ()),
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Devices { json } => {
            let list = verbs::inventory::inventory()?;
            devices::print(&list, json, &mut std::io::stdout().lock())
        }
        Command::WriteLat(args) => run_test(&args, Measure::Latency),
        Command::WriteBw(args) => run_test(&args, Measure::Bandwidth),
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
