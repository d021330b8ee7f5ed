//! Parses the command line, runs the command, maps the outcome to an exit code.

use clap::Parser;

use rdmabench::bench::runner;
use rdmabench::cli::{Cli, Command, DocsCommand, HistoryCommand, K8sCommand, RunArgs, TestArgs, docs};
use rdmabench::spec::{Measure, Operation};
use rdmabench::{Result, fleet, k8s, regress, report, signals, validate, verbs, workload};

fn run_test(operation: Operation, measure: Measure, args: &TestArgs) -> Result<()> {
    let opts = args.options()?;
    match &args.host {
        Some(host) => runner::client(host, &args.spec(operation, measure), &opts).map(|_| ()),
        None => runner::server(&opts, &args.test_flags_given()).map(|_| ()),
    }
}

fn write_all(out: &mut dyn std::io::Write, bytes: &[u8]) -> Result<()> {
    out.write_all(bytes).map_err(|e| rdmabench::Error::Environment(format!("cannot write: {e}")))
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
        session: opts,
        json: args.json.clone(),
        junit: args.junit.clone(),
        baseline: args.baseline.clone(),
        tolerance_pct: args.tolerance,
        allow_env_mismatch: args.allow_env_mismatch,
    };
    workload::run::client(&plan, out).map(drop)
}

/// The fleet workload at `path`, or the shipped one, with `--measure`s and `--threshold`s
/// over it.
fn fleet_file(path: Option<&str>, over: &fleet::config::Overrides) -> Result<fleet::config::FleetFile> {
    fleet::config::FleetFile::load_with(path, over).map_err(rdmabench::Error::Usage)
}

fn k8s_command(command: K8sCommand, out: &mut dyn std::io::Write) -> Result<()> {
    let write = |out: &mut dyn std::io::Write, text: &str| write_all(out, text.as_bytes());
    match command {
        K8sCommand::Render(args) => {
            let (params, warnings) = k8s::plan(&args.request())?;
            for w in warnings {
                eprintln!("rdmabench: warning: {w}");
            }
            write(out, &k8s::manifest::render(&params))
        }
        K8sCommand::Role { index, pods, topology } => {
            let role = k8s::fleet::role(index, pods, topology).map_err(rdmabench::Error::Usage)?;
            write(out, &format!("{}\n", k8s::fleet::role_line(&role)))
        }
        K8sCommand::Result { pod, peer, exit, run } => {
            let text = run
                .and_then(|p| std::fs::read_to_string(&p).ok().map(|t| (p, t)))
                .filter(|(_, t)| !t.trim().is_empty());
            let run = text.and_then(|(p, t)| {
                serde_json::from_str(&t)
                    .inspect_err(|e| {
                        eprintln!("rdmabench: {} is no run document ({e}); the result line has none", p.display())
                    })
                    .ok()
            });
            write(out, &format!("{}\n", k8s::summarize::result_line(pod, peer, exit, run)))
        }
        K8sCommand::RenderVariants { dir } => {
            for (path, request) in k8s::every_fleet_variant(8) {
                let (params, _) = k8s::plan(&request)?;
                let target = dir.join(&path);
                std::fs::create_dir_all(&dir)
                    .and_then(|_| std::fs::write(&target, k8s::manifest::render(&params)))
                    .map_err(|e| rdmabench::Error::Environment(format!("cannot write {}: {e}", target.display())))?;
                write(out, &format!("{}\n", target.display()))?;
            }
            Ok(())
        }
        K8sCommand::RenderAll { dir } => {
            for (path, request) in k8s::committed() {
                let (params, _) = k8s::plan(&request)?;
                let target = dir.join(&path);
                std::fs::create_dir_all(target.parent().expect("a file in a folder"))
                    .and_then(|_| std::fs::write(&target, k8s::manifest::render(&params)))
                    .map_err(|e| rdmabench::Error::Environment(format!("cannot write {}: {e}", target.display())))?;
                write(out, &format!("{}\n", target.display()))?;
            }
            let readme = dir.join("README.md");
            let mut text = std::fs::read_to_string(&readme).unwrap_or_default();
            for (begin, end, body) in k8s::readme_sections() {
                match report::markers::replace_between(&text, begin, end, &body) {
                    Some(t) => text = t,
                    None => write(out, &format!("{}: no {begin:?}..{end:?} markers, not written\n", readme.display()))?,
                }
            }
            std::fs::write(&readme, text)
                .map_err(|e| rdmabench::Error::Environment(format!("cannot write {}: {e}", readme.display())))?;
            write(out, &format!("{} (tables)\n", readme.display()))?;
            Ok(())
        }
    }
}

