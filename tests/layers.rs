//! The layering, enforced: every module imports only layers below its own (or modules of its
//! own layer, never in a circle). The table is the one in `src/lib.rs`'s docs; this test
//! reads it, so the table and the code cannot drift apart.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// `module -> layer rank` from the table in lib.rs (first row = top = highest rank).
fn layers() -> BTreeMap<String, usize> {
    let lib = std::fs::read_to_string(format!("{ROOT}/src/lib.rs")).unwrap();
    let rows: Vec<Vec<String>> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("//! | "))
        .map(|r| r.split('|').map(|c| c.trim().to_string()).collect::<Vec<_>>())
        .filter(|c| c.len() >= 2 && c[0] != "layer" && !c[0].starts_with("---"))
        .collect();
    assert!(rows.len() >= 5, "the layer table in src/lib.rs: {rows:?}");
    let n = rows.len();
    let mut map = BTreeMap::new();
    for (i, row) in rows.iter().enumerate() {
        for m in row[1].split(',') {
            let m = m.trim().trim_matches('`');
            assert!(map.insert(m.to_string(), n - i).is_none(), "{m} is in two layers");
        }
    }
    map
}

/// Every .rs file under src with the top-level module it belongs to.
fn files(dir: &Path, out: &mut Vec<(String, std::path::PathBuf)>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let rel = p.strip_prefix(format!("{ROOT}/src")).unwrap();
            let first = rel.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
            out.push((first.trim_end_matches(".rs").to_string(), p));
        }
    }
}

/// The crate's top-level modules that `text` names as `crate::name` (after a word boundary).
fn crate_refs(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("crate::") {
        if text[..i].chars().last().is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // e.g. `rdmabench_crate::`, not ours
        }
        let rest = &text[i + "crate::".len()..];
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if !name.is_empty() {
            out.insert(name);
        }
    }
    // The binary names the library by its crate name.
    for (i, _) in text.match_indices("rdmabench::") {
        let rest = &text[i + "rdmabench::".len()..];
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if !name.is_empty() {
            out.insert(name);
        }
    }
    if let Some(i) = text.find("use rdmabench::{") {
        let list = &text[i + "use rdmabench::{".len()..];
        for name in list[..list.find('}').unwrap()].split(',').map(str::trim).filter(|n| !n.is_empty()) {
            out.insert(name.split("::").next().unwrap().to_string());
        }
    }
    out
}

/// `module -> modules it imports`, with the files that do it.
fn imports() -> BTreeMap<(String, String), BTreeSet<String>> {
    let mut all = Vec::new();
    files(Path::new(&format!("{ROOT}/src")), &mut all);
    let mut edges = BTreeMap::new();
    for (module, path) in all {
        if module == "lib" {
            continue;
        }
        // Code only: a comment may name any module.
        let text: String = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .map(|l| l.to_string() + "\n")
            .collect();
        for target in crate_refs(&text) {
            // lib.rs re-exports the error types at the crate root.
            let target = if target == "Error" || target == "Result" { "error".to_string() } else { target };
            if target == module {
                continue;
            }
            let rel = path.strip_prefix(ROOT).unwrap().display().to_string();
            edges.entry((module.clone(), target)).or_insert_with(BTreeSet::new).insert(rel);
        }
    }
    edges
}

#[test]
fn every_import_points_down() {
    let layers = layers();
    let mut upward = Vec::new();
    for ((from, to), where_) in imports() {
        let (Some(&a), Some(&b)) = (layers.get(&from), layers.get(&to)) else {
            let missing = if layers.contains_key(&from) { &to } else { &from };
            upward.push(format!("module `{missing}` is in no layer of the table in src/lib.rs ({from} -> {to})"));
            continue;
        };
        if b > a {
            upward.push(format!("{from} -> {to} ({})", where_.into_iter().collect::<Vec<_>>().join(", ")));
        }
    }
    assert!(upward.is_empty(), "{} upward import(s):\n{}", upward.len(), upward.join("\n"));
}

#[test]
fn no_import_circle_spans_two_modules() {
    let edges: BTreeSet<(String, String)> = imports().into_keys().collect();
    let mut circles = Vec::new();
    for (a, b) in &edges {
        // a -> b and a path b -> ... -> a
        let mut seen = BTreeSet::new();
        let mut stack = vec![b.clone()];
        while let Some(m) = stack.pop() {
            if &m == a {
                circles.push(format!("{a} -> {b} -> ... -> {a}"));
                break;
            }
            if seen.insert(m.clone()) {
                stack.extend(edges.iter().filter(|(x, _)| *x == m).map(|(_, y)| y.clone()));
            }
        }
    }
    assert!(circles.is_empty(), "{} import circle(s):\n{}", circles.len(), circles.join("\n"));
}
