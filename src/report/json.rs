//! The JSON document: one per run, every size of a sweep in `results`, versioned by
//! `schema_version`. The schema is results/schema/result-v1.schema.json; a test keeps the
//! two in step.

use std::io::Write;

use serde::{Deserialize, Serialize};

use super::RunResult;
use crate::error::{Error, Result};

pub const SCHEMA: &str = "rdmabench/result";
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Document {
    pub schema: String,
    pub schema_version: u32,
    /// "client" or "server": whose view the environment is.
    pub role: String,
    /// Seconds since the Unix epoch when the run ended.
    pub finished_unix_s: f64,
    #[serde(flatten)]
    pub run: RunResult,
}

impl Document {
    pub fn new(role: &str, run: RunResult) -> Document {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        Document {
            schema: SCHEMA.into(),
            schema_version: SCHEMA_VERSION,
            role: role.into(),
            finished_unix_s: now,
            run,
        }
    }
}

/// Writes the document to `target`: a path, or `-` for stdout. A file is written to a
/// temporary name and renamed, so a reader never sees half a document.
pub fn write(doc: &Document, target: &str) -> Result<()> {
    let text = serde_json::to_string_pretty(doc)
        .map_err(|e| Error::Check(format!("cannot encode JSON: {e}")))?;
    if target == "-" {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{text}")
            .map_err(|e| Error::Environment(format!("cannot write JSON to stdout: {e}")))?;
        return Ok(());
    }
    let tmp = format!("{target}.tmp{}", std::process::id());
    std::fs::write(&tmp, text + "\n")
        .and_then(|_| std::fs::rename(&tmp, target))
        .map_err(|e| Error::Environment(format!("cannot write the JSON document to {target}: {e}")))
}
