//! `rdmabench validate` and `rdmabench nccl-env`: what an RDMA device plugin gave this
//! process, checked against a platform mode (`profiles`), read from sysfs/procfs/dev
//! (`sysfs`) so that fixture trees test every check (`checks`), and the NCCL variables
//! the platform documents compute by hand (`nccl`).

pub mod checks;
#[doc(hidden)]
pub mod fixture;
pub mod nccl;
pub mod profiles;
pub mod sysfs;
#[cfg(test)]
mod tests;

use std::io::Write;

use serde_json::json;

use crate::error::{Error, Result};
use crate::report::junit;
use checks::{Check, Inputs, Outcome, Registration, Status};
use profiles::Profile;
use sysfs::Tree;

/// What `validate` was asked.
pub struct Request {
    pub tree: Tree,
    pub profile: &'static Profile,
    pub expect_nics: Option<u32>,
    pub expect_gpus: Option<u32>,
    pub mr_size: u64,
    pub json: Option<String>,
    pub junit: Option<String>,
}

/// Registers `--mr-size` bytes on the first usable device (one whose verbs node this
/// process has: a pod sees every device in sysfs but only its own nodes): only on the live
/// system.
fn register(tree: &Tree, mr_size: u64) -> Registration {
    if !tree.is_live() {
        return Registration::Skipped("a fixture tree (--sysfs-root/--proc-root): nothing to register on".into());
    }
    let device =
        tree.rdma_devices().into_iter().find(|d| d.uverbs.as_deref().is_some_and(|u| tree.char_device_present(u)));
    let Some(device) = device else {
        return Registration::Skipped("no usable device to register on".into());
    };
    match crate::verbs::context::probe_registration(&device.name, mr_size as usize) {
        Ok(()) => Registration::Registered { device: device.name },
        Err(e) => Registration::Failed(e.message()),
    }
}

/// Runs every check of the request (registering memory on the live system).
pub fn evaluate(req: &Request) -> Outcome {
    let registration = register(&req.tree, req.mr_size);
    checks::run(&Inputs {
        tree: &req.tree,
        profile: req.profile,
        expect_nics: req.expect_nics,
        expect_gpus: req.expect_gpus,
        mr_size: req.mr_size,
        registration,
    })
}

/// Runs the checks, prints one line per check and the verdict, writes the JSON and JUnit
/// documents when asked. Err: the verdict (exit 1), or no RDMA at all (exit 3).
pub fn validate(req: &Request, out: &mut dyn Write) -> Result<()> {
    let outcome = evaluate(req);
    let to_stdout = req.json.as_deref() == Some("-");
    let mut text = Vec::new();
    print_lines(req.profile, &outcome, &mut text)?;
    if to_stdout {
        std::io::stderr().write_all(&text).ok();
    } else {
        out.write_all(&text).map_err(io)?;
    }
    if let Some(path) = &req.json {
        let doc = serde_json::to_string_pretty(&document(req.profile, &outcome)).expect("serialisable") + "\n";
        if to_stdout { out.write_all(doc.as_bytes()).map_err(io)? } else { write_file(path, &doc)? }
    }
    if let Some(path) = &req.junit {
        write_file(path, &junit::render(&format!("validate {}", req.profile.name), &junit_cases(&outcome)))?;
    }
    if outcome.no_rdma {
        return Err(Error::no_rdma(format!("no device under {}", req.tree.sys.join("class/infiniband").display())));
    }
    let failed: Vec<String> = outcome
        .checks
        .iter()
        .filter(|c| c.status == Status::Fail)
        .map(|c| format!("{} ({})", c.id, c.subject))
        .collect();
    if !failed.is_empty() {
        return Err(Error::Check(format!(
            "profile {}: {} check(s) failed: {}",
            req.profile.name,
            failed.len(),
            failed.join(", ")
        )));
    }
    Ok(())
}

fn io(e: std::io::Error) -> Error {
    Error::Environment(format!("cannot write the output: {e}"))
}

fn write_file(path: &str, text: &str) -> Result<()> {
    crate::report::file::write(path, text.as_bytes(), "the report")
}

fn counts(o: &Outcome) -> [(Status, usize); 4] {
    [Status::Pass, Status::Warn, Status::Fail, Status::Skip]
        .map(|s| (s, o.checks.iter().filter(|c| c.status == s).count()))
}

pub fn verdict(o: &Outcome) -> &'static str {
    if o.no_rdma || o.worst() == Status::Fail { "FAIL" } else { "PASS" }
}