fn history_command(command: HistoryCommand, out: &mut dyn std::io::Write) -> Result<()> {
    use rdmabench::history::command as h;
    match command {
        HistoryCommand::Add { run, store, label, setup } => h::add(&store.store, &run, &label, setup.as_deref(), out),
        HistoryCommand::List { store, filter } => h::list(&store.store, &filter.filter(), out),
        HistoryCommand::Show { store, filter } => h::show(&store.store, &filter.filter(), out),
        HistoryCommand::Export { store, filter, csv: _, output: None } => {
            h::export_csv(&store.store, &filter.filter(), out)
        }
        HistoryCommand::Export { store, filter, csv: _, output: Some(path) } => {
            let mut text = Vec::new();
            h::export_csv(&store.store, &filter.filter(), &mut text)?;
            report::file::write(&path, &text, "the CSV")
        }
        HistoryCommand::Check { series, json } => h::check(
            &h::CheckRequest {
                store: series.store.store,
                filter: series.filter.filter(),
                judge: series.judge.judge(),
                json,
            },
            out,
        ),
        HistoryCommand::Plot { series, output } => {
            h::plot(&series.store.store, &series.filter.filter(), &series.judge.judge(), &output)
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    if let Some((operation, measure, args)) = cli.command.test() {
        return run_test(operation, measure, args);
    }
    // Not locked for the whole command: a test's tables are printed from a thread of
    // their own (bench::runner), which would wait forever on a lock held here.
    let out = &mut std::io::stdout();
    match cli.command {
        Command::Devices { json } => report::devices::print(&verbs::inventory::inventory()?, json, out),
        Command::Validate(args) => validate::validate(&args.request(), out),
        Command::NcclEnv(args) => validate::nccl_env(&args.tree.tree(), args.format, out),
        Command::Run(args) if args.json.as_deref() == Some("-") => run_workload(&args, &mut std::io::stderr()),
        Command::Run(args) => run_workload(&args, out),
        Command::Compare(args) => regress::command::compare(&args.request(), out),
        Command::Plot(args) => report::plot::command(&args.request()),
        Command::History { command } => history_command(command, out),
        Command::K8s { command } => k8s_command(command, out),
        Command::Summarize(a) if a.fleet.is_some() => {
            let over = fleet::config::Overrides { thresholds: a.thresholds.clone(), ..Default::default() };
            let thresholds = fleet_file(a.workload.as_deref(), &over)?.thresholds;
            let plan = fleet::schedule::Plan {
                nodes: a.pods.expect("clap requires --pods with --fleet"),
                directions: a.directions,
                max_pairs_per_round: None,
            };
            k8s::summarize::all_pairs(&a.logs, &plan, &thresholds, a.out.as_deref(), a.json, out)
        }
        Command::Summarize(a) => k8s::summarize::command(&a.logs, a.pods.map(|n| (n, a.topology)), a.json, out),
        Command::Fleet(a) => {
            let over = fleet::config::Overrides { measure: a.measure.clone(), thresholds: a.thresholds.clone() };
            let file = fleet_file(a.workload.as_deref(), &over)?;
            let cfg = fleet::node::NodeConfig {
                index: a.index,
                plan: fleet::schedule::Plan {
                    nodes: a.pods,
                    directions: a.directions,
                    max_pairs_per_round: a.max_pairs_per_round,
                },
                peers: a.peer_addresses()?,
                port: a.conn.port,
                measure: file.measure,
                thresholds: file.thresholds,
                join_timeout: std::time::Duration::from_secs_f64(a.conn.connect_timeout.max(1.0)),
                measuring: fleet::node::Measuring::Verbs,
            };
            let ended = fleet::command(&cfg, &a.conn.run_options(true)?, out);
            if let Some(path) = &a.termination_log {
                let line = fleet::ending_line(a.index, a.pods, &ended);
                // The fleet's outcome stands whether or not the message could be written.
                if let Err(e) = std::fs::write(path, format!("{line}\n")) {
                    eprintln!("rdmabench: cannot write the termination message to {}: {e}", path.display());
                }
            }
            ended
        }
        Command::Completions { shell } => write_all(out, &docs::completions(shell)),
        Command::Docs { what: DocsCommand::Man } => write_all(out, &docs::man_page()),
        Command::Docs { what: DocsCommand::Readme { file } } => {
            let path = file.display().to_string();
            let text = std::fs::read_to_string(&file)
                .map_err(|e| rdmabench::Error::Environment(format!("cannot read {path}: {e}")))?;
            let fresh = docs::with_generated_sections(&text).ok_or_else(|| {
                rdmabench::Error::Usage(format!(
                    "{path} has no generated section: neither `{}` ... `{}` nor `{}` ... `{}` markers",
                    docs::BEGIN,
                    docs::END,
                    docs::KEYS_BEGIN,
                    docs::KEYS_END
                ))
            })?;
            std::fs::write(&file, fresh).map_err(|e| rdmabench::Error::Environment(format!("cannot write {path}: {e}")))
        }
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
