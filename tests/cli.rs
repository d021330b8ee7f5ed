//! Host tests of the binary's behaviour that need no RDMA.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_rdmabench");

fn has_rdma() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

#[test]
fn devices_without_rdma_says_so_in_one_line_and_exits_3() {
    let out = Command::new(BIN).arg("devices").output().unwrap();
    if has_rdma() {
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        return;
    }
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("no RDMA") && stderr.contains("lab/run"), "{stderr}");
    assert!(out.stdout.is_empty());
}

/// devices, a test, validate and nccl-env meet the same condition: one wording, exit 3,
/// each pointing to the lab.
#[test]
fn every_command_words_no_rdma_the_same_and_points_to_the_lab() {
    if has_rdma() {
        return;
    }
    for args in [
        &["devices"][..],
        &["write-lat", "--connect-timeout", "1", "127.0.0.1"],
        &["validate", "--profile", "generic"],
        &["nccl-env"],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {stderr}");
        let last = stderr.trim_end().lines().last().unwrap_or("");
        assert!(last.starts_with("rdmabench: error: no RDMA here: "), "{args:?}: {stderr}");
        assert!(last.contains(". Fix: ") && last.contains("lab/run -- rdmabench"), "{args:?}: {stderr}");
    }
}

#[test]
fn usage_errors_exit_2_before_touching_a_device() {
    for args in [
        &["write-bw", "-s", "0", "127.0.0.1"][..],
        &["write-lat", "-t", "0", "127.0.0.1"],
        &["write-bw", "-m", "1500", "x"],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let out = Command::new(BIN).args(["write-bw", "--no-such-flag"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn ring_bad_input_names_the_limit_and_the_fix_before_touching_a_device() {
    for (args, says) in [
        (
            &["ring-bw", "-s", "2000000", "--capacity", "1M", "127.0.0.1"][..],
            &["does not fit a ring of 1048576 B", "--capacity to 2097152"][..],
        ),
        (&["ring-bw", "--capacity", "5000", "127.0.0.1"], &["power of two"]),
        (&["ring-lat", "--capacity", "1K", "127.0.0.1"], &["4096"]),
        (&["ring-bw", "--validate-data", "-s", "8", "127.0.0.1"], &["-s 16 or more"]),
        (&["ring-bw", "--batch", "0", "127.0.0.1"], &["--batch 0"]),
        (&["ring-bw", "-q", "2", "127.0.0.1"], &["-q does not apply to ring tests"]),
        (&["ring-bw", "-c", "UD", "127.0.0.1"], &["rings run over RC"]),
        (&["ring-bw", "-Q", "8", "127.0.0.1"], &["-Q (a ring requests completions by --batch) does not apply"]),
        (&["write-bw", "--capacity", "4K", "127.0.0.1"], &["ring-bw and ring-lat only", "write-bw"]),
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        for s in says {
            assert!(stderr.contains(s), "{args:?}: wanted {s:?} in: {stderr}");
        }
    }
}

#[test]
fn help_lists_perftest_flags() {
    let out = Command::new(BIN).args(["write-bw", "--help"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in ["-d", "-i", "-x", "-p", "-s", "-n", "-D", "-t", "-Q", "-I", "-a", "--report_gbits", "--json"] {
        assert!(text.contains(flag), "{flag} missing from help");
    }
}

/// `--machine-nics`' help states the default that sizes whole-node pods, which lives in
/// the code as `k8s::WHOLE_NODE_NICS`.
#[test]
fn render_help_states_the_whole_node_default() {
    let out = Command::new(BIN).args(["k8s", "render", "--help"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(text.contains(&format!("default: {})", rdmabench::k8s::WHOLE_NODE_NICS)), "{text}");
}

mod fixture_trees {
    use super::*;
    use rdmabench::validate::fixture::{self, Nic, Process};

    /// Runs `rdmabench ARGS` against a fixture tree of `nics`.
    fn on_tree(nics: &[Nic], process: &Process, args: &[&str]) -> (Option<i32>, String, String, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let tree = fixture::write(dir.path(), nics, process);
        let out = Command::new(BIN)
            .args(args)
            .arg("--sysfs-root")
            .arg(&tree.sys)
            .arg("--proc-root")
            .arg(&tree.proc)
            .arg("--dev-root")
            .arg(&tree.dev)
            .arg("--topology-dir")
            .arg(&tree.topology)
            .output()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code(), text(&out.stdout), text(&out.stderr), dir)
    }

    #[test]
    fn validate_exit_codes_json_and_junit() {
        let nics = [Nic::roce(0), Nic::roce(1)];
        let junit_dir = tempfile::tempdir().unwrap();
        let junit = junit_dir.path().join("v.xml");
        let junit_arg = junit.to_str().unwrap();
        let args = ["validate", "--profile", "vke-shared", "--expect-nics", "2", "--json", "-", "--junit", junit_arg];
        let (code, stdout, stderr, _d) = on_tree(&nics, &Process::default(), &args);
        assert_eq!(code, Some(0), "{stderr}");
        let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(doc["verdict"], "pass");
        assert_eq!(doc["gid_index"], 3);
        assert!(stderr.contains("verdict: PASS"), "{stderr}");
        let xml = std::fs::read_to_string(&junit).unwrap();
        let parsed = roxmltree::Document::parse(&xml).expect("well-formed JUnit");
        let cases = parsed.descendants().filter(|n| n.has_tag_name("testcase")).count();
        assert_eq!(cases, doc["checks"].as_array().unwrap().len());

        let mut down = Nic::roce(1);
        down.mtu = 1500;
        let (code, stdout, stderr, _d) = on_tree(
            &[Nic::roce(0), down],
            &Process::default(),
            &["validate", "--profile", "vke-shared", "--junit", junit_arg],
        );
        assert_eq!(code, Some(1), "{stdout}");
        assert!(stdout.contains("FAIL  netdev") && stdout.contains("fix:"), "{stdout}");
        assert!(stderr.contains("netdev (mlx5_1/1)"), "{stderr}");
        let xml = std::fs::read_to_string(&junit).unwrap();
        let parsed = roxmltree::Document::parse(&xml).expect("well-formed JUnit");
        assert!(parsed.descendants().any(|n| n.has_tag_name("failure")));

        let (code, _, stderr, _d) = on_tree(&[], &Process::default(), &["validate", "--profile", "generic"]);
        assert_eq!(code, Some(3), "{stderr}");
    }

    #[test]
    fn nccl_env_formats_and_exit_codes() {
        let (code, stdout, _, _d) = on_tree(&[Nic::roce(0), Nic::roce(1)], &Process::default(), &["nccl-env"]);
        assert_eq!(code, Some(0));
        assert_eq!(stdout, "export NCCL_IB_HCA=mlx5_0:1,mlx5_1:1\nexport NCCL_IB_GID_INDEX=3\n");
        let (_, stdout, _, _d) = on_tree(&[Nic::roce(0)], &Process::default(), &["nccl-env", "--format", "json"]);
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(v["NCCL_IB_GID_INDEX"], "3");
        let mut other = Nic::roce(1);
        other.first_index = 5;
        let (code, _, stderr, _d) = on_tree(&[Nic::roce(0), other], &Process::default(), &["nccl-env"]);
        assert_eq!(code, Some(1), "{stderr}");
        assert!(stderr.contains("mlx5_1:1 index 5"), "{stderr}");
        let (code, _, stderr, _d) = on_tree(&[], &Process::default(), &["nccl-env"]);
        assert_eq!(code, Some(3), "{stderr}");
    }
}

mod results {
    use super::*;

    fn baseline() -> String {
        format!("{}/results/baseline-rxe.json", env!("CARGO_MANIFEST_DIR"))
    }

    fn modified(dir: &tempfile::TempDir, f: impl Fn(&mut serde_json::Value)) -> String {
        let mut doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(baseline()).unwrap()).unwrap();
        f(&mut doc);
        let path = dir.path().join("doc.json");
        std::fs::write(&path, doc.to_string()).unwrap();
        path.to_str().unwrap().to_string()
    }

    #[test]
    fn compare_a_baseline_with_itself_a_slower_copy_and_another_device() {
        let out = Command::new(BIN).args(["compare", &baseline(), &baseline()]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{text}");
        assert!(text.contains("0 regressed") && text.contains("write bandwidth 64 KiB"), "{text}");

        let dir = tempfile::tempdir().unwrap();
        let slower = modified(&dir, |d| {
            for step in d["steps"].as_array_mut().unwrap() {
                for size in step["stats"].as_array_mut().unwrap() {
                    if let Some(g) = size["metrics"].get_mut("gbps") {
                        for k in ["median", "min", "max"] {
                            g[k] = (g[k].as_f64().unwrap() / 2.0).into();
                        }
                        for v in g["values"].as_array_mut().unwrap() {
                            *v = (v.as_f64().unwrap() / 2.0).into();
                        }
                    }
                }
            }
        });
        let junit = dir.path().join("c.xml");
        let out = Command::new(BIN)
            .args(["compare", &baseline(), &slower, "--json", "-", "--junit", junit.to_str().unwrap()])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
        let c: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let regressed: Vec<&serde_json::Value> =
            c["rows"].as_array().unwrap().iter().filter(|r| r["verdict"] == "regressed").collect();
        assert_eq!(regressed.len(), 2, "gbps of the two bandwidth steps: {c}");
        let xml = std::fs::read_to_string(&junit).unwrap();
        assert!(roxmltree::Document::parse(&xml).unwrap().descendants().any(|n| n.has_tag_name("failure")));

        let other = modified(&dir, |d| d["environment"]["device"] = "mlx5_0".into());
        let out = Command::new(BIN).args(["compare", &baseline(), &other]).output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("different environments"));
        let out = Command::new(BIN).args(["compare", &baseline(), &other, "--allow-env-mismatch"]).output().unwrap();
        assert_eq!(out.status.code(), Some(0));
        assert!(String::from_utf8_lossy(&out.stdout).contains("WARNING environments differ: device"));
    }

    #[test]
    fn plot_draws_a_valid_svg() {
        let dir = tempfile::tempdir().unwrap();
        let svg = dir.path().join("b.svg");
        let out = Command::new(BIN).args(["plot", &baseline(), "-o", svg.to_str().unwrap()]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        let text = std::fs::read_to_string(&svg).unwrap();
        let doc = roxmltree::Document::parse(&text).expect("valid SVG");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        assert!(doc.descendants().filter(|n| n.has_tag_name("polyline")).count() >= 2, "bandwidth and latency lines");
    }

    #[test]
    fn the_baseline_matches_the_run_schema_of_its_version() {
        let root = env!("CARGO_MANIFEST_DIR");
        let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(baseline()).unwrap()).unwrap();
        let version = doc["schema_version"].as_u64().unwrap();
        let schema: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(format!("{root}/results/schema/run-v{version}.schema.json")).unwrap(),
        )
        .unwrap();
        let v = jsonschema::validator_for(&schema).unwrap();
        let errors: Vec<String> = v.iter_errors(&doc).map(|e| format!("{e} at {}", e.instance_path())).collect();
        assert!(errors.is_empty(), "{errors:?}");
    }
}

/// lab/test's last line, the README's promises about the two commands, and the toolchain
/// check: scripts run on fixture logs and a stand-in rustc.
mod lab_scripts {
    use super::*;

    const ROOT: &str = env!("CARGO_MANIFEST_DIR");

    fn summary(host_log: &str, lab_log: &str, expected: usize, stage: &str) -> (Option<i32>, String) {
        let dir = tempfile::tempdir().unwrap();
        let (h, l) = (dir.path().join("host.log"), dir.path().join("lab.log"));
        std::fs::write(&h, host_log).unwrap();
        std::fs::write(&l, lab_log).unwrap();
        let out = Command::new("bash")
            .arg(format!("{ROOT}/lab/summary"))
            .args([h.to_str().unwrap(), l.to_str().unwrap(), &expected.to_string(), stage])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.lines().count(), 1, "one line: {text}");
        (out.status.code(), text.trim_end().to_string())
    }

    fn lab_lines(results: &[(&str, bool)]) -> String {
        results.iter().map(|(name, ok)| format!("test {name} ... {}\n", if *ok { "ok" } else { "FAILED" })).collect()
    }

    const HOST: &str = "running 139 tests\ntest result: ok. 139 passed; 0 failed; 0 ignored; 0 measured\n\
                        running 12 tests\ntest result: ok. 12 passed; 0 failed; 0 ignored; 0 measured\n";

    #[test]
    fn lab_test_last_line_gives_the_true_counts_whatever_the_outcome() {
        let all = lab_lines(&[("lab_00_runs_on_rxe", true), ("lab_a", true), ("lab_b", true)]);
        let (code, line) = summary(HOST, &(all.clone() + "\ntest result: ok. 3 passed; 0 failed\n"), 3, "");
        assert_eq!(code, Some(0), "{line}");
        assert_eq!(
            line,
            "lab/test: PASS: lab tests on rxe: 3 passed, 0 failed, 0 did not run, 3 expected; \
             host tests: 151 passed, 0 failed"
        );

        // One failed: counted from the per-test lines (the harness's own line agrees).
        let one_failed = lab_lines(&[("lab_00_runs_on_rxe", true), ("lab_a", false), ("lab_b", true)])
            + "test result: FAILED. 2 passed; 1 failed\n";
        let (code, line) = summary(HOST, &one_failed, 3, "");
        assert_eq!(code, Some(1));
        assert!(line.starts_with("lab/test: FAILED (not every lab test ran and passed): "), "{line}");
        assert!(line.contains("2 passed, 1 failed, 0 did not run, 3 expected"), "{line}");

        // The guest died after two tests: no harness summary, the rest did not run.
        let died = lab_lines(&[("lab_00_runs_on_rxe", true), ("lab_a", true)]) + "test lab_b ... ";
        let (code, line) = summary(HOST, &died, 3, "lab tests (exit 124)");
        assert_eq!(code, Some(1));
        assert!(line.starts_with("lab/test: FAILED (lab tests (exit 124) failed): "), "{line}");
        assert!(line.contains("2 passed, 0 failed, 1 did not run, 3 expected"), "{line}");

        // An earlier step failed: the host counts as far as they got, no lab test ran.
        let host_failed = "test result: FAILED. 138 passed; 1 failed; 0 ignored\n";
        let (code, line) = summary(host_failed, "", 3, "host tests");
        assert_eq!(code, Some(1));
        assert_eq!(
            line,
            "lab/test: FAILED (host tests failed): lab tests on rxe: 0 passed, 0 failed, 3 did not run, \
             3 expected; host tests: 138 passed, 1 failed"
        );

        // Every test passed, but not on rxe (lab_00 is what proves the device).
        let (code, line) = summary(HOST, &lab_lines(&[("lab_a", true)]), 1, "");
        assert_eq!(code, Some(1));
        assert!(line.contains("did not run on rxe"), "{line}");
    }

    #[test]
    fn readme_states_the_prerequisites_and_the_last_line_of_each_command() {
        let readme = std::fs::read_to_string(format!("{ROOT}/README.md")).unwrap();
        let cargo = std::fs::read_to_string(format!("{ROOT}/Cargo.toml")).unwrap();
        let need = cargo.lines().find_map(|l| l.strip_prefix("rust-version = \"")).unwrap().trim_end_matches('"');
        let before = &readme[readme.find("## Before you start").expect("a Before you start section")..];
        let before = &before[..before.find("## Two commands").unwrap()];
        for part in [&format!("Rust {need} or newer")[..], "rustfmt", "clippy", "crates.io", "PyPI", "apt"] {
            assert!(before.contains(part), "Before you start lacks {part:?}");
        }
        // The stated last lines are what the commands print.
        let expected: usize = std::fs::read_dir(format!("{ROOT}/tests/lab"))
            .unwrap()
            .map(|f| std::fs::read_to_string(f.unwrap().path()).unwrap().matches("\nfn lab_").count())
            .sum();
        let names: Vec<String> =
            (0..expected).map(|i| if i == 0 { "lab_00_runs_on_rxe".into() } else { format!("lab_{i}") }).collect();
        let lab = lab_lines(&names.iter().map(|n| (n.as_str(), true)).collect::<Vec<_>>());
        let (_, line) = summary("test result: ok. 7 passed; 0 failed;\n", &lab, expected, "");
        let stated = line.replace("host tests: 7 passed", "host tests: N passed");
        assert!(before.contains(&format!("`{stated}`")), "README should state lab/test's last line: {stated}");
        assert!(before.contains("`=== workload smoke: PASS ===`"));
        let smoke = std::fs::read_to_string(format!("{ROOT}/src/workload/run.rs")).unwrap();
        assert!(smoke.contains("=== workload {}: {} ==="), "the run's closing line is still printed as stated");
        // .ci/run is exactly the README's test command.
        let ci = std::fs::read_to_string(format!("{ROOT}/.ci/run")).unwrap();
        assert!(ci.lines().any(|l| l.trim() == "exec lab/test") && readme.contains("lab/test    # every test"));
    }

    #[test]
    fn a_missing_or_old_rust_is_named_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let rustc = dir.path().join("rustc");
        std::fs::write(&rustc, "#!/bin/sh\necho 'rustc 1.63.0 (Debian)'\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&rustc, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = format!("{}:{}", dir.path().display(), std::env::var("PATH").unwrap());
        let out = Command::new("bash")
            .args(["-c", ". lab/setup.sh && lab_check_rust"])
            .current_dir(ROOT)
            .env("PATH", path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0));
        assert!(stderr.contains("rustc 1.63.0 is too old") && stderr.contains("rustup update"), "{stderr}");
        let out = Command::new("bash")
            .args(["-c", ". lab/setup.sh && lab_check_rust components"])
            .current_dir(ROOT)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "this machine builds the project: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A fleet node whose port is taken stops at once with the reason (exit 3), before it
/// joins: it would otherwise serve nothing and be judged for failing against its partners.
#[test]
fn a_fleet_node_whose_port_is_taken_stops_before_joining() {
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    // Node 1 serves on -p + 1: give the base one below the taken port.
    let base = (port - 1).to_string();
    let start = std::time::Instant::now();
    let out = Command::new(BIN)
        .args(["fleet", "--index", "1", "--pods", "3", "--peers", "127.0.0.1,127.0.0.1,127.0.0.1", "-p", &base])
        .args(["--connect-timeout", "60"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains(&format!("port {port}")) && stderr.contains("pick another port with -p"), "{stderr}");
    assert!(start.elapsed() < std::time::Duration::from_secs(30), "it waited to join: {:?}", start.elapsed());
    drop(taken);
}

/// The documented pipeline, `kubectl logs ... | rdmabench summarize --fleet all-pairs ... -`:
/// the logs come once, through a pipe, and the servers' records are joined to the rows
/// all the same; a line cut short is skipped, named with its line number, and counted in
/// the verdict, which still passes.
#[test]
fn a_fleets_logs_piped_once_keep_the_servers_records_and_a_cut_line_is_skipped() {
    use rdmabench::fleet::schedule::{Directions, Plan};
    use rdmabench::report::pairs::{PairRow, ServedRow};
    use std::io::Write;
    use std::process::Stdio;
    let plan = Plan { nodes: 3, directions: Directions::One, max_pairs_per_round: None };
    let mut lines = Vec::new();
    for step in plan.steps() {
        for p in &step.pairs {
            let mut r = PairRow::blank(step.index, step.round, None, p.client, p.server);
            (r.gbps, r.p50_us, r.p99_us) = (Some(100.0), Some(5.0), Some(7.0));
            lines.push(format!("[pod/fleet-{}/c] {}", p.client, r.line()));
            let counters = [("rcvd_pkts".to_string(), 42)].into();
            let s = ServedRow { step: step.index, client: p.client, server: p.server, counters, error: None };
            lines.push(format!("[pod/fleet-{}/c] {}", p.server, s.line()));
        }
    }
    let cut = lines[0].clone();
    lines.push(cut[..cut.len() / 2].to_string());
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let mut child = Command::new(BIN)
        .args(["summarize", "--fleet", "all-pairs", "--pods", "3", "--json", "--out"])
        .arg(&out_dir)
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all((lines.join("\n") + "\n").as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let verdict: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(verdict["skipped_lines"], 1, "{verdict}");
    assert!(stderr.contains(&format!("stdin line {}", lines.len())), "{stderr}");
    let pairs = std::fs::read_to_string(out_dir.join("pairs.jsonl")).unwrap();
    for row in pairs.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()) {
        assert_eq!(row["peer_counters"]["rcvd_pkts"], 42, "every server's record joined: {row}");
    }
}
