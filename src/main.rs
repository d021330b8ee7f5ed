//! Parses the command line, runs the command, maps the outcome to an exit code.

use clap::Parser;

use rdmabench::bench::runner;
use rdmabench::bench::spec::{Measure, Operation};
use rdmabench::cli::{Cli, Command, TestArgs};
use rdmabench::{Result, devices, signals, verbs};

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
    let Command::Devices { json } = cli.command else { unreachable!("every other command is a test") };
    let list = verbs::inventory::inventory()?;
    devices::print(&list, json, &mut std::io::stdout().lock())
}

fn main() {
    let cli = Cli::parse();
    signals::install();
    if let Err(e) = run(cli) {
        eprintln!("rdmabench: error: {e}");
        std::process::exit(e.exit_code());
    }
}
