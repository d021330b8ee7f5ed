//! The documentation cannot go stale: every `rdmabench` command shown in a shell block of
//! the README, the guides (`docs/`) and `k8s-jobs/README.md` parses against the real CLI,
//! every long flag the documents name is a flag of rdmabench (or of the one other tool the
//! line runs), every workload key they list is one the workload parser takes, and every
//! guide the README links to exists.

use std::collections::BTreeSet;

use clap::{CommandFactory, Parser};
use rdmabench::cli::Cli;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The documents a newcomer reads.
fn documents() -> Vec<(String, String)> {
    let mut paths = vec!["README.md".to_string(), "k8s-jobs/README.md".to_string()];
    let mut guides: Vec<String> = std::fs::read_dir(format!("{ROOT}/docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| format!("docs/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    guides.sort();
    paths.extend(guides);
    paths
        .into_iter()
        .map(|p| (std::fs::read_to_string(format!("{ROOT}/{p}")).unwrap(), p))
        .map(|(t, p)| (p, t))
        .collect()
}

/// The lines of every ```sh block, continuation lines joined, comments dropped.
fn shell_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (mut inside, mut pending) = (false, String::new());
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("```") {
            inside = t == "```sh";
            continue;
        }
        if !inside {
            continue;
        }
        let code = strip_comment(line);
        if let Some(head) = code.trim_end().strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(&code);
        out.push(std::mem::take(&mut pending));
    }
    out
}

/// A line without its `# comment` (a `#` outside quotes, after a blank or at the start).
fn strip_comment(line: &str) -> String {
    let (mut quote, mut prev) = (None, ' ');
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), _) if c == q => quote = None,
            (None, '#') if prev.is_whitespace() => return line[..i].to_string(),
            _ => {}
        }
        prev = c;
    }
    line.to_string()
}

