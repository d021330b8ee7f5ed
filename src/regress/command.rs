//! `rdmabench compare BASELINE CURRENT`: reads both documents, prints the table, writes
//! JSON and JUnit when asked; Err(Check) on a regression (exit 1).

use std::io::Write;

use super::{compare_counting, junit_cases, print};
use crate::error::{Error, Result};
use crate::report::junit;
use crate::report::run as doc;

/// What to compare and where to write the outcome.
#[derive(Debug, Clone)]
pub struct Request {
    pub baseline: String,
    pub current: String,
    /// Default tolerance, percent (per-metric ones recorded from the workload win).
    pub tolerance: f64,
    pub allow_env_mismatch: bool,
    /// Compare the port counter deltas as well (left out by default: they count events,
    /// not speed, and a baseline from another day's fabric differs in them).
    pub counters: bool,
    /// JSON to this file, or to stdout with `-` (the table then goes to stderr).
    pub json: Option<String>,
    pub junit: Option<String>,
}

pub fn compare(args: &Request, out: &mut dyn Write) -> Result<()> {
    crate::report::file::check_outputs(&[(&args.json, "--json"), (&args.junit, "--junit")])?;
    let base = doc::read(&args.baseline)?;
    let cur = doc::read(&args.current)?;
    let c = compare_counting(&base, &cur, args.tolerance, args.allow_env_mismatch, args.counters)?;
    let to_stdout = args.json.as_deref() == Some("-");
    if to_stdout {
        print(&c, &mut std::io::stderr())?;
    } else {
        print(&c, out)?;
    }
    if let Some(target) = &args.json {
        let text = serde_json::to_string_pretty(&c).expect("serialisable") + "\n";
        if to_stdout {
            out.write_all(text.as_bytes()).map_err(|e| Error::Environment(format!("cannot write: {e}")))?;
        } else {
            crate::report::file::write(target, text.as_bytes(), "the comparison")?;
        }
    }
    if let Some(path) = &args.junit {
        crate::report::file::write(
            path,
            junit::render("rdmabench compare", &junit_cases(&c)).as_bytes(),
            "the JUnit report",
        )?;
    }
    match c.failure() {
        None => Ok(()),
        Some(why) => Err(Error::Check(format!("{} against {}: {why}", args.current, args.baseline))),
    }
}
