//! The Dockerfile's build stage has every file the build reads: a `docker build` fails on
//! the first `include_str!` (or module, or target) it did not copy, which no cargo build in
//! the repository sees. The files the build read come from the compiler itself: the
//! dep-info (`.d`) cargo writes beside the rdmabench binary these tests run lists every
//! source and included file of the binary and its library, so nothing here parses Rust.

use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Every file the rdmabench binary's build read, relative to the repository, from the
/// dep-info the compiler wrote for it (`target/PROFILE/rdmabench.d`).
fn files_the_build_read() -> Vec<PathBuf> {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_rdmabench"));
    let dep_info = bin.with_extension("d");
    let text = std::fs::read_to_string(&dep_info)
        .unwrap_or_else(|e| panic!("{}: {e} (cargo writes it with the binary)", dep_info.display()));
    let deps = text.lines().find_map(|line| line.split_once(": ")).map(|(_, deps)| deps).expect("a make rule");
    // Make's syntax: paths are separated by spaces, a space inside one is escaped.
    let root = Path::new(ROOT).canonicalize().unwrap();
    let mut files = Vec::new();
    for path in deps.replace("\\ ", "\u{0}").split_whitespace().map(|p| p.replace('\u{0}', " ")) {
        let path = Path::new(&path);
        let rel = path
            .strip_prefix(&root)
            .or_else(|_| path.strip_prefix(ROOT))
            .unwrap_or_else(|_| panic!("the build read {} outside the repository", path.display()));
        files.push(rel.to_path_buf());
    }
    files
}

/// What the Dockerfile copies before its `cargo build`, as paths relative to the build
/// context (a file or a whole directory each).
fn copied_before_build() -> Vec<PathBuf> {
    let text = std::fs::read_to_string(Path::new(ROOT).join("Dockerfile")).unwrap();
    let mut copied = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with("RUN cargo build") {
            return copied;
        }
        if let Some(args) = line.strip_prefix("COPY ") {
            let words: Vec<&str> = args.split_whitespace().filter(|w| !w.starts_with("--")).collect();
            copied.extend(words[..words.len() - 1].iter().map(|w| PathBuf::from(w.trim_end_matches('/'))));
        }
    }
    panic!("the Dockerfile has no `RUN cargo build`");
}

fn is_copied(file: &Path, copied: &[PathBuf]) -> bool {
    copied.iter().any(|c| file.starts_with(c))
}

#[test]
fn the_build_stage_copies_every_file_the_build_reads() {
    let read = files_the_build_read();
    assert!(read.iter().any(|f| f.starts_with("src")), "the dep-info lists the sources: {read:?}");
    assert!(read.iter().any(|f| f.starts_with("workloads")), "and the workloads compiled in: {read:?}");
    let copied = copied_before_build();
    let missing: Vec<_> = read.iter().filter(|f| !is_copied(f, &copied)).collect();
    assert!(
        missing.is_empty(),
        "the build reads {missing:?}, which the Dockerfile's build stage does not COPY before `cargo build` \
         (it copies {copied:?}): `docker build` would stop there"
    );
    for file in ["Cargo.toml", "Cargo.lock"] {
        assert!(is_copied(Path::new(file), &copied), "{file} is copied: {copied:?}");
    }
}

/// Cargo reads every target the manifest declares before it builds any: a `[[bench]]` or
/// `[[test]]` whose file the build stage lacks stops `cargo build --bin` too.
#[test]
fn the_build_stage_copies_every_target_the_manifest_declares() {
    let manifest: toml::Table =
        std::fs::read_to_string(Path::new(ROOT).join("Cargo.toml")).unwrap().parse().expect("Cargo.toml");
    let copied = copied_before_build();
    let mut declared = 0;
    for (kind, dir) in [("bench", "benches"), ("test", "tests"), ("example", "examples"), ("bin", "src/bin")] {
        for target in manifest.get(kind).and_then(|t| t.as_array()).into_iter().flatten() {
            let name = target["name"].as_str().unwrap();
            let path = match target.get("path").and_then(|p| p.as_str()) {
                Some(p) => PathBuf::from(p),
                // A directory target (tests/lab/main.rs) or a file one (benches/x.rs).
                None if Path::new(ROOT).join(dir).join(name).is_dir() => Path::new(dir).join(name).join("main.rs"),
                None => Path::new(dir).join(format!("{name}.rs")),
            };
            assert!(Path::new(ROOT).join(&path).exists(), "[[{kind}]] {name}: {} exists", path.display());
            assert!(
                is_copied(&path, &copied),
                "[[{kind}]] {name} is at {}, which the Dockerfile's build stage does not COPY (it copies {copied:?})",
                path.display()
            );
            declared += 1;
        }
    }
    assert!(declared >= 4, "the manifest's targets were found: {declared}");
}
