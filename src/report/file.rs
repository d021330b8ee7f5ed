//! Writing output files whole: a temporary name in the same directory, then a rename, so
//! a reader (CI, a dashboard, the next run's comparison) never sees half a document, and
//! an interrupted write leaves the previous file as it was. Also the early check that an
//! output path can be written, made before a run spends minutes measuring.

use std::path::Path;

use crate::error::{Error, Result};

/// Writes `bytes` to `path` atomically; `what` names the file in the error.
pub fn write(path: &str, bytes: &[u8], what: &str) -> Result<()> {
    let tmp = temp_name(path);
    let done = std::fs::write(&tmp, bytes).and_then(|_| std::fs::rename(&tmp, path));
    done.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::Environment(format!("cannot write {what} to {path}: {e}"))
    })
}

/// Checks that `path` can be written (its directory exists and takes a new file) without
/// touching an existing file there; `flag` names the option in the error (exit 2).
pub fn check_writable(path: &str, flag: &str) -> Result<()> {
    if path == "-" {
        return Ok(());
    }
    if Path::new(path).is_dir() {
        return Err(Error::Usage(format!("{flag} {path}: is a directory; give a file name")));
    }
    let tmp = temp_name(path);
    match std::fs::write(&tmp, b"") {
        Ok(()) => {
            let _ = std::fs::remove_file(&tmp);
            Ok(())
        }
        Err(e) => Err(Error::Usage(format!(
            "{flag} {path}: cannot be written ({e}); give a path in an existing, writable directory"
        ))),
    }
}

/// [`check_writable`] for each output a command was given: (path if given, its flag).
pub fn check_outputs(outputs: &[(&Option<String>, &str)]) -> Result<()> {
    outputs.iter().filter_map(|(p, flag)| p.as_deref().map(|p| (p, *flag))).try_for_each(|(p, f)| check_writable(p, f))
}

fn temp_name(path: &str) -> String {
    let p = Path::new(path);
    let name = p.file_name().map_or("out".into(), |n| n.to_string_lossy().into_owned());
    let tmp = format!(".{name}.tmp{}", std::process::id());
    match p.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => dir.join(tmp).to_string_lossy().into_owned(),
        None => tmp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_replaces_the_file_whole_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.json").to_string_lossy().into_owned();
        write(&path, b"old", "x").unwrap();
        write(&path, b"new", "x").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary left");
    }

    #[test]
    fn unwritable_paths_are_named_with_the_flag_before_anything_runs() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no/such/dir/out.xml").to_string_lossy().into_owned();
        let e = check_writable(&missing, "--junit").unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--junit") && e.to_string().contains("no/such/dir"), "{e}");
        let e = check_writable(&dir.path().to_string_lossy(), "--json").unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
        let ok = dir.path().join("fine.json").to_string_lossy().into_owned();
        check_writable(&ok, "--json").unwrap();
        assert!(!Path::new(&ok).exists(), "the check leaves nothing behind");
        assert!(check_writable("-", "--json").is_ok());
        let e = write(&missing, b"x", "the JUnit report").unwrap_err();
        assert!(e.to_string().contains("the JUnit report"), "{e}");
    }
}