/// Shell words, quotes removed; `|`, `&&`, `;`, `>` and `$(` end a command.
fn commands(line: &str) -> Vec<Vec<String>> {
    let (mut all, mut cur, mut word, mut quote, mut in_word) = (Vec::new(), Vec::new(), String::new(), None, false);
    let mut chars = line.chars().peekable();
    let end_word = |cur: &mut Vec<String>, word: &mut String, in_word: &mut bool| {
        if *in_word {
            cur.push(std::mem::take(word));
            *in_word = false;
        }
    };
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), _) if c == q => quote = None,
            (Some(_), _) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '|' | ';' | '&' | '>' | '<' | '(' | ')') => {
                end_word(&mut cur, &mut word, &mut in_word);
                if !cur.is_empty() {
                    all.push(std::mem::take(&mut cur));
                }
                if c == '>' {
                    // The redirection's target is no argument.
                    while chars.peek().is_some_and(|c| c.is_whitespace()) {
                        chars.next();
                    }
                    while chars.peek().is_some_and(|c| !c.is_whitespace()) {
                        chars.next();
                    }
                }
            }
            (None, c) if c.is_whitespace() => end_word(&mut cur, &mut word, &mut in_word),
            (None, '$') if chars.peek() == Some(&'(') => {
                end_word(&mut cur, &mut word, &mut in_word);
                if !cur.is_empty() {
                    all.push(std::mem::take(&mut cur));
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    end_word(&mut cur, &mut word, &mut in_word);
    if !cur.is_empty() {
        all.push(cur);
    }
    all
}

fn is_rdmabench(program: &str) -> bool {
    program == "rdmabench" || program.ends_with("/rdmabench")
}

#[test]
fn every_rdmabench_command_shown_parses() {
    let mut checked = 0;
    let mut bad = Vec::new();
    for (path, text) in documents() {
        for line in shell_lines(&text) {
            // rdmabench itself, or run by another program (`kubectl exec POD -- rdmabench ...`).
            let runs = commands(&line).into_iter().filter_map(|c| {
                let at = c.iter().position(|w| is_rdmabench(w))?;
                (at == 0 || c[at - 1] == "--").then(|| c[at..].to_vec())
            });
            for cmd in runs {
                checked += 1;
                let Err(e) = Cli::try_parse_from(&cmd) else { continue };
                if !matches!(e.kind(), clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion) {
                    let first = e.to_string().lines().next().unwrap_or("").to_string();
                    bad.push(format!("{path}: `{}`: {first}", cmd.join(" ")));
                }
            }
        }
    }
    assert!(checked >= 20, "only {checked} commands found: the extraction broke");
    assert!(bad.is_empty(), "commands in the docs that the CLI refuses:\n{}", bad.join("\n"));
}

/// Every long flag of every rdmabench command.
fn rdmabench_flags() -> BTreeSet<String> {
    fn walk(c: &clap::Command, out: &mut BTreeSet<String>) {
        for a in c.get_arguments() {
            for l in a.get_long_and_visible_aliases().into_iter().flatten() {
                out.insert(format!("--{l}"));
            }
        }
        for s in c.get_subcommands() {
            walk(s, out);
        }
    }
    let mut out = BTreeSet::new();
    // Built, so that clap's own --help and --version are there too.
    let mut cli = Cli::command();
    cli.build();
    walk(&cli, &mut out);
    out
}

/// Flags of the other programs the documents run, and of rdmabench's lab scripts.
const OTHER_FLAGS: &[&str] = &[
    // lab/run
    "--timeout",
    "--nics",
    "--nodes",
    "--mtu",
    // cargo, rustup, the test harness
    "--release",
    "--bench",
    "--features",
    "--all-targets",
    "--test",
    "--no-run",
    "--lib",
    "--locked",
    "--bin",
    "--component",
    "--test-threads",
    "--nocapture",
    "--message-format",
    // kubectl
    "--tail",
    "--for",
    "--from-literal",
    "--max-log-requests",
    "--timeout",
    "--namespace",
    // kubernetes-validate, perftest (the benchmarks' twins)
    "--strict",
    // a Dockerfile's COPY from another image
    "--from",
    // cargo's examples, and the ring example program's own flags (examples/ring.rs)
    "--example",
    "--max-size",
    "--records",
    "--perform_warm_up",
    "--vgdb",
];

#[test]
fn every_long_flag_the_documents_name_exists() {
    let ours = rdmabench_flags();
    let mut unknown = BTreeSet::new();
    for (path, text) in documents() {
        let mut rest = text.as_str();
        while let Some(i) = rest.find("--") {
            let before = rest[..i].chars().last();
            rest = &rest[i + 2..];
            let name: String =
                rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_').collect();
            // `--` alone (end of options), a table rule, or inside a word.
            if name.is_empty()
                || !name.starts_with(|c: char| c.is_ascii_lowercase())
                || before.is_some_and(|c| c.is_alphanumeric() || c == '-')
            {
                continue;
            }
            let flag = format!("--{name}");
            if !ours.contains(&flag) && !OTHER_FLAGS.contains(&flag.as_str()) {
                unknown.insert(format!("{path}: {flag}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "flags the documents name that nothing has:\n{}",
        unknown.into_iter().collect::<Vec<_>>().join("\n")
    );
}

/// The `backticked` names between `<!-- NAME -->` and `<!-- /NAME -->` in `text`.
fn listed(text: &str, marker: &str) -> Vec<String> {
    let open = format!("<!-- {marker} -->");
    let close = format!("<!-- /{marker} -->");
    let start = text.find(&open).unwrap_or_else(|| panic!("no {open}")) + open.len();
    let end = start + text[start..].find(&close).unwrap_or_else(|| panic!("no {close}"));
    text[start..end].split('`').skip(1).step_by(2).flat_map(|s| s.split('/')).map(str::to_string).collect()
}

/// Whether the workload parser takes `key` in `table` (`None`: the step itself) with
/// some value: an unknown key is refused whatever its value.
fn takes(table: Option<&str>, key: &str) -> bool {
    // A threshold's value is checked before its key: give it a valid one.
    let values: &[&str] = if table.is_some() { &["1"] } else { &["true", "1", "\"4K\"", "1.5", "[1]"] };
    values.iter().any(|value| {
        let body = match table {
            None => format!("name = \"doc\"\n[[step]]\nname = \"s\"\ntest = \"write-bw\"\n{key} = {value}\n"),
            Some(t) => {
                format!("name = \"doc\"\n[[step]]\nname = \"s\"\ntest = \"write-bw\"\n[step.{t}]\n{key} = {value}\n")
            }
        };
        match rdmabench::workload::file::parse(&body, "doc.toml", &Default::default()) {
            Ok(_) => true,
            Err(e) => {
                let m = e.to_string();
                !(m.contains("unknown field") || m.contains("unknown threshold") || m.contains("unknown key"))
            }
        }
    })
}

/// The step keys are a generated table (`rdmabench docs readme docs/workloads.md`, held to
/// the parser by unit tests); the threshold keys are listed by hand and checked here.
#[test]
fn every_workload_key_the_guide_lists_is_taken() {
    let text = std::fs::read_to_string(format!("{ROOT}/docs/workloads.md")).unwrap();
    let steps: Vec<String> = rdmabench::workload::file::STEP_KEYS.iter().map(|k| k.to_string()).collect();
    let thresholds = listed(&text, "threshold-keys");
    assert!(thresholds.len() >= 7, "{thresholds:?}");
    for key in &steps {
        assert!(text.contains(&format!("| `{key}` |")), "docs/workloads.md's key table lacks {key}");
    }
    let bad: Vec<String> = steps
        .iter()
        .filter(|k| !["thresholds", "max_counters", "tolerance"].contains(&k.as_str()) && !takes(None, k))
        .chain(thresholds.iter().filter(|k| !takes(Some("thresholds"), k)))
        .cloned()
        .collect();
    assert!(bad.is_empty(), "keys docs/workloads.md lists that a workload refuses: {bad:?}");
    // The check can fail: a key nobody has is refused.
    assert!(!takes(None, "no_such_key") && !takes(Some("thresholds"), "min_nothing"));
}

#[test]
fn every_document_the_readme_links_to_exists_and_has_contents() {
    let readme = std::fs::read_to_string(format!("{ROOT}/README.md")).unwrap();
    let links: Vec<&str> = readme
        .split("](")
        .skip(1)
        .filter_map(|s| s.split(')').next())
        .filter(|l| !l.starts_with('#') && !l.starts_with("http"))
        .collect();
    assert!(links.len() >= 10, "{links:?}");
    for l in links {
        let file = l.split('#').next().unwrap();
        let text = std::fs::read_to_string(format!("{ROOT}/{file}"))
            .unwrap_or_else(|_| panic!("README links to {l}: missing"));
        if file.ends_with(".md") && file != "README.md" {
            assert!(text.contains("**Contents**"), "{file} has no contents list");
        }
    }
    assert!(readme.len() < 16_000, "the README is {} bytes: keep it short, move the rest to docs/", readme.len());
}

/// Every relative link (and image) of every Markdown file the project ships resolves from
/// that file's folder, as a repository browser resolves it.
#[test]
fn every_relative_link_in_the_docs_resolves() {
    let mut files = vec![format!("{ROOT}/README.md")];
    for dir in ["docs", "k8s-jobs", "workloads", "results", "k8s-jobs/schemas"] {
        let Ok(entries) = std::fs::read_dir(format!("{ROOT}/{dir}")) else { continue };
        files.extend(entries.map(|e| e.unwrap().path().display().to_string()).filter(|p| p.ends_with(".md")));
    }
    assert!(files.len() >= 10, "{files:?}");
    let mut broken = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let dir = std::path::Path::new(f).parent().unwrap();
        for target in text.split("](").skip(1).filter_map(|s| s.split([')', ' ']).next()) {
            let path = target.split('#').next().unwrap();
            if path.is_empty() || path.contains("://") || path.starts_with("mailto:") {
                continue;
            }
            if !dir.join(path).exists() {
                broken.push(format!("{f}: {target}"));
            }
        }
    }
    assert!(broken.is_empty(), "links to files that are not there: {broken:#?}");
}

#[test]
fn every_visible_command_and_flag_is_documented() {
    fn walk(c: &clap::Command, path: &str, out: &mut Vec<(String, String)>) {
        for a in c.get_arguments().filter(|a| !a.is_hide_set()) {
            if let Some(l) = a.get_long().filter(|l| !matches!(*l, "help" | "version")) {
                out.push((path.to_string(), format!("--{l}")));
            }
        }
        for s in c.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
            let p = format!("{path} {}", s.get_name());
            out.push((p.clone(), String::new()));
            walk(s, &p, out);
        }
    }
    let mut all = Vec::new();
    walk(&Cli::command(), "rdmabench", &mut all);
    let text: String = documents().into_iter().map(|(_, t)| t).collect::<Vec<_>>().join("\n");
    let named = |word: &str| {
        text.match_indices(word).any(|(i, _)| {
            let next = text[i + word.len()..].chars().next();
            !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
    };
    let missing: Vec<String> = all
        .iter()
        .filter(|(cmd, flag)| if flag.is_empty() { !named(cmd.rsplit(' ').next().unwrap()) } else { !named(flag) })
        .map(|(cmd, flag)| format!("{cmd} {flag}"))
        .collect();
    assert!(all.len() > 100, "{}", all.len());
    assert!(missing.is_empty(), "in the CLI but in no document:\n{}", missing.join("\n"));
}

/// The fleet workload's keys docs/fleet.md lists are exactly the ones its parser takes,
/// both ways: a key added to `[measure]` or `[thresholds]` must be documented, and a
/// documented key must exist.
#[test]
fn the_fleet_workload_keys_the_docs_list_are_the_parsers() {
    let text = std::fs::read_to_string(format!("{ROOT}/docs/fleet.md")).unwrap();
    let listed_keys = |marker: &str| -> BTreeSet<String> {
        // The first backticked name of each table row is its key.
        let open = format!("<!-- {marker} -->");
        let close = format!("<!-- /{marker} -->");
        let start = text.find(&open).unwrap_or_else(|| panic!("no {open}")) + open.len();
        let end = start + text[start..].find(&close).unwrap_or_else(|| panic!("no {close}"));
        text[start..end].lines().filter_map(|l| l.split('`').nth(1)).map(str::to_string).collect()
    };
    let parser = |t: toml::Table| -> BTreeSet<String> { t.keys().cloned().collect() };
    use rdmabench::fleet::config::{measure_keys, threshold_keys};
    assert_eq!(listed_keys("fleet-measure-keys"), parser(measure_keys()), "[measure]");
    assert_eq!(listed_keys("fleet-threshold-keys"), parser(threshold_keys()), "[thresholds]");
    assert!(parser(threshold_keys()).len() >= 7 && parser(measure_keys()).len() >= 8);
}

/// `kubectl wait` takes one condition: one `--for`, and a JSONPath of one `{...}`
/// expression (two concatenated, as a line once had, is refused by kubectl). The rendered
/// fleets' headers say the same commands and are checked too.
#[test]
fn every_kubectl_wait_shown_has_one_condition() {
    let mut lines: Vec<(String, String)> = Vec::new();
    for (path, text) in documents() {
        lines.extend(shell_lines(&text).into_iter().map(|l| (path.clone(), l)));
    }
    for entry in std::fs::read_dir(format!("{ROOT}/k8s-jobs/fleet")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let header = text.lines().filter_map(|l| l.strip_prefix("# ")).filter(|l| l.starts_with("kubectl "));
        lines.extend(header.map(|l| (path.display().to_string(), l.to_string())));
    }
    let waits: Vec<&(String, String)> =
        lines.iter().filter(|(_, l)| l.trim_start().starts_with("kubectl wait")).collect();
    assert!(waits.len() >= 7, "the docs and the fleets show their waits: {waits:?}");
    for (path, line) in waits {
        assert_eq!(line.matches("--for").count(), 1, "{path}: {line}");
        if let Some(i) = line.find("--for=jsonpath=") {
            let expr = line[i..].split_whitespace().next().unwrap();
            assert_eq!(expr.matches('{').count(), 1, "{path}: one JSONPath expression: {line}");
        }
    }
}