pub fn print_lines(profile: &Profile, o: &Outcome, out: &mut dyn Write) -> Result<()> {
    let w = |out: &mut dyn Write, s: String| writeln!(out, "{s}").map_err(io);
    w(out, format!("rdmabench validate --profile {} (rules: {})", profile.name, profile.source))?;
    for c in &o.checks {
        w(
            out,
            format!(
                "{:<5} {:<17} {:<12} seen: {}; expected: {}",
                c.status.label().to_uppercase(),
                c.id,
                c.subject,
                c.seen,
                c.expected
            ),
        )?;
        if let Some(fix) = &c.fix {
            w(out, format!("{:<36} fix: {fix}", ""))?;
        }
    }
    let tally = counts(o).iter().map(|(s, n)| format!("{n} {}", s.label())).collect::<Vec<_>>().join(", ");
    let index = o.gid_index.map_or(String::new(), |i| format!("; GID index {i} on every device"));
    w(out, format!("verdict: {} ({tally}){index}", verdict(o)))
}

fn document(profile: &Profile, o: &Outcome) -> serde_json::Value {
    let tally: serde_json::Map<String, serde_json::Value> =
        counts(o).iter().map(|(s, n)| (s.label().to_string(), json!(n))).collect();
    json!({
        "schema": "rdmabench/validate",
        "version": 1,
        "tool_version": env!("CARGO_PKG_VERSION"),
        "profile": profile,
        "verdict": verdict(o).to_lowercase(),
        "counts": tally,
        "gid_index": o.gid_index,
        "checks": o.checks,
    })
}

fn junit_cases(o: &Outcome) -> Vec<junit::Case> {
    o.checks.iter().map(junit_case).collect()
}

fn junit_case(c: &Check) -> junit::Case {
    let detail = format!(
        "seen: {}; expected: {}{}",
        c.seen,
        c.expected,
        c.fix.as_ref().map_or(String::new(), |f| format!("; fix: {f}"))
    );
    junit::Case {
        name: format!("{} {}", c.id, c.subject),
        classname: "validate".into(),
        outcome: match c.status {
            Status::Fail => junit::Outcome::Failed(detail.clone()),
            Status::Skip => junit::Outcome::Skipped(c.seen.clone()),
            Status::Pass | Status::Warn => junit::Outcome::Passed,
        },
        output: if c.status == Status::Warn { format!("WARNING {detail}") } else { detail },
        seconds: 0.0,
    }
}

/// `value` as one shell word that `eval` cannot run: as it is when it is plain (device
/// and interface lists), else single-quoted. A netdev may be called `$(x)` (Linux refuses
/// only `/`, `:` and spaces in one), and `eval "$(rdmabench nccl-env)"` must not run it.
fn shell_word(value: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ',' | ':' | '/' | '=' | '+' | '@');
    if !value.is_empty() && value.chars().all(plain) {
        return value.to_string();
    }
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// `nccl-env`: the variables as `export` lines, `NAME=value` lines or JSON.
pub fn nccl_env(tree: &Tree, format: NcclFormat, out: &mut dyn Write) -> Result<()> {
    let env = nccl::compute(tree)?;
    if !env.skipped.is_empty() {
        // stderr: stdout stays eval-able.
        eprintln!(
            "rdmabench: nccl-env: skipped {} (in sysfs, but this process has no /dev/infiniband verbs node for it)",
            crate::names::escape(&env.skipped.join(", "))
        );
    }
    let text = match format {
        NcclFormat::Export => env.vars().iter().map(|(k, v)| format!("export {k}={}\n", shell_word(v))).collect(),
        NcclFormat::Env => env.vars().iter().map(|(k, v)| format!("{k}={v}\n")).collect(),
        NcclFormat::Json => {
            serde_json::to_string_pretty(&json!({
                "NCCL_IB_HCA": env.hca.join(","),
                "NCCL_IB_GID_INDEX": env.gid_index.to_string(),
                "hca": env.hca,
                "gid_index": env.gid_index,
                "rate_gbps": env.rate_gbps,
                "skipped": env.skipped,
            }))
            .expect("serialisable")
                + "\n"
        }
    };
    out.write_all(text.as_bytes()).map_err(io)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NcclFormat {
    /// `export NAME=value` lines, for `eval "$(rdmabench nccl-env)"`.
    Export,
    /// `NAME=value` lines, for env files.
    Env,
    Json,
}
