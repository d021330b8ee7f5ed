//! Run documents as `compare` reads them (a baseline kept from another day, another host or
//! another version), and the comparison drawn from them.

use std::path::Path;

use rdmabench::regress;
use rdmabench::report::run as doc;

use super::harness::*;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn baseline() -> String {
    format!("{ROOT}/results/baseline-rxe.json")
}

fn seeds() -> Vec<Vec<u8>> {
    vec![std::fs::read(baseline()).unwrap()]
}

/// Reads `bytes` as the current run and compares it with the baseline, and with itself.
fn compare(path: &Path, bytes: &[u8]) -> Result<(), String> {
    std::fs::write(path, bytes).unwrap();
    let base = doc::read(&baseline()).unwrap();
    let cur = doc::read(path.to_str().unwrap()).map_err(|e| e.message())?;
    for (a, b) in [(&base, &cur), (&cur, &base), (&cur, &cur)] {
        for (env, counters) in [(true, true), (false, false)] {
            match regress::compare_counting(a, b, 5.0, env, counters) {
                Ok(c) => {
                    let mut sink = Vec::new();
                    regress::print(&c, &mut sink).map_err(|e| e.message())?;
                    let _ = (regress::junit_cases(&c), serde_json::to_string(&c).unwrap(), c.failure());
                }
                Err(e) => return Err(e.message()),
            }
        }
    }
    Ok(())
}

/// Found by the million-case run: a device name with a bidi override reached compare's
/// error as it was.
#[test]
fn a_baseline_s_text_reaches_errors_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("current.json");
    let text = std::fs::read_to_string(baseline()).unwrap();
    let device = text.find("\"device\": \"").expect("the baseline names its device");
    let odd =
        format!("{}\"device\": \"\u{202e}\\u001b[31m{}", &text[..device], &text[device + "\"device\": \"".len()..]);
    let why = compare(&path, odd.as_bytes()).unwrap_err();
    assert!(why.contains("different environments") && why.contains("\\u{202e}") && !why.contains('\u{1b}'), "{why}");
    // And a schema name of 140,000 bytes was quoted whole.
    let odd = text.replacen("\"rdmabench/run\"", &format!("\"{}\"", "[".repeat(140_000)), 1);
    let why = compare(&path, odd.as_bytes()).unwrap_err();
    assert!(why.len() <= 4096 && why.ends_with("bytes cut]"), "{}", &why[..200]);
}

#[test]
fn mutated_run_documents_compare_or_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("current.json");
    assert_eq!(compare(&path, &seeds()[0]), Ok(()), "the baseline compares with itself");
    property("compare run documents", mutated(seeds(), 6), |bytes| (bytes.len(), compare(&path, bytes)));
}
