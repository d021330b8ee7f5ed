//! The Dockerfile's build stage has every file the build reads: a `docker build` fails on
//! the first `include_str!` of a directory it did not copy, which no cargo build here sees.

use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The top directories (relative to the repository) that `src/` includes at compile time.
fn included_dirs() -> Vec<String> {
    let mut dirs = Vec::new();
    let mut stack = vec![Path::new(ROOT).join("src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            for (at, _) in text.match_indices("include_str!(\"").chain(text.match_indices("include_bytes!(\"")) {
                let rest = &text[at..];
                let quoted = &rest[rest.find('"').unwrap() + 1..];
                let target = &quoted[..quoted.find('"').unwrap()];
                // Relative to the including file: resolve, then name its top directory.
                let resolved = path.parent().unwrap().join(target);
                let resolved = resolved.canonicalize().unwrap_or_else(|e| panic!("{}: {target}: {e}", path.display()));
                let rel = resolved.strip_prefix(Path::new(ROOT).canonicalize().unwrap()).unwrap();
                let top = rel.components().next().unwrap().as_os_str().to_string_lossy().to_string();
                if !dirs.contains(&top) {
                    dirs.push(top);
                }
            }
        }
    }
    dirs.sort();
    dirs
}

/// What the Dockerfile copies before its `cargo build`.
fn copied_before_build() -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(ROOT).join("Dockerfile")).unwrap();
    let mut copied = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with("RUN cargo build") {
            return copied;
        }
        if let Some(args) = line.strip_prefix("COPY ") {
            let words: Vec<&str> = args.split_whitespace().filter(|w| !w.starts_with("--")).collect();
            copied.extend(words[..words.len() - 1].iter().map(|w| w.trim_end_matches('/').to_string()));
        }
    }
    panic!("the Dockerfile has no `RUN cargo build`");
}

#[test]
fn the_build_stage_copies_every_directory_the_source_includes() {
    let included = included_dirs();
    assert!(included.contains(&"workloads".to_string()), "the shipped workloads are included: {included:?}");
    let copied = copied_before_build();
    for dir in &included {
        assert!(
            copied.contains(dir),
            "src/ includes files from {dir}/, which the Dockerfile's build stage does not COPY before `cargo build` (it copies {copied:?})"
        );
    }
    for file in ["Cargo.toml", "Cargo.lock", "src"] {
        assert!(copied.contains(&file.to_string()), "{file} is copied: {copied:?}");
    }
}
