//! The Dockerfile's build stage has every file the build reads: a `docker build` fails on
//! the first `include_str!` (or module, or target) it did not copy, which no cargo build in
//! the repository sees. The files the build read come from the compiler itself: the
//! dep-info (`.d`) rustc writes for every compilation of the crate (its library, its
//! binary, their test builds) lists every source and included file, so nothing here
//! parses Rust.

use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Every file the crate's compilations read, relative to the repository: the union of the
/// dependencies in rustc's dep-info files of crate `rdmabench` beside the binary these
/// tests run (`target/PROFILE/deps/rdmabench-HASH.d`). Those of earlier builds may list a
/// file since removed: only files that exist count.
fn files_the_build_read() -> Vec<PathBuf> {
    let deps = PathBuf::from(env!("CARGO_BIN_EXE_rdmabench")).parent().unwrap().join("deps");
    let root = Path::new(ROOT).canonicalize().unwrap();
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&deps).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if !(name.starts_with("rdmabench-") && name.ends_with(".d")) {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap();
        // The first rule: `OUTPUT: DEP DEP ...`, in make's syntax (a space in a path is
        // escaped); paths relative to the package's root or absolute.
        let Some((_, line)) = text.lines().find_map(|l| l.split_once(": ")) else { continue };
        for dep in line.replace("\\ ", "\u{0}").split_whitespace().map(|p| p.replace('\u{0}', " ")) {
            let path = root.join(&dep);
            let Ok(path) = path.canonicalize() else { continue };
            let rel = path
                .strip_prefix(&root)
                .unwrap_or_else(|_| panic!("{}: the build read {} outside the repository", name, path.display()));
            if !files.iter().any(|f| f == rel) {
                files.push(rel.to_path_buf());
            }
        }
    }
    assert!(!files.is_empty(), "no dep-info of crate rdmabench in {}", deps.display());
    files.sort();
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
